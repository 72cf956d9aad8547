//! The router: the in-memory internal nodes, a map from each leaf's low fence to the leaf
//! ([`Fence`] and [`Leaf`] packed to 28 bytes an entry), and the free blocks new leaves
//! come from.
//!
//! Apart because its memory is counted against the budget the engine's queues share, so its
//! entries are kept small, and because open builds it (from the leaves or a persisted image)
//! where the tree's operations only read and extend it.

use std::collections::BTreeMap;
use std::ops::Bound;

use super::leaf::Key;
use crate::Error;

/// A leaf as the router holds it: 8 bytes (the tree's blocks are numbered in 32 bits,
/// checked at open).
#[derive(Debug, Clone, Copy)]
pub(super) struct Leaf {
    pub(super) block: u32,
    /// Upper bound of the leaf's record count.
    pub(super) records_max: u32,
}

impl Leaf {
    /// `records_max` of a leaf known only from a router image: neither its count nor that it
    /// is a leaf has been read. Above any capacity, so the first put splits it, which reads
    /// and checks it (and a delete checks it first).
    const UNREAD: u32 = u32::MAX;

    pub(super) fn new(block: u64, records_max: usize) -> Self {
        Self {
            block: block as u32,
            records_max: u32::try_from(records_max)
                .unwrap_or(u32::MAX)
                .min(Self::UNREAD - 1),
        }
    }

    /// A leaf from a router image, not read yet.
    pub(super) fn unread(block: u64) -> Self {
        Self {
            block: block as u32,
            records_max: Self::UNREAD,
        }
    }

    pub(super) fn is_unread(&self) -> bool {
        self.records_max == Self::UNREAD
    }

    pub(super) fn block(&self) -> u64 {
        u64::from(self.block)
    }

    pub(super) fn records_max(&self) -> usize {
        self.records_max as usize
    }

    pub(super) fn set_records_max(&mut self, n: usize) {
        self.records_max = u32::try_from(n).unwrap_or(u32::MAX).min(Self::UNREAD - 1);
    }
}

/// A key as the router holds it: 20 bytes where a [`Key`] takes 24 (packed to 4-byte
/// alignment), compared as three integers. With 8-byte [`Leaf`]s, a router entry is 28 bytes
/// instead of 40: the internal nodes take 30 % less of the memory budget they share with the
/// engine's queues.
#[derive(Debug, Clone, Copy)]
#[repr(C, packed(4))]
pub(super) struct Fence {
    /// Volume, then the LBA's high half.
    pub(super) hi: u64,
    /// The LBA's low half, then the timestamp's high half.
    pub(super) mid: u64,
    /// The timestamp's low half.
    pub(super) lo: u32,
}

impl From<Key> for Fence {
    fn from(k: Key) -> Self {
        Fence {
            hi: u64::from(k.volume) << 32 | k.lba >> 32,
            mid: k.lba << 32 | k.timestamp >> 32,
            lo: k.timestamp as u32,
        }
    }
}

impl Fence {
    pub(super) fn key(&self) -> Key {
        let (hi, mid, lo) = self.parts();
        Key::new(
            (hi >> 32) as u32,
            hi << 32 | mid >> 32,
            mid << 32 | u64::from(lo),
        )
    }

    /// The fields by value (a packed field cannot be borrowed).
    pub(super) fn parts(&self) -> (u64, u64, u32) {
        (self.hi, self.mid, self.lo)
    }
}

impl PartialEq for Fence {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for Fence {}

impl PartialOrd for Fence {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Fence {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.parts().cmp(&other.parts())
    }
}

const _: () = assert!(std::mem::size_of::<Fence>() == 20 && std::mem::size_of::<Leaf>() == 8);

/// The most blocks a B+tree's engine may have ([`Leaf::block`] is 32 bits).
pub(super) const MAX_BLOCKS: u64 = 1 << 32;

pub(super) struct Router {
    /// Low fence → leaf: the in-memory internal nodes.
    pub(super) leaves: BTreeMap<Fence, Leaf>,
    /// Unused blocks.
    pub(super) free: FreeBlocks,
    /// Set when a batch failed after the router already routed to its new leaves: the tree in
    /// memory no longer matches what is durable, so every later operation fails.
    pub(super) failed: Option<String>,
    /// Where router images go, and the lease of the newest ([`super::image`]); `None` for a
    /// tree opened without an image disk.
    pub(super) persist: Option<super::persist::Persist>,
}

/// Unused blocks as runs `[start, end)`, highest first: allocation takes the lowest block.
/// A run costs 16 bytes however long, so a mostly empty disk costs next to nothing.
#[derive(Debug, Default)]
pub(super) struct FreeBlocks {
    pub(super) runs: Vec<(u64, u64)>,
}

impl FreeBlocks {
    /// The free runs `[start, end)` in ascending order (allocation order).
    pub(super) fn ascending(&self) -> Vec<(u64, u64)> {
        self.runs.iter().rev().copied().collect()
    }

    /// From free runs `[start, end)` in ascending order, as a scan finds them.
    pub(super) fn from_ascending(mut runs: Vec<(u64, u64)>) -> Self {
        runs.retain(|r| r.0 < r.1);
        runs.reverse();
        Self { runs }
    }

    pub(super) fn pop(&mut self) -> Option<u64> {
        let run = self.runs.last_mut()?;
        let block = run.0;
        run.0 += 1;
        if run.0 == run.1 {
            self.runs.pop();
        }
        Some(block)
    }
}

impl Router {
    pub(super) fn check(&self) -> Result<(), Error> {
        match &self.failed {
            Some(why) => Err(Error::Failed(why.clone())),
            None => Ok(()),
        }
    }

    pub(super) fn leaf_for(&self, key: Key) -> Result<(Key, Leaf), Error> {
        // Open guarantees a leaf with fence Key::MIN.
        let (f, l) = self
            .leaves
            .range(..=Fence::from(key))
            .next_back()
            .ok_or_else(|| Error::Index("no leaf has the lowest fence".into()))?;
        Ok((f.key(), *l))
    }

    pub(super) fn next_fence(&self, fence: Key) -> Option<Key> {
        self.leaves
            .range((Bound::Excluded(Fence::from(fence)), Bound::Unbounded))
            .next()
            .map(|(k, _)| k.key())
    }

    pub(super) fn get(&self, fence: Key) -> Option<Leaf> {
        self.leaves.get(&Fence::from(fence)).copied()
    }

    pub(super) fn get_mut(&mut self, fence: Key) -> Option<&mut Leaf> {
        self.leaves.get_mut(&Fence::from(fence))
    }

    pub(super) fn insert(&mut self, fence: Key, leaf: Leaf) -> Option<Leaf> {
        self.leaves.insert(Fence::from(fence), leaf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The router's fences sort as the keys do and give them back.
    #[test]
    fn fences_keep_key_order() {
        let parts_u64 = [0, 1, 255, 256, 1 << 32, u64::MAX - 1, u64::MAX];
        let parts_u32 = [0, 1, 255, 256, u32::MAX];
        let mut keys = Vec::new();
        for &v in &parts_u32 {
            for &l in &parts_u64 {
                for &t in &parts_u64 {
                    keys.push(Key::new(v, l, t));
                }
            }
        }
        for a in &keys {
            assert_eq!(Fence::from(*a).key(), *a);
            for b in &keys {
                assert_eq!(
                    Fence::from(*a).cmp(&Fence::from(*b)),
                    a.cmp(b),
                    "{a:?} {b:?}"
                );
            }
        }
    }
}
