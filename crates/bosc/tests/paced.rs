#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The paced sweep and the images' share of the budget (`BoscConfig::sweep_above`,
//! `image_share`, as history's index uses them) under concurrency: writers and readers on
//! shared blocks while the background cycle commits and images are kept, dirtied and dropped;
//! every block then equals what its modifications, in order, make of it — before and after a
//! reopen that replays the own log.

#[path = "support/faulty.rs"]
mod faulty;

use std::sync::Arc;
use std::time::Duration;

use faulty::log_cfg;
use mariner_bosc::{BlockApp, Bosc, BoscConfig, Durability};
use mariner_disk::{Disk, MemDisk};
use mariner_log::Log;

/// Payload = u64 counters; a modification folds `value` into counter `slot` (slot u16, value
/// u64) as `old * 31 + value`: applied twice, skipped or reordered, a counter comes out wrong.
struct Fold;
impl BlockApp for Fold {
    fn apply(&self, _block: u64, payload: &mut [u8], m: &[u8]) {
        let slot = usize::from(u16::from_le_bytes([m[0], m[1]]));
        let value = u64::from_le_bytes(m[2..10].try_into().unwrap());
        let at = slot * 8..slot * 8 + 8;
        let old = u64::from_le_bytes(payload[at.clone()].try_into().unwrap());
        payload[at].copy_from_slice(&old.wrapping_mul(31).wrapping_add(value).to_le_bytes());
    }
}

const BLOCKS: u64 = 256;
const THREADS: u64 = 4;
const OPS: u64 = 4_000;
const LOG_ID: u128 = 0x9ACE;

fn cfg() -> BoscConfig {
    BoscConfig {
        block_bytes: 512,
        block_count: BLOCKS,
        memory_budget_bytes: 64 << 10,
        background: Some(Duration::from_millis(1)),
        sweep_above: 0.5,
        image_share: 0.1,
        runs_per_cycle: 4,
        ..BoscConfig::default()
    }
}

fn open(data: &Arc<dyn Disk>, log: &Arc<dyn Disk>) -> Bosc<Fold> {
    let durability = Durability::OwnLog {
        devices: vec![Arc::clone(log)],
        log: log_cfg(),
        log_id: LOG_ID,
        volume: 1,
    };
    Bosc::open(Arc::clone(data), cfg(), durability, Arc::new(Fold))
        .unwrap()
        .0
}

/// Thread `t`'s i-th modification: its block and value (thread `t` owns counter `t`).
fn op(t: u64, i: u64) -> (u64, u64) {
    let x = (t + 1)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(i.wrapping_mul(0xD1B5_4A32_D192_ED03));
    ((x >> 33) % BLOCKS, x % 1000)
}

#[test]
fn paced_sweeps_and_dropped_images_keep_every_modification_once() {
    let data: Arc<dyn Disk> = Arc::new(MemDisk::new(0));
    let log: Arc<dyn Disk> = Arc::new(MemDisk::new(16 << 20));
    Bosc::<Fold>::format(data.as_ref(), &cfg()).unwrap();
    Log::format(&[Arc::clone(&log)], &log_cfg(), LOG_ID).unwrap();
    let b = Arc::new(open(&data, &log));
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let b = Arc::clone(&b);
            s.spawn(move || {
                for i in 0..OPS {
                    let (block, value) = op(t, i);
                    let mut m = (t as u16).to_le_bytes().to_vec();
                    m.extend_from_slice(&value.to_le_bytes());
                    b.modify(block, &m).unwrap();
                    if i % 7 == 0 {
                        // Reads cache images (within their share), which later
                        // modifications then dirty or drop.
                        b.read(op(t, i / 2).0).unwrap();
                    }
                }
            });
        }
    });
    let mut want = vec![[0u64; THREADS as usize]; BLOCKS as usize];
    for t in 0..THREADS {
        for i in 0..OPS {
            let (block, value) = op(t, i);
            let c = &mut want[block as usize][t as usize];
            *c = c.wrapping_mul(31).wrapping_add(value);
        }
    }
    let check = |b: &Bosc<Fold>, when: &str| {
        for block in 0..BLOCKS {
            let payload = b.read(block).unwrap();
            for t in 0..THREADS as usize {
                let got = u64::from_le_bytes(payload[t * 8..t * 8 + 8].try_into().unwrap());
                assert_eq!(
                    got, want[block as usize][t],
                    "{when}: block {block} counter {t}"
                );
            }
        }
    };
    check(&b, "live");
    let written = b
        .stats()
        .blocks_written
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(written > 0, "the sweep committed past its share");
    let b = Arc::into_inner(b).expect("the writers are done");
    b.close();
    drop(b);
    let b = open(&data, &log);
    check(&b, "reopened");
    b.commit_all().unwrap();
    check(&b, "committed");
}
