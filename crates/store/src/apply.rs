//! The applier thread: records in sequence order into the images, then sync and release.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mariner_log::{RecordKind, RECORD_HEADER_LEN};

use crate::{Item, Progress, Store, StoreError};

/// Records taken from the queue per round.
const ROUND: usize = 256;

/// The fraction of the log in use beyond which write-back starts whether or not the writers
/// pause (see [`Store::log_pressure`]).
const PRESSURE_FILL: (u64, u64) = (3, 4);

/// [`Store::log_pressure`] on the log's counters.
fn under_pressure(segments_used: u64, segments_total: u64, stalled: u64) -> bool {
    let (num, den) = PRESSURE_FILL;
    stalled > 0 || segments_used * den > segments_total * num
}

/// Largest run of records read back from the log with one read.
const READBACK_BYTES: u64 = 1 << 20;

/// How many records at the front of `items` to read back from the log with one read: write
/// records without a payload in memory that lie back to back on one device (each starts
/// where the previous one's span ends, as the records of a batch and of batches written one
/// after another do), at most [`READBACK_BYTES`] in all.
fn readback_run(items: &[Item]) -> usize {
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
        if !needs_read(item) || !follows || end - first.addr.offset() > READBACK_BYTES {
            break;
        }
        n += 1;
        prev = item;
    }
    n
}

struct Cursor {
    /// Scratch for records read back from the log, reused run after run.
    readback: Vec<u8>,
    next: u64,
    applied_ts: u64,
    unsynced_bytes: u64,
    last_sync: Instant,
}

impl Store {
    pub(crate) fn run(self: Arc<Self>) {
        let p = self.progress();
        let mut c = Cursor {
            readback: Vec::new(),
            next: p.applied_seq + 1,
            applied_ts: p.applied_ts,
            unsynced_bytes: 0,
            last_sync: Instant::now(),
        };
        loop {
            let interval = Duration::from_millis(self.cfg.sync_interval_ms);
            let wait = interval.saturating_sub(c.last_sync.elapsed());
            let (items, shutdown) = self.take_ready(c.next, wait);
            if let Err(e) = self.apply_all(&items, &mut c) {
                return self.fail(&e);
            }
            let behind = c.next - 1 > self.progress().applied_seq;
            let due = c.unsynced_bytes >= self.cfg.sync_bytes
                || c.last_sync.elapsed() >= interval
                || self.log_pressure()
                || shutdown;
            if behind && due {
                if let Err(e) = self.sync_all(&c) {
                    return self.fail(&e);
                }
                c.unsynced_bytes = 0;
                c.last_sync = Instant::now();
            } else if !behind {
                c.last_sync = Instant::now();
            }
            if shutdown && items.is_empty() {
                return;
            }
        }
    }

