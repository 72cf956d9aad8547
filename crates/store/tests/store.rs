//! The store with the log on fault-injecting devices: reads see every acknowledged write whether
//! applied or not, and after crashes that lose unsynced writes on the log devices *and* the
//! images, recovery brings the volume back to exactly the acknowledged writes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use mariner_disk::{CrashMode, Disk, Faults, FaultyDisk, MemDisk};
use mariner_log::{Entry, Log, LogConfig, RecordKind};
use mariner_store::{Allocation, Progress, Store, StoreConfig};

const LOG_ID: u128 = 77;
const VOL: u32 = 1;
const SIZE: u64 = 1 << 20;

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
        // Short, so the crash rounds run through deferred and prompt applies alike.
        apply_idle_ms: 2,
        apply_max_delay_ms: 50,
        apply_max_held_bytes: u64::MAX,
    }
}

struct Node {
    log: Log,
    store: Arc<Store>,
}

fn open(dir: &Path, logs: &[Arc<dyn Disk>], image: Arc<dyn Disk>, paused: bool) -> Node {
    open_with(dir, logs, image, paused, store_cfg(dir))
}

fn open_with(
    dir: &Path,
    logs: &[Arc<dyn Disk>],
    image: Arc<dyn Disk>,
    paused: bool,
    cfg: StoreConfig,
) -> Node {
    let progress = Progress::load(&dir.join("store.progress")).unwrap();
    let store = Store::new(cfg, progress);
    store.add_volume(VOL, image, SIZE);
    let sink: Arc<dyn mariner_log::DurableSink> = store.clone();
    let (log, rec) = Log::open(
        logs.to_vec(),
        log_cfg(),
        LOG_ID,
        &[store.holder_spec()],
        sink,
    )
    .unwrap();
    store.set_paused(paused);
    store.start(log.clone(), &rec).unwrap();
    Node { log, store }
}

fn write(n: &Node, offset: u64, data: Vec<u8>) -> bool {
    let e = Entry::write(VOL, offset, Bytes::from(data));
    n.log
        .append(e)
        .ok()
        .and_then(|w| w.blocking_recv().ok())
        .is_some_and(|r| r.is_ok())
}

fn trim(n: &Node, offset: u64, len: u32) -> bool {
    let e = Entry::extent(RecordKind::Trim, VOL, offset, len);
    n.log
        .append(e)
        .ok()
        .and_then(|w| w.blocking_recv().ok())
        .is_some_and(|r| r.is_ok())
}

/// A tiny deterministic generator (splitmix64).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[test]
fn reads_see_unapplied_writes_and_then_the_image() {
    let dir = tempfile::tempdir().unwrap();
    let logs: Vec<Arc<dyn Disk>> = vec![Arc::new(MemDisk::new(1 << 20))];
    Log::format(&logs, &log_cfg(), LOG_ID).unwrap();
    let image: Arc<dyn Disk> = Arc::new(MemDisk::new(SIZE as usize));
    let n = open(dir.path(), &logs, image.clone(), true);
    assert!(write(&n, 4096, vec![7; 8192]));
    assert!(write(&n, 8192, vec![9; 512])); // overlaps the first
    assert!(trim(&n, 12288 - 512, 512));
    let mut want = vec![0u8; 16384];
    want[4096..12288].fill(7);
    want[8192..8704].fill(9);
    want[12288 - 512..12288].fill(0);
    assert_eq!(
        n.store.read(VOL, 0, 16384).unwrap(),
        want,
        "read before apply"
    );
    // The payloads are within the budget: served from memory, no read of the log.
    let log_reads = n.store.stats().log_reads.load(Relaxed);
    let mut cached = vec![0xa5u8; 16384];
    assert!(n.store.read_cached(VOL, 0, &mut cached).unwrap());
    assert_eq!(cached, want, "cached read before apply");
    assert_eq!(n.store.stats().log_reads.load(Relaxed), log_reads);
    // A reused buffer is overwritten whole: holes, zeroed and written pieces alike.
    let mut reused = vec![0x5au8; 16384];
    n.store.read_into(VOL, 0, &mut reused).unwrap();
    assert_eq!(reused, want, "read into a reused buffer before apply");
    let mut raw = vec![0u8; 16384];
    image.read_at(&mut raw, 0).unwrap();
    assert_eq!(raw, vec![0u8; 16384], "nothing applied while paused");
    let alloc = n.store.allocation(VOL, 0, 16384).unwrap();
    // MemDisk reports everything allocated; the unapplied trim shows as known zeros.
    assert_eq!(
        alloc,
        vec![
            (11776, Allocation::Data),
            (512, Allocation::Zero),
            (4096, Allocation::Data)
        ]
    );
    n.store.set_paused(false);
    let deadline = Instant::now() + Duration::from_secs(10);
    while n
        .store
        .stats()
        .overlay_extents
        .load(std::sync::atomic::Ordering::Relaxed)
        > 0
    {
        assert!(Instant::now() < deadline, "apply did not drain the overlay");
        std::thread::sleep(Duration::from_millis(5));
    }
    image.read_at(&mut raw, 0).unwrap();
    assert_eq!(raw, want, "applied image");
    assert_eq!(
        n.store.read(VOL, 0, 16384).unwrap(),
        want,
        "read after apply"
    );
    assert!(n.store.read_cached(VOL, 0, &mut cached).unwrap());
    assert_eq!(cached, want, "cached read after apply");
    reused.fill(0x5a);
    n.store.read_into(VOL, 0, &mut reused).unwrap();
    assert_eq!(reused, want, "read into a reused buffer after apply");
    assert!(n
        .store
        .read_into(VOL, SIZE - 512, &mut reused[..1024])
        .is_err());
    assert!(n.store.read(VOL, SIZE - 512, 1024).is_err(), "out of range");
    assert!(n
        .store
        .read_cached(VOL, SIZE - 512, &mut cached[..1024])
        .is_err());
    n.store.shutdown();
    n.log.shutdown();
}

