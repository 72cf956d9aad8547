//! A B+tree on BOSC (lu-dissertation §3.3), shaped for the CDP version index:
//! (volume, LBA, timestamp) → log location.
//!
//! - Leaves are BOSC blocks; inserts, updates and deletes are BOSC modifications applied by
//!   [`LeafApp`] (the first part of the seed's two-part commit function). Queries go through
//!   [`Bosc::query`], so they see queued modifications (§3.2.4).
//! - Internal nodes live in memory as a `BTreeMap` from each leaf's low fence key to the leaf.
//!   They are **rebuilt at open by scanning the leaves**: every leaf carries its low fence, so the
//!   leaves alone define the tree and a split needs no second durable structure to stay
//!   consistent with. The cost is one sequential read of the index at open (and the exact
//!   record counts come for free); persisting the fences in a directory of BOSC blocks would cut
//!   that to ~0.15% of the index and is the next step for indexes far larger than memory.
//! - The second part of the commit function runs when a modification is queued: the tree keeps
//!   an upper bound of each leaf's record count (a blind insert may be an update) and splits
//!   proactively once it passes `split_threshold`. When the leaf's image is in memory (always
//!   so for leaves created by a split until the commit cycle evicts them, since BOSC keeps the
//!   image of a whole-block write), the split costs no I/O. Otherwise it is deferred, as in the
//!   seed, until the bound reaches the leaf's capacity, and then the split reads the leaf.
//!
//! Split, in log order: (1) whole-block write of the new leaf with fence F and the upper half —
//! the commit point: from here the scan at open routes keys ≥ F to it; (2) `KeepBelow(F)` on the
//! old leaf. A crash between (1) and (2) leaves stale copies ≥ F in the old leaf; they are never
//! routed to, and open removes them. Leaves are never merged; deletes leave room in place.
//!
//! Leaf payload (little-endian): magic `b"BTLF"` u32, record count u32, low fence key (20 B),
//! then sorted records of key (20 B: volume u32, lba u64, timestamp u64) + value u64.
//!
//! Durability: own-log mode. [`BPlusTree::insert`] is durable when it returns;
//! [`BPlusTree::insert_batch`] makes a whole batch durable with one group commit of the log
//! (splits included, in log order), the durability of a transaction committed every batch.
//! Caller-durable mode (the CDP index proper) additionally needs durable records for the
//! split's structural modifications, which have no caller record: the new leaf's contents
//! exist nowhere else.
//!
//! [`BPlusTree::bulk_load`] builds a tree from sorted records straight onto a fresh disk.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use crate::engine::Submitted;
use crate::{BlockApp, Bosc, Change, Error, Op};

/// A version-index key. Ordered by volume, then LBA, then timestamp, so the versions of one
/// block are adjacent and "newest at or before T" is a predecessor search.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Key {
    pub volume: u32,
    pub lba: u64,
    pub timestamp: u64,
}

impl Key {
    pub const ENCODED_LEN: usize = 20;
    pub const MIN: Key = Key {
        volume: 0,
        lba: 0,
        timestamp: 0,
    };

    pub fn new(volume: u32, lba: u64, timestamp: u64) -> Self {
        Self {
            volume,
            lba,
            timestamp,
        }
    }

    pub fn encode(&self, out: &mut [u8]) {
        out[0..4].copy_from_slice(&self.volume.to_le_bytes());
        out[4..12].copy_from_slice(&self.lba.to_le_bytes());
        out[12..20].copy_from_slice(&self.timestamp.to_le_bytes());
    }

    pub fn decode(b: &[u8]) -> Self {
        Self {
            volume: u32_at(b, 0),
            lba: u64_at(b, 4),
            timestamp: u64_at(b, 12),
        }
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

pub const LEAF_MAGIC: [u8; 4] = *b"BTLF";
pub const LEAF_HEADER_LEN: usize = 8 + Key::ENCODED_LEN;
pub const RECORD_LEN: usize = Key::ENCODED_LEN + 8;
const _: () = assert!(LEAF_HEADER_LEN == 28 && RECORD_LEN == 28);

const TAG_PUT: u8 = 1;
const TAG_DELETE: u8 = 2;
const TAG_KEEP_BELOW: u8 = 3;

/// Records a leaf payload of `payload_bytes` holds.
pub fn leaf_capacity(payload_bytes: usize) -> usize {
    payload_bytes.saturating_sub(LEAF_HEADER_LEN) / RECORD_LEN
}

/// Read access to a leaf payload.
struct LeafView<'a>(&'a [u8]);

impl LeafView<'_> {
    fn is_leaf(&self) -> bool {
        self.0.len() >= LEAF_HEADER_LEN && self.0[0..4] == LEAF_MAGIC
    }
    fn count(&self) -> usize {
        u32_at(self.0, 4) as usize
    }
    fn fence(&self) -> Key {
        Key::decode(&self.0[8..28])
    }
    fn key(&self, i: usize) -> Key {
        let at = LEAF_HEADER_LEN + i * RECORD_LEN;
        Key::decode(&self.0[at..at + Key::ENCODED_LEN])
    }
    fn value(&self, i: usize) -> u64 {
        u64_at(self.0, LEAF_HEADER_LEN + i * RECORD_LEN + Key::ENCODED_LEN)
    }
    /// `Ok(i)`: record i has the key; `Err(i)`: it would go at i.
    fn search(&self, key: &Key) -> Result<usize, usize> {
        let (mut lo, mut hi) = (0, self.count());
        while lo < hi {
            let mid = (lo + hi) / 2;
            match self.key(mid).cmp(key) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Ok(mid),
            }
        }
        Err(lo)
    }
    /// What makes a block with the leaf magic no leaf the tree could have written: more
    /// records than fit, records out of order, or below the fence. The tree's record counts
    /// and searches rely on neither happening.
    fn malformed(&self, capacity: usize) -> Option<String> {
        let n = self.count();
        if n > capacity {
            return Some(format!(
                "a leaf of {n} records, more than the {capacity} it holds"
            ));
        }
        if n > 0 && self.key(0) < self.fence() {
            return Some("a leaf record below its fence".into());
        }
        (1..n)
            .any(|i| self.key(i - 1) >= self.key(i))
            .then(|| "leaf records out of order".into())
    }
    /// Records with keys in `[from, to)`.
    fn records(&self, from: Key, to: Option<Key>) -> Vec<(Key, u64)> {
        let start = self.search(&from).unwrap_or_else(|i| i);
        (start..self.count())
            .map(|i| (self.key(i), self.value(i)))
            .take_while(|(k, _)| to.is_none_or(|t| *k < t))
            .collect()
    }
}

