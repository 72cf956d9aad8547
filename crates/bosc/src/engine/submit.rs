//! The ways modifications come in: own-log bursts ([`Submitted`]: logged and queued in one
//! critical section, durable when waited for), caller-durable modifications at a position,
//! and the bulk load of a fresh disk; and `enqueue`, which puts one into its block's queue
//! (or applies it to the block's cached image).
//!
//! Apart from the commit side because a submission and a commit meet only through the
//! queues and the write-ahead rule (`State::undurable`).

use std::sync::atomic::Ordering;
use std::time::Instant;

use bytes::Bytes;
use mariner_log::Entry;

use super::memory::State;
use super::pending::Entry as Queued;
use super::{apply_op, lock, BlockApp, Change, Inner};
use crate::format::{seal_block, LoggedMod, Op, BLOCK_HEADER_LEN};
use crate::Error;

/// An own-log burst logged and queued ([`Inner::submit`]), not yet known durable. Waiting
/// for it (or dropping it, which waits too) takes it out of `State::undurable`.
#[must_use = "a submission's durability must be waited for"]
pub(crate) struct Submitted<'a, A: BlockApp> {
    inner: &'a Inner<A>,
    /// The burst's first sequence number; `None` once waited for (or for no changes).
    first: Option<u64>,
    futures: Vec<mariner_log::AppendFuture>,
}

impl<A: BlockApp> Submitted<'_, A> {
    /// Waits until every change is durable; returns their sequence numbers.
    pub(crate) fn wait(mut self) -> Result<Vec<u64>, Error> {
        self.finish()
    }

    pub(super) fn finish(&mut self) -> Result<Vec<u64>, Error> {
        let Some(first) = self.first.take() else {
            return Ok(Vec::new());
        };
        let waited = Instant::now();
        let n = self.futures.len() as u64;
        let mut first_error = None;
        for rx in self.futures.drain(..) {
            let r = rx
                .blocking_recv()
                .map_err(|_| Error::Failed("the log shut down".into()))
                .and_then(|r| r.map_err(Error::from));
            if let Err(e) = r {
                first_error.get_or_insert(e);
            }
        }
        let inner = self.inner;
        let ns = u64::try_from(waited.elapsed().as_nanos()).unwrap_or(u64::MAX);
        inner.stats.log_wait_ns.fetch_add(ns, Ordering::Relaxed);
        // Queued but lost by the log: nothing may commit them, nor anything after them.
        let failed = first_error.map(|e| inner.fail(e));
        lock(&inner.state).undurable.remove(&first);
        inner.durable.notify_all();
        match failed {
            Some(e) => Err(e),
            None => Ok((first..first + n).collect()),
        }
    }
}

impl<A: BlockApp> Drop for Submitted<'_, A> {
    fn drop(&mut self) {
        // An error has failed the engine, which reports it to every later caller.
        let _ = self.finish();
    }
}

impl<A: BlockApp> Inner<A> {
    pub(super) fn check_block_no(&self, block: u64) -> Result<(), Error> {
        if block >= self.geo.block_count {
            return Err(Error::OutOfRange(block));
        }
        if let Some(why) = &lock(&self.state).failed {
            return Err(Error::Failed(why.clone()));
        }
        Ok(())
    }

    pub(super) fn logged(&self, block: u64, op: Op, bytes: &[u8]) -> Result<u64, Error> {
        let change = Change {
            block,
            op,
            bytes: bytes.to_vec(),
        };
        let seqs = self.submit(vec![change])?.wait()?;
        seqs.first()
            .copied()
            .ok_or_else(|| Error::Failed("log returned no sequence number".into()))
    }