#[test]
fn a_cached_read_declines_what_only_the_log_device_holds() {
    for log_in_memory in [false, true] {
        // A FaultyDisk models a device: nothing of it is "cached". A MemDisk is memory.
        let log_disk: Arc<dyn Disk> = if log_in_memory {
            Arc::new(MemDisk::new(1 << 20))
        } else {
            Arc::new(FaultyDisk::new(1 << 20, 7))
        };
        let (_dir, image, n) = fresh_node(log_disk, true, without_payloads);
        assert!(write(&n, 4096, vec![7; 4096]));
        assert!(trim(&n, 16384, 4096));
        let mut buf = vec![0xa5u8; 4096];
        // The write's payload is only in the log: served from it if the log is in memory,
        // else declined; the blocking read has it either way.
        assert_eq!(
            n.store.read_cached(VOL, 4096, &mut buf).unwrap(),
            log_in_memory
        );
        if log_in_memory {
            assert_eq!(buf, vec![7; 4096]);
        }
        let mut wide = vec![0u8; 8192];
        assert_eq!(
            n.store.read_cached(VOL, 0, &mut wide).unwrap(),
            log_in_memory
        );
        assert_eq!(n.store.read(VOL, 4096, 4096).unwrap(), vec![7; 4096]);
        // Zeros of an unapplied trim and bytes of the (in-memory) image need no wait.
        assert!(n.store.read_cached(VOL, 16384, &mut buf).unwrap());
        assert_eq!(buf, vec![0; 4096]);
        image.write_at(&[3; 4096], 32768).unwrap();
        assert!(n.store.read_cached(VOL, 32768, &mut buf).unwrap());
        assert_eq!(buf, vec![3; 4096]);
        n.store.shutdown();
        n.log.shutdown();
    }
}

fn applied(n: &Node) -> u64 {
    n.store
        .stats()
        .applied_records
        .load(std::sync::atomic::Ordering::Relaxed)
}

/// A fresh node on a new log `log` and a memory image, its store configured by `configure`.
fn fresh_node(
    log: Arc<dyn Disk>,
    paused: bool,
    configure: impl FnOnce(StoreConfig) -> StoreConfig,
) -> (tempfile::TempDir, Arc<dyn Disk>, Node) {
    let dir = tempfile::tempdir().unwrap();
    let logs = vec![log];
    Log::format(&logs, &log_cfg(), LOG_ID).unwrap();
    let image: Arc<dyn Disk> = Arc::new(MemDisk::new(SIZE as usize));
    let cfg = configure(store_cfg(dir.path()));
    let n = open_with(dir.path(), &logs, image.clone(), paused, cfg);
    (dir, image, n)
}

/// A fresh node on memory disks whose applier defers as configured.
fn write_back_node(idle_ms: u64, max_delay_ms: u64) -> (tempfile::TempDir, Arc<dyn Disk>, Node) {
    fresh_node(Arc::new(MemDisk::new(1 << 20)), false, |cfg| StoreConfig {
        apply_idle_ms: idle_ms,
        apply_max_delay_ms: max_delay_ms,
        apply_max_held_bytes: u64::MAX,
        ..cfg
    })
}

/// No payloads kept in memory: every write is read back from the log.
fn without_payloads(cfg: StoreConfig) -> StoreConfig {
    StoreConfig {
        payload_budget_bytes: 0,
        ..cfg
    }
}

