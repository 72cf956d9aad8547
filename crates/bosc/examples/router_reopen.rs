//! The B+tree's reopen with and without its router image (issue 17 M1), on files.
//!
//! ```text
//! router_reopen build DIR MIB UPDATES   # bulk-load ~MIB of 4 KiB leaves, open once with an
//!                                       # image, insert UPDATES random records (splits), drop
//!                                       # with the queues still in the log
//! router_reopen reopen DIR image|scan [INSERTS]
//!                                       # reopen: the engine, then the tree from the image
//!                                       # or by reading every leaf; prints the times; then
//!                                       # times INSERTS random inserts (leaves from an image
//!                                       # are read at their first put) and keeps them
//! ```
//! `BUDGET_MIB` sets the engine's memory budget (default 64), for both.
//! Evict the data file from the page cache between the two (bench/router-reopen.sh does,
//! with posix_fadvise DONTNEED) to measure a cold reopen.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mariner_bosc::btree::{leaf_capacity, BPlusTree, Key, LeafApp};
use mariner_bosc::{Bosc, BoscConfig, Durability};
use mariner_disk::{Disk, FileDisk, OpenOptions};
use mariner_log::{Log, LogConfig};

const LOG_ID: u128 = 0x0E0E;
const BLOCK: u32 = 4096;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["build", dir, mib, updates] => build(
            Path::new(dir),
            mib.parse().unwrap(),
            updates.parse().unwrap(),
        ),
        ["reopen", dir, mode] => reopen(Path::new(dir), mode == "image", 0),
        ["reopen", dir, mode, inserts] => {
            reopen(Path::new(dir), mode == "image", inserts.parse().unwrap())
        }
        _ => panic!("usage: router_reopen build DIR MIB UPDATES | reopen DIR image|scan [INSERTS]"),
    }
}

fn cfg(blocks: u64) -> BoscConfig {
    BoscConfig {
        block_bytes: BLOCK,
        block_count: blocks,
        memory_budget_bytes: budget_mib() << 20,
        background: Some(Duration::from_millis(10)),
        ..BoscConfig::default()
    }
}

/// The engine's memory budget: `BUDGET_MIB` (default 64); the queues a reopen requeues grow
/// with it.
fn budget_mib() -> usize {
    std::env::var("BUDGET_MIB")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(64)
}

fn log_cfg() -> LogConfig {
    LogConfig {
        align_bytes: 4096,
        ..LogConfig::default()
    }
}