/// Builds a leaf payload.
pub fn leaf_payload(payload_bytes: usize, fence: Key, records: &[(Key, u64)]) -> Vec<u8> {
    assert!(records.len() <= leaf_capacity(payload_bytes));
    let mut p = vec![0u8; payload_bytes];
    p[0..4].copy_from_slice(&LEAF_MAGIC);
    p[4..8].copy_from_slice(&(records.len() as u32).to_le_bytes());
    fence.encode(&mut p[8..28]);
    for (i, (k, v)) in records.iter().enumerate() {
        let at = LEAF_HEADER_LEN + i * RECORD_LEN;
        k.encode(&mut p[at..at + Key::ENCODED_LEN]);
        p[at + Key::ENCODED_LEN..at + RECORD_LEN].copy_from_slice(&v.to_le_bytes());
    }
    p
}

/// A staged change applied to a leaf's payload in memory, as the engine would apply it.
fn apply_change(p: &mut [u8], c: &Change) {
    match c.op {
        Op::Write => {
            p.fill(0);
            p[..c.bytes.len()].copy_from_slice(&c.bytes);
        }
        Op::App => LeafApp.apply(c.block, p, &c.bytes),
    }
}

fn set_count(p: &mut [u8], n: usize) {
    p[4..8].copy_from_slice(&(n as u32).to_le_bytes());
}

fn encode_mod(tag: u8, key: Key, value: u64) -> Vec<u8> {
    let mut m = vec![0u8; 1 + RECORD_LEN];
    m[0] = tag;
    key.encode(&mut m[1..21]);
    m[21..29].copy_from_slice(&value.to_le_bytes());
    m
}

/// The leaf's commit function (part one): applies a put, delete or split truncation.
pub struct LeafApp;

impl BlockApp for LeafApp {
    fn apply(&self, _block: u64, p: &mut [u8], m: &[u8]) {
        if m.len() != 1 + RECORD_LEN || !LeafView(p).is_leaf() {
            // The tree only modifies blocks it wrote as leaves first; anything else is a bug.
            panic!("B+tree modification of a non-leaf or malformed modification");
        }
        let key = Key::decode(&m[1..21]);
        let view = LeafView(p);
        let (count, found) = (view.count(), view.search(&key));
        let at = |i: usize| LEAF_HEADER_LEN + i * RECORD_LEN;
        match (m[0], found) {
            (TAG_PUT, Ok(i)) => p[at(i) + 20..at(i) + 28].copy_from_slice(&m[21..29]),
            (TAG_PUT, Err(i)) => {
                assert!(count < leaf_capacity(p.len()), "leaf overflow");
                p.copy_within(at(i)..at(count), at(i + 1));
                p[at(i)..at(i + 1)].copy_from_slice(&m[1..29]);
                set_count(p, count + 1);
            }
            (TAG_DELETE, Ok(i)) => {
                p.copy_within(at(i + 1)..at(count), at(i));
                p[at(count - 1)..at(count)].fill(0);
                set_count(p, count - 1);
            }
            (TAG_DELETE, Err(_)) => {}
            (TAG_KEEP_BELOW, found) => {
                let keep = found.unwrap_or_else(|i| i);
                p[at(keep)..at(count)].fill(0);
                set_count(p, keep);
            }
            _ => panic!("unknown B+tree modification tag {}", m[0]),
        }
    }

    /// A leaf the commit cycle finds within a sixteenth of full is kept in memory, and the
    /// tree splits it at its next batch ([`BPlusTree::insert_batch`]) without reading it: the
    /// seed's proactive split (§3.3), where the second part of the commit function splits a
    /// leaf the first part filled. Otherwise a leaf that fills up on disk is read again to
    /// split. Not from the split threshold (3/4 by default): splitting every leaf the commit
    /// finds above it halves leaves at 3/4 full, and the index benchmark then wrote 23 % more
    /// blocks per update and its inserts were 8 % slower (docs/benchmarks.md).
    fn hot(&self, _block: u64, p: &[u8]) -> bool {
        let v = LeafView(p);
        v.is_leaf() && v.count() >= hot_at(leaf_capacity(p.len()))
    }
}

/// Records from which a leaf is nearly full: kept in memory by a commit that finds it so
/// ([`LeafApp::hot`]), read ahead by a batch that brings it there ([`BPlusTree::insert_batch`]).
fn hot_at(capacity: usize) -> usize {
    capacity - capacity / 16
}

/// A leaf splits at 3/4 of its capacity unless the tree is opened with another threshold.
fn default_split_threshold(capacity: usize) -> usize {
    capacity * 3 / 4
}

