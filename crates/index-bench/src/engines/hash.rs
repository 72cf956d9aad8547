//! The hash table on BOSC and the same table over plain read/write (mariner-bosc `hash`).
//!
//! Keys are [`pack`]ed into u64 (the seed's 16-byte records). Both tables get the same page
//! size and enough pages for the preload plus every insert the insert phase may do at 75%
//! load. No range queries.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use mariner_bosc::btree::Key;
use mariner_bosc::format::BLOCK_HEADER_LEN;
use mariner_bosc::hash::{page_capacity, BoscHash, HashApp, PlainHash};
use mariner_disk::{Disk, FileDisk, OpenOptions};
use serde_json::{json, Map, Value};

use super::bosc::{engine_notes, open_notes, BoscFiles};
use super::{budget_usize, remove_old, Engine, Reopened};
use crate::workload::{pack, Workload};
use crate::{BenchError, Config};

/// Pages for the preload plus every insert at 75% load.
fn pages(cfg: &Config, payload_bytes: usize) -> Result<u64, BenchError> {
    let per_page = (page_capacity(payload_bytes) * 3 / 4) as u64;
    if per_page == 0 {
        return Err(BenchError::Config(
            "pages too small for the hash table".into(),
        ));
    }
    Ok((cfg.preload_entries + cfg.max_inserts()).div_ceil(per_page))
}

/// Pages laid out per pass of the bulk load: a quarter of the budget.
fn chunk_pages(cfg: &Config) -> u64 {
    (cfg.budget_bytes / 4 / u64::from(cfg.block_bytes)).max(64)
}

fn packed(batch: &[(Key, u64)]) -> Vec<(u64, u64)> {
    batch.iter().map(|&(k, v)| (pack(k), v)).collect()
}

/// The hash table on BOSC.
pub struct BoscHashEngine {
    files: BoscFiles,
    table: Option<BoscHash>,
    budget: usize,
    chunk_pages: u64,
}

impl BoscHashEngine {
    pub fn new(cfg: &Config, fresh: bool) -> Result<Self, BenchError> {
        let payload = (cfg.block_bytes as usize).saturating_sub(BLOCK_HEADER_LEN);
        let budget = budget_usize(cfg);
        let pages = pages(cfg, payload)?;
        let files = if fresh {
            BoscFiles::create::<HashApp>(cfg, pages, budget)?
        } else {
            BoscFiles::existing(cfg, pages, budget)
        };
        Ok(Self {
            files,
            table: None,
            budget,
            chunk_pages: chunk_pages(cfg),
        })
    }

    fn table(&self) -> Result<&BoscHash, BenchError> {
        self.table
            .as_ref()
            .ok_or_else(|| BenchError::Config("the table is not loaded".into()))
    }

    /// The queues get what the page counts leave of the budget.
    fn rebudget(&self) -> Result<(), BenchError> {
        let t = self.table()?;
        let queues = super::queue_budget(self.budget, t.counts_bytes());
        t.bosc().set_memory_budget(queues);
        Ok(())
    }
}

impl Engine for BoscHashEngine {
    fn load(&mut self, w: &Workload) -> Result<(), BenchError> {
        let (bosc, _) = self.files.open(HashApp)?;
        let records = || w.preloaded().map(|(k, v)| (pack(k), v));
        self.table = Some(BoscHash::bulk_load(bosc, self.chunk_pages, records)?);
        self.rebudget()
    }

    fn write_batch(&mut self, batch: &[(Key, u64)]) -> Result<(), BenchError> {
        Ok(self.table()?.put_batch(&packed(batch))?)
    }

    fn get(&mut self, key: Key) -> Result<Option<u64>, BenchError> {
        Ok(self.table()?.get(pack(key))?)
    }

    fn commit_queued(&mut self) -> Result<Option<u64>, BenchError> {
        let bosc = self.table()?.bosc();
        let queued = bosc.pending_blocks();
        bosc.commit_all()?;
        Ok(Some(u64::try_from(queued).unwrap_or(u64::MAX)))
    }

