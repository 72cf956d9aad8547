#![allow(clippy::unwrap_used, clippy::expect_used)]

//! Holders of log space (crate::holders): a must-hold holder makes writers wait, a shrinkable
//! one is cut when they would, a bounded one is cut past its limit, and a restart keeps what
//! the lowest holder holds while replaying only what the store lacks.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use mariner_disk::{Disk, MemDisk};
use mariner_log::{
    Appended, Durable, DurableSink, Entry, HoldKind, HolderSpec, Log, LogConfig, LogError, Recovery,
};

const LOG_ID: u128 = 0x401d;
const SEG: u64 = 64 * 1024;
/// Segments of the test log.
const SEGMENTS: usize = 4;

struct Ignore;

impl DurableSink for Ignore {
    fn durable(&self, _: &[Durable]) {}
}

fn cfg() -> LogConfig {
    LogConfig {
        segment_bytes: SEG,
        t_wait_ns: 20_000,
        ..LogConfig::default()
    }
}

fn device() -> Vec<Arc<dyn Disk>> {
    let devs: Vec<Arc<dyn Disk>> =
        vec![Arc::new(MemDisk::new(64 * 1024 + SEGMENTS * SEG as usize))];
    Log::format(&devs, &cfg(), LOG_ID).unwrap();
    devs
}

fn open(devs: &[Arc<dyn Disk>], holders: &[HolderSpec]) -> Log {
    reopen(devs, holders).0
}

/// The store's holder at (watermark, timestamp) beside a shrinkable history at `history`.
fn store_and_history(store: (u64, u64), history: u64) -> [HolderSpec; 2] {
    [
        HolderSpec::must_hold("store", store.0, store.1),
        HolderSpec::new("history", HoldKind::Shrinkable, history, 0),
    ]
}

/// Opens the log, with what recovery found.
fn reopen(devs: &[Arc<dyn Disk>], holders: &[HolderSpec]) -> (Log, Recovery) {
    Log::open(devs.to_vec(), cfg(), LOG_ID, holders, Arc::new(Ignore)).unwrap()
}

fn write(i: u64) -> Entry {
    Entry::write(1, i * 4096, Bytes::from(vec![i as u8; 4096]))
}

fn append_sync(log: &Log, e: Entry) -> Appended {
    log.append(e).unwrap().blocking_recv().unwrap().unwrap()
}

/// Appends `n` writes, each waited for at most `patience`; returns the acknowledged ones and
/// whether one had to wait longer (a writer waiting for space).
fn append_within(log: &Log, n: u64, patience: Duration) -> (Vec<Appended>, bool) {
    let mut acked = Vec::new();
    for i in 0..n {
        let mut rx = log.append(write(i)).unwrap();
        let start = std::time::Instant::now();
        loop {
            match rx.try_recv() {
                Ok(r) => {
                    acked.push(r.unwrap());
                    break;
                }
                Err(_) if start.elapsed() > patience => return (acked, true),
                Err(_) => std::thread::sleep(Duration::from_millis(1)),
            }
        }
    }
    (acked, false)
}

#[test]
fn a_shrinkable_holder_is_cut_instead_of_making_writers_wait() {
    let devs = device();
    let holders = store_and_history((0, 0), 0);
    let log = open(&devs, &holders);
    let (store, history) = (log.holder("store").unwrap(), log.holder("history").unwrap());
    // The store releases what it has; history never does. Three times the log is written.
    let mut last = 0;
    for i in 0..3 * 15 * SEGMENTS as u64 {
        last = append_sync(&log, write(i)).seq;
        store.release(last);
    }
    let cut = history.cut_to().expect("history was cut");
    assert!(cut > 0 && cut < last, "cut to {cut} of {last}");
    assert!(history.cuts() > 0);
    assert_eq!(history.released(), cut, "a cut raises the watermark");
    assert_eq!(store.cut_to(), None, "a must-hold holder is never cut");
    assert_eq!(log.stats().stalled.load(Relaxed), 0);
}

