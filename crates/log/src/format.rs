//! Byte layouts of the log: the device superblock and the record header. Pure: no I/O.
//!
//! docs/FORMATS.md is the reference with diagrams; the offsets here are the single source of
//! truth and the golden-file tests in `tests/golden.rs` pin them. Everything is little-endian.
//!
//! A record is self-identifying (trail-paper.md §2.2): magic, kind, volume, sequence number,
//! timestamp, volume offset and length, the segment generation, a back pointer to the previous
//! record on the same device, the volume's own sequence number (version 2), and CRC32C
//! checksums. The header checksum is salted with the
//! segment generation, so a record left over from an earlier pass through the segment fails
//! verification when the segment is read as part of a newer pass.

#![deny(clippy::cast_possible_truncation)]

use crate::error::FormatError;

/// "MRNR" read as a little-endian u32.
pub const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"MRNR");
pub const RECORD_HEADER_LEN: usize = 80;
/// "MRNRLOG\0".
pub const SUPERBLOCK_MAGIC: [u8; 8] = *b"MRNRLOG\0";
pub const SUPERBLOCK_LEN: usize = 128;
/// Bytes reserved at the start of every device before segment 0.
pub const DATA_OFFSET: u64 = 64 * 1024;

/// Record and superblock format versions. Retired values are never reused.
///
/// Version 2 (issue 17) fills what version 1 reserved at record offset 68 with the volume's
/// own sequence number, and adds the volume lifecycle and history-gap kinds. Version 1 logs
/// still open: their records read with volume sequence number 0 (not stamped), and what is
/// written into them from then on is version 2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FormatVersion {
    V1,
    V2,
}

impl FormatVersion {
    pub const CURRENT: Self = Self::V2;
    pub fn code(self) -> u16 {
        match self {
            Self::V1 => 1,
            Self::V2 => 2,
        }
    }
    pub fn from_code(code: u16) -> Result<Self, FormatError> {
        match code {
            1 => Ok(Self::V1),
            2 => Ok(Self::V2),
            other => Err(FormatError::UnsupportedVersion(other)),
        }
    }
}

/// What a record says happened to the volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordKind {
    /// `length` bytes of payload at `offset`.
    Write,
    /// `[offset, offset+length)` was discarded; reads as zeros. No payload.
    Trim,
    /// `[offset, offset+length)` reads as zeros. No payload.
    WriteZeroes,
    /// The sequence number never became durable; nothing happened (written by recovery).
    Void,
    /// Volume `volume` was created, `offset` bytes large, with `length`-byte blocks.
    VolumeCreated,
    /// Volume `volume` is now `offset` bytes large.
    VolumeResized,
    /// Volume `volume` was deleted; its history stays readable until it leaves the window.
    VolumeDeleted,
    /// History of volume `volume` is incomplete from timestamp `offset` up to this record's:
    /// writes in between are in the current image but not in history (history was off, or
    /// lost them); instants inside the gap cannot be read.
    HistoryGap,
}

impl RecordKind {
    pub fn code(self) -> u8 {
        match self {
            Self::Write => 1,
            Self::Trim => 2,
            Self::WriteZeroes => 3,
            Self::Void => 4,
            Self::VolumeCreated => 5,
            Self::VolumeResized => 6,
            Self::VolumeDeleted => 7,
            Self::HistoryGap => 8,
        }
    }
    pub fn from_code(code: u8) -> Result<Self, FormatError> {
        match code {
            1 => Ok(Self::Write),
            2 => Ok(Self::Trim),
            3 => Ok(Self::WriteZeroes),
            4 => Ok(Self::Void),
            5 => Ok(Self::VolumeCreated),
            6 => Ok(Self::VolumeResized),
            7 => Ok(Self::VolumeDeleted),
            8 => Ok(Self::HistoryGap),
            other => Err(FormatError::UnknownKind(other)),
        }
    }
    /// Whether records of this kind change the volume's bytes (write, trim, write-zeroes); the
    /// others say something about the volume or the log, and the image ignores them.
    pub fn changes_data(self) -> bool {
        matches!(self, Self::Write | Self::Trim | Self::WriteZeroes)
    }
    /// Whether records of this kind range over `[offset, offset + length)` of the volume;
    /// the lifecycle and gap kinds use `offset` and `length` for other values.
    pub fn is_extent(self) -> bool {
        self.changes_data()
    }
    /// Whether records of this kind carry `length` bytes of payload.
    pub fn has_payload(self) -> bool {
        matches!(self, Self::Write)
    }
}

