//! The B+tree on BOSC, and the BOSC set-up the hash table shares.
//!
//! Files: `<engine>.data` (BOSC's data disk, 4 KiB blocks by default), `<engine>.router` (the
//! B+tree's router image) and `<engine>.log` (BOSC's own mariner-log, one device, zero-filled
//! at creation so fdatasync does not commit the file system's journal for unwritten extents).
//! Durability: own-log mode. A single `modify` is durable before it returns (stronger than
//! every N); the benchmark uses the batch calls, which log a whole batch with one group commit
//! and return when all of it is durable —
//! the same promise redb's transaction and fjall's persist give every N operations. Recovery
//! replays the log above the checkpoint into the queues ([`Engine::reopen`] measures it).

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mariner_bosc::btree::{leaf_capacity, BPlusTree, Key, LeafApp};
use mariner_bosc::format::BLOCK_HEADER_LEN;
use mariner_bosc::{BlockApp, Bosc, BoscConfig, Durability, OpenReport};
use mariner_disk::{Disk, FileDisk, OpenOptions};
use mariner_log::{Log, LogConfig};
use serde_json::{json, Map, Value};

use super::{budget_usize, remove_old, Engine, Reopened};
use crate::workload::Workload;
use crate::{BenchError, Config};

const LOG_ID: u128 = 0x1DE8_B05C;
/// Bytes a logged B+tree or hash modification takes in the log (80-byte header, 17-byte BOSC
/// prefix, the modification), rounded up.
const LOG_RECORD_BYTES: u64 = 160;

/// A BOSC engine's files and configurations.
pub(super) struct BoscFiles {
    data: PathBuf,
    log: PathBuf,
    /// The B+tree's router image (`BPlusTree::open_with_router`).
    router: PathBuf,
    pub(super) cfg: BoscConfig,
    log_cfg: LogConfig,
}

impl BoscFiles {
    /// Formats fresh files: a data disk of `block_count` blocks and a log sized for every
    /// write of both timed phases, in case nothing were released.
    pub(super) fn create<A: BlockApp>(
        cfg: &Config,
        block_count: u64,
        budget: usize,
    ) -> Result<Self, BenchError> {
        let files = Self::existing(cfg, block_count, budget);
        remove_old(&files.data)?;
        remove_old(&files.log)?;
        remove_old(&files.router)?;
        let data = FileDisk::open(&files.data, &OpenOptions::new().create(true).random(true))?;
        Bosc::<A>::format(&data, &files.cfg)?;
        let log_bytes = (2 * cfg.ops * LOG_RECORD_BYTES).clamp(16 << 20, 1 << 30);
        let log: Arc<dyn Disk> = Arc::new(FileDisk::open(
            &files.log,
            &OpenOptions::new().create(true),
        )?);
        mariner_disk::write_zeros(log.as_ref(), 0, log_bytes)?;
        log.sync()?;
        Log::format(&[log], &files.log_cfg, LOG_ID)?;
        Ok(files)
    }

    /// The files a run with the same parameters created.
    pub(super) fn existing(cfg: &Config, block_count: u64, budget: usize) -> Self {
        let name = cfg.engine.name();
        Self {
            data: cfg.dir.join(format!("{name}.data")),
            log: cfg.dir.join(format!("{name}.log")),
            router: cfg.dir.join(format!("{name}.router")),
            cfg: BoscConfig {
                block_bytes: cfg.block_bytes,
                block_count,
                max_run: cfg.max_run,
                memory_budget_bytes: budget,
                background: Some(Duration::from_millis(10)),
                dw_runs: if cfg.shadow {
                    0
                } else {
                    BoscConfig::default().dw_runs
                },
                shadow: cfg.shadow,
                sweep_above: cfg.sweep_above.unwrap_or(BoscConfig::default().sweep_above),
                sweep_full_above: cfg
                    .sweep_full_above
                    .unwrap_or(BoscConfig::default().sweep_full_above),
                ..BoscConfig::default()
            },
            // Batches aligned for O_DIRECT; O_DSYNC makes each write durable (see `open`).
            log_cfg: LogConfig {
                align_bytes: 4096,
                sync_each_write: false,
                ..LogConfig::default()
            },
        }
    }

    /// Opens (and recovers) the engine.
    pub(super) fn open<A: BlockApp>(&self, app: A) -> Result<(Bosc<A>, OpenReport), BenchError> {
        let data: Arc<dyn Disk> = Arc::new(FileDisk::open(
            &self.data,
            &OpenOptions::new().random(true),
        )?);
        // The log is written once and read back only at recovery: O_DIRECT|O_DSYNC writes each
        // group commit straight to the disk, past the page cache (which the memory limit
        // counts), with no fdatasync after it (log waits 12.3 -> 10.0-10.4 s per 60 s).
        let log: Arc<dyn Disk> = Arc::new(FileDisk::open(
            &self.log,
            &OpenOptions::new().direct(true).dsync(true),
        )?);
        let durability = Durability::OwnLog {
            devices: vec![log],
            log: self.log_cfg.clone(),
            log_id: LOG_ID,
            volume: 1,
        };
        Ok(Bosc::open(
            data,
            self.cfg.clone(),
            durability,
            Arc::new(app),
        )?)
    }

