//! Issue 4's index benchmark: the B+tree and the hash table on BOSC beside redb (a
//! conventional B-tree), fjall (an LSM tree) and the same hash table over plain read/write.
//!
//! One run is one engine ([`run`]): an untimed sorted bulk load of the preload, then timed
//! random inserts and random updates (each for at most `ops` operations or `window`,
//! whichever ends first), then point- and range-query latency. The run ends without a clean
//! shutdown of BOSC (its queues stay in its log only, as after a crash); [`reopen`], in a new
//! process, then times opening the files again and looks up a sample of the inserts. Every engine
//! gets the same memory budget for what it keeps in memory and makes its writes durable every
//! `sync_every` operations; [`engines`] says how, engine by engine. `bench/index-compare.sh`
//! runs each engine in its own memory cgroup; `tests/tiny.rs` runs them all with tiny
//! parameters and checks them against a `BTreeMap`.

#![warn(missing_docs)]

pub mod engines;
pub mod report;
pub mod workload;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use mariner_bosc::btree::Key;

use report::{Latency, Phase};
pub use report::{ReopenReport, Report};
use workload::{Rng, Workload};

/// What can go wrong.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The benchmark's parameters.
    #[error("configuration: {0}")]
    Config(String),
    /// A BOSC engine or index.
    #[error("BOSC: {0}")]
    Bosc(#[from] mariner_bosc::Error),
    /// BOSC's own log.
    #[error("log: {0}")]
    Log(#[from] mariner_log::LogError),
    /// redb.
    #[error("redb: {0}")]
    Redb(#[from] redb::Error),
    /// fjall.
    #[error("fjall: {0}")]
    Fjall(#[from] fjall::Error),
    /// Files.
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    /// An engine returned something wrong.
    #[error("check failed: {0}")]
    Check(String),
}

/// The engines compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    /// The B+tree on BOSC (mariner-bosc `BPlusTree`).
    BoscBtree,
    /// redb 4, a copy-on-write B-tree.
    Redb,
    /// fjall 3, an LSM tree.
    Fjall,
    /// The hash table on BOSC (mariner-bosc `BoscHash`).
    BoscHash,
    /// The same hash table over plain read/write (mariner-bosc `PlainHash`).
    PlainHash,
}

impl EngineKind {
    /// Every engine, in the order the comparison prints them.
    pub const ALL: [EngineKind; 5] = [
        EngineKind::BoscBtree,
        EngineKind::Redb,
        EngineKind::Fjall,
        EngineKind::BoscHash,
        EngineKind::PlainHash,
    ];

    /// The name on the command line and in the report.
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::BoscBtree => "bosc-btree",
            EngineKind::Redb => "redb",
            EngineKind::Fjall => "fjall",
            EngineKind::BoscHash => "bosc-hash",
            EngineKind::PlainHash => "plain-hash",
        }
    }

    /// Parses [`EngineKind::name`].
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Whether the engine answers range queries (the hash tables do not).
    pub fn ranges(self) -> bool {
        !matches!(self, EngineKind::BoscHash | EngineKind::PlainHash)
    }

    /// Most operations per timed phase: the hash tables pack a key into a u64, with 24 bits
    /// for the insert's timestamp; the ordered engines keep whole 20-byte keys.
    pub fn max_ops(self) -> u64 {
        if self.ranges() {
            1 << 40
        } else {
            (1 << 23) - 1
        }
    }
}

/// One run's parameters.
#[derive(Debug, Clone)]
pub struct Config {
    /// Which engine.
    pub engine: EngineKind,
    /// Scratch directory for the engine's files (created; must be on the disk under test).
    pub dir: PathBuf,
    /// Memory for everything the engine keeps in memory (caches, memtables, queues, internal
    /// nodes).
    pub budget_bytes: u64,
    /// Records bulk-loaded before the timed phases.
    pub preload_entries: u64,
    /// Most operations per timed phase.
    pub ops: u64,
    /// Longest time per timed phase.
    pub window: Duration,
    /// Writes are durable every this many operations.
    pub sync_every: u64,
    /// Point queries, and as many range queries.
    pub queries: u64,
    /// LBAs a range query covers (≈ records it returns).
    pub range_len: u64,
    /// Seed of the operations' random numbers.
    pub seed: u64,
    /// Block (leaf, page) size of the BOSC engines and the plain hash table.
    pub block_bytes: u32,
    /// Longest BOSC commit run, in blocks (32 in the seed).
    pub max_run: u32,
    /// BOSC engines: shadow extents instead of a double-write area (`BoscConfig::shadow`).
    pub shadow: bool,
    /// bosc-btree: parts each batch is handed to the log in (`BPlusTree::set_log_parts`).
    pub log_parts: usize,
    /// Keep a model of every record and check every engine answer against it (tiny runs).
    pub verify: bool,
    /// Also close and reopen inside [`run`] (and check the model again when verifying).
    pub reopen_in_run: bool,
    /// End each timed write phase with a timed commit of what the engine left queued (BOSC's
    /// queues), reported beside the phase's rate; the reopen then finds nothing to requeue.
    pub commit_queued: bool,
    /// Print to stderr, every second of a timed write phase, the operations done and each
    /// engine counter that moved in that second (where a phase's time goes, second by second).
    pub trace: bool,
    /// BOSC engines: `BoscConfig::sweep_full_above`, when not BOSC's default.
    pub sweep_full_above: Option<f64>,
    /// BOSC engines: `BoscConfig::sweep_above`, when not BOSC's default.
    pub sweep_above: Option<f64>,
}

