//! Shared by the model-based crash tests: a seeded generator, the engine and log
//! configurations, and a data disk plus log disks on FaultyDisk that crash together, at one
//! instant, also while an engine runs on them.
#![allow(dead_code)]

use std::io;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use mariner_bosc::{BlockApp, Bosc, BoscConfig, Durability, OpenReport};
use mariner_disk::{CrashMode, Disk, Extent, Faults, FaultyDisk};
use mariner_log::{Log, LogConfig};

/// xorshift64: deterministic, good enough to pick operations.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// 512-byte blocks, no background thread (the tests drive commit cycles themselves).
pub fn engine_cfg(blocks: u64, budget: usize) -> BoscConfig {
    BoscConfig {
        block_bytes: 512,
        block_count: blocks,
        max_run: 32,
        min_pending_ratio: 0.5,
        memory_budget_bytes: budget,
        runs_per_cycle: 3,
        // Two runs per double-write batch: a cycle of three runs writes a full batch and a
        // partial one, so crashes land in both and in stale slots an earlier batch left.
        dw_runs: 2,
        shadow: false,
        background: None,
        sweep_above: 0.0,
        sweep_full_above: 0.0,
        image_share: 1.0,
        cpu_class: None,
        write_gap: None,
        // The faulty disks report no holes, so fills never write (the fill is tested on a
        // sparse file in the engine's unit tests).
        fill_ahead_bytes: 8 << 20,
    }
}

pub fn log_cfg() -> LogConfig {
    LogConfig {
        segment_bytes: 64 * 1024,
        t_wait_ns: 0,
        ..LogConfig::default()
    }
}

/// The data disk and the log disk(s), with their fault handles. Every device is reached
/// through one gate, so a crash of them all happens at a single instant even while an engine
/// keeps writing.
pub struct Disks {
    pub data: Faults,
    /// The first log device.
    pub log: Faults,
    pub data_disk: Arc<dyn Disk>,
    pub log_disk: Arc<dyn Disk>,
    /// Log devices after the first.
    more_logs: Vec<(Faults, Arc<dyn Disk>)>,
    gate: Arc<RwLock<()>>,
}

impl Disks {
    /// Fresh disks: the data disk formatted for `A`, the log disk (`log_bytes`) as log `log_id`.
    pub fn new<A: BlockApp>(seed: u64, c: &BoscConfig, log_bytes: usize, log_id: u128) -> Self {
        Self::with_logs::<A>(seed, c, log_bytes, log_id, 1)
    }

    /// Like [`Disks::new`] with `logs` log devices of `log_bytes` each, formatted as one log.
    pub fn with_logs<A: BlockApp>(
        seed: u64,
        c: &BoscConfig,
        log_bytes: usize,
        log_id: u128,
        logs: u64,
    ) -> Self {
        let data = FaultyDisk::new(0, seed);
        let logs = (0..logs)
            .map(|i| FaultyDisk::new(log_bytes, seed ^ (0x55 + i)))
            .collect();
        let d = Self::gated(data, logs);
        Bosc::<A>::format(d.data_disk.as_ref(), c).unwrap();
        Log::format(&d.log_devices(), &log_cfg(), log_id).unwrap();
        d
    }

    fn gated(data: FaultyDisk, logs: Vec<FaultyDisk>) -> Self {
        let gate = Arc::new(RwLock::new(()));
        let wrap = |d: FaultyDisk| -> (Faults, Arc<dyn Disk>) {
            let f = d.faults();
            let disk = Gated {
                inner: d,
                gate: Arc::clone(&gate),
            };
            (f, Arc::new(disk))
        };
        let (data, data_disk) = wrap(data);
        let mut logs = logs.into_iter().map(wrap);
        let (log, log_disk) = logs.next().expect("a log device");
        let more_logs = logs.collect();
        Self {
            data,
            log,
            data_disk,
            log_disk,
            more_logs,
            gate,
        }
    }

    /// Every log device, the first first.
    pub fn log_devices(&self) -> Vec<Arc<dyn Disk>> {
        std::iter::once(Arc::clone(&self.log_disk))
            .chain(self.more_logs.iter().map(|(_, d)| Arc::clone(d)))
            .collect()
    }

    /// Opens (recovers) an engine of `app` on the data disk, in own-log mode on `log` (the
    /// log disk, or a wrapper of it) formatted as `log_id`, logging as `volume`.
    pub fn open_own_log<A: BlockApp>(
        &self,
        log: Arc<dyn Disk>,
        c: &BoscConfig,
        app: A,
        log_id: u128,
        volume: u32,
    ) -> (Bosc<A>, OpenReport) {
        self.open_on(vec![log], c, app, log_id, volume)
            .expect("open")
    }

