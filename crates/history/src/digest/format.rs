//! Byte layouts of the TL digest files: the file header, the frame header, the per-volume
//! summaries and the entries. Pure: no I/O.
//!
//! docs/FORMATS.md "History: TL digests" is the reference; the offsets here are the single
//! source of truth and `tests/digest_golden.rs` pins them. Everything is little-endian.
//!
//! Decoding is canonical: exactly one byte string decodes to a given list of entries
//! (reserved bytes zero, summaries and time bounds exactly those the entries give, entries
//! strictly ascending), so what decodes encodes back to the same bytes — the fuzz target's
//! assertion — and no damage that keeps a checksum valid can smuggle in a second meaning.
//! Nothing here panics on any input: every count is checked against the bytes present
//! before it is used.

#![deny(clippy::cast_possible_truncation)]

use mariner_log::{LogAddr, RecordKind};

use crate::DigestEntry;

/// "MRNRTLD\0": a digest file.
pub const FILE_MAGIC: [u8; 8] = *b"MRNRTLD\0";
/// "TLDF": a frame.
pub const FRAME_MAGIC: [u8; 4] = *b"TLDF";
/// The digest format version (file header and frames). Retired values are never reused.
pub const VERSION: u16 = 1;
pub const FILE_HEADER_LEN: usize = 32;
pub const FRAME_HEADER_LEN: usize = 64;
pub const SUMMARY_LEN: usize = 40;
pub const ENTRY_LEN: usize = 56;
/// The most entries one frame holds (3.5 MiB of entries): `append` splits longer batches,
/// and a damaged count cannot make a reader allocate more.
pub const MAX_FRAME_ENTRIES: u32 = 1 << 16;

/// Field offsets of the file header.
mod file {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    /// 6 reserved bytes (zero) at 10.
    pub const RESERVED: usize = 10;
    pub const FIRST_SEQ: usize = 16;
    /// 4 reserved bytes (zero) at 24.
    pub const RESERVED2: usize = 24;
    pub const CRC: usize = 28;
}
const _: () = assert!(file::CRC + 4 == FILE_HEADER_LEN);
const _: () = assert!(file::RESERVED + 6 == file::FIRST_SEQ);
const _: () = assert!(file::FIRST_SEQ + 8 == file::RESERVED2);

/// Field offsets of the frame header.
mod frame {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 4;
    pub const RESERVED: usize = 6;
    pub const ENTRIES: usize = 8;
    pub const VOLUMES: usize = 12;
    pub const FIRST_SEQ: usize = 16;
    pub const LAST_SEQ: usize = 24;
    pub const MIN_TS: usize = 32;
    pub const MAX_TS: usize = 40;
    pub const SUMMARIES_CRC: usize = 48;
    pub const ENTRIES_CRC: usize = 52;
    pub const RESERVED2: usize = 56;
    pub const HEADER_CRC: usize = 60;
}
const _: () = assert!(frame::HEADER_CRC + 4 == FRAME_HEADER_LEN);
const _: () = assert!(frame::MAX_TS + 8 == frame::SUMMARIES_CRC);

/// Field offsets of a per-volume summary.
mod summary {
    pub const VOLUME: usize = 0;
    pub const COUNT: usize = 4;
    pub const MIN_VSEQ: usize = 8;
    pub const MAX_VSEQ: usize = 16;
    pub const MIN_TS: usize = 24;
    pub const MAX_TS: usize = 32;
}
const _: () = assert!(summary::MAX_TS + 8 == SUMMARY_LEN);

/// Field offsets of an entry.
mod entry {
    pub const SEQ: usize = 0;
    pub const VOLUME_SEQ: usize = 8;
    pub const TIMESTAMP: usize = 16;
    pub const OFFSET: usize = 24;
    pub const ADDR: usize = 32;
    pub const VOLUME: usize = 40;
    pub const LENGTH: usize = 44;
    pub const KIND: usize = 48;
    /// 7 reserved bytes (zero) at 49.
    pub const RESERVED: usize = 49;
}
const _: () = assert!(entry::RESERVED + 7 == ENTRY_LEN);

