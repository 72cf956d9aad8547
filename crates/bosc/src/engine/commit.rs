//! The commit cycle: planning runs from the sweep cursor (or the runs of cached images a
//! forced commit writes first), the three-stage pipeline that reads, merges and
//! double-writes them, retiring what was written from the queues, and the checkpoint that
//! ends each cycle and releases the own log behind it.
//!
//! Apart because it is the only path that writes the data disk in place: the write-ahead
//! rule (`wait_durable`), the double write and the checkpoint order are all here.

use std::sync::atomic::Ordering;
use std::sync::PoisonError;
use std::time::{Duration, Instant};

use mariner_log::DeviceBusy;

use super::memory::State;
use super::pending::{group_of, GROUP_BLOCKS};
use super::query::block_lsns;
use super::{homes, lock, BlockApp, Inner};
use crate::format::{seal_block, Checkpoint, BLOCK_HEADER_LEN};
use crate::runs::{plan_runs, Run};
use crate::Error;
use mariner_cpuclass::CpuClass;

/// The background sweep's least share of the device's time ([`Inner::sweep_duty`]).
pub(super) const MIN_DUTY: f64 = 0.1;
/// The longest rest after one batch: the queues may fill meanwhile, and the next batch looks
/// again.
const MAX_REST: Duration = Duration::from_millis(50);

/// Merged runs waiting for one double write; at most the double-write area's slots.
#[derive(Default)]
pub(super) struct Batch {
    pub(super) runs: Vec<(Run, Vec<u8>)>,
    pub(super) staged: Vec<Staged>,
    pub(super) blocks: u64,
}

/// The merging side of the commit pipeline's writer thread: one batch in flight at most,
/// retired on this side once written.
pub(super) struct BatchWriter<'a, A: BlockApp> {
    pub(super) inner: &'a Inner<A>,
    pub(super) to_write: std::sync::mpsc::SyncSender<Batch>,
    pub(super) written_back: std::sync::mpsc::Receiver<(Batch, Result<(), Error>)>,
    pub(super) in_flight: bool,
    /// Blocks written and retired so far.
    pub(super) blocks: u64,
}

impl<A: BlockApp> BatchWriter<'_, A> {
    /// Hands `batch` to the writer once the one before it is written and retired.
    pub(super) fn send(&mut self, batch: Batch) -> Result<(), Error> {
        self.wait()?;
        self.to_write
            .send(batch)
            .map_err(|_| Error::Failed("commit writer stopped".into()))?;
        self.in_flight = true;
        Ok(())
    }

    /// Waits for the batch in flight, if any, and retires it.
    pub(super) fn wait(&mut self) -> Result<(), Error> {
        if std::mem::take(&mut self.in_flight) {
            let (batch, r) = self
                .written_back
                .recv()
                .map_err(|_| Error::Failed("commit writer stopped".into()))?;
            r?;
            self.blocks += self.inner.retire_batch(batch);
        }
        Ok(())
    }
}

/// One block of a run as the commit cycle carries it.
pub(super) struct Staged {
    pub(super) block: u64,
    /// Highest sequence number applied; entries at or below it leave the queue.
    pub(super) upto: u64,
}

