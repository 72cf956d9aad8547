#![allow(clippy::unwrap_used, clippy::expect_used)]

//! Systematic crash points (redb's `crash_consistency.rs`): a round of appends is run once to
//! count its I/Os (writes and syncs over all devices), then once more for every k in 1..=n,
//! crashing every device at once right after the k-th I/O returns. Recovery must bring back
//! every acknowledged record with its payload, in sequence order, invent nothing, and account
//! for every sequence number up to the last one (found or voided). Unlike the timed crashes of
//! `log.rs`, no moment of a round is left to chance.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use mariner_disk::{CrashMode, Disk, Faults, FaultyDisk};
use mariner_log::{Durable, DurableSink, Entry, HolderSpec, Log, LogConfig};

const LOG_ID: u128 = 0xc7a5;

/// The one holder of log space these tests open the log with.
const CONSUMER: &str = "consumer";

fn consumer(after: u64) -> [HolderSpec; 1] {
    [HolderSpec::must_hold(CONSUMER, after, 0)]
}
const SEG: u64 = 64 * 1024;
const DEVICE_BYTES: usize = 64 * 1024 + 8 * SEG as usize;
/// Appends per wave (submitted together, then awaited) and waves per round: small enough that
/// every crash point of every round runs in a few seconds, large enough for several batches
/// per device in flight at depth 4.
const PER_WAVE: u64 = 8;
const WAVES: u64 = 5;

struct Discard;

impl DurableSink for Discard {
    fn durable(&self, _: &[Durable]) {}
}

fn cfg(depth: u32) -> LogConfig {
    LogConfig {
        segment_bytes: SEG,
        t_wait_ns: 20_000,
        device_depth: depth,
        ..LogConfig::default()
    }
}

fn payload(tag: u64, len: usize) -> Bytes {
    Bytes::from(
        (0..len)
            .map(|i| (tag as usize * 31 + i) as u8)
            .collect::<Vec<_>>(),
    )
}

/// The record `tag` of a round: its length varies so batches vary in size.
fn record_len(tag: u64) -> usize {
    512 * (1 + (tag * 7 % 5) as usize)
}

/// Where a round stands: how many I/Os returned, where it crashes, and what the devices held
/// when it did.
struct Point {
    faults: Vec<Faults>,
    ios: u64,
    crash_after: Option<u64>,
    mode: CrashMode,
    crashed: Option<Vec<FaultyDisk>>,
}

impl Point {
    fn crash(&mut self) {
        if self.crashed.is_none() {
            let mode = self.mode;
            self.crashed = Some(self.faults.iter().map(|f| f.crash_with(mode)).collect());
        }
    }
}

/// A device of a round. Every I/O of every device goes through one lock, so the crash after
/// the k-th one snapshots all devices at a single instant; the crashed originals fail every
/// later I/O, as a machine that lost power does.
#[derive(Debug)]
struct Device {
    disk: FaultyDisk,
    point: Arc<Mutex<Point>>,
}

impl std::fmt::Debug for Point {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Point(ios {}, crash after {:?})",
            self.ios, self.crash_after
        )
    }
}

impl Device {
    fn lock(&self) -> MutexGuard<'_, Point> {
        self.point.lock().unwrap_or_else(PoisonError::into_inner)
    }
    fn counted(&self, io: impl FnOnce() -> io::Result<()>) -> io::Result<()> {
        let mut p = self.lock();
        let r = io();
        p.ios += 1;
        if p.crash_after == Some(p.ios) {
            p.crash();
        }
        r
    }
}

impl Disk for Device {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let _p = self.lock();
        self.disk.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.counted(|| self.disk.write_at(buf, offset))
    }
    fn sync(&self) -> io::Result<()> {
        self.counted(|| self.disk.sync())
    }
    fn len(&self) -> io::Result<u64> {
        self.disk.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.counted(|| self.disk.set_len(len))
    }
}

/// What a round left: the I/Os it did, the records it submitted (tag → length) and the
/// sequence numbers acknowledged to it (seq → tag), and the devices as they were at the crash
/// (at the end of the round when it did not reach its crash point).
struct Round {
    ios: u64,
    submitted: BTreeMap<u64, usize>,
    acked: BTreeMap<u64, u64>,
    crashed: Vec<FaultyDisk>,
}

/// Formats `devices` devices, opens the log on them (depth `depth`) and appends `WAVES` waves
/// of `PER_WAVE` records, crashing right after I/O number `crash_after`.
fn round(
    devices: usize,
    depth: u32,
    crash_after: Option<u64>,
    mode: CrashMode,
    seed: u64,
) -> Round {
    // Formatted durably before the round starts: the round's crash points begin at open.
    let fresh: Vec<FaultyDisk> = (0..devices)
        .map(|_| FaultyDisk::new(DEVICE_BYTES, 0))
        .collect();
    let faults: Vec<Faults> = fresh.iter().map(FaultyDisk::faults).collect();
    let fresh: Vec<Arc<dyn Disk>> = fresh
        .into_iter()
        .map(|d| Arc::new(d) as Arc<dyn Disk>)
        .collect();
    Log::format(&fresh, &cfg(depth), LOG_ID).unwrap();
    let disks: Vec<FaultyDisk> = faults
        .iter()
        .enumerate()
        .map(|(i, f)| FaultyDisk::from_image(f.durable_image(), seed * 16 + i as u64))
        .collect();
    let point = Arc::new(Mutex::new(Point {
        faults: disks.iter().map(FaultyDisk::faults).collect(),
        ios: 0,
        crash_after,
        mode,
        crashed: None,
    }));
    let devs: Vec<Arc<dyn Disk>> = disks
        .into_iter()
        .map(|disk| {
            Arc::new(Device {
                disk,
                point: point.clone(),
            }) as Arc<dyn Disk>
        })
        .collect();
    let mut submitted = BTreeMap::new();
    let mut acked = BTreeMap::new();
    if let Ok((log, _)) = Log::open(devs, cfg(depth), LOG_ID, &consumer(0), Arc::new(Discard)) {
        append_waves(&log, &mut submitted, &mut acked);
        log.shutdown();
    }
    let mut p = point.lock().unwrap();
    p.crash();
    Round {
        ios: p.ios,
        submitted,
        acked,
        crashed: p.crashed.take().unwrap(),
    }
}

