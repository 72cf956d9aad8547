//! The store when a volume's file system fills up: the applier keeps the record that found no
//! room (and, if a sync failed, everything since the last good sync), reports the volume out
//! of space, and applies them again once there is room, without a restart. Reads see every
//! acknowledged write throughout. Any other I/O error still fails the store for good.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use mariner_disk::{Disk, FailAfter, FullDisk, MemDisk};
use mariner_log::{Entry, Log, LogConfig};
use mariner_store::{Progress, Store, StoreConfig};

const LOG_ID: u128 = 78;
const SIZE: u64 = 1 << 20;
const A: u32 = 1;
const B: u32 = 2;

fn log_cfg() -> LogConfig {
    LogConfig {
        segment_bytes: 64 * 1024,
        t_wait_ns: 10_000,
        ..LogConfig::default()
    }
}

fn store_cfg(dir: &Path) -> StoreConfig {
    StoreConfig {
        progress_path: dir.join("store.progress"),
        sync_interval_ms: 3,
        sync_bytes: 64 * 1024,
        payload_budget_bytes: 16 * 1024,
        apply_idle_ms: 0,
        apply_max_delay_ms: 0,
        apply_max_held_bytes: u64::MAX,
    }
}

struct Node {
    log: Log,
    store: Arc<Store>,
}

impl Node {
    /// A node with volumes `A` and `B` on `images`, its log on `log`.
    fn open(dir: &Path, log: &Arc<dyn Disk>, images: [Arc<dyn Disk>; 2]) -> Node {
        let progress = Progress::load(&dir.join("store.progress")).unwrap();
        let store = Store::new(store_cfg(dir), progress);
        let [a, b] = images;
        store.add_volume(A, a, SIZE);
        store.add_volume(B, b, SIZE);
        let sink: Arc<dyn mariner_log::DurableSink> = store.clone();
        let (log, rec) = Log::open(
            vec![log.clone()],
            log_cfg(),
            LOG_ID,
            &[store.holder_spec()],
            sink,
        )
        .unwrap();
        store.start(log.clone(), &rec).unwrap();
        Node { log, store }
    }

    fn write(&self, volume: u32, offset: u64, data: &[u8]) {
        let e = Entry::write(volume, offset, Bytes::copy_from_slice(data));
        let r = self.log.append(e).unwrap().blocking_recv().unwrap();
        assert!(r.is_ok(), "write to volume {volume} at {offset}: {r:?}");
    }

    fn read(&self, volume: u32, offset: u64, len: u64) -> Vec<u8> {
        self.store.read(volume, offset, len).unwrap()
    }

