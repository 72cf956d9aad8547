#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Model-based test of the history engine over the real log, the real BOSC index and real
//! base images, history's files and the log device on fault-injecting disks, with an
//! injected clock: random writes, trims and write-zeroes, clock jumps that expire records,
//! indexing rounds, logs small enough to wrap and to make history shrink, and crashes — at
//! random points, and inside a history round by failing its I/O after a few operations.
//! After each step, reads as of a sample of instants (each write's, and the one before it)
//! must equal an oracle of the volume's bytes after every acknowledged write, or fail as
//! expired when older than what history says it keeps; while history neither shrank nor was
//! cut, every instant younger than the window must be readable.
//!
//! `MARINER_HISTORY_MODEL_CASES` sets the number of cases (default: as many as fit in about
//! a minute, at least 10), `MARINER_HISTORY_MODEL_SEED` the first seed; a failure names its
//! seed. One step in a hundred writes more than the log holds with no round between, so the
//! log cuts history; a history the log cut is seeded again after the round that finds it
//! broken, as the node does while serving (or at the next open, as the node does at start).
//! The store's log holder stands beside history's, as in the node. Counters over the run
//! assert that it covered crashes inside roll-forwards, shrinks, reads from base images, log
//! wraps, seeds while running, and rollbacks: finished (and undone), and resumed after a
//! crash cut them short (`model/rollback.rs`). After a finished rollback the volume must
//! equal the oracle as of its `to` (after an undo: as of the rollback's `from`).
//! `MARINER_HISTORY_MODEL_TRACE` and `MARINER_HISTORY_MODEL_WATCH`: see below.

#[path = "model/machine.rs"]
mod machine;
#[path = "model/rollback.rs"]
mod rollback;

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use mariner_disk::Disk;
use mariner_history::{At, History, HistoryError, SeedPoint};
use mariner_log::clock::{Clock, VirtualClock};
use mariner_log::{Entry, HolderSpec, Log, RecordKind};

use machine::{history_cfg, log_cfg, Machine, Rng};

const LOG_ID: u128 = 0x0DE1_4157;
/// The store's log holder (must-hold): the oracle stands in for its images.
const STORE: &str = "store";
const VOL: u32 = 5;
const SECTORS: u64 = 256;
const SIZE: u64 = SECTORS * 512;
const STEPS: usize = 200;
const SEGMENT: u64 = 64 << 10;
/// A log small enough to wrap about twice a case.
const LOG_SEGMENTS: u64 = 12;

/// The oracle applied every durable record: the store's holder lets the log have them.
fn applied(log: &Log) {
    let durable = log.stats().durable_seq.load(Relaxed);
    log.holder(STORE).unwrap().release(durable);
}

/// One acknowledged write (or trim) and the volume after it.
struct Version {
    vseq: u64,
    ts: u64,
    image: Arc<Vec<u8>>,
}

#[derive(Default)]
struct Counters {
    crashes: u64,
    crashes_in_roll_forward: u64,
    shrinks: u64,
    cuts: u64,
    base_reads: u64,
    log_wraps: u64,
    reads_checked: u64,
    expired_checked: u64,
    resumed_rollbacks: u64,
    rollbacks_finished: u64,
    undos_finished: u64,
    /// Rollbacks whose `to` a shrink or a cut took away.
    rollbacks_cancelled: u64,
    /// Histories the log cut, seeded again without a restart.
    live_reseeds: u64,
    /// Opens after a crash that found a leaf of the index torn and rebuilt it from the
    /// digests (the index has no double-write area).
    index_rebuilds: u64,
}

struct Case {
    rng: Rng,
    m: Machine,
    clock: Arc<VirtualClock>,
    window: Duration,
    log: Option<Log>,
    h: Option<History>,
    versions: Vec<Version>,
    image: Vec<u8>,
    /// History shrank or was cut in this case: younger instants may be gone.
    gave_way: bool,
    appended_bytes: u64,
    seed: u64,
    /// The `from` of the last rollback finished: an undo rolls back to it.
    undo: Option<u64>,
    /// The rollback being run is an undo.
    undoing: bool,
    /// The newest record appended through [`Case::append`] or found at open.
    last_seq: u64,
    /// What the store's holder released (the store's saved watermark).
    store_seq: u64,
}