/// Submits the waves, each awaited before the next; stops at the first failure (the crash).
fn append_waves(log: &Log, submitted: &mut BTreeMap<u64, usize>, acked: &mut BTreeMap<u64, u64>) {
    for wave in 0..WAVES {
        let mut waits = Vec::new();
        for i in 0..PER_WAVE {
            let tag = wave * 100 + i;
            let len = record_len(tag);
            match log.append(Entry::write(1, tag, payload(tag, len))) {
                Ok(w) => {
                    submitted.insert(tag, len);
                    waits.push((tag, w));
                }
                Err(_) => break,
            }
        }
        let mut failed = waits.len() < PER_WAVE as usize;
        for (tag, w) in waits {
            match w.blocking_recv() {
                Ok(Ok(a)) => {
                    acked.insert(a.seq, tag);
                }
                _ => failed = true,
            }
        }
        if failed {
            return;
        }
    }
}

/// Recovers the crashed devices of `r` and checks what came back (see the module doc).
fn check_recovery(r: &Round, depth: u32, what: &str) {
    let devs: Vec<Arc<dyn Disk>> = r
        .crashed
        .iter()
        .map(|d| Arc::new(FaultyDisk::from_image(d.faults().live_image(), 1)) as Arc<dyn Disk>)
        .collect();
    let (log, rec) = Log::open(devs, cfg(depth), LOG_ID, &consumer(0), Arc::new(Discard))
        .unwrap_or_else(|e| panic!("{what}: recovery failed: {e}"));
    let seqs: Vec<u64> = rec.records.iter().map(|f| f.header.seq).collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "{what}: records not in sequence order: {seqs:?}"
    );
    let mut tags = BTreeSet::new();
    for f in &rec.records {
        let tag = f.header.offset;
        let len = *r.submitted.get(&tag).unwrap_or_else(|| {
            panic!(
                "{what}: seq {} holds tag {tag}, never submitted",
                f.header.seq
            )
        });
        assert!(tags.insert(tag), "{what}: tag {tag} recovered twice");
        let (_, data) = log.read(f.addr, f.header.seq).unwrap();
        assert_eq!(
            data,
            payload(tag, len).to_vec(),
            "{what}: seq {} payload",
            f.header.seq
        );
    }
    let found: BTreeMap<u64, u64> = rec
        .records
        .iter()
        .map(|f| (f.header.seq, f.header.offset))
        .collect();
    for (seq, tag) in &r.acked {
        assert_eq!(
            found.get(seq),
            Some(tag),
            "{what}: acknowledged seq {seq} (tag {tag}) lost"
        );
    }
    // One device, one batch at a time: batches are written and synced in sequence order, so
    // an acknowledged record makes every record before it durable, and recovery voids only
    // numbers above the last acknowledged one.
    if r.crashed.len() == 1 && depth == 1 {
        let last_acked = r.acked.keys().next_back().copied().unwrap_or(0);
        let below: Vec<_> = rec.voided.iter().filter(|&&v| v < last_acked).collect();
        assert!(
            below.is_empty(),
            "{what}: voided {below:?} below the last acknowledged seq {last_acked}"
        );
    }
    let mut all: Vec<u64> = seqs.iter().chain(&rec.voided).copied().collect();
    all.sort_unstable();
    assert_eq!(
        all,
        (1..=rec.last_seq).collect::<Vec<_>>(),
        "{what}: holes or extras"
    );
    log.shutdown();
}

/// Every crash point of a round of `devices` devices at depth `depth`, each under every crash
/// mode that matters: only synced data survives, or the unsynced writes arrive in part, torn
/// and reordered (drawn from the seed).
fn every_crash_point(devices: usize, depth: u32) {
    let whole = round(devices, depth, None, CrashMode::KeepUnsynced, 0);
    assert_eq!(
        whole.acked.len() as u64,
        WAVES * PER_WAVE,
        "the uncrashed round completes"
    );
    check_recovery(&whole, depth, "no crash");
    eprintln!(
        "{devices} device(s), depth {depth}: {} I/Os per round",
        whole.ios
    );
    assert!(
        whole.ios > 2 * WAVES,
        "a round does more than one batch per wave: {}",
        whole.ios
    );
    for k in 1..=whole.ios {
        for (mode, seed) in [(CrashMode::LoseUnsynced, k), (CrashMode::Random, k + 1000)] {
            let r = round(devices, depth, Some(k), mode, seed);
            check_recovery(
                &r,
                depth,
                &format!("crash after I/O {k} of {} ({mode:?})", whole.ios),
            );
        }
    }
}

#[test]
fn every_crash_point_one_device() {
    every_crash_point(1, 1);
}

#[test]
fn every_crash_point_two_devices_four_batches_in_flight() {
    every_crash_point(2, 4);
}
