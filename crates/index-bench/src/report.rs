//! The one-line JSON result of a run.

use std::time::Duration;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::workload::RECORD_BYTES;
use crate::Config;

/// A timed write phase.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Phase {
    /// Operations done.
    pub ops: u64,
    /// Seconds they took.
    pub secs: f64,
    /// `ops / secs`.
    pub ops_per_s: f64,
    /// CPU seconds (user + system) the calling thread used.
    pub thread_cpu_s: f64,
    /// CPU seconds the whole process used, the engine's background threads included.
    pub process_cpu_s: f64,
    /// With `--commit-queued`, for an engine that queues (BOSC): blocks with queued
    /// modifications when the phase ended, ...
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queued_blocks: Option<u64>,
    /// ... the seconds the timed commit of all of them took after the phase, ...
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit_s: Option<f64>,
    /// ... and `ops / (secs + commit_s)`: the rate with the phase's queued work paid for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ops_per_s_committed: Option<f64>,
}

impl Phase {
    /// From a count, its time and the CPU times at its start ([`cpu_now`]).
    pub fn new(ops: u64, took: Duration, cpu_at_start: (f64, f64)) -> Self {
        let secs = took.as_secs_f64();
        let (thread, process) = cpu_now();
        Self {
            ops,
            secs,
            ops_per_s: if secs > 0.0 { ops as f64 / secs } else { 0.0 },
            thread_cpu_s: thread - cpu_at_start.0,
            process_cpu_s: process - cpu_at_start.1,
            queued_blocks: None,
            commit_s: None,
            ops_per_s_committed: None,
        }
    }

    /// Adds the commit of what the phase left queued: `queued` blocks, committed in `took`.
    pub fn with_commit(mut self, queued: u64, took: Duration) -> Self {
        let commit = took.as_secs_f64();
        let total = self.secs + commit;
        self.queued_blocks = Some(queued);
        self.commit_s = Some(commit);
        self.ops_per_s_committed = Some(if total > 0.0 {
            self.ops as f64 / total
        } else {
            0.0
        });
        self
    }
}

/// CPU seconds (user + system) used so far by the calling thread and by the process.
pub fn cpu_now() -> (f64, f64) {
    let usage = |who| {
        // SAFETY: `rusage` is plain integers and timevals, so all zeros is a valid value.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: getrusage writes only the struct it is given, which lives across the call.
        if unsafe { libc::getrusage(who, &mut u) } != 0 {
            return 0.0;
        }
        let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        secs(u.ru_utime) + secs(u.ru_stime)
    };
    (usage(libc::RUSAGE_THREAD), usage(libc::RUSAGE_SELF))
}

/// Query latencies.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Latency {
    /// Queries timed.
    pub count: u64,
    /// Median, µs.
    pub p50_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
    /// Mean, µs.
    pub mean_us: f64,
    /// Range queries: mean records returned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub records_mean: Option<f64>,
}

impl Latency {
    /// From the individual times; `records` is the total a range phase returned.
    pub fn new(mut times: Vec<Duration>, records: Option<u64>) -> Self {
        times.sort_unstable();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let at = |pct: usize| {
            let i = (times.len() * pct / 100).min(times.len().saturating_sub(1));
            times.get(i).copied().map_or(0.0, us)
        };
        let count = times.len() as u64;
        let total: Duration = times.iter().sum();
        Self {
            count,
            p50_us: at(50),
            p99_us: at(99),
            mean_us: if count > 0 {
                us(total) / count as f64
            } else {
                0.0
            },
            records_mean: records.map(|r| r as f64 / count.max(1) as f64),
        }
    }
}

/// A reopen: close (BOSC without committing its queues) and open again.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReopenReport {
    /// Engine name.
    pub engine: String,
    /// Close plus open, seconds.
    pub reopen_s: f64,
    /// What the open found (BOSC: pending updates requeued from its log, scan time).
    pub notes: Map<String, Value>,
    /// Inserted records looked up and found after it.
    pub inserts_checked: u64,
    /// Peak resident set of the process (VmHWM), bytes.
    pub peak_rss_bytes: u64,
}