/// A place in the log: device index in the top 8 bits, byte offset in the low 56.
/// Zero means "none" (offset 0 holds the superblock, never a record).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct LogAddr(pub u64);

impl LogAddr {
    pub const NONE: Self = Self(0);
    const OFFSET_MASK: u64 = (1 << 56) - 1;

    pub fn new(dev: u8, offset: u64) -> Self {
        Self((u64::from(dev) << 56) | (offset & Self::OFFSET_MASK))
    }
    pub fn dev(self) -> usize {
        (self.0 >> 56) as usize
    }
    pub fn offset(self) -> u64 {
        self.0 & Self::OFFSET_MASK
    }
    pub fn is_none(self) -> bool {
        self.0 == 0
    }
}

/// Field offsets of the record header.
mod rec {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 4;
    pub const KIND: usize = 6;
    pub const FLAGS: usize = 7;
    pub const VOLUME: usize = 8;
    pub const LENGTH: usize = 12;
    pub const SEQ: usize = 16;
    pub const TIMESTAMP: usize = 24;
    pub const OFFSET: usize = 32;
    pub const GENERATION: usize = 40;
    pub const BACK: usize = 48;
    pub const SPAN: usize = 56;
    pub const PAYLOAD_LEN: usize = 60;
    pub const PAYLOAD_CRC: usize = 64;
    /// Version 2; reserved (0) in version 1.
    pub const VOLUME_SEQ: usize = 68;
    pub const HEADER_CRC: usize = 76;
}
const _: () = assert!(rec::HEADER_CRC + 4 == RECORD_HEADER_LEN);
const _: () = assert!(rec::VOLUME_SEQ + 8 == rec::HEADER_CRC);

/// A decoded record header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    pub kind: RecordKind,
    pub volume: u32,
    /// Bytes of the volume the record covers.
    pub length: u32,
    pub seq: u64,
    pub timestamp_ns: u64,
    /// Byte offset in the volume (LBA × logical block size).
    pub offset: u64,
    /// Generation of the segment the record was written into.
    pub generation: u64,
    /// The previous record on the same device, or [`LogAddr::NONE`].
    pub back: LogAddr,
    /// Bytes from the start of this record to the start of the next one on the device: header,
    /// payload, and for the last record of a batch the padding to the alignment.
    pub span: u32,
    /// Bytes of payload after the header (`length` for writes, 0 otherwise).
    pub payload_len: u32,
    pub payload_crc: u32,
    /// The volume's own sequence number: 1, 2, 3… over the records of `volume`, in log
    /// order; 0 for a record not stamped (void records, and records of a version 1 log).
    pub volume_seq: u64,
}

impl RecordHeader {
    /// Encodes into `out`, computing the header CRC salted with the log's identity and
    /// `self.generation`. `payload_crc` must already be set.
    pub fn encode(&self, log_id: u128, out: &mut [u8; RECORD_HEADER_LEN]) {
        out.fill(0);
        put_u32(out, rec::MAGIC, RECORD_MAGIC);
        put_u16(out, rec::VERSION, FormatVersion::CURRENT.code());
        out[rec::KIND] = self.kind.code();
        out[rec::FLAGS] = 0;
        put_u32(out, rec::VOLUME, self.volume);
        put_u32(out, rec::LENGTH, self.length);
        put_u64(out, rec::SEQ, self.seq);
        put_u64(out, rec::TIMESTAMP, self.timestamp_ns);
        put_u64(out, rec::OFFSET, self.offset);
        put_u64(out, rec::GENERATION, self.generation);
        put_u64(out, rec::BACK, self.back.0);
        put_u32(out, rec::SPAN, self.span);
        put_u32(out, rec::PAYLOAD_LEN, self.payload_len);
        put_u32(out, rec::PAYLOAD_CRC, self.payload_crc);
        put_u64(out, rec::VOLUME_SEQ, self.volume_seq);
        let crc = header_crc(log_id, self.generation, &out[..rec::HEADER_CRC]);
        put_u32(out, rec::HEADER_CRC, crc);
    }