/// Counters.
#[derive(Debug, Default)]
pub struct TreeStats {
    /// Proactive splits of a leaf whose image was in memory: no I/O.
    pub splits_in_memory: AtomicU64,
    /// Splits that had to read the leaf (deferred until the leaf was full).
    pub splits_with_read: AtomicU64,
    /// Leaves cleaned at open after a crash between the two halves of a split.
    pub leaves_repaired: AtomicU64,
    /// Leaves read for a split whose exact count showed no need (the count's upper bound had
    /// grown by updates of present keys).
    pub counts_refreshed: AtomicU64,
    /// Leaves read ahead, concurrently, for the splits of a batch.
    pub leaves_prefetched: AtomicU64,
    /// Microseconds batches waited for their reads ahead.
    pub prefetch_us: AtomicU64,
    /// Splits of a leaf the commit cycle found due ([`LeafApp::hot`]) or a batch read ahead,
    /// from the copy the engine kept: no I/O on the way.
    pub splits_hot: AtomicU64,
    /// Nearly full leaves read ahead, off the batches' path.
    pub leaves_read_ahead: AtomicU64,
}

/// A leaf as the router holds it: 8 bytes (the tree's blocks are numbered in 32 bits,
/// checked at open).
#[derive(Debug, Clone, Copy)]
struct Leaf {
    block: u32,
    /// Upper bound of the leaf's record count.
    records_max: u32,
}

impl Leaf {
    fn new(block: u64, records_max: usize) -> Self {
        Self {
            block: block as u32,
            records_max: u32::try_from(records_max).unwrap_or(u32::MAX),
        }
    }

    fn block(&self) -> u64 {
        u64::from(self.block)
    }

    fn records_max(&self) -> usize {
        self.records_max as usize
    }

    fn set_records_max(&mut self, n: usize) {
        self.records_max = u32::try_from(n).unwrap_or(u32::MAX);
    }
}

/// A key as the router holds it: 20 bytes where a [`Key`] takes 24 (packed to 4-byte
/// alignment), compared as three integers. With 8-byte [`Leaf`]s, a router entry is 28 bytes
/// instead of 40: the internal nodes take 30 % less of the memory budget they share with the
/// engine's queues.
#[derive(Debug, Clone, Copy)]
#[repr(C, packed(4))]
struct Fence {
    /// Volume, then the LBA's high half.
    hi: u64,
    /// The LBA's low half, then the timestamp's high half.
    mid: u64,
    /// The timestamp's low half.
    lo: u32,
}

impl From<Key> for Fence {
    fn from(k: Key) -> Self {
        Fence {
            hi: u64::from(k.volume) << 32 | k.lba >> 32,
            mid: k.lba << 32 | k.timestamp >> 32,
            lo: k.timestamp as u32,
        }
    }
}

impl Fence {
    fn key(&self) -> Key {
        let (hi, mid, lo) = self.parts();
        Key::new(
            (hi >> 32) as u32,
            hi << 32 | mid >> 32,
            mid << 32 | u64::from(lo),
        )
    }

    /// The fields by value (a packed field cannot be borrowed).
    fn parts(&self) -> (u64, u64, u32) {
        (self.hi, self.mid, self.lo)
    }
}

impl PartialEq for Fence {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for Fence {}

impl PartialOrd for Fence {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Fence {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.parts().cmp(&other.parts())
    }
}

const _: () = assert!(std::mem::size_of::<Fence>() == 20 && std::mem::size_of::<Leaf>() == 8);

/// The most blocks a B+tree's engine may have ([`Leaf::block`] is 32 bits).
const MAX_BLOCKS: u64 = 1 << 32;

struct Router {
    /// Low fence → leaf: the in-memory internal nodes.
    leaves: BTreeMap<Fence, Leaf>,
    /// Unused blocks.
    free: FreeBlocks,
    /// Set when a batch failed after the router already routed to its new leaves: the tree in
    /// memory no longer matches what is durable, so every later operation fails.
    failed: Option<String>,
}

/// Unused blocks as runs `[start, end)`, highest first: allocation takes the lowest block.
/// A run costs 16 bytes however long, so a mostly empty disk costs next to nothing.
#[derive(Debug, Default)]
struct FreeBlocks {
    runs: Vec<(u64, u64)>,
}

impl FreeBlocks {
    /// From free runs `[start, end)` in ascending order, as a scan finds them.
    fn from_ascending(mut runs: Vec<(u64, u64)>) -> Self {
        runs.retain(|r| r.0 < r.1);
        runs.reverse();
        Self { runs }
    }

    fn pop(&mut self) -> Option<u64> {
        let run = self.runs.last_mut()?;
        let block = run.0;
        run.0 += 1;
        if run.0 == run.1 {
            self.runs.pop();
        }
        Some(block)
    }
}

/// Changes staged for one group commit, and the blocks they touch.
#[derive(Default)]
struct Staged {
    changes: Vec<Change>,
    touched: HashSet<u64>,
    /// Payloads of leaves the batch will split, read ahead concurrently (as before the batch).
    prefetched: HashMap<u64, Vec<u8>>,
    /// Low fences of the leaves the batch split.
    split: HashSet<Key>,
}

impl Staged {
    fn push(&mut self, change: Change) {
        self.touched.insert(change.block);
        self.changes.push(change);
    }
}

impl Router {
    fn check(&self) -> Result<(), Error> {
        match &self.failed {
            Some(why) => Err(Error::Failed(why.clone())),
            None => Ok(()),
        }
    }

    fn leaf_for(&self, key: Key) -> Result<(Key, Leaf), Error> {
        // Open guarantees a leaf with fence Key::MIN.
        let (f, l) = self
            .leaves
            .range(..=Fence::from(key))
            .next_back()
            .ok_or_else(|| Error::Index("no leaf has the lowest fence".into()))?;
        Ok((f.key(), *l))
    }

    fn next_fence(&self, fence: Key) -> Option<Key> {
        self.leaves
            .range((Bound::Excluded(Fence::from(fence)), Bound::Unbounded))
            .next()
            .map(|(k, _)| k.key())
    }

    fn get(&self, fence: Key) -> Option<Leaf> {
        self.leaves.get(&Fence::from(fence)).copied()
    }

