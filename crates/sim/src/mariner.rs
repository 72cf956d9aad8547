//! Mariner's log-disk array (mariner-paper.md §4, §7.2–7.3): the real
//! [`mariner_placement::Policy`] over rotational [`LogDisks`], fed 4 KB writes at a fixed
//! interval.

use mariner_placement::{Action, DeviceStart, Nanos, Policy, PolicyConfig};

use crate::disk::DiskParams;
use crate::logdisk::{LogDiskConfig, LogDiskStats, LogDisks};
use crate::report::{Plot, Report, Series};
use crate::rng::SplitMix64;
use crate::stats::Mean;

/// One run's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ArrayRun {
    pub disks: usize,
    pub t_wait_ns: u64,
    pub t_switch: f64,
    pub t_idle_ns: u64,
    pub interval_ns: u64,
    pub request_bytes: u64,
    pub count: usize,
    pub drift: f64,
    /// The paper's dispatch (`PolicyConfig::queue_when_busy`): an expired batch queues behind
    /// its busy disk. `false` runs the product's policy.
    pub queue_when_busy: bool,
}

impl ArrayRun {
    /// mariner-paper.md §7.3 defaults: T_idle 50 ms, T_switch 12, T_wait 0.2 ms, 5 disks.
    pub fn paper_defaults(interval_ns: u64, count: usize) -> Self {
        Self {
            disks: 5,
            t_wait_ns: 200_000,
            t_switch: 12.0,
            t_idle_ns: 50_000_000,
            interval_ns,
            request_bytes: 4096,
            count,
            drift: DEFAULT_DRIFT,
            queue_when_busy: false,
        }
    }
}

/// Assumed spindle-speed deviation bound (docs/simulation.md).
pub const DEFAULT_DRIFT: f64 = 0.001;

/// What a run measured.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ArrayResult {
    pub latency_ms: Mean,
    pub physical_writes: u64,
    pub bytes_written: u64,
    pub tracks_used: u64,
    pub elapsed_ns: Nanos,
    pub disk: LogDiskStats,
}

impl ArrayResult {
    pub fn batch_kb(&self) -> f64 {
        self.bytes_written as f64 / 1024.0 / self.physical_writes.max(1) as f64
    }
    /// Physical writes per second over the run.
    pub fn physical_ops(&self) -> f64 {
        self.physical_writes as f64 / (self.elapsed_ns.max(1) as f64 / 1e9)
    }
    /// Logical writes completed per second over the run.
    pub fn logical_ops(&self) -> f64 {
        self.latency_ms.count as f64 / (self.elapsed_ns.max(1) as f64 / 1e9)
    }
}

/// Simulates one run, deterministically for a given `seed`.
pub fn simulate(run: &ArrayRun, seed: u64) -> ArrayResult {
    let root = SplitMix64::new(seed);
    let model = LogDisks::new(
        LogDiskConfig {
            disk: DiskParams::dtla_307030(),
            t_idle_ns: run.t_idle_ns,
            drift: run.drift,
        },
        run.disks,
        &root,
    );
    let segments = 1u64 << 40;
    let cfg = PolicyConfig {
        t_wait_ns: run.t_wait_ns,
        t_switch: run.t_switch,
        dispatch_on_idle: false,
        queue_when_busy: run.queue_when_busy,
        align_bytes: 512,
        segment_bytes: model.segment_bytes(),
        segment_count: segments,
        data_offset: 0,
    };
    let starts: Vec<DeviceStart> = (0..run.disks)
        .map(|_| DeviceStart {
            segment: segments - 1,
            generation: 0,
            free_segments: segments,
        })
        .collect();
    let mut policy = Policy::new(cfg, model, &starts);
    let mut sim = Loop {
        in_flight: vec![None; run.disks],
        out: ArrayResult::default(),
    };
    sim.run(&mut policy, run);
    sim.out.disk = policy.model().stats;
    sim.out
}

