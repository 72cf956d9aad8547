//! Aligned pieces: how a record's extent becomes LT-index keys.
//!
//! The index answers "the newest version of this block at or before V". Keyed by a record's
//! first block, that is a backward scan over the versions of every extent starting near the
//! block — as long as the neighbours were written often. Keyed by block, a 1 MiB write costs
//! 256 entries. Instead an extent is cut into **aligned pieces**: a piece of level L covers
//! `8^L` sectors of 512 bytes starting at a multiple of `8^L` (level 0: 512 B, 1: 4 KiB,
//! 2: 32 KiB, 3: 256 KiB, … 7: 1 GiB). The cut is the canonical one — from the left, always
//! the largest aligned piece that fits — so an extent costs at most 7 pieces per level on
//! each side: one for a 4 KiB-aligned 4 KiB write, four for an aligned 1 MiB write, at most
//! 98 for any extent, however large (a whole-disk trim included).
//!
//! Exactly one piece of each level contains a given sector ([`covering`]), so the newest
//! version of a sector at or before V is the newest of at most [`LEVELS`] predecessor
//! searches, one per level: O(LEVELS · log n) whatever happened to the blocks beside it
//! (docs/ARCHITECTURE.md "History" states and tests this bound).
//!
//! A record's length is a `u32` of bytes, at most 2^23 sectors, so no piece is ever larger
//! than level 7.

/// The unit pieces are counted in: the smallest block size a volume can have.
pub const SECTOR: u64 = 512;
/// log2 of the fan-out between levels.
pub const RADIX_BITS: u32 = 3;
/// Levels 0 through 7.
pub const LEVELS: usize = 8;
/// Where the level sits in an index key's `lba` field (the piece index below it).
const LEVEL_SHIFT: u32 = 58;

/// `8^level` sectors at `index · 8^level`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Piece {
    pub level: u8,
    pub index: u64,
}

impl Piece {
    /// Sectors the piece covers.
    pub fn sectors(self) -> u64 {
        1u64 << (RADIX_BITS * u32::from(self.level))
    }

    /// Its first sector.
    pub fn first_sector(self) -> u64 {
        self.index << (RADIX_BITS * u32::from(self.level))
    }

    /// The `lba` field of its index keys: level in the top bits, so a level's pieces are
    /// adjacent in the tree and each piece's versions follow each other.
    pub fn key_lba(self) -> u64 {
        (u64::from(self.level) << LEVEL_SHIFT) | self.index
    }

    /// The piece a key's `lba` field names; `None` for a value no piece encodes.
    pub fn from_key_lba(lba: u64) -> Option<Self> {
        let level = u8::try_from(lba >> LEVEL_SHIFT).ok()?;
        let index = lba & ((1u64 << LEVEL_SHIFT) - 1);
        (usize::from(level) < LEVELS
            && index.checked_shl(RADIX_BITS * u32::from(level)).is_some()
            && index.leading_zeros() >= RADIX_BITS * u32::from(level))
        .then_some(Self { level, index })
    }
}

/// The canonical cut of sectors `[start, end)` into aligned pieces, in sector order.
pub fn decompose(start: u64, end: u64) -> Decompose {
    Decompose { at: start, end }
}

/// Iterator of [`decompose`].
#[derive(Debug, Clone)]
pub struct Decompose {
    at: u64,
    end: u64,
}

impl Iterator for Decompose {
    type Item = Piece;

    fn next(&mut self) -> Option<Piece> {
        if self.at >= self.end {
            return None;
        }
        let left = self.end - self.at;
        // The largest level whose alignment `at` has and whose size fits in what is left.
        let aligned = (self.at.trailing_zeros() / RADIX_BITS) as usize;
        let fits = ((63 - left.leading_zeros()) / RADIX_BITS) as usize;
        let level = aligned.min(fits).min(LEVELS - 1) as u8;
        let piece = Piece {
            level,
            index: self.at >> (RADIX_BITS * u32::from(level)),
        };
        self.at += piece.sectors();
        Some(piece)
    }
}

/// The piece of each level that contains `sector`, level 0 first.
pub fn covering(sector: u64) -> [Piece; LEVELS] {
    std::array::from_fn(|l| Piece {
        level: l as u8,
        index: sector >> (RADIX_BITS * l as u32),
    })
}

/// A volume byte range as whole sectors; `None` unless both ends are sector-aligned (every
/// record's extent is: volumes have blocks of at least [`SECTOR`] bytes).
pub fn sectors_of(offset: u64, length: u64) -> Option<(u64, u64)> {
    let end = offset.checked_add(length)?;
    (offset.is_multiple_of(SECTOR) && end.is_multiple_of(SECTOR))
        .then_some((offset / SECTOR, end / SECTOR))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn common_writes_cost_few_pieces() {
        // 4 KiB aligned: one level-1 piece.
        let p: Vec<_> = decompose(8, 16).collect();
        assert_eq!(p, vec![Piece { level: 1, index: 1 }]);
        // 1 MiB aligned at 1 MiB: four level-3 pieces.
        let p: Vec<_> = decompose(2048, 4096).collect();
        assert_eq!(p.len(), 4);
        assert!(p.iter().all(|p| p.level == 3));
        // A whole 1 TiB volume trimmed: level-7 pieces only.
        let p: Vec<_> = decompose(0, 1 << 31).collect();
        assert_eq!(p.len(), (1 << 31) / (1 << 21));
    }

    #[test]
    fn key_lba_round_trips_and_rejects_garbage() {
        let p = Piece {
            level: 5,
            index: 12345,
        };
        assert_eq!(Piece::from_key_lba(p.key_lba()), Some(p));
        assert_eq!(Piece::from_key_lba(u64::MAX), None);
    }

    proptest! {
        /// The pieces tile the extent exactly, each aligned, at most 7 per level per side.
        #[test]
        fn pieces_tile_the_extent(start in 0u64..1 << 40, len in 1u64..1 << 23) {
            let end = start + len;
            let mut at = start;
            let mut per_level = [0usize; LEVELS];
            for p in decompose(start, end) {
                prop_assert_eq!(p.first_sector(), at);
                prop_assert_eq!(p.first_sector() % p.sectors(), 0);
                at += p.sectors();
                per_level[usize::from(p.level)] += 1;
                prop_assert_eq!(Piece::from_key_lba(p.key_lba()), Some(p));
            }
            prop_assert_eq!(at, end);
            prop_assert!(per_level.iter().all(|&n| n <= 14), "{:?}", per_level);
        }

        /// A sector of the extent lies in exactly one of its pieces, and that piece is the
        /// one [`covering`] names at the piece's level.
        #[test]
        fn covering_finds_the_piece(start in 0u64..1 << 30, len in 1u64..1 << 16, off in 0u64..1 << 16) {
            let s = start + off % len;
            let hits: Vec<_> = decompose(start, start + len)
                .filter(|p| p.first_sector() <= s && s < p.first_sector() + p.sectors())
                .collect();
            prop_assert_eq!(hits.len(), 1);
            prop_assert_eq!(covering(s)[usize::from(hits[0].level)], hits[0]);
        }
    }
}