impl Case {
    fn open(&mut self) {
        let h = History::open_with_clock(
            self.m.mem_files(),
            history_cfg(self.window),
            self.clock.clone(),
        )
        .unwrap_or_else(|e| panic!("seed {}: history open: {e}", self.seed));
        // The store's holder beside history's, as in the node: it holds what is not yet in
        // the images, and the oracle applies every write when it is acknowledged. Without a
        // must-hold holder the log's recovery cannot tell records it cut from history from
        // records that never became durable (crates/log/src/recover.rs).
        let (log, rec) = Log::open_with_clock(
            vec![self.m.log_dev.clone() as Arc<dyn Disk>],
            log_cfg(),
            LOG_ID,
            &[
                h.holder_spec(),
                HolderSpec::must_hold(STORE, self.store_seq, 0),
            ],
            h.sink(),
            self.clock.clone(),
        )
        .unwrap_or_else(|e| panic!("seed {}: log open: {e}", self.seed));
        h.start(log.clone(), &rec)
            .unwrap_or_else(|e| panic!("seed {}: history start: {e}", self.seed));
        applied(&log);
        // A volume whose history broke (the log cut it) is seeded again, as the node does
        // at start-up, from the current image (the oracle's).
        let broken = !h.follows(VOL) && !self.versions.is_empty();
        self.last_seq = self.last_seq.max(rec.last_seq);
        self.log = Some(log);
        self.h = Some(h);
        if broken {
            self.seed_from_oracle(rec.last_seq, rec.last_ts, "reseed");
        }
    }

    fn close(&mut self) {
        if let Some(h) = self.h.take() {
            let _ = h.shutdown(false);
        }
        if let Some(log) = self.log.take() {
            // The store saves what it applied before it lets the log have it.
            self.store_seq = log.holder(STORE).unwrap().released();
            log.shutdown();
        }
    }

    fn h(&self) -> &History {
        self.h.as_ref().unwrap()
    }

    fn append(&mut self, e: Entry) -> mariner_log::Appended {
        self.appended_bytes += u64::from(e.length).min(e.payload.len() as u64) + 128;
        let log = self.log.as_ref().unwrap();
        let a = log
            .append(e)
            .unwrap()
            .blocking_recv()
            .unwrap()
            .unwrap_or_else(|e| panic!("seed {}: append: {e}", self.seed));
        self.last_seq = a.seq;
        applied(log);
        a
    }

    fn record(&mut self, a: mariner_log::Appended) {
        self.versions.push(Version {
            vseq: a.volume_seq,
            ts: a.timestamp_ns,
            image: Arc::new(self.image.clone()),
        });
    }

    fn write(&mut self) {
        let start = self.rng.below(SECTORS);
        let len = (1 + self.rng.below(64)).min(SECTORS - start);
        let (off, bytes) = (start * 512, (len * 512) as usize);
        let range = off as usize..off as usize + bytes;
        let a = match self.rng.below(10) {
            0 => {
                self.image[range].fill(0);
                self.append(Entry::extent(RecordKind::Trim, VOL, off, bytes as u32))
            }
            1 => {
                self.image[range].fill(0);
                self.append(Entry::extent(
                    RecordKind::WriteZeroes,
                    VOL,
                    off,
                    bytes as u32,
                ))
            }
            _ => {
                let data: Vec<u8> = (0..bytes).map(|_| self.rng.next() as u8).collect();
                self.image[range].copy_from_slice(&data);
                self.append(Entry::write(VOL, off, Bytes::from(data)))
            }
        };
        self.record(a);
    }

    fn round(&mut self) {
        let r = self.h().step();
        r.unwrap_or_else(|e| panic!("seed {}: history round: {e}", self.seed));
    }

    /// A volume whose history broke while history ran is seeded again at once, as the node
    /// does while serving (crates/node/src/history/reseed.rs): from the current image (the
    /// oracle's), as of the newest durable record.
    fn reseed_if_broken(&mut self, c: &mut Counters) {
        if !self.h().broken_volumes().contains(&VOL) {
            return;
        }
        // The newest record: appended here, found at open, or a rollback's.
        let durable = self.log.as_ref().unwrap().stats().durable_seq.load(Relaxed);
        let ts = self.versions.last().unwrap().ts;
        self.seed_from_oracle(self.last_seq.max(durable), ts, "reseed while running");
        assert!(
            self.h().follows(VOL),
            "seed {}: still broken after a reseed",
            self.seed
        );
        c.live_reseeds += 1;
    }

