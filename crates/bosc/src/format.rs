//! Byte layouts of the BOSC data disk and of BOSC's log payloads. Pure: no I/O. Little-endian.
//!
//! Data disk:
//!
//! ```text
//! 0        4096      8192                                     data_start
//! | ckpt A | ckpt B  | double-write area (dw_runs × max_run blocks) | block 0 | block 1 | ...
//! ```
//!
//! Every block starts with a [`BLOCK_HEADER_LEN`]-byte header:
//!
//! | offset | size | field                                                          |
//! |--------|------|----------------------------------------------------------------|
//! | 0      | 4    | CRC32C, salted with the disk id and version, with this zeroed  |
//! | 4      | 4    | magic `b"BOSC"`                                                |
//! | 8      | 8    | LSN: sequence number of the last modification applied         |
//! | 16     | 8    | block number (catches misdirected writes; names DW copies)     |
//!
//! A block that is entirely zero has never been written: LSN 0, payload zeros.
//!
//! Checkpoint slot (ping-pong, the one with the higher counter and a valid CRC wins):
//! magic `b"BOSCCKPT"`, version u16, dw_runs u16, block_bytes u32, block_count u64, max_run u32,
//! crc32c u32 (at 28, over all 64 bytes with itself zeroed), counter u64, checkpoint u64 (every
//! sequence number / caller position at or below it is committed), disk id u128 (random, chosen
//! at format; salts every block CRC). The checkpoint's version ([`FORMAT_VERSION`]) declares
//! the layout of everything on the disk; blocks carry none of their own, but their CRC is
//! salted with it. docs/FORMATS.md has the byte tables.
//!
//! Own-log payload (inside a mariner-log `Write` record whose `offset` is the block number, so
//! the log supplies sequence number, back pointer, timestamp and CRC32C):
//! version u16, tag u8 (1 = application modification, 2 = whole-payload write), global
//! frontier u64 (exclusive: every sequence number below it is committed), local frontier u64
//! (inclusive: every modification of this block at or below it is committed), then the
//! modification bytes.

#![deny(clippy::cast_possible_truncation)]

pub mod homes;

pub const BLOCK_HEADER_LEN: usize = 24;
pub const BLOCK_MAGIC: [u8; 4] = *b"BOSC";
pub const CKPT_MAGIC: [u8; 8] = *b"BOSCCKPT";
/// The BOSC format version: the checkpoint's, the own-log payload's, and (through the CRC
/// salt) every block's. Version 1 (unsalted blocks, 48-byte checkpoint, 17-byte record prefix)
/// is retired and refused; so is version 2 (a double-write area of one run).
pub const FORMAT_VERSION: u16 = 3;
pub const CKPT_VERSION: u16 = FORMAT_VERSION;
/// The checkpoint version of a disk without a double-write area (`dw_runs` 0): its data
/// blocks start where the area would, and a build that knew only areas of at least one run
/// would write its double writes over them — so it must refuse the disk, not misread it.
/// Everything else is as in [`CKPT_VERSION`] (the block CRC salt included).
pub const CKPT_VERSION_NO_DW: u16 = 4;
/// The checkpoint version of a disk of shadow extents (`dw_runs` 0, [`Geometry::shadow`]):
/// two home map slots follow the checkpoint slots, then every extent's two homes.
pub const CKPT_VERSION_SHADOW: u16 = 5;
pub const CKPT_SLOTS: [u64; 2] = [0, 4096];
pub const CKPT_LEN: usize = 64;
pub const DW_OFFSET: u64 = 8192;
/// Where a disk of shadow extents keeps its two home map slots (where others have the
/// double-write area).
pub const MAP_OFFSET: u64 = 8192;
pub const RECORD_VERSION: u16 = FORMAT_VERSION;
pub const RECORD_PREFIX_LEN: usize = 19;
/// The `op` byte of a [`LoggedBatch`]: several modifications in one log record.
pub const BATCH_CODE: u8 = 3;
/// A [`LoggedBatch`]'s bytes before its first entry: version, code, global frontier, count.
pub const BATCH_PREFIX_LEN: usize = 15;
/// A [`LoggedBatch`] entry's bytes before its modification: block, op, local frontier, length.
pub const BATCH_ENTRY_HEADER_LEN: usize = 21;

const _: () = assert!(CKPT_LEN <= 4096);

