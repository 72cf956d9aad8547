#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Caller-durable mode, in-memory application, forced commit.

use std::sync::Arc;

use mariner_bosc::{BlockApp, Bosc, BoscConfig, Durability, Error};
use mariner_disk::{CrashMode, Disk, FaultyDisk};

/// Adds the modification's byte to payload[0] (not idempotent on purpose: a double apply shows).
struct Add;
impl BlockApp for Add {
    fn apply(&self, _block: u64, payload: &mut [u8], m: &[u8]) {
        payload[0] = payload[0].wrapping_add(m[0]);
    }
}

fn cfg(budget: usize) -> BoscConfig {
    BoscConfig {
        block_bytes: 512,
        block_count: 64,
        memory_budget_bytes: budget,
        background: None,
        ..BoscConfig::default()
    }
}

#[test]
fn caller_durable_replays_above_checkpoint_exactly_once() {
    let disk = FaultyDisk::new(0, 3);
    let faults = disk.faults();
    let disk: Arc<dyn Disk> = Arc::new(disk);
    Bosc::<Add>::format(disk.as_ref(), &cfg(1 << 20)).unwrap();
    let (b, _) = Bosc::open(disk, cfg(1 << 20), Durability::Caller, Arc::new(Add)).unwrap();
    // The caller's log: position i adds 1 to block i % 4.
    for pos in 1..=40u64 {
        b.modify_at(pos % 4, &[1], pos).unwrap();
    }
    assert!(matches!(
        b.modify_at(0, &[1], 40),
        Err(Error::PositionNotIncreasing { .. })
    ));
    assert!(matches!(b.modify(0, &[1]), Err(Error::WrongMode)));
    b.commit_cycle().unwrap();
    let ckpt = b.checkpoint();
    assert_eq!(ckpt, 40);
    for pos in 41..=60u64 {
        b.modify_at(pos % 4, &[1], pos).unwrap();
    }
    drop(b);
    let disk: Arc<dyn Disk> = Arc::new(faults.crash_with(CrashMode::Random));
    let (b, report) = Bosc::open(disk, cfg(1 << 20), Durability::Caller, Arc::new(Add)).unwrap();
    assert_eq!(report.checkpoint, 40);
    for pos in report.checkpoint + 1..=60 {
        b.modify_at(pos % 4, &[1], pos).unwrap();
    }
    for block in 0..4 {
        assert_eq!(b.read(block).unwrap()[0], 15, "block {block}");
    }
}

#[test]
fn cached_blocks_apply_at_once_and_budget_forces_commit() {
    let disk: Arc<dyn Disk> = Arc::new(FaultyDisk::new(0, 4));
    Bosc::<Add>::format(disk.as_ref(), &cfg(1200)).unwrap();
    let (b, _) = Bosc::open(disk, cfg(1200), Durability::Caller, Arc::new(Add)).unwrap();
    b.read(5).unwrap(); // now cached
    b.modify_at(5, &[2], 1).unwrap();
    assert_eq!(
        b.stats()
            .applied_in_memory
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    assert_eq!(b.read(5).unwrap()[0], 2);
    for pos in 2..200u64 {
        b.modify_at(pos % 64, &[1], pos).unwrap();
        assert!(
            b.memory_bytes() <= 1200 + 600,
            "budget honoured up to one block"
        );
    }
    assert!(
        b.stats()
            .forced_commits
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
    );
    b.commit_all().unwrap();
    assert_eq!(b.checkpoint(), 199);
}