    /// Waits (at most 20 s) until `what` holds.
    fn until(&self, what: &str, f: impl Fn(&Node) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !f(self) {
            assert!(Instant::now() < deadline, "timed out waiting: {what}");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Waits until `volume` is reported out of space; returns why.
    fn out_of_space(&self, volume: u32) -> String {
        self.until(&format!("volume {volume} out of space"), |n| {
            n.store.out_of_space(volume).is_some()
        });
        self.store.out_of_space(volume).unwrap()
    }

    fn applied_seq(&self) -> u64 {
        let s = self.store.stats();
        s.applied_seq.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn synced_seq(&self) -> u64 {
        let s = self.store.stats();
        s.synced_seq.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn close(self) {
        self.store.shutdown();
        self.log.shutdown();
    }
}

fn raw(disk: &dyn Disk, offset: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    disk.read_at(&mut b, offset).unwrap();
    b
}

fn formatted_log() -> Arc<dyn Disk> {
    let log: Arc<dyn Disk> = Arc::new(MemDisk::new(1 << 20));
    Log::format(std::slice::from_ref(&log), &log_cfg(), LOG_ID).unwrap();
    log
}

/// A scratch directory, a formatted log, and the images of volume `A` (a disk that can be made
/// to run out of space) and `B` (a plain one).
struct Fixture {
    dir: tempfile::TempDir,
    log: Arc<dyn Disk>,
    a: Arc<FullDisk<MemDisk>>,
    b: Arc<dyn Disk>,
}

fn fixture() -> Fixture {
    Fixture {
        dir: tempfile::tempdir().unwrap(),
        log: formatted_log(),
        a: Arc::new(FullDisk::new(MemDisk::new(SIZE as usize))),
        b: Arc::new(MemDisk::new(SIZE as usize)),
    }
}

#[test]
fn a_record_that_found_no_room_is_applied_once_there_is_room() {
    let Fixture { dir, log, a, b } = fixture();
    let n = Node::open(dir.path(), &log, [a.clone(), b.clone()]);
    n.write(A, 0, &[1; 4096]);
    n.until("first write synced", |n| n.synced_seq() >= 1);
    a.set_full(true);
    n.write(A, 4096, &[2; 4096]);
    let why = n.out_of_space(A);
    assert!(why.contains("No space left on device"), "{why}");
    assert_eq!(n.store.out_of_space(B), None, "volume B has room");
    assert_eq!(n.store.failure(), None, "out of space is not a failure");
    assert_eq!(n.read(A, 4096, 4096), vec![2; 4096], "read from the log");
    assert_eq!(
        raw(a.as_ref(), 4096, 4096),
        vec![0; 4096],
        "not in the image"
    );

    // The other volume's writes are still taken, and read back, while the log has room:
    // applying is in sequence order, so they wait behind A's record.
    n.write(B, 0, &[3; 4096]);
    assert_eq!(n.read(B, 0, 4096), vec![3; 4096]);
    std::thread::sleep(Duration::from_millis(50));
    assert!(n.store.out_of_space(A).is_some(), "still no room");

    a.set_full(false);
    n.until("volume A has room again", |n| {
        n.store.out_of_space(A).is_none()
    });
    assert_eq!(
        n.synced_seq(),
        n.applied_seq(),
        "synced before writable again"
    );
    assert_eq!(raw(a.as_ref(), 0, 8192)[4096..], [2; 4096]);
    assert_eq!(raw(b.as_ref(), 0, 4096), vec![3; 4096]);
    n.write(A, 8192, &[4; 4096]);
    n.close();

    let n = Node::open(dir.path(), &log, [a, b]);
    let mut want = vec![1; 4096];
    want.extend([2; 4096]);
    want.extend([4; 4096]);
    assert_eq!(n.read(A, 0, 3 * 4096), want);
    assert_eq!(n.read(B, 0, 4096), vec![3; 4096]);
    n.close();
}

/// A sync that fails may have lost what it was to make durable; the applier takes everything
/// since the last good sync back from the log, not only from where it stopped.
#[test]
fn a_failed_sync_applies_again_from_the_last_good_sync() {
    let Fixture { dir, log, a, b } = fixture();
    let n = Node::open(dir.path(), &log, [a.clone(), b.clone()]);
    n.write(A, 0, &[1; 4096]);
    n.until("first write synced", |n| n.synced_seq() >= 1);
    let synced = n.synced_seq();
    a.fail_syncs(u64::MAX);
    n.write(A, 4096, &[5; 4096]);
    n.write(A, 8192, &[6; 4096]);
    let why = n.out_of_space(A);
    assert!(why.contains("sync"), "{why}");
    // The failed sync lost both writes in the image; reads take them from the log again.
    assert_eq!(raw(a.as_ref(), 4096, 8192), vec![0; 8192]);
    assert_eq!(n.read(A, 4096, 4096), vec![5; 4096]);
    assert_eq!(n.read(A, 8192, 4096), vec![6; 4096]);
    assert_eq!(n.synced_seq(), synced, "nothing synced since");

    a.fail_syncs(0);
    n.until("volume A has room again", |n| {
        n.store.out_of_space(A).is_none()
    });
    let mut want = vec![1; 4096];
    want.extend([5; 4096]);
    want.extend([6; 4096]);
    assert_eq!(raw(a.as_ref(), 0, 3 * 4096), want, "applied again");
    assert_eq!(n.read(A, 0, 3 * 4096), want);
    n.close();
    let n = Node::open(dir.path(), &log, [a, b]);
    assert_eq!(n.read(A, 0, 3 * 4096), want);
    n.close();
}

/// Shut down while out of space: what was not applied stays in the log, and the next start
/// applies it once there is room.
#[test]
fn a_shutdown_out_of_space_leaves_the_records_in_the_log() {
    let Fixture { dir, log, a, b } = fixture();
    let n = Node::open(dir.path(), &log, [a.clone(), b.clone()]);
    a.set_full(true);
    n.write(A, 0, &[7; 4096]);
    n.write(B, 0, &[8; 4096]);
    n.out_of_space(A);
    let started = Instant::now();
    n.close();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "shutdown waited for space"
    );
    a.set_full(false);
    let n = Node::open(dir.path(), &log, [a.clone(), b.clone()]);
    assert_eq!(n.read(A, 0, 4096), vec![7; 4096]);
    n.until("everything applied", |n| n.synced_seq() >= 2);
    assert_eq!(raw(a.as_ref(), 0, 4096), vec![7; 4096]);
    assert_eq!(raw(b.as_ref(), 0, 4096), vec![8; 4096]);
    n.close();
}

/// Only running out of space is waited out: another I/O error fails the store.
#[test]
fn other_io_errors_still_fail_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let log = formatted_log();
    let a: Arc<dyn Disk> = Arc::new(FailAfter::new(MemDisk::new(SIZE as usize), 0));
    let b: Arc<dyn Disk> = Arc::new(MemDisk::new(SIZE as usize));
    let n = Node::open(dir.path(), &log, [a, b]);
    n.write(A, 0, &[1; 4096]);
    n.until("store failed", |n| n.store.failure().is_some());
    assert_eq!(n.store.out_of_space(A), None);
    assert_eq!(n.read(A, 0, 4096), vec![1; 4096]);
    n.close();
}
