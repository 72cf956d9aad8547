//! The applier thread: records in sequence order into the images, then sync and release.

mod defer;
mod rest;

pub use rest::{AtRest, RestJob};

use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use mariner_disk::Disk;
use mariner_log::{Durable, LogAddr, RecordHeader, RecordKind, RECORD_HEADER_LEN};

use crate::{Item, OutOfSpace, Progress, Store, StoreError};

/// Records taken from the queue per round.
const ROUND: usize = 256;

/// Payload bytes taken from the queue per round (a round always takes at least one record).
/// Under log pressure every round ends in a sync and a release: 256 records of 1 MiB made one
/// round of 256 MiB, whose sync freed a quarter of the default log at once while the writers
/// waited, so their p99 was 255 ms. In 16 MiB rounds the log frees space as the images take
/// it: 92 ms, at the same throughput (1 MiB sequential writes at depth 8, 1.5 GiB after a
/// 1 GiB fill; the seq group of bench/nbd-compare.sh).
const ROUND_BYTES: u64 = 16 << 20;

/// How long the applier waits, out of space, before it tries again. Trying costs a failed
/// write (or sync) and a read of the record back from the log: cheap enough to poll, where
/// asking the file system for its free space would not tell whether this write fits.
const NO_SPACE_RETRY: Duration = Duration::from_secs(1);

/// Largest piece of a payload written to an image with one `pwrite`; pieces end on multiples
/// of it in the image. The page cache sizes a folio by the write that creates it, so one 1 MiB
/// `pwrite` leaves a 1 MiB folio, and ext4 (Linux 6.16 on, large folios over buffer heads)
/// walks every block of a folio on each later write into it and again when writing it back.
/// On a file filled with 1 MiB writes, buffered 4 KiB random writes with an fdatasync every
/// 256 cost 88 µs of system CPU each (fio: 8.5k/s); after a 4 or 16 KiB fill, 9-11 µs
/// (18-27k/s). The applier, writing back such writes on a volume filled sequentially, spent
/// 55% of its CPU in those walks and 71 µs per record; with 16 KiB pieces 12-15 µs
/// (bench/writeback.sh). 16 KiB folios cost no more than 4 KiB ones there; a 1 MiB record
/// takes 64 writes (applying a sequential 1 GiB fill: 1.14 s of CPU instead of 0.97 s).
const IMAGE_WRITE_PIECE: u64 = 16 << 10;

/// Writes `payload` at `offset` of `disk` in pieces of at most [`IMAGE_WRITE_PIECE`] bytes,
/// each within one piece-aligned window.
fn write_in_pieces(disk: &dyn Disk, payload: &[u8], offset: u64) -> std::io::Result<()> {
    let mut done = 0usize;
    while done < payload.len() {
        let at = offset + done as u64;
        let room = IMAGE_WRITE_PIECE - at % IMAGE_WRITE_PIECE;
        let n = usize::try_from(room).map_or(payload.len() - done, |r| r.min(payload.len() - done));
        disk.write_at(&payload[done..done + n], at)?;
        done += n;
    }
    Ok(())
}

/// Takes the records from `next` on, in order and without a gap, at most [`ROUND`] of them
/// and [`ROUND_BYTES`] of payload (always at least one).
fn take_round(items: &mut BTreeMap<u64, Item>, next: u64) -> Vec<Item> {
    let mut out = Vec::new();
    let mut bytes = 0u64;
    while out.len() < ROUND && bytes < ROUND_BYTES {
        let expect = next + out.len() as u64;
        if items.first_key_value().is_none_or(|(&k, _)| k != expect) {
            break;
        }
        if let Some((_, item)) = items.pop_first() {
            bytes += u64::from(item.header.payload_len);
            out.push(item);
        }
    }
    out
}

/// Largest run of records read back from the log with one read.
const READBACK_BYTES: u64 = 1 << 20;

