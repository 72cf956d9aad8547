//! Open: the router rebuilt from the leaves of a recovered engine, half-done splits
//! finished, the root leaf of an empty tree created.
//!
//! Apart because it runs once, before the tree serves anything, and reasons about what a
//! crash left on the disk.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::leaf::{
    default_split_threshold, encode_mod, leaf_capacity, leaf_payload, Key, LeafApp, LeafView,
    TAG_KEEP_BELOW,
};
use super::readers::Readers;
use super::router::{Fence, FreeBlocks, Leaf, Router, MAX_BLOCKS};
use super::{lock, BPlusTree, Refresher, RouterOpen, TreeStats};
use crate::{Bosc, Error};

/// A leaf found at open: 48 bytes, so that the list of a large tree's leaves stays small
/// beside the router it becomes.
pub(super) struct Scanned {
    pub(super) fence: Fence,
    /// Its largest key; the fence if it has none (then nothing is at or above the next fence).
    pub(super) max_key: Fence,
    pub(super) leaf: Leaf,
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
    pub(super) fn check_engine(bosc: &Bosc<LeafApp>) -> Result<usize, Error> {
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

    pub(super) fn assemble(
        bosc: Bosc<LeafApp>,
        capacity: usize,
        split_threshold: Option<usize>,
        leaves: BTreeMap<Fence, Leaf>,
        free: FreeBlocks,
    ) -> Self {
        Self {
            bosc: Arc::new(bosc),
            refresher: Refresher::default(),
            readers: Readers::default(),
            router: Arc::new(Mutex::new(Router {
                leaves,
                free,
                failed: None,
                persist: None,
            })),
            capacity,
            split_threshold: split_threshold
                .unwrap_or(default_split_threshold(capacity))
                .clamp(2, capacity),
            read_ahead: AtomicBool::new(true),
            log_parts: AtomicUsize::new(1),
            stats: Arc::new(TreeStats::default()),
            opened: RouterOpen::default(),
        }
    }

    /// Builds the router from the leaves found at open, in fence order (a sorted build packs
    /// the map's nodes full), and finishes the splits a crash left half done: a leaf holding
    /// keys at or above the next leaf's fence keeps only those below it.
    pub(super) fn install(&self, mut scanned: Vec<Scanned>) -> Result<(), Error> {
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
        self.finish_splits(&mut r, &torn)
    }

    /// Finishes splits a crash left half done, each `(fence, block, hi)`: the leaf at `block`
    /// (routed by `fence`) keeps only what lies below the new leaf's fence `hi`.
    pub(super) fn finish_splits(
        &self,
        r: &mut Router,
        torn: &[(Key, u64, Key)],
    ) -> Result<(), Error> {
        for &(fence, block, hi) in torn {
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
}
