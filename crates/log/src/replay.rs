//! Streaming replay: the records recovery found above the watermark, in sequence order, each
//! with its payload, read segment by segment. A consumer with many records above its watermark
//! (BOSC's own log holds every pending modification) opens with [`crate::Log::open_streaming`]
//! and replays, so recovery costs one segment buffer per device instead of a header per
//! record plus a read per payload.
//!
//! Order: on one device, segments are written in generation order and records within a
//! segment in sequence order, so each device's in-use segments, oldest generation first, yield
//! increasing sequence numbers; the devices' streams are merged by sequence number. The
//! segments are parsed exactly as the first pass of recovery parsed them (nothing writes into
//! them in between: every device resumes in a fresh segment), so the same records come out:
//! the same torn tails and stale generations end a segment. Equal sequence numbers (impossible
//! by construction) keep the first device's, as [`crate::Recovery::records`] does.

use std::sync::Arc;

use mariner_disk::{AlignedBuf, Disk};

use crate::readahead::ReadAhead;

use crate::format::{Superblock, RECORD_HEADER_LEN};
use crate::scan::{parse_segment_with, Found};
use crate::LogError;

/// Which segments hold records above the watermark: what [`crate::Log::replay`] reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayPlan {
    pub(crate) after_seq: u64,
    /// Per device, its in-use segments holding records above `after_seq`, oldest
    /// generation first.
    pub(crate) segments: Vec<Vec<u64>>,
    /// Per device, every in-use segment with its highest sequence number (or the bound that
    /// stands in for it), oldest generation first: what [`Self::after`] picks from.
    pub(crate) in_use: Vec<Vec<(u64, u64)>>,
    /// The lowest holder's watermark: records at or below it may be gone.
    pub(crate) kept_after: u64,
}

impl ReplayPlan {
    /// Per device, the segments the replay will read, in the order it reads them.
    pub fn segments(&self) -> &[Vec<u64>] {
        &self.segments
    }

    /// The records above it are replayed.
    pub fn after_seq(&self) -> u64 {
        self.after_seq
    }

    /// The plan for a holder whose watermark is `seq`, lower than the replay watermark (a
    /// shrinkable or bounded holder: history, a replica): the records above `seq`, which
    /// recovery did not read whole unless the replay needed them. `None` when `seq` is below
    /// what the log kept (the lowest watermark it was opened with): those records may be gone.
    pub fn after(&self, seq: u64) -> Option<ReplayPlan> {
        (seq >= self.kept_after).then(|| ReplayPlan {
            after_seq: seq,
            segments: self
                .in_use
                .iter()
                .map(|d| {
                    d.iter()
                        .filter(|&&(_, max_seq)| max_seq > seq)
                        .map(|&(segment, _)| segment)
                        .collect()
                })
                .collect(),
            in_use: self.in_use.clone(),
            kept_after: self.kept_after,
        })
    }
}

/// One device's stream: the records above the watermark of the segment in `buf`, the next
/// segment read meanwhile ([`ReadAhead`]).
struct Cursor {
    ahead: ReadAhead,
    dev: u8,
    buf: Option<AlignedBuf>,
    base: u64,
    records: Vec<Found>,
    next: usize,
}

impl Cursor {
    /// The sequence number of this device's next record, reading segments as needed.
    fn peek(&mut self, sb: &Superblock, after_seq: u64) -> Result<Option<u64>, LogError> {
        while self.next == self.records.len() {
            let Some((segment, read)) = self.ahead.next() else {
                return Ok(None);
            };
            let dev = usize::from(self.dev);
            let buf = read.map_err(|source| LogError::Io { dev, source })?;
            if let Some(done) = self.buf.replace(buf) {
                self.ahead.recycle(done);
            }
            self.base = sb.segment_offset(segment);
            self.records.clear();
            self.next = 0;
            let records = &mut self.records;
            let buf = self.buf.as_deref().unwrap_or_default();
            parse_segment_with(sb.log_id, self.dev, segment, self.base, buf, |f| {
                if f.header.seq > after_seq {
                    records.push(*f);
                }
            });
        }
        Ok(Some(self.records[self.next].header.seq))
    }

    /// Takes the record [`Self::peek`] announced, with its payload (checked by the parse).
    fn take(&mut self) -> (Found, &[u8]) {
        let f = self.records[self.next];
        self.next += 1;
        let at = (f.addr.offset() - self.base) as usize + RECORD_HEADER_LEN;
        let buf = self.buf.as_deref().unwrap_or_default();
        (f, &buf[at..at + f.header.payload_len as usize])
    }
}

/// Hands every record of `plan` to `f` in sequence order; returns how many.
pub(crate) fn replay<E: From<LogError>>(
    devices: &[Arc<dyn Disk>],
    sb: &Superblock,
    plan: &ReplayPlan,
    mut f: impl FnMut(&Found, &[u8]) -> Result<(), E>,
) -> Result<u64, E> {
    std::thread::scope(|scope| {
        let mut cursors = Vec::with_capacity(devices.len());
        for (dev, (disk, segments)) in devices.iter().zip(&plan.segments).enumerate() {
            let ahead = ReadAhead::start(scope, disk.as_ref(), sb, segments)
                .map_err(|source| LogError::Io { dev, source })?;
            cursors.push(Cursor {
                ahead,
                dev: u8::try_from(dev).map_err(|_| LogError::Config("too many devices".into()))?,
                buf: None,
                base: 0,
                records: Vec::new(),
                next: 0,
            });
        }
        let mut count = 0;
        let mut last = None;
        loop {
            let mut best: Option<(u64, usize)> = None;
            for (i, c) in cursors.iter_mut().enumerate() {
                if let Some(seq) = c.peek(sb, plan.after_seq)? {
                    if best.is_none_or(|(s, _)| seq < s) {
                        best = Some((seq, i));
                    }
                }
            }
            let Some((seq, i)) = best else {
                return Ok(count);
            };
            let (found, payload) = cursors[i].take();
            if last == Some(seq) {
                continue;
            }
            last = Some(seq);
            f(&found, payload)?;
            count += 1;
        }
    })
}