/// Where things live on the data disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub block_bytes: u32,
    pub block_count: u64,
    pub max_run: u32,
    /// The double-write area holds this many runs of `max_run` blocks: a commit writes up to
    /// that many runs with one pair of syncs.
    pub dw_runs: u16,
    /// Shadow extents instead (`dw_runs` 0; [`homes`]): each extent of `max_run` blocks has two
    /// homes, and a commit writes it whole to the one it is not in.
    pub shadow: bool,
}

/// Runs a commit writes in place with one sync when there is no double-write area (as many
/// as the default area holds). Without one a torn block is found at open, whatever the batch
/// (the engine's `find_torn`: every block of an unsynced batch still has modifications
/// queued), so the batch only sets how often the device's cache is flushed. One run per sync
/// flushed ~60 times a second under history's 1 MiB index budget while a depth-1 writer ran,
/// and each flush that met one of the log's writes made it wait (bench/history-trace.sh: 11–13
/// requests over 1 ms a second where history off had 0–3); eight runs, ~9 flushes and 5–15.
pub const NO_DW_BATCH_RUNS: u64 = 8;

impl Geometry {
    /// Slots (blocks) of the double-write area.
    pub fn dw_slots(&self) -> u64 {
        u64::from(self.max_run) * u64::from(self.dw_runs)
    }
    /// Blocks a commit writes in place with one sync: the double-write area's, or
    /// [`NO_DW_BATCH_RUNS`] runs without one.
    pub fn batch_blocks(&self) -> u64 {
        let runs = if self.dw_runs == 0 {
            NO_DW_BATCH_RUNS
        } else {
            u64::from(self.dw_runs)
        };
        u64::from(self.max_run) * runs
    }
    pub fn data_start(&self) -> u64 {
        if self.shadow {
            return MAP_OFFSET + 2 * self.map_slot_bytes();
        }
        DW_OFFSET + self.dw_slots() * u64::from(self.block_bytes)
    }
    /// Where `block` is on a disk without shadow extents; on one with, where it is in home 0.
    pub fn block_offset(&self, block: u64) -> u64 {
        self.data_start() + block * u64::from(self.block_bytes)
    }
    /// Where `block` is in `home` (0 or 1) on a disk of shadow extents.
    pub fn home_offset(&self, home: u8, block: u64) -> u64 {
        self.block_offset(u64::from(home & 1) * self.block_count + block)
    }
    /// Extents of a disk of shadow extents: `max_run` blocks each, the last maybe fewer.
    pub fn extents(&self) -> u64 {
        self.block_count.div_ceil(u64::from(self.max_run.max(1)))
    }
    /// The extent a block is in.
    pub fn extent_of(&self, block: u64) -> u64 {
        block / u64::from(self.max_run.max(1))
    }
    /// Bytes of the home map's bits.
    pub fn home_map_bits_bytes(&self) -> usize {
        usize::try_from(self.extents().div_ceil(8)).unwrap_or(usize::MAX)
    }
    /// Bytes of a home map slot (0 without shadow extents).
    pub fn map_slot_bytes(&self) -> u64 {
        if !self.shadow {
            return 0;
        }
        (homes::HOME_MAP_HEADER_LEN as u64 + self.home_map_bits_bytes() as u64)
            .next_multiple_of(4096)
    }
    /// The home map slot written with checkpoint counter `counter`.
    pub fn map_slot(&self, counter: u64) -> u64 {
        MAP_OFFSET + (counter % 2) * self.map_slot_bytes()
    }
    pub fn dw_offset(&self, slot: u64) -> u64 {
        DW_OFFSET + slot * u64::from(self.block_bytes)
    }
    pub fn disk_bytes(&self) -> u64 {
        let homes = if self.shadow { 2 } else { 1 };
        self.block_offset(homes * self.block_count)
    }
    pub fn payload_bytes(&self) -> usize {
        self.block_bytes as usize - BLOCK_HEADER_LEN
    }
}

/// A block header's meaningful fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockHeader {
    pub lsn: u64,
    pub block: u64,
}

/// Why a block image is unusable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BlockError {
    #[error("block checksum mismatch (torn, corrupt, or from another disk)")]
    Checksum,
    #[error("block header names block {found}, expected {expected}")]
    Misdirected { found: u64, expected: u64 },
}

