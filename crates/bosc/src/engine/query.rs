//! Reads: a block as every acknowledged modification leaves it (lu-dissertation §3.2.4),
//! merged from the disk's image and the block's queue; the sequential scan that indexes
//! rebuild from; the reads ahead the application asks for ([`Bosc::read_hot`]).
//!
//! Apart because queries never write the disk: they read under the gate's read side, and
//! only merge queued modifications into a copy (`merge_pending` is shared with the commit's
//! staging, which merges the same way before it writes).

use std::sync::atomic::Ordering;
use std::sync::PoisonError;

use super::memory::State;
use super::pending::{Entry as Queued, GROUP_BLOCKS};
use super::{apply_op, lock, BlockApp, Bosc, Inner};
use crate::format::{check_block, DiskId, BLOCK_HEADER_LEN};
use crate::Error;

impl<A: BlockApp> Bosc<A> {
    /// Runs `f` over every block of `[first, first + count)` in order, each as [`Bosc::query`]
    /// would see it, reading the disk in large sequential chunks and caching nothing: for
    /// indexes that rebuild their in-memory state at open.
    pub fn scan(
        &self,
        first: u64,
        count: u64,
        mut f: impl FnMut(u64, &[u8]) -> Result<(), Error>,
    ) -> Result<(), Error> {
        const CHUNK_BYTES: u64 = 1 << 20;
        let end = first
            .checked_add(count)
            .filter(|&e| e <= self.inner.geo.block_count)
            .ok_or(Error::OutOfRange(first.saturating_add(count)))?;
        let bs = u64::from(self.inner.geo.block_bytes);
        let per_chunk = (CHUNK_BYTES / bs).max(1);
        let mut buf = Vec::new();
        let mut at = first;
        while at < end {
            let n = per_chunk.min(end - at);
            buf.resize((n * bs) as usize, 0);
            self.inner.scan_chunk(at, &mut buf, &mut f)?;
            at += n;
        }
        Ok(())
    }
}

/// Checks the header of every block in `buf` (consecutive blocks from `first`) and returns
/// their LSNs.
pub(super) fn block_lsns(
    buf: &[u8],
    id: DiskId,
    block_bytes: usize,
    first: u64,
) -> Result<Vec<u64>, Error> {
    buf.chunks(block_bytes)
        .enumerate()
        .map(|(i, img)| {
            let block = first + i as u64;
            check_block(img, id, Some(block))
                .map(|h| h.lsn)
                .map_err(|e| Error::Block { block, error: e })
        })
        .collect()
}

impl<A: BlockApp> Inner<A> {
    pub(super) fn read_block(&self, block: u64) -> Result<(Vec<u8>, u64), Error> {
        let mut img = vec![0u8; self.geo.block_bytes as usize];
        self.disk.read_at(&mut img, self.block_at(block))?;
        let h = check_block(&img, self.disk_id, Some(block))
            .map_err(|e| Error::Block { block, error: e })?;
        Ok((img, h.lsn))
    }

    /// One chunk of [`Bosc::scan`]: blocks from `first` filling `buf`.
    pub(super) fn scan_chunk(
        &self,
        first: u64,
        buf: &mut [u8],
        f: &mut impl FnMut(u64, &[u8]) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let bs = self.geo.block_bytes as usize;
        let _gate = self.gate.read().unwrap_or_else(PoisonError::into_inner);
        // A hole of a sparse file reads as zeros: blocks never written. Not reading it keeps an
        // open's scan of a large, mostly empty disk to the blocks in use.
        self.read_span(buf, first, true)?;
        let st = lock(&self.state);
        let lsns = block_lsns(buf, self.disk_id, bs, first)?;
        self.merge_pending(&st, first, buf, &lsns);
        for (i, img) in buf.chunks(bs).enumerate() {
            let block = first + i as u64;
            match st.images.get(&block) {
                Some(c) => f(block, &c.image[BLOCK_HEADER_LEN..])?,
                None => f(block, &img[BLOCK_HEADER_LEN..])?,
            }
        }
        Ok(())
    }

