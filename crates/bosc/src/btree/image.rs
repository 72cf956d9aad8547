//! The router image: the tree's internal nodes persisted beside the data disk, so that an
//! open reads the image and a bounded region of blocks instead of every leaf.
//!
//! # What it says, and why that stays true
//!
//! An image lists the tree's leaves (low fence and block) and its free blocks, and grants a
//! **lease**: the first `lease_blocks` blocks of the free list, in allocation order. The
//! tree never allocates a block outside the lease of its newest durable image: when the
//! lease runs out it writes (and syncs) a new image before taking another block. Two facts
//! about the tree make that enough to route exactly after any crash:
//!
//! - Leaves are never moved, merged or freed, and a leaf's fence never changes (a split
//!   writes a new leaf and truncates the old one in place). So every leaf the image lists is
//!   still a leaf, with the same fence, in the same block, whatever happened since.
//! - A new leaf is always written to a block the allocator took from the free list. So every
//!   leaf created since the image lies inside its lease.
//!
//! Open therefore takes the image's leaves and scans only the lease ([`crate::Bosc::scan`],
//! which merges what the own log requeued: a split logged after the last BOSC checkpoint is
//! found as its queued whole-block write, one committed before it on the disk). The image is
//! independent of BOSC's checkpoints: it never describes uncommitted state as committed,
//! because it lists only leaves whose creating write was durable in the log when the image
//! was taken (between batches every change is durable; an image written inside a batch
//! leaves out the batch's own new leaves and counts their blocks as free).
//!
//! What the image cannot carry is an exact record count per leaf: puts after it are not in
//! it. The router's counts are upper bounds (a put into a full leaf would overflow it), so a
//! leaf from the image starts unread, and its first put reads it to learn its count
//! (`counts_refreshed`; a batch reads such leaves concurrently), unless the background
//! refresher (`counts`), which reads every leaf in block order after the open, got there
//! first. Leaves found in the lease are read by the scan and counted exactly. The refresher
//! also checks every leaf against the router, so an image that passed every check at open
//! and still lies fails the tree within one sequential read of it.
//!
//! The lease argument needs the newest image: an older copy of the file put back beside the
//! data disk may have a lease the tree has outrun. Allocation is in order, so the tree would
//! then have left leaves just past that lease; open reads 64 free blocks past it, and a leaf
//! there makes it fall back to the full scan.
//!
//! A split torn by a crash (new leaf written, old leaf not yet truncated) can only be the
//! last split before the crash, and its new leaf is the last one the lease holds in
//! allocation order; open checks the leaves before the last few it found.
//!
//! # Where it lives, and how it is replaced atomically
//!
//! On a disk (a file) of its own, beside the data disk: two 64-byte headers at offsets 0
//! (slot A) and 4096 (slot B), ping-pong like BOSC's checkpoint, each pointing at a body
//! elsewhere in the file. A new image writes its body where it overlaps no byte of the newest
//! valid body, syncs, then writes its header over the older slot and syncs again. A crash
//! before the header's sync leaves the newest header and its body untouched. Open takes the
//! valid header with the highest generation, but only when no slot holds a damaged header:
//! a header that fails its CRC may be the newest one torn, or one that rotted after it
//! extended the lease, and the older image's lease may then not cover what was allocated.
//! A missing, damaged, foreign (another disk id or geometry) or inconsistent image makes
//! open fall back to reading every leaf, as without an image; then it writes a fresh one.
//!
//! Layout (little-endian; docs/FORMATS.md "B+tree router image"):
//!
//! Header: magic `b"BTROUTER"`, version u16, reserved u16, CRC32C u32 (of the 64 bytes with
//! itself zeroed), generation u64, BOSC disk id u128, body offset u64, body length u64, body
//! CRC32C u32, reserved u32.
//!
//! Body: block count u64, payload bytes u32, leaves u32, free runs u32, reserved u32, lease
//! blocks u64; then per leaf its fence key (20 bytes) and block u32, in fence order; then per
//! free run its start and end u64, ascending.