    fn get_mut(&mut self, fence: Key) -> Option<&mut Leaf> {
        self.leaves.get_mut(&Fence::from(fence))
    }

    fn insert(&mut self, fence: Key, leaf: Leaf) -> Option<Leaf> {
        self.leaves.insert(Fence::from(fence), leaf)
    }
}

/// Threads reading leaves for the splits of a batch ([`BPlusTree::prefetch`]), started at the
/// first such batch and kept: spawning eight threads per batch (a stack mapped and unmapped
/// each) cost more CPU than the reads.
#[derive(Default)]
struct Readers {
    jobs: Mutex<Option<mpsc::Sender<ReadJob>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// A leaf to read and where to send its payload; with no one to send it to, a read ahead
/// that the engine keeps for [`Bosc::take_hot`].
struct ReadJob {
    block: u64,
    reply: Option<LeafReply>,
}

/// Where a reader sends a leaf's payload.
type LeafReply = mpsc::Sender<(u64, Result<Vec<u8>, Error>)>;

impl Readers {
    /// Reads at most this many leaves at once.
    const THREADS: usize = 8;

    fn send(
        &self,
        bosc: &Arc<Bosc<LeafApp>>,
        block: u64,
        reply: Option<LeafReply>,
    ) -> Result<(), Error> {
        let mut jobs = self.jobs.lock().unwrap_or_else(PoisonError::into_inner);
        if jobs.is_none() {
            let (tx, rx) = mpsc::channel::<ReadJob>();
            let rx = Arc::new(Mutex::new(rx));
            let mut threads = self.threads.lock().unwrap_or_else(PoisonError::into_inner);
            for i in 0..Self::THREADS {
                let (rx, bosc) = (Arc::clone(&rx), Arc::clone(bosc));
                let spawned = std::thread::Builder::new()
                    .name(format!("btree-read{i}"))
                    .spawn(move || loop {
                        let job = rx.lock().unwrap_or_else(PoisonError::into_inner).recv();
                        let Ok(job) = job else { return };
                        match job.reply {
                            Some(reply) => {
                                let payload = bosc.query(job.block, <[u8]>::to_vec);
                                let _ = reply.send((job.block, payload));
                            }
                            // A failed read ahead leaves the split to read the leaf itself,
                            // and to report the error.
                            None => drop(bosc.read_hot(job.block)),
                        }
                    });
                threads.push(spawned.map_err(|e| Error::Failed(format!("leaf reader: {e}")))?);
            }
            *jobs = Some(tx);
        }
        jobs.as_ref()
            .and_then(|tx| tx.send(ReadJob { block, reply }).ok())
            .ok_or_else(|| Error::Failed("the leaf readers stopped".into()))
    }
}

impl Drop for Readers {
    fn drop(&mut self) {
        // Closing the queue ends every thread once it has no job left.
        self.jobs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let threads =
            std::mem::take(&mut *self.threads.lock().unwrap_or_else(PoisonError::into_inner));
        for t in threads {
            let _ = t.join();
        }
    }
}

/// The B+tree. One lock serialises the tree's operations (the seed locks per leaf; the BOSC
/// calls under it are short, since modifications are only logged and queued).
pub struct BPlusTree {
    /// Declared first, so dropped first: the readers' threads end before the engine does.
    readers: Readers,
    bosc: Arc<Bosc<LeafApp>>,
    router: Mutex<Router>,
    capacity: usize,
    split_threshold: usize,
    /// Whether batches read nearly full leaves ahead ([`BPlusTree::set_read_ahead`]).
    read_ahead: AtomicBool,
    /// Parts a batch is logged in ([`BPlusTree::set_log_parts`]).
    log_parts: AtomicUsize,
    stats: TreeStats,
}

fn lock(m: &Mutex<Router>) -> MutexGuard<'_, Router> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A leaf found at open: 48 bytes, so that the list of a large tree's leaves stays small
/// beside the router it becomes.
struct Scanned {
    fence: Fence,
    /// Its largest key; the fence if it has none (then nothing is at or above the next fence).
    max_key: Fence,
    leaf: Leaf,
}

impl BPlusTree {
    /// Rebuilds the internal nodes from the leaves of an opened (recovered) engine, repairs
    /// half-done splits, and creates the root leaf of an empty tree. `split_threshold` is in
    /// records; `None` takes 3/4 of a leaf's capacity.
    pub fn open(bosc: Bosc<LeafApp>, split_threshold: Option<usize>) -> Result<Self, Error> {
        let capacity = Self::check_engine(&bosc)?;
        let mut scanned = Vec::new();
        let mut free = Vec::new();
        let mut next_free = 0;
        bosc.scan(0, bosc.block_count(), |block, p| {
            let v = LeafView(p);
            if v.is_leaf() {
                if let Some(why) = v.malformed(capacity) {
                    return Err(Error::Index(format!("block {block}: {why}")));
                }
                if next_free < block {
                    free.push((next_free, block));
                }
                next_free = block + 1;
                let fence = v.fence();
                scanned.push(Scanned {
                    fence: Fence::from(fence),
                    max_key: Fence::from(v.count().checked_sub(1).map_or(fence, |i| v.key(i))),
                    leaf: Leaf::new(block, v.count()),
                });
            }
            Ok(())
        })?;
        free.push((next_free, bosc.block_count()));
        let free = FreeBlocks::from_ascending(free);
        let tree = Self::assemble(bosc, capacity, split_threshold, BTreeMap::new(), free);
        tree.install(scanned)?;
        Ok(tree)
    }

