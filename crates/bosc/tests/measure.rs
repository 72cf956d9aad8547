//! Small versions of the BOSC measurements, run in the normal suite so they cannot rot. The
//! full measurements: `cargo run --release -p mariner-bosc --example measure`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/measure.rs"]
mod support;

use std::sync::Arc;
use std::time::Duration;

use mariner_disk::{Disk, MemDisk};
use support::*;

#[test]
fn recovery_time_tiny() {
    let (_, r) = recovery(2000, 256, 4);
    assert_eq!(r.records_requeued, 2000);
}

#[test]
fn forced_commit_tiny() {
    let (_, forced, wait, _) = forced_commit(2000, 8192, 256);
    assert!(forced > 0 && wait > Duration::ZERO);
}

/// Many writers on two blocks: appends of one block complete out of sequence order all the
/// time. Before the per-block ordering of `modify`, about half of these rounds lost a record
/// at recovery (tests/concurrent.rs forces the interleaving deterministically).
#[test]
fn recovery_many_writers_few_blocks() {
    for _ in 0..10 {
        let (_, r) = recovery(4000, 2, 16);
        assert_eq!(r.records_requeued, 4000, "{r:?}");
    }
}

/// The reopen-memory measurement, tiny: a log of three segments written a little more than
/// once, all committed.
#[test]
fn reopen_of_a_committed_log_tiny() {
    let data: Arc<dyn Disk> = Arc::new(MemDisk::new(0));
    let log: Arc<dyn Disk> = Arc::new(MemDisk::new((12 << 20) + (64 << 10)));
    let checkpoint = fill_committed_log(Arc::clone(&data), &log, 1.1);
    let r = reopen_committed(data, &log);
    assert_eq!(r.checkpoint, checkpoint);
    assert_eq!((r.records_scanned, r.records_requeued), (0, 0), "{r:?}");
}
