#![allow(dead_code)]
//! A log and history on memory disks with an injected clock, and an oracle of one volume's
//! bytes after each write: shared by the pins and rollback tests.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use mariner_disk::{Disk, MemDisk};
use mariner_history::files::{Files, MemFiles};
use mariner_history::{History, HistoryConfig, HistoryError, IndexConfig, RollbackWrite};
use mariner_log::clock::VirtualClock;
use mariner_log::{Entry, Log, LogConfig, RecordKind};

pub const LOG_ID: u128 = 0x917_5000;
pub const VOL: u32 = 3;
pub const SIZE: u64 = 1 << 20;
pub const SEGMENT: u64 = 64 << 10;
pub const HOUR: u64 = 3600 * 1_000_000_000;

pub fn cfg(window: Duration) -> HistoryConfig {
    HistoryConfig {
        window,
        min_window: Duration::ZERO,
        index: IndexConfig {
            block_count: 4096,
            block_bytes: 4096,
            memory_budget_bytes: 4 << 20,
            log_bytes: 8 << 20,
            log_segment_bytes: 256 << 10,
            background: None,
            cpu_class: None,
            write_gap: None,
        },
        batch_records: 64,
        background: false,
        state_interval: Duration::ZERO,
        rollback_save_bytes: 64 << 10,
        ..HistoryConfig::default()
    }
}

pub fn log_cfg() -> LogConfig {
    LogConfig {
        segment_bytes: SEGMENT,
        t_wait_ns: 0,
        ..LogConfig::default()
    }
}

pub struct Rig {
    pub dev: Arc<dyn Disk>,
    pub files: Arc<MemFiles>,
    pub clock: Arc<VirtualClock>,
    /// vseq → the volume's bytes after it.
    pub after: BTreeMap<u64, Vec<u8>>,
    pub image: Vec<u8>,
}

impl Rig {
    pub fn new(log_bytes: u64) -> Self {
        let dev: Arc<dyn Disk> = Arc::new(MemDisk::new(log_bytes as usize));
        Log::format(std::slice::from_ref(&dev), &log_cfg(), LOG_ID).unwrap();
        let files = MemFiles::new(BTreeMap::new(), |_| {
            Arc::new(MemDisk::new(0)) as Arc<dyn Disk>
        });
        Self {
            dev,
            files: Arc::new(files),
            clock: Arc::new(VirtualClock::new(1_800_000_000_000_000_000)),
            after: BTreeMap::new(),
            image: vec![0; SIZE as usize],
        }
    }

    /// History opened, `before_start` run on it, then started.
    pub fn open(&self, window: Duration, before_start: impl FnOnce(&History)) -> (Log, History) {
        let files: Arc<dyn Files> = self.files.clone();
        let h = History::open_with_clock(files, cfg(window), self.clock.clone()).unwrap();
        before_start(&h);
        let (log, rec) = Log::open_with_clock(
            vec![self.dev.clone()],
            log_cfg(),
            LOG_ID,
            &[h.holder_spec()],
            h.sink(),
            self.clock.clone(),
        )
        .unwrap();
        h.start(log.clone(), &rec).unwrap();
        (log, h)
    }

    pub fn create(&mut self, log: &Log) {
        self.create_blocks(log, 512);
    }

    pub fn create_blocks(&mut self, log: &Log, block: u32) {
        let a = append(
            log,
            Entry::extent(RecordKind::VolumeCreated, VOL, SIZE, block),
        );
        self.after.insert(a.volume_seq, self.image.clone());
    }

    /// `n` writes of `bytes` each, filled with their number; returns the last one's vseq.
    pub fn write(&mut self, log: &Log, n: u64, bytes: u64) -> u64 {
        for i in 0..n {
            let off = (i * 4096 * 3) % (SIZE - bytes);
            let fill = (self.after.len() % 250) as u8 + 1;
            let range = off as usize..(off + bytes) as usize;
            self.image[range].fill(fill);
            let data = Bytes::from(vec![fill; bytes as usize]);
            let a = append(log, Entry::write(VOL, off, data));
            self.after.insert(a.volume_seq, self.image.clone());
        }
        *self.after.keys().last().unwrap()
    }

    /// `n` writes, trims and write-zeroes of random sectors; returns the last one's vseq.
    pub fn write_mixed(&mut self, log: &Log, seed: u64, n: u64) -> u64 {
        let mut x = seed | 1;
        for _ in 0..n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let sectors = SIZE / 512;
            let start = x % sectors;
            let len = (1 + (x >> 12) % 40).min(sectors - start);
            let (off, bytes) = (start * 512, len * 512);
            let range = off as usize..(off + bytes) as usize;
            let a = if (x >> 20).is_multiple_of(5) {
                self.image[range].fill(0);
                append(log, Entry::extent(RecordKind::Trim, VOL, off, bytes as u32))
            } else {
                let data: Vec<u8> = (0..bytes).map(|i| (x >> 24) as u8 ^ i as u8 | 1).collect();
                self.image[range].copy_from_slice(&data);
                append(log, Entry::write(VOL, off, Bytes::from(data)))
            };
            self.after.insert(a.volume_seq, self.image.clone());
        }
        *self.after.keys().last().unwrap()
    }

    /// What the node's rollback write function does: one log record, durable on return.
    pub fn apply(&mut self, log: &Log, w: RollbackWrite<'_>) {
        let a = match w {
            RollbackWrite::Data { offset, data } => {
                self.image[offset as usize..offset as usize + data.len()].copy_from_slice(data);
                append(log, Entry::write(VOL, offset, Bytes::copy_from_slice(data)))
            }
            RollbackWrite::Zero { offset, length } => {
                self.image[offset as usize..(offset + length) as usize].fill(0);
                append(
                    log,
                    Entry::extent(RecordKind::WriteZeroes, VOL, offset, length as u32),
                )
            }
        };
        self.after.insert(a.volume_seq, self.image.clone());
    }

    pub fn reads(&self, h: &History, vseq: u64) -> Result<(), HistoryError> {
        let mut got = vec![0u8; SIZE as usize];
        h.read_at(VOL, vseq, 0, &mut got)?;
        assert!(got == self.after[&vseq], "as of @{vseq}: differs");
        Ok(())
    }
}

pub fn append(log: &Log, e: Entry) -> mariner_log::Appended {
    log.append(e).unwrap().blocking_recv().unwrap().unwrap()
}