    /// The capacity of the engine's leaves; refuses leaves too small and engines with more
    /// blocks than a [`Leaf`] can number.
    fn check_engine(bosc: &Bosc<LeafApp>) -> Result<usize, Error> {
        let capacity = leaf_capacity(bosc.payload_bytes());
        if capacity < 4 {
            return Err(Error::Config(
                "B+tree leaves need room for 4 records".into(),
            ));
        }
        if bosc.block_count() > MAX_BLOCKS {
            return Err(Error::Config(format!(
                "a B+tree engine has at most {MAX_BLOCKS} blocks"
            )));
        }
        Ok(capacity)
    }

    fn assemble(
        bosc: Bosc<LeafApp>,
        capacity: usize,
        split_threshold: Option<usize>,
        leaves: BTreeMap<Fence, Leaf>,
        free: FreeBlocks,
    ) -> Self {
        Self {
            bosc: Arc::new(bosc),
            readers: Readers::default(),
            router: Mutex::new(Router {
                leaves,
                free,
                failed: None,
            }),
            capacity,
            split_threshold: split_threshold
                .unwrap_or(default_split_threshold(capacity))
                .clamp(2, capacity),
            read_ahead: AtomicBool::new(true),
            log_parts: AtomicUsize::new(1),
            stats: TreeStats::default(),
        }
    }

    /// Builds the router from the leaves found at open, in fence order (a sorted build packs
    /// the map's nodes full), and finishes the splits a crash left half done: a leaf holding
    /// keys at or above the next leaf's fence keeps only those below it.
    fn install(&self, mut scanned: Vec<Scanned>) -> Result<(), Error> {
        let mut r = lock(&self.router);
        if scanned.is_empty() {
            let root = r.free.pop().ok_or(Error::Index("no blocks".into()))?;
            let payload = leaf_payload(self.bosc.payload_bytes(), Key::MIN, &[]);
            self.bosc.write(root, &payload)?;
            r.insert(Key::MIN, Leaf::new(root, 0));
            return Ok(());
        }
        scanned.sort_unstable_by_key(|s| s.fence);
        if let Some(w) = scanned.windows(2).find(|w| w[0].fence == w[1].fence) {
            return Err(Error::Index(format!(
                "two leaves with fence {:?}",
                w[0].fence.key()
            )));
        }
        if scanned[0].fence != Fence::from(Key::MIN) {
            return Err(Error::Index("no leaf has the lowest fence".into()));
        }
        let mut torn = Vec::new();
        for w in scanned.windows(2) {
            if w[0].max_key >= w[1].fence {
                torn.push((w[0].fence.key(), w[0].leaf.block(), w[1].fence.key()));
            }
        }
        r.leaves = scanned.into_iter().map(|s| (s.fence, s.leaf)).collect();
        for (fence, block, hi) in torn {
            self.bosc
                .modify(block, &encode_mod(TAG_KEEP_BELOW, hi, 0))?;
            let n = self.bosc.query(block, |p| LeafView(p).count())?;
            if let Some(l) = r.get_mut(fence) {
                l.set_records_max(n);
            }
            self.stats.leaves_repaired.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Builds a tree on a freshly formatted, never modified engine from records in strictly
    /// increasing key order: leaves of `fill` records (clamped to the capacity) written in
    /// sequence with [`Bosc::load`] — no log, no queues — and the internal nodes built in
    /// memory, as [`BPlusTree::open`] would rebuild them. Set-up for imports and benchmarks (the
    /// seed's fast initialisation, §3.4.1); a crash during it leaves a disk to format again.
    pub fn bulk_load(
        bosc: Bosc<LeafApp>,
        split_threshold: Option<usize>,
        fill: usize,
        records: impl IntoIterator<Item = (Key, u64)>,
    ) -> Result<Self, Error> {
        let capacity = Self::check_engine(&bosc)?;
        let mut loader = BulkLoader::new(&bosc, fill.clamp(1, capacity));
        for (key, value) in records {
            loader.push(key, value)?;
        }
        let leaves = loader.finish()?;
        let used = leaves.len() as u64;
        let free = FreeBlocks::from_ascending(vec![(used, bosc.block_count())]);
        let leaves = leaves
            .into_iter()
            .map(|(k, l)| (Fence::from(k), l))
            .collect();
        let tree = Self::assemble(bosc, capacity, split_threshold, leaves, free);
        if used == 0 {
            tree.install(Vec::new())?;
        }
        Ok(tree)
    }

    /// Inserts or updates (blind: the leaf is not read).
    pub fn insert(&self, key: Key, value: u64) -> Result<(), Error> {
        self.insert_batch(&[(key, value)])
    }

    /// Inserts or updates many records with one group commit of the log: all are durable
    /// when it returns (the durability of a transaction committed every `records.len()`
    /// operations). Splits go into the same group, in log order before the puts they make
    /// room for; a split of a leaf the batch already touched reads the leaf and applies the
    /// batch's changes of it in memory.
    pub fn insert_batch(&self, records: &[(Key, u64)]) -> Result<(), Error> {
        let mut r = lock(&self.router);
        r.check()?;
        let mut staged = Staged::default();
        self.split_hot(&mut r, &mut staged)?;
        // Each record's leaf, looked up once: the routes stay valid but for leaves the batch
        // splits (`Staged::split`).
        let routes = records
            .iter()
            .map(|(key, _)| Ok(r.leaf_for(*key)?.0))
            .collect::<Result<Vec<Key>, Error>>()?;
        let started = std::time::Instant::now();
        staged.prefetched = self.prefetch(&r, &routes)?;
        self.stats
            .prefetch_us
            .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
        let mut ahead = Vec::new();
        let hot_at = hot_at(self.capacity);
        let chunk = self.chunk_len(records.len());
        let mut in_flight = None;
        for (i, (&(key, value), &route)) in records.iter().zip(&routes).enumerate() {
            let route = (!staged.split.contains(&route)).then_some(route);
            let (fence, block) = self.prepare(&mut r, key, route, &mut staged)?;
            staged.push(Change::modify(block, encode_mod(TAG_PUT, key, value)));
            if let Some(l) = r.get_mut(fence) {
                l.records_max = l.records_max.saturating_add(1);
                if l.records_max() == hot_at {
                    ahead.push(block);
                }
            }
            // Counted in records, not changes: splits add changes, and a batch of one part
            // must stay one log write.
            let done = i + 1;
            if done % chunk == 0 && done < records.len() {
                in_flight = Some(self.send(&mut r, &mut staged, in_flight)?);
            }
        }
        // Leaves this batch brought to nearly full are read ahead while it is logged, and
        // split (or their count refreshed) at a later batch from the copy ([`Self::split_hot`]),
        // before they fill up and a put must wait for the read.
        if !self.read_ahead.load(Ordering::Relaxed) {
            ahead.clear();
        }
        for block in ahead {
            if !self.bosc.cached(block) {
                self.readers.send(&self.bosc, block, None)?;
                self.stats.leaves_read_ahead.fetch_add(1, Ordering::Relaxed);
            }
        }
        // No split of this batch is left to read the copies: the last part need not update them.
        staged.prefetched.clear();
        let last = self.send(&mut r, &mut staged, in_flight)?;
        last.wait().map(drop).inspect_err(|e| {
            r.failed = Some(format!("a batch failed: {e}"));
        })
    }

    /// Records of a batch of `n` handed to the log at a time: the log writes one part while
    /// the next is prepared, and the batch waits for the last part's write alone.
    fn chunk_len(&self, n: usize) -> usize {
        n.div_ceil(self.log_parts.load(Ordering::Relaxed).max(1))
            .max(1)
    }

    /// Into how many parts a batch's records are logged (default 1: one log write per batch).
    /// With more, preparing part k+1 overlaps the log write of part k; a batch is durable when
    /// [`Self::insert_batch`] returns either way. Each part is a log write of its own, so parts
    /// of a few dozen records cost more than they overlap.
    pub fn set_log_parts(&self, parts: usize) {
        self.log_parts.store(parts.max(1), Ordering::Relaxed);
    }

    /// Hands the staged changes to the log (after `previous` is durable) and queues them:
    /// from here queries, and reads for later splits, find them in the engine, so the staged
    /// set starts empty and the copies read ahead take them in too.
    fn send<'a>(
        &'a self,
        r: &mut Router,
        staged: &mut Staged,
        previous: Option<Submitted<'a, LeafApp>>,
    ) -> Result<Submitted<'a, LeafApp>, Error> {
        staged.touched.clear();
        let changes = std::mem::take(&mut staged.changes);
        for c in &changes {
            if let Some(p) = staged.prefetched.get_mut(&c.block) {
                apply_change(p, c);
            }
        }
        self.bosc.submit_after(previous, changes).inspect_err(|e| {
            r.failed = Some(format!("a batch failed: {e}"));
        })
    }

