#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A B+tree's open scans every block of its data disk. On a sparse file sized for growth most
//! blocks were never written: the scan skips the file's holes instead of reading gigabytes of
//! zeros (an index benchmark sized for 10^9 inserts took 44 s to reopen).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use mariner_bosc::btree::{BPlusTree, Key, LeafApp};
use mariner_bosc::{Bosc, BoscConfig, Durability};
use mariner_disk::{Disk, Extent, FileDisk, MemDisk, OpenOptions};
use mariner_log::{Log, LogConfig};

/// Counts the bytes read through it.
#[derive(Debug)]
struct Counted(FileDisk, Arc<AtomicU64>);

impl Disk for Counted {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.1.fetch_add(buf.len() as u64, Ordering::Relaxed);
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.0.write_at(buf, offset)
    }
    fn sync(&self) -> std::io::Result<()> {
        self.0.sync()
    }
    fn len(&self) -> std::io::Result<u64> {
        self.0.len()
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.0.set_len(len)
    }
    fn allocation(&self, offset: u64, len: u64) -> std::io::Result<Vec<Extent>> {
        self.0.allocation(offset, len)
    }
}

#[test]
fn open_reads_the_blocks_in_use_not_the_holes() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = BoscConfig {
        block_bytes: 4096,
        // 4 GiB of blocks, a few of them used.
        block_count: 1 << 20,
        background: None,
        ..BoscConfig::default()
    };
    let log_cfg = LogConfig {
        segment_bytes: 1 << 20,
        t_wait_ns: 0,
        ..LogConfig::default()
    };
    let log: Arc<dyn Disk> = Arc::new(MemDisk::new(16 << 20));
    Log::format(&[Arc::clone(&log)], &log_cfg, 5).unwrap();
    let read = Arc::new(AtomicU64::new(0));
    let data = |read: &Arc<AtomicU64>| -> Arc<dyn Disk> {
        let f = FileDisk::open(
            dir.path().join("data"),
            &OpenOptions {
                create: true,
                ..OpenOptions::default()
            },
        )
        .unwrap();
        Arc::new(Counted(f, Arc::clone(read)))
    };
    let durability = || Durability::OwnLog {
        devices: vec![Arc::clone(&log)],
        log: log_cfg.clone(),
        log_id: 5,
        volume: 1,
    };
    Bosc::<LeafApp>::format(data(&read).as_ref(), &cfg).unwrap();
    let records: Vec<(Key, u64)> = (0..20_000u64)
        .map(|i| (Key::new(1, i * 7919 % 100_000, 1), i))
        .collect();
    {
        let (b, _) = Bosc::open(data(&read), cfg.clone(), durability(), Arc::new(LeafApp)).unwrap();
        let t = BPlusTree::open(b, None).unwrap();
        for chunk in records.chunks(1000) {
            t.insert_batch(chunk).unwrap();
        }
        t.bosc().commit_all().unwrap();
    }
    read.store(0, Ordering::Relaxed);
    let (b, _) = Bosc::open(data(&read), cfg, durability(), Arc::new(LeafApp)).unwrap();
    let t = BPlusTree::open(b, None).unwrap();
    let bytes = read.load(Ordering::Relaxed);
    assert!(
        bytes < 64 << 20,
        "the open read {bytes} bytes of a 4 GiB disk with {} leaves",
        t.leaf_count()
    );
    for (k, v) in records.iter().step_by(97) {
        assert_eq!(t.get(*k).unwrap(), Some(*v));
    }
}