    /// Decodes and verifies a header of the log `log_id`. `expected_generation`: the generation
    /// the reader expects (the segment's); `None` accepts the header's own (used for the first
    /// record of a segment, which tells the reader the segment's generation).
    pub fn decode(
        bytes: &[u8],
        log_id: u128,
        expected_generation: Option<u64>,
    ) -> Result<Self, FormatError> {
        let b: &[u8; RECORD_HEADER_LEN] = bytes
            .get(..RECORD_HEADER_LEN)
            .and_then(|s| s.try_into().ok())
            .ok_or(FormatError::Truncated)?;
        if get_u32(b, rec::MAGIC) != RECORD_MAGIC {
            return Err(FormatError::BadMagic);
        }
        FormatVersion::from_code(get_u16(b, rec::VERSION))?;
        let generation = get_u64(b, rec::GENERATION);
        let salt = expected_generation.unwrap_or(generation);
        if header_crc(log_id, salt, &b[..rec::HEADER_CRC]) != get_u32(b, rec::HEADER_CRC) {
            return Err(FormatError::BadChecksum);
        }
        let h = Self {
            kind: RecordKind::from_code(b[rec::KIND])?,
            volume: get_u32(b, rec::VOLUME),
            length: get_u32(b, rec::LENGTH),
            seq: get_u64(b, rec::SEQ),
            timestamp_ns: get_u64(b, rec::TIMESTAMP),
            offset: get_u64(b, rec::OFFSET),
            generation,
            back: LogAddr(get_u64(b, rec::BACK)),
            span: get_u32(b, rec::SPAN),
            payload_len: get_u32(b, rec::PAYLOAD_LEN),
            payload_crc: get_u32(b, rec::PAYLOAD_CRC),
            // Version 1 wrote zeros here.
            volume_seq: get_u64(b, rec::VOLUME_SEQ),
        };
        h.check_shape()?;
        Ok(h)
    }

    fn check_shape(&self) -> Result<(), FormatError> {
        let expected_payload = if self.kind.has_payload() {
            self.length
        } else {
            0
        };
        if self.payload_len != expected_payload {
            return Err(FormatError::Inconsistent(
                "payload length does not match the kind",
            ));
        }
        let min_span = RECORD_HEADER_LEN as u64 + u64::from(self.payload_len);
        if u64::from(self.span) < min_span {
            return Err(FormatError::Inconsistent("span shorter than the record"));
        }
        if self.offset.checked_add(u64::from(self.length)).is_none() {
            return Err(FormatError::Inconsistent("offset + length overflows"));
        }
        Ok(())
    }

    /// Verifies `payload` (exactly `payload_len` bytes) against the header.
    pub fn verify_payload(&self, payload: &[u8]) -> Result<(), FormatError> {
        if payload.len() != self.payload_len as usize {
            return Err(FormatError::Truncated);
        }
        if crc32c::crc32c(payload) != self.payload_crc {
            return Err(FormatError::BadChecksum);
        }
        Ok(())
    }
}

/// CRC32C of the header, seeded with the log id and the generation: a record from another log
/// or from an earlier pass through the segment does not verify.
fn header_crc(log_id: u128, generation: u64, header: &[u8]) -> u32 {
    let mut salt = [0u8; 24];
    salt[..16].copy_from_slice(&log_id.to_le_bytes());
    salt[16..].copy_from_slice(&generation.to_le_bytes());
    crc32c::crc32c_append(crc32c::crc32c(&salt), header)
}

/// The per-device superblock at offset 0: names the log and the device's place in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Superblock {
    pub log_id: u128,
    pub device_index: u16,
    pub device_count: u16,
    pub device_bytes: u64,
    pub segment_bytes: u64,
    pub segment_count: u64,
    pub data_offset: u64,
    pub align_bytes: u32,
    pub created_ns: u64,
}

mod sb {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const INDEX: usize = 10;
    pub const COUNT: usize = 12;
    pub const LOG_ID: usize = 16;
    pub const DEVICE_BYTES: usize = 32;
    pub const SEGMENT_BYTES: usize = 40;
    pub const SEGMENT_COUNT: usize = 48;
    pub const DATA_OFFSET: usize = 56;
    pub const ALIGN: usize = 64;
    pub const CREATED: usize = 72;
    pub const CRC: usize = 124;
}
const _: () = assert!(sb::CRC + 4 == SUPERBLOCK_LEN);

