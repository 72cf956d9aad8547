#![allow(clippy::unwrap_used, clippy::expect_used)]

//! Reopening an own-log engine costs about what its queues held, not its replay window: the
//! log's records stream through `Log::replay` into the queues, and entries the frontiers show
//! committed are dropped as the queues outgrow the budget. A counting allocator measures the
//! peak of `Bosc::open`; it sees every thread of the process, so this binary holds this one
//! test only.

#[path = "../../../tests/support/counting_alloc.rs"]
mod counting_alloc;
#[path = "support/measure.rs"]
mod support;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use mariner_bosc::{Bosc, BoscConfig, Durability};
use mariner_disk::{Disk, MemDisk};
use mariner_log::{Log, LogConfig};
use support::{modification, Slots};

const LOG_ID: u128 = 0x3e40;
const SEG: u64 = 64 * 1024;
const BUDGET: usize = 256 * 1024;

fn cfg() -> BoscConfig {
    BoscConfig {
        block_bytes: 512,
        block_count: 8192,
        memory_budget_bytes: BUDGET,
        background: None,
        ..BoscConfig::default()
    }
}

fn durability(log: &Arc<dyn Disk>) -> Durability {
    Durability::OwnLog {
        devices: vec![Arc::clone(log)],
        log: LogConfig {
            segment_bytes: SEG,
            t_wait_ns: 0,
            ..LogConfig::default()
        },
        log_id: LOG_ID,
        volume: 1,
    }
}

#[test]
fn reopen_memory_follows_the_budget_not_the_replay_window() {
    let data: Arc<dyn Disk> = Arc::new(MemDisk::new(0));
    let log: Arc<dyn Disk> = Arc::new(MemDisk::new(64 << 20));
    Bosc::<Slots>::format(data.as_ref(), &cfg()).unwrap();
    let Durability::OwnLog { log: log_cfg, .. } = durability(&log) else {
        unreachable!()
    };
    Log::format(&[Arc::clone(&log)], &log_cfg, LOG_ID).unwrap();
    let (b, _) = Bosc::open(Arc::clone(&data), cfg(), durability(&log), Arc::new(Slots)).unwrap();
    // Random modifications in batches; the budget forces commit cycles all along, and the
    // sweep leaves the oldest pending entries behind, so the window outgrows the queues.
    let mut rng = 0x9E37_79B9u64;
    for _ in 0..300 {
        let batch = (0..500)
            .map(|_| {
                let (block, m) = modification(&mut rng);
                mariner_bosc::Change::modify(block % 8192, m.to_vec())
            })
            .collect();
        b.modify_batch(batch).unwrap();
    }
    let pending = b.pending_modifications();
    assert!(b.stats().forced_commits.load(Ordering::Relaxed) > 0);
    drop(b); // a crash for the data disk: the queues were not committed

    let ((b, report), peak) = counting_alloc::peak_of(|| {
        Bosc::open(data, cfg(), durability(&log), Arc::new(Slots)).unwrap()
    });
    assert_eq!(report.records_requeued as usize, b.pending_modifications());
    assert!(report.records_requeued as usize >= pending);
    // A list of the window at 80 bytes a modification (a log record header, as when each
    // had a record of its own), before a byte of payload, would alone break the bound below.
    let listed = report.records_scanned as usize * 80;
    // One log segment and the double-write area are read whole; a local frontier per block.
    let fixed = SEG as usize + 8 * 32 * 512 + 8192 * 48;
    assert!(
        listed > fixed + 2 * BUDGET,
        "the window ({} records) must outgrow the bound",
        report.records_scanned
    );
    assert!(
        peak < fixed + 2 * BUDGET,
        "open allocated {peak} B at its peak for {} records scanned, {} requeued",
        report.records_scanned,
        report.records_requeued
    );
}
