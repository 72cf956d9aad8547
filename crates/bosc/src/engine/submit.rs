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
use mariner_log::{Entry, Log};

use super::memory::State;
use super::pending::Entry as Queued;
use super::{apply_op, lock, BlockApp, Change, Inner};
use crate::format::{seal_block, LoggedBatch, Op, BATCH_PREFIX_LEN, BLOCK_HEADER_LEN};
use crate::Error;

/// A submission takes at most this share (1/N) of the own log per burst.
const BURST_SHARE: u64 = 8;

/// The longest payload of a batch record: 64 KiB, or a sixteenth of a segment if that is
/// less. A record never spans segments, so the end of a segment that the next record does not
/// fit in stays empty: a small cap keeps that waste small (and [`plan_records`] counts it).
/// One change longer than the cap still goes alone.
fn record_cap(log: &Log) -> usize {
    let part = usize::try_from(log.superblock().segment_bytes / 16).unwrap_or(usize::MAX);
    part.clamp(1, 64 << 10)
}

/// Bytes of the own log a change takes in its batch record (the record's header and prefix,
/// and a batch's padding, aside).
fn entry_bytes(c: &Change) -> u64 {
    LoggedBatch::entry_bytes(c.bytes.len()) as u64
}

/// Where each batch record of `changes` ends (exclusive indices), filling records up to `cap`
/// payload bytes, and the log bytes they take with their headers and the segment ends they
/// may leave empty (up to a record's header and cap for each segment they reach into).
fn plan_records(changes: &[Change], cap: usize, segment: u64) -> (Vec<usize>, u64) {
    let mut ends = Vec::new();
    let mut len = 0;
    let mut bytes = 0u64;
    for (i, c) in changes.iter().enumerate() {
        let add = LoggedBatch::entry_bytes(c.bytes.len());
        if len > 0 && len + add > cap {
            ends.push(i);
            len = 0;
        }
        if len == 0 {
            len = BATCH_PREFIX_LEN;
            bytes += (mariner_log::RECORD_HEADER_LEN + BATCH_PREFIX_LEN) as u64;
        }
        len += add;
        bytes += add as u64;
    }
    if len > 0 {
        ends.push(changes.len());
    }
    let waste = (mariner_log::RECORD_HEADER_LEN + cap) as u64;
    bytes += (bytes / segment.max(1) + 1) * waste;
    (ends, bytes)
}

/// The own log's size in bytes, over all its devices.
fn log_capacity(log: &Log) -> u64 {
    log.stats().segments_total.load(Ordering::Relaxed) * log.superblock().segment_bytes
}

/// An own-log burst logged and queued ([`Inner::submit`]), not yet known durable. Waiting
/// for it (or dropping it, which waits too) takes it out of `State::undurable`.
#[must_use = "a submission's durability must be waited for"]
pub(crate) struct Submitted<'a, A: BlockApp> {
    inner: &'a Inner<A>,
    /// The burst's first sequence number; `None` once waited for (or for no changes).
    first: Option<u64>,
    futures: Vec<mariner_log::AppendFuture>,
    /// Each change's sequence number: its batch record's.
    seqs: Vec<u64>,
    /// Bytes of the own log it takes (in `State::logging_bytes` until waited for).
    log_bytes: u64,
    /// Sequence numbers of the submission's earlier bursts, durable already.
    done: Vec<u64>,
}