/// How many records at the front of `items` to read back from the log with one read: write
/// records without a payload in memory that lie back to back on one device (each starts
/// where the previous one's span ends, as the records of a batch and of batches written one
/// after another do), at most `max_bytes` in all: [`READBACK_BYTES`], or less where the log
/// reads less at once ([`mariner_log::Log::max_read_following`]: a segment of a log formatted
/// with segments under 1 MiB; a longer run failed the store).
fn readback_run(items: &[Item], max_bytes: u64) -> usize {
    let needs_read = |i: &Item| i.header.kind == RecordKind::Write && i.payload.is_none();
    let Some(first) = items.first().filter(|i| needs_read(i)) else {
        return 0;
    };
    let mut n = 1;
    let mut prev = first;
    for item in &items[1..] {
        let follows = item.addr.dev() == prev.addr.dev()
            && item.addr.offset() == prev.addr.offset() + u64::from(prev.header.span);
        let end =
            item.addr.offset() + RECORD_HEADER_LEN as u64 + u64::from(item.header.payload_len);
        if !needs_read(item) || !follows || end - first.addr.offset() > max_bytes {
            break;
        }
        n += 1;
        prev = item;
    }
    n
}

/// The applier's position and what it applied since its last sync.
pub(crate) struct Cursor {
    /// Scratch for records read back from the log, reused run after run.
    readback: Vec<u8>,
    next: u64,
    applied_ts: u64,
    /// Per volume, the volume sequence number of the last record applied.
    volume_seqs: BTreeMap<u32, u64>,
    unsynced_bytes: u64,
    last_sync: Instant,
    /// The records applied since the last sync, to apply again if the sync fails for want of
    /// space: the failed sync may have lost them (the fsync-gate lesson), the log has them.
    unsynced: Vec<(RecordHeader, LogAddr)>,
    /// Out of space: when to try again.
    retry_at: Option<Instant>,
    /// The store reports itself out of space until what it applied after the wait is synced.
    short_of_space: bool,
}

/// Why the images could not be synced, and whose (`None`: the store's watermark).
struct SyncError {
    volume: Option<u32>,
    error: StoreError,
}

impl From<StoreError> for SyncError {
    fn from(error: StoreError) -> Self {
        Self {
            volume: None,
            error,
        }
    }
}

/// Whether the applier goes on after a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Round {
    Again,
    Stop,
}

impl Store {
    /// The applier's position at start: just above the persisted watermark.
    pub(crate) fn cursor(&self) -> Cursor {
        let p = self.progress();
        Cursor {
            readback: Vec::new(),
            next: p.applied_seq + 1,
            applied_ts: p.applied_ts,
            volume_seqs: p.volume_seqs,
            unsynced_bytes: 0,
            last_sync: self.clock.now(),
            unsynced: Vec::new(),
            retry_at: None,
            short_of_space: false,
        }
    }

    /// The applier thread.
    pub(crate) fn run(self: Arc<Self>) {
        let mut c = self.cursor();
        while self.round(&mut c, true) == Round::Again {}
    }

    /// One round: waits (if `blocking`) for records or for a sync to fall due, applies what
    /// is ready, syncs and releases if due.
    pub(crate) fn round(&self, c: &mut Cursor, blocking: bool) -> Round {
        let interval = Duration::from_millis(self.cfg.sync_interval_ms);
        let wait = if blocking {
            self.wait_for_space(c);
            interval.saturating_sub(self.since(c.last_sync))
        } else {
            if c.retry_at.is_some_and(|t| t > self.clock.now()) {
                return Round::Again;
            }
            c.retry_at = None;
            Duration::ZERO
        };
        let (items, shutdown) = self.take_ready(c.next, wait);
        let took = items.len();
        if let Err(e) = self.apply_all(items, c) {
            self.fail(&e);
            return Round::Stop;
        }
        if let Err(e) = self.sync_if_due(c, shutdown) {
            self.fail(&e);
            return Round::Stop;
        }
        // Out of space at shutdown, what was not applied stays in the log for the next
        // start.
        if shutdown && (took == 0 || c.retry_at.is_some()) {
            return Round::Stop;
        }
        self.run_rest_jobs(c);
        Round::Again
    }

    /// How long ago `t` was, by the store's clock.
    fn since(&self, t: Instant) -> Duration {
        self.clock.now().saturating_duration_since(t)
    }