    /// Waits up to `wait` for the record `next` and for the moment to apply it (see
    /// [`Store::defer`]) and returns it with its contiguous successors.
    fn take_ready(&self, next: u64, wait: Duration) -> (Vec<Item>, bool) {
        let until = Instant::now() + wait;
        let Ok(mut q) = self.queue.lock() else {
            return (Vec::new(), true);
        };
        let ready = |q: &crate::Queue| {
            q.shutdown
                || (!self.paused.load(Relaxed)
                    && q.items.first_key_value().is_some_and(|(k, _)| *k == next))
        };
        if !ready(&q) {
            q.applier_waiting = true;
            let r = self.wake.wait_timeout_while(q, wait, |q| !ready(q));
            q = match r {
                Ok((q, _)) => q,
                Err(_) => return (Vec::new(), true),
            };
            q.applier_waiting = false;
        }
        // Write-back: let the writers' burst pass first. New records do not wake this wait.
        while ready(&q) {
            let Some(nap) = self.defer(&q) else { break };
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return (Vec::new(), q.shutdown);
            }
            q = match self.wake.wait_timeout(q, nap.min(left)) {
                Ok((q, _)) => q,
                Err(_) => return (Vec::new(), true),
            };
        }
        let mut out = Vec::new();
        let mut expect = next;
        while out.len() < ROUND && !self.paused.load(Relaxed) {
            match q.items.first_key_value() {
                Some((&k, _)) if k == expect => {
                    if let Some((_, item)) = q.items.pop_first() {
                        out.push(item);
                    }
                    expect += 1;
                }
                _ => break,
            }
        }
        self.stats
            .queued_records
            .store(q.items.len() as u64, Relaxed);
        (out, q.shutdown)
    }

    fn apply_all(&self, items: &[Item], c: &mut Cursor) -> Result<(), StoreError> {
        let mut at = 0;
        while at < items.len() {
            let run = readback_run(&items[at..]);
            if run == 0 {
                self.apply_one(&items[at], None)?;
                self.applied(&items[at], c);
                at += 1;
                continue;
            }
            // One read for the run, a lone record included (its header is known: one read
            // of header and payload together instead of one of each).
            let run = &items[at..at + run];
            let payloads = self.log_read_run(run, &mut c.readback)?;
            for (item, payload) in run.iter().zip(payloads) {
                self.apply_one(item, c.readback.get(payload))?;
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

    /// Bookkeeping once `item` is in its image (or skipped).
    fn applied(&self, item: &Item, c: &mut Cursor) {
        c.next = item.header.seq + 1;
        c.applied_ts = c.applied_ts.max(item.header.timestamp_ns);
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
        if let Some(p) = &item.payload {
            self.stats
                .queued_payload_bytes
                .fetch_sub(p.len() as u64, Relaxed);
        }
        if h.kind == RecordKind::Void {
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
                image.disk.write_at(payload, h.offset)?;
            }
            RecordKind::Trim | RecordKind::WriteZeroes => {
                image.disk.punch_hole(h.offset, u64::from(h.length))?;
            }
            RecordKind::Void => {}
        }
        if let Ok(mut o) = image.overlay.lock() {
            o.remove(h.offset, end, h.seq);
            self.stats.overlay_extents.store(o.len() as u64, Relaxed);
        }
        Ok(())
    }

    /// How much longer to leave the queued records in the log, or `None` to apply now: at
    /// shutdown, under log pressure, once the writers have paused for `apply_idle_ms`, or once
    /// the oldest record has waited `apply_max_delay_ms`.
    fn defer(&self, q: &crate::Queue) -> Option<Duration> {
        let idle = Duration::from_millis(self.cfg.apply_idle_ms);
        if idle.is_zero() || q.shutdown || self.log_pressure() {
            return None;
        }
        let quiet = q.last_accept.map_or(idle, |t| t.elapsed());
        let max_delay = Duration::from_millis(self.cfg.apply_max_delay_ms);
        let waited = q
            .items
            .first_key_value()
            .map_or(max_delay, |(_, item)| item.accepted.elapsed());
        let nap = idle
            .saturating_sub(quiet)
            .min(max_delay.saturating_sub(waited));
        (!nap.is_zero()).then_some(nap)
    }

    /// Whether the log needs its space back now: a writer waits for space, or more than
    /// [`PRESSURE_FILL`] of the log is in use. The quarter left is headroom for the writers
    /// while the applier catches up (under pressure it syncs and releases after every round);
    /// the three quarters before it absorb a burst without write-back competing with the
    /// writers for CPU (40,000 4 KiB writes at depth 32 into the default 256 MiB log: 44–47k
    /// IOPS when write-back started at half full, docs/benchmarks.md).
    fn log_pressure(&self) -> bool {
        let Some(log) = self.log.get() else {
            return false;
        };
        let s = log.stats();
        under_pressure(
            s.segments_used.load(Relaxed),
            s.segments_total.load(Relaxed),
            s.stalled.load(Relaxed),
        )
    }

    fn sync_all(&self, c: &Cursor) -> Result<(), StoreError> {
        let images: Vec<_> = match self.images.read() {
            Ok(m) => m.values().cloned().collect(),
            Err(_) => return Err(StoreError::Failed("lock poisoned".into())),
        };
        for image in images {
            image.disk.sync()?;
        }
        let p = Progress {
            applied_seq: c.next - 1,
            applied_ts: c.applied_ts,
        };
        p.store(&self.cfg.progress_path)?;
        if let Ok(mut g) = self.progress.lock() {
            *g = p;
        }
        self.stats.synced_seq.store(p.applied_seq, Relaxed);
        self.stats.syncs.fetch_add(1, Relaxed);
        if let Some(log) = self.log.get() {
            log.release(p.applied_seq);
        }
        Ok(())
    }

    fn fail(&self, e: &StoreError) {
        tracing::error!(error = %e, "applying to the volume images failed; volumes are read-only");
        if let Ok(mut f) = self.failed.lock() {
            f.get_or_insert(e.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::under_pressure;

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
