//! `mariner sim replay`: one trace (workload.rs formats) through a conventional FCFS disk, a
//! Trail disk and Mariner's log array, side by side.
//!
//! LBAs beyond the chosen disk wrap around its capacity (SPC traces address several ASUs).
//! The Mariner column replays the writes only, on DTLA-307030 log disks (the disk its model is
//! built for), with the §7.3 defaults; reads do not touch the log.

use crate::conventional;
use crate::disk::DiskParams;
use crate::mariner::{self, ArrayRun, Arrival};
use crate::report::{pct, Report};
use crate::rng::SplitMix64;
use crate::trail;
use crate::workload::Request;

/// Replay settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Replay {
    pub disk: DiskParams,
    pub log_disks: usize,
    pub seed: u64,
}

/// Runs `reqs` (sorted by arrival) through every model and tabulates latency and efficiency.
pub fn replay(reqs: &[Request], cfg: &Replay) -> Report {
    let total = cfg.disk.total_sectors().max(1);
    let reqs: Vec<Request> = reqs
        .iter()
        .map(|r| Request {
            lba: r.lba % total,
            ..*r
        })
        .collect();
    let root = SplitMix64::new(cfg.seed);
    let conv = conventional::run(&cfg.disk, &reqs, &mut root.fork(1));
    let tr = trail::run(&cfg.disk, &reqs, false, &mut root.fork(2));
    let writes: Vec<Arrival> = reqs
        .iter()
        .filter(|r| r.write)
        .map(|r| ((r.arrival_ms * 1e6) as u64, r.bytes))
        .collect();
    let mut run = ArrayRun::paper_defaults(0, 0);
    run.disks = cfg.log_disks.max(1);
    let ma = mariner::simulate_trace(&run, &writes, cfg.seed);
    let reads = reqs.len() - writes.len();
    let mut rep = Report::new(
        &format!(
            "Trace replay: {} requests ({} reads, {} writes) on {}",
            reqs.len(),
            reads,
            writes.len(),
            cfg.disk.name
        ),
        &[
            "model",
            "read lat ms",
            "write lat ms",
            "read eff",
            "write eff",
        ],
    );
    rep.row(vec![
        "conventional (FCFS)".into(),
        format!("{:.2}", conv.read_latency_ms.mean()),
        format!("{:.2}", conv.write_latency_ms.mean()),
        pct(conv.read_bw.efficiency()),
        pct(conv.write_bw.efficiency()),
    ]);
    rep.row(vec![
        "Trail (log + main disk)".into(),
        format!("{:.2}", tr.read_latency_ms.mean()),
        format!("{:.2}", tr.write_latency_ms.mean()),
        pct(tr.main_bw.efficiency()),
        pct(tr.log_bw.efficiency()),
    ]);
    rep.row(vec![
        format!("Mariner, {} log disk(s)", run.disks),
        "-".into(),
        format!("{:.2}", ma.latency_ms.mean()),
        "-".into(),
        format!("{:.1} KB batches", ma.batch_kb()),
    ]);
    let refused = writes.len() as u64 - ma.latency_ms.count;
    if refused > 0 {
        rep.notes.push(format!(
            "{refused} writes larger than a log track were refused by the placement policy"
        ));
    }
    rep.notes.push(
        "Mariner: writes only, on DTLA-307030 log disks, T_wait 0.2 ms, T_switch 12, T_idle 50 ms"
            .into(),
    );
    rep
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{parse_trace, write_trace, Arrivals, Synthetic};

    #[test]
    fn a_trace_replays_deterministically_through_every_model() {
        let disk = DiskParams::trail_table1();
        let reqs = Synthetic {
            reads_per_write: 1.0,
            min_bytes: 1024,
            max_bytes: 8192,
            arrivals: Arrivals::Exponential { mean_ms: 20.0 },
            locality: 1.0,
            count: 400,
        }
        .generate(&disk, &mut SplitMix64::new(4));
        let reqs = parse_trace(&write_trace(&reqs)).unwrap_or_default();
        let cfg = Replay {
            disk,
            log_disks: 2,
            seed: 1,
        };
        let rep = replay(&reqs, &cfg);
        assert_eq!(rep.rows.len(), 3);
        assert_eq!(rep, replay(&reqs, &cfg));
        assert!(rep.title.contains("400 requests"), "{}", rep.title);
    }
}
