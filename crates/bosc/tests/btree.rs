#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Model-based crash test of the B+tree on BOSC: random inserts, updates, deletes, point,
//! range and as-of queries, commit cycles and crashes (lost, reordered and torn unsynced writes
//! on FaultyDisk, data and log alike) against a BTreeMap oracle. After every recovery every
//! acknowledged operation is visible and nothing else.
//!
//! The disks crash while the engine still runs (it is dropped afterwards, writing to dead
//! devices). Operations here are synchronous, one at a time, so a crash meets unsynced
//! data-disk writes but a settled log; tests/model.rs crashes with log writes in flight.

#[path = "support/faulty.rs"]
mod faulty;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use faulty::{engine_cfg, Disks, Rng};
use mariner_bosc::btree::{leaf_payload, BPlusTree, Key, LeafApp};
use mariner_bosc::{Bosc, BoscConfig};

const BLOCKS: u64 = 192;
const LOG_ID: u128 = 0xB7EE;

fn cfg(budget: usize) -> BoscConfig {
    engine_cfg(BLOCKS, budget)
}

impl Disks {
    fn open(&self, c: &BoscConfig) -> BPlusTree {
        self.open_reporting(c).0
    }

    /// Also how many whole-block writes recovery found on the data disk already.
    fn open_reporting(&self, c: &BoscConfig) -> (BPlusTree, u64) {
        let (bosc, report) = self.open_own_log(Arc::clone(&self.log_disk), c, LeafApp, LOG_ID, 9);
        (
            BPlusTree::open(bosc, None).expect("tree"),
            report.images_dropped,
        )
    }
}

fn key(rng: &mut Rng) -> Key {
    Key::new(rng.below(3) as u32, rng.below(40), rng.below(12) * 10)
}

fn oracle_newest(o: &BTreeMap<Key, u64>, v: u32, lba: u64, at: u64) -> Option<(u64, u64)> {
    o.range(Key::new(v, lba, 0)..=Key::new(v, lba, at))
        .next_back()
        .map(|(k, val)| (k.timestamp, *val))
}

fn check_all(t: &BPlusTree, o: &BTreeMap<Key, u64>) {
    let all = t.range(Key::MIN, Key::new(u32::MAX, 0, 0)).unwrap();
    let want: Vec<_> = o.iter().map(|(k, v)| (*k, *v)).collect();
    assert_eq!(all, want);
    for (k, v) in o.iter().take(50) {
        assert_eq!(t.get(*k).unwrap(), Some(*v));
    }
}