    fn reopen(&mut self) -> Result<Reopened, BenchError> {
        let started = Instant::now();
        drop(self.table.take());
        let (bosc, report) = self.files.open(HashApp)?;
        let scan = Instant::now();
        self.table = Some(BoscHash::open(bosc)?);
        let mut notes = open_notes(&report);
        notes.insert("count_scan_s".into(), json!(scan.elapsed().as_secs_f64()));
        let elapsed = started.elapsed();
        self.rebudget()?;
        Ok(Reopened { elapsed, notes })
    }

    fn notes(&self) -> Map<String, Value> {
        let Some(t) = self.table.as_ref() else {
            return Map::new();
        };
        let mut m = engine_notes(t.bosc());
        let s = t.stats();
        let n = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        m.insert("pages".into(), json!(t.bosc().block_count()));
        m.insert("blind_puts".into(), json!(n(&s.blind_puts)));
        m.insert("probed_puts".into(), json!(n(&s.probed_puts)));
        m
    }

    fn index_files(&self) -> Vec<PathBuf> {
        vec![self.files.data_path()]
    }
}

/// The same table over plain read/write: a FIFO page cache of budget / page size pages,
/// write-through, one fdatasync per batch.
pub struct PlainHashEngine {
    path: PathBuf,
    page_bytes: usize,
    pages: u64,
    cache_pages: usize,
    chunk_pages: u64,
    table: Option<PlainHash>,
}

impl PlainHashEngine {
    pub fn new(cfg: &Config, fresh: bool) -> Result<Self, BenchError> {
        let path = cfg.dir.join("plain-hash.data");
        if fresh {
            remove_old(&path)?;
        }
        let page_bytes = cfg.block_bytes as usize;
        Ok(Self {
            path,
            page_bytes,
            pages: pages(cfg, page_bytes)?,
            cache_pages: (budget_usize(cfg) / page_bytes).max(1),
            chunk_pages: chunk_pages(cfg),
            table: None,
        })
    }

    fn disk(&self) -> Result<Arc<dyn Disk>, BenchError> {
        Ok(Arc::new(FileDisk::open(
            &self.path,
            &OpenOptions::new().create(true).random(true),
        )?))
    }

    fn table(&self) -> Result<&PlainHash, BenchError> {
        self.table
            .as_ref()
            .ok_or_else(|| BenchError::Config("the table is not loaded".into()))
    }
}

impl Engine for PlainHashEngine {
    fn load(&mut self, w: &Workload) -> Result<(), BenchError> {
        let records = || w.preloaded().map(|(k, v)| (pack(k), v));
        self.table = Some(PlainHash::bulk_load(
            self.disk()?,
            self.page_bytes,
            self.pages,
            self.cache_pages,
            u64::MAX,
            self.chunk_pages,
            records,
        )?);
        Ok(())
    }

    fn write_batch(&mut self, batch: &[(Key, u64)]) -> Result<(), BenchError> {
        let t = self.table()?;
        for &(k, v) in batch {
            t.put(pack(k), v)?;
        }
        Ok(t.sync()?)
    }

    fn get(&mut self, key: Key) -> Result<Option<u64>, BenchError> {
        Ok(self.table()?.get(pack(key))?)
    }

    fn reopen(&mut self) -> Result<Reopened, BenchError> {
        let started = Instant::now();
        drop(self.table.take());
        let t = PlainHash::open(
            self.disk()?,
            self.page_bytes,
            self.pages,
            self.cache_pages,
            u64::MAX,
        )?;
        self.table = Some(t);
        Ok(Reopened {
            elapsed: started.elapsed(),
            notes: Map::new(),
        })
    }

    fn notes(&self) -> Map<String, Value> {
        let mut m = Map::new();
        if let Some(t) = self.table.as_ref() {
            let (reads, writes) = t.io_counts();
            m.insert("pages".into(), json!(self.pages));
            m.insert("cache_pages".into(), json!(self.cache_pages));
            m.insert("page_reads".into(), json!(reads));
            m.insert("page_writes".into(), json!(writes));
        }
        m
    }

    fn index_files(&self) -> Vec<PathBuf> {
        vec![self.path.clone()]
    }
}
