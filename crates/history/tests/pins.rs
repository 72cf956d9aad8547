#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Pins: a pinned instant outlives its window (taken before or after `start`), unpinning lets
//! it expire at the next roll-forward, and shrinking passes a pin (reads then fail Expired).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use mariner_disk::{Disk, MemDisk};
use mariner_history::files::{Files, MemFiles};
use mariner_history::{History, HistoryConfig, HistoryError, IndexConfig};
use mariner_log::clock::VirtualClock;
use mariner_log::{Entry, Log, LogConfig, RecordKind};

const LOG_ID: u128 = 0x917_5000;
const VOL: u32 = 3;
const SIZE: u64 = 1 << 20;
const SEGMENT: u64 = 64 << 10;
const HOUR: u64 = 3600 * 1_000_000_000;

fn cfg(window: Duration) -> HistoryConfig {
    HistoryConfig {
        window,
        min_window: Duration::ZERO,
        index: IndexConfig {
            block_count: 4096,
            block_bytes: 4096,
            memory_budget_bytes: 4 << 20,
            log_bytes: 8 << 20,
            log_segment_bytes: 256 << 10,
            background: None,
        },
        batch_records: 64,
        background: false,
        state_interval: Duration::ZERO,
        ..HistoryConfig::default()
    }
}

fn log_cfg() -> LogConfig {
    LogConfig {
        segment_bytes: SEGMENT,
        t_wait_ns: 0,
        ..LogConfig::default()
    }
}

struct Rig {
    dev: Arc<dyn Disk>,
    files: Arc<MemFiles>,
    clock: Arc<VirtualClock>,
    /// vseq → the volume's bytes after it.
    after: BTreeMap<u64, Vec<u8>>,
    image: Vec<u8>,
}

impl Rig {
    fn new(log_bytes: u64) -> Self {
        let dev: Arc<dyn Disk> = Arc::new(MemDisk::new(log_bytes as usize));
        Log::format(std::slice::from_ref(&dev), &log_cfg(), LOG_ID).unwrap();
        let files = MemFiles::new(BTreeMap::new(), |_| {
            Arc::new(MemDisk::new(0)) as Arc<dyn Disk>
        });
        Self {
            dev,
            files: Arc::new(files),
            clock: Arc::new(VirtualClock::new(1_800_000_000_000_000_000)),
            after: BTreeMap::new(),
            image: vec![0; SIZE as usize],
        }
    }

    /// History opened, `before_start` run on it, then started.
    fn open(&self, window: Duration, before_start: impl FnOnce(&History)) -> (Log, History) {
        let files: Arc<dyn Files> = self.files.clone();
        let h = History::open_with_clock(files, cfg(window), self.clock.clone()).unwrap();
        before_start(&h);
        let (log, rec) = Log::open_with_clock(
            vec![self.dev.clone()],
            log_cfg(),
            LOG_ID,
            &[h.holder_spec()],
            h.sink(),
            self.clock.clone(),
        )
        .unwrap();
        h.start(log.clone(), &rec).unwrap();
        (log, h)
    }

    fn create(&mut self, log: &Log) {
        let a = append(
            log,
            Entry::extent(RecordKind::VolumeCreated, VOL, SIZE, 512),
        );
        self.after.insert(a.volume_seq, self.image.clone());
    }

    /// `n` writes of `bytes` each, filled with their number; returns the last one's vseq.
    fn write(&mut self, log: &Log, n: u64, bytes: u64) -> u64 {
        for i in 0..n {
            let off = (i * 4096 * 3) % (SIZE - bytes);
            let fill = (self.after.len() % 250) as u8 + 1;
            let range = off as usize..(off + bytes) as usize;
            self.image[range].fill(fill);
            let data = Bytes::from(vec![fill; bytes as usize]);
            let a = append(log, Entry::write(VOL, off, data));
            self.after.insert(a.volume_seq, self.image.clone());
        }
        *self.after.keys().last().unwrap()
    }

    fn reads(&self, h: &History, vseq: u64) -> Result<(), HistoryError> {
        let mut got = vec![0u8; SIZE as usize];
        h.read_at(VOL, vseq, 0, &mut got)?;
        assert!(got == self.after[&vseq], "as of @{vseq}: differs");
        Ok(())
    }
}

