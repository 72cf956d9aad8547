//! BOSC measurements (issue 4): recovery time against pending updates (dissertation Fig. 3.11,
//! Table 3.2) and the cost of a forced commit to the caller. In-memory disks, so these measure
//! the engine's CPU cost. Run: `cargo run --release -p mariner-bosc --example measure`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/support/measure.rs"]
mod support;

fn main() {
    for pending in [125_000, 250_000, 500_000, 1_000_000] {
        support::print_recovery(pending);
    }
    for budget in [usize::MAX, 4 << 20, 1 << 20, 256 << 10] {
        support::print_forced(100_000, budget);
    }
}