struct Loop {
    in_flight: Vec<Option<(Nanos, Vec<u64>)>>,
    out: ArrayResult,
}

impl Loop {
    fn run(&mut self, policy: &mut Policy<LogDisks>, run: &ArrayRun) {
        let arrival = |i: usize| i as u64 * run.interval_ns;
        let mut next = 0usize;
        loop {
            let done = self
                .in_flight
                .iter()
                .enumerate()
                .filter_map(|(d, f)| f.as_ref().map(|(t, _)| (*t, d)))
                .min();
            let deadline = policy.next_deadline();
            let arr = (next < run.count).then(|| arrival(next));
            let actions = match (done, deadline, arr) {
                (Some((t, dev)), _, _)
                    if deadline.is_none_or(|d| t <= d) && arr.is_none_or(|a| t <= a) =>
                {
                    self.complete(dev, t, run);
                    policy.completed(dev, t).unwrap_or_default()
                }
                (_, Some(d), _) if arr.is_none_or(|a| d <= a) => policy.poll(d),
                (_, _, Some(a)) => {
                    next += 1;
                    policy
                        .submit(next as u64 - 1, run.request_bytes, a)
                        .unwrap_or_default()
                }
                _ => break,
            };
            self.apply(policy, actions);
        }
    }

    fn complete(&mut self, dev: usize, t: Nanos, run: &ArrayRun) {
        if let Some((_, reqs)) = self.in_flight[dev].take() {
            for r in reqs {
                let arrived = r * run.interval_ns;
                self.out.latency_ms.add((t - arrived) as f64 / 1e6);
            }
            self.out.elapsed_ns = self.out.elapsed_ns.max(t);
        }
    }

    fn apply(&mut self, policy: &Policy<LogDisks>, actions: Vec<Action>) {
        for a in actions {
            match a {
                Action::Write(w) => {
                    let end = policy.model().busy_until(w.dev);
                    self.out.physical_writes += 1;
                    self.out.bytes_written += w.reqs.iter().map(|(_, b)| b).sum::<u64>();
                    self.in_flight[w.dev] = Some((end, w.reqs.iter().map(|(r, _)| *r).collect()));
                }
                Action::SwitchSegment { .. } => self.out.tracks_used += 1,
            }
        }
    }
}

/// mariner-paper.md Table 1: (T_wait ms, batch KB, latency ms).
pub const TABLE1: &[(f64, f64, f64)] = &[
    (0.0, 12.0, 6.7),
    (0.12, 12.7, 5.8),
    (0.24, 15.0, 3.1),
    (0.36, 20.0, 1.9),
    (0.48, 22.0, 2.1),
    (0.60, 24.0, 2.3),
    (0.72, 28.0, 2.4),
    (1.0, 32.0, 3.0),
];

/// Table 1's runs: 5 disks, T_switch 6, 4 KB writes every 60 µs; `queue_when_busy` selects
/// the paper's dispatch (`true`) or the product's (`false`).
pub fn table1_results(seed: u64, count: usize, queue_when_busy: bool) -> Vec<ArrayResult> {
    TABLE1
        .iter()
        .map(|&(t_wait_ms, _, _)| {
            let mut run = ArrayRun::paper_defaults(60_000, count);
            run.t_switch = 6.0;
            run.t_wait_ns = (t_wait_ms * 1e6) as u64;
            run.queue_when_busy = queue_when_busy;
            simulate(&run, seed)
        })
        .collect()
}

