//! The peers: redb (a conventional copy-on-write B-tree) and fjall (an LSM tree). Keys are
//! the 20 big-endian bytes of [`key_bytes`] (byte order = key order), values 8 bytes.

use std::path::PathBuf;
use std::time::Instant;

use fjall::config::{PartitioningPolicy, PinningPolicy};
use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode};
use mariner_bosc::btree::Key;
use redb::{Durability, ReadableDatabase, TableDefinition};
use serde_json::{json, Map, Value};

use super::{budget_usize, remove_old, Engine, Reopened};
use crate::workload::{key_bytes, key_from_bytes, Workload};
use crate::{BenchError, Config};

const TABLE: TableDefinition<'static, [u8; 20], u64> = TableDefinition::new("index");
/// Records per write transaction of redb's bulk load.
const REDB_LOAD_TXN: u64 = 200_000;

fn redb_err(e: impl Into<redb::Error>) -> BenchError {
    BenchError::Redb(e.into())
}

/// redb with its cache set to the budget; a write transaction per batch, committed with
/// `Durability::Immediate` (fdatasync). The bulk load inserts in key order, 200,000 records
/// per transaction (redb has no bulk-load path).
pub struct RedbEngine {
    path: PathBuf,
    cache_bytes: usize,
    db: Option<redb::Database>,
}

impl RedbEngine {
    pub fn new(cfg: &Config, fresh: bool) -> Result<Self, BenchError> {
        let path = cfg.dir.join("redb.db");
        if fresh {
            remove_old(&path)?;
        }
        Ok(Self {
            path,
            cache_bytes: budget_usize(cfg),
            db: None,
        })
    }

    fn open(&mut self) -> Result<(), BenchError> {
        let db = redb::Builder::new()
            .set_cache_size(self.cache_bytes)
            .create(&self.path)
            .map_err(redb_err)?;
        self.db = Some(db);
        Ok(())
    }

    fn db(&self) -> Result<&redb::Database, BenchError> {
        self.db
            .as_ref()
            .ok_or_else(|| BenchError::Config("redb is not open".into()))
    }

    fn write(&self, records: impl Iterator<Item = (Key, u64)>) -> Result<(), BenchError> {
        let mut tx = self.db()?.begin_write().map_err(redb_err)?;
        tx.set_durability(Durability::Immediate)
            .map_err(|e| BenchError::Config(format!("redb durability: {e}")))?;
        {
            let mut t = tx.open_table(TABLE).map_err(redb_err)?;
            for (k, v) in records {
                t.insert(key_bytes(k), v).map_err(redb_err)?;
            }
        }
        tx.commit().map_err(redb_err)
    }
}

impl Engine for RedbEngine {
    fn load(&mut self, w: &Workload) -> Result<(), BenchError> {
        self.open()?;
        let mut first = 0;
        while first < w.preload {
            let end = (first + REDB_LOAD_TXN).min(w.preload);
            self.write((first..end).map(|i| (w.preload_key(i), Workload::preload_value(i))))?;
            first = end;
        }
        Ok(())
    }

    fn write_batch(&mut self, batch: &[(Key, u64)]) -> Result<(), BenchError> {
        self.write(batch.iter().copied())
    }

    fn get(&mut self, key: Key) -> Result<Option<u64>, BenchError> {
        let tx = self.db()?.begin_read().map_err(redb_err)?;
        let t = tx.open_table(TABLE).map_err(redb_err)?;
        let got = t.get(key_bytes(key)).map_err(redb_err)?;
        Ok(got.map(|g| g.value()))
    }

    fn range(&mut self, from: Key, to: Key) -> Result<Option<Vec<(Key, u64)>>, BenchError> {
        let tx = self.db()?.begin_read().map_err(redb_err)?;
        let t = tx.open_table(TABLE).map_err(redb_err)?;
        let mut out = Vec::new();
        for item in t.range(key_bytes(from)..key_bytes(to)).map_err(redb_err)? {
            let (k, v) = item.map_err(redb_err)?;
            out.push((key_from_bytes(&k.value())?, v.value()));
        }
        Ok(Some(out))
    }

    fn reopen(&mut self) -> Result<Reopened, BenchError> {
        let started = Instant::now();
        drop(self.db.take());
        self.open()?;
        Ok(Reopened {
            elapsed: started.elapsed(),
            notes: Map::new(),
        })
    }

    fn notes(&self) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("cache_bytes".into(), json!(self.cache_bytes));
        m
    }

    fn index_files(&self) -> Vec<PathBuf> {
        vec![self.path.clone()]
    }
}

