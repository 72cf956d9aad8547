//! The log without threads, for deterministic simulation (crates/faultsim).
//!
//! [`crate::Log::open_simulated`] opens a log whose dispatcher runs exactly as in production
//! — same placement policy, batch layout, acknowledgement order, consumer hand-off and failure
//! handling — but starts no device or timer thread: laid-out batches wait in a queue, and the
//! simulation decides when each one is written and completes, in which order, and when the
//! `T_wait` deadline fires, on a virtual [`crate::clock::VirtualClock`]. A batch the simulation
//! never completes was in flight when it crashes the disks: [`SimDevices::land`] puts its bytes
//! on the device without completing it, where the fault-injecting disk may lose or tear them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::writer::{self, DevJob, DeviceCtx, Jobs, Shared};

/// One batch in flight: laid out and handed to its device, not yet durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InFlight {
    pub dev: usize,
    /// The device's batches in placement order: 0, 1, 2, …
    pub ticket: u64,
    pub offset: u64,
    pub len: usize,
}

/// The simulation's hold on a log's devices ([`crate::Log::open_simulated`]).
pub struct SimDevices {
    pub(crate) shared: Arc<Shared>,
    pub(crate) ctxs: Vec<Arc<DeviceCtx>>,
}

impl SimDevices {
    /// The batches in flight, in the order they were handed to their devices.
    pub fn in_flight(&self) -> Vec<InFlight> {
        let Some(w) = self.shared.lock() else {
            return Vec::new();
        };
        match &w.jobs {
            Jobs::Queued(q) => q
                .iter()
                .map(|j| InFlight {
                    dev: j.dev,
                    ticket: j.ticket,
                    offset: j.offset,
                    len: j.buf.len(),
                })
                .collect(),
            Jobs::Threads(_) => Vec::new(),
        }
    }

    fn take(&self, i: usize) -> Option<DevJob> {
        let mut w = self.shared.lock()?;
        match &mut w.jobs {
            Jobs::Queued(q) if i < q.len() => Some(q.remove(i)),
            _ => None,
        }
    }

    /// Writes batch `i` of [`SimDevices::in_flight`] (and syncs, unless the devices are
    /// `O_DSYNC`) and completes it as its device thread would: acknowledges it and the batches
    /// it held back, hands them to the consumer, lets the policy place what waited. A failed
    /// write fails the log. Returns false if there was no batch `i`.
    pub fn complete(&self, i: usize) -> bool {
        let Some(job) = self.take(i) else {
            return false;
        };
        let Some(ctx) = self.ctxs.get(job.dev) else {
            return false;
        };
        let result = writer::write_job(ctx, &job);
        writer::finish_job(ctx, &self.shared, job, result);
        true
    }

    /// Puts batch `i`'s bytes on its device without syncing or completing it: the write was
    /// under way when the power went. Its waiters are never answered. Returns false if there
    /// was no batch `i`.
    pub fn land(&self, i: usize) -> bool {
        let Some(job) = self.take(i) else {
            return false;
        };
        if let Some(ctx) = self.ctxs.get(job.dev) {
            let _ = ctx.write_unsynced(&job.buf, job.offset);
        }
        true
    }

    /// When the policy's `T_wait` deadline falls, if it has one.
    pub fn next_deadline(&self) -> Option<Instant> {
        let w = self.shared.lock()?;
        let d = w.core.next_deadline()?;
        Some(w.epoch + Duration::from_nanos(d))
    }

    /// Runs the `T_wait` deadline if the clock has reached it; returns whether it had.
    pub fn fire_timer(&self) -> bool {
        writer::fire_timer(&self.shared)
    }
}
