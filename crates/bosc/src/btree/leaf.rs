//! The leaf format and the leaves' update function: [`Key`], the leaf payload (magic,
//! count, low fence, sorted records), the modifications a leaf takes (put, delete,
//! keep-below, drop-through) and [`LeafApp`], which BOSC runs to apply them.
//!
//! Apart from the tree because this is what lies on the disk and in the log: the bytes every
//! other part reads and writes, and the one part the engine calls back into.

use crate::{BlockApp, Change, Error, Op};

/// A version-index key. Ordered by volume, then LBA, then timestamp, so the versions of one
/// block are adjacent and "newest at or before T" is a predecessor search.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Key {
    pub volume: u32,
    pub lba: u64,
    pub timestamp: u64,
}

impl Key {
    pub const ENCODED_LEN: usize = 20;
    pub const MIN: Key = Key {
        volume: 0,
        lba: 0,
        timestamp: 0,
    };

    pub fn new(volume: u32, lba: u64, timestamp: u64) -> Self {
        Self {
            volume,
            lba,
            timestamp,
        }
    }

    pub fn encode(&self, out: &mut [u8]) {
        out[0..4].copy_from_slice(&self.volume.to_le_bytes());
        out[4..12].copy_from_slice(&self.lba.to_le_bytes());
        out[12..20].copy_from_slice(&self.timestamp.to_le_bytes());
    }

    pub fn decode(b: &[u8]) -> Self {
        Self {
            volume: u32_at(b, 0),
            lba: u64_at(b, 4),
            timestamp: u64_at(b, 12),
        }
    }
}

pub(super) fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

pub(super) fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

pub const LEAF_MAGIC: [u8; 4] = *b"BTLF";
pub const LEAF_HEADER_LEN: usize = 8 + Key::ENCODED_LEN;
pub const RECORD_LEN: usize = Key::ENCODED_LEN + 8;
const _: () = assert!(LEAF_HEADER_LEN == 28 && RECORD_LEN == 28);

pub(super) const TAG_PUT: u8 = 1;
pub(super) const TAG_DELETE: u8 = 2;
pub(super) const TAG_KEEP_BELOW: u8 = 3;
/// Drops every record of the key's volume whose timestamp is at or below the key's (the
/// key's LBA is 0 and unused): one modification a leaf instead of a delete a key when a
/// version index lets go of everything of a volume up to an instant.
pub(super) const TAG_DROP_THROUGH: u8 = 4;

/// Records a leaf payload of `payload_bytes` holds.
pub fn leaf_capacity(payload_bytes: usize) -> usize {
    payload_bytes.saturating_sub(LEAF_HEADER_LEN) / RECORD_LEN
}

/// Read access to a leaf payload.
pub(super) struct LeafView<'a>(pub(super) &'a [u8]);

impl<'a> LeafView<'a> {
    /// The payload as a leaf if it is one the tree could read without going out of bounds:
    /// the magic and a count within the capacity. Every block the router sends a query or a
    /// split to is checked so: a scan verified its leaves, but a router image is trusted
    /// without reading them, and a wrong one must fail the operation, not panic.
    pub(super) fn checked(block: u64, p: &'a [u8]) -> Result<Self, Error> {
        let v = LeafView(p);
        if v.is_leaf() && v.count() <= leaf_capacity(p.len()) {
            Ok(v)
        } else {
            Err(Error::Index(format!(
                "block {block} is routed to but holds no leaf"
            )))
        }
    }
}

impl LeafView<'_> {
    pub(super) fn is_leaf(&self) -> bool {
        self.0.len() >= LEAF_HEADER_LEN && self.0[0..4] == LEAF_MAGIC
    }
    pub(super) fn count(&self) -> usize {
        u32_at(self.0, 4) as usize
    }
    pub(super) fn fence(&self) -> Key {
        Key::decode(&self.0[8..28])
    }
    pub(super) fn key(&self, i: usize) -> Key {
        let at = LEAF_HEADER_LEN + i * RECORD_LEN;
        Key::decode(&self.0[at..at + Key::ENCODED_LEN])
    }
    pub(super) fn value(&self, i: usize) -> u64 {
        u64_at(self.0, LEAF_HEADER_LEN + i * RECORD_LEN + Key::ENCODED_LEN)
    }
    /// `Ok(i)`: record i has the key; `Err(i)`: it would go at i.
    pub(super) fn search(&self, key: &Key) -> Result<usize, usize> {
        let (mut lo, mut hi) = (0, self.count());
        while lo < hi {
            let mid = (lo + hi) / 2;
            match self.key(mid).cmp(key) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Ok(mid),
            }
        }
        Err(lo)
    }
    /// What makes a block with the leaf magic no leaf the tree could have written: more
    /// records than fit, records out of order, or below the fence. The tree's record counts
    /// and searches rely on neither happening.
    pub(super) fn malformed(&self, capacity: usize) -> Option<String> {
        let n = self.count();
        if n > capacity {
            return Some(format!(
                "a leaf of {n} records, more than the {capacity} it holds"
            ));
        }
        if n > 0 && self.key(0) < self.fence() {
            return Some("a leaf record below its fence".into());
        }
        (1..n)
            .any(|i| self.key(i - 1) >= self.key(i))
            .then(|| "leaf records out of order".into())
    }
    /// Records with keys in `[from, to)`.
    pub(super) fn records(&self, from: Key, to: Option<Key>) -> Vec<(Key, u64)> {
        let start = self.search(&from).unwrap_or_else(|i| i);
        (start..self.count())
            .map(|i| (self.key(i), self.value(i)))
            .take_while(|(k, _)| to.is_none_or(|t| *k < t))
            .collect()
    }
}

