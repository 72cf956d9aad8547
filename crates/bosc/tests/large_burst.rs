#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A burst of modifications larger than the own log has room for — larger than the whole
//! log, even — is taken, made durable and committed, never left waiting: a commit that
//! waited for the burst's durability while the burst waited for the log space that commit
//! would release hung history's index on its first large prune (262,144 records).

#[path = "support/faulty.rs"]
mod faulty;

use std::sync::Arc;
use std::time::Duration;

use faulty::log_cfg;
use mariner_bosc::{BlockApp, Bosc, BoscConfig, Change, Durability};
use mariner_disk::{Disk, MemDisk};
use mariner_log::Log;

/// Payload = u64 counters; a modification adds `value` to counter `slot` (slot u16, value u64).
struct Add;
impl BlockApp for Add {
    fn apply(&self, _block: u64, payload: &mut [u8], m: &[u8]) {
        let slot = usize::from(u16::from_le_bytes([m[0], m[1]]));
        let value = u64::from_le_bytes(m[2..10].try_into().unwrap());
        let at = slot * 8..slot * 8 + 8;
        let old = u64::from_le_bytes(payload[at.clone()].try_into().unwrap());
        payload[at].copy_from_slice(&old.wrapping_add(value).to_le_bytes());
    }
}

const BLOCKS: u64 = 64;
const LOG_ID: u128 = 0xB0257;
/// The own log: 16 segments of 64 KiB.
const LOG_BYTES: usize = 1 << 20;

fn cfg(background: bool) -> BoscConfig {
    BoscConfig {
        block_bytes: 512,
        block_count: BLOCKS,
        memory_budget_bytes: 256 << 10,
        background: background.then_some(Duration::from_millis(1)),
        sweep_above: 0.5,
        image_share: 0.25,
        ..BoscConfig::default()
    }
}

fn open(data: &Arc<dyn Disk>, log: &Arc<dyn Disk>, background: bool) -> Bosc<Add> {
    let durability = Durability::OwnLog {
        devices: vec![Arc::clone(log)],
        log: log_cfg(),
        log_id: LOG_ID,
        volume: 1,
    };
    Bosc::open(Arc::clone(data), cfg(background), durability, Arc::new(Add))
        .unwrap()
        .0
}

fn change(i: u64) -> Change {
    let mut m = Vec::with_capacity(10);
    m.extend_from_slice(&((i % 60) as u16).to_le_bytes());
    m.extend_from_slice(&1u64.to_le_bytes());
    Change::modify(i % BLOCKS, m)
}

/// Runs `f` on a thread and fails the test if it has not finished within a minute.
fn within_a_minute<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("a burst larger than the own log's room hung")
}

#[test]
fn a_burst_larger_than_the_own_log_is_taken_whole() {
    for background in [true, false] {
        let data: Arc<dyn Disk> = Arc::new(MemDisk::new(0));
        let log: Arc<dyn Disk> = Arc::new(MemDisk::new(LOG_BYTES));
        Bosc::<Add>::format(data.as_ref(), &cfg(background)).unwrap();
        Log::format(&[Arc::clone(&log)], &log_cfg(), LOG_ID).unwrap();
        let b = Arc::new(open(&data, &log, background));
        // Each record takes ~100 bytes of the log: 3 bursts of 20,000 are ~6 MiB, each ~2x
        // the whole log.
        let bursts = 3u64;
        let per = 20_000u64;
        let b2 = Arc::clone(&b);
        within_a_minute(move || {
            for k in 0..bursts {
                let changes = (k * per..(k + 1) * per).map(change).collect();
                let seqs = b2.modify_batch(changes).unwrap();
                assert_eq!(seqs.len() as u64, per);
            }
        });
        let expect = |block: u64, slot: u64| -> u64 {
            (0..bursts * per)
                .filter(|i| i % BLOCKS == block && i % 60 == slot)
                .count() as u64
        };
        let check = |b: &Bosc<Add>| {
            for block in 0..BLOCKS {
                let p = b.read(block).unwrap();
                for slot in 0..60u64 {
                    let got = u64::from_le_bytes(p[slot as usize * 8..][..8].try_into().unwrap());
                    assert_eq!(got, expect(block, slot), "block {block} slot {slot}");
                }
            }
        };
        check(&b);
        b.close();
        drop(b);
        // Reopened: the own log's replay gives the same.
        let b = open(&data, &log, false);
        check(&b);
    }
}
