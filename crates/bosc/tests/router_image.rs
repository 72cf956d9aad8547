#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The B+tree's persisted router (`btree::image`): an open from the image reads far fewer
//! blocks than the full scan and routes exactly as it would — after splits with and without
//! a checkpoint since the image, after leases renewed inside batches, after a damaged image
//! (full scan instead) and after crashes of every disk, the image's included, at any point
//! of an image write.

#[path = "support/faulty.rs"]
mod faulty;

use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use faulty::{engine_cfg, log_cfg, Disks, Rng};
use mariner_bosc::btree::image::{ImageHeader, IMAGE_BODY_START, IMAGE_SLOTS};
use mariner_bosc::btree::{BPlusTree, Key, LeafApp};
use mariner_bosc::{Bosc, BoscConfig, Durability};
use mariner_disk::{Disk, Extent, Faults, FaultyDisk, MemDisk};
use mariner_log::Log;

const LOG_ID: u128 = 0x1A6E;

/// A disk that counts the bytes read through it.
#[derive(Debug)]
struct Counting {
    inner: MemDisk,
    read: AtomicU64,
}

impl Disk for Counting {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.read.fetch_add(buf.len() as u64, Ordering::Relaxed);
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
    fn allocation(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
        // Everything allocated: the full scan reads every block, as on a preallocated file.
        Ok(vec![Extent {
            offset,
            len,
            allocated: true,
        }])
    }
}

/// Memory disks (data counted) that survive the engine: a clean shutdown or a crash of the
/// process alike, since a memory disk keeps every write.
struct Mem {
    data: Arc<Counting>,
    log: Arc<dyn Disk>,
    image: Arc<dyn Disk>,
    cfg: BoscConfig,
}

impl Mem {
    fn new(blocks: u64) -> Self {
        let cfg = BoscConfig {
            memory_budget_bytes: 1 << 20,
            ..engine_cfg(blocks, 1 << 20)
        };
        let data = Arc::new(Counting {
            inner: MemDisk::new(0),
            read: AtomicU64::new(0),
        });
        let log: Arc<dyn Disk> = Arc::new(MemDisk::new(16 << 20));
        Bosc::<LeafApp>::format(data.as_ref(), &cfg).unwrap();
        Log::format(&[Arc::clone(&log)], &log_cfg(), LOG_ID).unwrap();
        Self {
            data,
            log,
            image: Arc::new(MemDisk::new(0)),
            cfg,
        }
    }

    fn engine(&self) -> Bosc<LeafApp> {
        let durability = Durability::OwnLog {
            devices: vec![Arc::clone(&self.log)],
            log: log_cfg(),
            log_id: LOG_ID,
            volume: 9,
        };
        let data: Arc<dyn Disk> = self.data.clone();
        Bosc::open(data, self.cfg.clone(), durability, Arc::new(LeafApp))
            .unwrap()
            .0
    }

    /// Opens with the image; returns the tree and the data disk's read counter as the tree's
    /// open began (after the engine's).
    fn open(&self) -> (BPlusTree, u64) {
        let bosc = self.engine();
        let before = self.data.read.load(Ordering::Relaxed);
        let t = BPlusTree::open_with_router(bosc, None, Arc::clone(&self.image)).unwrap();
        (t, before)
    }

    /// Opens without the image, reading every leaf.
    fn open_scanning(&self) -> (BPlusTree, u64) {
        let bosc = self.engine();
        let before = self.data.read.load(Ordering::Relaxed);
        let t = BPlusTree::open(bosc, None).unwrap();
        (t, self.data.read.load(Ordering::Relaxed) - before)
    }
}

fn wide_key(rng: &mut Rng) -> Key {
    Key::new(rng.below(4) as u32, rng.below(1 << 20), rng.below(1000))
}

fn insert(t: &BPlusTree, o: &mut BTreeMap<Key, u64>, rng: &mut Rng, n: usize) {
    for chunk in 0..n.div_ceil(50) {
        let batch: Vec<(Key, u64)> = (0..50.min(n - chunk * 50))
            .map(|i| (wide_key(rng), (chunk * 50 + i) as u64))
            .collect();
        t.insert_batch(&batch).unwrap();
        o.extend(batch);
    }
}

