//! Work that needs the images at rest: a job handed to [`Store::at_rest`] runs on the
//! applier's thread between two rounds, when every record up to a known sequence number is
//! in the images and none after it, and nothing writes them until it returns. History seeds
//! a volume's base image from its image this way while the node serves (its history broke:
//! the log let go of records the base lacked; crates/history/src/seed.rs).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::Arc;

use mariner_disk::Disk;
use mariner_log::{LogAddr, RecordHeader};

use super::Cursor;
use crate::Store;

/// A job for the images at rest ([`Store::at_rest`]).
pub type RestJob = Box<dyn FnOnce(&AtRest<'_>) + Send>;

/// Where the images stand while a job given to [`Store::at_rest`] runs.
pub struct AtRest<'a> {
    /// Every record up to it is in the images — applied, read back by reads of the image,
    /// not necessarily synced — and none after it.
    pub applied_seq: u64,
    /// The timestamp of record `applied_seq` (the watermark's, before the first record).
    pub applied_ts: u64,
    /// Per volume, the volume sequence number of its last record applied.
    pub volume_seqs: &'a BTreeMap<u32, u64>,
    /// The durable records after `applied_seq` the store holds, in order and without a gap:
    /// the log keeps them at least until the store applies them.
    pub pending: Vec<(RecordHeader, LogAddr)>,
    store: &'a Store,
}

impl AtRest<'_> {
    /// Volume `id`'s image and its size in bytes, if the store has it.
    pub fn image(&self, id: u32) -> Option<(Arc<dyn Disk>, u64)> {
        let image = self.store.image(id).ok()?;
        let size = image.size.load(Relaxed);
        Some((Arc::clone(&image.disk), size))
    }
}

impl Store {
    /// Runs `job` on the applier's thread at the end of a round (within the sync interval,
    /// or as soon as the current round ends), with the images at rest: the applier waits for
    /// it, records still become durable (the log holds them). Dropped unrun at shutdown or
    /// if the store has failed.
    pub fn at_rest(&self, job: RestJob) {
        if let Ok(mut q) = self.queue.lock() {
            q.rest.push(job);
            self.rest_queued.store(true, Release);
        }
        self.wake.notify_all();
    }

    /// Runs the jobs waiting for the images at rest, at the applier's position `c`.
    pub(super) fn run_rest_jobs(&self, c: &Cursor) {
        if !self.rest_queued.load(Acquire) {
            return;
        }
        let (jobs, pending) = {
            let Ok(mut q) = self.queue.lock() else {
                return;
            };
            let jobs = std::mem::take(&mut q.rest);
            self.rest_queued.store(false, Relaxed);
            // Only the gapless run from `c.next`: a record missing from it may yet arrive.
            let pending: Vec<(RecordHeader, LogAddr)> = q
                .items
                .range(c.next..)
                .zip(c.next..)
                .take_while(|((&k, _), want)| k == *want)
                .map(|((_, item), _)| (item.header, item.addr))
                .collect();
            (jobs, pending)
        };
        let at = AtRest {
            applied_seq: c.next - 1,
            applied_ts: c.applied_ts,
            volume_seqs: &c.volume_seqs,
            pending,
            store: self,
        };
        for job in jobs {
            job(&at);
        }
    }
}