impl Config {
    /// Tiny defaults for `engine` in `dir`; the command line and the tests change fields.
    pub fn new(engine: EngineKind, dir: PathBuf) -> Self {
        Self {
            engine,
            dir,
            budget_bytes: 32 << 20,
            preload_entries: 1_000_000,
            ops: 1_000_000,
            window: Duration::from_secs(60),
            sync_every: 1000,
            queries: 2000,
            range_len: 100,
            seed: 1,
            block_bytes: 4096,
            max_run: 32,
            shadow: true,
            trace: false,
            sweep_full_above: None,
            sweep_above: None,
            log_parts: 1,
            verify: false,
            reopen_in_run: false,
            commit_queued: false,
        }
    }

    /// The most inserts the insert phase can make, for sizing the files: `ops`, or what the
    /// window allows at 2 million a second (faster than any engine here by far), whichever is
    /// less — a sparse file sized for `ops` = 10^9 made the B+tree's open scan 110 GB of
    /// zeros.
    pub fn max_inserts(&self) -> u64 {
        const FASTEST_PER_SEC: u64 = 2_000_000;
        self.ops
            .min(self.window.as_secs().max(1).saturating_mul(FASTEST_PER_SEC))
    }

    fn check(&self) -> Result<(), BenchError> {
        let bad = |why: &str| Err(BenchError::Config(why.into()));
        if self.preload_entries == 0 || self.sync_every == 0 {
            return bad("preload and sync-every must be at least 1");
        }
        if self.ops > self.engine.max_ops() {
            return bad(&format!(
                "at most {} operations per phase for {} (hash keys pack timestamps into 24 bits)",
                self.engine.max_ops(),
                self.engine.name()
            ));
        }
        if self.preload_entries >= 1 << 30 {
            return bad("at most 2^30 preloaded entries (LBAs pack into 32 bits)");
        }
        Ok(())
    }
}

/// What [`run`] keeps to check engines: the model, and inserted records to look for after
/// the reopen.
struct Checks {
    model: Option<BTreeMap<Key, u64>>,
    inserted_sample: Vec<(Key, u64)>,
}

/// Runs one engine through every phase and reports.
pub fn run(cfg: &Config) -> Result<Report, BenchError> {
    cfg.check()?;
    std::fs::create_dir_all(&cfg.dir)?;
    let w = Workload::new(cfg.preload_entries);
    let mut engine = engines::new(cfg, true)?;
    let mut report = Report::new(cfg);
    let mut checks = Checks {
        model: cfg.verify.then(BTreeMap::new),
        inserted_sample: Vec::new(),
    };

    let started = Instant::now();
    engine.load(&w)?;
    report.bulk_load_s = started.elapsed().as_secs_f64();
    report.note_rss("load");
    report.index_disk_bytes = engines::allocated_bytes(&engine.index_files())?;
    if let Some(m) = checks.model.as_mut() {
        m.extend(w.preloaded());
    }

    let mut rng = Rng::new(cfg.seed);
    report.insert = timed_writes(engine.as_mut(), cfg, &mut checks, true, |j| {
        w.insert(&mut rng, j)
    })?;
    report.note_rss("insert");
    report.notes_after_insert = engine.notes();
    report.update = timed_writes(engine.as_mut(), cfg, &mut checks, false, |j| {
        w.update(&mut rng, j)
    })?;
    report.note_rss("update");
    report.point = point_queries(engine.as_mut(), cfg, &w, &mut rng)?;
    if cfg.engine.ranges() {
        report.range = Some(range_queries(engine.as_mut(), cfg, &w, &mut rng)?);
    }
    if let Some(m) = &checks.model {
        verify(engine.as_mut(), cfg, m, "after the timed phases")?;
    }
    report.notes = engine.notes();
    report.note_rss("queries");
    save_sample(cfg, &checks.inserted_sample)?;
    if cfg.reopen_in_run {
        let reopened = engine.reopen()?;
        report.reopen = Some(check_reopened(engine.as_mut(), cfg, reopened, &checks)?);
        report.note_rss("reopen");
    }
    report.verified = cfg.verify;
    report.peak_rss_bytes = report::peak_rss_bytes();
    Ok(report)
}