    /// Hands `changes` to the log as one burst and queues them, in one critical section, so
    /// each block's queue is in sequence order whoever appends; their durability is the
    /// answer's to wait for. Forced commits happen here, before the append.
    pub(super) fn submit(&self, changes: Vec<Change>) -> Result<Submitted<'_, A>, Error> {
        let Some((log, volume)) = &self.log else {
            return Err(Error::WrongMode);
        };
        for c in &changes {
            self.check_block_no(c.block)?;
        }
        let mut sub = Submitted {
            inner: self,
            first: None,
            futures: Vec::new(),
        };
        if changes.is_empty() {
            return Ok(sub);
        }
        self.make_room()?;
        let mut st = lock(&self.state);
        let gf = st.global_frontier();
        let entries = changes
            .iter()
            .map(|c| {
                let lf = st.local_frontier(c.block);
                let payload = LoggedMod::encode(c.op, gf, lf, &c.bytes);
                Entry::write(*volume, c.block, Bytes::from(payload))
            })
            .collect();
        let burst = log.append_many(entries)?;
        let Some(first) = burst.first_seq else {
            let why = log
                .failure()
                .unwrap_or_else(|| "the log is shut down".into());
            return Err(Error::Failed(format!("the log took no record: {why}")));
        };
        let n = changes.len() as u64;
        for (seq, c) in (first..).zip(changes) {
            self.enqueue(&mut st, c.block, seq, c.op, c.bytes);
        }
        st.max_seen = st.max_seen.max(first + n - 1);
        st.undurable.insert(first);
        sub.first = Some(first);
        sub.futures = burst.futures;
        Ok(sub)
    }

    pub(super) fn load(&self, first: u64, payloads: &[u8]) -> Result<(), Error> {
        let (bs, pb) = (self.geo.block_bytes as usize, self.geo.payload_bytes());
        if !payloads.len().is_multiple_of(pb) {
            return Err(Error::Config(format!(
                "bulk load of {} bytes is not a multiple of the {pb}-byte payload",
                payloads.len()
            )));
        }
        let count = (payloads.len() / pb) as u64;
        if count == 0 {
            return Ok(());
        }
        self.check_block_no(first + count - 1)?;
        // Under the commit lock: a commit run rewrites whole spans, unmodified blocks included.
        let _one = lock(&self.commit_lock);
        {
            let st = lock(&self.state);
            if st.max_seen != 0 || !st.groups.is_empty() || !st.images.is_empty() {
                return Err(Error::Config(
                    "bulk load needs an engine never modified since format".into(),
                ));
            }
        }
        let mut buf = vec![0u8; count as usize * bs];
        for (i, (img, p)) in buf.chunks_mut(bs).zip(payloads.chunks(pb)).enumerate() {
            img[BLOCK_HEADER_LEN..].copy_from_slice(p);
            seal_block(img, self.disk_id, 0, first + i as u64);
        }
        self.disk.write_at(&buf, self.geo.block_offset(first))?;
        self.disk.sync()?;
        Ok(())
    }

    pub(super) fn at_position(
        &self,
        block: u64,
        op: Op,
        bytes: &[u8],
        position: u64,
    ) -> Result<(), Error> {
        if self.log.is_some() {
            return Err(Error::WrongMode);
        }
        self.check_block_no(block)?;
        self.make_room()?;
        let mut st = lock(&self.state);
        if position <= st.max_seen {
            return Err(Error::PositionNotIncreasing {
                position,
                last: st.max_seen,
            });
        }
        st.max_seen = position;
        self.enqueue(&mut st, block, position, op, bytes.to_vec());
        Ok(())
    }

    pub(super) fn enqueue(&self, st: &mut State, block: u64, seq: u64, op: Op, bytes: Vec<u8>) {
        self.stats.modifications.fetch_add(1, Ordering::Relaxed);
        if op != Op::Write && self.images_over_share(st) && st.clean.contains(&block) {
            // Modified, the image would stay until committed: past its share of the budget
            // the modification queues instead, where it takes a few dozen bytes.
            st.evict_image(block);
        }
        let applied = st.images.contains_key(&block);
        if !applied && op == Op::Write {
            // A whole-payload write needs nothing from the disk: the block is in memory from
            // here on (the B+tree's new leaves; a split of such a leaf costs no I/O).
            st.cache_image(block, vec![0u8; self.geo.block_bytes as usize], 0);
        }
        let change = match st.images.get_mut(&block) {
            Some(c) => {
                apply_op(self.app.as_ref(), block, &mut c.image, op, &bytes);
                c.lsn = seq;
                None
            }
            None => Some((op, &bytes[..])),
        };
        st.with_group(block, |g, offset| {
            debug_assert!(
                g.entries_of(offset).all(|e| e.seq < seq),
                "block {block}: modifications queue in sequence order"
            );
            g.push(Queued {
                offset,
                seq,
                change,
            });
        });
        st.unmark_clean(block);
        if applied {
            self.stats.applied_in_memory.fetch_add(1, Ordering::Relaxed);
        }
    }
}
