//! Small versions of the BOSC measurements, run in the normal suite so they cannot rot. The
//! full measurements: `cargo run --release -p mariner-bosc --example measure`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/measure.rs"]
mod support;

use std::time::Duration;
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