    /// The router image file, created empty if missing.
    pub(super) fn router(&self) -> Result<Arc<dyn Disk>, BenchError> {
        Ok(Arc::new(FileDisk::open(
            &self.router,
            &OpenOptions::new().create(true),
        )?))
    }

    pub(super) fn data_path(&self) -> PathBuf {
        self.data.clone()
    }
}

/// The engine's counters.
pub(super) fn engine_notes<A: BlockApp>(b: &Bosc<A>) -> Map<String, Value> {
    let s = b.stats();
    let n = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    let mut m = Map::new();
    m.insert("modifications".into(), json!(n(&s.modifications)));
    m.insert("applied_in_memory".into(), json!(n(&s.applied_in_memory)));
    m.insert("runs_committed".into(), json!(n(&s.runs_committed)));
    m.insert("blocks_written".into(), json!(n(&s.blocks_written)));
    m.insert("forced_commits".into(), json!(n(&s.forced_commits)));
    m.insert("kept_hot".into(), json!(n(&s.kept_hot)));
    m.insert("read_hot".into(), json!(n(&s.read_hot)));
    m.insert(
        "image_runs_committed".into(),
        json!(n(&s.image_runs_committed)),
    );
    m.insert(
        "forced_wait_s".into(),
        json!(n(&s.forced_wait_ns) as f64 / 1e9),
    );
    m.insert("log_wait_s".into(), json!(n(&s.log_wait_ns) as f64 / 1e9));
    m.insert("heap_trims".into(), json!(n(&s.heap_trims)));
    m.insert("heap_trim_s".into(), json!(n(&s.heap_trim_ns) as f64 / 1e9));
    m.insert("filled_ahead_bytes".into(), json!(n(&s.filled_ahead_bytes)));
    m.insert(
        "sweep_rest_s".into(),
        json!(n(&s.sweep_rest_ns) as f64 / 1e9),
    );
    if let Some(l) = b.log_stats() {
        m.insert("log_records".into(), json!(n(&l.records)));
        m.insert("log_batches".into(), json!(n(&l.batches)));
        m.insert(
            "log_device_write_us_p50".into(),
            json!(l.device_write_us.quantile(0.5)),
        );
        // Power-of-two buckets: the means say more than the quantiles' bounds.
        for (name, h) in [
            ("log_device_write_us", &l.device_write_us),
            ("log_ack_us", &l.ack_latency_us),
        ] {
            let (_, sum, count) = h.snapshot();
            m.insert(format!("{name}_sum"), json!(sum));
            m.insert(format!("{name}_count"), json!(count));
            m.insert(format!("{name}_p99"), json!(h.quantile(0.99)));
        }
    }
    m.insert("pending_at_end".into(), json!(b.pending_modifications()));
    m.insert("queue_bytes_at_end".into(), json!(b.memory_bytes()));
    m.insert("queue_budget_bytes".into(), json!(b.memory_budget()));
    m
}

pub(super) fn open_notes(r: &OpenReport) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("engine_open_s".into(), json!(r.elapsed.as_secs_f64()));
    m.insert("log_open_s".into(), json!(r.log_open.as_secs_f64()));
    m.insert("requeue_s".into(), json!(r.requeue.as_secs_f64()));
    m.insert("records_scanned".into(), json!(r.records_scanned));
    m.insert("pending_requeued".into(), json!(r.records_requeued));
    m.insert("images_dropped".into(), json!(r.images_dropped));
    m
}

/// The B+tree on BOSC.
pub struct BoscBtree {
    files: BoscFiles,
    tree: Option<BPlusTree>,
    budget: usize,
    fill: usize,
    log_parts: usize,
}

impl BoscBtree {
    /// Leaves are bulk-loaded two-thirds full; the disk has room for every split the insert
    /// phase could cause (a leaf splits after at least a quarter of its capacity more).
    pub fn new(cfg: &Config, fresh: bool) -> Result<Self, BenchError> {
        let capacity = leaf_capacity((cfg.block_bytes as usize).saturating_sub(BLOCK_HEADER_LEN));
        if capacity < 8 {
            return Err(BenchError::Config(
                "blocks too small for B+tree leaves".into(),
            ));
        }
        let fill = capacity * 2 / 3;
        let leaves = cfg.preload_entries.div_ceil(fill as u64);
        let block_count = leaves + cfg.max_inserts() / (capacity as u64 / 4) + 1024;
        let budget = budget_usize(cfg);
        let files = if fresh {
            BoscFiles::create::<LeafApp>(cfg, block_count, budget)?
        } else {
            BoscFiles::existing(cfg, block_count, budget)
        };
        Ok(Self {
            files,
            tree: None,
            budget,
            fill,
            log_parts: cfg.log_parts,
        })
    }