/// Why bytes do not decode, and where: `at` is relative to the start of the slice given to
/// the decoder (the caller adds where that slice lies in the file). A checksum mismatch is
/// reported at the start of the bytes the checksum covers: the damage is at or after `at`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    pub at: u64,
    pub why: String,
}

fn damage<T>(at: usize, why: impl Into<String>) -> Result<T, Damage> {
    Err(Damage {
        at: at as u64,
        why: why.into(),
    })
}

/// A decoded frame header: enough to know the frame's length, its sequence and time range,
/// and to check its summaries and entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub entries: u32,
    pub volumes: u32,
    pub first_seq: u64,
    pub last_seq: u64,
    pub min_ts: u64,
    pub max_ts: u64,
    pub summaries_crc: u32,
    pub entries_crc: u32,
}

impl FrameHeader {
    pub fn summaries_len(&self) -> u64 {
        u64::from(self.volumes) * SUMMARY_LEN as u64
    }
    pub fn entries_len(&self) -> u64 {
        u64::from(self.entries) * ENTRY_LEN as u64
    }
    /// Bytes of the whole frame: header, summaries, entries.
    pub fn frame_len(&self) -> u64 {
        FRAME_HEADER_LEN as u64 + self.summaries_len() + self.entries_len()
    }
}

/// What a frame holds of one volume. Min/max rather than first/last, so that skipping a
/// frame by its summary is right even where a volume's numbers or timestamps are not in
/// sequence order (records of a version 1 log are all numbered 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub volume: u32,
    /// The volume's entries in the frame (≥ 1).
    pub count: u32,
    pub min_vseq: u64,
    pub max_vseq: u64,
    pub min_ts: u64,
    pub max_ts: u64,
}

/// The file header: magic, version, the sequence number of the file's first entry (also its
/// name), CRC.
pub fn encode_file_header(first_seq: u64) -> [u8; FILE_HEADER_LEN] {
    let mut b = [0u8; FILE_HEADER_LEN];
    b[file::MAGIC..file::MAGIC + 8].copy_from_slice(&FILE_MAGIC);
    put_u16(&mut b, file::VERSION, VERSION);
    put_u64(&mut b, file::FIRST_SEQ, first_seq);
    let crc = crc32c::crc32c(&b[..file::CRC]);
    put_u32(&mut b, file::CRC, crc);
    b
}

/// Decodes a file header; returns the file's first sequence number.
pub fn decode_file_header(b: &[u8]) -> Result<u64, Damage> {
    let Some(b) = b.get(..FILE_HEADER_LEN) else {
        return damage(b.len(), "file header cut short");
    };
    if b[file::MAGIC..file::MAGIC + 8] != FILE_MAGIC {
        return damage(file::MAGIC, "not a digest file (bad magic)");
    }
    if crc32c::crc32c(&b[..file::CRC]) != get_u32(b, file::CRC) {
        return damage(0, "file header checksum mismatch");
    }
    let version = get_u16(b, file::VERSION);
    if version != VERSION {
        return damage(
            file::VERSION,
            format!("unsupported digest version {version}"),
        );
    }
    if b[file::RESERVED..file::FIRST_SEQ].iter().any(|&x| x != 0)
        || get_u32(b, file::RESERVED2) != 0
    {
        return damage(file::RESERVED, "file header has nonzero reserved bytes");
    }
    Ok(get_u64(b, file::FIRST_SEQ))
}

/// The summaries and time bounds of `entries` (volumes ascending): what the frame header and
/// summaries must say, computed one way for the encoder and the decoder's check alike.
pub fn summarize(entries: &[DigestEntry]) -> (Vec<Summary>, u64, u64) {
    let mut by_volume: std::collections::BTreeMap<u32, Summary> = Default::default();
    let (mut min_ts, mut max_ts) = (u64::MAX, 0);
    for e in entries {
        min_ts = min_ts.min(e.timestamp_ns);
        max_ts = max_ts.max(e.timestamp_ns);
        by_volume
            .entry(e.volume)
            .and_modify(|s| {
                s.count = s.count.saturating_add(1);
                s.min_vseq = s.min_vseq.min(e.volume_seq);
                s.max_vseq = s.max_vseq.max(e.volume_seq);
                s.min_ts = s.min_ts.min(e.timestamp_ns);
                s.max_ts = s.max_ts.max(e.timestamp_ns);
            })
            .or_insert(Summary {
                volume: e.volume,
                count: 1,
                min_vseq: e.volume_seq,
                max_vseq: e.volume_seq,
                min_ts: e.timestamp_ns,
                max_ts: e.timestamp_ns,
            });
    }
    if entries.is_empty() {
        min_ts = 0;
    }
    (by_volume.into_values().collect(), min_ts, max_ts)
}