    /// When a round next has work by the clock alone: a retry out of space, write-back of the
    /// queued records falling due, or a sync falling due. `None`: nothing waits for time.
    pub(crate) fn deadline(&self, c: &Cursor) -> Option<Instant> {
        let now = self.clock.now();
        if let Some(at) = c.retry_at {
            return Some(at);
        }
        let mut due: Option<Instant> = None;
        if let Ok(q) = self.queue.lock() {
            if q.items.first_key_value().is_some_and(|(k, _)| *k == c.next) {
                due = Some(now + self.defer(&q).unwrap_or_default());
            }
        }
        if c.next - 1 > self.applied_seq() {
            let interval = Duration::from_millis(self.cfg.sync_interval_ms);
            let sync = c.last_sync + interval;
            due = Some(due.map_or(sync, |d| d.min(sync)));
        }
        due
    }

    /// Syncs the images and releases the log once enough was applied, or time is up; out of
    /// space, takes the records since the last sync back to apply them again.
    fn sync_if_due(&self, c: &mut Cursor, shutdown: bool) -> Result<(), StoreError> {
        let interval = Duration::from_millis(self.cfg.sync_interval_ms);
        let behind = c.next - 1 > self.applied_seq();
        let due = c.unsynced_bytes >= self.cfg.sync_bytes
            || self.since(c.last_sync) >= interval
            || self.log_pressure()
            || c.short_of_space
            || shutdown;
        if behind && due {
            match self.sync_all(c) {
                Ok(()) => {
                    c.unsynced_bytes = 0;
                    c.unsynced.clear();
                    c.last_sync = self.clock.now();
                }
                Err(e) if e.error.is_no_space() => {
                    let reason = format!("syncing the images failed: {}", e.error);
                    self.apply_again_since_sync(c);
                    self.wait_for_room(e.volume, reason, c);
                }
                Err(e) => return Err(e.error),
            }
        } else if !behind {
            c.last_sync = self.clock.now();
        }
        let synced = c.next - 1 <= self.applied_seq();
        if c.short_of_space && c.retry_at.is_none() && synced {
            self.room_again(c);
        }
        Ok(())
    }

    /// Out of space: records the reason, which refuses the volume's writes (every volume's,
    /// with `volume` `None`), and has the applier try again after [`NO_SPACE_RETRY`].
    ///
    /// A volume already out of space stays the one to blame when then the watermark cannot be
    /// written either: on a full file system the watermark's new file is the next thing
    /// that finds no room, and the volume's writes are what filled it.
    fn wait_for_room(&self, volume: Option<u32>, reason: String, c: &mut Cursor) {
        let reason = format!("{reason}; trying again every {NO_SPACE_RETRY:?}");
        if !c.short_of_space {
            tracing::warn!(volume, %reason, "out of space: applying waits for room");
        }
        if let Ok(mut o) = self.out_of_space.lock() {
            let blamed = o
                .as_ref()
                .and_then(|o| o.volume)
                .filter(|_| volume.is_none());
            if blamed.is_none() {
                *o = Some(OutOfSpace { volume, reason });
            }
            self.short_of_space
                .store(true, std::sync::atomic::Ordering::Release);
        }
        c.short_of_space = true;
        c.retry_at = Some(self.clock.now() + NO_SPACE_RETRY);
    }

    /// What was applied after waiting for space is synced: the volumes take writes again.
    fn room_again(&self, c: &mut Cursor) {
        tracing::info!("space again: applied and synced what waited for room");
        if let Ok(mut o) = self.out_of_space.lock() {
            *o = None;
            self.short_of_space
                .store(false, std::sync::atomic::Ordering::Release);
        }
        c.short_of_space = false;
    }

    /// Waits until it is time to try again after running out of space (or shutdown).
    fn wait_for_space(&self, c: &mut Cursor) {
        let Some(at) = c.retry_at.take() else {
            return;
        };
        let Ok(q) = self.queue.lock() else {
            return;
        };
        let left = at.saturating_duration_since(self.clock.now());
        let _ = self.wake.wait_timeout_while(q, left, |q| !q.shutdown);
    }