#[test]
fn a_must_hold_holder_still_makes_writers_wait_beside_a_shrinkable_one() {
    let devs = device();
    let holders = store_and_history((0, 0), 0);
    let log = open(&devs, &holders);
    let (acked, waited) = append_within(&log, 200, Duration::from_millis(200));
    assert!(waited, "the store released nothing: writers must wait");
    assert!(log.stats().stalled.load(Relaxed) > 0);
    // History released everything the store has not: nothing it may give up is enough.
    let history = log.holder("history").unwrap();
    history.release(acked.last().unwrap().seq);
    assert!(log.stats().stalled.load(Relaxed) > 0);
    log.holder("store")
        .unwrap()
        .release(acked.last().unwrap().seq);
    assert_eq!(log.stats().stalled.load(Relaxed), 0);
}

#[test]
fn a_bounded_holder_is_cut_past_its_limit_and_after_history_when_writers_would_wait() {
    let devs = device();
    let holders = [
        HolderSpec::must_hold("store", 0, 0),
        HolderSpec::new("replica", HoldKind::Bounded { max_bytes: SEG }, 0, 0),
    ];
    let log = open(&devs, &holders);
    let (store, replica) = (log.holder("store").unwrap(), log.holder("replica").unwrap());
    for _ in 0..3 * 15 * SEGMENTS {
        let (a, waited) = append_within(&log, 1, Duration::from_secs(5));
        assert!(!waited, "a replica over its limit must not stop writers");
        store.release(a[0].seq);
    }
    let cut = replica.cut_to().expect("the replica was cut");
    assert!(cut > 0);
    // Beyond what the store holds, it keeps at most its limit (one segment) and the
    // current one.
    assert!(
        replica.segments_held() <= 2 + store.segments_held(),
        "replica holds {} segments, store {}",
        replica.segments_held(),
        store.segments_held()
    );

    // A limit larger than the log, beside history: when writers would wait, history gives
    // way first; a replica that keeps up is never cut.
    let big = HoldKind::Bounded {
        max_bytes: 2 * SEGMENTS as u64 * SEG,
    };
    let devs = device();
    let holders = [
        HolderSpec::must_hold("store", 0, 0),
        HolderSpec::new("history", HoldKind::Shrinkable, 0, 0),
        HolderSpec::new("replica", big, 0, 0),
    ];
    let log = open(&devs, &holders);
    let (store, replica) = (log.holder("store").unwrap(), log.holder("replica").unwrap());
    for _ in 0..3 * 15 * SEGMENTS {
        let (a, waited) = append_within(&log, 1, Duration::from_secs(5));
        assert!(!waited, "writers never wait for history or a replica");
        store.release(a[0].seq);
        replica.release(a[0].seq);
    }
    assert!(log.holder("history").unwrap().cut_to().is_some());
    assert_eq!(replica.cut_to(), None, "history gives way before a replica");

    // Alone beside the store, a replica that releases nothing is cut rather than stop the
    // writers, even within its limit.
    let devs = device();
    let holders = [
        HolderSpec::must_hold("store", 0, 0),
        HolderSpec::new("replica", big, 0, 0),
    ];
    let log = open(&devs, &holders);
    let store = log.holder("store").unwrap();
    for _ in 0..3 * 15 * SEGMENTS {
        let (a, waited) = append_within(&log, 1, Duration::from_secs(5));
        assert!(!waited, "writers never wait for a replica");
        store.release(a[0].seq);
    }
    assert!(log.holder("replica").unwrap().cut_to().is_some());
}