    /// Seeds the volume's history from the oracle's current image, as of log record `seq`
    /// (timestamp `ts`) and the newest acknowledged write.
    fn seed_from_oracle(&self, seq: u64, ts: u64, what: &str) {
        let image = mariner_disk::MemDisk::from_vec(self.image.clone());
        let at = SeedPoint {
            seq,
            timestamp_ns: ts,
            volume_seq: self.versions.last().unwrap().vseq,
        };
        self.h()
            .seed(VOL, &image, SIZE, 512, at, &[])
            .unwrap_or_else(|e| panic!("seed {}: {what}: {e}", self.seed));
    }

    fn crash(&mut self, c: &mut Counters) {
        self.note(c);
        self.close();
        self.m.crash();
        c.crashes += 1;
        self.open();
        if self.h().stats().resumed_rolls.load(Relaxed) > 0 {
            c.crashes_in_roll_forward += 1;
        }
        c.index_rebuilds += self.h().stats().index_rebuilds.load(Relaxed);
    }

    fn note(&mut self, c: &mut Counters) {
        if let Some(h) = &self.h {
            let s = h.stats();
            let (shrinks, cuts) = (s.shrinks.load(Relaxed), s.cuts.load(Relaxed));
            if shrinks + cuts > 0 {
                self.gave_way = true;
            }
            c.shrinks += shrinks;
            c.cuts += cuts;
        }
    }

    /// Reads as of a sample of instants, and the window's promise.
    fn check(&mut self, c: &mut Counters, all: bool) {
        let h = self.h.as_ref().unwrap();
        let w = match h.window(VOL) {
            Ok(w) => w,
            Err(HistoryError::Broken(_)) => {
                self.gave_way = true;
                return;
            }
            Err(e) => panic!("seed {}: window: {e}", self.seed),
        };
        let newest = self.versions.last().unwrap();
        assert_eq!(
            w.newest.volume_seq, newest.vseq,
            "seed {}: the newest instant is not the last acknowledged write",
            self.seed
        );
        let s = h.stats();
        if s.shrinks.load(Relaxed) + s.cuts.load(Relaxed) > 0 {
            self.gave_way = true;
        }
        if !self.gave_way {
            // Every instant younger than the window can be read: the oldest readable one is
            // not newer than the newest write older than the window (or the creation).
            let cutoff = self
                .clock
                .wall_ns()
                .saturating_sub(self.window.as_nanos() as u64);
            let bound = self
                .versions
                .iter()
                .take_while(|v| v.ts < cutoff)
                .last()
                .unwrap_or(&self.versions[0])
                .vseq;
            assert!(
                w.oldest.volume_seq <= bound,
                "seed {}: history dropped @{}..@{} while younger than the window",
                self.seed,
                bound,
                w.oldest.volume_seq
            );
        }
        let n = self.versions.len();
        let picks: Vec<usize> = if all {
            (0..n).collect()
        } else {
            let mut p: Vec<usize> = (0..6).map(|_| self.rng.below(n as u64) as usize).collect();
            p.push(n - 1);
            if trace() {
                p = (0..n).collect();
            }
            p
        };
        let mut buf = vec![0u8; SIZE as usize];
        let rolled = w.oldest.volume_seq > self.versions[0].vseq;
        let base_reads = s.base_reads.load(Relaxed);
        for i in picks {
            let v = &self.versions[i];
            let r = h.read_at(VOL, v.vseq, 0, &mut buf);
            if v.vseq < w.oldest.volume_seq {
                assert!(
                    matches!(r, Err(HistoryError::Expired { .. })),
                    "seed {}: @{} is older than the window's @{} yet read {:?}",
                    self.seed,
                    v.vseq,
                    w.oldest.volume_seq,
                    r.err()
                );
                c.expired_checked += 1;
                continue;
            }
            match r {
                Ok(()) => {}
                Err(HistoryError::Broken(_)) => {
                    // The log cut history while this ran: it is unreadable until seeded.
                    self.gave_way = true;
                    return;
                }
                Err(e) => panic!("seed {}: read as of @{}: {e}", self.seed, v.vseq),
            }
            if buf != *v.image {
                let at = buf
                    .iter()
                    .zip(v.image.iter())
                    .position(|(a, b)| a != b)
                    .unwrap_or(0);
                if trace() {
                    let sector = at / 512 * 512..at / 512 * 512 + 512;
                    let changed: Vec<u64> = self
                        .versions
                        .windows(2)
                        .filter(|w| w[0].image[sector.clone()] != w[1].image[sector.clone()])
                        .map(|w| w[1].vseq)
                        .collect();
                    let matches: Vec<u64> = self
                        .versions
                        .iter()
                        .filter(|o| o.image[sector.clone()] == buf[sector.clone()])
                        .map(|o| o.vseq)
                        .collect();
                    eprintln!(
                        "sector written at {changed:?}; read equals the versions {matches:?}"
                    );
                    eprintln!("index levels {:?}", h.index().levels());
                    for p in mariner_history::pieces::covering((at / 512) as u64) {
                        let found = h
                            .index()
                            .tree()
                            .newest_at_or_before(VOL, p.key_lba(), v.vseq);
                        eprintln!("level {}: {:?}", p.level, found.map(|f| f.map(|(s, _)| s)));
                    }
                }
                panic!(
                    "seed {}: as of @{} byte {at} differs (sector {}); window @{}..@{}, {} versions, last @{}",
                    self.seed,
                    v.vseq,
                    at / 512,
                    w.oldest.volume_seq,
                    w.newest.volume_seq,
                    self.versions.len(),
                    self.versions.last().unwrap().vseq
                );
            }
            // Its time resolves to it when no other write shares the timestamp (and history
            // reaches back to it: after a reseed the window starts at the seed, later than the
            // write the base is as of).
            let unique = self.versions.iter().filter(|o| o.ts == v.ts).count() == 1;
            if unique && v.ts >= w.oldest.timestamp_ns {
                let p = h.resolve(VOL, At::Time(v.ts)).unwrap_or_else(|e| {
                    panic!("seed {}: time of @{} ({} ns): {e}", self.seed, v.vseq, v.ts)
                });
                assert_eq!(
                    p.volume_seq, v.vseq,
                    "seed {}: time of @{}",
                    self.seed, v.vseq
                );
            }
            c.reads_checked += 1;
        }
        if rolled {
            // Reads that took sectors from a base image rolled forward (not the empty one).
            c.base_reads += s.base_reads.load(Relaxed) - base_reads;
        }
    }
}