    /// Puts records taken from the queue back, to be taken again in order.
    fn requeue(&self, items: impl IntoIterator<Item = Item>) {
        if let Ok(mut q) = self.queue.lock() {
            for item in items {
                q.items.insert(item.header.seq, item);
            }
            self.stats
                .queued_records
                .store(q.items.len() as u64, Relaxed);
        }
    }

    /// A sync failed for want of space and may have lost what was applied since the last
    /// good one: maps those records in the overlay again (reads take them from the log) and
    /// queues them to be applied again from the watermark on.
    fn apply_again_since_sync(&self, c: &mut Cursor) {
        let p = self.progress();
        let records = std::mem::take(&mut c.unsynced);
        let now = self.clock.now();
        let items = records.into_iter().map(|(header, addr)| {
            self.map_overlay(
                &Durable {
                    header,
                    addr,
                    payload: Bytes::new(),
                },
                None,
            );
            Item {
                header,
                addr,
                payload: None,
                accepted: now,
            }
        });
        self.requeue(items.collect::<Vec<_>>());
        c.next = p.applied_seq + 1;
        c.applied_ts = p.applied_ts;
        c.volume_seqs = p.volume_seqs;
        c.unsynced_bytes = 0;
        self.stats.applied_seq.store(p.applied_seq, Relaxed);
    }

    /// Waits up to `wait` for the record `next` and for the moment to apply it (see
    /// [`Store::defer`]) and returns it with its contiguous successors.
    fn take_ready(&self, next: u64, wait: Duration) -> (Vec<Item>, bool) {
        let until = self.clock.now() + wait;
        let Ok(mut q) = self.queue.lock() else {
            return (Vec::new(), true);
        };
        // A void record recovery counted as a gap (see `Store::attach`) can become durable
        // after the applier passed its number: drop such late arrivals.
        let stale = |q: &mut crate::Queue| {
            while q.items.first_key_value().is_some_and(|(k, _)| *k < next) {
                q.items.pop_first();
            }
        };
        stale(&mut q);
        let ready = |q: &crate::Queue| {
            q.shutdown
                || (!self.paused.load(Relaxed)
                    && q.items.first_key_value().is_some_and(|(k, _)| *k == next))
        };
        if !ready(&q) && q.rest.is_empty() {
            q.applier_waiting = true;
            let r = self
                .wake
                .wait_timeout_while(q, wait, |q| !ready(q) && q.rest.is_empty());
            q = match r {
                Ok((q, _)) => q,
                Err(_) => return (Vec::new(), true),
            };
            q.applier_waiting = false;
            stale(&mut q);
        }
        // Write-back: let the writers' burst pass first. New records do not wake this wait.
        while ready(&q) {
            let Some(nap) = self.defer(&q) else { break };
            let left = until.saturating_duration_since(self.clock.now());
            if left.is_zero() {
                return (Vec::new(), q.shutdown);
            }
            q = match self.wake.wait_timeout(q, nap.min(left)) {
                Ok((q, _)) => q,
                Err(_) => return (Vec::new(), true),
            };
            stale(&mut q);
        }
        let out = if self.paused.load(Relaxed) {
            Vec::new()
        } else {
            take_round(&mut q.items, next)
        };
        self.stats
            .queued_records
            .store(q.items.len() as u64, Relaxed);
        (out, q.shutdown)
    }

    /// Applies `items` in order. Out of space, the record that found no room and those after
    /// it go back to the queue and the applier waits for room; any other error is final.
    fn apply_all(&self, mut items: Vec<Item>, c: &mut Cursor) -> Result<(), StoreError> {
        let Err((at, e)) = self.apply_items(&items, c) else {
            return Ok(());
        };
        let Some(h) = items.get(at).map(|i| i.header).filter(|_| e.is_no_space()) else {
            return Err(e);
        };
        self.requeue(items.split_off(at));
        let reason = format!(
            "applying record {} to the image of volume {} failed: {e}",
            h.seq, h.volume
        );
        self.wait_for_room(Some(h.volume), reason, c);
        Ok(())
    }