/// With no payloads kept in memory the applier reads records back from the log, a run of
/// consecutive records per read, across batches and around records without a payload.
#[test]
fn records_read_back_in_runs_reach_the_image() {
    let (_dir, image, n) = fresh_node(Arc::new(MemDisk::new(1 << 20)), true, without_payloads);
    let mut want = vec![0u8; 64 * 1024];
    let mut writes = 0;
    let mut waits = Vec::new();
    for i in 0..40u64 {
        let offset = (i * 7 % 16) * 4096;
        if i % 9 == 8 {
            assert!(trim(&n, offset, 4096));
            want[offset as usize..offset as usize + 4096].fill(0);
            continue;
        }
        let len = if i % 3 == 0 { 4096 } else { 1024 };
        // Up to four appends in flight, so that batches hold several records.
        let data = vec![i as u8 + 1; len];
        want[offset as usize..offset as usize + len].copy_from_slice(&data);
        let wait = n
            .log
            .append(Entry::write(VOL, offset, Bytes::from(data)))
            .unwrap();
        waits.push(wait);
        if i % 4 == 3 {
            for w in waits.drain(..) {
                assert!(w.blocking_recv().unwrap().is_ok());
            }
        }
        writes += 1;
    }
    for w in waits.drain(..) {
        assert!(w.blocking_recv().unwrap().is_ok());
    }
    assert!(write(&n, 60 * 1024, vec![0xee; 4096]));
    want[60 * 1024..].fill(0xee);
    writes += 1;
    n.store.set_paused(false);
    let deadline = Instant::now() + Duration::from_secs(10);
    while applied(&n) < 41 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let reads = n
        .store
        .stats()
        .log_reads
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(reads, writes, "every write record was read back");
    let mut got = vec![0u8; want.len()];
    image.read_at(&mut got, 0).unwrap();
    assert_eq!(got, want);
    n.store.shutdown();
    n.log.shutdown();
}

