#![allow(clippy::unwrap_used, clippy::expect_used)]
//! History over the real log and the real index: reads as of every write equal what the
//! volume held then, before and after indexing, across a restart, and after the base rolled
//! forward past the window.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use mariner_disk::{Disk, MemDisk};
use mariner_history::files::MemFiles;
use mariner_history::{At, Held, History, HistoryConfig, HistoryError, IndexConfig};
use mariner_log::clock::{Clock, VirtualClock};
use mariner_log::{Entry, Log, LogConfig, RecordKind};

const LOG_ID: u128 = 0xB15_7041;
const VOL: u32 = 7;
const SIZE: u64 = 1 << 20;

fn small_index() -> IndexConfig {
    IndexConfig {
        block_count: 4096,
        block_bytes: 4096,
        memory_budget_bytes: 4 << 20,
        log_bytes: 8 << 20,
        log_segment_bytes: 256 << 10,
        background: None,
        cpu_class: None,
        write_gap: None,
    }
}

fn cfg(window: Duration) -> HistoryConfig {
    HistoryConfig {
        window,
        index: small_index(),
        batch_records: 64,
        background: false,
        state_interval: Duration::ZERO,
        ..HistoryConfig::default()
    }
}

/// The volume's bytes after each write: the oracle.
struct Oracle {
    image: Vec<u8>,
    /// vseq → image after it.
    after: BTreeMap<u64, Vec<u8>>,
    ts: BTreeMap<u64, u64>,
}

struct Rig {
    devices: Vec<Arc<dyn Disk>>,
    files: Arc<MemFiles>,
    clock: Arc<VirtualClock>,
}

impl Rig {
    fn new() -> Self {
        let dev: Arc<dyn Disk> = Arc::new(MemDisk::new(16 << 20));
        Log::format(std::slice::from_ref(&dev), &log_cfg(), LOG_ID).unwrap();
        let wall = mariner_log::clock::SystemClock.wall_ns();
        let files = MemFiles::new(BTreeMap::new(), |_| {
            Arc::new(MemDisk::new(0)) as Arc<dyn Disk>
        });
        Self {
            devices: vec![dev],
            files: Arc::new(files),
            clock: Arc::new(VirtualClock::new(wall)),
        }
    }