/// Opens the files a [`run`] with the same parameters left, as after a crash for BOSC (whose
/// queues then come back from its log), and looks up the sample of inserts it saved.
pub fn reopen(cfg: &Config) -> Result<ReopenReport, BenchError> {
    cfg.check()?;
    let mut engine = engines::new(cfg, false)?;
    let reopened = engine.reopen()?;
    let checks = Checks {
        model: None,
        inserted_sample: load_sample(cfg)?,
    };
    check_reopened(engine.as_mut(), cfg, reopened, &checks)
}

fn check_reopened(
    engine: &mut dyn engines::Engine,
    cfg: &Config,
    reopened: engines::Reopened,
    checks: &Checks,
) -> Result<ReopenReport, BenchError> {
    for (k, v) in &checks.inserted_sample {
        if engine.get(*k)? != Some(*v) {
            return Err(BenchError::Check(format!(
                "inserted {k:?} → {v} is gone after the reopen"
            )));
        }
    }
    if let Some(m) = &checks.model {
        verify(engine, cfg, m, "after the reopen")?;
    }
    Ok(ReopenReport {
        engine: cfg.engine.name().into(),
        reopen_s: reopened.elapsed.as_secs_f64(),
        notes: reopened.notes,
        inserts_checked: checks.inserted_sample.len() as u64,
        peak_rss_bytes: report::peak_rss_bytes(),
    })
}

fn sample_path(cfg: &Config) -> PathBuf {
    cfg.dir.join(format!("{}.inserted.json", cfg.engine.name()))
}

/// The sample of inserts, for [`reopen`] in another process.
fn save_sample(cfg: &Config, sample: &[(Key, u64)]) -> Result<(), BenchError> {
    let rows: Vec<[u64; 4]> = sample
        .iter()
        .map(|(k, v)| [u64::from(k.volume), k.lba, k.timestamp, *v])
        .collect();
    let mut out = std::io::BufWriter::new(std::fs::File::create(sample_path(cfg))?);
    serde_json::to_writer(&mut out, &rows).map_err(|e| BenchError::Check(e.to_string()))?;
    std::io::Write::flush(&mut out)?;
    Ok(())
}

fn load_sample(cfg: &Config) -> Result<Vec<(Key, u64)>, BenchError> {
    let text = std::fs::read_to_string(sample_path(cfg))?;
    let rows: Vec<[u64; 4]> =
        serde_json::from_str(&text).map_err(|e| BenchError::Check(e.to_string()))?;
    rows.into_iter()
        .map(|[v, l, t, x]| {
            let volume = u32::try_from(v)
                .map_err(|_| BenchError::Check(format!("bad volume {v} in the sample")))?;
            Ok((Key::new(volume, l, t), x))
        })
        .collect()
}

/// One insert in this many is kept for the reopen's check ([`Checks::inserted_sample`]).
const SAMPLE_EVERY: u64 = 1000;

/// The operations of `batch`, whose first is the phase's operation `first`, that are a
/// multiple of [`SAMPLE_EVERY`] in the phase.
fn sampled<T>(first: u64, batch: &[T]) -> impl Iterator<Item = &T> {
    let skip = first.next_multiple_of(SAMPLE_EVERY) - first;
    batch
        .iter()
        .skip(usize::try_from(skip).unwrap_or(usize::MAX))
        .step_by(SAMPLE_EVERY as usize)
}

