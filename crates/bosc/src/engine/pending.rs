//! Pending modifications, packed: those of [`GROUP_BLOCKS`] consecutive blocks share one byte
//! arena, in the order they were queued.
//!
//! An entry:
//!
//! | field  | bytes  | meaning                                                          |
//! |--------|--------|------------------------------------------------------------------|
//! | offset | 1      | the block's offset in its group                                  |
//! | seq    | varint | zigzag delta from the previous entry's sequence number (from 0)  |
//! | tag    | varint | `len << 2 \| kind`; kind 0: applied to the cached image already  |
//! |        |        | (no bytes), 1: [`Op::App`], 2: [`Op::Write`]                     |
//! | bytes  | len    | the modification                                                 |
//!
//! A 29-byte B+tree modification takes 33 bytes. A block's entries are in sequence order (the
//! engine queues them so); entries of different blocks may be out of order, hence the signed
//! delta. One arena per group rather than a vector per block: the map entry, allocation and
//! frontier entry are paid per group, not per block or per modification, and finding one
//! block's entries walks a group's (a few dozen under the index benchmark's load).

use crate::format::Op;

/// Blocks per group (bits of [`Group::mask`]).
pub(super) const GROUP_BLOCKS: u64 = 32;
const _: () = assert!(GROUP_BLOCKS <= u32::BITS as u64);

/// The group of a block and the block's offset in it.
pub(super) fn group_of(block: u64) -> (u64, u32) {
    (block / GROUP_BLOCKS, (block % GROUP_BLOCKS) as u32)
}

/// The bytes the allocator hands out for a request of `n` (glibc: an 8-byte header, 16-byte
/// granules, 32 bytes at least).
pub(super) fn alloc_bytes(n: usize) -> usize {
    if n == 0 {
        0
    } else {
        (n + 8).next_multiple_of(16).max(32)
    }
}

/// The capacity an arena of `n` bytes is given: the largest request that takes the
/// allocation of the smallest class holding `n`, the classes being four per doubling
/// (1, 1.25, 1.5 and 1.75 × a power of two, as jemalloc's) from 64 bytes up.
///
/// Arenas grow, shrink and are freed by the thousand between commits. Were each given the
/// exact size it reached, the holes they leave would fit few of the others, and the heap
/// would hold far more than the queues (measured: 40–50 MiB over a 64 MiB budget under the
/// index benchmark). On a few sizes a freed arena's chunk fits the next arena of its class.
fn size_class(n: usize) -> usize {
    let chunk = alloc_bytes(n.max(1));
    if chunk <= 64 {
        return chunk - 8;
    }
    let step = 1usize << (usize::BITS - 1 - (chunk - 1).leading_zeros() - 2);
    chunk.next_multiple_of(step) - 8
}

/// One queued modification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Entry<'a> {
    /// The block's offset in its group.
    pub(super) offset: u32,
    pub(super) seq: u64,
    /// `None`: applied to the block's cached image already.
    pub(super) change: Option<(Op, &'a [u8])>,
}

/// The pending modifications of one group of blocks.
#[derive(Default)]
pub(super) struct Group {
    arena: Vec<u8>,
    /// Blocks with entries, by offset.
    mask: u32,
    entries: u32,
    /// The sequence number of the last entry (the next entry's delta is from it).
    last: u64,
    /// The smallest sequence number of the entries.
    min: u64,
}

impl Group {
    pub(super) fn is_empty(&self) -> bool {
        self.entries == 0
    }

    /// Entries, all blocks.
    pub(super) fn len(&self) -> usize {
        self.entries as usize
    }

    pub(super) fn has(&self, offset: u32) -> bool {
        self.mask >> offset & 1 == 1
    }

