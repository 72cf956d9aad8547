//! Shared by the model-based crash tests: a seeded generator, the engine and log
//! configurations, and a data disk plus log disk on FaultyDisk that crash together.
#![allow(dead_code)]

use std::sync::Arc;

use mariner_bosc::{BlockApp, Bosc, BoscConfig, Durability, OpenReport};
use mariner_disk::{CrashMode, Disk, Faults, FaultyDisk};
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
        background: None,
    }
}

pub fn log_cfg() -> LogConfig {
    LogConfig {
        segment_bytes: 64 * 1024,
        t_wait_ns: 0,
        ..LogConfig::default()
    }
}

/// The data disk and the log disk, with their fault handles.
pub struct Disks {
    pub data: Faults,
    pub log: Faults,
    pub data_disk: Arc<dyn Disk>,
    pub log_disk: Arc<dyn Disk>,
}

impl Disks {
    /// Fresh disks: the data disk formatted for `A`, the log disk (`log_bytes`) as log `log_id`.
    pub fn new<A: BlockApp>(seed: u64, c: &BoscConfig, log_bytes: usize, log_id: u128) -> Self {
        let data = FaultyDisk::new(0, seed);
        let log = FaultyDisk::new(log_bytes, seed ^ 0x55);
        let d = Self {
            data: data.faults(),
            log: log.faults(),
            data_disk: Arc::new(data),
            log_disk: Arc::new(log),
        };
        Bosc::<A>::format(d.data_disk.as_ref(), c).unwrap();
        Log::format(&[Arc::clone(&d.log_disk)], &log_cfg(), log_id).unwrap();
        d
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
        let durability = Durability::OwnLog {
            devices: vec![log],
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
        .expect("open")
    }

    /// Both disks crash at once: unsynced writes are lost, reordered or torn.
    pub fn crash(self) -> Self {
        let data = self.data.crash_with(CrashMode::Random);
        let log = self.log.crash_with(CrashMode::Random);
        Self {
            data: data.faults(),
            log: log.faults(),
            data_disk: Arc::new(data),
            log_disk: Arc::new(log),
        }
    }
}
