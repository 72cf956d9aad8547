//! What one seed runs on, drawn from the seed.

use mariner_log::LogConfig;
use rand::rngs::SmallRng;
use rand::Rng;

/// What one seed runs on: drawn from the seed, so that the seeds between them cover one and
/// two devices, depths 1 to 4, tiny logs that fill at once and larger ones, prompt and
/// deferred write-back, payloads kept in memory and read back from the log.
#[derive(Debug, Clone)]
pub struct Setup {
    pub devices: usize,
    pub log: LogConfig,
    pub segments: u64,
    pub volumes: Vec<u64>,
    pub store: StoreParams,
    /// Largest record, in sectors.
    pub max_sectors: u64,
}

#[derive(Debug, Clone, Copy)]
pub struct StoreParams {
    pub sync_interval_ms: u64,
    pub sync_bytes: u64,
    pub payload_budget_bytes: u64,
    pub apply_idle_ms: u64,
    pub apply_max_delay_ms: u64,
}

impl Setup {
    pub fn draw(rng: &mut SmallRng) -> Self {
        // The smallest segments the log takes, and few of them: the log fills up and writers
        // wait for the store to release space.
        // (Small disks also keep a seed cheap: copying the images at each crash is most of
        // its cost.)
        let segment_bytes = 64u64 << 10;
        let segments = rng.random_range(3..=6);
        let log = LogConfig {
            segment_bytes,
            align_bytes: 512,
            t_wait_ns: [0, 10_000, 50_000, 200_000][rng.random_range(0..4)],
            t_switch: f64::INFINITY,
            dispatch_on_idle: rng.random_bool(0.7),
            // The fault-injecting disk makes a write durable only on sync: write + fdatasync.
            sync_each_write: true,
            device_depth: rng.random_range(1..=4),
            ..LogConfig::default()
        };
        let volumes = (0..rng.random_range(1..=2))
            .map(|_| [64u64 << 10, 128 << 10][rng.random_range(0..2)])
            .collect();
        let store = StoreParams {
            sync_interval_ms: rng.random_range(1..=20),
            sync_bytes: [4u64 << 10, 16 << 10, 64 << 10][rng.random_range(0..3)],
            payload_budget_bytes: [0u64, 8 << 10, 64 << 10][rng.random_range(0..3)],
            apply_idle_ms: rng.random_range(0..=5),
            apply_max_delay_ms: rng.random_range(5..=50),
        };
        Self {
            devices: rng.random_range(1..=2),
            log,
            segments,
            volumes,
            store,
            max_sectors: 16,
        }
    }
}
