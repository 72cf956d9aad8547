#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Queries read blocks from the disk while commit cycles write blocks in place. A buffered
//! file gives no atomicity between a `pread` and a `pwrite` of the same page: a read can see
//! half of a write. This disk makes that visible (it writes a block in 512-byte pieces with a
//! pause between), and queries must never see a torn block: the commit's in-place writes
//! exclude them (they took the index benchmark down with "block checksum mismatch").

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mariner_bosc::{BlockApp, Bosc, BoscConfig, Durability};
use mariner_disk::{Disk, MemDisk};
use mariner_log::{Log, LogConfig};

/// Writes in 512-byte pieces, yielding between them, like a page copy another thread can
/// read in the middle of.
#[derive(Debug)]
struct PiecewiseDisk(MemDisk);

impl Disk for PiecewiseDisk {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        for (i, piece) in buf.chunks(512).enumerate() {
            self.0.write_at(piece, offset + i as u64 * 512)?;
            std::thread::yield_now();
        }
        Ok(())
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
}

/// Sets one u64 slot of the block: (slot u16, value u64).
struct Slots;
impl BlockApp for Slots {
    fn apply(&self, _block: u64, payload: &mut [u8], m: &[u8]) {
        let slot = u16::from_le_bytes([m[0], m[1]]) as usize;
        payload[slot * 8..slot * 8 + 8].copy_from_slice(&m[2..10]);
    }
}

const BLOCKS: u64 = 256;

/// Sets its flag when dropped, also while unwinding.
struct StopOnDrop<'a>(&'a AtomicBool);
impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

#[test]
fn queries_never_see_a_block_half_written() {
    let cfg = BoscConfig {
        block_bytes: 4096,
        block_count: BLOCKS,
        max_run: 8,
        // Small: cached images are evicted, so queries read the disk.
        memory_budget_bytes: 16 << 10,
        background: Some(Duration::from_millis(1)),
        ..BoscConfig::default()
    };
    let log_cfg = LogConfig {
        segment_bytes: 256 * 1024,
        t_wait_ns: 0,
        ..LogConfig::default()
    };
    let data: Arc<dyn Disk> = Arc::new(PiecewiseDisk(MemDisk::new(0)));
    let log: Arc<dyn Disk> = Arc::new(MemDisk::new(32 << 20));
    Bosc::<Slots>::format(data.as_ref(), &cfg).unwrap();
    Log::format(&[Arc::clone(&log)], &log_cfg, 7).unwrap();
    let durability = Durability::OwnLog {
        devices: vec![log],
        log: log_cfg,
        log_id: 7,
        volume: 1,
    };
    let (b, _) = Bosc::open(data, cfg, durability, Arc::new(Slots)).unwrap();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        // Stops the reader however this thread leaves the scope: a panic in `modify_batch`
        // (a failed assertion in the engine) must fail the test, not leave the scope waiting
        // for a reader that never stops.
        let _stop_reader = StopOnDrop(&stop);
        let reader = s.spawn(|| {
            let mut queries = 0u64;
            let mut block = 0;
            while !stop.load(Ordering::Relaxed) {
                b.query(block, |p| p[0]).unwrap();
                block = (block + 1) % BLOCKS;
                queries += 1;
            }
            queries
        });
        let started = Instant::now();
        let mut i = 0u64;
        while started.elapsed() < Duration::from_millis(1500) {
            let batch = (0..32)
                .map(|j| {
                    let mut m = ((i + j) % 400).to_le_bytes()[..2].to_vec();
                    m.extend_from_slice(&(i + j).to_le_bytes());
                    mariner_bosc::Change::modify((i * 7 + j * 3) % BLOCKS, m)
                })
                .collect();
            b.modify_batch(batch).unwrap();
            i += 1;
        }
        stop.store(true, Ordering::Relaxed);
        let queries = reader.join().unwrap();
        assert!(queries > 1000, "{queries} queries");
    });
    assert!(b.stats().blocks_written.load(Ordering::Relaxed) > 100);
}