fn check_all(t: &BPlusTree, o: &BTreeMap<Key, u64>) {
    let all = t.range(Key::MIN, Key::new(u32::MAX, 0, 0)).unwrap();
    let want: Vec<_> = o.iter().map(|(k, v)| (*k, *v)).collect();
    assert_eq!(all.len(), want.len());
    assert_eq!(all, want);
    for (k, v) in o.iter().step_by(7) {
        assert_eq!(t.get(*k).unwrap(), Some(*v), "get {k:?}");
        assert_eq!(
            t.newest_at_or_before(k.volume, k.lba, k.timestamp).unwrap(),
            Some((k.timestamp, *v))
        );
    }
}

#[test]
fn reopen_from_the_image_after_splits_with_and_without_a_checkpoint() {
    let m = Mem::new(4096);
    let mut rng = Rng(7);
    let mut o = BTreeMap::new();
    let (t, _) = m.open();
    assert!(!t.router_open().from_image);
    assert_eq!(t.router_open().fallback.as_deref(), Some("no router image"));
    insert(&t, &mut o, &mut rng, 3000);
    t.bosc().commit_all().unwrap();
    // Splits after the checkpoint: only in the log, requeued at open.
    insert(&t, &mut o, &mut rng, 3000);
    let images = t.stats().router_images_written.load(Ordering::Relaxed);
    assert!(images > 3, "leases ran out inside batches: {images} images");
    let leaves = t.leaf_count();
    drop(t);

    let (t, before) = m.open();
    // The background refresher reads the counts of the leaves no put has read yet: every
    // block once, which leaves what the open itself read.
    t.wait_for_counts();
    let bs = u64::from(m.cfg.block_bytes);
    let read = m.data.read.load(Ordering::Relaxed) - before - m.cfg.block_count * bs;
    let r = t.router_open().clone();
    assert!(r.from_image, "{r:?}");
    assert!(r.leaves_found > 0, "splits since the last image: {r:?}");
    assert_eq!(t.leaf_count(), leaves);
    check_all(&t, &o);
    let counted = t
        .stats()
        .counts_refreshed_in_background
        .load(Ordering::Relaxed);
    assert!(counted > 0 && counted as usize <= leaves, "{counted}");
    check_all(&t, &o);
    drop(t);
    let (t, full) = m.open_scanning();
    assert_eq!(t.leaf_count(), leaves);
    check_all(&t, &o);
    drop(t);
    // The scan reads every block; the image's open its lease (a sixteenth of the leaves, at
    // least 32 blocks), 64 blocks past it, and a few leaves to check for a torn split.
    assert_eq!(full, m.cfg.block_count * bs);
    assert!(
        read * 8 < full,
        "image open read {read} bytes, the scan {full}"
    );
    // The lease, and 64 blocks past it that must hold no leaf.
    assert!(r.blocks_scanned <= leaves as u64 / 16 + 32 + 64, "{r:?}");

    // A checkpoint between the last splits and the reopen; then splits of leaves whose counts
    // the image did not have (each read once, by a put or by the refresher, whichever first).
    let (t, _) = m.open();
    insert(&t, &mut o, &mut rng, 2000);
    t.bosc().commit_all().unwrap();
    drop(t);
    let (t, _) = m.open();
    assert!(t.router_open().from_image);
    check_all(&t, &o);
    insert(&t, &mut o, &mut rng, 2000);
    let s = t.stats();
    let read = s.counts_refreshed.load(Ordering::Relaxed)
        + s.counts_refreshed_in_background.load(Ordering::Relaxed);
    assert!(read > 0);
    check_all(&t, &o);
}

