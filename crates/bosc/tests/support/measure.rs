#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]
//! Measurements of issue 4, each also run with tiny parameters so it cannot rot:
//! - recovery time against the number of pending updates (lu-dissertation Fig. 3.11,
//!   Table 3.2; target: 1 M pending in ≤ 5 s);
//! - the cost of a forced commit to the caller of `modify`.
//!
//! Full runs (memory disks, so they measure CPU and the engine, not a device):
//! `cargo run --release -p mariner-bosc --example measure`

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mariner_bosc::{BlockApp, Bosc, BoscConfig, Durability};
use mariner_disk::{Disk, MemDisk};
use mariner_log::{Log, LogConfig};

/// Sets one u64 slot of the block: (slot u16, value u64).
pub struct Slots;
impl BlockApp for Slots {
    fn apply(&self, _block: u64, payload: &mut [u8], m: &[u8]) {
        let slot = u16::from_le_bytes([m[0], m[1]]) as usize;
        payload[slot * 8..slot * 8 + 8].copy_from_slice(&m[2..10]);
    }
}

const LOG_ID: u128 = 0x3EA5;

pub fn log_cfg() -> LogConfig {
    LogConfig {
        segment_bytes: 4 << 20,
        t_wait_ns: 20_000,
        ..LogConfig::default()
    }
}

pub fn durability(log: &Arc<dyn Disk>) -> Durability {
    Durability::OwnLog {
        devices: vec![Arc::clone(log)],
        log: log_cfg(),
        log_id: LOG_ID,
        volume: 1,
    }
}

pub fn modification(rng: &mut u64) -> (u64, [u8; 10]) {
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    let mut m = [0u8; 10];
    m[0..2].copy_from_slice(&((*rng % 60) as u16).to_le_bytes());
    m[2..10].copy_from_slice(&rng.to_le_bytes());
    (*rng >> 8, m)
}

/// Logs `pending` modifications from `threads` writers (group commit), never commits, reopens.
/// Returns (time to log them, open report).
pub fn recovery(pending: u64, blocks: u64, threads: u64) -> (Duration, mariner_bosc::OpenReport) {
    let cfg = BoscConfig {
        block_bytes: 512,
        block_count: blocks,
        memory_budget_bytes: usize::MAX,
        background: None,
        ..BoscConfig::default()
    };
    let data: Arc<dyn Disk> = Arc::new(MemDisk::new(0));
    // Each record is one 512-byte aligned batch at worst.
    let log: Arc<dyn Disk> = Arc::new(MemDisk::new((pending as usize + 4096) * 512 + (64 << 20)));
    Bosc::<Slots>::format(data.as_ref(), &cfg).unwrap();
    Log::format(&[Arc::clone(&log)], &log_cfg(), LOG_ID).unwrap();
    let (b, _) = Bosc::open(
        Arc::clone(&data),
        cfg.clone(),
        durability(&log),
        Arc::new(Slots),
    )
    .unwrap();
    let started = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let b = &b;
            s.spawn(move || {
                let mut rng = 0x9E37_79B9 ^ (t + 1);
                for _ in 0..pending / threads {
                    let (block, m) = modification(&mut rng);
                    b.modify(block % blocks, &m).unwrap();
                }
            });
        }
    });
    let logged = started.elapsed();
    assert_eq!(
        b.pending_modifications() as u64,
        pending / threads * threads
    );
    drop(b);
    let (b, report) = Bosc::open(data, cfg, durability(&log), Arc::new(Slots)).unwrap();
    assert_eq!(b.pending_modifications() as u64, report.records_requeued);
    (logged, report)
}

pub fn print_recovery(pending: u64) {
    let (logged, r) = recovery(pending, 1 << 16, 8);
    println!(
        "pending {:>8}  logged in {:>7.2} s  recovery {:>7.3} s  ({:.2} µs/record; scanned {}, requeued {})",
        pending,
        logged.as_secs_f64(),
        r.elapsed.as_secs_f64(),
        r.elapsed.as_secs_f64() * 1e6 / pending.max(1) as f64,
        r.records_scanned,
        r.records_requeued
    );
    assert_eq!(
        r.records_requeued, pending,
        "every pending modification requeued: {r:?}"
    );
}

