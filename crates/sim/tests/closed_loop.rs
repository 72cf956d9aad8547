#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The Iometer-style constant queue depth (ew-array-paper.txt §3.4) as a workload option of
//! every model: one driver, the same `Arrivals::Closed` for the conventional disk, Trail and
//! Mariner's log array (the EW-Array experiments use it too, `tests/ew_shapes.rs`).

use mariner_sim::conventional::{Conventional, Discipline};
use mariner_sim::disk::DiskParams;
use mariner_sim::driver::{drive, Driven};
use mariner_sim::mariner::{ArrayRun, LogArray};
use mariner_sim::rng::SplitMix64;
use mariner_sim::trail::Trail;
use mariner_sim::workload::{Arrivals, FixedWrites, Synthetic};

fn spec(depth: usize, count: usize) -> Synthetic {
    Synthetic {
        reads_per_write: 1.0,
        min_bytes: 4096,
        max_bytes: 4096,
        arrivals: Arrivals::Closed { depth },
        locality: 1.0,
        count,
    }
}

fn conventional(discipline: Discipline, depth: usize, count: usize) -> Driven {
    let d = DiskParams::st39133lwv();
    let mut m = Conventional::new(&d, discipline, SplitMix64::new(2));
    spec(depth, count).drive(&mut m, &d, &mut SplitMix64::new(1))
}

#[test]
fn every_model_keeps_the_queue_at_its_depth() {
    let d = DiskParams::trail_table1();
    for depth in [1, 4, 16] {
        let conv = conventional(Discipline::Satf, depth, 2_000);
        let mut trail = Trail::new(&d, true, SplitMix64::new(2));
        let tr = spec(depth, 2_000).drive(&mut trail, &d, &mut SplitMix64::new(1));
        let run = ArrayRun::paper_defaults(0, 2_000);
        let mut array = LogArray::new(&run, 1, false);
        let arr = drive(
            &mut array,
            &mut FixedWrites { bytes: 4096 },
            Arrivals::Closed { depth },
            2_000,
            &mut SplitMix64::new(1),
        );
        for (name, r) in [("conventional", conv), ("Trail", tr), ("Mariner", arr)] {
            assert_eq!(
                (r.outstanding_min, r.outstanding_max),
                (depth, depth),
                "{name} at depth {depth}"
            );
            assert_eq!(r.latency_ms.count, 2_000, "{name}");
            assert_eq!(r.issued, 2_000, "{name}");
        }
    }
}

#[test]
fn a_deeper_queue_raises_satf_throughput_but_not_fcfs() {
    let satf: Vec<f64> = [1, 4, 16, 64]
        .iter()
        .map(|&q| conventional(Discipline::Satf, q, 6_000).throughput())
        .collect();
    assert!(satf.windows(2).all(|w| w[1] > 1.1 * w[0]), "SATF {satf:?}");
    assert!(satf[3] > 2.0 * satf[0], "SATF {satf:?}");
    // FCFS serves in arrival order: a longer queue only adds waiting.
    let fcfs: Vec<f64> = [1, 16]
        .iter()
        .map(|&q| conventional(Discipline::Fcfs, q, 6_000).throughput())
        .collect();
    assert!((fcfs[1] / fcfs[0] - 1.0).abs() < 0.05, "FCFS {fcfs:?}");
    // At depth 1 there is nothing to choose: both serve one random request at a time.
    assert!(
        (satf[0] / fcfs[0] - 1.0).abs() < 0.1,
        "{} vs {}",
        satf[0],
        fcfs[0]
    );
}

#[test]
fn the_log_array_batches_more_under_a_deeper_queue() {
    let run = ArrayRun::paper_defaults(0, 4_000);
    let at =
        |depth: usize| mariner_sim::mariner::simulate_load(&run, Arrivals::Closed { depth }, 3);
    let (shallow, deep) = (at(1), at(32));
    assert!(deep.batch_kb() > 1.5 * shallow.batch_kb());
    assert!(deep.logical_ops() > 2.0 * shallow.logical_ops());
}

#[test]
fn a_closed_loop_is_deterministic() {
    let a = conventional(Discipline::Satf, 8, 1_000);
    assert_eq!(a, conventional(Discipline::Satf, 8, 1_000));
}
