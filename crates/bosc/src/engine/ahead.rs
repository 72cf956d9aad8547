//! Filling ahead: before a commit writes past what the data disk's file has allocated, the
//! holes of the next [`BoscConfig::fill_ahead_bytes`](super::BoscConfig::fill_ahead_bytes)
//! are written with zeros, so the file system allocates in large pieces and not a few blocks
//! under every batch's sync.
//!
//! Why: a data disk is a sparse file sized for everything the index may grow to. A B+tree
//! takes new blocks in order, so most commits into a growing tree write a block the file has
//! never held, and the file system allocates it when the batch's sync writes it back. That
//! sync then commits the file system's journal, and the own log's durable writes on the same
//! device wait behind it: at a sync every 10 operations the B+tree did 18–20 k inserts/s on a
//! sparse file and 33 k on one written in advance (docs/benchmarks.md, "Issue 18: BOSC's
//! memory beside its budget"). A fill allocates once per `fill_ahead_bytes` instead.
//!
//! Why it cannot lose data: a fill writes zeros only into holes, which read as zeros already
//! (an all-zero block is a valid never-written block, [`crate::format::check_block`]), and
//! only at or above a frontier per home that every write of this engine lies below
//! ([`Inner::fill_ahead`]), so not even a write still in the page cache (which a hole query
//! might miss) is in a range a fill covers. Queries may read a range while it is filled: a
//! hole and a written zero read alike.

use super::{lock, BlockApp, Inner};
use crate::Error;

impl<A: BlockApp> Inner<A> {
    /// Called before blocks up to (not including) `end` are written in `home` (0 without
    /// shadow extents). Past the middle of the filled room, fills the holes of
    /// `[max(frontier, end), end + ahead)` and moves the frontier to its end, so every block
    /// written since the engine opened lies below the frontier.
    pub(super) fn fill_ahead(&self, home: u8, end: u64) -> Result<(), Error> {
        let ahead = self.cfg.fill_ahead_bytes / u64::from(self.geo.block_bytes);
        if ahead == 0 {
            return Ok(());
        }
        let mut frontiers = lock(&self.filled);
        let frontier = &mut frontiers[usize::from(home & 1)];
        if end + ahead / 2 <= *frontier {
            return Ok(());
        }
        let from = (*frontier).max(end);
        let to = (end + ahead).min(self.geo.block_count);
        if from < to {
            let (start, stop) = (
                self.geo.home_offset(home, from),
                self.geo.home_offset(home, to),
            );
            for hole in self.disk.allocation(start, stop - start)? {
                if hole.allocated {
                    continue;
                }
                mariner_disk::write_zeros(self.disk.as_ref(), hole.offset, hole.len)?;
                self.stats
                    .filled_ahead_bytes
                    .fetch_add(hole.len, std::sync::atomic::Ordering::Relaxed);
            }
        }
        *frontier = (*frontier).max(to).max(end);
        Ok(())
    }

    /// Moves the frontier of `home` past blocks written outside a commit (a bulk load).
    pub(super) fn written_below(&self, home: u8, end: u64) {
        let mut frontiers = lock(&self.filled);
        let frontier = &mut frontiers[usize::from(home & 1)];
        *frontier = (*frontier).max(end);
    }
}
