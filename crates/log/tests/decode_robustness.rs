#![allow(clippy::unwrap_used, clippy::expect_used)]

//! Fuzz-style robustness of the decoders: whatever the bytes, `RecordHeader::decode`,
//! `Superblock::decode` and `scan::parse_segment` return instead of panicking; valid values
//! roundtrip; a damaged segment yields a prefix of the records written into it.

use mariner_log::format::{FormatVersion, RECORD_MAGIC};
use mariner_log::scan::{parse_segment, Stop};
use mariner_log::{
    FormatError, Found, LogAddr, RecordHeader, RecordKind, Superblock, RECORD_HEADER_LEN,
};
use proptest::prelude::*;

const LOG_ID: u128 = 0x0d0e_c0de;

fn kind() -> impl Strategy<Value = RecordKind> {
    prop_oneof![
        Just(RecordKind::Write),
        Just(RecordKind::Trim),
        Just(RecordKind::WriteZeroes),
        Just(RecordKind::Void),
    ]
}

/// Any header the writer could produce: the payload length follows the kind, the span covers
/// header and payload, and `offset + length` does not overflow.
fn valid_header() -> impl Strategy<Value = RecordHeader> {
    (
        kind(),
        any::<u32>(),
        0..=u32::MAX - RECORD_HEADER_LEN as u32,
        any::<[u64; 4]>(),
        any::<u64>(),
        any::<u32>(),
        any::<u32>(),
    )
        .prop_map(
            |(kind, volume, length, [seq, timestamp_ns, generation, back], offset, extra, crc)| {
                let payload_len = if kind.has_payload() { length } else { 0 };
                let min_span = RECORD_HEADER_LEN as u32 + payload_len;
                RecordHeader {
                    kind,
                    volume,
                    length,
                    seq,
                    timestamp_ns,
                    offset: offset.min(u64::MAX - u64::from(length)),
                    generation,
                    back: LogAddr(back),
                    span: min_span.saturating_add(extra % 4096),
                    payload_len,
                    payload_crc: crc,
                    volume_seq: seq ^ timestamp_ns,
                }
            },
        )
}

fn valid_superblock() -> impl Strategy<Value = Superblock> {
    (
        any::<u128>(),
        (1u16..=64).prop_flat_map(|count| (0..count, Just(count))),
        9u32..=16,
        1u64..=4096,
        1u64..=1024,
        0u64..=128,
        0u64..=1 << 20,
        any::<u64>(),
    )
        .prop_map(
            |(log_id, (device_index, device_count), shift, seg, count, data, slack, created)| {
                let align = 1u64 << shift;
                let segment_bytes = seg * align;
                let data_offset = data * align;
                Superblock {
                    log_id,
                    device_index,
                    device_count,
                    device_bytes: data_offset + segment_bytes * count + slack,
                    segment_bytes,
                    segment_count: count,
                    data_offset,
                    align_bytes: align as u32,
                    created_ns: created,
                }
            },
        )
}

fn encode(h: &RecordHeader) -> [u8; RECORD_HEADER_LEN] {
    let mut b = [0u8; RECORD_HEADER_LEN];
    h.encode(LOG_ID, &mut b);
    b
}

/// The header checksum as docs/FORMATS.md defines it, computed without the crate.
fn salted_crc(generation: u64, header: &[u8]) -> u32 {
    let mut v = LOG_ID.to_le_bytes().to_vec();
    v.extend_from_slice(&generation.to_le_bytes());
    v.extend_from_slice(&header[..76]);
    crc32c::crc32c(&v)
}

/// A segment image of batches laid out as the writer lays them out, and the records in it.
fn segment(batches: &[Vec<(RecordKind, u16)>], generation: u64) -> (Vec<u8>, Vec<Found>) {
    const ALIGN: usize = 512;
    let mut image = Vec::new();
    let mut found = Vec::new();
    let mut seq = 1;
    let mut back = LogAddr::NONE;
    for batch in batches {
        let len: usize = batch
            .iter()
            .map(|&(k, n)| RECORD_HEADER_LEN + if k.has_payload() { usize::from(n) } else { 0 })
            .sum();
        let padded = len.div_ceil(ALIGN) * ALIGN;
        let start = image.len();
        image.resize(start + padded, 0);
        let mut pos = 0;
        for (i, &(kind, n)) in batch.iter().enumerate() {
            let payload: Vec<u8> = if kind.has_payload() {
                (0..n).map(|j| (j as u8) ^ (seq as u8)).collect()
            } else {
                Vec::new()
            };
            let span = if i + 1 == batch.len() {
                padded - pos
            } else {
                RECORD_HEADER_LEN + payload.len()
            };
            let h = RecordHeader {
                kind,
                volume: 1,
                length: u32::from(n),
                seq,
                timestamp_ns: seq * 1000,
                offset: seq * 4096,
                generation,
                back,
                span: span as u32,
                payload_len: payload.len() as u32,
                payload_crc: crc32c::crc32c(&payload),
                volume_seq: 0,
            };
            let at = start + pos;
            image[at..at + RECORD_HEADER_LEN].copy_from_slice(&encode(&h));
            image[at + RECORD_HEADER_LEN..at + RECORD_HEADER_LEN + payload.len()]
                .copy_from_slice(&payload);
            let addr = LogAddr::new(0, at as u64);
            found.push(Found { header: h, addr });
            back = addr;
            seq += 1;
            pos += span;
        }
    }
    (image, found)
}