fn blocks_of(dir: &Path) -> u64 {
    std::fs::read_to_string(dir.join("blocks"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn engine(dir: &Path, blocks: u64) -> (Bosc<LeafApp>, Duration, u64) {
    let data: Arc<dyn Disk> =
        Arc::new(FileDisk::open(dir.join("data"), &OpenOptions::new().random(true)).unwrap());
    let log: Arc<dyn Disk> =
        Arc::new(FileDisk::open(dir.join("log"), &OpenOptions::new()).unwrap());
    let durability = Durability::OwnLog {
        devices: vec![log],
        log: log_cfg(),
        log_id: LOG_ID,
        volume: 1,
    };
    let started = Instant::now();
    let (bosc, r) = Bosc::open(data, cfg(blocks), durability, Arc::new(LeafApp)).unwrap();
    (bosc, started.elapsed(), r.records_requeued)
}

fn image(dir: &Path) -> Arc<dyn Disk> {
    Arc::new(FileDisk::open(dir.join("router"), &OpenOptions::new().create(true)).unwrap())
}

fn build(dir: &Path, mib: u64, updates: u64) {
    let leaves = (mib << 20) / u64::from(BLOCK);
    // Room for the splits of the updates, and more.
    let blocks = leaves * 2 + 4096;
    std::fs::write(dir.join("blocks"), blocks.to_string()).unwrap();
    let data = FileDisk::create_sized(dir.join("data"), 0).unwrap();
    Bosc::<LeafApp>::format(&data, &cfg(blocks)).unwrap();
    let log: Arc<dyn Disk> = Arc::new(FileDisk::create_sized(dir.join("log"), 2 << 30).unwrap());
    Log::format(&[log], &log_cfg(), LOG_ID).unwrap();
    let _ = std::fs::remove_file(dir.join("router"));
    let (bosc, _, _) = engine(dir, blocks);
    // Nearly full leaves: the inserts then split many of them.
    let fill = leaf_capacity(bosc.payload_bytes()) - 4;
    let records = (0..leaves * fill as u64).map(|i| (Key::new(1, i * 16, 0), i));
    let started = Instant::now();
    let tree = BPlusTree::bulk_load(bosc, None, fill, records).unwrap();
    println!(
        "bulk load: {} leaves in {:.1} s",
        tree.leaf_count(),
        started.elapsed().as_secs_f64()
    );
    drop(tree);
    let (bosc, _, _) = engine(dir, blocks);
    let tree = BPlusTree::open_with_router(bosc, None, image(dir)).unwrap();
    println!("first open (no image yet): {:?}", tree.router_open());
    let started = Instant::now();
    insert(
        &tree,
        updates,
        leaves * fill as u64 * 16,
        0x9E37_79B9_7F4A_7C15,
    );
    let s = tree.stats();
    println!(
        "{updates} inserts in {:.1} s: {} leaves, {} images written, {} modifications pending",
        started.elapsed().as_secs_f64(),
        tree.leaf_count(),
        s.router_images_written
            .load(std::sync::atomic::Ordering::Relaxed),
        tree.bosc().pending_modifications()
    );
}

/// `n` random inserts in batches of 1,000 over keys `[0, span)`, each batch a new timestamp.
fn insert(tree: &BPlusTree, n: u64, span: u64, mut x: u64) {
    for b in 0..n.div_ceil(1000) {
        let batch: Vec<(Key, u64)> = (0..1000)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (Key::new(1, x % span, 1 + b), i)
            })
            .collect();
        tree.insert_batch(&batch).unwrap();
    }
}

fn reopen(dir: &Path, from_image: bool, inserts: u64) {
    let blocks = blocks_of(dir);
    let started = Instant::now();
    let (bosc, engine_s, requeued) = engine(dir, blocks);
    let t = Instant::now();
    let tree = if from_image {
        BPlusTree::open_with_router(bosc, None, image(dir)).unwrap()
    } else {
        BPlusTree::open(bosc, None).unwrap()
    };
    let tree_s = t.elapsed();
    let total = started.elapsed();
    let r = tree.router_open();
    println!(
        "reopen ({}): total {:.3} s = engine {:.3} s ({requeued} requeued) + tree {:.3} s; \
         {} leaves; from_image {}, blocks scanned {}, leaves found {}, image {} bytes",
        if from_image { "image" } else { "scan" },
        total.as_secs_f64(),
        engine_s.as_secs_f64(),
        tree_s.as_secs_f64(),
        tree.leaf_count(),
        r.from_image,
        if from_image { r.blocks_scanned } else { blocks },
        r.leaves_found,
        r.image_bytes,
    );
    if from_image && inserts == 0 {
        let t = Instant::now();
        tree.wait_for_counts();
        println!(
            "  counts of every leaf read in the background {:.3} s after the open",
            t.elapsed().as_secs_f64()
        );
    }
    if inserts > 0 {
        let started = Instant::now();
        let span = (blocks / 2) * 16 * leaf_capacity(tree.bosc().payload_bytes()) as u64;
        insert(&tree, inserts, span, 0x2545_F491_4F6C_DD1D);
        let s = tree.stats();
        let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        println!(
            "  then {inserts} inserts in {:.2} s ({:.0}/s): {} leaves read for their count by a \
             put, {} by the background refresher, {} split with a read, {} read ahead for splits",
            started.elapsed().as_secs_f64(),
            inserts as f64 / started.elapsed().as_secs_f64(),
            load(&s.counts_refreshed),
            load(&s.counts_refreshed_in_background),
            load(&s.splits_with_read),
            load(&s.leaves_prefetched),
        );
    }
    tree.bosc().close();
}
