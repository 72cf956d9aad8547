#![allow(dead_code, clippy::unwrap_used)]
//! The fixed values the BOSC golden-file tests share (`golden.rs`, `golden_own_log.rs`): the
//! golden block size, the disk identities, the B+tree leaf and its modification, and
//! little-endian readers for the documented-offset tests.

use mariner_bosc::btree::{leaf_payload, Key};
use mariner_bosc::format::{DiskId, BLOCK_HEADER_LEN};

/// Block size of every golden block; payload = 512 − 24 = 488 bytes.
pub const BLOCK: usize = 512;
pub const PAYLOAD: usize = BLOCK - BLOCK_HEADER_LEN;

pub fn le_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().unwrap())
}
pub fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
pub fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// The disk identity of every golden block and checkpoint.
pub const DISK_ID: DiskId = DiskId(0x0f0e_0d0c_0b0a_0908_0706_0504_0302_0100);
/// Another disk's.
pub const OTHER_DISK: DiskId = DiskId(0x0f0e_0d0c_0b0a_0908_0706_0504_0302_0101);

pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

pub fn leaf_fence() -> Key {
    Key::new(3, 100, 0)
}

pub fn leaf_records() -> Vec<(Key, u64)> {
    vec![
        (Key::new(3, 100, 5), 0x1000_0000_0000_0010),
        (Key::new(3, 100, 9), 0x1000_0000_0000_0011),
        (Key::new(3, 257, 1), 0x1000_0000_0000_0012),
    ]
}

pub fn golden_leaf() -> Vec<u8> {
    leaf_payload(PAYLOAD, leaf_fence(), &leaf_records())
}

/// The B+tree leaf modification as `LeafApp` reads it: tag u8 (1 put, 2 delete, 3 keep
/// below, 4 drop through), key (20 bytes), value u64.
pub fn leaf_mod(tag: u8, key: Key, value: u64) -> Vec<u8> {
    let mut m = vec![tag];
    let mut k = [0u8; Key::ENCODED_LEN];
    key.encode(&mut k);
    m.extend_from_slice(&k);
    m.extend_from_slice(&value.to_le_bytes());
    m
}