    fn tree(&self) -> Result<&BPlusTree, BenchError> {
        self.tree
            .as_ref()
            .ok_or_else(|| BenchError::Config("the tree is not loaded".into()))
    }

    /// The queues get what the tree's own structures leave of the budget.
    fn rebudget(&self) -> Result<(), BenchError> {
        let t = self.tree()?;
        let queues = super::queue_budget(self.budget, t.router_bytes());
        t.bosc().set_memory_budget(queues);
        Ok(())
    }
}

impl Engine for BoscBtree {
    fn load(&mut self, w: &Workload) -> Result<(), BenchError> {
        let (bosc, _) = self.files.open(LeafApp)?;
        let tree = BPlusTree::bulk_load(bosc, None, self.fill, w.preloaded())?;
        // Opened once more with its router image file (untimed set-up: this open reads every
        // leaf, as there is no image yet, and writes the first), as history's index is: a
        // reopen then reads the router from the image instead of every leaf.
        drop(tree);
        let (bosc, _) = self.files.open(LeafApp)?;
        let tree = BPlusTree::open_with_router(bosc, None, self.files.router()?)?;
        tree.set_log_parts(self.log_parts);
        self.tree = Some(tree);
        self.rebudget()
    }

    fn write_batch(&mut self, batch: &[(Key, u64)]) -> Result<(), BenchError> {
        self.tree()?.insert_batch(batch)?;
        self.rebudget()
    }

    fn get(&mut self, key: Key) -> Result<Option<u64>, BenchError> {
        Ok(self.tree()?.get(key)?)
    }

    fn commit_queued(&mut self) -> Result<Option<u64>, BenchError> {
        let bosc = self.tree()?.bosc();
        let queued = bosc.pending_blocks();
        bosc.commit_all()?;
        Ok(Some(u64::try_from(queued).unwrap_or(u64::MAX)))
    }

    fn range(&mut self, from: Key, to: Key) -> Result<Option<Vec<(Key, u64)>>, BenchError> {
        Ok(Some(self.tree()?.range(from, to)?))
    }

    fn reopen(&mut self) -> Result<Reopened, BenchError> {
        let started = Instant::now();
        // Dropping stops the commit thread and the log; the queues stay in the log only.
        drop(self.tree.take());
        let (bosc, report) = self.files.open(LeafApp)?;
        let engine_peak = crate::report::peak_rss_bytes();
        let queue_bytes = bosc.memory_bytes();
        let scan = Instant::now();
        let tree = BPlusTree::open_with_router(bosc, None, self.files.router()?)?;
        tree.set_log_parts(self.log_parts);
        let mut notes = open_notes(&report);
        notes.insert("tree_scan_s".into(), json!(scan.elapsed().as_secs_f64()));
        let r = tree.router_open();
        notes.insert("router_from_image".into(), json!(r.from_image));
        notes.insert("router_blocks_scanned".into(), json!(r.blocks_scanned));
        if let Some(why) = &r.fallback {
            notes.insert("router_fallback".into(), json!(why));
        }
        self.tree = Some(tree);
        // Where a reopen's memory goes: the engine's recovery, then the scan of the leaves.
        notes.insert("peak_rss_after_engine_open".into(), json!(engine_peak));
        notes.insert("queue_bytes_after_engine_open".into(), json!(queue_bytes));
        let elapsed = started.elapsed();
        self.rebudget()?;
        Ok(Reopened { elapsed, notes })
    }

    fn notes(&self) -> Map<String, Value> {
        let Some(t) = self.tree.as_ref() else {
            return Map::new();
        };
        let mut m = engine_notes(t.bosc());
        let s = t.stats();
        let n = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        m.insert("leaves".into(), json!(t.leaf_count()));
        m.insert("router_bytes".into(), json!(t.router_bytes()));
        m.insert("splits_in_memory".into(), json!(n(&s.splits_in_memory)));
        m.insert("splits_hot".into(), json!(n(&s.splits_hot)));
        m.insert("leaves_read_ahead".into(), json!(n(&s.leaves_read_ahead)));
        m.insert("splits_with_read".into(), json!(n(&s.splits_with_read)));
        m.insert("counts_refreshed".into(), json!(n(&s.counts_refreshed)));
        m.insert("leaves_prefetched".into(), json!(n(&s.leaves_prefetched)));
        m.insert("prefetch_s".into(), json!(n(&s.prefetch_us) as f64 / 1e6));
        m
    }

    fn index_files(&self) -> Vec<PathBuf> {
        vec![self.files.data_path()]
    }
}