pub fn table1(seed: u64, count: usize) -> Report {
    let mut rep = Report::new(
        &format!("mariner-paper Table 1: T_wait sweep, 5 DTLA-307030 log disks, 4 KB every 60 us, T_switch 6 ({count} writes)"),
        &[
            "T_wait ms", "paper batch KB", "paper lat ms", "paper-mode batch", "paper-mode lat",
            "product batch", "product lat", "missed rot (paper/product)",
        ],
    );
    let paper_mode = table1_results(seed, count, true);
    let product = table1_results(seed, count, false);
    let (mut pm, mut pr) = (Vec::new(), Vec::new());
    for ((q, r), &(tw, pb, pl)) in paper_mode.iter().zip(&product).zip(TABLE1) {
        pm.push((tw, q.latency_ms.mean()));
        pr.push((tw, r.latency_ms.mean()));
        rep.row(vec![
            format!("{tw:.2}"),
            format!("{pb:.1}"),
            format!("{pl:.1}"),
            format!("{:.1}", q.batch_kb()),
            format!("{:.2}", q.latency_ms.mean()),
            format!("{:.1}", r.batch_kb()),
            format!("{:.2}", r.latency_ms.mean()),
            format!("{}/{}", q.disk.missed_rotations, r.disk.missed_rotations),
        ]);
    }
    rep.notes.push(
        "paper mode: an expired batch queues behind its busy disk (PolicyConfig::queue_when_busy, \
         mariner-paper §4); product mode: it keeps gathering until a disk frees (the default)"
            .into(),
    );
    rep.plot = Some(Plot {
        x_label: "T_wait (ms)".into(),
        y_label: "mean write latency (ms)".into(),
        log_y: false,
        series: vec![
            Series {
                name: "paper mode".into(),
                points: pm,
            },
            Series {
                name: "product mode".into(),
                points: pr,
            },
            Series {
                name: "paper".into(),
                points: TABLE1.iter().map(|&(t, _, l)| (t, l)).collect(),
            },
        ],
    });
    rep
}

/// Bytes written over the capacity of the tracks entered.
pub fn utilization(r: &ArrayResult) -> f64 {
    let track = f64::from(DiskParams::dtla_307030().outer_spt()) * 512.0;
    r.bytes_written as f64 / (r.tracks_used.max(1) as f64 * track)
}

/// Fig. 6(b)'s inter-request intervals (µs), from 0.18 to 0.08 ms.
pub const FIG6_INTERVALS_US: &[u64] = &[180, 160, 140, 120, 100, 80];

pub fn fig6b_results(seed: u64, count: usize) -> Vec<(usize, u64, ArrayResult)> {
    let mut out = Vec::new();
    for disks in 1..=5 {
        for &us in FIG6_INTERVALS_US {
            let mut run = ArrayRun::paper_defaults(us * 1000, count);
            run.disks = disks;
            out.push((disks, us, simulate(&run, seed)));
        }
    }
    out
}

pub fn fig6b(seed: u64, count: usize) -> Report {
    let mut rep = Report::new(
        &format!("mariner-paper Fig. 6(b): log disks vs throughput and latency (T_wait 0.2 ms, T_switch 12, T_idle 50 ms, {count} writes)"),
        &["disks", "interval us", "physical OPS", "logical OPS", "batch KB", "latency ms", "track util"],
    );
    let mut series: Vec<Series> = Vec::new();
    for (disks, us, r) in fig6b_results(seed, count) {
        if series.len() < disks {
            series.push(Series {
                name: format!("{disks} disk(s)"),
                points: Vec::new(),
            });
        }
        series[disks - 1]
            .points
            .push((r.physical_ops(), r.latency_ms.mean()));
        rep.row(vec![
            disks.to_string(),
            us.to_string(),
            format!("{:.0}", r.physical_ops()),
            format!("{:.0}", r.logical_ops()),
            format!("{:.1}", r.batch_kb()),
            format!("{:.2}", r.latency_ms.mean()),
            format!("{:.0}%", 100.0 * utilization(&r)),
        ]);
    }
    rep.notes.push(
        "paper: at 0.1 ms, 1 disk 1000 OPS at 1.4 ms; 2 disks 2000 OPS at the same latency".into(),
    );
    rep.plot = Some(Plot {
        x_label: "physical write operations per second".into(),
        y_label: "mean write latency (ms)".into(),
        log_y: false,
        series,
    });
    rep
}