impl Superblock {
    pub fn encode(&self) -> [u8; SUPERBLOCK_LEN] {
        let mut out = [0u8; SUPERBLOCK_LEN];
        out[sb::MAGIC..sb::MAGIC + 8].copy_from_slice(&SUPERBLOCK_MAGIC);
        put_u16(&mut out, sb::VERSION, FormatVersion::CURRENT.code());
        put_u16(&mut out, sb::INDEX, self.device_index);
        put_u16(&mut out, sb::COUNT, self.device_count);
        out[sb::LOG_ID..sb::LOG_ID + 16].copy_from_slice(&self.log_id.to_le_bytes());
        put_u64(&mut out, sb::DEVICE_BYTES, self.device_bytes);
        put_u64(&mut out, sb::SEGMENT_BYTES, self.segment_bytes);
        put_u64(&mut out, sb::SEGMENT_COUNT, self.segment_count);
        put_u64(&mut out, sb::DATA_OFFSET, self.data_offset);
        put_u32(&mut out, sb::ALIGN, self.align_bytes);
        put_u64(&mut out, sb::CREATED, self.created_ns);
        let crc = crc32c::crc32c(&out[..sb::CRC]);
        put_u32(&mut out, sb::CRC, crc);
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        let b: &[u8; SUPERBLOCK_LEN] = bytes
            .get(..SUPERBLOCK_LEN)
            .and_then(|s| s.try_into().ok())
            .ok_or(FormatError::Truncated)?;
        if b[..8] != SUPERBLOCK_MAGIC {
            return Err(FormatError::BadMagic);
        }
        if crc32c::crc32c(&b[..sb::CRC]) != get_u32(b, sb::CRC) {
            return Err(FormatError::BadChecksum);
        }
        FormatVersion::from_code(get_u16(b, sb::VERSION))?;
        let mut id = [0u8; 16];
        id.copy_from_slice(&b[sb::LOG_ID..sb::LOG_ID + 16]);
        let s = Self {
            log_id: u128::from_le_bytes(id),
            device_index: get_u16(b, sb::INDEX),
            device_count: get_u16(b, sb::COUNT),
            device_bytes: get_u64(b, sb::DEVICE_BYTES),
            segment_bytes: get_u64(b, sb::SEGMENT_BYTES),
            segment_count: get_u64(b, sb::SEGMENT_COUNT),
            data_offset: get_u64(b, sb::DATA_OFFSET),
            align_bytes: get_u32(b, sb::ALIGN),
            created_ns: get_u64(b, sb::CREATED),
        };
        s.check_shape()?;
        Ok(s)
    }

    fn check_shape(&self) -> Result<(), FormatError> {
        let align = u64::from(self.align_bytes);
        let fits = self
            .segment_bytes
            .checked_mul(self.segment_count)
            .and_then(|n| n.checked_add(self.data_offset))
            .is_some_and(|end| end <= self.device_bytes);
        let ok = self.device_index < self.device_count
            && align.is_power_of_two()
            && self.segment_bytes > 0
            && self.segment_bytes.is_multiple_of(align)
            && self.data_offset.is_multiple_of(align)
            && self.segment_bytes <= u64::from(u32::MAX)
            && fits;
        if ok {
            Ok(())
        } else {
            Err(FormatError::Inconsistent("superblock geometry"))
        }
    }

    /// Byte offset of `segment` on the device.
    pub fn segment_offset(&self, segment: u64) -> u64 {
        self.data_offset + segment * self.segment_bytes
    }
}

/// "MRNRGENF": a device's generation floor, two slots at [`GEN_FLOOR_SLOTS`].
pub const GEN_FLOOR_MAGIC: [u8; 8] = *b"MRNRGENF";
/// Byte offsets of the two generation-floor slots (each one 512-byte sector).
pub const GEN_FLOOR_SLOTS: [u64; 2] = [4096, 8192];
pub const GEN_FLOOR_LEN: usize = 32;

/// Every generation a device uses from now on is at least `floor`. Written (alternating slots,
/// synced) each time the log opens, before any write: a segment entered in a session whose
/// first record never became durable leaves no trace of its generation in the segments, and
/// without the floor the next session could hand the same generation out again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GenFloor {
    pub floor: u64,
    /// Which write this is; the slot is `counter % 2`, the newer valid slot wins.
    pub counter: u64,
}

