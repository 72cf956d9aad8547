//! A B+tree on BOSC (lu-dissertation §3.3), shaped for the CDP version index:
//! (volume, LBA, timestamp) → log location.
//!
//! - Leaves are BOSC blocks; inserts, updates and deletes are BOSC modifications applied by
//!   [`LeafApp`] (the first part of the seed's two-part commit function). Queries go through
//!   [`Bosc::query`], so they see queued modifications (§3.2.4).
//! - Internal nodes live in memory as a `BTreeMap` from each leaf's low fence key to the leaf.
//!   Every leaf carries its low fence, so the leaves alone define the tree and a split needs no
//!   second durable structure to stay consistent with: [`BPlusTree::open`] **rebuilds the
//!   router by scanning every leaf** (one sequential read of the index; 0.9 s for 650 MiB of
//!   leaves, read cold, in bench/router-reopen.sh). [`BPlusTree::open_with_router`] reads it
//!   instead from a **router image** beside the data disk ([`image`]: 24 bytes a leaf, 0.6 % of
//!   the index) and scans only the image's lease, the few blocks where leaves created since
//!   can be; the lease is what keeps the image valid without writing it at every split or
//!   every BOSC checkpoint. A missing or damaged image costs the full scan, never a wrong route.
//! - The second part of the commit function runs when a modification is queued: the tree keeps
//!   an upper bound of each leaf's record count (a blind insert may be an update) and splits
//!   proactively once it passes `split_threshold`. When the leaf's image is in memory (always
//!   so for leaves created by a split until the commit cycle evicts them, since BOSC keeps the
//!   image of a whole-block write), the split costs no I/O. Otherwise it is deferred, as in the
//!   seed, until the bound reaches the leaf's capacity, and then the split reads the leaf.
//!
//! Split, in log order: (1) whole-block write of the new leaf with fence F and the upper half —
//! the commit point: from here an open (scan, or image and lease) routes keys ≥ F to it; (2) `KeepBelow(F)` on the
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
//!
//! Layout: this file holds [`BPlusTree`] and its operations (batches, splits, queries); the
//! submodules `leaf` (the on-disk leaf and its update function), `router` (the in-memory
//! internal nodes and free blocks), `open` (rebuilding the router by the scan), [`image`] (the
//! router image's format and the reasoning behind it), `persist` (writing images, the lease,
//! opening from an image), `readers` (the leaf-reading threads) and `bulk` (bulk load) hold
//! the parts around it.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard, PoisonError};

use crate::engine::Submitted;
use crate::{Bosc, Change, Error, Op};

mod bulk;
mod counts;
pub mod image;
mod leaf;
mod open;
mod persist;
mod readers;
mod router;

use counts::Refresher;
use leaf::{
    apply_change, encode_mod, hot_at, LeafView, TAG_DELETE, TAG_DROP_THROUGH, TAG_KEEP_BELOW,
    TAG_PUT,
};
pub use leaf::{
    leaf_capacity, leaf_payload, Key, LeafApp, LEAF_HEADER_LEN, LEAF_MAGIC, RECORD_LEN,
};
pub use persist::RouterOpen;
use readers::Readers;
use router::{Fence, Leaf, Router};

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
    /// Router images written ([`image`]): at open, when a lease ran out, on request.
    pub router_images_written: AtomicU64,
    /// Opens with a router image disk that found no usable image and read every leaf.
    pub router_fallbacks: AtomicU64,
    /// Leaves known from a router image whose count the background refresher read before
    /// a put did.
    pub counts_refreshed_in_background: AtomicU64,
    /// Leaves [`BPlusTree::newest_at_or_before`] searched (its cost beyond the router: the
    /// bound history's lookups state).
    pub predecessor_leaves: AtomicU64,
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
    /// The batch's new leaves (fence, block), whole batch long: not yet durable, so a
    /// router image written inside the batch leaves them out ([`Self::alloc`]).
    created: Vec<(Key, u64)>,
}

impl Staged {
    fn push(&mut self, change: Change) {
        self.touched.insert(change.block);
        self.changes.push(change);
    }
}