    /// Offsets of the blocks with entries, ascending.
    pub(super) fn offsets(&self) -> impl Iterator<Item = u32> + '_ {
        (0..GROUP_BLOCKS as u32).filter(|&o| self.has(o))
    }

    pub(super) fn blocks(&self) -> usize {
        self.mask.count_ones() as usize
    }

    /// The smallest pending sequence number, if any.
    pub(super) fn min_seq(&self) -> Option<u64> {
        (!self.is_empty()).then_some(self.min)
    }

    /// The arena's allocation.
    pub(super) fn heap_bytes(&self) -> usize {
        alloc_bytes(self.arena.capacity())
    }

    /// Appends an entry; the block's earlier entries must have lower sequence numbers.
    pub(super) fn push(&mut self, e: Entry<'_>) {
        debug_assert!(e.offset < GROUP_BLOCKS as u32);
        let (kind, bytes): (u64, &[u8]) = match e.change {
            None => (0, &[]),
            Some((Op::App, b)) => (1, b),
            Some((Op::Write, b)) => (2, b),
        };
        let delta = e.seq.wrapping_sub(self.last) as i64;
        let zigzag = ((delta << 1) ^ (delta >> 63)) as u64;
        let tag = (bytes.len() as u64) << 2 | kind;
        self.reserve(1 + varint_len(zigzag) + varint_len(tag) + bytes.len());
        self.arena.push(e.offset as u8);
        put_varint(&mut self.arena, zigzag);
        put_varint(&mut self.arena, tag);
        self.arena.extend_from_slice(bytes);
        self.min = if self.is_empty() {
            e.seq
        } else {
            self.min.min(e.seq)
        };
        self.last = e.seq;
        self.mask |= 1 << e.offset;
        self.entries += 1;
    }

    /// Grows the arena by an eighth at least, to the end of its size class ([`size_class`]):
    /// slack within a quarter, and a reallocation every few entries only.
    fn reserve(&mut self, need: usize) {
        let len = self.arena.len();
        if len + need > self.arena.capacity() {
            let cap = size_class((len + need).max(len + len / 8));
            self.arena.reserve_exact(cap - len);
        }
    }

    /// Every entry, in queue order.
    pub(super) fn entries(&self) -> Entries<'_> {
        Entries {
            arena: &self.arena,
            at: 0,
            last: 0,
        }
    }

    /// The block's entries, in sequence order.
    pub(super) fn entries_of(&self, offset: u32) -> impl Iterator<Item = Entry<'_>> {
        let arena: &[u8] = if self.has(offset) { &self.arena } else { &[] };
        Entries {
            arena,
            at: 0,
            last: 0,
        }
        .filter(move |e| e.offset == offset)
    }

    /// Keeps the entries `f` maps to `Some` (possibly changed), in order; returns how many
    /// were dropped. The arena is rebuilt to fit.
    pub(super) fn rebuild(&mut self, mut f: impl FnMut(Entry<'_>) -> Option<Entry<'_>>) -> usize {
        let old = std::mem::take(self);
        let mut dropped = 0;
        // Built in one allocation of the old arena's class (deltas grow by a byte where an
        // entry between two went, so it can outgrow it: then `push` grows it once more),
        // then cut to its own class: two allocations, not one per growth step.
        self.arena = Vec::with_capacity(old.arena.capacity());
        for e in old.entries() {
            match f(e) {
                Some(kept) => self.push(kept),
                None => dropped += 1,
            }
        }
        let fit = if self.arena.is_empty() {
            0
        } else {
            size_class(self.arena.len())
        };
        if fit < self.arena.capacity() {
            let mut cut = Vec::with_capacity(fit);
            cut.extend_from_slice(&self.arena);
            self.arena = cut;
        }
        dropped
    }
}

/// Decodes a group's arena.
pub(super) struct Entries<'a> {
    arena: &'a [u8],
    at: usize,
    last: u64,
}

impl<'a> Iterator for Entries<'a> {
    type Item = Entry<'a>;

    fn next(&mut self) -> Option<Entry<'a>> {
        let offset = u32::from(*self.arena.get(self.at)?);
        let mut at = self.at + 1;
        let zigzag = get_varint(self.arena, &mut at)?;
        let tag = get_varint(self.arena, &mut at)?;
        let len = usize::try_from(tag >> 2).ok()?;
        let bytes = self.arena.get(at..at.checked_add(len)?)?;
        let change = match tag & 3 {
            0 => None,
            1 => Some((Op::App, bytes)),
            _ => Some((Op::Write, bytes)),
        };
        let delta = (zigzag >> 1) as i64 ^ -((zigzag & 1) as i64);
        let seq = self.last.wrapping_add(delta as u64);
        self.last = seq;
        self.at = at + len;
        Some(Entry {
            offset,
            seq,
            change,
        })
    }
}

fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn get_varint(b: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*at)?;
        *at += 1;
        v |= u64::from(byte & 0x7F) << shift;
        if byte < 0x80 {
            return Some(v);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry, owned: (offset, seq, change).
    type Owned = (u32, u64, Option<(Op, Vec<u8>)>);

    fn all(g: &Group) -> Vec<Owned> {
        g.entries()
            .map(|e| (e.offset, e.seq, e.change.map(|(op, b)| (op, b.to_vec()))))
            .collect()
    }

    /// Entries come back as pushed: large and out-of-order sequence numbers, every kind,
    /// lengths across varint boundaries; rebuilds keep order and recompute mask and minimum.
    #[test]
    fn entries_round_trip_and_rebuild() {
        let mut g = Group::default();
        let long = vec![7u8; 300];
        let pushed = [
            (3, 1_000_000_000_000, Some((Op::App, &b"abc"[..]))),
            (0, 5, None),
            (31, 1_000_000_000_001, Some((Op::Write, &long[..]))),
            (3, u64::MAX, Some((Op::App, &[][..]))),
            (0, 6, Some((Op::App, &[1u8; 29][..]))),
        ];
        for (offset, seq, change) in pushed {
            g.push(Entry {
                offset,
                seq,
                change,
            });
        }
        let want: Vec<_> = pushed
            .iter()
            .map(|&(o, s, c)| (o, s, c.map(|(op, b)| (op, b.to_vec()))))
            .collect();
        assert_eq!(all(&g), want);
        assert_eq!((g.len(), g.blocks(), g.min_seq()), (5, 3, Some(5)));
        assert_eq!(g.offsets().collect::<Vec<_>>(), [0, 3, 31]);
        assert_eq!(
            g.entries_of(3).next().map(|e| e.seq),
            Some(1_000_000_000_000)
        );
        assert_eq!(g.entries_of(1).next(), None);
        assert_eq!(g.entries_of(0).map(|e| e.seq).collect::<Vec<_>>(), [5, 6]);
        let dropped = g.rebuild(|e| (e.offset != 0).then_some(e));
        assert_eq!(dropped, 2);
        assert_eq!(all(&g), [want[0].clone(), want[2].clone(), want[3].clone()]);
        assert_eq!((g.blocks(), g.min_seq()), (2, Some(1_000_000_000_000)));
        g.rebuild(|e| {
            Some(Entry {
                change: if e.offset == 3 { None } else { e.change },
                ..e
            })
        });
        assert_eq!(g.entries_of(3).filter(|e| e.change.is_some()).count(), 0);
        assert_eq!(g.entries_of(31).count(), 1);
        assert_eq!(g.rebuild(|_| None), 3);
        assert!(g.is_empty() && g.min_seq().is_none() && g.heap_bytes() == 0);
    }

    /// 29-byte modifications take 33 bytes each (offset, a 2-byte delta, tag), and the arena's
    /// slack stays within a quarter (its size class's step).
    #[test]
    fn entries_are_compact() {
        let mut g = Group::default();
        for i in 0..200u64 {
            g.push(Entry {
                offset: (i % 32) as u32,
                seq: 1_000_000 + i * 5000,
                change: Some((Op::App, &[9u8; 29])),
            });
        }
        // The first delta is from 0: 2,000,000 zigzag-encoded takes 3 bytes.
        let first = 1 + 3 + 1 + 29;
        assert_eq!(g.arena.len(), first + 199 * 33);
        assert!(g.heap_bytes() <= g.arena.len() + g.arena.len() / 4 + 32);
    }

    /// Arena sizes fall on few classes (four per doubling): each holds what it is asked to,
    /// wastes at most a quarter, and is exactly what the allocator hands out for it.
    #[test]
    fn arena_sizes_fall_on_few_classes() {
        let mut classes = std::collections::BTreeSet::new();
        for n in 1..=(1usize << 20) {
            let c = size_class(n);
            assert!(c >= n, "{n} -> {c}");
            assert_eq!(size_class(c), c, "a class is its own class: {n} -> {c}");
            assert!(
                alloc_bytes(c) <= alloc_bytes(n) + alloc_bytes(n) / 4,
                "{n} -> {c}"
            );
            classes.insert(c);
        }
        // 16-byte granules up to 64 bytes, then four classes per doubling up to 1 MiB.
        assert!(classes.len() <= 3 + 4 * 14 + 1, "{} classes", classes.len());
        assert_eq!(size_class(100), 104);
        assert_eq!(size_class(1100), 1272);
    }

    #[test]
    fn varints() {
        for v in [0, 1, 127, 128, 16383, 16384, u64::MAX / 2, u64::MAX] {
            let mut b = Vec::new();
            put_varint(&mut b, v);
            assert_eq!(b.len(), varint_len(v), "{v}");
            let mut at = 0;
            assert_eq!(get_varint(&b, &mut at), Some(v));
            assert_eq!(at, b.len());
        }
        assert_eq!(get_varint(&[0x80], &mut 0), None);
    }
}