/// A data disk's identity: chosen at random by format, kept in the checkpoint, and mixed into
/// every block CRC, so a block copied from another BOSC disk (or written under another format
/// version) fails [`check_block`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DiskId(pub u128);

impl DiskId {
    /// A fresh random identity from the operating system.
    pub fn random() -> Result<Self, std::io::Error> {
        let mut b = [0u8; 16];
        getrandom::fill(&mut b).map_err(std::io::Error::other)?;
        Ok(Self(u128::from_le_bytes(b)))
    }

    /// The CRC32C state every block CRC of this disk starts from:
    /// `CRC32C(disk id LE 16 bytes ‖ FORMAT_VERSION LE 2 bytes)`.
    pub fn block_salt(self) -> u32 {
        let mut salt = [0u8; 18];
        salt[..16].copy_from_slice(&self.0.to_le_bytes());
        salt[16..].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        crc32c::crc32c(&salt)
    }
}

fn block_crc(image: &[u8], disk: DiskId) -> u32 {
    let zeroed = crc32c::crc32c_append(disk.block_salt(), &[0u8; 4]);
    crc32c::crc32c_append(zeroed, &image[4..])
}

/// Stamps header and CRC (salted with `disk`) onto a full block image.
pub fn seal_block(image: &mut [u8], disk: DiskId, lsn: u64, block: u64) {
    image[4..8].copy_from_slice(&BLOCK_MAGIC);
    image[8..16].copy_from_slice(&lsn.to_le_bytes());
    image[16..24].copy_from_slice(&block.to_le_bytes());
    let crc = block_crc(image, disk);
    image[0..4].copy_from_slice(&crc.to_le_bytes());
}

/// Checks a full block image of disk `disk`; a never-written (all-zero) block is valid with
/// LSN 0.
pub fn check_block(
    image: &[u8],
    disk: DiskId,
    expected: Option<u64>,
) -> Result<BlockHeader, BlockError> {
    if is_zero(image) {
        return Ok(BlockHeader {
            lsn: 0,
            block: expected.unwrap_or(u64::MAX),
        });
    }
    if image.len() < BLOCK_HEADER_LEN {
        return Err(BlockError::Checksum);
    }
    let stored = u32::from_le_bytes([image[0], image[1], image[2], image[3]]);
    if stored != block_crc(image, disk) || image[4..8] != BLOCK_MAGIC {
        return Err(BlockError::Checksum);
    }
    let header = BlockHeader {
        lsn: u64_at(image, 8),
        block: u64_at(image, 16),
    };
    match expected {
        Some(e) if e != header.block => Err(BlockError::Misdirected {
            found: header.block,
            expected: e,
        }),
        _ => Ok(header),
    }
}

/// Whether every byte is zero: a sealed block fails at its first word (CRC and magic), a
/// never-written one is compared a word at a time (opens scan whole disks of them).
fn is_zero(b: &[u8]) -> bool {
    let mut words = b.chunks_exact(8);
    words
        .by_ref()
        .all(|w| u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]) == 0)
        && words.remainder().iter().all(|&x| x == 0)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// The durable checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checkpoint {
    pub geometry: Geometry,
    pub counter: u64,
    pub checkpoint: u64,
    pub disk_id: DiskId,
}

/// Why a checkpoint slot is unusable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointError {
    #[error("no BOSC checkpoint magic")]
    Magic,
    #[error("BOSC format version {0} is not supported (this build reads {FORMAT_VERSION})")]
    UnsupportedVersion(u16),
    #[error("checkpoint checksum mismatch (torn or corrupt)")]
    Checksum,
}