impl<A: BlockApp> Submitted<'_, A> {
    /// Waits until every change is durable; returns their sequence numbers (the changes of one
    /// batch record share its number).
    pub(crate) fn wait(mut self) -> Result<Vec<u64>, Error> {
        self.finish()
    }

    pub(super) fn finish(&mut self) -> Result<Vec<u64>, Error> {
        let Some(first) = self.first.take() else {
            return Ok(std::mem::take(&mut self.done));
        };
        let waited = Instant::now();
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
        {
            let mut st = lock(&inner.state);
            st.undurable.remove(&first);
            st.logging_bytes = st.logging_bytes.saturating_sub(self.log_bytes);
        }
        inner.durable.notify_all();
        match failed {
            Some(e) => Err(e),
            None => {
                let mut seqs = std::mem::take(&mut self.done);
                seqs.append(&mut self.seqs);
                Ok(seqs)
            }
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

    /// Hands `changes` to the log and queues them, in one critical section per burst, so
    /// each block's queue is in sequence order whoever appends; their durability is the
    /// answer's to wait for. Forced commits happen here, before the append.
    ///
    /// A submission larger than [`BURST_SHARE`] of the own log goes in several bursts, each
    /// durable before the next is logged, and each logged only once the log has room for it
    /// ([`Self::make_log_room`]): a commit waits for the durability of what it merges, and a
    /// burst the log had no room for would wait for the space that commit's checkpoint
    /// releases — a burst twice the own log hung history's index that way.
    pub(super) fn submit(&self, changes: Vec<Change>) -> Result<Submitted<'_, A>, Error> {
        let Some((log, volume)) = &self.log else {
            return Err(Error::WrongMode);
        };
        for c in &changes {
            self.check_block_no(c.block)?;
            if u32::try_from(c.bytes.len()).is_err() {
                return Err(Error::Config(format!(
                    "a modification of block {} is {} bytes long: 4 GiB or more",
                    c.block,
                    c.bytes.len()
                )));
            }
        }
        let cap = log_capacity(log) / BURST_SHARE;
        let mut rest = changes;
        let mut done = Vec::new();
        loop {
            let mut bytes = 0;
            let n = rest
                .iter()
                .take_while(|c| {
                    bytes += entry_bytes(c);
                    bytes <= cap
                })
                .count()
                .max(1)
                .min(rest.len());
            let tail = rest.split_off(n);
            let mut burst = self.submit_burst(log, *volume, rest)?;
            if tail.is_empty() {
                burst.done = done;
                return Ok(burst);
            }
            done.extend(burst.wait()?);
            rest = tail;
        }
    }

    /// Logs and queues one burst that fits the own log (see [`Self::submit`]).
    fn submit_burst(
        &self,
        log: &Log,
        volume: u32,
        changes: Vec<Change>,
    ) -> Result<Submitted<'_, A>, Error> {
        let mut sub = Submitted {
            inner: self,
            first: None,
            futures: Vec::new(),
            seqs: Vec::new(),
            log_bytes: 0,
            done: Vec::new(),
        };
        if changes.is_empty() {
            return Ok(sub);
        }
        let segment = log.superblock().segment_bytes;
        let (ends, log_bytes) = plan_records(&changes, record_cap(log), segment);
        self.make_room()?;
        self.make_log_room(log, log_bytes)?;
        let mut st = lock(&self.state);
        let gf = st.global_frontier();
        let mut entries = Vec::with_capacity(ends.len());
        let mut start = 0;
        for &end in &ends {
            let mut batch = LoggedBatch::new(gf);
            for c in &changes[start..end] {
                // Lengths were checked in `submit`.
                let pushed = batch.push(c.block, c.op, st.local_frontier(c.block), &c.bytes);
                debug_assert!(pushed, "a modification under 4 GiB");
            }
            entries.push(Entry::write(
                volume,
                changes[start].block,
                Bytes::from(batch.finish()),
            ));
            start = end;
        }
        let burst = log.append_many(entries)?;
        let Some(first) = burst.first_seq else {
            let why = log
                .failure()
                .unwrap_or_else(|| "the log is shut down".into());
            return Err(Error::Failed(format!("the log took no record: {why}")));
        };
        let mut seqs = Vec::with_capacity(changes.len());
        let mut start = 0;
        for (seq, &end) in (first..).zip(&ends) {
            for c in &changes[start..end] {
                self.enqueue(&mut st, c.block, seq, c.op, &c.bytes);
                seqs.push(seq);
            }
            start = end;
        }
        st.max_seen = st.max_seen.max(first + ends.len() as u64 - 1);
        st.undurable.insert(first);
        st.logging_bytes += log_bytes;
        sub.first = Some(first);
        sub.futures = burst.futures;
        sub.seqs = seqs;
        sub.log_bytes = log_bytes;
        Ok(sub)
    }

    /// Commits until the own log has room for `bytes` more beside the bursts still being
    /// logged: the checkpoint after each commit releases the log behind it. Gives up (and
    /// lets the append wait for the log) only once nothing is left to commit.
    fn make_log_room(&self, log: &Log, bytes: u64) -> Result<(), Error> {
        let segment = log.superblock().segment_bytes;
        let started = Instant::now();
        let mut forced = false;
        loop {
            let s = log.stats();
            let free = s
                .segments_total
                .load(Ordering::Relaxed)
                .saturating_sub(s.segments_used.load(Ordering::Relaxed))
                .saturating_sub(1)
                .saturating_mul(segment);
            let (logging, pending) = {
                let st = lock(&self.state);
                (st.logging_bytes, !st.groups.is_empty())
            };
            if free >= bytes + logging || !pending {
                break;
            }
            forced = true;
            self.commit_cycle()?;
        }
        if forced {
            self.note_forced(started);
        }
        Ok(())
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
        if self.geo.shadow {
            // Every extent of a fresh engine lives in home 0, so its home-1 copy is read by no
            // one until a commit moves the extent there. Written now, the second home's file
            // blocks exist before the timed life of the index begins: on a sparse file the
            // first commits into it would otherwise allocate blocks under each batch's sync,
            // and the file system's journal commit delays the own log's writes behind it
            // (1.6-1.8x fewer operations at a sync every 10 operations, docs/benchmarks.md).
            self.disk.write_at(&buf, self.geo.home_offset(1, first))?;
            self.written_below(1, first + count);
        }
        self.written_below(0, first + count);
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
        self.enqueue(&mut st, block, position, op, bytes);
        Ok(())
    }

    pub(super) fn enqueue(&self, st: &mut State, block: u64, seq: u64, op: Op, bytes: &[u8]) {
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
                apply_op(self.app.as_ref(), block, &mut c.image, op, bytes);
                c.lsn = seq;
                None
            }
            None => Some((op, bytes)),
        };
        st.with_group(block, |g, offset| {
            // Equal for the changes of one batch record, queued in the order they were made.
            // The check walks the group's arena, so only while it is small: a burst of many
            // thousand changes to a few blocks would make debug builds quadratic.
            debug_assert!(
                g.len() > 1024 || g.entries_of(offset).all(|e| e.seq <= seq),
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