    /// Applies `items` in order; on error, returns the index of the record it stopped at.
    fn apply_items(&self, items: &[Item], c: &mut Cursor) -> Result<(), (usize, StoreError)> {
        let max_run = self.log.get().map_or(READBACK_BYTES, |l| {
            l.max_read_following().min(READBACK_BYTES)
        });
        let mut at = 0;
        while at < items.len() {
            let run = readback_run(&items[at..], max_run);
            if run == 0 {
                self.apply_one(&items[at], None).map_err(|e| (at, e))?;
                self.applied(&items[at], c);
                at += 1;
                continue;
            }
            // One read for the run, a lone record included (its header is known: one read
            // of header and payload together instead of one of each).
            let run = &items[at..at + run];
            let payloads = self
                .log_read_run(run, &mut c.readback)
                .map_err(|e| (at, e))?;
            for (i, (item, payload)) in run.iter().zip(payloads).enumerate() {
                self.apply_one(item, c.readback.get(payload))
                    .map_err(|e| (at + i, e))?;
                self.applied(item, c);
            }
            at += run.len();
        }
        Ok(())
    }

    /// Reads back the payloads of `run` (see [`readback_run`]) with one log read into `buf`;
    /// returns where each lies in it.
    fn log_read_run(
        &self,
        run: &[Item],
        buf: &mut Vec<u8>,
    ) -> Result<Vec<std::ops::Range<usize>>, StoreError> {
        let (Some(first), Some(last)) = (run.first(), run.last()) else {
            return Ok(Vec::new());
        };
        let log = self
            .log
            .get()
            .ok_or_else(|| StoreError::Failed("no log attached".into()))?;
        let len = last.addr.offset() - first.addr.offset()
            + RECORD_HEADER_LEN as u64
            + u64::from(last.header.payload_len);
        let seqs: Vec<u64> = run.iter().map(|i| i.header.seq).collect();
        let read = log.read_following(first.addr, &seqs, len, buf)?;
        self.stats.log_reads.fetch_add(run.len() as u64, Relaxed);
        Ok(read.into_iter().map(|(_, payload)| payload).collect())
    }

    /// Bookkeeping once `item` is in its image (or skipped). Its payload leaves the memory
    /// budget only now: a record that found no room goes back to the queue with it.
    fn applied(&self, item: &Item, c: &mut Cursor) {
        if let Some(p) = &item.payload {
            self.stats
                .queued_payload_bytes
                .fetch_sub(p.len() as u64, Relaxed);
        }
        c.unsynced.push((item.header, item.addr));
        c.next = item.header.seq + 1;
        c.applied_ts = c.applied_ts.max(item.header.timestamp_ns);
        if item.header.volume_seq > 0 {
            c.volume_seqs
                .insert(item.header.volume, item.header.volume_seq);
        }
        c.unsynced_bytes += u64::from(item.header.payload_len);
        self.stats.applied_seq.store(item.header.seq, Relaxed);
        self.stats.applied_records.fetch_add(1, Relaxed);
        self.stats
            .applied_bytes
            .fetch_add(u64::from(item.header.length), Relaxed);
    }

    /// Applies one record; `fetched` is its payload when the caller read it back (every write
    /// whose payload is not in memory, see [`readback_run`]).
    fn apply_one(&self, item: &Item, fetched: Option<&[u8]>) -> Result<(), StoreError> {
        let h = &item.header;
        if !h.kind.changes_data() {
            return Ok(());
        }
        let Ok(image) = self.image(h.volume) else {
            return Ok(()); // the volume was deleted
        };
        let end = h.offset + u64::from(h.length);
        if end > image.size.load(Relaxed) {
            tracing::warn!(
                seq = h.seq,
                volume = h.volume,
                "record beyond the volume's end skipped"
            );
            return Ok(());
        }
        match h.kind {
            RecordKind::Write => {
                let payload = item.payload.as_deref().or(fetched).ok_or_else(|| {
                    StoreError::Failed(format!("record {} applied without its payload", h.seq))
                })?;
                write_in_pieces(image.disk.as_ref(), payload, h.offset)?;
            }
            RecordKind::Trim | RecordKind::WriteZeroes => {
                image.disk.punch_hole(h.offset, u64::from(h.length))?;
            }
            RecordKind::Void
            | RecordKind::VolumeCreated
            | RecordKind::VolumeResized
            | RecordKind::VolumeDeleted
            | RecordKind::HistoryGap => {}
        }
        if let Ok(mut o) = image.overlay.lock() {
            o.remove(h.offset, end, h.seq);
            self.stats.overlay_extents.store(o.len() as u64, Relaxed);
        }
        Ok(())
    }