fn append(log: &Log, e: Entry) -> mariner_log::Appended {
    log.append(e).unwrap().blocking_recv().unwrap().unwrap()
}

#[test]
fn a_pinned_instant_outlives_its_window_until_unpinned() {
    let mut rig = Rig::new(16 << 20);
    let (log, h) = rig.open(Duration::from_secs(60), |_| {});
    rig.create(&log);
    let pinned = rig.write(&log, 20, 4096);
    let last = rig.write(&log, 20, 4096);
    h.flush().unwrap();
    let pin = h.pin(VOL, pinned).unwrap();
    // An hour later every write is older than the window; the base stops at the pin.
    rig.clock.advance(HOUR);
    h.step().unwrap();
    assert!(h.stats().roll_forwards.load(Relaxed) > 0);
    let w = h.window(VOL).unwrap();
    assert_eq!(
        w.oldest.volume_seq, pinned,
        "the base stops exactly at the pin"
    );
    rig.reads(&h, pinned).unwrap();
    rig.reads(&h, last).unwrap();
    assert!(matches!(
        rig.reads(&h, pinned - 1),
        Err(HistoryError::Expired { .. })
    ));
    // An instant already gone cannot be pinned.
    assert!(matches!(
        h.pin(VOL, pinned - 1),
        Err(HistoryError::Expired { .. })
    ));
    // Rounds while pinned leave it be.
    rig.clock.advance(HOUR);
    h.step().unwrap();
    rig.reads(&h, pinned).unwrap();
    // Unpinned: the next roll takes the base past it.
    h.unpin(pin);
    rig.clock.advance(2_000_000_000);
    h.step().unwrap();
    assert_eq!(h.window(VOL).unwrap().oldest.volume_seq, last);
    assert!(matches!(
        rig.reads(&h, pinned),
        Err(HistoryError::Expired { .. })
    ));
    rig.reads(&h, last).unwrap();
    log.shutdown();
}

#[test]
fn a_pin_taken_before_start_holds_from_the_first_roll_forward() {
    let mut rig = Rig::new(16 << 20);
    let (log, h) = rig.open(Duration::from_secs(60), |_| {});
    rig.create(&log);
    let pinned = rig.write(&log, 10, 4096);
    let last = rig.write(&log, 10, 4096);
    h.flush().unwrap();
    h.shutdown(true).unwrap();
    log.shutdown();
    drop((log, h));
    rig.clock.advance(HOUR);
    // Re-pinned between open and start, as the node does for its snapshot exports: the
    // window is not known yet, and the pin is taken.
    let (log, h) = rig.open(Duration::from_secs(60), |h| {
        h.pin(VOL, pinned).unwrap();
    });
    h.step().unwrap();
    assert_eq!(h.window(VOL).unwrap().oldest.volume_seq, pinned);
    rig.reads(&h, pinned).unwrap();
    rig.reads(&h, last).unwrap();
    assert_eq!(h.pins().len(), 1);
    log.shutdown();
}

#[test]
fn shrinking_passes_a_pin_and_reads_as_of_it_fail_expired() {
    // A 2 MiB log and a week's window: history must shrink to keep the log writable.
    let mut rig = Rig::new(32 * SEGMENT + (1 << 16));
    let (log, h) = rig.open(Duration::from_secs(7 * 24 * 3600), |_| {});
    rig.create(&log);
    let pinned = rig.write(&log, 4, 16 << 10);
    h.flush().unwrap();
    h.pin(VOL, pinned).unwrap();
    rig.reads(&h, pinned).unwrap();
    let mut last = pinned;
    for _ in 0..40 {
        last = rig.write(&log, 4, 16 << 10);
        h.step().unwrap();
    }
    h.flush().unwrap();
    assert!(h.stats().shrinks.load(Relaxed) > 0, "history shrank");
    let w = h.window(VOL).unwrap();
    assert!(w.oldest.volume_seq > pinned, "the shrink passed the pin");
    assert!(matches!(
        rig.reads(&h, pinned),
        Err(HistoryError::Expired { .. })
    ));
    rig.reads(&h, last).unwrap();
    log.shutdown();
}
