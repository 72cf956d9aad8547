//! Shadow extents (docs/FORMATS.md "Shadow extents"): the byte layouts of the home map and of
//! the own-log record that moves extents between their homes. Pure: no I/O. Little-endian.
//!
//! On a disk of shadow extents every extent (`max_run` consecutive blocks) has two homes, and
//! a commit writes an extent whole to the home it is not in, so a crash that tears the write
//! leaves the extent's current home as it was: no double write. Which home is current is one
//! bit an extent: in the home map, written beside each checkpoint (two slots, as the
//! checkpoints), and in [`LoggedHomes`] records for the moves since.
//!
//! Home map slot (`Geometry::map_slot_bytes`, a multiple of 4096):
//!
//! | offset | size | field                                                          |
//! |--------|------|----------------------------------------------------------------|
//! | 0      | 8    | magic `b"BOSCHOME"`                                            |
//! | 8      | 2    | version ([`super::FORMAT_VERSION`])                            |
//! | 10     | 2    | zero                                                           |
//! | 12     | 4    | CRC32C of the whole slot with this field zeroed                |
//! | 16     | 8    | counter: the checkpoint's it was written with                  |
//! | 24     | 8    | checkpoint: that checkpoint's sequence number                  |
//! | 32     | 8    | extents                                                        |
//! | 40     | 16   | disk id                                                        |
//! | 56     | …    | one bit an extent (extent e: byte e / 8, bit e % 8): its home  |
//!
//! [`LoggedHomes`] (the payload of an own-log `Write` record, offset 0):
//! `version u16 | 4 u8 | count u32 | count × (extent u64 | home u8)`.

use super::{u64_at, DiskId, Geometry, FORMAT_VERSION, RECORD_VERSION};

pub const HOME_MAP_MAGIC: [u8; 8] = *b"BOSCHOME";
/// Bytes of a home map slot before its bits.
pub const HOME_MAP_HEADER_LEN: usize = 56;
/// The `op` byte of a [`LoggedHomes`] record.
pub const HOMES_CODE: u8 = 4;
/// A [`LoggedHomes`] record's bytes before its first entry: version, code, count.
pub const HOMES_PREFIX_LEN: usize = 7;
/// A [`LoggedHomes`] entry: extent, home.
pub const HOMES_ENTRY_LEN: usize = 9;

/// Which home each extent is in, as of one checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HomeMap {
    /// The counter of the checkpoint written with it.
    pub counter: u64,
    /// That checkpoint's sequence number. A map belongs to a checkpoint only if both match:
    /// a crash can leave a map written for a checkpoint that never landed, and the next
    /// checkpoint after the reopen takes the same counter (the same slots) again.
    pub checkpoint: u64,
    /// One bit an extent, extent e at byte e / 8, bit e % 8.
    pub bits: Vec<u8>,
}

/// Why a home map slot is unusable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HomeMapError {
    #[error("no home map magic, or another version")]
    Magic,
    #[error("home map checksum mismatch (torn or corrupt)")]
    Checksum,
    #[error("the home map is of another disk, or another geometry")]
    Foreign,
    #[error("bytes past the home map's bits are not zero")]
    Malformed,
}

impl HomeMap {
    /// Every extent in home 0 (a fresh disk).
    pub fn fresh(geo: &Geometry, counter: u64) -> Self {
        Self {
            counter,
            checkpoint: 0,
            bits: vec![0; geo.home_map_bits_bytes()],
        }
    }

    pub fn home(&self, extent: u64) -> u8 {
        usize::try_from(extent / 8)
            .ok()
            .and_then(|i| self.bits.get(i))
            .map_or(0, |b| b >> (extent % 8) & 1)
    }

    pub fn set(&mut self, extent: u64, home: u8) {
        if let Some(b) = usize::try_from(extent / 8)
            .ok()
            .and_then(|i| self.bits.get_mut(i))
        {
            let bit = 1u8 << (extent % 8);
            if home & 1 == 1 {
                *b |= bit;
            } else {
                *b &= !bit;
            }
        }
    }

