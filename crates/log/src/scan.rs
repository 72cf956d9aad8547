//! Reading a device's segments back: the first pass of recovery (trail-paper.md §2.2).
//!
//! A segment is read whole and parsed from its start. Its first valid record names the
//! segment's generation; every later record must carry the same generation (the header checksum
//! is salted with it), so records left from an earlier pass stop the parse. The parse also stops
//! at the first record whose header or payload fails its checksum: that is the torn tail of the
//! last write, which was never acknowledged, because a device starts a write only after the
//! previous one was durable, and after a restart writing resumes in a fresh segment.

use mariner_disk::{AlignedBuf, Disk};

use crate::format::{LogAddr, RecordHeader, Superblock, RECORD_HEADER_LEN};

/// Why the parse of a segment stopped before its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// Reached the end of the segment.
    End,
    /// Bytes that are not a record header (zeros of a fresh segment, or a torn write).
    NoRecord,
    /// A header from another generation (an earlier pass) or with a bad checksum.
    BadHeader,
    /// A valid header whose payload fails its checksum (a torn write).
    BadPayload,
}

/// One record found by the scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    pub header: RecordHeader,
    pub addr: LogAddr,
}

/// What one segment holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentScan {
    pub segment: u64,
    /// `None` when not even the first record is valid.
    pub generation: Option<u64>,
    pub records: Vec<Found>,
    pub stop: Stop,
    /// Bytes of valid records.
    pub used_bytes: u64,
}

/// What one segment holds, without its records: what recovery decides by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentSummary {
    pub segment: u64,
    /// `None` when not even the first record is valid.
    pub generation: Option<u64>,
    pub stop: Stop,
    /// Bytes of valid records.
    pub used_bytes: u64,
    /// Valid records.
    pub record_count: u64,
    /// Highest sequence number and timestamp of the valid records (0 when there are none).
    pub max_seq: u64,
    pub max_ts: u64,
}

/// Receives what a device scan finds as it finds it, so the caller keeps only what it needs
/// (recovery: the records above the consumers' watermark and a few per-segment facts).
pub trait Visit {
    /// A valid record, in device order.
    fn record(&mut self, found: &Found);
    /// A segment's parse ended; its records were visited just before.
    fn segment(&mut self, summary: &SegmentSummary);
}

/// Parses one segment image, handing each valid record to `on_record`. `base` is the
/// segment's byte offset on device `dev`.
pub fn parse_segment_with(
    log_id: u128,
    dev: u8,
    segment: u64,
    base: u64,
    bytes: &[u8],
    mut on_record: impl FnMut(&Found),
) -> SegmentSummary {
    let mut scan = SegmentSummary {
        segment,
        generation: None,
        stop: Stop::End,
        used_bytes: 0,
        record_count: 0,
        max_seq: 0,
        max_ts: 0,
    };
    let mut pos = 0usize;
    while pos < bytes.len() {
        let rest = &bytes[pos..];
        if rest.len() < RECORD_HEADER_LEN {
            scan.stop = Stop::NoRecord;
            break;
        }
        let header = match RecordHeader::decode(rest, log_id, scan.generation) {
            Ok(h) => h,
            Err(crate::FormatError::BadMagic) | Err(crate::FormatError::Truncated) => {
                scan.stop = Stop::NoRecord;
                break;
            }
            Err(_) => {
                scan.stop = Stop::BadHeader;
                break;
            }
        };
        let span = header.span as usize;
        let payload_end = RECORD_HEADER_LEN + header.payload_len as usize;
        if span > rest.len()
            || header
                .verify_payload(&rest[RECORD_HEADER_LEN..payload_end])
                .is_err()
        {
            scan.stop = Stop::BadPayload;
            break;
        }
        scan.generation = Some(header.generation);
        scan.record_count += 1;
        scan.max_seq = scan.max_seq.max(header.seq);
        scan.max_ts = scan.max_ts.max(header.timestamp_ns);
        on_record(&Found {
            header,
            addr: LogAddr::new(dev, base + pos as u64),
        });
        pos += span;
        scan.used_bytes = pos as u64;
    }
    scan
}