fn batches() -> impl Strategy<Value = Vec<Vec<(RecordKind, u16)>>> {
    prop::collection::vec(prop::collection::vec((kind(), 0u16..1500), 1..4), 1..5)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic_the_decoders(
        bytes in prop::collection::vec(any::<u8>(), 0..300),
        generation in any::<u64>(),
    ) {
        let _ = RecordHeader::decode(&bytes, LOG_ID, None);
        let _ = RecordHeader::decode(&bytes, LOG_ID, Some(generation));
        let _ = Superblock::decode(&bytes);
        let scan = parse_segment(LOG_ID, 0, 0, 0, &bytes);
        prop_assert!(scan.used_bytes <= bytes.len() as u64);
    }

    #[test]
    fn arbitrary_segments_never_panic_the_parser(
        bytes in prop::collection::vec(any::<u8>(), 0..8192),
        dev in any::<u8>(),
        base in any::<u64>(),
    ) {
        let scan = parse_segment(LOG_ID, dev, 7, base >> 8, &bytes);
        prop_assert!(scan.used_bytes <= bytes.len() as u64);
    }

    /// Random field values behind a valid magic, version and checksum reach the shape checks:
    /// decode never panics, and what it accepts re-encodes to the same bytes.
    #[test]
    fn checksummed_random_headers_decode_or_fail_cleanly(
        raw in any::<[u8; RECORD_HEADER_LEN]>(),
        kind_code in 0u8..=6,
        tail in prop::collection::vec(any::<u8>(), 0..2048),
    ) {
        let mut b = raw;
        b[0..4].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&FormatVersion::CURRENT.code().to_le_bytes());
        b[6] = kind_code;
        b[7] = 0;
        b[68..76].fill(0);
        let generation = u64::from_le_bytes(b[40..48].try_into().unwrap());
        let crc = salted_crc(generation, &b);
        b[76..80].copy_from_slice(&crc.to_le_bytes());
        match RecordHeader::decode(&b, LOG_ID, None) {
            Ok(h) => prop_assert_eq!(encode(&h), b),
            Err(e) => prop_assert!(
                matches!(e, FormatError::UnknownKind(_) | FormatError::Inconsistent(_)),
                "{:?}", e
            ),
        }
        // The same header in front of arbitrary bytes, as a segment.
        let mut seg = b.to_vec();
        seg.extend_from_slice(&tail);
        let scan = parse_segment(LOG_ID, 0, 0, 0, &seg);
        prop_assert!(scan.used_bytes <= seg.len() as u64);
    }

    #[test]
    fn valid_headers_roundtrip(h in valid_header()) {
        let b = encode(&h);
        prop_assert_eq!(RecordHeader::decode(&b, LOG_ID, Some(h.generation)), Ok(h));
        prop_assert_eq!(RecordHeader::decode(&b, LOG_ID, None), Ok(h));
        prop_assert_eq!(u32::from_le_bytes(b[76..80].try_into().unwrap()), salted_crc(h.generation, &b));
        // Another generation or another log: the salted checksum fails. (A one-bit change of
        // the salt is a burst CRC32C always detects.)
        prop_assert_eq!(
            RecordHeader::decode(&b, LOG_ID, Some(h.generation ^ 1)),
            Err(FormatError::BadChecksum)
        );
        prop_assert_eq!(
            RecordHeader::decode(&b, LOG_ID ^ (1 << 100), None),
            Err(FormatError::BadChecksum)
        );
    }

    #[test]
    fn valid_superblocks_roundtrip(s in valid_superblock()) {
        let b = s.encode();
        prop_assert_eq!(Superblock::decode(&b), Ok(s));
        prop_assert_eq!(s.segment_offset(0), s.data_offset);
    }

    #[test]
    fn log_addrs_roundtrip(dev in any::<u8>(), offset in 0u64..1 << 56) {
        let a = LogAddr::new(dev, offset);
        prop_assert_eq!((a.dev(), a.offset()), (usize::from(dev), offset));
    }

    #[test]
    fn segments_of_batches_parse_back(batches in batches(), generation in any::<u64>()) {
        let (mut image, found) = segment(&batches, generation);
        let end = image.len() as u64;
        image.resize(image.len() + 4096, 0);
        let scan = parse_segment(LOG_ID, 0, 0, 0, &image);
        prop_assert_eq!(&scan.records, &found);
        prop_assert_eq!(scan.generation, Some(generation));
        prop_assert_eq!(scan.used_bytes, end);
        prop_assert_eq!(scan.stop, Stop::NoRecord);
    }

    /// One damaged byte or a truncation: the parse returns the records before the damage, in
    /// order, and nothing else.
    #[test]
    fn damaged_segments_yield_a_prefix(
        batches in batches(),
        at in any::<prop::sample::Index>(),
        mask in 1u8..,
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    ) {
        let (mut image, found) = segment(&batches, 5);
        let damaged_at;
        if truncate {
            let keep = cut.index(image.len());
            image.truncate(keep);
            damaged_at = keep;
        } else {
            damaged_at = at.index(image.len());
            image[damaged_at] ^= mask;
        }
        let scan = parse_segment(LOG_ID, 0, 0, 0, &image);
        prop_assert!(scan.records.len() <= found.len());
        prop_assert_eq!(&scan.records[..], &found[..scan.records.len()]);
        // Every record lying wholly before the damage survives; the one hit does not (padding
        // after a batch's last record is not checksummed, so damage there is harmless).
        for (i, f) in found.iter().enumerate() {
            let start = f.addr.offset() as usize;
            let checked_end = start + RECORD_HEADER_LEN + f.header.payload_len as usize;
            let span_end = start + f.header.span as usize;
            if span_end <= damaged_at {
                prop_assert!(i < scan.records.len(), "record {} before the damage was lost", i);
            } else if start <= damaged_at && (damaged_at < checked_end || truncate) {
                prop_assert!(scan.records.len() <= i, "damaged record {} was accepted", i);
            }
        }
    }
}
