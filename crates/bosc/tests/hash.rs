#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The hash table on BOSC against a HashMap oracle across crashes, and the plain read/write
//! table against the same oracle. Small pages, so pages fill and puts probe.
//!
//! The disks crash while the engine still runs (it is dropped afterwards, writing to dead
//! devices). Operations here are synchronous, one at a time, so a crash meets unsynced
//! data-disk writes but a settled log; tests/model.rs crashes with log writes in flight.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use mariner_bosc::hash::{BoscHash, HashApp, PlainHash};
use mariner_bosc::{Bosc, BoscConfig, Durability};
use mariner_disk::{CrashMode, Disk, FaultyDisk, MemDisk};
use mariner_log::{Log, LogConfig};

const PAGES: u64 = 48;
const LOG_ID: u128 = 0x4A54;

fn cfg() -> BoscConfig {
    BoscConfig {
        block_bytes: 512,
        block_count: PAGES,
        memory_budget_bytes: 8192,
        runs_per_cycle: 4,
        background: None,
        ..BoscConfig::default()
    }
}

fn log_cfg() -> LogConfig {
    LogConfig {
        segment_bytes: 64 * 1024,
        t_wait_ns: 0,
        ..LogConfig::default()
    }
}

fn open(data: &Arc<dyn Disk>, log: &Arc<dyn Disk>) -> BoscHash {
    let durability = Durability::OwnLog {
        devices: vec![Arc::clone(log)],
        log: log_cfg(),
        log_id: LOG_ID,
        volume: 1,
    };
    let (b, _) = Bosc::open(Arc::clone(data), cfg(), durability, Arc::new(HashApp)).unwrap();
    BoscHash::open(b).unwrap()
}

struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[test]
fn bosc_hash_survives_crashes() {
    let data = FaultyDisk::new(0, 5);
    let log = FaultyDisk::new(4 << 20, 6);
    let (mut df, mut lf) = (data.faults(), log.faults());
    let (mut d, mut l): (Arc<dyn Disk>, Arc<dyn Disk>) = (Arc::new(data), Arc::new(log));
    Bosc::<HashApp>::format(d.as_ref(), &cfg()).unwrap();
    Log::format(&[Arc::clone(&l)], &log_cfg(), LOG_ID).unwrap();
    let mut h = open(&d, &l);
    let mut oracle = HashMap::new();
    let mut rng = Rng(99);
    let (mut blind, mut probed) = (0, 0);
    // 48 pages x 31 records; 1100 distinct keys fill it to ~74%, so pages overflow.
    for step in 0..3000u64 {
        match rng.below(100) {
            0..=69 => {
                let k = rng.below(1100);
                h.put(k, step).unwrap();
                oracle.insert(k, step);
            }
            70..=84 => {
                let k = rng.below(1200);
                assert_eq!(h.get(k).unwrap(), oracle.get(&k).copied(), "key {k}");
            }
            85..=97 => {
                h.bosc().commit_cycle().unwrap();
            }
            _ => {
                blind += h.stats().blind_puts.load(Ordering::Relaxed);
                probed += h.stats().probed_puts.load(Ordering::Relaxed);
                // Crash with the engine running; what its shutdown writes reaches no image.
                let (dn, ln) = (
                    df.crash_with(CrashMode::Random),
                    lf.crash_with(CrashMode::Random),
                );
                drop(h);
                (df, lf) = (dn.faults(), ln.faults());
                (d, l) = (Arc::new(dn), Arc::new(ln));
                h = open(&d, &l);
                for (k, v) in &oracle {
                    assert_eq!(h.get(*k).unwrap(), Some(*v), "key {k} after crash");
                }
            }
        }
    }
    assert!(blind > 0 && probed > 0, "blind {blind} probed {probed}");
}

#[test]
fn plain_hash_matches_oracle_and_reopens() {
    let disk: Arc<dyn Disk> = Arc::new(MemDisk::new(0));
    let h = PlainHash::open(Arc::clone(&disk), 512, PAGES, 4, 16).unwrap();
    let mut oracle = HashMap::new();
    let mut rng = Rng(7);
    for step in 0..3000u64 {
        let k = rng.below(1100);
        h.put(k, step).unwrap();
        oracle.insert(k, step);
    }
    h.sync().unwrap();
    let (reads, writes) = h.io_counts();
    assert_eq!(writes, 3000, "write-through: one page write per put");
    assert!(reads > 2000, "a 4-page cache misses: {reads}");
    drop(h);
    let h = PlainHash::open(disk, 512, PAGES, 4, 16).unwrap();
    for k in 0..1200 {
        assert_eq!(h.get(k).unwrap(), oracle.get(&k).copied(), "key {k}");
    }
}

/// 1400 distinct keys over 48 pages of 31 records (94% full): pages overflow into the next,
/// the last page's overflow wraps to page 0 through ordinary puts.
fn bulk_records() -> impl Iterator<Item = (u64, u64)> {
    (0..1400u64).map(|i| (i * 7 + 3, i))
}

#[test]
fn bulk_loaded_tables_match_oracle() {
    let oracle: HashMap<u64, u64> = bulk_records().collect();
    // BOSC: layout in chunks of 5 pages, then a batch of puts, then a crash.
    let (data, log) = (FaultyDisk::new(0, 8), FaultyDisk::new(4 << 20, 9));
    let (df, lf) = (data.faults(), log.faults());
    let (d, l): (Arc<dyn Disk>, Arc<dyn Disk>) = (Arc::new(data), Arc::new(log));
    Bosc::<HashApp>::format(d.as_ref(), &cfg()).unwrap();
    Log::format(&[Arc::clone(&l)], &log_cfg(), LOG_ID).unwrap();
    let durability = Durability::OwnLog {
        devices: vec![Arc::clone(&l)],
        log: log_cfg(),
        log_id: LOG_ID,
        volume: 1,
    };
    let (b, _) = Bosc::open(Arc::clone(&d), cfg(), durability, Arc::new(HashApp)).unwrap();
    let h = BoscHash::bulk_load(b, 5, bulk_records).unwrap();
    for (k, v) in &oracle {
        assert_eq!(h.get(*k).unwrap(), Some(*v), "key {k} after load");
    }
    let mut after = oracle.clone();
    let batch: Vec<_> = (0..40u64).map(|i| (i * 7 + 3, 10_000 + i)).collect();
    h.put_batch(&batch).unwrap();
    after.extend(batch);
    assert!(h.stats().probed_puts.load(Ordering::Relaxed) > 0);
    drop(h);
    // The load was synced on its own; the batch is durable in the log.
    let (dn, ln) = (
        df.crash_with(CrashMode::Random),
        lf.crash_with(CrashMode::Random),
    );
    let (d, l): (Arc<dyn Disk>, Arc<dyn Disk>) = (Arc::new(dn), Arc::new(ln));
    let h = open(&d, &l);
    for (k, v) in &after {
        assert_eq!(h.get(*k).unwrap(), Some(*v), "key {k} after crash");
    }
    // Plain: the same layout over raw pages.
    let disk: Arc<dyn Disk> = Arc::new(MemDisk::new(0));
    let p = PlainHash::bulk_load(Arc::clone(&disk), 512, PAGES, 4, 16, 7, bulk_records).unwrap();
    for (k, v) in &oracle {
        assert_eq!(p.get(*k).unwrap(), Some(*v), "plain key {k}");
    }
    assert_eq!(p.get(1).unwrap(), None);
}
