#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A read as of an instant whose blocks come from several log records hints every record to
//! the log device before reading any (`Disk::prefetch`), so a device fetches them together;
//! a read from one record hints nothing. The bytes are the same either way.

mod rig;

use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use mariner_disk::{Disk, Extent};
use mariner_log::Entry;
use rig::{append, Rig, VOL};

/// A disk that records the prefetch hints it is given and forwards everything.
#[derive(Debug)]
struct Hints {
    inner: Arc<dyn Disk>,
    seen: Mutex<Vec<(u64, u64)>>,
}

impl Disk for Hints {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
    fn allocation(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
        self.inner.allocation(offset, len)
    }
    fn prefetch(&self, offset: u64, len: u64) -> io::Result<()> {
        self.seen.lock().unwrap().push((offset, len));
        self.inner.prefetch(offset, len)
    }
}

#[test]
fn a_read_of_blocks_from_several_records_hints_each_record_first() {
    let mut rig = Rig::new(4 << 20);
    let hints = Arc::new(Hints {
        inner: rig.dev.clone(),
        seen: Mutex::new(Vec::new()),
    });
    rig.dev = hints.clone();
    let (log, h) = rig.open(Duration::from_secs(3600), |_| {});
    rig.create(&log);
    // 32 KiB in one record, then blocks 2 and 5 written again on their own.
    let mut want = vec![1u8; 32 << 10];
    append(&log, Entry::write(VOL, 0, Bytes::from(want.clone())));
    for (block, fill) in [(2u64, 2u8), (5, 3)] {
        let at = (block * 4096) as usize;
        want[at..at + 4096].fill(fill);
        append(
            &log,
            Entry::write(VOL, block * 4096, Bytes::from(vec![fill; 4096])),
        );
    }
    let latest = h.window(VOL).unwrap().newest.volume_seq;
    let take = |h: &mariner_history::History, offset: u64, len: usize| {
        hints.seen.lock().unwrap().clear();
        let mut got = vec![0u8; len];
        h.read_at(VOL, latest, offset, &mut got).unwrap();
        let seen = std::mem::take(&mut *hints.seen.lock().unwrap());
        (got, seen)
    };

    // Five runs: the big record, block 2's, the big one, block 5's, the big one again.
    let (got, seen) = take(&h, 0, 32 << 10);
    assert!(got == want, "the bytes as of the newest write");
    assert_eq!(seen.len(), 5, "one hint per run: {seen:?}");
    assert_eq!(seen[0].0, seen[2].0, "runs of one record hint its start");
    assert_eq!(seen[2].0, seen[4].0);
    assert!(seen[1].0 != seen[0].0 && seen[3].0 != seen[1].0);
    // Each hint: the record's header and at most 8 KiB of the part.
    assert!(seen
        .iter()
        .all(|&(_, len)| len > 4096 && len <= (8 << 10) + 4096));

    // One record: nothing to overlap, no hint.
    let (got, seen) = take(&h, 8192, 4096);
    assert!(got == want[8192..12288]);
    assert!(seen.is_empty(), "{seen:?}");

    // The same after a restart.
    drop(h);
    drop(log);
    let (_log, h) = rig.open(Duration::from_secs(3600), |_| {});
    let (got, seen) = take(&h, 0, 32 << 10);
    assert!(got == want);
    assert_eq!(seen.len(), 5, "{seen:?}");
}
