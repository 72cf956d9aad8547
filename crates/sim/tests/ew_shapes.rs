#![allow(clippy::unwrap_used, clippy::expect_used)]
//! EW-Array shapes the seed describes (ew-array-paper.txt Figs. 4, 5, 11).

use mariner_sim::ewarray::ArrayConfig;
use mariner_sim::ewdisk::Scheduler;
use mariner_sim::ewexp::{single_disk, sustainable};

#[test]
fn scheduler_ranking_of_figs_4_and_5() {
    let t = |s, depth, reads| single_disk(s, depth, reads, 6_000, 1);
    // Queue length 1: nothing to schedule, every algorithm is the same.
    let one: Vec<f64> = Scheduler::EAGER.iter().map(|&s| t(s, 1, 0.5)).collect();
    assert!(
        one.iter().all(|&x| (x / one[0] - 1.0).abs() < 0.01),
        "{one:?}"
    );
    // Long queues: Hybrid best of the SCAN family and at least SATF-EW; read-first worst;
    // throughput grows with the queue.
    let hybrid = t(Scheduler::FreeBwHybrid, 64, 0.5);
    let satf_ew = t(Scheduler::SatfEw, 64, 0.5);
    let scan = t(Scheduler::FreeBwScan, 64, 0.5);
    let read_first = t(Scheduler::ReadFirst, 64, 0.5);
    assert!(hybrid >= satf_ew && hybrid > scan && scan > read_first);
    assert!(satf_ew > 1.5 * read_first);
    assert!(satf_ew > 2.0 * t(Scheduler::SatfEw, 4, 0.5) * 0.9);
    // Fig. 5: FreeBW-SCAN falls behind SATF-EW at a high read ratio.
    assert!(t(Scheduler::FreeBwScan, 64, 0.9) < 0.8 * t(Scheduler::SatfEw, 64, 0.9));
}

#[test]
fn ew_array_sustains_about_twice_raid10() {
    let grid: Vec<f64> = (2..=12).map(|i| f64::from(i) * 5.0).collect();
    let (raid, _) = sustainable(&ArrayConfig::raid10(36), &grid, 8_000, 1);
    let (ew, _) = sustainable(&ArrayConfig::ew(2, 9.0, 2.0), &grid, 8_000, 1);
    assert!(
        raid > 0.0 && ew >= 1.6 * raid,
        "EW {ew}x vs RAID-10 {raid}x"
    );
}

#[test]
fn ew_experiments_are_deterministic() {
    assert_eq!(
        single_disk(Scheduler::SatfEw, 16, 0.5, 2_000, 9),
        single_disk(Scheduler::SatfEw, 16, 0.5, 2_000, 9)
    );
}