#[test]
fn a_damaged_image_falls_back_to_the_full_scan() {
    let m = Mem::new(2048);
    let mut rng = Rng(11);
    let mut o = BTreeMap::new();
    let (t, _) = m.open();
    insert(&t, &mut o, &mut rng, 3000);
    drop(t);
    let len = m.image.len().unwrap();
    let flip = |at: u64| {
        let mut b = [0u8; 1];
        m.image.read_at(&mut b, at).unwrap();
        b[0] ^= 0x10;
        m.image.write_at(&b, at).unwrap();
    };
    let newest = || {
        let mut slots = [[0u8; 64]; 2];
        for (s, at) in slots.iter_mut().zip(IMAGE_SLOTS) {
            m.image.read_at(s, at).unwrap();
        }
        ImageHeader::pick([&slots[0], &slots[1]]).unwrap()
    };
    // A body that fails its checksum, a torn header, a header of another disk: each time the
    // full scan, the same answers, and a fresh image the next open uses.
    let cases: [(&dyn Fn(), &str); 3] = [
        (&|| flip(newest().body_offset + 40), "checksum"),
        (&|| flip(IMAGE_SLOTS[1] + 20), "damaged"),
        (
            &|| {
                let h = ImageHeader {
                    generation: newest().generation + 1,
                    disk_id: mariner_bosc::format::DiskId(1),
                    ..newest()
                };
                m.image.write_at(&h.encode(), IMAGE_SLOTS[0]).unwrap();
            },
            "another disk",
        ),
    ];
    assert!(len > IMAGE_BODY_START);
    for (damage, why) in cases {
        damage();
        let (t, before) = m.open();
        let read = m.data.read.load(Ordering::Relaxed) - before;
        let r = t.router_open().clone();
        assert!(!r.from_image);
        assert!(
            r.fallback.as_deref().is_some_and(|f| f.contains(why)),
            "{why}: {r:?}"
        );
        assert_eq!(t.stats().router_fallbacks.load(Ordering::Relaxed), 1);
        assert_eq!(read, m.cfg.block_count * u64::from(m.cfg.block_bytes));
        check_all(&t, &o);
        insert(&t, &mut o, &mut rng, 200);
        drop(t);
        let (t, _) = m.open();
        assert!(t.router_open().from_image);
        check_all(&t, &o);
        drop(t);
    }
}

/// Random batches, commit cycles and crashes of every disk at once; before some crashes the
/// image disk fails at its next write or sync (an image body written but not its header, a
/// header written but not synced...), which fails the batch that needed a new lease.
/// After each crash the tree answers as the oracle of acknowledged batches says.
#[test]
fn crashes_around_image_writes_route_every_key() {
    let (mut from_image, mut found, mut fell_back, mut failed_writes) = (0, 0, 0, 0);
    for seed in 1..=6u64 {
        let mut rng = Rng((seed * 0x9E37_79B9) | 1);
        let c = engine_cfg(1024, 1 << 20);
        let mut disks = Disks::new::<LeafApp>(seed, &c, 8 << 20, LOG_ID);
        let image_disk = FaultyDisk::new(0, seed ^ 0x1A6E);
        let mut image: Faults = image_disk.faults();
        let mut image_arc: Arc<dyn Disk> = Arc::new(image_disk);
        let open = |disks: &Disks, image: &Arc<dyn Disk>| {
            let (bosc, _) = disks.open_own_log(Arc::clone(&disks.log_disk), &c, LeafApp, LOG_ID, 9);
            BPlusTree::open_with_router(bosc, None, Arc::clone(image)).unwrap()
        };
        let mut t = open(&disks, &image_arc);
        let mut o: BTreeMap<Key, u64> = BTreeMap::new();
        for step in 0..300u64 {
            match rng.below(20) {
                0..=13 => {
                    let batch: Vec<(Key, u64)> = (0..1 + rng.below(40))
                        .map(|i| (wide_key(&mut rng), step * 100 + i))
                        .collect();
                    match t.insert_batch(&batch) {
                        Ok(()) => o.extend(batch),
                        // Only an image write fails here; a batch that needed it is not
                        // acknowledged, and none of it was logged.
                        Err(_) => failed_writes += 1,
                    }
                }
                14..=16 => {
                    t.bosc().commit_cycle().unwrap();
                }
                17 => image.fail_after(rng.below(4)),
                _ => {
                    disks = disks.crash();
                    let next = image.crash();
                    image = next.faults();
                    image_arc = Arc::new(next);
                    drop(t);
                    t = open(&disks, &image_arc);
                    let r = t.router_open();
                    if r.from_image {
                        from_image += 1;
                        found += r.leaves_found;
                    } else {
                        fell_back += 1;
                    }
                    check_all(&t, &o);
                }
            }
        }
        // A batch failed by the image disk may have failed the tree; a reopen heals it.
        drop(t);
        let last: Arc<dyn Disk> = Arc::new(image.crash());
        let t = open(&disks.crash(), &last);
        check_all(&t, &o);
    }
    eprintln!(
        "{from_image} opens from the image ({found} leaves found in leases), {fell_back} full \
         scans, {failed_writes} batches failed by the image disk"
    );
    assert!(from_image > 10 && found > 0 && failed_writes > 0);
}