/// History holds old records the store has applied: after a restart the store is handed only
/// what it lacks, history's records are still there (readable at their addresses), and new
/// writes do not overwrite them.
#[test]
fn a_restart_keeps_what_the_lowest_holder_holds_and_replays_what_the_store_lacks() {
    let devs = device();
    let holders = store_and_history((0, 0), 0);
    let log = open(&devs, &holders);
    let store = log.holder("store").unwrap();
    let acked: Vec<Appended> = (0..30).map(|i| append_sync(&log, write(i))).collect();
    let applied = acked[19];
    store.release(applied.seq);
    let used = log.stats().segments_used.load(Relaxed);
    log.shutdown();

    let holders = store_and_history((applied.seq, applied.timestamp_ns), 0);
    let (log, rec) = reopen(&devs, &holders);
    let replayed: Vec<u64> = rec.records.iter().map(|f| f.header.seq).collect();
    let lacked: Vec<u64> = acked[20..].iter().map(|a| a.seq).collect();
    assert_eq!(
        replayed, lacked,
        "the store is handed what it lacks, no more"
    );
    // History's segments stay in use, those holding only what the store applied included.
    assert!(
        used >= 2,
        "the test needs records the store applied in a segment of their own"
    );
    assert_eq!(log.stats().segments_used.load(Relaxed), used);
    for a in &acked {
        let (h, payload) = log.read(a.addr, a.seq).unwrap();
        assert_eq!(h.seq, a.seq);
        assert_eq!(payload.len(), 4096);
    }
    // The store keeps releasing; history holds: the next writes cut history rather than
    // wait, and only once the log is full.
    let store = log.holder("store").unwrap();
    let history = log.holder("history").unwrap();
    let mut n = 0;
    while history.cut_to().is_none() {
        let a = append_sync(&log, write(100 + n));
        store.release(a.seq);
        n += 1;
        assert!(n < 1000, "history is never cut");
    }
    // Two segments were free after the restart: a segment's worth (15 writes) at least
    // went in before history had to give way.
    assert!(
        n >= 15,
        "history was cut after {n} writes, before the log was full"
    );
}

/// A cut is not saved by the log: after a restart a holder finds it out from
/// `Recovery::first_kept`, the first record the log still has on each device.
#[test]
fn after_a_restart_the_first_record_kept_shows_a_cut_the_holder_did_not_save() {
    let devs = device();
    let holders = store_and_history((0, 0), 0);
    let log = open(&devs, &holders);
    let (store, history) = (log.holder("store").unwrap(), log.holder("history").unwrap());
    let mut acked = Vec::new();
    while history.cut_to().is_none() {
        let a = append_sync(&log, write(acked.len() as u64));
        store.release(a.seq);
        acked.push(a);
        assert!(acked.len() < 1000, "history is never cut");
    }
    let cut = history.cut_to().unwrap();
    let last = acked.last().unwrap().seq;
    log.shutdown();

    // History saved nothing (watermark 0), the store everything.
    let holders = store_and_history((last, 0), 0);
    let (log, rec) = reopen(&devs, &holders);
    assert_eq!(rec.first_kept.len(), 1);
    let first = rec.first_kept[0].expect("the device keeps records");
    assert_eq!(
        first,
        cut + 1,
        "the records through the cut are gone, the next one is kept"
    );
    for a in acked.iter().filter(|a| a.seq >= first) {
        log.read(a.addr, a.seq).unwrap();
    }
    assert!(
        log.read(acked[0].addr, acked[0].seq).is_err(),
        "the first record was written over"
    );
    // Without a cut, the first record kept is at or below what the lowest holder needs.
    log.shutdown();
    let holders = store_and_history((last, 0), cut);
    let (_, rec) = reopen(&devs, &holders);
    assert!(rec.first_kept[0].is_some_and(|f| f <= cut + 1));
}

#[test]
fn opening_without_a_holder_or_with_a_name_twice_is_refused() {
    let devs = device();
    let open = |holders: &[HolderSpec]| {
        Log::open(devs.to_vec(), cfg(), LOG_ID, holders, Arc::new(Ignore)).map(|_| ())
    };
    assert!(matches!(open(&[]), Err(LogError::Config(_))));
    let twice = [
        HolderSpec::must_hold("store", 0, 0),
        HolderSpec::new("store", HoldKind::Shrinkable, 0, 0),
    ];
    assert!(matches!(open(&twice), Err(LogError::Config(_))));
    let log = Log::open(
        devs.to_vec(),
        cfg(),
        LOG_ID,
        &[HolderSpec::must_hold("store", 0, 0)],
        Arc::new(Ignore),
    )
    .unwrap()
    .0;
    assert!(matches!(log.holder("history"), Err(LogError::Config(_))));
}
