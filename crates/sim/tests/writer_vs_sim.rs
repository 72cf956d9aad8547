#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Issue 5's cross-check: one trace run through the server's log writer on a simulated
//! `DeviceModel` and through the simulator gives identical dispatch decisions.
//!
//! (a) `mariner_log::Dispatch` — the clock-free core the log's dispatcher thread calls with its
//! clock — is driven here by a virtual-time stand-in for that thread: it delivers appends at the
//! trace's arrival times, device completions at the time the rotational model says the write
//! ends (`LogDisks::busy_until`), `T_wait` timeouts at `next_deadline()`, and the consumers'
//! releases after each completion, and accounts every action as the thread does.
//! (b) `mariner_sim::mariner`'s own loop runs the same trace on the same model and seed.
//! Both order simultaneous events the same way (completion, deadline, arrival).

use std::collections::VecDeque;

use mariner_log::{Dispatch, Hold, HoldKind};
use mariner_placement::{Action, Nanos};
use mariner_sim::logdisk::LogDisks;
use mariner_sim::mariner::{self, ArrayRun, Arrival};
use mariner_sim::rng::SplitMix64;

/// A bursty trace: exponential gaps with occasional long pauses (so disks idle and
/// recalibrate), sizes from 512 B to 64 KB with most small, as log records are.
fn trace(seed: u64, count: usize, mean_gap_ns: f64) -> Vec<Arrival> {
    let mut rng = SplitMix64::new(seed);
    let mut t = 0.0;
    (0..count)
        .map(|_| {
            t += rng.exponential(mean_gap_ns);
            if rng.unit() < 0.01 {
                t += 80e6;
            }
            let bytes = if rng.unit() < 0.8 {
                rng.range(1, 16) * 512
            } else {
                rng.range(1, 128) * 512
            };
            (t as Nanos, bytes)
        })
        .collect()
}

/// The log writer's dispatcher thread, in virtual time: one message (append, device done,
/// release) or timeout at a time, each followed by executing the returned actions, as
/// `Writer::run` does.
struct Thread {
    core: Dispatch<LogDisks>,
    in_flight: Vec<Option<(Nanos, Vec<u64>)>>,
    durable: Vec<bool>,
    /// Requests `0..watermark` are durable.
    watermark: usize,
    actions: Vec<Action>,
}

impl Thread {
    fn execute(&mut self, step: Vec<Action>) {
        for a in step {
            self.core.account(&a);
            if let Action::Write(w) = &a {
                // A write may start after its device moved on (a full batch queued behind the
                // busy device), but never into a segment the log already freed.
                let held = self.core.in_use()[w.dev].iter().any(|s| s.0 == w.segment);
                assert!(held, "write into a freed segment {w:?}");
                assert!(
                    self.in_flight[w.dev].is_none(),
                    "one write in flight per device"
                );
                let end = self.core.policy().model().busy_until(w.dev);
                self.in_flight[w.dev] = Some((end, w.reqs.iter().map(|r| r.0).collect()));
            }
            self.actions.push(a);
        }
    }

    /// Device `dev` is done at `t`; then the consumers release everything durable so far.
    fn done(&mut self, dev: usize, t: Nanos) {
        let (_, reqs) = self.in_flight[dev].take().unwrap();
        let step = self.core.completed(dev, t);
        self.execute(step);
        for r in reqs {
            self.durable[r as usize] = true;
        }
        while self.watermark < self.durable.len() && self.durable[self.watermark] {
            self.watermark += 1;
        }
        if self.watermark > 0 {
            let (step, _) = self.core.release(0, self.watermark as u64 - 1, t);
            self.execute(step);
        }
    }
}

fn through_log_writer(run: &ArrayRun, trace: &[Arrival], seed: u64) -> (Vec<Action>, usize) {
    let in_use = vec![VecDeque::new(); run.disks];
    let mut th = Thread {
        core: Dispatch::new(
            mariner::policy(run, seed),
            in_use,
            vec![Hold::new(HoldKind::MustHold, 0)],
        ),
        in_flight: vec![None; run.disks],
        durable: vec![false; trace.len()],
        watermark: 0,
        actions: Vec::new(),
    };
    let mut next = 0usize;
    loop {
        let done = th
            .in_flight
            .iter()
            .enumerate()
            .filter_map(|(d, f)| f.as_ref().map(|(t, _)| (*t, d)))
            .min();
        let deadline = th.core.next_deadline();
        let arr = trace.get(next).copied();
        match (done, deadline, arr) {
            (Some((t, dev)), _, _)
                if deadline.is_none_or(|d| t <= d) && arr.is_none_or(|(a, _)| t <= a) =>
            {
                th.done(dev, t);
            }
            (_, Some(d), _) if arr.is_none_or(|(a, _)| d <= a) => {
                let step = th.core.poll(d);
                th.execute(step);
            }
            (_, _, Some((a, bytes))) => {
                next += 1;
                let (step, _) = th.core.submit(next as u64 - 1, bytes, a).unwrap();
                th.execute(step);
            }
            _ => break,
        }
    }
    // Everything is durable and released: only each device's current segment stays in use.
    let held = th.core.in_use().iter().map(VecDeque::len).max();
    (th.actions, held.unwrap_or(0))
}

fn runs() -> Vec<ArrayRun> {
    let mut out = Vec::new();
    for (disks, t_wait_us, t_switch, queue_when_busy) in [
        (1, 200, 12.0, false),
        (3, 0, 6.0, false),
        (5, 200, 12.0, false),
        (5, 1000, f64::INFINITY, false),
        (2, 360, 6.0, true),
        (5, 0, 6.0, true),
    ] {
        let mut run = ArrayRun::paper_defaults(0, 0);
        run.disks = disks;
        run.t_wait_ns = t_wait_us * 1000;
        run.t_switch = t_switch;
        run.queue_when_busy = queue_when_busy;
        out.push(run);
    }
    out
}

#[test]
fn the_log_writer_and_the_simulator_make_identical_dispatch_decisions() {
    for (i, run) in runs().iter().enumerate() {
        for (seed, gap_ns) in [(1, 150_000.0), (2, 400_000.0)] {
            let trace = trace(seed * 31 + i as u64, 4_000, gap_ns);
            let sim = mariner::dispatch_decisions(run, &trace, seed);
            let (log, held) = through_log_writer(run, &trace, seed);
            let writes = sim.iter().filter(|a| matches!(a, Action::Write(_))).count();
            let switches = sim.len() - writes;
            assert!(writes > 200 && switches > 10, "run {i}: a trivial trace");
            assert_eq!(sim.len(), log.len(), "run {i} seed {seed}: action counts");
            for (k, (s, l)) in sim.iter().zip(&log).enumerate() {
                assert_eq!(s, l, "run {i} seed {seed}: action {k} differs");
            }
            let laid_out: usize = log
                .iter()
                .map(|a| match a {
                    Action::Write(w) => w.reqs.len(),
                    Action::SwitchSegment { .. } => 0,
                })
                .sum();
            assert_eq!(laid_out, trace.len(), "run {i}: every request written once");
            assert!(
                held <= 4,
                "run {i}: released segments are freed ({held} held)"
            );
        }
    }
}

#[test]
fn batches_actually_form_on_the_trace() {
    // Guards the cross-check against passing vacuously on one-request writes.
    let run = &runs()[2];
    let trace = trace(9, 4_000, 150_000.0);
    let sim = mariner::dispatch_decisions(run, &trace, 1);
    let batched = sim
        .iter()
        .filter(|a| matches!(a, Action::Write(w) if w.reqs.len() > 1))
        .count();
    assert!(batched > 50, "{batched}");
}
