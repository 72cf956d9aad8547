//! The overlay of acknowledged writes not yet applied to a volume image: byte ranges mapped to
//! the newest durable record that covers them.
//!
//! Records can become durable out of sequence order (several log devices finish out of order),
//! so an insert only takes the parts of its range where nothing newer is mapped. An applied
//! record is removed only where it is still the mapped one.

use std::collections::btree_map::Entry;
use std::collections::BTreeMap;

use bytes::Bytes;
use mariner_log::LogAddr;

/// Where the bytes of a mapped range come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Payload of the record at this log address, which starts at volume offset `base`;
    /// `payload` is the record's payload while the store keeps it in memory for the applier
    /// (the same bytes, shared: the overlay costs no copy and no memory of its own), so a read
    /// of a write not yet applied is a copy, not a read of the log.
    Log {
        addr: LogAddr,
        base: u64,
        payload: Option<Bytes>,
    },
    /// Zeros (trim or write-zeroes).
    Zero,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    pub end: u64,
    pub seq: u64,
    pub src: Source,
}

/// One part of a lookup answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    pub start: u64,
    pub end: u64,
    /// `None`: not in the overlay; read the image.
    pub piece: Option<(u64, Source)>,
}

#[derive(Debug, Default)]
pub struct ExtentMap {
    map: BTreeMap<u64, Piece>,
}

impl ExtentMap {
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Pieces overlapping `[start, end)`, removed from the map.
    fn take_overlapping(&mut self, start: u64, end: u64) -> Vec<(u64, Piece)> {
        let mut keys: Vec<u64> = self.map.range(start..end).map(|(k, _)| *k).collect();
        if let Some((&k, p)) = self.map.range(..start).next_back() {
            if p.end > start {
                keys.insert(0, k);
            }
        }
        keys.into_iter()
            .filter_map(|k| self.map.remove(&k).map(|p| (k, p)))
            .collect()
    }

    fn put(&mut self, start: u64, end: u64, seq: u64, src: Source) {
        if start < end {
            self.map.insert(start, Piece { end, seq, src });
        }
    }

