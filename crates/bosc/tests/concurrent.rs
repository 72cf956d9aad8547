#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Concurrent writers on one block whose log appends complete out of sequence order.
//!
//! The forced interleaving: writer A's record (the lower sequence number) is held inside a
//! log device's write while writer B's record (the next sequence number, same block) goes to
//! the other, idle log device and becomes durable first. Before the fix B queued its
//! modification ahead of A's, so the block's queue was no longer in sequence order: the local
//! frontier of the next record of the block was taken from the queue's head (B's sequence
//! number minus one, i.e. A's) and recovery dropped A's acknowledged modification; and a commit
//! applied B then A, stamped the block with A's LSN and kept B queued, applying it twice.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use mariner_bosc::{BlockApp, Bosc, BoscConfig, Durability};
use mariner_disk::{Disk, MemDisk};
use mariner_log::{Log, LogConfig};

/// Payload = u64 counters; a modification folds `value` into counter `slot` (slot u16, value
/// u64) as `old * 31 + value`. Neither idempotent nor commutative: a modification applied
/// twice shows, one lost shows, and two applied out of sequence order show (1 then 10 gives
/// 41, 10 then 1 gives 311).
struct Add;
impl BlockApp for Add {
    fn apply(&self, _block: u64, payload: &mut [u8], m: &[u8]) {
        let slot = u16::from_le_bytes([m[0], m[1]]) as usize;
        let add = u64::from_le_bytes(m[2..10].try_into().unwrap());
        let at = &mut payload[slot * 8..slot * 8 + 8];
        let old = u64::from_le_bytes((&*at).try_into().unwrap());
        let v = old.wrapping_mul(31).wrapping_add(add);
        at.copy_from_slice(&v.to_le_bytes());
    }
}

fn add(slot: u16, value: u64) -> Vec<u8> {
    let mut m = slot.to_le_bytes().to_vec();
    m.extend_from_slice(&value.to_le_bytes());
    m
}

fn counter(payload: &[u8], slot: usize) -> u64 {
    u64::from_le_bytes(payload[slot * 8..slot * 8 + 8].try_into().unwrap())
}

#[derive(Debug, Default)]
struct Gate {
    /// The next write to a gated device is held until `open` is set.
    armed: bool,
    held: bool,
    open: bool,
}

/// A log device that can hold one write: the record in it stays in flight on demand.
#[derive(Debug)]
struct GatedDisk {
    disk: MemDisk,
    gate: Arc<(Mutex<Gate>, Condvar)>,
}

impl Disk for GatedDisk {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.disk.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        let (m, cv) = &*self.gate;
        let mut g = m.lock().unwrap();
        if g.armed {
            g.armed = false;
            g.held = true;
            cv.notify_all();
            while !g.open {
                g = cv.wait(g).unwrap();
            }
        }
        drop(g);
        self.disk.write_at(buf, offset)
    }
    fn sync(&self) -> std::io::Result<()> {
        self.disk.sync()
    }
    fn len(&self) -> std::io::Result<u64> {
        self.disk.len()
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.disk.set_len(len)
    }
}

const LOG_ID: u128 = 0xC0C0;

fn cfg() -> BoscConfig {
    BoscConfig {
        block_bytes: 512,
        block_count: 8,
        memory_budget_bytes: 1 << 20,
        background: None,
        ..BoscConfig::default()
    }
}

fn log_cfg() -> LogConfig {
    LogConfig {
        segment_bytes: 64 * 1024,
        t_wait_ns: 0,
        ..LogConfig::default()
    }
}

struct Rig {
    gate: Arc<(Mutex<Gate>, Condvar)>,
    data: Arc<dyn Disk>,
    logs: Vec<Arc<dyn Disk>>,
}

impl Rig {
    fn new() -> Self {
        let gate = Arc::new((Mutex::new(Gate::default()), Condvar::new()));
        let logs: Vec<Arc<dyn Disk>> = (0..2)
            .map(|_| {
                Arc::new(GatedDisk {
                    disk: MemDisk::new(2 << 20),
                    gate: Arc::clone(&gate),
                }) as Arc<dyn Disk>
            })
            .collect();
        let data: Arc<dyn Disk> = Arc::new(MemDisk::new(0));
        Bosc::<Add>::format(data.as_ref(), &cfg()).unwrap();
        Log::format(&logs, &log_cfg(), LOG_ID).unwrap();
        Self { gate, data, logs }
    }

    fn open(&self) -> (Bosc<Add>, mariner_bosc::OpenReport) {
        let durability = Durability::OwnLog {
            devices: self.logs.clone(),
            log: log_cfg(),
            log_id: LOG_ID,
            volume: 3,
        };
        Bosc::open(Arc::clone(&self.data), cfg(), durability, Arc::new(Add)).unwrap()
    }

    /// A folds 1 into counter 0 of `block`, B folds 10 into it; A's record is appended first (lower
    /// sequence number) but becomes durable after B's. Returns (A's seq, B's seq).
    fn reversed_pair(&self, b: &Bosc<Add>, block: u64) -> (u64, u64) {
        let (m, cv) = &*self.gate;
        *m.lock().unwrap() = Gate {
            armed: true,
            ..Gate::default()
        };
        std::thread::scope(|s| {
            let a = s.spawn(|| b.modify(block, &add(0, 1)).unwrap());
            {
                let mut g = m.lock().unwrap();
                while !g.held {
                    g = cv.wait(g).unwrap();
                }
            }
            // A's record is held in a log device's write; B's goes to the idle one.
            let later = s.spawn(|| b.modify(block, &add(0, 10)).unwrap());
            // Give B time to be acknowledged by the log and queued (before the fix it returns
            // at once; after it, B waits for A and this merely times out).
            let until = Instant::now() + Duration::from_millis(300);
            while !later.is_finished() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(1));
            }
            m.lock().unwrap().open = true;
            cv.notify_all();
            let (sa, sb) = (a.join().unwrap(), later.join().unwrap());
            assert!(sa < sb, "A was appended first: {sa} < {sb}");
            (sa, sb)
        })
    }
}

#[test]
fn out_of_order_log_completion_keeps_every_modification_on_recovery() {
    let rig = Rig::new();
    let (b, _) = rig.open();
    rig.reversed_pair(&b, 5);
    // Nothing in flight now: this record's local frontier comes from block 5's queue.
    b.modify(5, &add(1, 100)).unwrap();
    let live = b.read(5).unwrap();
    assert_eq!((counter(&live, 0), counter(&live, 1)), (41, 100));
    assert_eq!(b.pending_modifications(), 3);
    drop(b);
    let (b, report) = rig.open();
    assert_eq!(report.records_requeued, 3, "{report:?}");
    let p = b.read(5).unwrap();
    assert_eq!(
        (counter(&p, 0), counter(&p, 1)),
        (41, 100),
        "every acknowledged modification survives recovery"
    );
    b.commit_all().unwrap();
    let p = b.read(5).unwrap();
    assert_eq!((counter(&p, 0), counter(&p, 1)), (41, 100));
}

#[test]
fn out_of_order_log_completion_commits_each_modification_once() {
    let rig = Rig::new();
    let (b, _) = rig.open();
    rig.reversed_pair(&b, 2);
    b.commit_all().unwrap();
    assert_eq!(b.pending_modifications(), 0);
    assert_eq!(counter(&b.read(2).unwrap(), 0), 41, "applied exactly once");
    drop(b);
    let (b, report) = rig.open();
    assert_eq!(report.records_requeued, 0, "{report:?}");
    assert_eq!(counter(&b.read(2).unwrap(), 0), 41, "after reopening");
}
