//! Helpers the log's test files share: a log on memory devices with one must-hold holder.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use mariner_disk::Disk;
use mariner_log::{Durable, DurableSink, Entry, HolderSpec, Log, LogConfig, LogError, Recovery};

pub const LOG_ID: u128 = 0x5eed;

/// The one holder of log space these tests open the log with.
pub const CONSUMER: &str = "consumer";

pub fn consumer(after: u64) -> [HolderSpec; 1] {
    [HolderSpec::must_hold(CONSUMER, after, 0)]
}
pub const SEG: u64 = 64 * 1024;

#[derive(Default)]
pub struct Collect(pub Mutex<Vec<Durable>>);

impl DurableSink for Collect {
    fn durable(&self, records: &[Durable]) {
        if let Ok(mut v) = self.0.lock() {
            v.extend_from_slice(records);
        }
    }
}

pub fn cfg() -> LogConfig {
    LogConfig {
        segment_bytes: SEG,
        t_wait_ns: 20_000,
        ..LogConfig::default()
    }
}

pub fn payload(seq_hint: u64, len: usize) -> Bytes {
    Bytes::from(
        (0..len)
            .map(|i| (seq_hint as usize * 31 + i) as u8)
            .collect::<Vec<_>>(),
    )
}

pub fn open(devs: &[Arc<dyn Disk>], after: u64) -> Result<(Log, Recovery), LogError> {
    open_with(devs, after, cfg())
}

pub fn open_with(
    devs: &[Arc<dyn Disk>],
    after: u64,
    cfg: LogConfig,
) -> Result<(Log, Recovery), LogError> {
    Log::open(
        devs.to_vec(),
        cfg,
        LOG_ID,
        &consumer(after),
        Arc::new(Collect::default()),
    )
}

pub fn append_sync(log: &Log, e: Entry) -> Result<mariner_log::Appended, LogError> {
    log.append(e)?
        .blocking_recv()
        .map_err(|_| LogError::Shutdown)?
}
