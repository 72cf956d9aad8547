//! Deterministic simulation of a node's write path under faults (issue 15, item 9).
//!
//! The production log ([`mariner_log::Log::open_simulated`]) and store
//! ([`mariner_store::Store::start_stepped`]) run on fault-injecting disks
//! ([`mariner_disk::FaultyDisk`], wrapped in [`mariner_disk::FullDisk`] for the images) with a
//! [`mariner_log::clock::VirtualClock`] and no threads. A scheduler seeded by one number decides
//! everything that a real node leaves to chance: which batch in flight completes next (devices
//! finish out of order), when the placement policy's `T_wait` fires, when the store's applier
//! runs and how far the clock moves, when appends arrive, when a fault strikes (a log device's
//! write fails, an image's sync fails, an image's file system fills up) and when the power goes
//! (in-flight batches land unsynced; every disk keeps its synced data plus, at random, some of
//! the rest, whole, torn or not at all). Small logs fill up, so writers wait for the store to
//! release space. The same seed replays the same run.
//!
//! Invariants checked (the model is [`model::Volume`]):
//! - Reads through the store always equal the acknowledged records applied by sequence
//!   number: every acknowledged write is visible at once, nothing unacknowledged is.
//! - After every crash, recovery finds every acknowledged record above the store's watermark,
//!   unchanged; finds nothing that was not appended; returns records in sequence order;
//!   accounts for every sequence number (found or voided); and the volumes read as the model.
//! - Sequence numbers are handed out once; acknowledgements carry the record's own number;
//!   timestamps rise with sequence numbers, across crashes too; no device has more batches in
//!   flight than its depth.
//! - Without faults the node makes progress: every append is answered, the store applies and
//!   syncs everything, and the images on disk equal the model (liveness, with a full log).
//!
//! TigerBeetle's VOPR and turmoil are the models. `mariner-faultsim --seeds N` soaks; the test
//! `tests/seeds.rs` runs a bounded number of seeds in CI.

pub mod model;
mod world;

use std::fmt;

use world::World;
pub use world::{Setup, StoreParams};

/// Counts over one or more seeds.
#[derive(Debug, Default, Clone, Copy)]
pub struct Summary {
    pub seeds: u64,
    pub appended: u64,
    pub acked: u64,
    pub batches: u64,
    pub crashes: u64,
    pub faults: u64,
    /// Records never acknowledged that recovery found anyway (durable when the power went).
    pub recovered_unacked: u64,
    /// Records never acknowledged that did not survive the crash.
    pub lost_unacked: u64,
    pub torn_tails: u64,
    pub reads: u64,
    /// Appends made while the log was full (writers waiting for the store to release space).
    pub log_full: u64,
    /// Applier rounds that found an image's file system full.
    pub no_space: u64,
    /// Segments the log let go of past a second holder (history, a replica) to make room.
    pub holder_cuts: u64,
    /// Records of the second holder's, above its persisted watermark, gone after a restart
    /// (a cut the crash kept it from hearing of), each below the first record its device kept.
    pub cut_records_found_at_open: u64,
}

impl Summary {
    pub fn add(&mut self, o: &Summary) {
        self.seeds += o.seeds;
        self.appended += o.appended;
        self.acked += o.acked;
        self.batches += o.batches;
        self.crashes += o.crashes;
        self.faults += o.faults;
        self.recovered_unacked += o.recovered_unacked;
        self.lost_unacked += o.lost_unacked;
        self.torn_tails += o.torn_tails;
        self.reads += o.reads;
        self.log_full += o.log_full;
        self.no_space += o.no_space;
        self.holder_cuts += o.holder_cuts;
        self.cut_records_found_at_open += o.cut_records_found_at_open;
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} seeds: {} records appended, {} acknowledged, {} batches, {} crashes, {} faults, \
             {} unacknowledged records recovered and {} lost, {} torn tails, {} reads checked, \
             {} appends into a full log, {} applier rounds out of space, {} segments cut from a \
             second holder ({} of its records found gone at an open)",
            self.seeds,
            self.appended,
            self.acked,
            self.batches,
            self.crashes,
            self.faults,
            self.recovered_unacked,
            self.lost_unacked,
            self.torn_tails,
            self.reads,
            self.log_full,
            self.no_space,
            self.holder_cuts,
            self.cut_records_found_at_open
        )
    }
}

/// An invariant broke.
#[derive(Debug, Clone)]
pub struct Failure {
    pub seed: u64,
    pub message: String,
    /// The last events before it.
    pub trace: Vec<String>,
}

impl Failure {
    fn new(seed: u64, message: String) -> Self {
        Self {
            seed,
            message,
            trace: Vec::new(),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "seed {}: {}", self.seed, self.message)?;
        writeln!(f, "last events:")?;
        for e in &self.trace {
            writeln!(f, "  {e}")?;
        }
        write!(
            f,
            "replay: cargo run --release -p mariner-faultsim -- --seed {} --verbose",
            self.seed
        )
    }
}

/// Steps between crashes.
pub const STEPS: u32 = 300;

/// Runs one seed: opens a node, then one to three times runs random steps and crashes it, and
/// at the end runs it dry and checks the images on disk.
pub fn run_seed(seed: u64, verbose: bool) -> Result<Summary, Failure> {
    let mut w = World::new(seed, verbose)?;
    w.open()?;
    let cycles = 1 + w.random(3);
    for _ in 0..cycles {
        // Now and then the power goes again right after recovery, with its void records
        // still in flight.
        let steps = if w.random(8) == 0 {
            w.random(10)
        } else {
            STEPS / 2 + w.random(STEPS)
        };
        let fault_at = (steps > 0 && w.random(3) == 0).then(|| w.random(steps));
        for step in 0..steps {
            if fault_at == Some(step) {
                w.inject_fault()?;
            }
            match w.random(100) {
                0..=24 => w.append()?,
                25..=49 => {
                    w.complete_one()?;
                }
                50..=57 => {
                    w.fire_timer()?;
                }
                58..=72 => w.store_step()?,
                73..=88 => w.advance()?,
                89..=97 => w.random_read()?,
                _ => w.make_room(),
            }
            w.collect()?;
            w.second_holder_step()?;
        }
        // Sometimes the node runs dry before the power goes: nothing in flight to lose.
        if fault_at.is_none() && w.random(4) == 0 {
            w.drain()?;
        } else if fault_at.is_some() && w.random(2) == 0 {
            w.settle()?;
        }
        w.crash()?;
        w.open()?;
    }
    w.drain()?;
    let mut s = w.summary;
    s.seeds = 1;
    Ok(s)
}

/// Runs seeds `first..first + count`, stopping at the first failure.
pub fn run_seeds(first: u64, count: u64) -> Result<Summary, Failure> {
    let mut total = Summary::default();
    for seed in first..first + count {
        // A panic anywhere in the node is a finding like any other: report its seed.
        let run = std::panic::catch_unwind(|| run_seed(seed, false));
        let summary = run.unwrap_or_else(|p| {
            let what = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Err(Failure::new(seed, format!("panicked: {what}")))
        })?;
        total.add(&summary);
    }
    Ok(total)
}