/// Encodes one frame. `entries` must be non-empty, at most [`MAX_FRAME_ENTRIES`], with
/// strictly ascending `seq` (the caller, `Digests::append`, checks; what violates it would
/// not decode).
pub fn encode_frame(entries: &[DigestEntry]) -> Vec<u8> {
    let (summaries, min_ts, max_ts) = summarize(entries);
    let body_at = FRAME_HEADER_LEN + summaries.len() * SUMMARY_LEN;
    let mut b = vec![0u8; body_at + entries.len() * ENTRY_LEN];
    for (i, s) in summaries.iter().enumerate() {
        let at = FRAME_HEADER_LEN + i * SUMMARY_LEN;
        put_u32(&mut b, at + summary::VOLUME, s.volume);
        put_u32(&mut b, at + summary::COUNT, s.count);
        put_u64(&mut b, at + summary::MIN_VSEQ, s.min_vseq);
        put_u64(&mut b, at + summary::MAX_VSEQ, s.max_vseq);
        put_u64(&mut b, at + summary::MIN_TS, s.min_ts);
        put_u64(&mut b, at + summary::MAX_TS, s.max_ts);
    }
    for (i, e) in entries.iter().enumerate() {
        let at = body_at + i * ENTRY_LEN;
        put_u64(&mut b, at + entry::SEQ, e.seq);
        put_u64(&mut b, at + entry::VOLUME_SEQ, e.volume_seq);
        put_u64(&mut b, at + entry::TIMESTAMP, e.timestamp_ns);
        put_u64(&mut b, at + entry::OFFSET, e.offset);
        put_u64(&mut b, at + entry::ADDR, e.addr.0);
        put_u32(&mut b, at + entry::VOLUME, e.volume);
        put_u32(&mut b, at + entry::LENGTH, e.length);
        b[at + entry::KIND] = e.kind.code();
    }
    let summaries_crc = crc32c::crc32c(&b[FRAME_HEADER_LEN..body_at]);
    let entries_crc = crc32c::crc32c(&b[body_at..]);
    let h = &mut b[..FRAME_HEADER_LEN];
    h[frame::MAGIC..frame::MAGIC + 4].copy_from_slice(&FRAME_MAGIC);
    put_u16(h, frame::VERSION, VERSION);
    put_u32(h, frame::ENTRIES, len_u32(entries.len()));
    put_u32(h, frame::VOLUMES, len_u32(summaries.len()));
    put_u64(h, frame::FIRST_SEQ, entries.first().map_or(0, |e| e.seq));
    put_u64(h, frame::LAST_SEQ, entries.last().map_or(0, |e| e.seq));
    put_u64(h, frame::MIN_TS, min_ts);
    put_u64(h, frame::MAX_TS, max_ts);
    put_u32(h, frame::SUMMARIES_CRC, summaries_crc);
    put_u32(h, frame::ENTRIES_CRC, entries_crc);
    let crc = crc32c::crc32c(&h[..frame::HEADER_CRC]);
    put_u32(h, frame::HEADER_CRC, crc);
    b
}