    /// Splits the leaves the commit cycle found due ([`LeafApp::hot`]) from the copies it
    /// kept: no read. A leaf split or merged since is left for its next put to handle. The
    /// routes computed after this see the new leaves, so it leaves `staged.split` empty.
    fn split_hot(&self, r: &mut Router, staged: &mut Staged) -> Result<(), Error> {
        for (block, payload) in self.bosc.take_hot() {
            let v = LeafView(&payload);
            if !v.is_leaf() || r.get(v.fence()).is_none_or(|l| l.block() != block) {
                continue;
            }
            let fence = v.fence();
            staged.prefetched.insert(block, payload);
            self.split(r, fence, staged, true)?;
        }
        staged.split.clear();
        staged.prefetched.clear();
        Ok(())
    }

    /// Whether batches read the leaves they bring to nearly full ahead (on by default). Off,
    /// such a leaf is read when it fills up unless a commit found it nearly full first.
    pub fn set_read_ahead(&self, on: bool) {
        self.read_ahead.store(on, Ordering::Relaxed);
    }

    /// Deletes (blind: a missing key is not an error).
    pub fn delete(&self, key: Key) -> Result<(), Error> {
        let r = lock(&self.router);
        r.check()?;
        let (_, leaf) = r.leaf_for(key)?;
        self.bosc
            .modify(leaf.block(), &encode_mod(TAG_DELETE, key, 0))?;
        Ok(())
    }

    /// Reads, several at a time, the uncached leaves the batch's puts will fill: the splits
    /// then need no read of their own, and the reads overlap instead of each waiting for the
    /// disk in turn.
    fn prefetch(&self, r: &Router, routes: &[Key]) -> Result<HashMap<u64, Vec<u8>>, Error> {
        let mut puts: HashMap<Key, usize> = HashMap::new();
        for fence in routes {
            *puts.entry(*fence).or_default() += 1;
        }
        let blocks: Vec<u64> = puts
            .iter()
            .filter_map(|(fence, n)| r.get(*fence).map(|l| (l, n)))
            .filter(|(l, n)| l.records_max() + *n >= self.capacity && !self.bosc.cached(l.block()))
            .map(|(l, _)| l.block())
            .collect();
        if blocks.len() < 2 {
            return Ok(HashMap::new());
        }
        let (reply, replies) = mpsc::channel();
        for &block in &blocks {
            self.readers.send(&self.bosc, block, Some(reply.clone()))?;
        }
        drop(reply);
        let mut out = HashMap::with_capacity(blocks.len());
        for (block, payload) in replies {
            out.insert(block, payload?);
        }
        if out.len() < blocks.len() {
            return Err(Error::Failed("a leaf reader stopped".into()));
        }
        self.stats
            .leaves_prefetched
            .fetch_add(out.len() as u64, Ordering::Relaxed);
        Ok(out)
    }