impl Checkpoint {
    pub fn encode(&self) -> [u8; CKPT_LEN] {
        let mut out = [0u8; CKPT_LEN];
        out[0..8].copy_from_slice(&CKPT_MAGIC);
        let version = if self.geometry.shadow {
            CKPT_VERSION_SHADOW
        } else if self.geometry.dw_runs == 0 {
            CKPT_VERSION_NO_DW
        } else {
            CKPT_VERSION
        };
        out[8..10].copy_from_slice(&version.to_le_bytes());
        out[10..12].copy_from_slice(&self.geometry.dw_runs.to_le_bytes());
        out[12..16].copy_from_slice(&self.geometry.block_bytes.to_le_bytes());
        out[16..24].copy_from_slice(&self.geometry.block_count.to_le_bytes());
        out[24..28].copy_from_slice(&self.geometry.max_run.to_le_bytes());
        out[32..40].copy_from_slice(&self.counter.to_le_bytes());
        out[40..48].copy_from_slice(&self.checkpoint.to_le_bytes());
        out[48..64].copy_from_slice(&self.disk_id.0.to_le_bytes());
        // The CRC covers everything but itself; it sits in the 4 pad bytes at 28.
        let crc = crc32c::crc32c(&out);
        out[28..32].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// Checks, in order: length and magic, version (another one is refused, not misread),
    /// CRC.
    pub fn decode(b: &[u8]) -> Result<Self, CheckpointError> {
        if b.len() < 10 || b[0..8] != CKPT_MAGIC {
            return Err(CheckpointError::Magic);
        }
        let version = u16::from_le_bytes([b[8], b[9]]);
        if ![CKPT_VERSION, CKPT_VERSION_NO_DW, CKPT_VERSION_SHADOW].contains(&version) {
            return Err(CheckpointError::UnsupportedVersion(version));
        }
        if b.len() < CKPT_LEN {
            return Err(CheckpointError::Checksum);
        }
        let mut copy = [0u8; CKPT_LEN];
        copy.copy_from_slice(&b[..CKPT_LEN]);
        copy[28..32].fill(0);
        let stored = u32::from_le_bytes([b[28], b[29], b[30], b[31]]);
        if crc32c::crc32c(&copy) != stored {
            return Err(CheckpointError::Checksum);
        }
        let dw_runs = u16::from_le_bytes([b[10], b[11]]);
        if (dw_runs == 0) != (version != CKPT_VERSION) {
            // Each version says whether the disk has a double-write area; a checkpoint that
            // disagrees with its own version was not written by this format.
            return Err(CheckpointError::UnsupportedVersion(version));
        }
        let mut id = [0u8; 16];
        id.copy_from_slice(&b[48..64]);
        Ok(Self {
            geometry: Geometry {
                block_bytes: u32::from_le_bytes([b[12], b[13], b[14], b[15]]),
                block_count: u64_at(b, 16),
                max_run: u32::from_le_bytes([b[24], b[25], b[26], b[27]]),
                dw_runs: u16::from_le_bytes([b[10], b[11]]),
                shadow: version == CKPT_VERSION_SHADOW,
            },
            counter: u64_at(b, 32),
            checkpoint: u64_at(b, 40),
            disk_id: DiskId(u128::from_le_bytes(id)),
        })
    }

    /// The two slot images format writes: counter 0 in slot A and counter 1 in slot B, both
    /// checkpoint 0, so the first later checkpoint (counter 2, slot A) leaves slot B valid.
    /// Returns (offset, image) pairs.
    pub fn format_slots(geometry: Geometry, disk_id: DiskId) -> [(u64, [u8; CKPT_LEN]); 2] {
        [0, 1].map(|counter| {
            let c = Self {
                geometry,
                counter,
                checkpoint: 0,
                disk_id,
            };
            (c.slot(), c.encode())
        })
    }

    /// The slot this checkpoint is written to: `CKPT_SLOTS[counter % 2]`.
    pub fn slot(&self) -> u64 {
        CKPT_SLOTS[usize::from(self.counter % 2 == 1)]
    }

    /// Picks the valid slot with the higher counter. A slot of another format version makes
    /// the whole disk unsupported (a newer writer has been here); neither valid: `None`.
    pub fn pick(slots: [&[u8]; 2]) -> Result<Option<Self>, CheckpointError> {
        let mut best: Option<Self> = None;
        for b in slots {
            match Self::decode(b) {
                Ok(c) if best.is_none_or(|b| c.counter > b.counter) => best = Some(c),
                Ok(_) | Err(CheckpointError::Magic | CheckpointError::Checksum) => {}
                Err(e @ CheckpointError::UnsupportedVersion(_)) => return Err(e),
            }
        }
        Ok(best)
    }
}

/// What a logged BOSC modification says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedMod {
    pub op: Op,
    pub global_frontier: u64,
    pub local_frontier: u64,
    pub bytes: Vec<u8>,
}

/// The kind of a modification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Passed to the application's update function.
    App,
    /// Replaces the whole payload (plain write).
    Write,
}

