#![allow(clippy::unwrap_used, clippy::expect_used)]

//! Reopening an own-log engine costs about what its queues held, not its replay window: the
//! log's records stream through `Log::replay` into the queues, and entries the frontiers show
//! committed are dropped as the queues outgrow the budget. A counting allocator measures the
//! peak of `Bosc::open`; it sees every thread of the process, so this binary holds this one
//! test only.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use mariner_bosc::{BlockApp, Bosc, BoscConfig, Durability};
use mariner_disk::{Disk, MemDisk};
use mariner_log::{Log, LogConfig};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; only counters are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which `System` shares.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` above, i.e. from `System`, with this `layout`.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Sets one u64 slot of the block: (slot u16, value u64).
struct Slots;
impl BlockApp for Slots {
    fn apply(&self, _block: u64, payload: &mut [u8], m: &[u8]) {
        let slot = u16::from_le_bytes([m[0], m[1]]) as usize;
        payload[slot * 8..slot * 8 + 8].copy_from_slice(&m[2..10]);
    }
}

const LOG_ID: u128 = 0x3e40;
const SEG: u64 = 64 * 1024;
const BUDGET: usize = 256 * 1024;

fn cfg() -> BoscConfig {
    BoscConfig {
        block_bytes: 512,
        block_count: 8192,
        memory_budget_bytes: BUDGET,
        background: None,
        ..BoscConfig::default()
    }
}

fn durability(log: &Arc<dyn Disk>) -> Durability {
    Durability::OwnLog {
        devices: vec![Arc::clone(log)],
        log: LogConfig {
            segment_bytes: SEG,
            t_wait_ns: 0,
            ..LogConfig::default()
        },
        log_id: LOG_ID,
        volume: 1,
    }
}

#[test]
fn reopen_memory_follows_the_budget_not_the_replay_window() {
    let data: Arc<dyn Disk> = Arc::new(MemDisk::new(0));
    let log: Arc<dyn Disk> = Arc::new(MemDisk::new(64 << 20));
    Bosc::<Slots>::format(data.as_ref(), &cfg()).unwrap();
    let Durability::OwnLog { log: log_cfg, .. } = durability(&log) else {
        unreachable!()
    };
    Log::format(&[Arc::clone(&log)], &log_cfg, LOG_ID).unwrap();
    let (b, _) = Bosc::open(Arc::clone(&data), cfg(), durability(&log), Arc::new(Slots)).unwrap();
    // Random modifications in batches; the budget forces commit cycles all along, and the
    // sweep leaves the oldest pending entries behind, so the window outgrows the queues.
    let mut rng = 0x9E37_79B9u64;
    for _ in 0..300 {
        let batch = (0..500)
            .map(|_| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let mut m = vec![0u8; 10];
                m[0..2].copy_from_slice(&((rng % 60) as u16).to_le_bytes());
                m[2..10].copy_from_slice(&rng.to_le_bytes());
                mariner_bosc::Change::modify((rng >> 8) % 8192, m)
            })
            .collect();
        b.modify_batch(batch).unwrap();
    }
    let pending = b.pending_modifications();
    assert!(b.stats().forced_commits.load(Ordering::Relaxed) > 0);
    drop(b); // a crash for the data disk: the queues were not committed

    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let (b, report) = Bosc::open(data, cfg(), durability(&log), Arc::new(Slots)).unwrap();
    let peak = PEAK.load(Ordering::Relaxed) - before;
    assert_eq!(report.records_requeued as usize, b.pending_modifications());
    assert!(report.records_requeued as usize >= pending);
    // A list of the window at 80 bytes a record (a log record header), before a byte of
    // payload, would alone break the bound below.
    let listed = report.records_scanned as usize * 80;
    // One log segment and the double-write area are read whole; a local frontier per block.
    let fixed = SEG as usize + 8 * 32 * 512 + 8192 * 48;
    assert!(
        listed > fixed + 2 * BUDGET,
        "the window ({} records) must outgrow the bound",
        report.records_scanned
    );
    assert!(
        peak < fixed + 2 * BUDGET,
        "open allocated {peak} B at its peak for {} records scanned, {} requeued",
        report.records_scanned,
        report.records_requeued
    );
}