/// Single writer; budget `budget`: returns (mean modify latency, forced commits, forced wait).
pub fn forced_commit(n: u64, budget: usize, blocks: u64) -> (Duration, u64, Duration, Duration) {
    let cfg = BoscConfig {
        block_bytes: 4096,
        block_count: blocks,
        memory_budget_bytes: budget,
        background: None,
        ..BoscConfig::default()
    };
    let data: Arc<dyn Disk> = Arc::new(MemDisk::new(0));
    let log: Arc<dyn Disk> = Arc::new(MemDisk::new((n as usize + 4096) * 512 + (64 << 20)));
    Bosc::<Slots>::format(data.as_ref(), &cfg).unwrap();
    Log::format(&[Arc::clone(&log)], &log_cfg(), LOG_ID).unwrap();
    let (b, _) = Bosc::open(data, cfg, durability(&log), Arc::new(Slots)).unwrap();
    let mut rng = 0xC0FFEE;
    let mut worst = Duration::ZERO;
    let started = Instant::now();
    for _ in 0..n {
        let (block, m) = modification(&mut rng);
        let t = Instant::now();
        b.modify(block % blocks, &m).unwrap();
        worst = worst.max(t.elapsed());
    }
    let mean = started.elapsed() / n as u32;
    let s = b.stats();
    (
        mean,
        s.forced_commits.load(Ordering::Relaxed),
        Duration::from_nanos(s.forced_wait_ns.load(Ordering::Relaxed)),
        worst,
    )
}

pub fn print_forced(n: u64, budget: usize) {
    let (mean, forced, wait, worst) = forced_commit(n, budget, 1 << 14);
    let per = if forced > 0 {
        wait / forced as u32
    } else {
        Duration::ZERO
    };
    println!(
        "budget {:>9} B  {n} modifies: mean {:>6.1} µs  worst {:>8.1} µs  forced commits {forced:>5}  \
         each {:>8.1} µs  share of time {:>5.1}%",
        budget,
        mean.as_secs_f64() * 1e6,
        worst.as_secs_f64() * 1e6,
        per.as_secs_f64() * 1e6,
        wait.as_secs_f64() * 100.0 / (mean.as_secs_f64() * n as f64)
    );
}

/// 512-byte blocks, no background thread: the engine of the reopen measurement.
fn committed_cfg() -> BoscConfig {
    BoscConfig {
        block_bytes: 512,
        block_count: 1 << 16,
        memory_budget_bytes: usize::MAX,
        background: None,
        ..BoscConfig::default()
    }
}

/// Formats `data` and `log`, then logs small modifications worth about `passes` × the log's
/// size in batches, committing every eighth of the log so its space is recycled, and commits
/// everything at the end: the whole log then lies at or below the checkpoint. Returns the
/// checkpoint.
pub fn fill_committed_log(data: Arc<dyn Disk>, log: &Arc<dyn Disk>, passes: f64) -> u64 {
    // A logged modification here takes ~33 bytes of log in its batch record (21 of entry
    // header, 10 of modification, the record's header shared); 32 overestimates their count.
    let records = (log.len().unwrap() as f64 * passes / 32.0) as u64;
    let per_commit = log.len().unwrap() / 8 / 32;
    let cfg = committed_cfg();
    Bosc::<Slots>::format(data.as_ref(), &cfg).unwrap();
    Log::format(&[Arc::clone(log)], &log_cfg(), LOG_ID).unwrap();
    let (b, _) = Bosc::open(data, cfg.clone(), durability(log), Arc::new(Slots)).unwrap();
    let mut rng = 0x5EED_u64;
    let (mut logged, mut since_commit, mut last_seq) = (0, 0, 0);
    while logged < records {
        let batch: Vec<_> = (0..4096.min(records - logged))
            .map(|_| {
                let (block, m) = modification(&mut rng);
                mariner_bosc::Change::modify(block % cfg.block_count, m.to_vec())
            })
            .collect();
        logged += batch.len() as u64;
        since_commit += batch.len() as u64;
        let seqs = b.modify_batch(batch).unwrap();
        last_seq = seqs.iter().copied().max().unwrap_or(last_seq);
        if since_commit >= per_commit {
            b.commit_all().unwrap();
            since_commit = 0;
        }
    }
    b.commit_all().unwrap();
    let checkpoint = b.checkpoint();
    b.close();
    assert_eq!(checkpoint, last_seq, "every logged modification committed");
    checkpoint
}

/// Reopens what [`fill_committed_log`] left.
pub fn reopen_committed(data: Arc<dyn Disk>, log: &Arc<dyn Disk>) -> mariner_bosc::OpenReport {
    let (b, report) = Bosc::open(data, committed_cfg(), durability(log), Arc::new(Slots)).unwrap();
    b.close();
    report
}
