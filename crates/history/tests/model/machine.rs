//! The machine the model test runs on: the log device and history's files on fault-injecting
//! disks that survive a simulated crash, every write of history's files through a shared
//! budget that fails them once spent.

use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mariner_disk::{Disk, FaultyDisk};
use mariner_history::files::{Files, MemFiles};
use mariner_history::{HistoryConfig, IndexConfig};
use mariner_log::{Log, LogConfig};

use super::{LOG_ID, LOG_SEGMENTS, SEGMENT};

pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Fails every write and sync once the shared budget runs out: the machine going down in
/// the middle of whatever history was doing.
#[derive(Debug)]
struct Gated {
    inner: Arc<FaultyDisk>,
    budget: Arc<AtomicI64>,
}

impl Gated {
    fn spend(&self) -> io::Result<()> {
        if self.budget.fetch_sub(1, Relaxed) <= 0 {
            return Err(io::Error::other("injected: the machine is going down"));
        }
        Ok(())
    }
}

impl Disk for Gated {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.spend()?;
        self.inner.write_at(buf, offset)
    }
    fn sync(&self) -> io::Result<()> {
        self.spend()?;
        self.inner.sync()
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.spend()?;
        self.inner.set_len(len)
    }
    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        self.spend()?;
        self.inner.punch_hole(offset, len)
    }
}

pub type Registry = Arc<Mutex<BTreeMap<String, Arc<FaultyDisk>>>>;

/// What outlives a crash: the log device and history's files.
pub struct Machine {
    pub log_dev: Arc<FaultyDisk>,
    pub files: Registry,
    pub budget: Arc<AtomicI64>,
    next_seed: Arc<AtomicU64>,
    /// The file set history has open, to see which files it removed.
    live: Mutex<Option<Arc<MemFiles>>>,
}

impl Machine {
    pub fn new(seed: u64) -> Self {
        let log_dev = Arc::new(FaultyDisk::new(
            (LOG_SEGMENTS * SEGMENT + (1 << 16)) as usize,
            seed,
        ));
        Log::format(&[log_dev.clone() as Arc<dyn Disk>], &log_cfg(), LOG_ID).unwrap();
        Self {
            log_dev,
            files: Arc::default(),
            budget: Arc::new(AtomicI64::new(i64::MAX)),
            next_seed: Arc::new(AtomicU64::new(seed.wrapping_mul(31))),
            live: Mutex::new(None),
        }
    }

    /// History's files as the engine sees them, every write through the shared budget.
    pub fn mem_files(&self) -> Arc<dyn Files> {
        let gate = |d: &Arc<FaultyDisk>, budget: &Arc<AtomicI64>| -> Arc<dyn Disk> {
            Arc::new(Gated {
                inner: Arc::clone(d),
                budget: Arc::clone(budget),
            })
        };
        let existing: BTreeMap<String, Arc<dyn Disk>> = self
            .files
            .lock()
            .unwrap()
            .iter()
            .map(|(n, d)| (n.clone(), gate(d, &self.budget)))
            .collect();
        let (reg, budget, seeds) = (
            Arc::clone(&self.files),
            Arc::clone(&self.budget),
            Arc::clone(&self.next_seed),
        );
        let make = move |name: &str| {
            let d = Arc::new(FaultyDisk::new(0, seeds.fetch_add(1, Relaxed)));
            reg.lock().unwrap().insert(name.to_string(), Arc::clone(&d));
            gate(&d, &budget)
        };
        let files = Arc::new(MemFiles::new(existing, make));
        *self.live.lock().unwrap() = Some(Arc::clone(&files));
        files
    }

    /// Every disk loses, keeps or tears what it had not synced.
    pub fn crash(&mut self) {
        self.log_dev = Arc::new(self.log_dev.crash());
        // Files history removed stay removed (a removal is durable when it returns).
        let present: Option<Vec<String>> = self
            .live
            .lock()
            .unwrap()
            .as_ref()
            .map(|f| f.disks().into_keys().collect());
        let mut reg = self.files.lock().unwrap();
        let crashed: BTreeMap<String, Arc<FaultyDisk>> = reg
            .iter()
            .filter(|(n, _)| present.as_ref().is_none_or(|p| p.contains(n)))
            .map(|(n, d)| (n.clone(), Arc::new(d.crash())))
            .collect();
        *reg = crashed;
        self.budget.store(i64::MAX, Relaxed);
    }
}

pub fn log_cfg() -> LogConfig {
    LogConfig {
        segment_bytes: SEGMENT,
        t_wait_ns: 0,
        ..LogConfig::default()
    }
}

pub fn history_cfg(window: Duration) -> HistoryConfig {
    HistoryConfig {
        window,
        min_window: Duration::ZERO,
        index: IndexConfig {
            block_count: 512,
            block_bytes: 4096,
            memory_budget_bytes: 2 << 20,
            log_bytes: 4 << 20,
            log_segment_bytes: 64 << 10,
            background: Some(Duration::from_millis(2)),
            cpu_class: None,
            write_gap: None,
        },
        batch_records: 16,
        state_interval: Duration::ZERO,
        background: false,
        rollback_save_bytes: 8 << 10,
        // Roll-forwards and prunes of several rounds (a seed jumps the base over a burst).
        round_records: 24,
        // Roll-forward rounds cut short by the ranges they write.
        round_pieces: 16,
        ..HistoryConfig::default()
    }
}