/// fjall: block cache a quarter of the budget, write buffers (memtables) another quarter, one
/// memtable at most an eighth (one is written out while the next fills), filter and index
/// blocks unpinned and partitioned so they live in the cache. The other half of the budget is
/// what fjall uses beyond these knobs (flush and compaction buffers, table metadata, the
/// top-level index partitions): with cache and write buffers at half the budget each, its
/// anonymous memory reached 63–65 MB and the 64 MiB cgroup (32 MiB budget) killed it.
/// `insert` per operation and `persist(SyncData)` (fdatasync of the journal) per batch. The
/// bulk load is fjall's sorted ingestion, which writes tables directly.
pub struct FjallEngine {
    path: PathBuf,
    budget: u64,
    db: Option<(Database, Keyspace)>,
}

impl FjallEngine {
    pub fn new(cfg: &Config, fresh: bool) -> Result<Self, BenchError> {
        let path = cfg.dir.join("fjall");
        if fresh {
            remove_old(&path)?;
        }
        Ok(Self {
            path,
            budget: cfg.budget_bytes,
            db: None,
        })
    }

    #[allow(deprecated)] // max_write_buffer_size is fjall's only bound on all memtables
    fn open(&mut self) -> Result<(), BenchError> {
        let db = Database::builder(&self.path)
            .cache_size(self.budget / 4)
            .max_write_buffer_size(Some((self.budget / 4).max(1 << 20)))
            .open()?;
        let memtable = (self.budget / 8).max(1 << 20);
        // fjall pins L0 filters and L0/L1 indexes in memory outside its cache by default; a
        // bulk load's single large table then pins ~30 MB of filter alone. Unpinned and
        // partitioned, they are read through the block cache, inside the budget.
        let ks = db.keyspace("index", || {
            KeyspaceCreateOptions::default()
                .max_memtable_size(memtable)
                .filter_block_pinning_policy(PinningPolicy::disabled())
                .index_block_pinning_policy(PinningPolicy::disabled())
                .filter_block_partitioning_policy(PartitioningPolicy::all(true))
                .index_block_partitioning_policy(PartitioningPolicy::all(true))
        })?;
        self.db = Some((db, ks));
        Ok(())
    }

    fn ks(&self) -> Result<&Keyspace, BenchError> {
        self.db
            .as_ref()
            .map(|(_, ks)| ks)
            .ok_or_else(|| BenchError::Config("fjall is not open".into()))
    }

    fn persist(&self) -> Result<(), BenchError> {
        let (db, _) = self
            .db
            .as_ref()
            .ok_or_else(|| BenchError::Config("fjall is not open".into()))?;
        Ok(db.persist(PersistMode::SyncData)?)
    }
}

fn value_of(bytes: &[u8]) -> Result<u64, BenchError> {
    let arr: [u8; 8] = bytes
        .try_into()
        .map_err(|_| BenchError::Check(format!("a stored value has {} bytes", bytes.len())))?;
    Ok(u64::from_le_bytes(arr))
}

impl Engine for FjallEngine {
    fn load(&mut self, w: &Workload) -> Result<(), BenchError> {
        self.open()?;
        let ks = self.ks()?;
        let mut ingest = ks.start_ingestion()?;
        for (k, v) in w.preloaded() {
            ingest.write(&key_bytes(k)[..], &v.to_le_bytes()[..])?;
        }
        ingest.finish()?;
        self.persist()
    }

    fn write_batch(&mut self, batch: &[(Key, u64)]) -> Result<(), BenchError> {
        let ks = self.ks()?;
        for &(k, v) in batch {
            ks.insert(&key_bytes(k)[..], &v.to_le_bytes()[..])?;
        }
        self.persist()
    }

    fn get(&mut self, key: Key) -> Result<Option<u64>, BenchError> {
        self.ks()?
            .get(key_bytes(key))?
            .map(|v| value_of(&v))
            .transpose()
    }

    fn range(&mut self, from: Key, to: Key) -> Result<Option<Vec<(Key, u64)>>, BenchError> {
        let mut out = Vec::new();
        for guard in self.ks()?.range(key_bytes(from)..key_bytes(to)) {
            let (k, v) = guard.into_inner()?;
            out.push((key_from_bytes(&k)?, value_of(&v)?));
        }
        Ok(Some(out))
    }

    fn reopen(&mut self) -> Result<Reopened, BenchError> {
        let started = Instant::now();
        drop(self.db.take());
        self.open()?;
        Ok(Reopened {
            elapsed: started.elapsed(),
            notes: Map::new(),
        })
    }

    fn notes(&self) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("cache_bytes".into(), json!(self.budget / 4));
        m.insert("write_buffer_bytes".into(), json!(self.budget / 4));
        m.insert("memtable_bytes".into(), json!(self.budget / 8));
        if let Ok(ks) = self.ks() {
            m.insert("disk_space".into(), json!(ks.disk_space()));
        }
        m
    }

    fn index_files(&self) -> Vec<PathBuf> {
        vec![self.path.clone()]
    }
}