/// The B+tree. One lock serialises the tree's operations (the seed locks per leaf; the BOSC
/// calls under it are short, since modifications are only logged and queued).
pub struct BPlusTree {
    /// Declared first, so dropped first: the threads end before the engine does.
    refresher: Refresher,
    readers: Readers,
    bosc: Arc<Bosc<LeafApp>>,
    router: Arc<Mutex<Router>>,
    capacity: usize,
    split_threshold: usize,
    /// Whether batches read nearly full leaves ahead ([`BPlusTree::set_read_ahead`]).
    read_ahead: AtomicBool,
    /// Parts a batch is logged in ([`BPlusTree::set_log_parts`]).
    log_parts: AtomicUsize,
    stats: Arc<TreeStats>,
    /// How open built the router.
    opened: RouterOpen,
}

fn lock(m: &Mutex<Router>) -> MutexGuard<'_, Router> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl BPlusTree {
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
        let done = self.stage_and_send(&mut r, &mut staged, records);
        if let Err(e) = &done {
            // Splits already routed to leaves whose writes were never logged: the router no
            // longer matches what is durable (nor may a router image record it).
            if r.failed.is_none() && !staged.created.is_empty() {
                r.failed = Some(format!("a batch failed: {e}"));
            }
        }
        done
    }

    /// [`Self::insert_batch`] under the router lock.
    fn stage_and_send(
        &self,
        r: &mut Router,
        staged: &mut Staged,
        records: &[(Key, u64)],
    ) -> Result<(), Error> {
        self.split_hot(r, staged)?;
        // Each record's leaf, looked up once: the routes stay valid but for leaves the batch
        // splits (`Staged::split`).
        let routes = records
            .iter()
            .map(|(key, _)| Ok(r.leaf_for(*key)?.0))
            .collect::<Result<Vec<Key>, Error>>()?;
        let started = std::time::Instant::now();
        staged.prefetched = self.prefetch(r, &routes)?;
        self.stats
            .prefetch_us
            .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
        let mut ahead = Vec::new();
        let hot_at = hot_at(self.capacity);
        let chunk = self.chunk_len(records.len());
        let mut in_flight = None;
        for (i, (&(key, value), &route)) in records.iter().zip(&routes).enumerate() {
            let route = (!staged.split.contains(&route)).then_some(route);
            let (fence, block) = self.prepare(r, key, route, staged)?;
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
                in_flight = Some(self.send(r, staged, in_flight)?);
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
        let last = self.send(r, staged, in_flight)?;
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
        self.delete_batch(&[key])
    }

    /// Deletes many keys with one group commit of the log (blind, as [`Self::delete`]): all
    /// are durable when it returns.
    pub fn delete_batch(&self, keys: &[Key]) -> Result<(), Error> {
        if keys.is_empty() {
            return Ok(());
        }
        let mut r = lock(&self.router);
        r.check()?;
        let mut changes = Vec::with_capacity(keys.len());
        for &key in keys {
            let leaf = self.checked_leaf_for(&mut r, key)?;
            changes.push(Change::modify(leaf.block(), encode_mod(TAG_DELETE, key, 0)));
        }
        self.bosc.modify_batch(changes)?;
        Ok(())
    }

    /// The leaf `key` routes to. A leaf known only from a router image is read and checked
    /// first (its count then known): a modification queued for a block that is no leaf would
    /// fail the commit, where a wrong image must fail the call.
    fn checked_leaf_for(&self, r: &mut Router, key: Key) -> Result<Leaf, Error> {
        let (fence, leaf) = r.leaf_for(key)?;
        if leaf.is_unread() {
            let n = self.bosc.query(leaf.block(), |p| {
                LeafView::checked(leaf.block(), p).map(|v| v.count())
            })??;
            if let Some(l) = r.get_mut(fence) {
                l.set_records_max(n);
            }
        }
        Ok(leaf)
    }

    /// Drops, from every leaf one of `keys` lies in, all records of that key's volume with a
    /// timestamp at or below `through(volume)` (volumes it gives `None` keep theirs): one
    /// modification a leaf and volume, however many of its records go, with one group commit
    /// of the log; durable when it returns. Returns the modifications queued.
    ///
    /// History lets go of the versions that left the window this way, a roll-forward at a
    /// time: `keys` are the round's, so every leaf holding one of them is cleaned, older
    /// leftovers included. Like a delete it never splits, and reads a leaf only if a router
    /// image named it and nothing has read it since; a leaf's record count bound stays an
    /// upper bound.
    pub fn drop_through(
        &self,
        keys: &[Key],
        through: impl Fn(u32) -> Option<u64>,
    ) -> Result<usize, Error> {
        let mut r = lock(&self.router);
        r.check()?;
        let mut seen: HashSet<(u64, u32)> = HashSet::new();
        let mut changes = Vec::new();
        for &key in keys {
            let Some(t) = through(key.volume).filter(|&t| key.timestamp <= t) else {
                continue;
            };
            let leaf = self.checked_leaf_for(&mut r, key)?;
            if seen.insert((leaf.block(), key.volume)) {
                let m = encode_mod(TAG_DROP_THROUGH, Key::new(key.volume, 0, t), 0);
                changes.push(Change::modify(leaf.block(), m));
            }
        }
        let n = changes.len();
        if n > 0 {
            self.bosc.modify_batch(changes)?;
        }
        Ok(n)
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
            LeafView::checked(leaf.block(), &p)?.records(Key::MIN, hi)
        } else {
            self.bosc.query(leaf.block(), |p| {
                LeafView::checked(leaf.block(), p).map(|v| v.records(Key::MIN, hi))
            })??
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
        let new_block = self.alloc(r, &staged.created)?;
        let payload = leaf_payload(self.bosc.payload_bytes(), split_key, &recs[mid..]);
        staged.split.insert(fence);
        staged.created.push((split_key, new_block));
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
            let v = LeafView::checked(leaf.block(), p)?;
            Ok(v.search(&key).ok().map(|i| v.value(i)))
        })?
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
            out.extend(self.bosc.query(leaf.block(), |p| {
                LeafView::checked(leaf.block(), p).map(|v| v.records(lo, Some(hi)))
            })??);
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
            self.stats
                .predecessor_leaves
                .fetch_add(1, Ordering::Relaxed);
            let found = self.bosc.query(leaf.block(), |p| {
                let v = LeafView::checked(leaf.block(), p)?;
                Ok::<_, Error>(newest_in_leaf(&v, target, hi))
            })??;
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

    /// [`Self::newest_at_or_before`] for each of `lbas` (ascending) of `volume`: the answers
    /// in their order. The targets one leaf holds are answered with one read of it under one
    /// hold of the router (a read of a stretch of the past asks for tens of neighbouring
    /// pieces, most in one leaf); a target whose answer lies in an earlier leaf is asked
    /// alone after.
    #[allow(clippy::type_complexity)]
    pub fn newest_at_or_before_each(
        &self,
        volume: u32,
        lbas: &[u64],
        at: u64,
    ) -> Result<Vec<Option<(u64, u64)>>, Error> {
        debug_assert!(lbas.windows(2).all(|w| w[0] < w[1]), "lbas ascending");
        let mut out = vec![None; lbas.len()];
        let mut earlier = Vec::new();
        {
            let r = lock(&self.router);
            r.check()?;
            let mut i = 0;
            while i < lbas.len() {
                let (fence, leaf) = r.leaf_for(Key::new(volume, lbas[i], at))?;
                let hi = r.next_fence(fence);
                let j = i + lbas[i..]
                    .iter()
                    .take_while(|&&lba| hi.is_none_or(|h| Key::new(volume, lba, at) < h))
                    .count();
                self.stats
                    .predecessor_leaves
                    .fetch_add(1, Ordering::Relaxed);
                self.bosc.query(leaf.block(), |p| {
                    let v = LeafView::checked(leaf.block(), p)?;
                    for k in i..j {
                        let floor = Key::new(volume, lbas[k], 0);
                        match newest_in_leaf(&v, Key::new(volume, lbas[k], at), hi) {
                            Some((key, value)) => {
                                out[k] = (key >= floor).then_some((key.timestamp, value));
                            }
                            None if fence > floor => earlier.push(k),
                            None => {}
                        }
                    }
                    Ok::<_, Error>(())
                })??;
                i = j.max(i + 1);
            }
        }
        for k in earlier {
            out[k] = self.newest_at_or_before(volume, lbas[k], at)?;
        }
        Ok(out)
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

/// The newest key of `v` at or before `target` and below `hi` (the next leaf's fence), with
/// its value.
fn newest_in_leaf(v: &LeafView<'_>, target: Key, hi: Option<Key>) -> Option<(Key, u64)> {
    let end = match v.search(&target) {
        Ok(i) => i + 1,
        Err(i) => i,
    };
    (0..end)
        .rev()
        .map(|i| (v.key(i), v.value(i)))
        .find(|(k, _)| hi.is_none_or(|h| *k < h))
}