    /// The second part of the commit function: split the target leaf first if it is due.
    /// `route` is the key's leaf if known still to be.
    fn prepare(
        &self,
        r: &mut Router,
        key: Key,
        route: Option<Key>,
        staged: &mut Staged,
    ) -> Result<(Key, u64), Error> {
        let mut route = route.and_then(|f| Some((f, r.get(f)?)));
        loop {
            let (fence, leaf) = match route.take() {
                Some(known) => known,
                None => r.leaf_for(key)?,
            };
            let full = leaf.records_max() >= self.capacity;
            let due = leaf.records_max() >= self.split_threshold && self.bosc.cached(leaf.block());
            if !(full || due) {
                return Ok((fence, leaf.block()));
            }
            if !self.split(r, fence, staged, false)? {
                let (fence, leaf) = r.leaf_for(key)?;
                return Ok((fence, leaf.block()));
            }
        }
    }

    /// Stages a split of the leaf at `fence` in two; `false` if its exact count showed no need.
    /// The leaf's records are what the engine has (durable and queued) with the batch's
    /// staged changes of the leaf applied on top.
    /// `hot`: the leaf's payload is the commit's copy in `staged.prefetched` ([`Self::split_hot`]).
    fn split(
        &self,
        r: &mut Router,
        fence: Key,
        staged: &mut Staged,
        hot: bool,
    ) -> Result<bool, Error> {
        let leaf = r
            .get(fence)
            .ok_or_else(|| Error::Index(format!("no leaf has fence {fence:?}")))?;
        let hi = r.next_fence(fence);
        let cached = self.bosc.cached(leaf.block());
        let ahead = staged.prefetched.remove(&leaf.block());
        let recs = if ahead.is_some() || staged.touched.contains(&leaf.block()) {
            let mine = staged.changes.iter().filter(|c| c.block == leaf.block());
            // A leaf the batch created is all in its staged write: nothing to read.
            let created = mine.clone().next().is_some_and(|c| c.op == Op::Write);
            let mut p = match ahead {
                _ if created => vec![0u8; self.bosc.payload_bytes()],
                Some(p) => p,
                None => self.bosc.query(leaf.block(), <[u8]>::to_vec)?,
            };
            for c in mine {
                apply_change(&mut p, c);
            }
            LeafView(&p).records(Key::MIN, hi)
        } else {
            self.bosc
                .query(leaf.block(), |p| LeafView(p).records(Key::MIN, hi))?
        };
        if recs.len() < self.split_threshold {
            if let Some(l) = r.get_mut(fence) {
                l.set_records_max(recs.len());
            }
            self.stats.counts_refreshed.fetch_add(1, Ordering::Relaxed);
            return Ok(false);
        }
        let mid = recs.len() / 2;
        let split_key = recs[mid].0;
        let new_block = r
            .free
            .pop()
            .ok_or_else(|| Error::Index("B+tree is out of blocks".into()))?;
        let payload = leaf_payload(self.bosc.payload_bytes(), split_key, &recs[mid..]);
        staged.split.insert(fence);
        staged.push(Change::write(new_block, payload));
        staged.push(Change::modify(
            leaf.block(),
            encode_mod(TAG_KEEP_BELOW, split_key, 0),
        ));
        r.insert(split_key, Leaf::new(new_block, recs.len() - mid));
        if let Some(l) = r.get_mut(fence) {
            l.set_records_max(mid);
        }
        let counter = if hot {
            &self.stats.splits_hot
        } else if cached {
            &self.stats.splits_in_memory
        } else {
            &self.stats.splits_with_read
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    /// Point query; sees queued modifications.
    pub fn get(&self, key: Key) -> Result<Option<u64>, Error> {
        let r = lock(&self.router);
        r.check()?;
        let (_, leaf) = r.leaf_for(key)?;
        self.bosc.query(leaf.block(), |p| {
            let v = LeafView(p);
            v.search(&key).ok().map(|i| v.value(i))
        })
    }

    /// Records with keys in `[from, to)`, in key order.
    pub fn range(&self, from: Key, to: Key) -> Result<Vec<(Key, u64)>, Error> {
        let r = lock(&self.router);
        r.check()?;
        let (first, _) = r.leaf_for(from)?;
        let mut out = Vec::new();
        let mut leaves = r.leaves.range(Fence::from(first)..).peekable();
        while let Some((fence, leaf)) = leaves.next() {
            let fence = fence.key();
            if fence >= to {
                break;
            }
            let next = leaves.peek().map(|(f, _)| f.key());
            let hi = next.map_or(to, |h| h.min(to));
            let lo = from.max(fence);
            out.extend(
                self.bosc
                    .query(leaf.block(), |p| LeafView(p).records(lo, Some(hi)))?,
            );
        }
        Ok(out)
    }

    /// CDP's query: the newest version of (volume, lba) with timestamp ≤ `at`, as
    /// (timestamp, value).
    pub fn newest_at_or_before(
        &self,
        volume: u32,
        lba: u64,
        at: u64,
    ) -> Result<Option<(u64, u64)>, Error> {
        let target = Key::new(volume, lba, at);
        let floor = Key::new(volume, lba, 0);
        let r = lock(&self.router);
        r.check()?;
        let mut hi = r.next_fence(r.leaf_for(target)?.0);
        for (fence, leaf) in r.leaves.range(..=Fence::from(target)).rev() {
            let fence = fence.key();
            let found = self.bosc.query(leaf.block(), |p| {
                let v = LeafView(p);
                let end = match v.search(&target) {
                    Ok(i) => i + 1,
                    Err(i) => i,
                };
                (0..end)
                    .rev()
                    .map(|i| (v.key(i), v.value(i)))
                    .find(|(k, _)| hi.is_none_or(|h| *k < h))
            })?;
            if let Some((k, v)) = found {
                return Ok((k >= floor).then_some((k.timestamp, v)));
            }
            if fence <= floor {
                return Ok(None);
            }
            hi = Some(fence);
        }
        Ok(None)
    }

    pub fn bosc(&self) -> &Bosc<LeafApp> {
        &self.bosc
    }

    pub fn stats(&self) -> &TreeStats {
        &self.stats
    }

    pub fn leaf_count(&self) -> usize {
        lock(&self.router).leaves.len()
    }

    /// Records per leaf.
    pub fn leaf_capacity(&self) -> usize {
        self.capacity
    }

    /// Estimated heap bytes of the in-memory internal nodes and the free-block list: what the
    /// tree keeps in memory besides the engine's queues (for memory budgets).
    pub fn router_bytes(&self) -> usize {
        let r = lock(&self.router);
        // A map entry with its share of the nodes, as the engine counts its maps: nodes
        // about two-thirds full, as random splits leave them (a sorted build packs them full,
        // so this overstates a freshly opened or loaded tree).
        let entry = crate::engine::map_entry_bytes(
            std::mem::size_of::<Fence>() + std::mem::size_of::<Leaf>(),
        );
        r.leaves.len() * entry + r.free.runs.capacity() * std::mem::size_of::<(u64, u64)>()
    }
}

/// Packs sorted records into leaves and writes them with [`Bosc::load`] in chunks.
struct BulkLoader<'a> {
    bosc: &'a Bosc<LeafApp>,
    fill: usize,
    leaf: Vec<(Key, u64)>,
    last: Option<Key>,
    leaves: Vec<(Key, Leaf)>,
    chunk: Vec<u8>,
    chunk_first: u64,
}

impl<'a> BulkLoader<'a> {
    /// Leaves written per [`Bosc::load`] call.
    const CHUNK_LEAVES: usize = 256;