impl Case {
    /// `MARINER_HISTORY_MODEL_WATCH=sector:vseq`: prints after each step what the index holds
    /// at or below the instant for the sector's pieces, and history's sequence numbers.
    fn watch(&self) {
        let Some(w) = std::env::var("MARINER_HISTORY_MODEL_WATCH").ok() else {
            return;
        };
        let (sector, vseq) = w.split_once(':').unwrap();
        let (sector, vseq): (u64, u64) = (sector.parse().unwrap(), vseq.parse().unwrap());
        let h = self.h();
        let s = h.stats();
        let found: Vec<_> = mariner_history::pieces::covering(sector)
            .into_iter()
            .map(|p| {
                h.index()
                    .tree()
                    .newest_at_or_before(VOL, p.key_lba(), vseq)
                    .map(|f| f.map(|(s, _)| s))
            })
            .collect();
        eprintln!(
            "  watch: {found:?} indexed {} saved {} log last {}",
            s.indexed_seq.load(Relaxed),
            s.saved_seq.load(Relaxed),
            self.last_seq
        );
    }
}

/// `MARINER_HISTORY_MODEL_TRACE`: print each step, and check every instant after it.
fn trace() -> bool {
    std::env::var_os("MARINER_HISTORY_MODEL_TRACE").is_some()
}