/// Totals over the run's trees: splits in memory, with a read, from a commit's hot copy;
/// leaves repaired; new leaves recovery found committed already; leaves read ahead.
fn run(seed: u64, steps: usize, budget: usize, read_ahead: bool) -> [u64; 6] {
    let mut rng = Rng(seed | 1);
    // Every other seed keeps images within a quarter of the budget: a modified clean image
    // past it is dropped and the modification queued (`BoscConfig::image_share`).
    let c = BoscConfig {
        image_share: if seed.is_multiple_of(2) { 1.0 } else { 0.25 },
        ..cfg(budget)
    };
    let mut disks = Disks::new::<LeafApp>(seed, &c, 4 << 20, LOG_ID);
    let mut tree = disks.open(&c);
    tree.set_read_ahead(read_ahead);
    let mut o = BTreeMap::new();
    let mut crashes = 0;
    let mut totals = [0; 6];
    let add = |t: &BPlusTree, totals: &mut [u64; 6]| {
        let s = t.stats();
        let counters = [
            &s.splits_in_memory,
            &s.splits_with_read,
            &s.splits_hot,
            &s.leaves_repaired,
        ];
        totals[5] += s.leaves_read_ahead.load(Ordering::Relaxed);
        for (total, c) in totals.iter_mut().zip(counters) {
            *total += c.load(Ordering::Relaxed);
        }
    };
    for step in 0..steps {
        match rng.below(100) {
            0..=54 => {
                let k = key(&mut rng);
                t_insert(&tree, &mut o, k, step as u64 + 1);
            }
            55..=61 => {
                let k = key(&mut rng);
                tree.delete(k).unwrap();
                o.remove(&k);
            }
            62..=64 => {
                // History's prune: a volume's records up to a timestamp, routed by the keys
                // of those records (every leaf holding one gets the drop).
                let (v, through) = (rng.below(3) as u32, rng.below(12) * 10);
                let gone: Vec<Key> = o
                    .keys()
                    .filter(|k| k.volume == v && k.timestamp <= through)
                    .copied()
                    .collect();
                tree.drop_through(&gone, |vol| (vol == v).then_some(through))
                    .unwrap();
                for k in gone {
                    o.remove(&k);
                }
            }
            65..=72 => {
                let k = key(&mut rng);
                assert_eq!(tree.get(k).unwrap(), o.get(&k).copied(), "get {k:?}");
            }
            73..=77 => {
                let (a, b) = (key(&mut rng), key(&mut rng));
                let (a, b) = (a.min(b), a.max(b));
                let want: Vec<_> = o.range(a..b).map(|(k, v)| (*k, *v)).collect();
                assert_eq!(tree.range(a, b).unwrap(), want, "range {a:?}..{b:?}");
            }
            78..=84 => {
                let k = key(&mut rng);
                let at = rng.below(130);
                assert_eq!(
                    tree.newest_at_or_before(k.volume, k.lba, at).unwrap(),
                    oracle_newest(&o, k.volume, k.lba, at),
                    "as-of {k:?} {at}"
                );
                // The same question for a run of blocks from it, with one read a leaf.
                let lbas: Vec<u64> = (k.lba..k.lba + 1 + rng.below(30)).collect();
                let want: Vec<_> = lbas
                    .iter()
                    .map(|&lba| oracle_newest(&o, k.volume, lba, at))
                    .collect();
                assert_eq!(
                    tree.newest_at_or_before_each(k.volume, &lbas, at).unwrap(),
                    want,
                    "as-of each {k:?}+{} {at}",
                    lbas.len()
                );
            }
            85..=95 => {
                tree.bosc().commit_cycle().unwrap();
            }
            _ => {
                if rng.below(2) == 0 {
                    disks.data.fail_after(rng.below(6));
                    let _ = tree.bosc().commit_cycle();
                }
                add(&tree, &mut totals);
                // Crash with the engine running; what its shutdown writes reaches no image.
                disks = disks.crash();
                drop(tree);
                let dropped;
                (tree, dropped) = disks.open_reporting(&c);
                tree.set_read_ahead(read_ahead);
                totals[4] += dropped;
                crashes += 1;
                check_all(&tree, &o);
            }
        }
    }
    tree.bosc().commit_all().unwrap();
    check_all(&tree, &o);
    add(&tree, &mut totals);
    drop(tree);
    let disks = disks.crash();
    let tree = disks.open(&c);
    check_all(&tree, &o);
    assert_eq!(tree.bosc().pending_modifications(), 0);
    assert!(crashes > 0);
    assert!(tree.leaf_count() > 4, "the tree split");
    totals
}

/// [`run`] over `seeds`, totals summed.
fn runs(
    seeds: std::ops::RangeInclusive<u64>,
    steps: usize,
    budget: usize,
    read_ahead: bool,
) -> [u64; 6] {
    seeds.fold([0; 6], |totals, seed| {
        let t = run(seed, steps, budget, read_ahead);
        std::array::from_fn(|i| totals[i] + t[i])
    })
}

fn t_insert(t: &BPlusTree, o: &mut BTreeMap<Key, u64>, k: Key, v: u64) {
    t.insert(k, v).unwrap();
    o.insert(k, v);
}

#[test]
fn btree_crashes_keep_every_acknowledged_operation() {
    let totals = runs(1..=6, 900, 1 << 20, true);
    assert!(totals[0] > 0, "some splits needed no I/O: {totals:?}");
    assert!(
        totals[4] > 0,
        "recovery dropped new leaves the disk had already: {totals:?}"
    );
}

/// The same under a tight budget with batches reading nearly full leaves ahead: every
/// operation still checked against the oracle, across crashes, while splits take the copies
/// the reads ahead left (whenever they arrive before the leaf fills up).
#[test]
fn btree_tight_budget_reads_ahead() {
    let totals = runs(30..=32, 700, 4096, true);
    assert!(
        totals[5] > 0,
        "nearly full leaves were read ahead: {totals:?}"
    );
    assert!(totals[2] > 0, "splits took the copies: {totals:?}");
}

#[test]
fn btree_tight_budget_splits_with_reads() {
    let totals = runs(20..=22, 700, 4096, false);
    assert!(
        totals[1] > 0,
        "uncached full leaves were read to split: {totals:?}"
    );
    assert!(
        totals[2] > 0,
        "some leaves were split from the copy a commit kept: {totals:?}"
    );
}