    fn new(bosc: &'a Bosc<LeafApp>, fill: usize) -> Self {
        Self {
            bosc,
            fill,
            leaf: Vec::with_capacity(fill),
            last: None,
            leaves: Vec::new(),
            chunk: Vec::new(),
            chunk_first: 0,
        }
    }

    fn push(&mut self, key: Key, value: u64) -> Result<(), Error> {
        if self.last.is_some_and(|last| key <= last) {
            return Err(Error::Index(format!(
                "bulk load keys must strictly increase: {key:?} after {:?}",
                self.last
            )));
        }
        self.last = Some(key);
        self.leaf.push((key, value));
        if self.leaf.len() == self.fill {
            self.end_leaf()?;
        }
        Ok(())
    }

    fn end_leaf(&mut self) -> Result<(), Error> {
        let block = self.leaves.len() as u64;
        if block >= self.bosc.block_count() {
            return Err(Error::Index("bulk load: B+tree is out of blocks".into()));
        }
        // The first leaf's fence is the lowest key, as routing requires.
        let fence = if block == 0 { Key::MIN } else { self.leaf[0].0 };
        let payload = leaf_payload(self.bosc.payload_bytes(), fence, &self.leaf);
        self.chunk.extend_from_slice(&payload);
        let leaf = Leaf::new(block, self.leaf.len());
        self.leaves.push((fence, leaf));
        self.leaf.clear();
        if self.chunk.len() >= Self::CHUNK_LEAVES * self.bosc.payload_bytes() {
            self.write_chunk()?;
        }
        Ok(())
    }

    fn write_chunk(&mut self) -> Result<(), Error> {
        self.bosc.load(self.chunk_first, &self.chunk)?;
        self.chunk.clear();
        self.chunk_first = self.leaves.len() as u64;
        Ok(())
    }

    fn finish(mut self) -> Result<Vec<(Key, Leaf)>, Error> {
        if !self.leaf.is_empty() {
            self.end_leaf()?;
        }
        if !self.chunk.is_empty() {
            self.write_chunk()?;
        }
        Ok(self.leaves)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(p: &mut [u8], tag: u8, k: u64, v: u64) {
        LeafApp.apply(0, p, &encode_mod(tag, Key::new(1, k, 0), v));
    }

    /// The router's fences sort as the keys do and give them back.
    #[test]
    fn fences_keep_key_order() {
        let parts_u64 = [0, 1, 255, 256, 1 << 32, u64::MAX - 1, u64::MAX];
        let parts_u32 = [0, 1, 255, 256, u32::MAX];
        let mut keys = Vec::new();
        for &v in &parts_u32 {
            for &l in &parts_u64 {
                for &t in &parts_u64 {
                    keys.push(Key::new(v, l, t));
                }
            }
        }
        for a in &keys {
            assert_eq!(Fence::from(*a).key(), *a);
            for b in &keys {
                assert_eq!(
                    Fence::from(*a).cmp(&Fence::from(*b)),
                    a.cmp(b),
                    "{a:?} {b:?}"
                );
            }
        }
    }

    #[test]
    fn leaf_put_delete_keep_below() {
        let mut p = leaf_payload(488, Key::MIN, &[]);
        for k in [5, 1, 9, 3, 7] {
            apply(&mut p, TAG_PUT, k, k * 10);
        }
        apply(&mut p, TAG_PUT, 3, 33);
        apply(&mut p, TAG_DELETE, 9, 0);
        apply(&mut p, TAG_DELETE, 4, 0);
        let got: Vec<_> = LeafView(&p)
            .records(Key::MIN, None)
            .into_iter()
            .map(|(k, v)| (k.lba, v))
            .collect();
        assert_eq!(got, vec![(1, 10), (3, 33), (5, 50), (7, 70)]);
        apply(&mut p, TAG_KEEP_BELOW, 5, 0);
        assert_eq!(LeafView(&p).count(), 2);
        assert_eq!(p, {
            let mut q = leaf_payload(488, Key::MIN, &[]);
            apply(&mut q, TAG_PUT, 1, 10);
            apply(&mut q, TAG_PUT, 3, 33);
            q
        });
    }
}