fn run_case(seed: u64, c: &mut Counters) {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let window = Duration::from_secs(10 + rng.below(300));
    let clock = Arc::new(VirtualClock::new(1_800_000_000_000_000_000));
    let mut case = Case {
        rng,
        m: Machine::new(seed),
        clock,
        window,
        log: None,
        h: None,
        versions: Vec::new(),
        image: vec![0; SIZE as usize],
        gave_way: false,
        appended_bytes: 0,
        seed,
        undo: None,
        undoing: false,
        last_seq: 0,
        store_seq: 0,
    };
    case.open();
    let a = case.append(Entry::extent(RecordKind::VolumeCreated, VOL, SIZE, 512));
    case.record(a);
    let log_bytes = LOG_SEGMENTS * SEGMENT;
    for _ in 0..STEPS {
        let pick = case.rng.below(100);
        if trace() {
            eprintln!(
                "step {pick}, newest @{}",
                case.versions.last().map_or(0, |v| v.vseq)
            );
        }
        match pick {
            0 => {
                // A burst with no history round in it: more than the log holds, so the log
                // cuts history and the next round seeds it again.
                for _ in 0..80 {
                    case.write();
                }
            }
            1..=49 => case.write(),
            50..=54 => case.rollback(c),
            55..=69 => {
                let ns = case.rng.below(20_000_000_000);
                case.clock.advance(ns);
            }
            70..=89 => {
                case.round();
                case.reseed_if_broken(c);
            }
            90..=94 => {
                // A round the machine dies in.
                case.m.budget.store(case.rng.below(40) as i64, Relaxed);
                let _ = case.h().step();
                case.crash(c);
            }
            _ => case.crash(c),
        }
        case.watch();
        case.check(c, false);
    }
    case.h().flush().unwrap();
    case.check(c, true);
    case.note(c);
    c.log_wraps += case.appended_bytes / log_bytes;
    case.close();
}

/// Seeds that found bugs, run every time: 159 — the log cut history, and the machine crashed
/// before history noted it; at the next start history claimed the records it had lost
/// (`Inner::cut_before_start`).
const FOUND: [u64; 1] = [159];

#[test]
fn the_seeds_that_found_bugs_pass() {
    let mut c = Counters::default();
    for seed in FOUND {
        run_case(seed, &mut c);
    }
    assert!(
        c.crashes > 0 && c.cuts > 0,
        "seed 159 no longer crashes after a cut"
    );
}

#[test]
fn history_reads_every_instant_it_keeps_through_crashes_expiry_and_shrinking() {
    let first: u64 = std::env::var("MARINER_HISTORY_MODEL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let cases: Option<u64> = std::env::var("MARINER_HISTORY_MODEL_CASES")
        .ok()
        .and_then(|s| s.parse().ok());
    let budget = Duration::from_secs(60);
    let started = Instant::now();
    let mut c = Counters::default();
    let mut n = 0;
    loop {
        // About a minute, longer (up to three) on a slow machine until the run covered what
        // it must.
        let covered = [
            c.crashes_in_roll_forward,
            c.shrinks,
            c.base_reads,
            c.log_wraps,
            c.resumed_rollbacks,
            c.rollbacks_finished + c.undos_finished,
            c.live_reseeds,
        ]
        .iter()
        .all(|&k| k >= 50);
        match cases {
            Some(k) if n >= k => break,
            None if n >= 10 && started.elapsed() > budget && covered => break,
            None if started.elapsed() > 3 * budget => break,
            _ => {}
        }
        run_case(first + n, &mut c);
        n += 1;
    }
    eprintln!(
        "{n} cases: {} crashes ({} inside a roll-forward), {} shrinks, {} cuts, {} base reads, \
         {} log wraps, {} reads and {} expired instants checked; rollbacks: {} finished, {} \
         undone, {} resumed, {} cancelled; {} seeded again while running; {} index rebuilds",
        c.crashes,
        c.crashes_in_roll_forward,
        c.shrinks,
        c.cuts,
        c.base_reads,
        c.log_wraps,
        c.reads_checked,
        c.expired_checked,
        c.rollbacks_finished,
        c.undos_finished,
        c.resumed_rollbacks,
        c.rollbacks_cancelled,
        c.live_reseeds,
        c.index_rebuilds
    );
    if cases.is_none() {
        for (what, count) in [
            ("crashes inside a roll-forward", c.crashes_in_roll_forward),
            ("shrinks", c.shrinks),
            ("reads from a base image", c.base_reads),
            ("log wraps", c.log_wraps),
            ("resumed rollbacks", c.resumed_rollbacks),
            (
                "rollbacks and undos finished",
                c.rollbacks_finished + c.undos_finished,
            ),
        ] {
            assert!(count >= 50, "the run covered only {count} {what}");
        }
    }
}