#[test]
fn half_done_split_is_repaired_at_open() {
    let c = cfg(1 << 20);
    let disks = Disks::new::<LeafApp>(77, &c, 4 << 20, LOG_ID);
    let tree = disks.open(&c);
    // Below the split threshold (3/4 of a leaf): one leaf.
    let cap = tree.leaf_capacity() as u64 * 3 / 4 - 1;
    for lba in 0..cap {
        tree.insert(Key::new(1, lba, 0), lba).unwrap();
    }
    tree.bosc().commit_all().unwrap();
    assert_eq!(tree.leaf_count(), 1);
    drop(tree);
    // Do by hand what a split does, and stop between the two halves: the new leaf exists,
    // the old one still holds the moved records.
    let bosc = open_engine(&disks, &c);
    let upper: Vec<_> = (cap / 2..cap).map(|l| (Key::new(1, l, 0), l)).collect();
    let payload = mariner_bosc::btree::leaf_payload(bosc.payload_bytes(), upper[0].0, &upper);
    bosc.write(BLOCKS - 1, &payload).unwrap();
    drop(bosc);
    let tree = disks.crash().open(&c);
    assert_eq!(tree.stats().leaves_repaired.load(Ordering::Relaxed), 1);
    assert_eq!(tree.leaf_count(), 2);
    let all = tree.range(Key::MIN, Key::new(2, 0, 0)).unwrap();
    assert_eq!(all.len() as u64, cap);
    tree.insert(Key::new(1, 0, 5), 99).unwrap();
    assert_eq!(tree.newest_at_or_before(1, 0, 100).unwrap(), Some((5, 99)));
    assert_eq!(tree.newest_at_or_before(1, 0, 4).unwrap(), Some((0, 0)));
    assert_eq!(tree.newest_at_or_before(1, cap, 4).unwrap(), None);
}

fn open_engine(disks: &Disks, c: &BoscConfig) -> Bosc<LeafApp> {
    disks
        .open_own_log(Arc::clone(&disks.log_disk), c, LeafApp, LOG_ID, 9)
        .0
}

/// A sorted bulk load, then batches of inserts (several per leaf, splits of leaves the batch
/// already touched), commit cycles and crashes against the oracle.
#[test]
fn bulk_load_then_batches_survive_crashes() {
    let c = cfg(1 << 20);
    let mut disks = Disks::new::<LeafApp>(5, &c, 4 << 20, LOG_ID);
    let recs: Vec<_> = (0..600u64)
        .map(|i| (Key::new((i / 200) as u32, (i % 200) * 4, 10), i))
        .collect();
    let mut o: BTreeMap<Key, u64> = recs.iter().copied().collect();
    let tree = BPlusTree::bulk_load(open_engine(&disks, &c), None, 10, recs).unwrap();
    // 512-byte blocks hold 16 records; 10 per leaf.
    assert_eq!(tree.leaf_count(), 60);
    assert_eq!(tree.bosc().pending_modifications(), 0);
    check_all(&tree, &o);
    // The load is durable on its own: no log record describes it.
    disks = disks.crash();
    drop(tree);
    let mut tree = disks.open(&c);
    assert_eq!(tree.leaf_count(), 60);
    check_all(&tree, &o);
    let mut rng = Rng(0xB01C);
    let mut step = 1000;
    for round in 0..24 {
        let n = rng.below(40) + 1;
        let batch: Vec<_> = (0..n)
            .map(|_| {
                step += 1;
                (key(&mut rng), step)
            })
            .collect();
        // Some batches are logged in parts: a part is queued before the next is prepared.
        tree.set_log_parts(1 + round % 4);
        tree.insert_batch(&batch).unwrap();
        o.extend(batch);
        if round % 3 == 0 {
            tree.bosc().commit_cycle().unwrap();
        }
        if round % 5 == 4 {
            disks = disks.crash();
            drop(tree);
            tree = disks.open(&c);
            check_all(&tree, &o);
        }
    }
    check_all(&tree, &o);
    let s = tree.stats();
    assert!(
        s.splits_in_memory.load(Ordering::Relaxed) + s.splits_with_read.load(Ordering::Relaxed) > 0
    );
}