fn len_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Decodes and checks a frame header on its own (its own CRC, bounds that need no other
/// bytes), so the frame's length can be trusted before its body is read.
pub fn decode_frame_header(b: &[u8]) -> Result<FrameHeader, Damage> {
    let Some(b) = b.get(..FRAME_HEADER_LEN) else {
        return damage(b.len(), "frame header cut short");
    };
    if b[frame::MAGIC..frame::MAGIC + 4] != FRAME_MAGIC {
        return damage(frame::MAGIC, "no frame here (bad magic)");
    }
    if crc32c::crc32c(&b[..frame::HEADER_CRC]) != get_u32(b, frame::HEADER_CRC) {
        return damage(0, "frame header checksum mismatch");
    }
    let version = get_u16(b, frame::VERSION);
    if version != VERSION {
        return damage(
            frame::VERSION,
            format!("unsupported frame version {version}"),
        );
    }
    if get_u16(b, frame::RESERVED) != 0 || get_u32(b, frame::RESERVED2) != 0 {
        return damage(frame::RESERVED, "frame header has nonzero reserved bytes");
    }
    let h = FrameHeader {
        entries: get_u32(b, frame::ENTRIES),
        volumes: get_u32(b, frame::VOLUMES),
        first_seq: get_u64(b, frame::FIRST_SEQ),
        last_seq: get_u64(b, frame::LAST_SEQ),
        min_ts: get_u64(b, frame::MIN_TS),
        max_ts: get_u64(b, frame::MAX_TS),
        summaries_crc: get_u32(b, frame::SUMMARIES_CRC),
        entries_crc: get_u32(b, frame::ENTRIES_CRC),
    };
    if h.entries == 0 || h.entries > MAX_FRAME_ENTRIES {
        return damage(frame::ENTRIES, format!("frame of {} entries", h.entries));
    }
    if h.volumes == 0 || h.volumes > h.entries {
        return damage(
            frame::VOLUMES,
            format!("{} volumes in a frame of {} entries", h.volumes, h.entries),
        );
    }
    // Strictly ascending sequence numbers: at least entries − 1 apart.
    if h.last_seq < h.first_seq || h.last_seq - h.first_seq < u64::from(h.entries - 1) {
        return damage(
            frame::FIRST_SEQ,
            "frame sequence range cannot hold its entries",
        );
    }
    if h.min_ts > h.max_ts {
        return damage(frame::MIN_TS, "frame time range reversed");
    }
    Ok(h)
}

/// Decodes the summaries that follow `h` (`b` holds exactly them).
pub fn decode_summaries(h: &FrameHeader, b: &[u8]) -> Result<Vec<Summary>, Damage> {
    if b.len() as u64 != h.summaries_len() {
        return damage(b.len(), "summaries cut short");
    }
    if crc32c::crc32c(b) != h.summaries_crc {
        return damage(0, "summaries checksum mismatch");
    }
    let mut out: Vec<Summary> = Vec::with_capacity(h.volumes as usize);
    let mut total = 0u64;
    for (i, s) in b.chunks_exact(SUMMARY_LEN).enumerate() {
        let at = i * SUMMARY_LEN;
        let s = Summary {
            volume: get_u32(s, summary::VOLUME),
            count: get_u32(s, summary::COUNT),
            min_vseq: get_u64(s, summary::MIN_VSEQ),
            max_vseq: get_u64(s, summary::MAX_VSEQ),
            min_ts: get_u64(s, summary::MIN_TS),
            max_ts: get_u64(s, summary::MAX_TS),
        };
        if out.last().is_some_and(|p| p.volume >= s.volume) {
            return damage(at, "summaries not in ascending volume order");
        }
        if s.count == 0 || s.min_vseq > s.max_vseq || s.min_ts > s.max_ts {
            return damage(at, "summary inconsistent");
        }
        if s.min_ts < h.min_ts || s.max_ts > h.max_ts {
            return damage(at, "summary outside the frame's time range");
        }
        total += u64::from(s.count);
        out.push(s);
    }
    if total != u64::from(h.entries) {
        return damage(0, "summaries do not count the frame's entries");
    }
    Ok(out)
}

/// Decodes the entries that follow the summaries (`b` holds exactly them) and checks that
/// header and summaries are exactly what they give.
pub fn decode_entries(
    h: &FrameHeader,
    summaries: &[Summary],
    b: &[u8],
) -> Result<Vec<DigestEntry>, Damage> {
    if b.len() as u64 != h.entries_len() {
        return damage(b.len(), "entries cut short");
    }
    if crc32c::crc32c(b) != h.entries_crc {
        return damage(0, "entries checksum mismatch");
    }
    let mut out: Vec<DigestEntry> = Vec::with_capacity(h.entries as usize);
    for (i, e) in b.chunks_exact(ENTRY_LEN).enumerate() {
        let at = i * ENTRY_LEN;
        let Ok(kind) = RecordKind::from_code(e[entry::KIND]) else {
            return damage(
                at + entry::KIND,
                format!("unknown record kind {}", e[entry::KIND]),
            );
        };
        if e[entry::RESERVED..].iter().any(|&x| x != 0) {
            return damage(at + entry::RESERVED, "entry has nonzero reserved bytes");
        }
        let d = DigestEntry {
            seq: get_u64(e, entry::SEQ),
            volume: get_u32(e, entry::VOLUME),
            kind,
            volume_seq: get_u64(e, entry::VOLUME_SEQ),
            timestamp_ns: get_u64(e, entry::TIMESTAMP),
            offset: get_u64(e, entry::OFFSET),
            length: get_u32(e, entry::LENGTH),
            addr: LogAddr(get_u64(e, entry::ADDR)),
        };
        if out.last().is_some_and(|p| p.seq >= d.seq) {
            return damage(at, "entries not in ascending sequence order");
        }
        out.push(d);
    }
    let (first, last) = match (out.first(), out.last()) {
        (Some(f), Some(l)) => (f.seq, l.seq),
        _ => return damage(0, "frame without entries"),
    };
    let (want, min_ts, max_ts) = summarize(&out);
    if first != h.first_seq || last != h.last_seq || min_ts != h.min_ts || max_ts != h.max_ts {
        return damage(0, "frame header does not match its entries");
    }
    if want != summaries {
        return damage(0, "summaries do not match the entries");
    }
    Ok(out)
}

/// Decodes one whole frame (`b` holds exactly it).
pub fn decode_frame(b: &[u8]) -> Result<Vec<DigestEntry>, Damage> {
    let h = decode_frame_header(b)?;
    if b.len() as u64 != h.frame_len() {
        return damage(b.len(), "frame length does not match its header");
    }
    let body = FRAME_HEADER_LEN + h.volumes as usize * SUMMARY_LEN;
    let summaries = decode_summaries(&h, &b[FRAME_HEADER_LEN..body]).map_err(|d| Damage {
        at: d.at + FRAME_HEADER_LEN as u64,
        ..d
    })?;
    decode_entries(&h, &summaries, &b[body..]).map_err(|d| Damage {
        at: d.at + body as u64,
        ..d
    })
}

/// Encodes a whole file: header, then one frame per element of `frames` — byte for byte what
/// `Digests` writes when it appends those frames to a new file.
pub fn encode_file_image(first_seq: u64, frames: &[Vec<DigestEntry>]) -> Vec<u8> {
    let mut out = encode_file_header(first_seq).to_vec();
    for f in frames {
        out.extend_from_slice(&encode_frame(f));
    }
    out
}

/// Decodes a whole file image: its first sequence number and its frames' entries. The first
/// frame must start at the file's first sequence number and each frame above the last.
pub fn decode_file_image(b: &[u8]) -> Result<(u64, Vec<Vec<DigestEntry>>), Damage> {
    let first_seq = decode_file_header(b)?;
    let mut frames: Vec<Vec<DigestEntry>> = Vec::new();
    let mut pos = FILE_HEADER_LEN;
    while pos < b.len() {
        let rest = &b[pos..];
        let h = decode_frame_header(rest).map_err(|d| shift(d, pos))?;
        let Some(one) = usize::try_from(h.frame_len())
            .ok()
            .and_then(|n| rest.get(..n))
        else {
            return damage(pos, "frame runs past the end of the file");
        };
        let entries = decode_frame(one).map_err(|d| shift(d, pos))?;
        let prev_last = frames.last().and_then(|f| f.last()).map(|e| e.seq);
        match prev_last {
            None if h.first_seq != first_seq => {
                return damage(
                    pos,
                    "first frame does not start at the file's sequence number",
                )
            }
            Some(last) if h.first_seq <= last => {
                return damage(pos, "frame does not follow the one before it")
            }
            _ => {}
        }
        pos += one.len();
        frames.push(entries);
    }
    Ok((first_seq, frames))
}

/// `d` found in a slice that starts at `base`.
pub fn shift(d: Damage, base: usize) -> Damage {
    Damage {
        at: d.at + base as u64,
        why: d.why,
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
