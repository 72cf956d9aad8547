//! What changed between two instants, and how much was written when: diff and activity,
//! read from the TL digests plus the unindexed tail, never from a payload (lu-dissertation
//! ch. 4: the TL index answers time-range queries; mariner-paper.md §3).
//!
//! A whole-window diff may cover millions of writes: extents are merged as they are met (a
//! map of disjoint, non-adjacent intervals), so memory follows the number of distinct changed
//! ranges, not the number of writes.

use std::collections::BTreeMap;
use std::sync::PoisonError;

use mariner_log::RecordKind;

use crate::engine::{lock, History, View};
use crate::read::Point;
use crate::{DigestEntry, HistoryError};

/// A byte range of a volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub offset: u64,
    pub length: u64,
}

/// What a volume's writes in a range of instants changed ([`History::changes`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// Sorted, merged (adjacent or overlapping ranges joined).
    pub extents: Vec<Extent>,
    pub writes: u64,
    pub write_bytes: u64,
    /// Trims and write-zeroes.
    pub zeroings: u64,
    pub zeroed_bytes: u64,
    /// Digest bytes this query read: a diff must stay a small share of the log's bytes.
    pub digest_bytes_read: u64,
}

/// Writes and bytes of one time bucket ([`History::activity`]): records with a timestamp in
/// `[start_ns, end_ns)`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bucket {
    pub start_ns: u64,
    pub end_ns: u64,
    pub writes: u64,
    pub write_bytes: u64,
    pub zeroings: u64,
    pub zeroed_bytes: u64,
}

/// Disjoint, non-adjacent byte ranges, start → end, merged as they are added.
#[derive(Debug, Default)]
pub(crate) struct Merged(BTreeMap<u64, u64>);

impl Merged {
    pub fn add(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let (mut s, mut e) = (start, end);
        if let Some((&ps, &pe)) = self.0.range(..=s).next_back() {
            if pe >= s {
                s = ps;
                e = e.max(pe);
                self.0.remove(&ps);
            }
        }
        while let Some((&ns, &ne)) = self.0.range(s..=e).next() {
            e = e.max(ne);
            self.0.remove(&ns);
        }
        self.0.insert(s, e);
    }

    pub fn extents(&self) -> Vec<Extent> {
        self.0
            .iter()
            .map(|(&s, &e)| Extent {
                offset: s,
                length: e - s,
            })
            .collect()
    }
}

/// Counts of one record into `writes`/`zeroings` style totals; false for records that do
/// not change data (lifecycle, gaps, voids).
fn tally(e: &DigestEntry, c: &mut [u64; 4]) -> bool {
    if !e.kind.changes_data() || e.length == 0 {
        return false;
    }
    let len = u64::from(e.length);
    if e.kind == RecordKind::Write {
        c[0] += 1;
        c[1] += len;
    } else {
        c[2] += 1;
        c[3] += len;
    }
    true
}

impl History {
    /// The view of `volume`, checked to have `(from, to]` inside its window.
    fn range_view(&self, volume: u32, from: u64, to: u64) -> Result<View, HistoryError> {
        let view = self.view(volume)?;
        let w = view.window();
        if from < w.oldest.volume_seq || to > w.newest.volume_seq {
            return Err(HistoryError::Expired {
                volume,
                asked: format!("@{from}..@{to}"),
                window: w.to_string(),
            });
        }
        Ok(view)
    }

    /// What `volume`'s writes numbered in (from, to] (volume sequence numbers, as
    /// `resolve` returns) changed. Expired/Broken errors like reads when `from` is outside the window.
    /// Empty when `to <= from`.
    pub fn changes(&self, volume: u32, from: u64, to: u64) -> Result<Changes, HistoryError> {
        let view = self.range_view(volume, from, to)?;
        if to <= from {
            return Ok(Changes::default());
        }
        let mut merged = Merged::default();
        let mut c = [0u64; 4];
        let read = self.each_between(&view, volume, from, to, None, &mut |e| {
            if tally(e, &mut c) {
                merged.add(e.offset, e.offset + u64::from(e.length));
            }
        })?;
        Ok(Changes {
            extents: merged.extents(),
            writes: c[0],
            write_bytes: c[1],
            zeroings: c[2],
            zeroed_bytes: c[3],
            digest_bytes_read: read,
        })
    }