use super::leaf::Key;
use crate::format::DiskId;

pub const IMAGE_MAGIC: [u8; 8] = *b"BTROUTER";
pub const IMAGE_VERSION: u16 = 1;
pub const IMAGE_HEADER_LEN: usize = 64;
/// Where the two header slots are.
pub const IMAGE_SLOTS: [u64; 2] = [0, 4096];
/// Bodies start here, past both header slots.
pub const IMAGE_BODY_START: u64 = 8192;
pub const IMAGE_BODY_PREFIX_LEN: usize = 32;
pub const IMAGE_LEAF_LEN: usize = Key::ENCODED_LEN + 4;
pub const IMAGE_FREE_RUN_LEN: usize = 16;

// The offsets the docs' tables give.
const H_VERSION: usize = 8;
const H_CRC: usize = 12;
const H_GENERATION: usize = 16;
const H_DISK_ID: usize = 24;
const H_BODY_OFFSET: usize = 40;
const H_BODY_LEN: usize = 48;
const H_BODY_CRC: usize = 56;
const B_BLOCK_COUNT: usize = 0;
const B_PAYLOAD: usize = 8;
const B_LEAVES: usize = 12;
const B_FREE: usize = 16;
const B_LEASE: usize = 24;
const _: () = assert!(
    H_BODY_CRC + 8 == IMAGE_HEADER_LEN
        && B_BLOCK_COUNT + 8 == B_PAYLOAD
        && B_LEASE + 8 == IMAGE_BODY_PREFIX_LEN
        && IMAGE_LEAF_LEN == 24
        && H_DISK_ID + 16 == H_BODY_OFFSET
        && (IMAGE_HEADER_LEN as u64) <= IMAGE_SLOTS[1]
        && IMAGE_SLOTS[1] + 4096 == IMAGE_BODY_START
);

/// A header slot: which body is the image, and whose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageHeader {
    pub generation: u64,
    pub disk_id: DiskId,
    pub body_offset: u64,
    pub body_len: u64,
    pub body_crc: u32,
}

/// The router as an image holds it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RouterImage {
    pub block_count: u64,
    pub payload_bytes: u32,
    /// (low fence, block), fences strictly increasing, the first [`Key::MIN`].
    pub leaves: Vec<(Key, u32)>,
    /// Free runs `[start, end)`, ascending, disjoint, none touching a leaf's block.
    pub free: Vec<(u64, u64)>,
    /// The first this many free blocks (in the order of `free`) may hold leaves created
    /// after the image.
    pub lease_blocks: u64,
}

