//! A log device's side of the dispatcher: its threads write batches, then acknowledge them
//! in placement order themselves (no hop back to a dispatcher thread), after letting the
//! policy place the next batch.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use mariner_disk::{AlignedBuf, Disk};

use super::{DevJob, Pending, Shared};
use crate::clock::Clock;
use crate::stats::LogStats;
use crate::{Appended, Durable, DurableSink};

/// Acknowledgement order of one device whose batches may be written in parallel
/// (`device_depth` > 1): a batch is acknowledged only once every batch placed before it on
/// the device is durable too. Recovery reads a segment up to its first damaged record, so a
/// durable batch behind one that never became durable is lost; in order, it was never
/// acknowledged.
#[derive(Default)]
pub(super) struct AckOrder {
    next: u64,
    /// Durable batches waiting for an earlier one, by ticket.
    waiting: std::collections::BTreeMap<u64, Vec<Pending>>,
    /// A write failed: nothing of this device is acknowledged any more.
    failed: bool,
}

/// What a device thread needs to acknowledge its batches itself, saving a thread hop on the
/// path of every write.
pub(crate) struct DeviceCtx {
    pub(super) dev: usize,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) disk: Arc<dyn Disk>,
    pub(super) sync_each_write: bool,
    pub(super) sink: Arc<dyn DurableSink>,
    pub(super) stats: Arc<LogStats>,
    pub(super) acks: Mutex<AckOrder>,
}

impl DeviceCtx {
    /// A write that reaches the device but is neither synced nor completed (simulation).
    pub(crate) fn write_unsynced(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.disk.write_at(buf, offset)
    }

    /// Batch `ticket` finished writing. Acknowledges it and every batch it held back, in
    /// order; returns the batches to fail instead (this one failed, or an earlier one did).
    fn finish(&self, ticket: u64, ok: bool, batch: Vec<Pending>) -> Vec<Pending> {
        let Ok(mut order) = self.acks.lock() else {
            return batch;
        };
        if !ok || order.failed {
            order.failed = true;
            let mut failed = batch;
            for (_, b) in std::mem::take(&mut order.waiting) {
                failed.extend(b);
            }
            return failed;
        }
        order.waiting.insert(ticket, batch);
        // Acknowledging under the lock keeps the device's acknowledgements in order when
        // several of its threads finish at once.
        loop {
            let next = order.next;
            let Some(b) = order.waiting.remove(&next) else {
                break;
            };
            order.next += 1;
            acknowledge(self, b);
        }
        Vec::new()
    }
}

pub(super) fn device_loop(ctx: &DeviceCtx, jobs: &Mutex<Receiver<DevJob>>, shared: &Shared) {
    loop {
        // The queue's lock is held while waiting: the device's other threads queue behind it.
        let job = match jobs.lock().map(|rx| rx.recv()) {
            Ok(Ok(job)) => job,
            _ => return,
        };
        let start = Instant::now();
        let result = write_job(ctx, &job);
        ctx.stats
            .device_write_us
            .record(start.elapsed().as_micros() as u64);
        if !finish_job(ctx, shared, job, result) {
            return;
        }
    }
}

/// Writes a batch and makes it durable.
pub(crate) fn write_job(ctx: &DeviceCtx, job: &DevJob) -> std::io::Result<()> {
    ctx.stats.busy.started();
    let written = ctx.disk.write_at(&job.buf, job.offset).and_then(|()| {
        if ctx.sync_each_write {
            ctx.disk.sync()?;
        }
        Ok(())
    });
    ctx.stats.busy.finished();
    written
}

/// A batch's write finished with `result`: acknowledges what is durable in order, tells the
/// policy. Returns false once the dispatcher is gone.
pub(crate) fn finish_job(
    ctx: &DeviceCtx,
    shared: &Shared,
    job: DevJob,
    result: std::io::Result<()>,
) -> bool {
    if let Err(e) = result {
        let failed = ctx.finish(job.ticket, false, job.batch);
        return tell_policy(shared, ctx.dev, Some(job.buf), Err(e), failed);
    }
    // The device is free: the policy places the next batch first, and the device's spare
    // thread writes it while this one wakes the consumers and waiters (that took about a
    // sixth of every batch's turn on the device when the next batch waited for it).
    if !tell_policy(shared, ctx.dev, Some(job.buf), Ok(()), Vec::new()) {
        return false;
    }
    let failed = ctx.finish(job.ticket, true, job.batch);
    if failed.is_empty() {
        return true;
    }
    // An earlier write of the device failed: the log has failed already.
    let why = std::io::Error::other("an earlier write of the device failed");
    tell_policy(shared, ctx.dev, None, Err(why), failed)
}

/// Tells the policy that device `dev` finished a write with `result` (failing the batches
/// `failed`), keeps the batch's buffer for a later batch and executes what the policy decides.
/// Returns false once the dispatcher is gone.
fn tell_policy(
    shared: &Shared,
    dev: usize,
    buf: Option<AlignedBuf>,
    result: std::io::Result<()>,
    failed: Vec<Pending>,
) -> bool {
    let Some(mut w) = shared.lock() else {
        return false;
    };
    if let Some(buf) = buf {
        w.recycle(buf);
    }
    let actions = w.done(dev, result, failed);
    shared.execute(&mut w, actions);
    true
}

/// The batch is durable: consumers first (so reads see it), then each waiter.
fn acknowledge(ctx: &DeviceCtx, batch: Vec<Pending>) {
    let durable: Vec<Durable> = batch
        .iter()
        .map(|p| Durable {
            header: p.header,
            addr: p.addr,
            payload: p.entry.payload.clone(),
        })
        .collect();
    ctx.sink.durable(&durable);
    for p in batch {
        ctx.stats.durable_seq.fetch_max(p.header.seq, Relaxed);
        ctx.stats.records.fetch_add(1, Relaxed);
        ctx.stats.ack_latency_us.record(
            ctx.clock
                .now()
                .saturating_duration_since(p.arrived)
                .as_micros() as u64,
        );
        let appended = Appended {
            seq: p.header.seq,
            timestamp_ns: p.header.timestamp_ns,
            addr: p.addr,
            volume_seq: p.header.volume_seq,
        };
        let _ = p.reply.send(Ok(appended));
    }
}