    fn sync_all(&self, c: &Cursor) -> Result<(), SyncError> {
        let images: Vec<_> = match self.images.read() {
            Ok(m) => m.iter().map(|(id, i)| (*id, Arc::clone(i))).collect(),
            Err(_) => return Err(StoreError::Failed("lock poisoned".into()).into()),
        };
        for (id, image) in images {
            image.disk.sync().map_err(|e| SyncError {
                volume: Some(id),
                error: e.into(),
            })?;
        }
        let p = Progress {
            applied_seq: c.next - 1,
            applied_ts: c.applied_ts,
            volume_seqs: c.volume_seqs.clone(),
        };
        let saved = match &self.progress_file {
            Some(f) => f.save(&p),
            None => p.store(&self.cfg.progress_path),
        };
        saved.map_err(|e| SyncError::from(StoreError::Progress(e)))?;
        let applied_seq = p.applied_seq;
        if let Ok(mut g) = self.progress.lock() {
            *g = p;
        }
        self.stats.synced_seq.store(applied_seq, Relaxed);
        self.stats.syncs.fetch_add(1, Relaxed);
        if let Some(holder) = self.holder.get() {
            holder.release(applied_seq);
        }
        Ok(())
    }

    fn fail(&self, e: &StoreError) {
        tracing::error!(error = %e, "applying to the volume images failed; volumes are read-only");
        if let Ok(mut f) = self.failed.lock() {
            f.get_or_insert(e.to_string());
        }
        // The log keeps what was not applied, but this store will never release it again:
        // writers waiting for log space must hear that now, not wait forever.
        if let Some(log) = self.log.get() {
            log.fail(&format!(
                "the store failed and releases no more log space: {e}"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::defer::under_pressure;
    use super::{readback_run, take_round, write_in_pieces, Item, IMAGE_WRITE_PIECE};
    use super::{ROUND, ROUND_BYTES};
    use mariner_disk::{Disk, MemDisk};
    use mariner_log::{LogAddr, RecordHeader, RecordKind, RECORD_HEADER_LEN};
    use std::sync::Mutex;

    /// `n` write records of `payload` bytes each, back to back on device 0 from offset 0.
    fn back_to_back(n: usize, payload: u32) -> Vec<Item> {
        let span = RECORD_HEADER_LEN as u32 + payload;
        (0..n)
            .map(|i| {
                let header = RecordHeader {
                    kind: RecordKind::Write,
                    volume: 1,
                    length: payload,
                    seq: i as u64 + 1,
                    timestamp_ns: 0,
                    offset: 0,
                    generation: 1,
                    back: LogAddr::NONE,
                    span,
                    payload_len: payload,
                    payload_crc: 0,
                    volume_seq: 0,
                };
                Item {
                    header,
                    addr: LogAddr::new(0, u64::from(span) * i as u64),
                    payload: None,
                    accepted: std::time::Instant::now(),
                }
            })
            .collect()
    }

    fn queued(items: Vec<Item>) -> std::collections::BTreeMap<u64, Item> {
        items.into_iter().map(|i| (i.header.seq, i)).collect()
    }

    #[test]
    fn a_round_is_bounded_by_records_and_by_bytes() {
        let mut small = queued(back_to_back(300, 4 << 10));
        assert_eq!(take_round(&mut small, 1).len(), ROUND);
        assert_eq!(small.len(), 300 - ROUND);

        let mut large = queued(back_to_back(40, 1 << 20));
        let round = take_round(&mut large, 1);
        assert_eq!(round.len() as u64, ROUND_BYTES >> 20);
        let seqs: Vec<u64> = round.iter().map(|i| i.header.seq).collect();
        assert_eq!(seqs, (1..=ROUND_BYTES >> 20).collect::<Vec<_>>());

        // One record larger than the cap still makes a round.
        let mut huge = queued(back_to_back(2, 64 << 20));
        assert_eq!(take_round(&mut huge, 1).len(), 1);
        // Nothing is taken past a gap, nor when the next record is not there yet.
        let mut gap = queued(back_to_back(5, 4 << 10));
        gap.remove(&3);
        assert_eq!(take_round(&mut gap, 1).len(), 2);
        assert!(take_round(&mut gap, 3).is_empty());
    }

    #[test]
    fn a_run_read_back_fits_what_the_log_reads_at_once() {
        // 64 KiB segments (the smallest the configuration allows): a run of 16 KiB records
        // stops before 64 KiB, where it used to run on to 1 MiB and fail the store.
        let items = back_to_back(40, 16 << 10);
        let n = readback_run(&items, 64 << 10);
        assert_eq!(n, 3, "three 16 KiB records and their headers fit in 64 KiB");
        assert_eq!(readback_run(&items, 1 << 20), 40);
    }

    /// A memory disk that remembers the `(offset, len)` of every write.
    #[derive(Debug)]
    struct Recording {
        disk: MemDisk,
        writes: Mutex<Vec<(u64, usize)>>,
    }

    impl Disk for Recording {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
            self.disk.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
            if let Ok(mut w) = self.writes.lock() {
                w.push((offset, buf.len()));
            }
            self.disk.write_at(buf, offset)
        }
        fn sync(&self) -> std::io::Result<()> {
            self.disk.sync()
        }
        fn len(&self) -> std::io::Result<u64> {
            self.disk.len()
        }
        fn set_len(&self, len: u64) -> std::io::Result<()> {
            self.disk.set_len(len)
        }
    }

    #[test]
    fn payloads_reach_the_image_whole_in_aligned_pieces() {
        let piece = IMAGE_WRITE_PIECE as usize;
        let d = Recording {
            disk: MemDisk::new(8 * piece),
            writes: Mutex::default(),
        };
        // Unaligned at both ends, crossing four piece boundaries; then one inside a piece.
        let payload: Vec<u8> = (0..4 * piece + 1000).map(|i| (i % 251) as u8).collect();
        let at = (piece - 512) as u64;
        write_in_pieces(&d, &payload, at).unwrap();
        write_in_pieces(&d, &[7; 4096], 6 * piece as u64 + 4096).unwrap();
        let writes = d.writes.lock().unwrap().clone();
        assert_eq!(
            writes.len(),
            6 + 1,
            "a head, four whole pieces and a tail; then one"
        );
        assert_eq!(writes[0], (at, 512));
        for &(off, len) in &writes {
            assert!(len > 0 && len <= piece);
            let window = off / IMAGE_WRITE_PIECE;
            assert_eq!(
                (off + len as u64 - 1) / IMAGE_WRITE_PIECE,
                window,
                "{off}+{len}"
            );
        }
        let image = d.disk.to_vec();
        assert_eq!(
            &image[at as usize..at as usize + payload.len()],
            &payload[..]
        );
        assert_eq!(&image[6 * piece + 4096..6 * piece + 8192], &[7; 4096][..]);
    }

    #[test]
    fn write_back_starts_beyond_three_quarters_or_when_a_writer_waits() {
        // The default log: 256 MiB in 32 segments.
        assert!(!under_pressure(0, 32, 0));
        assert!(
            !under_pressure(16, 32, 0),
            "half full is a burst still being absorbed"
        );
        assert!(!under_pressure(24, 32, 0));
        assert!(under_pressure(25, 32, 0));
        assert!(under_pressure(1, 32, 1), "a waiting writer always counts");
        assert!(under_pressure(4, 4, 0));
        assert!(!under_pressure(3, 4, 0));
    }
}