impl GenFloor {
    pub fn encode(&self) -> [u8; GEN_FLOOR_LEN] {
        let mut b = [0u8; GEN_FLOOR_LEN];
        b[..8].copy_from_slice(&GEN_FLOOR_MAGIC);
        put_u64(&mut b, 8, self.floor);
        put_u64(&mut b, 16, self.counter);
        let crc = crc32c::crc32c(&b[..28]);
        put_u32(&mut b, 28, crc);
        b
    }

    pub fn decode(b: &[u8]) -> Option<Self> {
        let b = b.get(..GEN_FLOOR_LEN)?;
        if b[..8] != GEN_FLOOR_MAGIC || crc32c::crc32c(&b[..28]) != get_u32(b, 28) {
            return None;
        }
        Some(Self {
            floor: get_u64(b, 8),
            counter: get_u64(b, 16),
        })
    }
}

fn put_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}
fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
fn get_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn get_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}
fn get_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const LOG: u128 = 0xfeed;

    fn header() -> RecordHeader {
        RecordHeader {
            kind: RecordKind::Write,
            volume: 3,
            length: 4096,
            seq: 42,
            timestamp_ns: 1_700_000_000_000_000_000,
            offset: 8192,
            generation: 7,
            back: LogAddr::new(1, 65536),
            span: 4608,
            payload_len: 4096,
            payload_crc: crc32c::crc32c(&[0xab; 4096]),
            volume_seq: 0,
        }
    }

    #[test]
    fn header_roundtrips() {
        let h = header();
        let mut b = [0u8; RECORD_HEADER_LEN];
        h.encode(LOG, &mut b);
        assert_eq!(RecordHeader::decode(&b, LOG, Some(7)), Ok(h));
        assert_eq!(RecordHeader::decode(&b, LOG, None), Ok(h));
        assert_eq!(
            RecordHeader::decode(&b, LOG + 1, None),
            Err(FormatError::BadChecksum)
        );
        assert!(h.verify_payload(&[0xab; 4096]).is_ok());
        assert_eq!(
            h.verify_payload(&[0xac; 4096]),
            Err(FormatError::BadChecksum)
        );
    }

    #[test]
    fn a_record_from_another_generation_fails_verification() {
        let mut b = [0u8; RECORD_HEADER_LEN];
        header().encode(LOG, &mut b);
        assert_eq!(
            RecordHeader::decode(&b, LOG, Some(8)),
            Err(FormatError::BadChecksum)
        );
    }

    #[test]
    fn every_flipped_bit_is_caught() {
        let mut b = [0u8; RECORD_HEADER_LEN];
        header().encode(LOG, &mut b);
        for bit in 0..RECORD_HEADER_LEN * 8 {
            let mut c = b;
            c[bit / 8] ^= 1 << (bit % 8);
            assert!(RecordHeader::decode(&c, LOG, Some(7)).is_err(), "bit {bit}");
        }
    }

    #[test]
    fn superblock_roundtrips_and_rejects_damage() {
        let s = Superblock {
            log_id: 0x0123_4567_89ab_cdef_0011_2233_4455_6677,
            device_index: 1,
            device_count: 2,
            device_bytes: 1 << 30,
            segment_bytes: 4 << 20,
            segment_count: 255,
            data_offset: DATA_OFFSET,
            align_bytes: 512,
            created_ns: 99,
        };
        let b = s.encode();
        assert_eq!(Superblock::decode(&b), Ok(s));
        let mut c = b;
        c[20] ^= 1;
        assert_eq!(Superblock::decode(&c), Err(FormatError::BadChecksum));
    }

    #[test]
    fn log_addr_packs_device_and_offset() {
        let a = LogAddr::new(3, 0x1234_5678_9abc);
        assert_eq!((a.dev(), a.offset()), (3, 0x1234_5678_9abc));
        assert!(LogAddr::NONE.is_none());
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
            let _ = RecordHeader::decode(&bytes, LOG, None);
            let _ = RecordHeader::decode(&bytes, LOG, Some(1));
            let _ = Superblock::decode(&bytes);
        }
    }
}