/// Write-back: records stay in the log while the writers keep writing (reads see them through
/// the overlay) and are applied once the writers pause.
#[test]
fn the_applier_waits_for_the_writers_to_pause() {
    let (_dir, image, n) = write_back_node(1000, 60_000);
    for i in 0..40u64 {
        assert!(write(&n, i * 512, vec![i as u8 + 1; 512]));
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(applied(&n), 0, "applied while the writers were busy");
    assert_eq!(n.store.read(VOL, 39 * 512, 512).unwrap(), vec![40; 512]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while applied(&n) < 40 {
        assert!(
            Instant::now() < deadline,
            "not applied after the writers paused"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut raw = vec![0u8; 512];
    image.read_at(&mut raw, 39 * 512).unwrap();
    assert_eq!(raw, vec![40; 512]);
    n.store.shutdown();
    n.log.shutdown();
}

/// ... but a record never waits longer than `apply_max_delay_ms`, however busy the writers.
#[test]
fn a_record_waits_at_most_the_maximum_delay() {
    let (_dir, _image, n) = write_back_node(60_000, 100);
    let start = Instant::now();
    let mut i = 0u64;
    while applied(&n) == 0 {
        assert!(start.elapsed() < Duration::from_secs(10), "never applied");
        assert!(write(&n, (i % 64) * 512, vec![1; 512]));
        i += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        start.elapsed() >= Duration::from_millis(100),
        "applied before the delay"
    );
    n.store.shutdown();
    n.log.shutdown();
}

/// ... nor once what waits holds more than `apply_max_held_bytes` of the log (what a restart
/// would replay), however busy the writers and however young the records.
#[test]
fn write_back_starts_once_the_held_log_passes_its_bound() {
    let (_dir, _image, n) = fresh_node(Arc::new(MemDisk::new(1 << 20)), false, |cfg| StoreConfig {
        apply_idle_ms: 60_000,
        apply_max_delay_ms: 60_000,
        // Two of the log's 64 KiB segments.
        apply_max_held_bytes: 128 * 1024,
        ..cfg
    });
    // Under the bound (8 records of 4 KiB, in the first segment), nothing is applied.
    for i in 0..8u64 {
        assert!(write(&n, i * 4096, vec![2; 4096]));
    }
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(applied(&n), 0, "applied under the bound");
    // Past it, write-back starts though the writers never pause.
    let start = Instant::now();
    let mut written = 8u64;
    while applied(&n) == 0 {
        assert!(start.elapsed() < Duration::from_secs(10), "never applied");
        assert!(write(&n, (written % 64) * 4096, vec![2; 4096]));
        written += 1;
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(written > 16, "applied after only {written} writes");
    n.store.shutdown();
    n.log.shutdown();
}

/// Random writes and trims; every few operations all devices crash (unsynced data lost or torn,
/// on the log devices and on the image) and the node reopens. After each recovery the volume
/// equals the model of acknowledged operations, except blocks of the single operation in flight
/// at the crash, which may show either outcome.
fn crash_model(seed: u64, log_devices: usize) {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(seed);
    let mk = |seed| Arc::new(FaultyDisk::new(64 * 1024 + 12 * 64 * 1024, seed));
    let mut log_disks: Vec<Arc<FaultyDisk>> =
        (0..log_devices).map(|i| mk(seed * 10 + i as u64)).collect();
    let mut image_disk = Arc::new(FaultyDisk::new(SIZE as usize, seed * 10 + 9));
    let as_dyn = |d: &[Arc<FaultyDisk>]| {
        d.iter()
            .map(|d| d.clone() as Arc<dyn Disk>)
            .collect::<Vec<_>>()
    };
    Log::format(&as_dyn(&log_disks), &log_cfg(), LOG_ID).unwrap();
    let mut model = vec![0u8; SIZE as usize];
    for round in 0..6 {
        let faults: Vec<Faults> = log_disks.iter().map(|d| d.faults()).collect();
        let image_faults = image_disk.faults();
        let n = open(dir.path(), &as_dyn(&log_disks), image_disk.clone(), false);
        let got = n.store.read(VOL, 0, SIZE).unwrap();
        if let Some(i) = got.iter().zip(&model).position(|(a, b)| a != b) {
            panic!(
                "seed {seed} round {round}: byte {i} is {} not {}",
                got[i], model[i]
            );
        }
        let ops = 20 + rng.below(60);
        for _ in 0..ops {
            let offset = rng.below(SIZE / 512 - 64) * 512;
            let len = (1 + rng.below(32)) * 512;
            if rng.below(5) == 0 {
                assert!(trim(&n, offset, len as u32));
                model[offset as usize..(offset + len) as usize].fill(0);
            } else {
                let byte = (rng.below(255) + 1) as u8;
                assert!(write(&n, offset, vec![byte; len as usize]));
                model[offset as usize..(offset + len) as usize].fill(byte);
            }
            if rng.below(7) == 0 {
                std::thread::sleep(Duration::from_millis(rng.below(6)));
            }
        }
        // Crash everything at once; the old threads see failing devices and stop.
        log_disks = faults
            .iter()
            .map(|f| Arc::new(f.crash_with(CrashMode::Random)))
            .collect();
        image_disk = Arc::new(image_faults.crash_with(CrashMode::Random));
        n.store.shutdown();
        n.log.shutdown();
    }
}

#[test]
fn crashes_of_log_and_image_lose_no_acknowledged_write() {
    for seed in 1..=6 {
        crash_model(seed, 1);
    }
    for seed in 11..=14 {
        crash_model(seed, 2);
    }
}

/// The store's watermark carries each volume's last volume sequence number, and a store
/// reopened on it opens the log so that a volume whose records are all released and
/// overwritten continues its numbering: nothing but the watermark remembers it.
#[test]
fn the_watermark_keeps_each_volumes_sequence_number_across_a_wrapped_log() {
    let log: Arc<dyn Disk> = Arc::new(MemDisk::new(1 << 20));
    let (dir, image, n) = fresh_node(Arc::clone(&log), false, |cfg| StoreConfig {
        apply_idle_ms: 0,
        apply_max_delay_ms: 0,
        apply_max_held_bytes: u64::MAX,
        ..cfg
    });
    for i in 0..3 {
        assert!(write(&n, i * 4096, vec![1; 4096]));
    }
    // Enough writes to another volume to wrap the 1 MiB log many times over.
    const OTHER: u32 = VOL + 1;
    n.store
        .add_volume(OTHER, Arc::new(MemDisk::new(SIZE as usize)), SIZE);
    let mut last = 0;
    for i in 0..1000u64 {
        let e = Entry::write(OTHER, (i % 64) * 4096, Bytes::from(vec![2; 4096]));
        last = n
            .log
            .append(e)
            .unwrap()
            .blocking_recv()
            .unwrap()
            .unwrap()
            .seq;
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while n.store.applied_seq() < last {
        assert!(
            std::time::Instant::now() < deadline,
            "the store did not sync"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let p = n.store.progress();
    assert_eq!(p.volume_seqs.get(&VOL), Some(&3));
    assert_eq!(p.volume_seqs.get(&OTHER), Some(&1000));
    n.store.shutdown();
    n.log.shutdown();

    let n = open(dir.path(), &[log], image, false);
    let e = Entry::write(VOL, 0, Bytes::from(vec![3; 4096]));
    let a = n.log.append(e).unwrap().blocking_recv().unwrap().unwrap();
    assert_eq!(a.volume_seq, 4, "volume {VOL} continues its numbering");
    n.store.shutdown();
    n.log.shutdown();
}