    /// Writes and bytes of `volume` between two instants, in `buckets` equal time buckets
    /// (for `mariner history`'s histogram): the records after `from` up to `to`, bucketed by
    /// timestamp over `[from.timestamp_ns, to.timestamp_ns]`. No buckets when `buckets` is 0.
    pub fn activity(
        &self,
        volume: u32,
        from: Point,
        to: Point,
        buckets: u32,
    ) -> Result<Vec<Bucket>, HistoryError> {
        let view = self.range_view(volume, from.volume_seq, to.volume_seq)?;
        if buckets == 0 {
            return Ok(Vec::new());
        }
        let (t0, t1) = (from.timestamp_ns, to.timestamp_ns.max(from.timestamp_ns));
        let width = (t1 - t0)
            .saturating_add(1)
            .div_ceil(u64::from(buckets))
            .max(1);
        let mut out: Vec<Bucket> = (0..u64::from(buckets))
            .map(|i| {
                let start = t0.saturating_add(i.saturating_mul(width));
                Bucket {
                    start_ns: start,
                    end_ns: start.saturating_add(width).min(t1.saturating_add(1)),
                    ..Bucket::default()
                }
            })
            .collect();
        if to.volume_seq > from.volume_seq {
            self.each_between(
                &view,
                volume,
                from.volume_seq,
                to.volume_seq,
                Some((t0, t1)),
                &mut |e| {
                    let i = (e.timestamp_ns.saturating_sub(t0) / width) as usize;
                    if let Some(b) = out.get_mut(i.min(buckets as usize - 1)) {
                        let mut c = [b.writes, b.write_bytes, b.zeroings, b.zeroed_bytes];
                        if tally(e, &mut c) {
                            [b.writes, b.write_bytes, b.zeroings, b.zeroed_bytes] = c;
                        }
                    }
                },
            )?;
        }
        Ok(out)
    }

    /// Calls `f` once for each of `volume`'s records numbered in `(from, to]`, from the
    /// digests and then the tail (each record once), in no promised order; `time`: the
    /// digests are walked by time over that range instead of by sequence number. Returns the
    /// digest bytes read.
    fn each_between(
        &self,
        view: &View,
        volume: u32,
        from: u64,
        to: u64,
        time: Option<(u64, u64)>,
        f: &mut dyn FnMut(&DigestEntry),
    ) -> Result<u64, HistoryError> {
        let inner = &self.inner;
        // The tail first: a record the indexer takes off it meanwhile is in the digests
        // before it leaves the tail, and the digests are read after.
        let tail = inner
            .tail
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .entries_of(volume, from, to);
        let d = lock(&inner.digests);
        let before = d.bytes_read();
        let wanted = |e: &DigestEntry| e.volume_seq > from && e.volume_seq <= to;
        match time {
            Some((t0, t1)) => d.for_each_in_time(volume, t0, t1, |e| {
                if wanted(e) {
                    f(e);
                }
                Ok(())
            })?,
            None => {
                // From the record `from` (the base's position when it is the oldest instant,
                // or when the digests do not have it), through the record `to` (the digests'
                // end when it is still on the tail).
                let s = &view.state;
                let after = if from <= s.base_vseq.max(s.rolling_vseq) {
                    s.base_seq
                } else {
                    d.by_volume_seq(volume, from)?.map_or(s.base_seq, |e| e.seq)
                };
                let through = d.by_volume_seq(volume, to)?.map_or(u64::MAX, |e| e.seq);
                d.for_each(after, through, Some(volume), |e| {
                    if wanted(e) {
                        f(e);
                    }
                    Ok(())
                })?;
            }
        }
        let last = d.last_seq();
        let read = d.bytes_read() - before;
        drop(d);
        for e in tail.iter().filter(|e| e.seq > last) {
            f(e);
        }
        Ok(read)
    }
}

#[cfg(test)]
mod tests {
    use super::Merged;

    /// Merged ranges cover exactly the bytes added, disjoint and never touching.
    #[test]
    fn merged_ranges_cover_exactly_what_was_added() {
        let mut x = 11u64;
        for _ in 0..300 {
            let mut m = Merged::default();
            let mut model = [false; 96];
            for _ in 0..10 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let s = x % 96;
                let e = (s + (x >> 9) % 16).min(96);
                m.add(s, e);
                model[s as usize..e as usize].fill(true);
            }
            let mut got = [false; 96];
            let mut last_end: Option<u64> = None;
            for ex in m.extents() {
                assert!(ex.length > 0);
                assert!(
                    last_end.is_none_or(|l| ex.offset > l),
                    "touching or overlapping"
                );
                last_end = Some(ex.offset + ex.length);
                got[ex.offset as usize..(ex.offset + ex.length) as usize].fill(true);
            }
            assert_eq!(got, model);
        }
    }
}
