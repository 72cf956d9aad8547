//! Shadow extents on the running engine ([`crate::format::homes`]): where a block is read from,
//! how a commit moves whole extents to their other home, and the home map the checkpoint
//! writes beside it.
//!
//! Order of one batch, and why it guards against torn writes without a double write:
//! 1. the extents are written whole to the home each is *not* in, and synced — a crash here
//!    leaves every current home as it was, and the own log still holds what was merged (the
//!    write-ahead rule, [`Inner::wait_durable`], held before step 1);
//! 2. a [`LoggedHomes`] record names the moves and is waited on until durable — before it, a
//!    recovery reads the old homes and requeues the modifications (nothing yet says they are
//!    committed: they leave the queues only in step 3);
//! 3. the map in memory flips (under the gate, so no query reads half of a move), and the
//!    batch retires. Any later record whose frontiers call the batch's modifications committed
//!    comes after the `LoggedHomes` record in the log, so recovery has moved the extents by
//!    the time it reads those frontiers.
//!
//! The checkpoint writes the whole map to the slot of its counter before its own slot, with
//! one sync for both; open takes the newest checkpoint whose map slot is valid with the same
//! counter, then applies the `LoggedHomes` records above it.

use std::sync::PoisonError;

use bytes::Bytes;
use mariner_log::Entry;

use super::commit::Batch;
use super::{lock, BlockApp, Inner};
use crate::format::homes::{HomeMap, LoggedHomes};
use crate::runs::Run;
use crate::Error;

/// Extents a batch moves with one sync and one `LoggedHomes` record.
pub(super) const BATCH_EXTENTS: u64 = 8;

impl<A: BlockApp> Inner<A> {
    /// Where `block` is read from now: its extent's current home.
    pub(super) fn block_at(&self, block: u64) -> u64 {
        match &self.homes {
            None => self.geo.block_offset(block),
            Some(m) => {
                let home = lock(m).home(self.geo.extent_of(block));
                self.geo.home_offset(home, block)
            }
        }
    }

    /// Reads consecutive blocks from `first` into `buf`, each extent from its home. With
    /// `skip_holes`, a piece of the disk that was never written (a hole of a sparse file) is
    /// not read but zeroed (blocks never written read as zeros).
    pub(super) fn read_span(
        &self,
        buf: &mut [u8],
        first: u64,
        skip_holes: bool,
    ) -> Result<(), Error> {
        let bs = self.geo.block_bytes as usize;
        let n = (buf.len() / bs) as u64;
        let step = match self.homes {
            None => n.max(1),
            Some(_) => u64::from(self.geo.max_run.max(1)),
        };
        let mut b = first;
        while b < first + n {
            let end = ((b / step + 1) * step).min(first + n);
            let piece = &mut buf[(b - first) as usize * bs..(end - first) as usize * bs];
            let at = self.block_at(b);
            let hole = skip_holes
                && self
                    .disk
                    .allocation(at, piece.len() as u64)?
                    .iter()
                    .all(|e| !e.allocated);
            if hole {
                piece.fill(0);
            } else {
                self.disk.read_at(piece, at)?;
            }
            b = end;
        }
        Ok(())
    }

    /// A cycle's runs widened to the whole extents they touch, in block order: an extent
    /// moves whole or not at all.
    pub(super) fn whole_extents(&self, runs: Vec<Run>) -> Vec<Run> {
        let mr = u64::from(self.geo.max_run.max(1));
        let mut out: Vec<Run> = Vec::with_capacity(runs.len());
        for r in runs {
            for e in r.start / mr..=(r.start + r.len.max(1) - 1) / mr {
                let start = e * mr;
                out.push(Run {
                    start,
                    len: mr.min(self.geo.block_count - start),
                });
            }
        }
        out.sort_unstable_by_key(|r| r.start);
        out.dedup_by_key(|r| r.start);
        out
    }

    /// Steps 1–3 of the module docs for one batch of whole extents.
    pub(super) fn move_extents(
        &self,
        batch: &Batch,
        homes: &std::sync::Mutex<HomeMap>,
    ) -> Result<(), Error> {
        let moves: Vec<(u64, u8)> = {
            let map = lock(homes);
            batch
                .runs
                .iter()
                .map(|(run, _)| {
                    let e = self.geo.extent_of(run.start);
                    (e, 1 - map.home(e))
                })
                .collect()
        };
        for ((run, buf), &(_, to)) in batch.runs.iter().zip(&moves) {
            debug_assert_eq!(run.start % u64::from(self.geo.max_run), 0, "whole extents");
            self.fill_ahead(to, run.start + run.len)?;
            self.disk
                .write_at(buf, self.geo.home_offset(to, run.start))?;
        }
        self.disk.sync()?;
        let (log, volume) = self
            .log
            .as_ref()
            .ok_or_else(|| Error::Config("shadow extents need the own log".into()))?;
        // Small (9 bytes an extent): the room writers leave in the log (a segment, see
        // `make_log_room`) takes a cycle's records, so this append never waits for a
        // checkpoint that only this commit would write.
        let payload = Bytes::from(LoggedHomes::encode(&moves));
        let burst = log.append_many(vec![Entry::write(*volume, 0, payload)])?;
        let Some(seq) = burst.first_seq else {
            let why = log
                .failure()
                .unwrap_or_else(|| "the log is shut down".into());
            return Err(Error::Failed(format!("the log took no record: {why}")));
        };
        for rx in burst.futures {
            rx.blocking_recv()
                .map_err(|_| Error::Failed("the log shut down".into()))?
                .map_err(Error::from)?;
        }
        {
            let mut st = lock(&self.state);
            st.max_seen = st.max_seen.max(seq);
        }
        let _gate = self.gate.write().unwrap_or_else(PoisonError::into_inner);
        let mut map = lock(homes);
        for &(e, to) in &moves {
            map.set(e, to);
        }
        Ok(())
    }
}