/// Why an image is not used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    #[error("no router image")]
    Missing,
    #[error("router image header damaged (torn or corrupt)")]
    DamagedHeader,
    #[error("router image version {0} (this build reads {IMAGE_VERSION})")]
    UnsupportedVersion(u16),
    #[error("router image body fails its checksum")]
    BodyChecksum,
    #[error("router image is of another disk or geometry")]
    Foreign,
    #[error("router image is inconsistent: {0}")]
    Inconsistent(&'static str),
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

impl ImageHeader {
    pub fn encode(&self) -> [u8; IMAGE_HEADER_LEN] {
        let mut out = [0u8; IMAGE_HEADER_LEN];
        out[0..8].copy_from_slice(&IMAGE_MAGIC);
        out[H_VERSION..H_VERSION + 2].copy_from_slice(&IMAGE_VERSION.to_le_bytes());
        out[H_GENERATION..H_GENERATION + 8].copy_from_slice(&self.generation.to_le_bytes());
        out[H_DISK_ID..H_DISK_ID + 16].copy_from_slice(&self.disk_id.0.to_le_bytes());
        out[H_BODY_OFFSET..H_BODY_OFFSET + 8].copy_from_slice(&self.body_offset.to_le_bytes());
        out[H_BODY_LEN..H_BODY_LEN + 8].copy_from_slice(&self.body_len.to_le_bytes());
        out[H_BODY_CRC..H_BODY_CRC + 4].copy_from_slice(&self.body_crc.to_le_bytes());
        let crc = crc32c::crc32c(&out);
        out[H_CRC..H_CRC + 4].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// `Ok(None)`: a slot never written (all zero). Checks magic, version, CRC, in order.
    pub fn decode(b: &[u8]) -> Result<Option<Self>, ImageError> {
        if b.len() < IMAGE_HEADER_LEN {
            return Err(ImageError::DamagedHeader);
        }
        let b = &b[..IMAGE_HEADER_LEN];
        if b.iter().all(|&x| x == 0) {
            return Ok(None);
        }
        if b[0..8] != IMAGE_MAGIC {
            return Err(ImageError::DamagedHeader);
        }
        let version = u16::from_le_bytes([b[H_VERSION], b[H_VERSION + 1]]);
        if version != IMAGE_VERSION {
            return Err(ImageError::UnsupportedVersion(version));
        }
        let mut copy = [0u8; IMAGE_HEADER_LEN];
        copy.copy_from_slice(b);
        copy[H_CRC..H_CRC + 4].fill(0);
        if crc32c::crc32c(&copy) != u32_at(b, H_CRC) {
            return Err(ImageError::DamagedHeader);
        }
        if b[10..12] != [0, 0] || u32_at(b, H_BODY_CRC + 4) != 0 {
            return Err(ImageError::DamagedHeader);
        }
        let mut id = [0u8; 16];
        id.copy_from_slice(&b[H_DISK_ID..H_DISK_ID + 16]);
        Ok(Some(Self {
            generation: u64_at(b, H_GENERATION),
            disk_id: DiskId(u128::from_le_bytes(id)),
            body_offset: u64_at(b, H_BODY_OFFSET),
            body_len: u64_at(b, H_BODY_LEN),
            body_crc: u32_at(b, H_BODY_CRC),
        }))
    }

    /// The header open uses, of the two slots: the valid one with the higher generation, and
    /// only if neither slot is damaged (see the module docs).
    pub fn pick(slots: [&[u8]; 2]) -> Result<Self, ImageError> {
        let mut best: Option<Self> = None;
        for s in slots {
            if let Some(h) = Self::decode(s)? {
                if best.is_none_or(|b| h.generation > b.generation) {
                    best = Some(h);
                }
            }
        }
        best.ok_or(ImageError::Missing)
    }
}

/// A body's fixed fields: what [`encode_body`] writes before the leaves.
#[derive(Debug, Clone, Copy)]
pub struct BodyPrefix {
    pub block_count: u64,
    pub payload_bytes: u32,
    pub leaves: u32,
    pub free_runs: u32,
    pub lease_blocks: u64,
}

impl BodyPrefix {
    /// The body's length in bytes.
    pub fn body_len(&self) -> u64 {
        IMAGE_BODY_PREFIX_LEN as u64
            + u64::from(self.leaves) * IMAGE_LEAF_LEN as u64
            + u64::from(self.free_runs) * IMAGE_FREE_RUN_LEN as u64
    }
}

/// Encodes a body piece by piece, so a large tree's image (24 bytes a leaf: megabytes) is
/// never built whole in memory beside the router it copies: the bytes gather in `buf`, and
/// `flush` takes them (and must empty `buf`) whenever `chunk` bytes or more have gathered,
/// and once at the end. Returns the bytes encoded; a caller whose `leaves` or `free` yield
/// other counts than `prefix` says gets a length other than [`BodyPrefix::body_len`] and
/// must not use the body.
pub fn encode_body<E>(
    prefix: &BodyPrefix,
    leaves: impl Iterator<Item = (Key, u32)>,
    free: impl Iterator<Item = (u64, u64)>,
    chunk: usize,
    buf: &mut Vec<u8>,
    flush: &mut dyn FnMut(&mut Vec<u8>) -> Result<(), E>,
) -> Result<u64, E> {
    let mut total = 0u64;
    let mut put = |buf: &mut Vec<u8>, bytes: &[u8]| -> Result<(), E> {
        buf.extend_from_slice(bytes);
        total += bytes.len() as u64;
        if buf.len() >= chunk {
            flush(buf)?;
        }
        Ok(())
    };
    let mut head = [0u8; IMAGE_BODY_PREFIX_LEN];
    head[B_BLOCK_COUNT..B_BLOCK_COUNT + 8].copy_from_slice(&prefix.block_count.to_le_bytes());
    head[B_PAYLOAD..B_PAYLOAD + 4].copy_from_slice(&prefix.payload_bytes.to_le_bytes());
    head[B_LEAVES..B_LEAVES + 4].copy_from_slice(&prefix.leaves.to_le_bytes());
    head[B_FREE..B_FREE + 4].copy_from_slice(&prefix.free_runs.to_le_bytes());
    head[B_LEASE..B_LEASE + 8].copy_from_slice(&prefix.lease_blocks.to_le_bytes());
    put(buf, &head)?;
    let mut leaf = [0u8; IMAGE_LEAF_LEN];
    for (fence, block) in leaves {
        fence.encode(&mut leaf[..Key::ENCODED_LEN]);
        leaf[Key::ENCODED_LEN..].copy_from_slice(&block.to_le_bytes());
        put(buf, &leaf)?;
    }
    let mut run = [0u8; IMAGE_FREE_RUN_LEN];
    for (start, end) in free {
        run[..8].copy_from_slice(&start.to_le_bytes());
        run[8..].copy_from_slice(&end.to_le_bytes());
        put(buf, &run)?;
    }
    if !buf.is_empty() {
        flush(buf)?;
    }
    Ok(total)
}

impl RouterImage {
    /// The body's fixed fields. Counts past `u32::MAX` saturate (the body then fails its
    /// length check at decode; no disk holds that many leaves).
    pub fn prefix(&self) -> BodyPrefix {
        BodyPrefix {
            block_count: self.block_count,
            payload_bytes: self.payload_bytes,
            leaves: u32::try_from(self.leaves.len()).unwrap_or(u32::MAX),
            free_runs: u32::try_from(self.free.len()).unwrap_or(u32::MAX),
            lease_blocks: self.lease_blocks,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let prefix = self.prefix();
        let mut out = Vec::with_capacity(usize::try_from(prefix.body_len()).unwrap_or(0));
        let whole: Result<u64, std::convert::Infallible> = encode_body(
            &prefix,
            self.leaves.iter().copied(),
            self.free.iter().copied(),
            usize::MAX,
            &mut out,
            &mut |_| Ok(()),
        );
        debug_assert!(whole.is_ok());
        out
    }

    /// Decodes a body whose CRC was checked, and checks what routing relies on: fences
    /// strictly increasing from [`Key::MIN`], blocks inside the disk and distinct, free runs
    /// ascending and disjoint and holding no leaf, a lease no longer than the free list.
    pub fn decode(b: &[u8]) -> Result<Self, ImageError> {
        let bad = ImageError::Inconsistent;
        if b.len() < IMAGE_BODY_PREFIX_LEN {
            return Err(bad("short body"));
        }
        let leaves_n = u32_at(b, B_LEAVES) as usize;
        let free_n = u32_at(b, B_FREE) as usize;
        let want = leaves_n
            .checked_mul(IMAGE_LEAF_LEN)
            .and_then(|l| l.checked_add(free_n.checked_mul(IMAGE_FREE_RUN_LEN)?))
            .and_then(|l| l.checked_add(IMAGE_BODY_PREFIX_LEN));
        if want != Some(b.len()) {
            return Err(bad("body length does not match its counts"));
        }
        if u32_at(b, B_LEAVES + 8) != 0 {
            return Err(bad("reserved bytes set"));
        }
        let img = Self {
            block_count: u64_at(b, B_BLOCK_COUNT),
            payload_bytes: u32_at(b, B_PAYLOAD),
            lease_blocks: u64_at(b, B_LEASE),
            leaves: b[IMAGE_BODY_PREFIX_LEN..IMAGE_BODY_PREFIX_LEN + leaves_n * IMAGE_LEAF_LEN]
                .chunks_exact(IMAGE_LEAF_LEN)
                .map(|c| {
                    (
                        Key::decode(&c[..Key::ENCODED_LEN]),
                        u32_at(c, Key::ENCODED_LEN),
                    )
                })
                .collect(),
            free: b[IMAGE_BODY_PREFIX_LEN + leaves_n * IMAGE_LEAF_LEN..]
                .chunks_exact(IMAGE_FREE_RUN_LEN)
                .map(|c| (u64_at(c, 0), u64_at(c, 8)))
                .collect(),
        };
        img.check()?;
        Ok(img)
    }

    fn check(&self) -> Result<(), ImageError> {
        let bad = ImageError::Inconsistent;
        if self.leaves.first().is_none_or(|(f, _)| *f != Key::MIN) {
            return Err(bad("no leaf has the lowest fence"));
        }
        if self.leaves.windows(2).any(|w| w[0].0 >= w[1].0) {
            return Err(bad("fences out of order"));
        }
        let mut blocks: Vec<u64> = self.leaves.iter().map(|(_, b)| u64::from(*b)).collect();
        blocks.sort_unstable();
        if blocks.windows(2).any(|w| w[0] == w[1]) {
            return Err(bad("two leaves in one block"));
        }
        if blocks.last().is_some_and(|&b| b >= self.block_count) {
            return Err(bad("a leaf outside the disk"));
        }
        let mut free_blocks = 0u64;
        let mut prev_end = 0;
        for &(start, end) in &self.free {
            if start >= end || start < prev_end || end > self.block_count {
                return Err(bad("free runs out of order or outside the disk"));
            }
            // The first leaf block at or above the run's start must lie past its end.
            let i = blocks.partition_point(|&b| b < start);
            if blocks.get(i).is_some_and(|&b| b < end) {
                return Err(bad("a leaf inside a free run"));
            }
            free_blocks += end - start;
            prev_end = end;
        }
        if self.lease_blocks > free_blocks {
            return Err(bad("a lease longer than the free list"));
        }
        Ok(())
    }

    /// The lease as runs `[start, end)` in allocation order.
    pub fn lease_runs(&self) -> Vec<(u64, u64)> {
        self.free_runs(0, self.lease_blocks)
    }

    /// The `n` free blocks after the lease, as runs in allocation order: where the allocator
    /// would have gone had it outrun the lease (an older copy of the image file put back).
    pub fn past_lease_runs(&self, n: u64) -> Vec<(u64, u64)> {
        self.free_runs(self.lease_blocks, n)
    }

    /// Free blocks `skip..skip + n` in allocation order, as runs.
    fn free_runs(&self, mut skip: u64, mut left: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        for &(start, end) in &self.free {
            if left == 0 {
                break;
            }
            let len = end - start;
            if skip >= len {
                skip -= len;
                continue;
            }
            let s = start + skip;
            skip = 0;
            let n = (end - s).min(left);
            out.push((s, s + n));
            left -= n;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body written in pieces (as a router image is) is the body encoded whole, whatever
    /// the piece size; every piece but the last is at least the piece size.
    #[test]
    fn a_body_in_pieces_is_the_body_whole() {
        let mut img = image();
        img.leaves = (0..500u32)
            .map(|i| (Key::new(i, u64::from(i) * 7, 0), i + 3))
            .collect();
        img.leaves[0].0 = Key::MIN;
        img.block_count = 10_000;
        img.free = (0..40u64).map(|i| (600 + i * 10, 605 + i * 10)).collect();
        let whole = img.encode();
        assert_eq!(whole.len() as u64, img.prefix().body_len());
        assert_eq!(RouterImage::decode(&whole), Ok(img.clone()));
        for chunk in [1, 24, 100, 4096, usize::MAX] {
            let (mut out, mut pieces) = (Vec::new(), Vec::new());
            let mut buf = Vec::new();
            let n = encode_body(
                &img.prefix(),
                img.leaves.iter().copied(),
                img.free.iter().copied(),
                chunk,
                &mut buf,
                &mut |b: &mut Vec<u8>| -> Result<(), ()> {
                    out.extend_from_slice(b);
                    pieces.push(b.len());
                    b.clear();
                    Ok(())
                },
            );
            assert_eq!(n, Ok(whole.len() as u64), "chunk {chunk}");
            assert_eq!(out, whole, "chunk {chunk}");
            let last = pieces.pop();
            assert!(
                last.is_some() && pieces.iter().all(|&p| p >= chunk),
                "chunk {chunk}"
            );
        }
        // A caller whose leaves disagree with its prefix sees the length differ.
        let mut buf = Vec::new();
        let short = encode_body(
            &img.prefix(),
            img.leaves.iter().copied().skip(1),
            img.free.iter().copied(),
            usize::MAX,
            &mut buf,
            &mut |_| Ok::<(), ()>(()),
        );
        assert_eq!(short, Ok(whole.len() as u64 - IMAGE_LEAF_LEN as u64));
    }

    fn image() -> RouterImage {
        RouterImage {
            block_count: 100,
            payload_bytes: 488,
            leaves: vec![
                (Key::MIN, 0),
                (Key::new(1, 5, 0), 3),
                (Key::new(2, 0, 9), 1),
            ],
            free: vec![(2, 3), (4, 100)],
            lease_blocks: 10,
        }
    }

    #[test]
    fn body_roundtrip_and_checks() {
        let img = image();
        assert_eq!(RouterImage::decode(&img.encode()), Ok(img.clone()));
        assert_eq!(img.lease_runs(), vec![(2, 3), (4, 13)]);
        assert_eq!(img.past_lease_runs(5), vec![(13, 18)]);
        assert_eq!(img.past_lease_runs(200), vec![(13, 100)]);
        let broken = [
            RouterImage {
                leaves: vec![(Key::new(0, 1, 0), 0)],
                ..img.clone()
            },
            RouterImage {
                free: vec![(2, 4), (4, 100)],
                ..img.clone()
            },
            RouterImage {
                lease_blocks: 98,
                ..img.clone()
            },
            RouterImage {
                leaves: vec![(Key::MIN, 0), (Key::new(1, 5, 0), 0)],
                ..img.clone()
            },
        ];
        for b in broken {
            assert!(matches!(
                RouterImage::decode(&b.encode()),
                Err(ImageError::Inconsistent(_))
            ));
        }
        let mut short = img.encode();
        short.pop();
        assert!(RouterImage::decode(&short).is_err());
    }

    #[test]
    fn header_pick_refuses_a_damaged_slot() {
        let h = |generation| ImageHeader {
            generation,
            disk_id: DiskId(7),
            body_offset: IMAGE_BODY_START,
            body_len: 10,
            body_crc: 3,
        };
        let (a, b) = (h(4).encode(), h(5).encode());
        assert_eq!(ImageHeader::pick([&a, &b]), Ok(h(5)));
        assert_eq!(ImageHeader::pick([&[0u8; 64], &a]), Ok(h(4)));
        assert_eq!(
            ImageHeader::pick([&[0u8; 64], &[0u8; 64]]),
            Err(ImageError::Missing)
        );
        let mut torn = b;
        torn[20] ^= 1;
        assert_eq!(
            ImageHeader::pick([&a, &torn]),
            Err(ImageError::DamagedHeader)
        );
    }
}
