//! The engines behind one interface, and how each is held to the budget and the durability.
//!
//! | engine | memory budget B goes to | durable every N operations by |
//! |---|---|---|
//! | bosc-btree | BOSC queues + cached leaves = B − the tree's internal nodes and free list (re-evaluated every batch) | `BPlusTree::insert_batch`: one group commit of BOSC's own log per batch |
//! | redb | `Builder::set_cache_size(B)` | one write transaction per batch, committed with `Durability::Immediate` |
//! | fjall | block cache B/4 (filter and index blocks included: unpinned, partitioned), `max_write_buffer_size` B/4, memtable B/8; the other B/2 is what fjall allocates beyond its knobs (see `peers.rs`) | `insert` each, then `Database::persist(SyncData)` |
//! | bosc-hash | BOSC queues = B − the page counts | `BoscHash::put_batch`: one group commit per batch |
//! | plain-hash | page cache of B / page size pages | each put writes its page, then one fdatasync per batch |
//!
//! Every engine's sync is an fdatasync (redb and BOSC's log and data disk call it; fjall's
//! `SyncData` is it). The memory cgroup of `bench/index-compare.sh` (B + a fixed slack)
//! bounds the page cache as well, so no engine can keep its index there.

mod bosc;
mod hash;
mod peers;

use std::path::{Path, PathBuf};
use std::time::Duration;

use mariner_bosc::btree::Key;
use serde_json::{Map, Value};

use crate::workload::Workload;
use crate::{BenchError, Config, EngineKind};

/// What a reopen found.
#[derive(Debug, Default)]
pub struct Reopened {
    /// Close plus open.
    pub elapsed: Duration,
    /// Engine-specific: e.g. BOSC's requeued pending updates and its scan time.
    pub notes: Map<String, Value>,
}

/// One engine under test.
pub trait Engine {
    /// The untimed sorted bulk load of the preload.
    fn load(&mut self, w: &Workload) -> Result<(), BenchError>;
    /// Inserts or updates; everything is durable when it returns.
    fn write_batch(&mut self, batch: &[(Key, u64)]) -> Result<(), BenchError>;
    /// Point query.
    fn get(&mut self, key: Key) -> Result<Option<u64>, BenchError>;
    /// Records in `[from, to)` in key order; `None` (the default) where the engine has no
    /// range queries.
    fn range(&mut self, _from: Key, _to: Key) -> Result<Option<Vec<(Key, u64)>>, BenchError> {
        Ok(None)
    }
    /// Commits what the engine holds queued in memory and its log only (BOSC's pending
    /// modifications) to the index in place, durably; returns how many blocks were queued, or
    /// `None` (the default) for an engine that queues nothing beyond its durable writes.
    fn commit_queued(&mut self) -> Result<Option<u64>, BenchError> {
        Ok(None)
    }
    /// Closes (BOSC: without committing its queues, as after a crash) and opens again.
    fn reopen(&mut self) -> Result<Reopened, BenchError>;
    /// Counters worth reporting.
    fn notes(&self) -> Map<String, Value>;
    /// The files (or directories) holding the index.
    fn index_files(&self) -> Vec<PathBuf>;
}

/// The engine of `cfg` in `cfg.dir`: on new empty files (`fresh`, to be loaded), or on the
/// files a run with the same parameters left (to be reopened).
pub fn new(cfg: &Config, fresh: bool) -> Result<Box<dyn Engine>, BenchError> {
    Ok(match cfg.engine {
        EngineKind::BoscBtree => Box::new(bosc::BoscBtree::new(cfg, fresh)?),
        EngineKind::Redb => Box::new(peers::RedbEngine::new(cfg, fresh)?),
        EngineKind::Fjall => Box::new(peers::FjallEngine::new(cfg, fresh)?),
        EngineKind::BoscHash => Box::new(hash::BoscHashEngine::new(cfg, fresh)?),
        EngineKind::PlainHash => Box::new(hash::PlainHashEngine::new(cfg, fresh)?),
    })
}

/// Disk space allocated to files and directory trees.
pub fn allocated_bytes(paths: &[PathBuf]) -> Result<u64, BenchError> {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    for p in paths {
        let md = std::fs::symlink_metadata(p)?;
        if md.is_dir() {
            let children: Vec<PathBuf> = std::fs::read_dir(p)?
                .map(|e| e.map(|e| e.path()))
                .collect::<Result<_, _>>()?;
            total += allocated_bytes(&children)?;
        } else {
            total += md.blocks() * 512;
        }
    }
    Ok(total)
}

/// Removes what a previous run left at `path`.
fn remove_old(path: &Path) -> Result<(), BenchError> {
    match std::fs::symlink_metadata(path) {
        Ok(md) if md.is_dir() => std::fs::remove_dir_all(path)?,
        Ok(_) => std::fs::remove_file(path)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e.into()),
    }
    Ok(())
}

fn budget_usize(cfg: &Config) -> usize {
    usize::try_from(cfg.budget_bytes).unwrap_or(usize::MAX)
}

/// What a BOSC engine's queues get of `budget` once the index's own in-memory structures
/// (`own` bytes) are paid for; never less than a quarter of it.
pub(crate) fn queue_budget(budget: usize, own: usize) -> usize {
    budget.saturating_sub(own).max(budget / 4)
}