impl Op {
    pub fn code(self) -> u8 {
        match self {
            Op::App => 1,
            Op::Write => 2,
        }
    }
    pub fn from_code(c: u8) -> Option<Self> {
        match c {
            1 => Some(Op::App),
            2 => Some(Op::Write),
            _ => None,
        }
    }
}

impl LoggedMod {
    pub fn encode(op: Op, global_frontier: u64, local_frontier: u64, bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(RECORD_PREFIX_LEN + bytes.len());
        out.extend_from_slice(&RECORD_VERSION.to_le_bytes());
        out.push(op.code());
        out.extend_from_slice(&global_frontier.to_le_bytes());
        out.extend_from_slice(&local_frontier.to_le_bytes());
        out.extend_from_slice(bytes);
        out
    }

    /// `None` for a short payload, another version or an unknown op: garbage is refused, not
    /// misparsed.
    pub fn decode(b: &[u8]) -> Option<Self> {
        let (op, global_frontier, local_frontier, bytes) = Self::decode_parts(b)?;
        Some(Self {
            op,
            global_frontier,
            local_frontier,
            bytes: bytes.to_vec(),
        })
    }

    /// [`Self::decode`] without copying the modification: `(op, global frontier, local
    /// frontier, bytes)` (recovery replays a million records and more).
    pub fn decode_parts(b: &[u8]) -> Option<(Op, u64, u64, &[u8])> {
        if b.len() < RECORD_PREFIX_LEN || u16::from_le_bytes([b[0], b[1]]) != RECORD_VERSION {
            return None;
        }
        Some((
            Op::from_code(b[2])?,
            u64_at(b, 3),
            u64_at(b, 11),
            &b[RECORD_PREFIX_LEN..],
        ))
    }
}

/// Several modifications in one own-log record (docs/FORMATS.md "Own-log records"): what a
/// burst logs, so that a modification of a few dozen bytes does not take a log record header
/// of its own (80 bytes) and a prefix (19). Every entry takes the record's sequence number; a
/// block's entries in one record are in the order they were made.
///
/// ```text
/// version u16 | 3 u8 | global_frontier u64 | count u32 | count × (block u64 | op u8 | local_frontier u64 | len u32 | bytes)
/// ```
#[derive(Debug, Clone)]
pub struct LoggedBatch {
    buf: Vec<u8>,
    count: u32,
}

/// One entry of a decoded [`LoggedBatch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchEntry<'a> {
    pub block: u64,
    pub op: Op,
    pub local_frontier: u64,
    pub bytes: &'a [u8],
}

impl LoggedBatch {
    pub fn new(global_frontier: u64) -> Self {
        let mut buf = Vec::with_capacity(4096);
        buf.extend_from_slice(&RECORD_VERSION.to_le_bytes());
        buf.push(BATCH_CODE);
        buf.extend_from_slice(&global_frontier.to_le_bytes());
        buf.extend_from_slice(&0u32.to_le_bytes());
        Self { buf, count: 0 }
    }

    /// The bytes an entry of `len` bytes of modification takes.
    pub fn entry_bytes(len: usize) -> usize {
        BATCH_ENTRY_HEADER_LEN + len
    }