    /// Every disk crashes at once: unsynced writes are lost, reordered or torn.
    pub fn crash(self) -> Self {
        self.crash_counting().0
    }

    /// [`Disks::crash`], also returning how many log operations were not yet synced at the
    /// crash. An engine still running on the old disks stays blocked for the instant of the
    /// crash and sees failing devices afterwards: nothing it writes later reaches the new ones.
    pub fn crash_counting(self) -> (Self, usize) {
        self.crash_meeting_unsynced_log(Duration::ZERO)
    }

    /// [`Disks::crash_counting`] at an instant the log devices hold writes not yet synced, if
    /// one comes within `patience` (a log writes and syncs in a breath: a crash at a random
    /// instant would mostly find it settled).
    pub fn crash_meeting_unsynced_log(self, patience: Duration) -> (Self, usize) {
        self.crash_when(patience, |d| d.log_pending() > 0)
    }

    fn crash_when(self, patience: Duration, now: impl Fn(&Self) -> bool) -> (Self, usize) {
        let started = Instant::now();
        let _instant = loop {
            let g = self.gate.write().unwrap_or_else(PoisonError::into_inner);
            if now(&self) || started.elapsed() >= patience {
                break g;
            }
            drop(g);
            std::thread::yield_now();
        };
        let unsynced = self.log_pending();
        let logs = std::iter::once(&self.log).chain(self.more_logs.iter().map(|(f, _)| f));
        let crashed_logs = logs.map(|f| f.crash_with(CrashMode::Random)).collect();
        let data = self.data.crash_with(CrashMode::Random);
        (Self::gated(data, crashed_logs), unsynced)
    }

    /// Log operations not yet synced, on every log device.
    fn log_pending(&self) -> usize {
        self.log.pending()
            + self
                .more_logs
                .iter()
                .map(|(f, _)| f.pending())
                .sum::<usize>()
    }

    /// Opens (recovers) an engine of `app` in own-log mode on every log device.
    pub fn open_own_logs<A: BlockApp>(
        &self,
        c: &BoscConfig,
        app: A,
        log_id: u128,
        volume: u32,
    ) -> (Bosc<A>, OpenReport) {
        self.open_on(self.log_devices(), c, app, log_id, volume)
            .expect("open")
    }

    /// [`Self::open_own_logs`], its error returned.
    pub fn try_open_own_logs<A: BlockApp>(
        &self,
        c: &BoscConfig,
        app: A,
        log_id: u128,
        volume: u32,
    ) -> Result<(Bosc<A>, OpenReport), mariner_bosc::Error> {
        self.open_on(self.log_devices(), c, app, log_id, volume)
    }

    /// Opens (recovers) an engine of `app` on the data disk, in own-log mode on `devices`.
    fn open_on<A: BlockApp>(
        &self,
        devices: Vec<Arc<dyn Disk>>,
        c: &BoscConfig,
        app: A,
        log_id: u128,
        volume: u32,
    ) -> Result<(Bosc<A>, OpenReport), mariner_bosc::Error> {
        let durability = Durability::OwnLog {
            devices,
            log: log_cfg(),
            log_id,
            volume,
        };
        Bosc::open(
            Arc::clone(&self.data_disk),
            c.clone(),
            durability,
            Arc::new(app),
        )
    }
}

/// A device reached through the crash gate: each operation holds it shared, a crash holds it
/// exclusively.
#[derive(Debug)]
struct Gated {
    inner: FaultyDisk,
    gate: Arc<RwLock<()>>,
}

impl Gated {
    fn pass<T>(&self, op: impl FnOnce(&FaultyDisk) -> io::Result<T>) -> io::Result<T> {
        let _shared = self.gate.read().unwrap_or_else(PoisonError::into_inner);
        op(&self.inner)
    }
}

impl Disk for Gated {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.pass(|d| d.read_at(buf, offset))
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.pass(|d| d.write_at(buf, offset))
    }
    fn sync(&self) -> io::Result<()> {
        self.pass(|d| d.sync())
    }
    fn len(&self) -> io::Result<u64> {
        self.pass(|d| d.len())
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.pass(|d| d.set_len(len))
    }
    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        self.pass(|d| d.punch_hole(offset, len))
    }
    fn allocation(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
        self.pass(|d| d.allocation(offset, len))
    }
    fn alignment(&self) -> usize {
        self.inner.alignment()
    }
}