/// A split torn by a crash (new leaf written, old leaf not yet truncated) after the image:
/// its new leaf is in the lease, and open truncates the old leaf as the full scan would.
#[test]
fn a_split_torn_after_the_image_is_repaired_at_open() {
    let m = Mem::new(256);
    let (t, _) = m.open();
    let cap = t.leaf_capacity() as u64 * 3 / 4 - 1;
    for lba in 0..cap {
        t.insert(Key::new(1, lba, 0), lba).unwrap();
    }
    t.bosc().commit_all().unwrap();
    assert_eq!(t.leaf_count(), 1);
    drop(t);
    // The first half of a split, by hand, into the block the allocator takes next.
    let bosc = m.engine();
    let upper: Vec<_> = (cap / 2..cap).map(|l| (Key::new(1, l, 0), l)).collect();
    let payload = mariner_bosc::btree::leaf_payload(bosc.payload_bytes(), upper[0].0, &upper);
    bosc.write(1, &payload).unwrap();
    drop(bosc);
    let (t, _) = m.open();
    let r = t.router_open().clone();
    assert!(r.from_image && r.leaves_found == 1, "{r:?}");
    assert_eq!(t.stats().leaves_repaired.load(Ordering::Relaxed), 1);
    assert_eq!(t.leaf_count(), 2);
    let all = t.range(Key::MIN, Key::new(2, 0, 0)).unwrap();
    assert_eq!(all.len() as u64, cap);
    // The old leaf's count is exact again: it fills and splits without overflowing.
    for lba in 0..cap {
        t.insert(Key::new(1, lba, 1), lba).unwrap();
    }
    assert_eq!(
        t.range(Key::MIN, Key::new(2, 0, 0)).unwrap().len() as u64,
        2 * cap
    );
}

/// An older copy of the image file put back beside a tree that has outgrown its lease: the
/// blocks past the lease hold leaves, so open does not trust it and reads every leaf.
#[test]
fn an_image_older_than_the_tree_is_not_used() {
    let m = Mem::new(4096);
    let mut rng = Rng(5);
    let mut o = BTreeMap::new();
    let (t, _) = m.open();
    insert(&t, &mut o, &mut rng, 1000);
    drop(t);
    let len = m.image.len().unwrap() as usize;
    let mut old = vec![0u8; len];
    m.image.read_at(&mut old, 0).unwrap();
    let (t, _) = m.open();
    insert(&t, &mut o, &mut rng, 4000);
    drop(t);
    m.image.write_at(&old, 0).unwrap();
    m.image.set_len(len as u64).unwrap();
    let (t, _) = m.open();
    let r = t.router_open().clone();
    assert!(!r.from_image);
    assert!(
        r.fallback.as_deref().is_some_and(|f| f.contains("stale")),
        "{r:?}"
    );
    check_all(&t, &o);
}

/// An image with valid checksums that lies (two leaves' blocks swapped): open cannot tell
/// without reading the leaves, but the background refresher, which reads them all, finds a
/// leaf the router routes elsewhere and fails the tree instead of letting it answer wrong.
#[test]
fn a_lying_image_is_caught_by_the_refresher() {
    use mariner_bosc::btree::image::RouterImage;
    let m = Mem::new(2048);
    let mut rng = Rng(13);
    let mut o = BTreeMap::new();
    let (t, _) = m.open();
    insert(&t, &mut o, &mut rng, 2000);
    drop(t);
    let mut slots = [[0u8; 64]; 2];
    for (s, at) in slots.iter_mut().zip(IMAGE_SLOTS) {
        m.image.read_at(s, at).unwrap();
    }
    let h = ImageHeader::pick([&slots[0], &slots[1]]).unwrap();
    let mut body = vec![0u8; h.body_len as usize];
    m.image.read_at(&mut body, h.body_offset).unwrap();
    let mut img = RouterImage::decode(&body).unwrap();
    let (a, b) = (img.leaves[1].1, img.leaves[2].1);
    img.leaves[1].1 = b;
    img.leaves[2].1 = a;
    let body = img.encode();
    let at = m.image.len().unwrap().next_multiple_of(4096);
    m.image.set_len(at + body.len() as u64).unwrap();
    m.image.write_at(&body, at).unwrap();
    let lie = ImageHeader {
        generation: h.generation + 1,
        body_offset: at,
        body_len: body.len() as u64,
        body_crc: crc32c::crc32c(&body),
        ..h
    };
    let slot = IMAGE_SLOTS[usize::from(lie.generation % 2 == 1)];
    m.image.write_at(&lie.encode(), slot).unwrap();
    let (t, _) = m.open();
    assert!(t.router_open().from_image);
    t.wait_for_counts();
    let err = t.get(Key::MIN).unwrap_err().to_string();
    assert!(err.contains("did not match"), "{err}");
}