/// Builds a leaf payload.
pub fn leaf_payload(payload_bytes: usize, fence: Key, records: &[(Key, u64)]) -> Vec<u8> {
    assert!(records.len() <= leaf_capacity(payload_bytes));
    let mut p = vec![0u8; payload_bytes];
    p[0..4].copy_from_slice(&LEAF_MAGIC);
    p[4..8].copy_from_slice(&(records.len() as u32).to_le_bytes());
    fence.encode(&mut p[8..28]);
    for (i, (k, v)) in records.iter().enumerate() {
        let at = LEAF_HEADER_LEN + i * RECORD_LEN;
        k.encode(&mut p[at..at + Key::ENCODED_LEN]);
        p[at + Key::ENCODED_LEN..at + RECORD_LEN].copy_from_slice(&v.to_le_bytes());
    }
    p
}

/// A staged change applied to a leaf's payload in memory, as the engine would apply it.
pub(super) fn apply_change(p: &mut [u8], c: &Change) {
    match c.op {
        Op::Write => {
            p.fill(0);
            p[..c.bytes.len()].copy_from_slice(&c.bytes);
        }
        Op::App => LeafApp.apply(c.block, p, &c.bytes),
    }
}

pub(super) fn set_count(p: &mut [u8], n: usize) {
    p[4..8].copy_from_slice(&(n as u32).to_le_bytes());
}

pub(super) fn encode_mod(tag: u8, key: Key, value: u64) -> Vec<u8> {
    let mut m = vec![0u8; 1 + RECORD_LEN];
    m[0] = tag;
    key.encode(&mut m[1..21]);
    m[21..29].copy_from_slice(&value.to_le_bytes());
    m
}

/// The leaf's commit function (part one): applies a put, delete, split truncation or drop.
pub struct LeafApp;

impl BlockApp for LeafApp {
    fn apply(&self, _block: u64, p: &mut [u8], m: &[u8]) {
        if m.len() != 1 + RECORD_LEN || !LeafView(p).is_leaf() {
            // The tree only modifies blocks it wrote as leaves first; anything else is a bug.
            panic!("B+tree modification of a non-leaf or malformed modification");
        }
        let key = Key::decode(&m[1..21]);
        let view = LeafView(p);
        let (count, found) = (view.count(), view.search(&key));
        let at = |i: usize| LEAF_HEADER_LEN + i * RECORD_LEN;
        match (m[0], found) {
            (TAG_PUT, Ok(i)) => p[at(i) + 20..at(i) + 28].copy_from_slice(&m[21..29]),
            (TAG_PUT, Err(i)) => {
                assert!(count < leaf_capacity(p.len()), "leaf overflow");
                p.copy_within(at(i)..at(count), at(i + 1));
                p[at(i)..at(i + 1)].copy_from_slice(&m[1..29]);
                set_count(p, count + 1);
            }
            (TAG_DELETE, Ok(i)) => {
                p.copy_within(at(i + 1)..at(count), at(i));
                p[at(count - 1)..at(count)].fill(0);
                set_count(p, count - 1);
            }
            (TAG_DELETE, Err(_)) => {}
            (TAG_KEEP_BELOW, found) => {
                let keep = found.unwrap_or_else(|i| i);
                p[at(keep)..at(count)].fill(0);
                set_count(p, keep);
            }
            (TAG_DROP_THROUGH, _) => {
                // The volume's records are adjacent; keep those past the timestamp.
                let v = LeafView(p);
                let first = v.search(&Key::new(key.volume, 0, 0)).unwrap_or_else(|i| i);
                let end = match key.volume.checked_add(1) {
                    Some(next) => v.search(&Key::new(next, 0, 0)).unwrap_or_else(|i| i),
                    None => count,
                };
                let mut kept = first;
                for i in first..end {
                    if LeafView(p).key(i).timestamp > key.timestamp {
                        p.copy_within(at(i)..at(i + 1), at(kept));
                        kept += 1;
                    }
                }
                if kept < end {
                    p.copy_within(at(end)..at(count), at(kept));
                    let n = count - (end - kept);
                    p[at(n)..at(count)].fill(0);
                    set_count(p, n);
                }
            }
            _ => panic!("unknown B+tree modification tag {}", m[0]),
        }
    }