/// Everything a run measured, printed as one JSON line.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// Engine name.
    pub engine: String,
    /// The memory budget, bytes.
    pub budget_bytes: u64,
    /// Durable every this many operations.
    pub sync_every: u64,
    /// Records bulk-loaded.
    pub preload_entries: u64,
    /// `preload_entries` × 28 bytes (20-byte key + 8-byte value).
    pub preload_raw_bytes: u64,
    /// Disk space of the index's files after the bulk load.
    pub index_disk_bytes: u64,
    /// The untimed bulk load, seconds.
    pub bulk_load_s: f64,
    /// Random inserts of new keys.
    pub insert: Phase,
    /// Random updates of preloaded keys.
    pub update: Phase,
    /// Point queries of random preloaded keys.
    pub point: Latency,
    /// Range queries (B-trees and the LSM only).
    pub range: Option<Latency>,
    /// Engine counters after the timed phases.
    pub notes: Map<String, Value>,
    /// The engine's counters at the end of the insert phase (`notes` are at the end of
    /// the run): what the inserts alone cost.
    pub notes_after_insert: Map<String, Value>,
    /// The reopen inside the run, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reopen: Option<ReopenReport>,
    /// Whether every answer was checked against a model.
    pub verified: bool,
    /// Peak resident set of the process (VmHWM), bytes.
    pub peak_rss_bytes: u64,
    /// Resident set (VmRSS) after each phase, bytes.
    pub rss_bytes: Map<String, Value>,
    /// The allocator's heap after each phase (glibc's `mallinfo2`: bytes in use and bytes
    /// free but kept), where the resident set beyond what an engine holds goes.
    #[serde(skip_serializing_if = "Map::is_empty")]
    pub heap_bytes: Map<String, Value>,
}

impl Report {
    /// An empty report for `cfg`.
    pub fn new(cfg: &Config) -> Self {
        Self {
            engine: cfg.engine.name().into(),
            budget_bytes: cfg.budget_bytes,
            sync_every: cfg.sync_every,
            preload_entries: cfg.preload_entries,
            preload_raw_bytes: cfg.preload_entries * RECORD_BYTES,
            ..Self::default()
        }
    }

    /// Records the resident set after `phase` (and says so on stderr, for long runs).
    pub fn note_rss(&mut self, phase: &str) {
        let rss = rss_bytes();
        let heap = mariner_heap::usage().map(|u| (u.in_use, u.free));
        match heap {
            Some((used, free)) => eprintln!(
                "{}: {phase} done, RSS {} MiB (heap {} MiB in use, {} MiB free)",
                self.engine,
                rss >> 20,
                used >> 20,
                free >> 20
            ),
            None => eprintln!("{}: {phase} done, RSS {} MiB", self.engine, rss >> 20),
        }
        self.rss_bytes.insert(phase.into(), Value::from(rss));
        if let Some((used, free)) = heap {
            let v = serde_json::json!({ "in_use": used, "free": free });
            self.heap_bytes.insert(phase.into(), v);
        }
    }
}

/// VmHWM from /proc/self/status; 0 where there is none.
pub fn peak_rss_bytes() -> u64 {
    status_bytes("VmHWM:")
}

/// VmRSS from /proc/self/status; 0 where there is none.
pub fn rss_bytes() -> u64 {
    status_bytes("VmRSS:")
}

fn status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// `--trace`: once a second of a timed phase, the operations done and every numeric engine
/// counter that moved since the line before, as one stderr line.
pub struct Trace {
    phase: &'static str,
    started: std::time::Instant,
    last: std::time::Instant,
    ops: u64,
    notes: Map<String, Value>,
}

impl Trace {
    /// Starts a trace of `phase` from the engine's counters now.
    pub fn new(phase: &'static str, engine: &dyn crate::engines::Engine) -> Self {
        let now = std::time::Instant::now();
        Self {
            phase,
            started: now,
            last: now,
            ops: 0,
            notes: engine.notes(),
        }
    }

    /// After each batch: prints a line when a second has passed.
    pub fn tick(&mut self, engine: &dyn crate::engines::Engine, ops: u64) {
        let now = std::time::Instant::now();
        let secs = now.duration_since(self.last).as_secs_f64();
        if secs < 1.0 {
            return;
        }
        let notes = engine.notes();
        let mut line = format!(
            "trace {} t={:.0} ops/s={:.0}",
            self.phase,
            now.duration_since(self.started).as_secs_f64(),
            (ops - self.ops) as f64 / secs
        );
        for (k, v) in &notes {
            let (Some(new), Some(old)) = (v.as_f64(), self.notes.get(k).and_then(Value::as_f64))
            else {
                continue;
            };
            if new != old {
                line.push_str(&format!(" {k}={}", round3(new - old)));
            }
        }
        eprintln!("{line}");
        (self.last, self.ops, self.notes) = (now, ops, notes);
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}