/// Parses one segment image and keeps its records. `base` is the segment's byte offset on
/// device `dev`.
pub fn parse_segment(log_id: u128, dev: u8, segment: u64, base: u64, bytes: &[u8]) -> SegmentScan {
    let mut records = Vec::new();
    let s = parse_segment_with(log_id, dev, segment, base, bytes, |f| records.push(*f));
    SegmentScan {
        segment,
        generation: s.generation,
        records,
        stop: s.stop,
        used_bytes: s.used_bytes,
    }
}

/// Reads and parses every segment of a device, keeping every record (for inspection tools;
/// recovery uses [`scan_device_with`]).
pub fn scan_device<D: Disk + ?Sized>(
    disk: &D,
    dev: u8,
    sb: &Superblock,
) -> std::io::Result<Vec<SegmentScan>> {
    let mut out = Vec::with_capacity(sb.segment_count as usize);
    for_each_segment(disk, sb, |segment, base, bytes| {
        out.push(parse_segment(sb.log_id, dev, segment, base, bytes));
    })?;
    Ok(out)
}

/// Reads and parses every segment of a device in order, handing what it finds to `visit`;
/// holds one segment image at a time.
pub fn scan_device_with<D: Disk + ?Sized, V: Visit>(
    disk: &D,
    dev: u8,
    sb: &Superblock,
    visit: &mut V,
) -> std::io::Result<()> {
    for_each_segment(disk, sb, |segment, base, bytes| {
        let summary = parse_segment_with(sb.log_id, dev, segment, base, bytes, |f| visit.record(f));
        visit.segment(&summary);
    })
}

/// The first record header of every segment of the device (decoded with its own generation),
/// or `None` where the segment does not start with a valid one: what recovery orders the
/// segments by and bounds their sequence numbers with, reading one block per segment.
pub fn first_headers<D: Disk + ?Sized>(
    disk: &D,
    sb: &Superblock,
) -> std::io::Result<Vec<Option<RecordHeader>>> {
    let align = (sb.align_bytes as usize).max(disk.alignment()).max(512);
    let mut buf = AlignedBuf::new(align, align)?;
    (0..sb.segment_count)
        .map(|segment| {
            disk.read_at(&mut buf, sb.segment_offset(segment))?;
            Ok(RecordHeader::decode(&buf, sb.log_id, None).ok())
        })
        .collect()
}

/// Reads and parses one segment, handing what it finds to `visit`. `buf` must hold a segment.
pub fn scan_segment<D: Disk + ?Sized, V: Visit>(
    disk: &D,
    dev: u8,
    sb: &Superblock,
    segment: u64,
    buf: &mut [u8],
    visit: &mut V,
) -> std::io::Result<()> {
    disk.read_at(buf, sb.segment_offset(segment))?;
    scan_image(dev, sb, segment, buf, visit);
    Ok(())
}

/// Parses one segment's image as [`scan_segment`] does after reading it.
pub fn scan_image<V: Visit>(dev: u8, sb: &Superblock, segment: u64, image: &[u8], visit: &mut V) {
    let base = sb.segment_offset(segment);
    let summary = parse_segment_with(sb.log_id, dev, segment, base, image, |f| visit.record(f));
    visit.segment(&summary);
}

/// A buffer for one segment of `disk`, aligned as its reads must be.
pub fn segment_buffer<D: Disk + ?Sized>(disk: &D, sb: &Superblock) -> std::io::Result<AlignedBuf> {
    let align = (sb.align_bytes as usize).max(disk.alignment()).max(512);
    AlignedBuf::new(sb.segment_bytes as usize, align)
}