impl<A: BlockApp> Inner<A> {
    /// Waits until a commit may write modifications up to `seq` to the data disk.
    pub(super) fn wait_durable(&self, seq: u64) -> Result<(), Error> {
        let mut st = lock(&self.state);
        loop {
            // Failed first: a burst the log lost leaves `undurable` after it fails the
            // engine, so past the wait it would look durable.
            if let Some(why) = &st.failed {
                return Err(Error::Failed(why.clone()));
            }
            if st.durable_through() >= seq {
                return Ok(());
            }
            st = self
                .durable
                .wait(st)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    pub(super) fn background(&self, every: Duration) {
        loop {
            {
                let st = lock(&self.state);
                if st.shutdown || st.failed.is_some() {
                    return;
                }
                let (st, _) = self
                    .wake
                    .wait_timeout(st, every)
                    .unwrap_or_else(PoisonError::into_inner);
                if st.shutdown {
                    return;
                }
            }
            if !self.sweep_due() {
                continue;
            }
            // An error is recorded in `failed` and reported to every later caller.
            let _ = self.commit_planned(&Self::plan, true);
        }
    }

    /// The share of the time the background sweep may keep the device busy now
    /// ([`crate::BoscConfig::sweep_full_above`]): a tenth at `sweep_above`, rising linearly
    /// with the fuller of the queues and the own log to all of it at `sweep_full_above`.
    pub(super) fn sweep_duty(&self) -> f64 {
        let (from, full) = (self.cfg.sweep_above, self.cfg.sweep_full_above);
        if full <= from {
            return 1.0;
        }
        let budget = self.budget.load(Ordering::Relaxed).max(1) as f64;
        let queues = lock(&self.state).pending_bytes() as f64 / budget;
        let ramp = ((queues.max(self.log_used_share()) - from) / (full - from)).clamp(0.0, 1.0);
        MIN_DUTY + (1.0 - MIN_DUTY) * ramp
    }

    /// After a batch of the background sweep that kept the device busy for `busy`: rests so
    /// the sweep's share of the time is [`Self::sweep_duty`]'s, at most [`MAX_REST`].
    fn rest_after(&self, busy: Duration) {
        let duty = self.sweep_duty();
        if duty >= 1.0 {
            return;
        }
        let rest = busy.mul_f64(1.0 / duty - 1.0).min(MAX_REST);
        std::thread::sleep(rest);
        self.stats
            .sweep_rest_ns
            .fetch_add(rest.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Whether the background cycle sweeps now ([`crate::BoscConfig::sweep_above`]).
    fn sweep_due(&self) -> bool {
        let above = self.cfg.sweep_above;
        if above <= 0.0 {
            return true;
        }
        let budget = self.budget.load(Ordering::Relaxed) as f64;
        if lock(&self.state).pending_bytes() as f64 > above * budget {
            return true;
        }
        // The own log is released only behind committed modifications: a block left pending
        // for long would hold it until writers wait for room.
        self.log_used_share() > 0.5
    }

    /// The share of the own log's segments in use (0 without an own log).
    fn log_used_share(&self) -> f64 {
        self.log.as_ref().map_or(0.0, |(log, _)| {
            let s = log.stats();
            let total = s.segments_total.load(Ordering::Relaxed);
            if total == 0 {
                return 0.0;
            }
            s.segments_used.load(Ordering::Relaxed) as f64 / total as f64
        })
    }

    pub(super) fn fail(&self, e: Error) -> Error {
        let mut st = lock(&self.state);
        if st.failed.is_none() {
            st.failed = Some(e.to_string());
        }
        drop(st);
        // A commit waiting for durability gives up.
        self.durable.notify_all();
        e
    }

    /// Plans the runs of one cycle from the sweep cursor (wrapping once).
    pub(super) fn plan(&self) -> Vec<Run> {
        let mut st = lock(&self.state);
        let runs_per_cycle = self.cfg.runs_per_cycle.max(1);
        // A run holds at least one pending block and at most `max_run`, and the greedy planner
        // looks one pending block past a run's end: this many pending blocks plan the cycle's
        // runs exactly as all of them would, without walking every queue each cycle.
        let enough = runs_per_cycle * self.geo.max_run as usize + 1;
        let pending = |from: u64, st: &State| -> Vec<u64> {
            st.groups
                .range(from / GROUP_BLOCKS..)
                .flat_map(|(&k, g)| g.offsets().map(move |o| k * GROUP_BLOCKS + u64::from(o)))
                .filter(|&b| b >= from)
                .take(enough)
                .collect()
        };
        let mut blocks = pending(st.cursor, &st);
        if blocks.is_empty() {
            st.cursor = 0;
            blocks = pending(0, &st);
        }
        let mut runs = plan_runs(
            &blocks,
            u64::from(self.geo.max_run),
            self.cfg.min_pending_ratio,
        );
        runs.truncate(runs_per_cycle);
        if let Some(last) = runs.last() {
            st.cursor = last.start + last.len;
        }
        runs
    }

    /// Plans runs over the pending blocks whose whole image is in memory (a B+tree split's
    /// new leaf, a `write`). A B+tree takes its new leaves from the free region in block
    /// order, so these blocks bunch and commit in dense runs, and committing one frees its
    /// image — the most memory a block's commit can free. Only while such images hold half
    /// the queues' memory or more: otherwise the sweep frees as much per cycle, and a cycle of
    /// a few image runs would pay a checkpoint for little. Leaves the sweep cursor alone.
    pub(super) fn plan_images(&self) -> Vec<Run> {
        let st = lock(&self.state);
        let mut image_bytes = 0;
        let mut blocks = Vec::new();
        for (&b, c) in &st.images {
            if st.has_pending(b) {
                image_bytes += c.footprint();
                blocks.push(b);
            }
        }
        if image_bytes * 2 < st.memory_bytes {
            return Vec::new();
        }
        let mut runs = plan_runs(
            &blocks,
            u64::from(self.geo.max_run),
            self.cfg.min_pending_ratio,
        );
        // Only runs worth a sequential I/O: a lone image block is left to the sweep.
        runs.retain(|r| r.len > 1);
        runs.truncate(self.cfg.runs_per_cycle.max(1));
        runs
    }

    /// A forced commit's first choice (see [`Self::plan_images`]); 0 when it found no run.
    pub(super) fn commit_images(&self) -> Result<u64, Error> {
        let runs = std::cell::Cell::new(0u64);
        let written = self.commit_planned(
            &|inner: &Self| {
                let planned = inner.plan_images();
                runs.set(planned.len() as u64);
                planned
            },
            false,
        )?;
        self.stats
            .image_runs_committed
            .fetch_add(runs.get(), Ordering::Relaxed);
        Ok(written)
    }

    pub(super) fn commit_cycle(&self) -> Result<u64, Error> {
        self.commit_planned(&Self::plan, false)
    }

    /// One cycle of the runs `plan` picks; `rest`: the background sweep's, which rests
    /// between batches ([`Self::rest_after`]).
    pub(super) fn commit_planned(
        &self,
        plan: &dyn Fn(&Self) -> Vec<Run>,
        rest: bool,
    ) -> Result<u64, Error> {
        let _one = lock(&self.commit_lock);
        if let Some(why) = &lock(&self.state).failed {
            return Err(Error::Failed(why.clone()));
        }
        let mut runs = plan(self);
        if self.homes.is_some() {
            runs = self.whole_extents(runs);
        }
        if runs.is_empty() {
            return Ok(0);
        }
        let before = lock(&self.state).memory_bytes;
        let written = self.pipeline(&runs, rest).map_err(|e| self.fail(e))?;
        self.write_checkpoint().map_err(|e| self.fail(e))?;
        let after = lock(&self.state).memory_bytes;
        self.return_freed(before.saturating_sub(after));
        Ok(written)
    }

    /// Three stages on three threads: a reader reads the runs in order, this thread merges
    /// each into batches that fill the double-write area, and a writer writes each batch
    /// ([`Self::write_batch`]) and hands it back, to be retired here. So reading and merging
    /// batch k+1 overlap batch k's writes and syncs; the runs of one cycle are disjoint, so a
    /// batch merged early holds no block the one being written holds. Only this thread
    /// allocates: the other two are new every cycle, and memory they allocated and freed
    /// would stay behind in their allocator arenas.
    pub(super) fn pipeline(&self, runs: &[Run], rest: bool) -> Result<u64, Error> {
        let bs = self.geo.block_bytes as usize;
        std::thread::scope(|s| {
            let (tx, rx) = std::sync::mpsc::sync_channel::<Result<(Run, Vec<u8>), Error>>(1);
            s.spawn(move || {
                let _class = self.cfg.cpu_class.as_ref().map(CpuClass::join);
                for &run in runs {
                    let mut buf = self.run_buf(bs * run.len as usize);
                    let r = if self.run_is_cached(run) {
                        // Every block is overwritten; zeros pass the block check.
                        buf.fill(0);
                        Ok((run, buf))
                    } else {
                        self.read_span(&mut buf, run.start, false)
                            .map(|()| (run, buf))
                    };
                    let stop = r.is_err();
                    if tx.send(r).is_err() || stop {
                        return;
                    }
                }
            });
            let (wtx, wrx) = std::sync::mpsc::sync_channel::<Batch>(0);
            let (dtx, drx) = std::sync::mpsc::sync_channel::<(Batch, Result<(), Error>)>(1);
            s.spawn(move || {
                let _class = self.cfg.cpu_class.as_ref().map(CpuClass::join);
                for batch in wrx {
                    let started = Instant::now();
                    let r = self.write_batch(&batch);
                    let (busy, written) = (started.elapsed(), r.is_ok());
                    if dtx.send((batch, r)).is_err() {
                        return;
                    }
                    // After handing the batch back: it retires (and frees its share of the
                    // queues) while this thread rests.
                    if rest && written {
                        self.rest_after(busy);
                    }
                }
            });
            let mut writer = BatchWriter {
                inner: self,
                to_write: wtx,
                written_back: drx,
                in_flight: false,
                blocks: 0,
            };
            let mut batch = Batch::default();
            for got in rx {
                let (run, mut buf) = got?;
                if batch.blocks + run.len > self.batch_limit() {
                    writer.send(std::mem::take(&mut batch))?;
                }
                self.stage_run(run, &mut buf, &mut batch.staged)?;
                batch.blocks += run.len;
                batch.runs.push((run, buf));
            }
            if !batch.runs.is_empty() {
                writer.send(batch)?;
            }
            writer.wait()?;
            Ok(writer.blocks)
        })
    }

    /// Blocks written with one sync: the double-write area's, [`crate::format::NO_DW_BATCH_RUNS`]
    /// runs without one, or [`homes::BATCH_EXTENTS`] extents.
    fn batch_limit(&self) -> u64 {
        if self.homes.is_some() {
            homes::BATCH_EXTENTS * u64::from(self.geo.max_run)
        } else {
            self.geo.batch_blocks()
        }
    }

    /// A run buffer of `len` bytes from the pool (contents undefined).
    pub(super) fn run_buf(&self, len: usize) -> Vec<u8> {
        let mut buf = lock(&self.run_bufs).pop().unwrap_or_default();
        buf.resize(len, 0);
        buf
    }

    /// Whether every block of the run has its whole image in memory and pending modifications
    /// (a B+tree's new leaves): then [`Self::stage_run`] overwrites every block of the run and
    /// nothing needs reading. Stays true until the run is committed: only commits (under the
    /// commit lock, held) retire entries, and only clean images are evicted.
    pub(super) fn run_is_cached(&self, run: Run) -> bool {
        let st = lock(&self.state);
        (run.start..run.start + run.len).all(|b| st.images.contains_key(&b) && st.has_pending(b))
    }

    /// Applies a run's pending modifications to its image read from disk (`buf`) and seals
    /// every block that changes; what each block now includes goes to `staged`.
    pub(super) fn stage_run(
        &self,
        run: Run,
        buf: &mut [u8],
        staged: &mut Vec<Staged>,
    ) -> Result<(), Error> {
        let bs = self.geo.block_bytes as usize;
        let mut st = lock(&self.state);
        let lsns = block_lsns(buf, self.disk_id, bs, run.start)?;
        // A copy kept at an earlier commit would miss what this commit retires.
        let stale: Vec<u64> = st
            .hot
            .range(run.start..run.start + run.len)
            .map(|(&b, _)| b)
            .collect();
        for block in stale {
            st.drop_hot(block);
        }
        let merged = self.merge_pending(&st, run.start, buf, &lsns);
        let budget = self.budget.load(Ordering::Relaxed);
        for (i, (img, m)) in buf.chunks_mut(bs).zip(merged).enumerate() {
            let Some((upto, mut lsn)) = m else {
                continue;
            };
            let block = run.start + i as u64;
            if let Some(c) = st.images.get(&block) {
                img.copy_from_slice(&c.image);
                lsn = c.lsn.max(lsns[i]);
            } else if st.hot_has_room(budget) && self.app.hot(block, &img[BLOCK_HEADER_LEN..]) {
                // Everything queued for the block is merged into this copy: what comes later
                // is queued on top of it, and [`Bosc::take_hot`] applies that.
                st.keep_hot(block, img.to_vec(), upto);
                self.stats.kept_hot.fetch_add(1, Ordering::Relaxed);
            }
            seal_block(img, self.disk_id, lsn, block);
            staged.push(Staged { block, upto });
        }
        Ok(())
    }

    /// Double write: the batch's runs go to consecutive slots of the double-write area and are
    /// synced before any block is overwritten in place, so a torn in-place write is repaired at
    /// open; then in place, and one more sync. Not before everything merged into the batch is
    /// durable in the log (write-ahead). Without a double-write area (`dw_runs` 0) only in
    /// place: a block this tears is found at open ([`Inner::find_torn`]).
    pub(super) fn write_batch(&self, batch: &Batch) -> Result<(), Error> {
        let newest = batch.staged.iter().map(|s| s.upto).max().unwrap_or(0);
        self.wait_durable(newest)?;
        if let Some(homes) = &self.homes {
            return self.move_extents(batch, homes);
        }
        if let Some(end) = batch.runs.iter().map(|(r, _)| r.start + r.len).max() {
            self.fill_ahead(0, end)?;
        }
        if self.geo.dw_runs > 0 {
            let mut slot = 0;
            for (run, buf) in &batch.runs {
                self.disk.write_at(buf, self.geo.dw_offset(slot))?;
                slot += run.len;
            }
            self.disk.sync()?;
        }
        // Queries read blocks under the gate's read side: none may see a block half written
        // (a buffered read and write of one page are not atomic to each other). One run at a
        // time, so a query waits for one run's write at most.
        for (run, buf) in &batch.runs {
            let _gate = self.gate.write().unwrap_or_else(PoisonError::into_inner);
            self.disk.write_at(buf, self.geo.block_offset(run.start))?;
        }
        if let Some(gap) = &self.cfg.write_gap {
            for (run, _) in &batch.runs {
                let mut at = self.geo.block_offset(run.start);
                let end = self.geo.block_offset(run.start + run.len);
                while at < end {
                    let n = DeviceBusy::PIECE.min(end - at);
                    (gap.0)();
                    self.disk.write_out(at, n)?;
                    at += n;
                }
            }
        }
        self.disk.sync()?;
        Ok(())
    }

    /// A written batch's entries leave the queues and its buffers go back to the pool;
    /// returns its blocks.
    pub(super) fn retire_batch(&self, mut batch: Batch) -> u64 {
        self.retire(&batch.staged);
        let (runs, blocks) = (batch.runs.len() as u64, batch.blocks);
        // The pool keeps what a pipeline holds at most: a batch being written, one being
        // merged, and the reader's two.
        let keep = 2 * (self.batch_limit() / u64::from(self.geo.max_run.max(1))) as usize + 2;
        let mut pool = lock(&self.run_bufs);
        for (_, buf) in batch.runs.drain(..) {
            if pool.len() < keep {
                pool.push(buf);
            }
        }
        drop(pool);
        self.stats.runs_committed.fetch_add(runs, Ordering::Relaxed);
        self.stats.batches_written.fetch_add(1, Ordering::Relaxed);
        self.stats
            .blocks_written
            .fetch_add(blocks, Ordering::Relaxed);
        blocks
    }

    /// Drops committed entries from the queues, one rebuild per group.
    pub(super) fn retire(&self, staged: &[Staged]) {
        let _gate = self.gate.write().unwrap_or_else(PoisonError::into_inner);
        let mut st = lock(&self.state);
        for same in staged.chunk_by(|a, b| group_of(a.block).0 == group_of(b.block).0) {
            let Some(first) = same.first().filter(|s| st.group(s.block).is_some()) else {
                continue;
            };
            let mut upto = [None; GROUP_BLOCKS as usize];
            for s in same {
                upto[group_of(s.block).1 as usize] = Some(s.upto);
            }
            st.with_group(first.block, |g, _| {
                g.rebuild(|e| {
                    upto[e.offset as usize]
                        .is_none_or(|u| e.seq > u)
                        .then_some(e)
                })
            });
            for s in same {
                st.note_clean(s.block);
            }
        }
    }

    pub(super) fn write_checkpoint(&self) -> Result<(), Error> {
        let (ckpt, counter) = {
            let st = lock(&self.state);
            (st.global_frontier() - 1, st.ckpt_counter + 1)
        };
        if ckpt == lock(&self.state).durable_ckpt {
            return Ok(());
        }
        let c = Checkpoint {
            geometry: self.geo,
            counter,
            checkpoint: ckpt,
            disk_id: self.disk_id,
        };
        if let Some(homes) = &self.homes {
            // The map as of this checkpoint, to its slot; the checkpoint names it by counter.
            let mut map = lock(homes).clone();
            map.counter = counter;
            map.checkpoint = ckpt;
            self.disk.write_at(
                &map.encode(&self.geo, self.disk_id),
                self.geo.map_slot(counter),
            )?;
        }
        self.disk.write_at(&c.encode(), c.slot())?;
        self.disk.sync()?;
        {
            let mut st = lock(&self.state);
            st.ckpt_counter = counter;
            st.durable_ckpt = ckpt;
        }
        if let Some(holder) = &self.holder {
            // Log space behind the global frontier is recycled.
            holder.release(ckpt);
        }
        Ok(())
    }
}