    /// Appends an entry; `false` (and nothing appended) for a modification of 4 GiB or more,
    /// which the engine refuses before it logs anything.
    #[must_use]
    pub fn push(&mut self, block: u64, op: Op, local_frontier: u64, bytes: &[u8]) -> bool {
        let Ok(len) = u32::try_from(bytes.len()) else {
            return false;
        };
        self.buf.extend_from_slice(&block.to_le_bytes());
        self.buf.push(op.code());
        self.buf.extend_from_slice(&local_frontier.to_le_bytes());
        self.buf.extend_from_slice(&len.to_le_bytes());
        self.buf.extend_from_slice(bytes);
        self.count += 1;
        true
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The payload's length so far.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// The record's payload.
    pub fn finish(mut self) -> Vec<u8> {
        self.buf[11..15].copy_from_slice(&self.count.to_le_bytes());
        self.buf
    }

    /// `(global frontier, entries)`, or `None` for a payload that is not exactly a batch of
    /// this version: short, another version or code, no entries, an unknown op, an entry
    /// running past the end, bytes left over, or a count that does not match.
    pub fn decode(b: &[u8]) -> Option<(u64, Vec<BatchEntry<'_>>)> {
        if b.len() < BATCH_PREFIX_LEN
            || u16::from_le_bytes([b[0], b[1]]) != RECORD_VERSION
            || b[2] != BATCH_CODE
        {
            return None;
        }
        let global_frontier = u64_at(b, 3);
        let count = u32::from_le_bytes(b[11..15].try_into().ok()?) as usize;
        if count == 0 {
            return None;
        }
        // Each entry takes its header at least: a count no payload could hold allocates nothing.
        let mut entries = Vec::with_capacity(count.min(b.len() / BATCH_ENTRY_HEADER_LEN));
        let mut at = BATCH_PREFIX_LEN;
        while at < b.len() {
            let head = b.get(at..at.checked_add(BATCH_ENTRY_HEADER_LEN)?)?;
            let len = u32::from_le_bytes(head[17..21].try_into().ok()?) as usize;
            let start = at + BATCH_ENTRY_HEADER_LEN;
            let end = start.checked_add(len)?;
            entries.push(BatchEntry {
                block: u64_at(head, 0),
                op: Op::from_code(head[8])?,
                local_frontier: u64_at(head, 9),
                bytes: b.get(start..end)?,
            });
            at = end;
        }
        (entries.len() == count).then_some((global_frontier, entries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_roundtrip_and_refusals() {
        let mut b = LoggedBatch::new(9);
        assert!(b.is_empty());
        assert!(b.push(4, Op::App, 7, b"xyz"));
        assert!(b.push(4, Op::Write, 0, b""));
        assert!(b.push(u64::MAX, Op::App, 1, &[5; 40]));
        let bytes = b.finish();
        assert_eq!(
            bytes.len(),
            BATCH_PREFIX_LEN + 3 * BATCH_ENTRY_HEADER_LEN + 43
        );
        let (gf, e) = LoggedBatch::decode(&bytes).unwrap();
        assert_eq!(gf, 9);
        assert_eq!(e.len(), 3);
        assert_eq!(
            (e[0].block, e[0].op, e[0].local_frontier, e[0].bytes),
            (4, Op::App, 7, &b"xyz"[..])
        );
        assert_eq!((e[1].op, e[1].bytes.len()), (Op::Write, 0));
        assert_eq!((e[2].block, e[2].bytes), (u64::MAX, &[5u8; 40][..]));
        // Every prefix of it is refused, and so are extra bytes, a wrong count and a bad op.
        for n in 0..bytes.len() {
            assert!(LoggedBatch::decode(&bytes[..n]).is_none(), "prefix of {n}");
        }
        let mut more = bytes.clone();
        more.push(0);
        assert!(LoggedBatch::decode(&more).is_none());
        let mut count = bytes.clone();
        count[11] = 4;
        assert!(LoggedBatch::decode(&count).is_none());
        let mut op = bytes.clone();
        op[BATCH_PREFIX_LEN + 8] = 9;
        assert!(LoggedBatch::decode(&op).is_none());
        assert!(LoggedBatch::decode(&LoggedBatch::new(1).finish()).is_none());
        // A single modification's record is not a batch, nor the other way round.
        assert!(LoggedBatch::decode(&LoggedMod::encode(Op::App, 1, 2, b"abc")).is_none());
        assert!(LoggedMod::decode(&bytes).is_none());
    }

    #[test]
    fn block_roundtrip_and_tear() {
        let d = DiskId(0x1234);
        let mut img = vec![7u8; 512];
        seal_block(&mut img, d, 42, 3);
        assert_eq!(
            check_block(&img, d, Some(3)),
            Ok(BlockHeader { lsn: 42, block: 3 })
        );
        assert!(matches!(
            check_block(&img, d, Some(4)),
            Err(BlockError::Misdirected { .. })
        ));
        img[300] ^= 1;
        assert_eq!(check_block(&img, d, Some(3)), Err(BlockError::Checksum));
        assert_eq!(check_block(&[0u8; 512], d, Some(9)).map(|h| h.lsn), Ok(0));
    }

    #[test]
    fn block_of_another_disk_fails_the_check() {
        let (a, b) = (DiskId(1), DiskId(2));
        let mut img = vec![7u8; 512];
        seal_block(&mut img, a, 42, 3);
        assert!(check_block(&img, a, Some(3)).is_ok());
        assert_eq!(check_block(&img, b, Some(3)), Err(BlockError::Checksum));
        let (x, y) = (DiskId::random().unwrap(), DiskId::random().unwrap());
        assert_ne!(x, y);
    }

    #[test]
    fn checkpoint_roundtrip() {
        let c = Checkpoint {
            geometry: Geometry {
                block_bytes: 4096,
                block_count: 10,
                max_run: 32,
                dw_runs: 4,
                shadow: false,
            },
            counter: 5,
            checkpoint: 99,
            disk_id: DiskId(u128::MAX - 5),
        };
        let mut b = c.encode();
        assert_eq!(Checkpoint::decode(&b), Ok(c));
        b[41] ^= 1;
        assert_eq!(Checkpoint::decode(&b), Err(CheckpointError::Checksum));
        b[8] = 1;
        assert_eq!(
            Checkpoint::decode(&b),
            Err(CheckpointError::UnsupportedVersion(1))
        );
        assert_eq!(
            Checkpoint::pick([&b, &c.encode()]),
            Err(CheckpointError::UnsupportedVersion(1))
        );
    }

    /// A disk without a double-write area says so in its checkpoint's version (4), which
    /// builds that knew only areas refuse; each version with the other's `dw_runs` is refused.
    #[test]
    fn a_disk_without_a_double_write_area_has_its_own_checkpoint_version() {
        let c = Checkpoint {
            geometry: Geometry {
                block_bytes: 4096,
                block_count: 64,
                max_run: 32,
                dw_runs: 0,
                shadow: false,
            },
            counter: 3,
            checkpoint: 7,
            disk_id: DiskId(11),
        };
        let b = c.encode();
        assert_eq!(u16::from_le_bytes([b[8], b[9]]), CKPT_VERSION_NO_DW);
        assert_eq!(Checkpoint::decode(&b), Ok(c));
        let reseal = |mut b: [u8; CKPT_LEN], version: u16, dw_runs: u16| {
            b[8..10].copy_from_slice(&version.to_le_bytes());
            b[10..12].copy_from_slice(&dw_runs.to_le_bytes());
            b[28..32].fill(0);
            let crc = crc32c::crc32c(&b);
            b[28..32].copy_from_slice(&crc.to_le_bytes());
            b
        };
        assert_eq!(
            Checkpoint::decode(&reseal(b, CKPT_VERSION, 0)),
            Err(CheckpointError::UnsupportedVersion(CKPT_VERSION))
        );
        assert_eq!(
            Checkpoint::decode(&reseal(b, CKPT_VERSION_NO_DW, 2)),
            Err(CheckpointError::UnsupportedVersion(CKPT_VERSION_NO_DW))
        );
        assert!(Checkpoint::decode(&reseal(b, CKPT_VERSION, 2)).is_ok());
    }

    #[test]
    fn format_fills_both_slots_and_the_next_checkpoint_spares_one() {
        let geo = Geometry {
            block_bytes: 512,
            block_count: 4,
            max_run: 2,
            dw_runs: 1,
            shadow: false,
        };
        let slots = Checkpoint::format_slots(geo, DiskId(9));
        assert_eq!([slots[0].0, slots[1].0], CKPT_SLOTS);
        let picked = Checkpoint::pick([&slots[0].1, &slots[1].1])
            .unwrap()
            .unwrap();
        assert_eq!((picked.counter, picked.checkpoint), (1, 0));
        let next = Checkpoint {
            counter: picked.counter + 1,
            ..picked
        };
        // The next checkpoint goes to the other slot than the newest one; if it tears, the
        // newest format slot still stands.
        assert_eq!(next.slot(), slots[0].0);
        let torn = [0xFFu8; CKPT_LEN];
        let after = Checkpoint::pick([&torn, &slots[1].1]).unwrap().unwrap();
        assert_eq!(after, picked);
    }

    #[test]
    fn record_roundtrip() {
        let mut b = LoggedMod::encode(Op::App, 4, 6, b"xyz");
        let m = LoggedMod::decode(&b).unwrap();
        assert_eq!((m.op, m.global_frontier, m.local_frontier), (Op::App, 4, 6));
        assert_eq!(m.bytes, b"xyz");
        b[0] = 1;
        assert_eq!(LoggedMod::decode(&b), None);
    }
}