    /// Applies to each block of `buf` (consecutive blocks from `first`, with the LSNs of their
    /// headers in `lsns`) its pending modifications above its LSN, walking each group once;
    /// blocks with a cached image are left as they are. Returns per block, if it has pending
    /// modifications, the last one's sequence number and the block's LSN after them.
    pub(super) fn merge_pending(
        &self,
        st: &State,
        first: u64,
        buf: &mut [u8],
        lsns: &[u64],
    ) -> Vec<Option<(u64, u64)>> {
        let bs = self.geo.block_bytes as usize;
        let mut merged: Vec<Option<(u64, u64)>> = vec![None; lsns.len()];
        let Some(last) = (first + lsns.len() as u64)
            .checked_sub(1)
            .filter(|&l| l >= first)
        else {
            return merged;
        };
        let mut cached = vec![false; lsns.len()];
        for &b in st.images.range(first..=last).map(|(b, _)| b) {
            cached[(b - first) as usize] = true;
        }
        for (&key, g) in st.groups.range(first / GROUP_BLOCKS..=last / GROUP_BLOCKS) {
            for e in g.entries() {
                let block = key * GROUP_BLOCKS + u64::from(e.offset);
                if !(first..=last).contains(&block) {
                    continue;
                }
                let i = (block - first) as usize;
                let slot = merged[i].get_or_insert((0, lsns[i]));
                slot.0 = e.seq;
                if cached[i] || e.seq <= lsns[i] {
                    continue;
                }
                if let Some((op, bytes)) = e.change {
                    let img = &mut buf[i * bs..(i + 1) * bs];
                    apply_op(self.app.as_ref(), block, img, op, bytes);
                    slot.1 = e.seq;
                }
            }
        }
        merged
    }

    pub(super) fn query<R>(&self, block: u64, f: impl FnOnce(&[u8]) -> R) -> Result<R, Error> {
        self.check_block_no(block)?;
        {
            let st = lock(&self.state);
            if let Some(c) = st.images.get(&block) {
                return Ok(f(&c.image[BLOCK_HEADER_LEN..]));
            }
        }
        let _gate = self.gate.read().unwrap_or_else(PoisonError::into_inner);
        let (mut img, lsn) = self.read_block(block)?;
        let mut st = lock(&self.state);
        if let Some(c) = st.images.get(&block) {
            return Ok(f(&c.image[BLOCK_HEADER_LEN..]));
        }
        let budget = self.budget.load(Ordering::Relaxed);
        let room = st.memory_bytes + img.len() <= budget && !self.images_over_share(&st);
        let img_lsn = self.apply_queued(&st, block, &mut img, lsn);
        let out = f(&img[BLOCK_HEADER_LEN..]);
        if room {
            // The queues double as a cache: later modifications apply to this image at once,
            // and the queued ones keep only their sequence numbers.
            if st.has_pending(block) {
                st.with_group(block, |g, offset| {
                    g.rebuild(|e| {
                        let applied = Queued { change: None, ..e };
                        Some(if e.offset == offset { applied } else { e })
                    })
                });
            }
            st.cache_image(block, img, img_lsn);
        }
        Ok(out)
    }

    /// Applies to `img`, the block read or copied when every modification up to `above` was
    /// in it, those queued above `above`; returns the last one's sequence number (`above` if
    /// none). For a block without a cached image, whose entries all hold their bytes.
    pub(super) fn apply_queued(&self, st: &State, block: u64, img: &mut [u8], above: u64) -> u64 {
        let mut last = above;
        if let Some((g, offset)) = st.group(block) {
            for e in g.entries_of(offset).filter(|e| e.seq > above) {
                if let Some((op, bytes)) = e.change {
                    apply_op(self.app.as_ref(), block, img, op, bytes);
                }
                last = e.seq;
            }
        }
        last
    }

    pub(super) fn read_hot(&self, block: u64) -> Result<(), Error> {
        self.check_block_no(block)?;
        let room = |st: &State| {
            !st.images.contains_key(&block)
                && !st.hot.contains_key(&block)
                && st.hot_has_room(self.budget.load(Ordering::Relaxed))
        };
        if !room(&lock(&self.state)) {
            return Ok(());
        }
        // As a query reads and merges it: the gate, held until the merge, keeps commits from
        // writing the block or retiring its entries in between.
        let _gate = self.gate.read().unwrap_or_else(PoisonError::into_inner);
        let (mut img, lsn) = self.read_block(block)?;
        let mut st = lock(&self.state);
        if !room(&st) {
            return Ok(());
        }
        let upto = self.apply_queued(&st, block, &mut img, lsn);
        st.keep_hot(block, img, upto);
        self.stats.read_hot.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}