/// Batches logged in parts: the leaves a batch will split are read ahead before it starts,
/// and a part handed to the log may carry puts to a leaf that a later part of the batch
/// splits. The split must see them: the copies read ahead take each part in as it goes.
#[test]
fn batches_logged_in_parts_split_from_current_copies() {
    // A budget that holds a few leaves: at a reopen, the leaves are on disk only.
    let c = cfg(4096);
    let mut disks = Disks::new::<LeafApp>(11, &c, 4 << 20, LOG_ID);
    let key_of = |i: u64| Key::new((i / 200) as u32, (i % 200) * 4, 10);
    let recs: Vec<_> = (0..600u64).map(|i| (key_of(i), i)).collect();
    let mut o: BTreeMap<Key, u64> = recs.iter().copied().collect();
    // 10 of 16 records a leaf; a leaf splits once it holds 12 and is in memory.
    let mut tree = BPlusTree::bulk_load(open_engine(&disks, &c), None, 10, recs).unwrap();
    let mut rng = Rng(0x9A27);
    let (mut step, mut prefetched) = (1000, 0);
    let (mut split_in_one, mut logged_in_parts) = (false, false);
    for round in 0..24u64 {
        let parts = 1 + round % 4;
        tree.set_log_parts(parts as usize);
        // Eight puts next to each of three loaded records, in random order.
        let mut batch: Vec<(Key, u64)> = Vec::new();
        for _ in 0..3 {
            let near = key_of(rng.below(600));
            for j in 0..8 {
                step += 1;
                batch.push((Key::new(near.volume, near.lba + 1, round * 10 + j), step));
            }
        }
        for i in (1..batch.len()).rev() {
            batch.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let writes = |t: &BPlusTree| {
            t.bosc()
                .log_stats()
                .unwrap()
                .batches
                .load(Ordering::Relaxed)
        };
        let (before, splits_before) = (writes(&tree), tree.leaf_count());
        tree.insert_batch(&batch).unwrap();
        // One log write a part, whatever the splits add to the batch.
        assert_eq!(writes(&tree) - before, parts, "round {round}");
        split_in_one |= parts == 1 && tree.leaf_count() > splits_before;
        logged_in_parts |= parts > 1;
        o.extend(batch);
        check_all(&tree, &o);
        // Reopened, every leaf is on disk only again: the next batch reads its leaves ahead.
        prefetched += tree.stats().leaves_prefetched.load(Ordering::Relaxed);
        disks = disks.crash();
        drop(tree);
        tree = disks.open(&c);
        check_all(&tree, &o);
    }
    assert!(prefetched > 0, "leaves were read ahead for splits");
    assert!(split_in_one && logged_in_parts);
}

#[test]
fn bulk_load_refuses_unsorted_keys_and_a_used_engine() {
    let c = cfg(1 << 20);
    let disks = Disks::new::<LeafApp>(6, &c, 4 << 20, LOG_ID);
    let unsorted = [(Key::new(1, 5, 0), 1), (Key::new(1, 5, 0), 2)];
    assert!(BPlusTree::bulk_load(open_engine(&disks, &c), None, 10, unsorted).is_err());
    // The refused load wrote nothing: an engine that was modified cannot be loaded.
    let tree = disks.open(&c);
    tree.insert(Key::new(1, 1, 1), 1).unwrap();
    drop(tree);
    let bosc = open_engine(&disks, &c);
    let one = [(Key::new(2, 0, 0), 7)];
    assert!(matches!(
        BPlusTree::bulk_load(bosc, None, 10, one),
        Err(mariner_bosc::Error::Config(_))
    ));
}

/// A block with the leaf magic that the tree could not have written makes open refuse the
/// disk: records out of order or below the fence would break the record counts a split
/// relies on (the `bosc_btree` fuzz target found a leaf overflow panic from one).
#[test]
fn open_refuses_malformed_leaves() {
    let c = cfg(1 << 20);
    let payload = 512 - mariner_bosc::format::BLOCK_HEADER_LEN;
    let k = |lba| Key::new(0, lba, 1);
    let cases = [
        ("out of order", Key::MIN, vec![(k(8), 1), (k(4), 2)]),
        ("below its fence", k(6), vec![(k(4), 1), (k(8), 2)]),
        ("out of order", Key::MIN, vec![(k(4), 1), (k(4), 2)]),
    ];
    for (i, (why, fence, records)) in cases.into_iter().enumerate() {
        let disks = Disks::new::<LeafApp>(40 + i as u64, &c, 1 << 20, LOG_ID);
        let bosc = open_engine(&disks, &c);
        bosc.write(0, &leaf_payload(payload, Key::MIN, &[]))
            .unwrap();
        bosc.write(1, &leaf_payload(payload, fence, &records))
            .unwrap();
        match BPlusTree::open(bosc, None) {
            Err(mariner_bosc::Error::Index(msg)) => assert!(msg.contains(why), "{msg}"),
            Err(e) => panic!("{why}: {e}"),
            Ok(_) => panic!("{why}: opened"),
        }
    }
    // The input the fuzz target found, through its entry point: no panic.
    mariner_bosc::fuzzing::fuzz_btree(include_bytes!(
        "../../../fuzz/corpus/bosc_btree/unsorted_leaf"
    ));
}