    fn open(&self, window: Duration) -> (Log, History) {
        let files: Arc<dyn mariner_history::files::Files> = self.files.clone();
        let h = History::open_with_clock(files, cfg(window), self.clock.clone()).unwrap();
        let (log, rec) = Log::open_with_clock(
            self.devices.clone(),
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
}

fn log_cfg() -> LogConfig {
    LogConfig {
        segment_bytes: 256 << 10,
        t_wait_ns: 0,
        ..LogConfig::default()
    }
}

fn append(log: &Log, e: Entry) -> mariner_log::Appended {
    log.append(e).unwrap().blocking_recv().unwrap().unwrap()
}

/// Creates the volume (zeros): the oracle, holding that first instant.
fn create_volume(log: &Log) -> Oracle {
    let created = append(
        log,
        Entry::extent(RecordKind::VolumeCreated, VOL, SIZE, 512),
    );
    let image = vec![0; SIZE as usize];
    Oracle {
        after: BTreeMap::from([(created.volume_seq, image.clone())]),
        ts: BTreeMap::from([(created.volume_seq, created.timestamp_ns)]),
        image,
    }
}

fn check_all(h: &History, o: &Oracle, from: u64) {
    for (&vseq, image) in o.after.range(from..) {
        let mut got = vec![0u8; SIZE as usize];
        h.read_at(VOL, vseq, 0, &mut got).unwrap();
        assert!(got == *image, "as of @{vseq}: differs");
        // The allocation as of the instant covers the volume and says zeros or hole only
        // where it reads as zeros.
        let runs = h.allocation_at(VOL, vseq, 0, SIZE).unwrap();
        let mut at = 0u64;
        for (len, held) in runs {
            let bytes = &image[at as usize..(at + len) as usize];
            if held != Held::Data {
                assert!(
                    bytes.iter().all(|&b| b == 0),
                    "as of @{vseq}: {held:?} at {at}+{len} over data"
                );
            }
            at += len;
        }
        assert_eq!(
            at, SIZE,
            "as of @{vseq}: the allocation does not cover the volume"
        );
        let p = h.resolve(VOL, At::Time(o.ts[&vseq])).unwrap();
        assert_eq!(p.volume_seq, vseq, "time of @{vseq} resolves elsewhere");
    }
}

fn write_some(log: &Log, o: &mut Oracle, n: usize, seed: u64) {
    let mut x = seed | 1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for _ in 0..n {
        let sectors = SIZE / 512;
        let start = next() % sectors;
        let len = (1 + next() % 64).min(sectors - start);
        let (off, bytes) = (start * 512, len * 512);
        let kind = next() % 5;
        let a = if kind == 0 {
            let a = append(log, Entry::extent(RecordKind::Trim, VOL, off, bytes as u32));
            o.image[off as usize..(off + bytes) as usize].fill(0);
            a
        } else {
            let fill = (next() % 251) as u8 + 1;
            let data = vec![fill; bytes as usize];
            let a = append(log, Entry::write(VOL, off, Bytes::from(data)));
            o.image[off as usize..(off + bytes) as usize].fill(fill);
            a
        };
        o.after.insert(a.volume_seq, o.image.clone());
        o.ts.insert(a.volume_seq, a.timestamp_ns);
    }
}

#[test]
fn reads_as_of_every_write_before_and_after_indexing_and_a_restart() {
    let rig = Rig::new();
    let (log, h) = rig.open(Duration::from_secs(3600));
    let mut o = create_volume(&log);
    h.flush().unwrap();
    write_some(&log, &mut o, 100, 1);
    // Nothing indexed yet: all from the tail.
    check_all(&h, &o, 0);
    h.flush().unwrap();
    assert!(
        h.stats()
            .keys_inserted
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
    );
    check_all(&h, &o, 0);
    write_some(&log, &mut o, 50, 2);
    // Half indexed, half in the tail.
    h.step().unwrap();
    check_all(&h, &o, 0);
    // A restart without a flush: the records above the saved state are indexed again.
    h.shutdown(false).unwrap();
    log.shutdown();
    drop((log, h));
    let (log, h) = rig.open(Duration::from_secs(3600));
    check_all(&h, &o, 0);
    h.flush().unwrap();
    check_all(&h, &o, 0);
    // Latest is the newest write.
    let newest = *o.after.keys().last().unwrap();
    assert_eq!(h.resolve(VOL, At::Latest).unwrap().volume_seq, newest);
    assert!(matches!(
        h.resolve(VOL, At::Seq(newest + 1)),
        Err(HistoryError::Expired { .. })
    ));
    log.shutdown();
}

#[test]
fn the_base_rolls_forward_past_the_window_and_older_instants_expire() {
    let rig = Rig::new();
    let (log, h) = rig.open(Duration::from_secs(60));
    let mut o = create_volume(&log);
    write_some(&log, &mut o, 80, 3);
    h.flush().unwrap();
    // An hour later, 40 more writes; the first 81 instants leave the window.
    rig.clock.advance(3600 * 1_000_000_000);
    let old_last = *o.after.keys().last().unwrap();
    // Writes made "now" by the log's clock are older than the advanced history clock, so
    // give the log's records the time they are made: the window is judged on history's
    // clock, and everything written before the advance is older than 60 s by it.
    h.step().unwrap();
    assert!(
        h.stats()
            .roll_forwards
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
    );
    let w = h.window(VOL).unwrap();
    assert_eq!(w.oldest.volume_seq, old_last);
    assert!(matches!(
        h.read_at(VOL, old_last - 1, 0, &mut [0u8; 512]),
        Err(HistoryError::Expired { .. })
    ));
    check_all(&h, &o, old_last);
    // And after a restart.
    h.shutdown(false).unwrap();
    log.shutdown();
    drop((log, h));
    let (log, h) = rig.open(Duration::from_secs(60));
    check_all(&h, &o, old_last);
    log.shutdown();
}

/// Two volumes with their own windows, one with history turned off, one deleted: each keeps
/// what its own window says; a deleted volume stays readable until its deletion leaves the
/// window; history off keeps nothing.
#[test]
fn each_volume_keeps_its_own_window_and_a_deleted_one_stays_readable_until_it_leaves() {
    const SHORT: u32 = 1;
    const LONG: u32 = 2;
    const OFF: u32 = 3;
    let rig = Rig::new();
    let files: Arc<dyn mariner_history::files::Files> = rig.files.clone();
    let h =
        History::open_with_clock(files, cfg(Duration::from_secs(600)), rig.clock.clone()).unwrap();
    h.set_window(SHORT, Some(Duration::from_secs(60))).unwrap();
    h.set_window(OFF, None).unwrap();
    let (log, rec) = Log::open_with_clock(
        rig.devices.clone(),
        log_cfg(),
        LOG_ID,
        &[h.holder_spec()],
        h.sink(),
        rig.clock.clone(),
    )
    .unwrap();
    h.start(log.clone(), &rec).unwrap();
    for v in [SHORT, LONG, OFF] {
        append(&log, Entry::extent(RecordKind::VolumeCreated, v, SIZE, 512));
    }
    let mut first = BTreeMap::new();
    for v in [SHORT, LONG, OFF] {
        let a = append(&log, Entry::write(v, 0, Bytes::from(vec![v as u8; 4096])));
        first.insert(v, a.volume_seq);
    }
    h.flush().unwrap();
    assert!(matches!(h.window(OFF), Err(HistoryError::UnknownVolume(3))));
    // Two minutes later: the short window's first write is older than its window.
    rig.clock.advance(120 * 1_000_000_000);
    for v in [SHORT, LONG] {
        append(&log, Entry::write(v, 0, Bytes::from(vec![0xEE; 4096])));
    }
    append(&log, Entry::extent(RecordKind::VolumeDeleted, LONG, 0, 0));
    h.flush().unwrap();
    h.step().unwrap();
    let short = h.window(SHORT).unwrap();
    assert_eq!(short.oldest.volume_seq, first[&SHORT], "{short:?}");
    let mut b = vec![0u8; 4096];
    assert!(matches!(
        h.read_at(SHORT, first[&SHORT] - 1, 0, &mut b),
        Err(HistoryError::Expired { .. })
    ));
    h.read_at(SHORT, first[&SHORT], 0, &mut b).unwrap();
    assert!(b.iter().all(|&x| x == SHORT as u8));
    // The long window kept everything, deleted or not: as of its creation it reads zeros,
    // as of its first write that write.
    let long = h.window(LONG).unwrap();
    assert_eq!(long.oldest.volume_seq, 1, "{long:?}");
    h.read_at(LONG, first[&LONG], 0, &mut b).unwrap();
    assert!(b.iter().all(|&x| x == LONG as u8));
    // Past the long window the deleted volume's history is gone.
    rig.clock.advance(3600 * 1_000_000_000);
    h.step().unwrap();
    assert!(matches!(
        h.window(LONG),
        Err(HistoryError::UnknownVolume(2))
    ));
    assert!(h.window(SHORT).is_ok());
    // Turning history off for a volume drops what it kept.
    h.set_window(SHORT, None).unwrap();
    assert!(matches!(
        h.window(SHORT),
        Err(HistoryError::UnknownVolume(1))
    ));
    h.shutdown(false).unwrap();
    log.shutdown();
}

/// A declared gap (`RecordKind::HistoryGap`: writes history never saw) breaks the volume's
/// history as soon as the record is durable, before it is indexed, and across a restart; once
/// seeded again from the current image, the window starts there: instants before and inside
/// the gap are refused as outside it, and the writes after the seed read back.
#[test]
fn a_declared_gap_breaks_history_until_it_is_seeded_again() {
    let rig = Rig::new();
    let (log, h) = rig.open(Duration::from_secs(3600));
    let mut o = create_volume(&log);
    write_some(&log, &mut o, 40, 5);
    h.flush().unwrap();
    check_all(&h, &o, 0);
    let before_gap = *o.after.keys().last().unwrap();
    // Writes the node applied while history did not see them, then the gap that says so.
    o.image[..4096].fill(0xEE);
    let gap = append(
        &log,
        Entry::extent(RecordKind::HistoryGap, VOL, o.ts[&before_gap], 0),
    );
    // Broken at once, not at the next round.
    assert!(matches!(h.window(VOL), Err(HistoryError::Broken(VOL))));
    assert_eq!(h.broken_volumes(), vec![VOL]);
    assert!(!h.follows(VOL));
    // And after a restart, indexed or not.
    h.shutdown(false).unwrap();
    log.shutdown();
    drop((log, h));
    let (log, h) = rig.open(Duration::from_secs(3600));
    assert!(matches!(h.window(VOL), Err(HistoryError::Broken(VOL))));
    h.flush().unwrap();
    assert!(matches!(h.window(VOL), Err(HistoryError::Broken(VOL))));
    assert_eq!(h.stats().gaps.load(std::sync::atomic::Ordering::Relaxed), 1);
    // Seeded again from the current image, as of the gap record.
    let image = MemDisk::from_vec(o.image.clone());
    let at = mariner_history::SeedPoint {
        seq: gap.seq,
        timestamp_ns: gap.timestamp_ns,
        volume_seq: gap.volume_seq,
    };
    h.seed(VOL, &image, SIZE, 512, at, &[]).unwrap();
    assert!(h.follows(VOL));
    let w = h.window(VOL).unwrap();
    assert_eq!(w.oldest.volume_seq, gap.volume_seq, "{w:?}");
    let mut b = vec![0u8; 4096];
    // (The gap record is an instant of its own, @before_gap + 1: the window's start.)
    assert_eq!(gap.volume_seq, before_gap + 1);
    for asked in [before_gap - 1, before_gap] {
        let r = h.read_at(VOL, asked, 0, &mut b);
        assert!(
            matches!(r, Err(HistoryError::Expired { .. })),
            "@{asked}: {r:?}"
        );
    }
    let err = h.resolve(VOL, At::Seq(before_gap)).unwrap_err().to_string();
    assert!(err.contains("window"), "{err}");
    o.after.clear();
    o.ts.clear();
    o.after.insert(gap.volume_seq, o.image.clone());
    o.ts.insert(gap.volume_seq, gap.timestamp_ns);
    write_some(&log, &mut o, 20, 6);
    check_all(&h, &o, 0);
    h.flush().unwrap();
    check_all(&h, &o, 0);
    h.shutdown(false).unwrap();
    log.shutdown();
}

/// The index has no double-write area: a leaf a crash tore in place is found when history
/// opens, and the index is rebuilt from the digests, every instant still readable.
#[test]
fn a_torn_index_leaf_is_rebuilt_from_the_digests() {
    let rig = Rig::new();
    let (log, h) = rig.open(Duration::from_secs(3600));
    let mut o = create_volume(&log);
    write_some(&log, &mut o, 100, 3);
    // A clean stop: the leaves are on the disk.
    h.shutdown(true).unwrap();
    log.shutdown();
    drop((log, h));
    let (log, h) = rig.open(Duration::from_secs(3600));
    write_some(&log, &mut o, 100, 4);
    h.flush().unwrap();
    // Indexed, durable in the index's own log, not yet written to the leaves: the crash comes
    // as the commit writes them, and one is torn (its second sector garbage).
    h.shutdown(false).unwrap();
    log.shutdown();
    drop((log, h));
    let data = rig.files.disks()["index.data"].clone();
    let first_leaf = (0..64u64)
        .map(|b| 8192 + b * 4096)
        .find(|&at| {
            let mut head = [0u8; 8];
            data.read_at(&mut head, at).unwrap();
            head != [0; 8]
        })
        .expect("a leaf on the disk");
    data.write_at(&[0xa5; 512], first_leaf + 512).unwrap();
    let (log, h) = rig.open(Duration::from_secs(3600));
    assert_eq!(
        h.stats()
            .index_rebuilds
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    check_all(&h, &o, 0);
    h.flush().unwrap();
    check_all(&h, &o, 0);
    log.shutdown();
}
