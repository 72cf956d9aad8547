//! The keys and values every engine sees: the CDP version index's shape, (volume, LBA,
//! timestamp) → log location, 20 + 8 bytes.
//!
//! - Preload: entry `i` is (i / per_volume, (i % per_volume) · 8, 1) → i + 1, over four
//!   volumes, generated in key order (the sorted bulk load).
//! - Insert `j`: a new version of a random LBA of a random volume, timestamp 2 + j (so never
//!   present before), value [`INSERT_TAG`] | j.
//! - Update `j`: a random preloaded key gets [`UPDATE_TAG`] | j.
//!
//! The hash tables hold u64 keys: [`pack`] maps a key one-to-one into 64 bits for the sizes
//! the benchmark allows (volume < 2^8, LBA < 2^32, timestamp < 2^24).

use mariner_bosc::btree::Key;

use crate::BenchError;

/// Volumes the keys spread over.
pub const VOLUMES: u64 = 4;
/// Preloaded LBAs are this far apart, so inserts of other LBAs land between them.
pub const LBA_STRIDE: u64 = 8;
/// Marks an inserted value.
pub const INSERT_TAG: u64 = 1 << 62;
/// Marks an updated value.
pub const UPDATE_TAG: u64 = 1 << 63;
/// Bytes of one record in the version-index shape (key + value).
pub const RECORD_BYTES: u64 = 28;

/// splitmix64: seeded and reproducible.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeded.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// The preloaded key space.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    /// Entries preloaded.
    pub preload: u64,
    per_volume: u64,
}

impl Workload {
    /// The key space of `preload` entries.
    pub fn new(preload: u64) -> Self {
        Self {
            preload,
            per_volume: preload.div_ceil(VOLUMES).max(1),
        }
    }

    /// Preloaded entry `i`'s key.
    pub fn preload_key(&self, i: u64) -> Key {
        Key::new(
            (i / self.per_volume) as u32,
            (i % self.per_volume) * LBA_STRIDE,
            1,
        )
    }

    /// Preloaded entry `i`'s value.
    pub fn preload_value(i: u64) -> u64 {
        i + 1
    }

    /// Every preloaded record, in key order.
    pub fn preloaded(&self) -> impl Iterator<Item = (Key, u64)> + '_ {
        (0..self.preload).map(|i| (self.preload_key(i), Self::preload_value(i)))
    }

    /// Insert `j`: a key not present before.
    pub fn insert(&self, rng: &mut Rng, j: u64) -> (Key, u64) {
        let volume = rng.below(VOLUMES) as u32;
        let lba = rng.below(self.per_volume * LBA_STRIDE);
        (Key::new(volume, lba, 2 + j), INSERT_TAG | j)
    }

    /// A random preloaded entry's index.
    pub fn pick(&self, rng: &mut Rng) -> u64 {
        rng.below(self.preload)
    }

    /// Update `j`: a new value for a random preloaded key.
    pub fn update(&self, rng: &mut Rng, j: u64) -> (Key, u64) {
        (self.preload_key(self.pick(rng)), UPDATE_TAG | j)
    }

    /// Whether `value` can be what preloaded entry `i` holds: its preload value or an update.
    pub fn plausible(i: u64, value: u64) -> bool {
        value == Self::preload_value(i) || value & UPDATE_TAG != 0
    }

    /// The range query from preloaded entry `i`: `len` LBAs of its volume, all timestamps.
    /// Returns the bounds and how many preloaded entries it must find at least.
    pub fn range(&self, i: u64, len: u64) -> (Key, Key, u64) {
        let from = self.preload_key(i);
        let to = Key::new(from.volume, from.lba + len * LBA_STRIDE, 0);
        let left_in_volume = self.per_volume - i % self.per_volume;
        let left = left_in_volume.min(self.preload - i);
        (Key::new(from.volume, from.lba, 0), to, len.min(left))
    }
}

/// A key as the hash tables' u64: volume (8 bits), LBA (32), timestamp (24). One-to-one and
/// order-keeping within those widths, which [`crate::Config`] guarantees for every key the
/// workload makes.
pub fn pack(k: Key) -> u64 {
    u64::from(k.volume) << 56 | (k.lba & 0xFFFF_FFFF) << 24 | (k.timestamp & 0xFF_FFFF)
}

/// Big-endian key bytes: byte order is key order, as redb and fjall compare keys.
#[allow(clippy::big_endian_bytes)] // the ordering of the encoded bytes is the point
pub fn key_bytes(k: Key) -> [u8; 20] {
    let mut b = [0u8; 20];
    b[0..4].copy_from_slice(&k.volume.to_be_bytes());
    b[4..12].copy_from_slice(&k.lba.to_be_bytes());
    b[12..20].copy_from_slice(&k.timestamp.to_be_bytes());
    b
}

/// Inverse of [`key_bytes`].
#[allow(clippy::big_endian_bytes)]
pub fn key_from_bytes(b: &[u8]) -> Result<Key, BenchError> {
    let bad = || BenchError::Check(format!("a stored key has {} bytes, not 20", b.len()));
    let arr: [u8; 20] = b.try_into().map_err(|_| bad())?;
    let mut v = [0u8; 4];
    v.copy_from_slice(&arr[0..4]);
    let mut l = [0u8; 8];
    l.copy_from_slice(&arr[4..12]);
    let mut t = [0u8; 8];
    t.copy_from_slice(&arr[12..20]);
    Ok(Key::new(
        u32::from_be_bytes(v),
        u64::from_be_bytes(l),
        u64::from_be_bytes(t),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preload_is_sorted_and_encodings_keep_order() {
        let w = Workload::new(1001);
        let keys: Vec<_> = w.preloaded().map(|(k, _)| k).collect();
        assert!(keys.windows(2).all(|p| p[0] < p[1]));
        assert!(keys
            .windows(2)
            .all(|p| key_bytes(p[0]) < key_bytes(p[1]) && pack(p[0]) < pack(p[1])));
        assert_eq!(key_from_bytes(&key_bytes(keys[77])).ok(), Some(keys[77]));
    }

    #[test]
    fn inserts_are_new_keys() {
        let w = Workload::new(1000);
        let mut rng = Rng::new(1);
        let pre: std::collections::BTreeSet<_> = w.preloaded().map(|(k, _)| k).collect();
        for j in 0..1000 {
            assert!(!pre.contains(&w.insert(&mut rng, j).0));
        }
    }
}
