//! Bulk load: a tree built from sorted records straight onto a fresh disk, leaves packed and
//! written with [`crate::Bosc::load`] in chunks, the router built in memory as it goes.
//!
//! Apart because it bypasses the log and the queues entirely: set-up for imports and
//! benchmarks, not an operation of a running tree.

use super::leaf::{leaf_payload, Key, LeafApp};
use super::router::{Fence, FreeBlocks, Leaf};
use super::BPlusTree;
use crate::{Bosc, Error};

impl BPlusTree {
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
}

/// Packs sorted records into leaves and writes them with [`Bosc::load`] in chunks.
pub(super) struct BulkLoader<'a> {
    pub(super) bosc: &'a Bosc<LeafApp>,
    pub(super) fill: usize,
    pub(super) leaf: Vec<(Key, u64)>,
    pub(super) last: Option<Key>,
    pub(super) leaves: Vec<(Key, Leaf)>,
    pub(super) chunk: Vec<u8>,
    pub(super) chunk_first: u64,
}

impl<'a> BulkLoader<'a> {
    /// Leaves written per [`Bosc::load`] call.
    const CHUNK_LEAVES: usize = 256;

    pub(super) fn new(bosc: &'a Bosc<LeafApp>, fill: usize) -> Self {
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

    pub(super) fn push(&mut self, key: Key, value: u64) -> Result<(), Error> {
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

    pub(super) fn end_leaf(&mut self) -> Result<(), Error> {
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

    pub(super) fn write_chunk(&mut self) -> Result<(), Error> {
        self.bosc.load(self.chunk_first, &self.chunk)?;
        self.chunk.clear();
        self.chunk_first = self.leaves.len() as u64;
        Ok(())
    }

    pub(super) fn finish(mut self) -> Result<Vec<(Key, Leaf)>, Error> {
        if !self.leaf.is_empty() {
            self.end_leaf()?;
        }
        if !self.chunk.is_empty() {
            self.write_chunk()?;
        }
        Ok(self.leaves)
    }
}