/// Reads each segment of the device into one buffer and calls `f(segment, base, image)`.
fn for_each_segment<D: Disk + ?Sized>(
    disk: &D,
    sb: &Superblock,
    mut f: impl FnMut(u64, u64, &[u8]),
) -> std::io::Result<()> {
    let align = (sb.align_bytes as usize).max(disk.alignment()).max(512);
    let mut buf = AlignedBuf::new(sb.segment_bytes as usize, align)?;
    for segment in 0..sb.segment_count {
        let base = sb.segment_offset(segment);
        // Most segments of a young log are empty: look at the first header before reading all.
        disk.read_at(&mut buf[..align], base)?;
        if RecordHeader::decode(&buf[..align], sb.log_id, None).is_err() {
            f(segment, base, &buf[..align]);
            continue;
        }
        disk.read_at(&mut buf, base)?;
        f(segment, base, &buf);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::RecordKind;

    fn record(seq: u64, generation: u64, payload: &[u8], span: u32) -> Vec<u8> {
        let h = RecordHeader {
            kind: RecordKind::Write,
            volume: 1,
            length: payload.len() as u32,
            seq,
            timestamp_ns: seq * 10,
            offset: seq * 4096,
            generation,
            back: LogAddr::NONE,
            span,
            payload_len: payload.len() as u32,
            payload_crc: crc32c::crc32c(payload),
            volume_seq: 0,
        };
        let mut hb = [0u8; RECORD_HEADER_LEN];
        h.encode(7, &mut hb);
        let mut v = hb.to_vec();
        v.extend_from_slice(payload);
        v.resize(span as usize, 0);
        v
    }

    #[test]
    fn parses_until_zeros() {
        let mut seg = record(1, 5, &[1; 100], 512);
        seg.extend(record(2, 5, &[2; 100], 512));
        seg.resize(4096, 0);
        let s = parse_segment(7, 0, 0, 65536, &seg);
        assert_eq!(s.generation, Some(5));
        assert_eq!(s.records.len(), 2);
        assert_eq!(s.records[1].addr, LogAddr::new(0, 65536 + 512));
        assert_eq!(s.stop, Stop::NoRecord);
        assert_eq!(s.used_bytes, 1024);
    }

    #[test]
    fn the_summary_counts_what_the_records_say() {
        let mut seg = record(9, 5, &[1; 100], 512);
        seg.extend(record(4, 5, &[2; 100], 512));
        seg.resize(4096, 0);
        let mut seen = Vec::new();
        let s = parse_segment_with(7, 0, 3, 0, &seg, |f| seen.push(f.header.seq));
        assert_eq!(seen, vec![9, 4]);
        assert_eq!(
            (s.segment, s.generation, s.stop),
            (3, Some(5), Stop::NoRecord)
        );
        assert_eq!(
            (s.record_count, s.max_seq, s.max_ts, s.used_bytes),
            (2, 9, 90, 1024)
        );
        let empty = parse_segment_with(7, 0, 4, 0, &[0; 512], |_| panic!("no record"));
        assert_eq!(
            (empty.generation, empty.record_count, empty.max_seq),
            (None, 0, 0)
        );
    }

    #[test]
    fn stale_records_from_an_earlier_generation_stop_the_parse() {
        let mut seg = record(10, 6, &[1; 100], 512);
        seg.extend(record(3, 5, &[2; 100], 512));
        let s = parse_segment(7, 0, 0, 0, &seg);
        assert_eq!(s.records.len(), 1);
        assert_eq!(s.stop, Stop::BadHeader);
    }

    #[test]
    fn a_torn_payload_stops_the_parse() {
        let mut seg = record(1, 5, &[1; 100], 512);
        let mut torn = record(2, 5, &[2; 1000], 1536);
        torn[600..].fill(0);
        seg.extend(torn);
        let s = parse_segment(7, 0, 0, 0, &seg);
        assert_eq!(s.records.len(), 1);
        assert_eq!(s.stop, Stop::BadPayload);
    }
}