    /// The slot image: `geo.map_slot_bytes()` bytes.
    pub fn encode(&self, geo: &Geometry, disk_id: DiskId) -> Vec<u8> {
        let mut out = vec![0u8; usize::try_from(geo.map_slot_bytes()).unwrap_or(0)];
        out[0..8].copy_from_slice(&HOME_MAP_MAGIC);
        out[8..10].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        out[16..24].copy_from_slice(&self.counter.to_le_bytes());
        out[24..32].copy_from_slice(&self.checkpoint.to_le_bytes());
        out[32..40].copy_from_slice(&geo.extents().to_le_bytes());
        out[40..56].copy_from_slice(&disk_id.0.to_le_bytes());
        let n = self.bits.len().min(out.len() - HOME_MAP_HEADER_LEN);
        out[HOME_MAP_HEADER_LEN..HOME_MAP_HEADER_LEN + n].copy_from_slice(&self.bits[..n]);
        let crc = crc32c::crc32c(&out);
        out[12..16].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// Checks magic and version, CRC, then that it is this disk's and geometry's.
    pub fn decode(b: &[u8], geo: &Geometry, disk_id: DiskId) -> Result<Self, HomeMapError> {
        let len = usize::try_from(geo.map_slot_bytes()).unwrap_or(usize::MAX);
        if b.len() < len
            || b[0..8] != HOME_MAP_MAGIC
            || u16::from_le_bytes([b[8], b[9]]) != FORMAT_VERSION
        {
            return Err(HomeMapError::Magic);
        }
        let mut copy = b[..len].to_vec();
        copy[12..16].fill(0);
        if crc32c::crc32c(&copy) != u32::from_le_bytes([b[12], b[13], b[14], b[15]]) {
            return Err(HomeMapError::Checksum);
        }
        let mut id = [0u8; 16];
        id.copy_from_slice(&b[40..56]);
        if u64_at(b, 32) != geo.extents() || DiskId(u128::from_le_bytes(id)) != disk_id {
            return Err(HomeMapError::Foreign);
        }
        let bits_len = geo.home_map_bits_bytes();
        if b[HOME_MAP_HEADER_LEN + bits_len..len]
            .iter()
            .any(|&x| x != 0)
            || b[10..12] != [0, 0]
        {
            return Err(HomeMapError::Malformed);
        }
        Ok(Self {
            counter: u64_at(b, 16),
            checkpoint: u64_at(b, 24),
            bits: b[HOME_MAP_HEADER_LEN..HOME_MAP_HEADER_LEN + bits_len].to_vec(),
        })
    }
}

/// Extents a commit moved to their other home, logged once the move is synced and before
/// anything says the modifications it carries are committed: recovery applies these to the
/// checkpoint's home map in log order (each entry names the home, so applying one twice is
/// harmless).
pub struct LoggedHomes;

impl LoggedHomes {
    pub fn encode(moves: &[(u64, u8)]) -> Vec<u8> {
        let mut out = Vec::with_capacity(HOMES_PREFIX_LEN + moves.len() * HOMES_ENTRY_LEN);
        out.extend_from_slice(&RECORD_VERSION.to_le_bytes());
        out.push(HOMES_CODE);
        let count = u32::try_from(moves.len()).unwrap_or(u32::MAX);
        out.extend_from_slice(&count.to_le_bytes());
        for &(extent, home) in moves.iter().take(count as usize) {
            out.extend_from_slice(&extent.to_le_bytes());
            out.push(home);
        }
        out
    }

    /// `None` for another version or code, a count that does not match the length, or a home
    /// other than 0 and 1.
    pub fn decode(b: &[u8]) -> Option<Vec<(u64, u8)>> {
        if b.len() < HOMES_PREFIX_LEN
            || u16::from_le_bytes([b[0], b[1]]) != RECORD_VERSION
            || b[2] != HOMES_CODE
        {
            return None;
        }
        let count = u32::from_le_bytes([b[3], b[4], b[5], b[6]]) as usize;
        let body = &b[HOMES_PREFIX_LEN..];
        if body.len() != count.checked_mul(HOMES_ENTRY_LEN)? {
            return None;
        }
        body.chunks_exact(HOMES_ENTRY_LEN)
            .map(|e| (e[8] <= 1).then(|| (u64_at(e, 0), e[8])))
            .collect()
    }
}