/// One timed write phase: batches of `sync_every` operations, each durable when the engine
/// returns, until `ops` are done or the window is over.
fn timed_writes(
    engine: &mut dyn engines::Engine,
    cfg: &Config,
    checks: &mut Checks,
    inserts: bool,
    mut next: impl FnMut(u64) -> (Key, u64),
) -> Result<Phase, BenchError> {
    let started = Instant::now();
    let cpu = report::cpu_now();
    let mut done = 0;
    let mut batch = Vec::with_capacity(cfg.sync_every as usize);
    let mut trace = cfg
        .trace
        .then(|| report::Trace::new(if inserts { "insert" } else { "update" }, engine));
    while done < cfg.ops && started.elapsed() < cfg.window {
        let n = cfg.sync_every.min(cfg.ops - done);
        batch.clear();
        batch.extend((done..done + n).map(&mut next));
        engine.write_batch(&batch)?;
        if let Some(t) = trace.as_mut() {
            t.tick(engine, done + n);
        }
        if let Some(m) = checks.model.as_mut() {
            m.extend(batch.iter().copied());
        }
        if inserts {
            // Every 1000th insert of the phase is looked up after the reopen (counted over
            // the phase, not per batch: per batch, a sync every 10 sampled a fifth of all
            // inserts, tens of MB charged to the engine's cgroup).
            checks
                .inserted_sample
                .extend(sampled(done, &batch).copied());
        }
        done += n;
    }
    if inserts {
        // And the whole last batch, the one most likely lost by a reopen that misses an
        // acknowledgement.
        checks.inserted_sample.extend(batch.iter().copied());
    }
    let phase = Phase::new(done, started.elapsed(), cpu);
    if !cfg.commit_queued {
        return Ok(phase);
    }
    let commit = Instant::now();
    Ok(match engine.commit_queued()? {
        Some(queued) => phase.with_commit(queued, commit.elapsed()),
        None => phase,
    })
}

fn point_queries(
    engine: &mut dyn engines::Engine,
    cfg: &Config,
    w: &Workload,
    rng: &mut Rng,
) -> Result<Latency, BenchError> {
    let mut ns = Vec::with_capacity(cfg.queries as usize);
    for _ in 0..cfg.queries {
        let i = w.pick(rng);
        let started = Instant::now();
        let got = engine.get(w.preload_key(i))?;
        ns.push(started.elapsed());
        if !got.is_some_and(|v| Workload::plausible(i, v)) {
            return Err(BenchError::Check(format!(
                "point query of preloaded entry {i} returned {got:?}"
            )));
        }
    }
    Ok(Latency::new(ns, None))
}

fn range_queries(
    engine: &mut dyn engines::Engine,
    cfg: &Config,
    w: &Workload,
    rng: &mut Rng,
) -> Result<Latency, BenchError> {
    let mut ns = Vec::with_capacity(cfg.queries as usize);
    let mut records = 0;
    for _ in 0..cfg.queries {
        let (from, to, at_least) = w.range(w.pick(rng), cfg.range_len);
        let started = Instant::now();
        let got = engine.range(from, to)?.unwrap_or_default();
        ns.push(started.elapsed());
        let sorted = got.windows(2).all(|p| p[0].0 < p[1].0);
        let inside = got.iter().all(|(k, _)| from <= *k && *k < to);
        if (got.len() as u64) < at_least || !sorted || !inside {
            return Err(BenchError::Check(format!(
                "range {from:?}..{to:?}: {} records (at least {at_least}), sorted {sorted}, \
                 inside {inside}",
                got.len()
            )));
        }
        records += got.len() as u64;
    }
    Ok(Latency::new(ns, Some(records)))
}

/// Every record of the model, one by one, and (for range engines) one full scan.
fn verify(
    engine: &mut dyn engines::Engine,
    cfg: &Config,
    model: &BTreeMap<Key, u64>,
    when: &str,
) -> Result<(), BenchError> {
    for (k, v) in model {
        let got = engine.get(*k)?;
        if got != Some(*v) {
            return Err(BenchError::Check(format!(
                "{when}: {k:?} holds {got:?}, the model {v}"
            )));
        }
    }
    if cfg.engine.ranges() {
        let all = engine
            .range(Key::MIN, Key::new(u32::MAX, 0, 0))?
            .unwrap_or_default();
        let want: Vec<_> = model.iter().map(|(k, v)| (*k, *v)).collect();
        if all != want {
            return Err(BenchError::Check(format!(
                "{when}: a full scan returned {} records, the model has {}",
                all.len(),
                want.len()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sample_takes_every_thousandth_operation_of_the_phase_whatever_the_batches() {
        for batch in [1u64, 7, 10, 999, 1000, 1001, 4096] {
            let ops: Vec<u64> = (0..10_500).collect();
            let mut got = Vec::new();
            for (i, chunk) in ops.chunks(batch as usize).enumerate() {
                got.extend(sampled(i as u64 * batch, chunk).copied());
            }
            let want: Vec<u64> = (0..10_500).step_by(1000).collect();
            assert_eq!(got, want, "batches of {batch}");
        }
    }
}