    /// Whether any piece overlaps `[start, end)`. Pieces are disjoint and sorted, so only the
    /// last one starting before `end` can reach into the range: one descent of the tree.
    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.map
            .range(..end)
            .next_back()
            .is_some_and(|(_, p)| p.end > start)
    }

    /// Maps `[start, end)` to record `seq`, except where a newer record is already mapped.
    pub fn insert(&mut self, start: u64, end: u64, seq: u64, src: Source) {
        if start >= end {
            return;
        }
        // The common case, a write to a range with nothing unapplied in it, costs two
        // descents instead of collecting and re-inserting neighbours (the overlay is touched
        // for every write, on the log's completion path).
        if !self.overlaps(start, end) {
            self.map.insert(start, Piece { end, seq, src });
            return;
        }
        let mut cursor = start;
        for (k, p) in self.take_overlapping(start, end) {
            // The parts of an old piece outside the new range stay as they were.
            if k < start {
                self.put(k, start, p.seq, p.src.clone());
            }
            if p.end > end {
                self.put(end, p.end, p.seq, p.src.clone());
            }
            // Inside, a newer piece wins; the new record fills around it.
            if p.seq > seq {
                let (inner_start, inner_end) = (k.max(start), p.end.min(end));
                self.put(cursor, inner_start, seq, src.clone());
                self.put(inner_start, inner_end, p.seq, p.src);
                cursor = inner_end;
            }
        }
        self.put(cursor, end, seq, src);
    }

    /// Unmaps the parts of `[start, end)` still mapped to record `seq`.
    pub fn remove(&mut self, start: u64, end: u64, seq: u64) {
        // The common case: the record's piece is still mapped whole. Pieces are disjoint, so
        // nothing else overlaps its range and one descent removes it.
        if let Entry::Occupied(e) = self.map.entry(start) {
            let p = e.get();
            if p.end == end && p.seq == seq {
                e.remove();
                return;
            }
        }
        for (k, p) in self.take_overlapping(start, end) {
            if p.seq != seq {
                self.map.insert(k, p);
                continue;
            }
            self.put(k, start.max(k).min(p.end), p.seq, p.src.clone());
            self.put(end.max(k).min(p.end), p.end, p.seq, p.src);
        }
    }

    /// Covers `[start, end)` with spans, in order: mapped pieces and the gaps between them.
    pub fn lookup(&self, start: u64, end: u64) -> Vec<Span> {
        let mut out = Vec::new();
        let mut cursor = start;
        let before = self
            .map
            .range(..start)
            .next_back()
            .filter(|(_, p)| p.end > start);
        for (&k, p) in before.into_iter().chain(self.map.range(start..end)) {
            let s = k.max(start);
            if s > cursor {
                out.push(Span {
                    start: cursor,
                    end: s,
                    piece: None,
                });
            }
            let e = p.end.min(end);
            out.push(Span {
                start: s,
                end: e,
                piece: Some((p.seq, p.src.clone())),
            });
            cursor = e;
        }
        if cursor < end {
            out.push(Span {
                start: cursor,
                end,
                piece: None,
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn src(n: u64) -> Source {
        Source::Log {
            addr: LogAddr(n),
            base: 0,
            payload: None,
        }
    }

    /// Per-byte model: newest seq wins.
    fn model_apply(model: &mut [Option<u64>], op: &Op) {
        match *op {
            Op::Insert(s, e, seq) => {
                for b in &mut model[s as usize..e as usize] {
                    if b.is_none_or(|old| old < seq) {
                        *b = Some(seq);
                    }
                }
            }
            Op::Remove(s, e, seq) => {
                for b in &mut model[s as usize..e as usize] {
                    if *b == Some(seq) {
                        *b = None;
                    }
                }
            }
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64, u64, u64),
        Remove(u64, u64, u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        (0u64..64, 1u64..24, 1u64..20, any::<bool>()).prop_map(|(s, l, seq, ins)| {
            let e = (s + l).min(64);
            if ins {
                Op::Insert(s, e, seq)
            } else {
                Op::Remove(s, e, seq)
            }
        })
    }

    proptest! {
        #[test]
        fn matches_a_per_byte_model(ops in prop::collection::vec(op(), 1..60)) {
            let mut m = ExtentMap::default();
            let mut model = vec![None; 64];
            let mut used = std::collections::HashSet::new();
            for o in &ops {
                // A sequence number names one record: insert each at most once.
                if let Op::Insert(_, _, seq) = o {
                    if !used.insert(*seq) { continue; }
                    if let Op::Insert(s, e, seq) = *o { m.insert(s, e, seq, src(seq)); }
                } else if let Op::Remove(s, e, seq) = *o {
                    m.remove(s, e, seq);
                }
                model_apply(&mut model, o);
                let spans = m.lookup(0, 64);
                let mut got = vec![None; 64];
                let mut at = 0;
                for sp in &spans {
                    prop_assert_eq!(sp.start, at);
                    prop_assert!(sp.end > sp.start);
                    for b in &mut got[sp.start as usize..sp.end as usize] {
                        *b = sp.piece.as_ref().map(|p| p.0);
                    }
                    at = sp.end;
                }
                prop_assert_eq!(at, 64);
                prop_assert_eq!(&got, &model);
                // Pieces never overlap.
                let mut last_end = 0;
                for (&k, p) in &m.map {
                    prop_assert!(k >= last_end && p.end > k);
                    last_end = p.end;
                }
            }
        }
    }

    #[test]
    fn older_record_fills_only_around_a_newer_one() {
        let mut m = ExtentMap::default();
        m.insert(10, 20, 6, src(6));
        m.insert(0, 30, 5, src(5));
        let seqs: Vec<_> = m
            .lookup(0, 30)
            .iter()
            .map(|s| (s.start, s.end, s.piece.as_ref().map(|p| p.0)))
            .collect();
        assert_eq!(
            seqs,
            vec![(0, 10, Some(5)), (10, 20, Some(6)), (20, 30, Some(5))]
        );
    }
}