    /// A leaf the commit cycle finds within a sixteenth of full is kept in memory, and the
    /// tree splits it at its next batch ([`BPlusTree::insert_batch`]) without reading it: the
    /// seed's proactive split (§3.3), where the second part of the commit function splits a
    /// leaf the first part filled. Otherwise a leaf that fills up on disk is read again to
    /// split. Not from the split threshold (3/4 by default): splitting every leaf the commit
    /// finds above it halves leaves at 3/4 full, and the index benchmark then wrote 23 % more
    /// blocks per update and its inserts were 8 % slower (docs/benchmarks.md).
    fn hot(&self, _block: u64, p: &[u8]) -> bool {
        let v = LeafView(p);
        v.is_leaf() && v.count() >= hot_at(leaf_capacity(p.len()))
    }
}

/// Records from which a leaf is nearly full: kept in memory by a commit that finds it so
/// ([`LeafApp::hot`]), read ahead by a batch that brings it there ([`BPlusTree::insert_batch`]).
pub(super) fn hot_at(capacity: usize) -> usize {
    capacity - capacity / 16
}

/// A leaf splits at 3/4 of its capacity unless the tree is opened with another threshold.
pub(super) fn default_split_threshold(capacity: usize) -> usize {
    capacity * 3 / 4
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(p: &mut [u8], tag: u8, k: u64, v: u64) {
        LeafApp.apply(0, p, &encode_mod(tag, Key::new(1, k, 0), v));
    }

    #[test]
    fn leaf_put_delete_keep_below() {
        let mut p = leaf_payload(488, Key::MIN, &[]);
        for k in [5, 1, 9, 3, 7] {
            apply(&mut p, TAG_PUT, k, k * 10);
        }
        apply(&mut p, TAG_PUT, 3, 33);
        apply(&mut p, TAG_DELETE, 9, 0);
        apply(&mut p, TAG_DELETE, 4, 0);
        let got: Vec<_> = LeafView(&p)
            .records(Key::MIN, None)
            .into_iter()
            .map(|(k, v)| (k.lba, v))
            .collect();
        assert_eq!(got, vec![(1, 10), (3, 33), (5, 50), (7, 70)]);
        apply(&mut p, TAG_KEEP_BELOW, 5, 0);
        assert_eq!(LeafView(&p).count(), 2);
        assert_eq!(p, {
            let mut q = leaf_payload(488, Key::MIN, &[]);
            apply(&mut q, TAG_PUT, 1, 10);
            apply(&mut q, TAG_PUT, 3, 33);
            q
        });
    }

    /// A drop-through removes exactly its volume's records at or below its timestamp, keeps
    /// the order, and leaves the bytes past the count zero, as a leaf built with only the
    /// survivors (so a block's image does not depend on how it got there).
    #[test]
    fn leaf_drop_through_keeps_the_volume_s_newer_records_and_the_others() {
        let recs: Vec<(Key, u64)> = [(0, 5, 9), (1, 1, 3), (1, 1, 8), (1, 2, 2), (1, 4, 6)]
            .into_iter()
            .chain([(1, 4, 9), (2, 0, 1), (u32::MAX, 3, 1), (u32::MAX, 3, 7)])
            .map(|(v, l, t)| (Key::new(v, l, t), l * 100 + t))
            .collect();
        let drop = |volume: u32, through: u64| {
            let mut p = leaf_payload(488, Key::MIN, &recs);
            let m = encode_mod(TAG_DROP_THROUGH, Key::new(volume, 0, through), 0);
            LeafApp.apply(0, &mut p, &m);
            let kept: Vec<(Key, u64)> = recs
                .iter()
                .filter(|(k, _)| k.volume != volume || k.timestamp > through)
                .copied()
                .collect();
            assert_eq!(
                p,
                leaf_payload(488, Key::MIN, &kept),
                "volume {volume} through {through}"
            );
            LeafView(&p).count()
        };
        assert_eq!(drop(1, 6), 6);
        assert_eq!(drop(1, 0), 9);
        assert_eq!(drop(1, u64::MAX), 4);
        assert_eq!(drop(3, u64::MAX), 9);
        assert_eq!(drop(u32::MAX, 5), 8);
        assert_eq!(drop(0, 9), 8);
    }
}
