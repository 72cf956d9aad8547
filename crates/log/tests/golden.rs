#![allow(clippy::unwrap_used, clippy::expect_used)]

//! Golden files for the Trail log formats (docs/FORMATS.md, "Trail log").
//!
//! A fixed superblock, one record of each kind (header followed by its payload) and one
//! two-record batch laid out as the writer lays batches out are encoded and compared byte for
//! byte with the files committed under `tests/golden/`; the committed files are then decoded
//! and compared with the structs. A change to the byte layout therefore fails here until the
//! files are regenerated on purpose (and the format version and docs changed with them):
//!
//! ```text
//! MARINER_REGENERATE_GOLDEN=1 cargo test -p mariner-log --test golden
//! ```
//!
//! The `*_sit_at_documented_offsets` tests pin the tables of docs/FORMATS.md: distinctive field
//! values must appear at the documented offsets, and the checksums must be the documented ones
//! computed independently of the crate.

use mariner_log::format::{FormatVersion, RECORD_MAGIC, SUPERBLOCK_LEN, SUPERBLOCK_MAGIC};
use mariner_log::scan::{parse_segment, Stop};
use mariner_log::{
    FormatError, Found, LogAddr, RecordHeader, RecordKind, Superblock, DATA_OFFSET,
    RECORD_HEADER_LEN,
};

const LOG_ID: u128 = 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210;
const GENERATION: u64 = 9;
const ALIGN: u64 = 512;

// ---------------------------------------------------------------------------------------------
// Golden file plumbing

#[path = "../../../tests/support/golden.rs"]
mod support;
use support::{each_damaged_byte, golden};

// ---------------------------------------------------------------------------------------------
// The fixed values

fn superblock() -> Superblock {
    Superblock {
        log_id: LOG_ID,
        device_index: 1,
        device_count: 2,
        device_bytes: 1 << 30,
        segment_bytes: 4 << 20,
        segment_count: ((1 << 30) - DATA_OFFSET) / (4 << 20),
        data_offset: DATA_OFFSET,
        align_bytes: ALIGN as u32,
        created_ns: 1_700_000_000_123_456_789,
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(37).wrapping_add(seed))
        .collect()
}

fn round_up(n: u64, to: u64) -> u64 {
    n.div_ceil(to) * to
}

/// A header for `kind`, with `payload_len` and `payload_crc` filled in from `payload`, and a
/// volume sequence number of `seq - 960` (0 for a void).
#[allow(clippy::too_many_arguments)]
fn header(
    kind: RecordKind,
    volume: u32,
    offset: u64,
    length: u32,
    seq: u64,
    back: LogAddr,
    span: u32,
    payload: &[u8],
) -> RecordHeader {
    RecordHeader {
        kind,
        volume,
        length,
        seq,
        timestamp_ns: 1_700_000_000_000_000_000 + seq,
        offset,
        generation: GENERATION,
        back,
        span,
        payload_len: payload.len() as u32,
        payload_crc: crc32c::crc32c(payload),
        volume_seq: if kind == RecordKind::Void {
            0
        } else {
            seq - 960
        },
    }
}

struct GoldenRecord {
    file: &'static str,
    header: RecordHeader,
    payload: Vec<u8>,
}

/// One record of each kind, as the writer would put them on device 1 at the start of segment 3:
/// the write alone in a first batch (span 80 + 512 padded to 1024; no previous record since
/// open, so `back` is none), then a second batch of trim, write-zeroes and void (spans 80, 80,
/// and 512 − 160 = 352 for the last, which covers the padding), then a third of the volume
/// lifecycle and a history gap (spans 80, 80, 80 and 512 − 240 = 272). A write carries
/// `length` bytes of payload; the others none. Created: `offset` the size (10 GiB), `length`
/// the block size; resized: `offset` the new size; gap: `offset` the timestamp it starts at.
fn records() -> Vec<GoldenRecord> {
    let data = pattern(512, 11);
    let write_span = round_up(RECORD_HEADER_LEN as u64 + 512, ALIGN) as u32;
    let at = |off: u64| LogAddr::new(1, DATA_OFFSET + 3 * (4 << 20) + off);
    vec![
        GoldenRecord {
            file: "record-write.bin",
            header: header(
                RecordKind::Write,
                7,
                0x0001_0000_2000,
                512,
                1001,
                LogAddr::NONE,
                write_span,
                &data,
            ),
            payload: data,
        },
        GoldenRecord {
            file: "record-trim.bin",
            header: header(
                RecordKind::Trim,
                7,
                0x40_0000,
                1 << 20,
                1002,
                at(0),
                RECORD_HEADER_LEN as u32,
                &[],
            ),
            payload: Vec::new(),
        },
        GoldenRecord {
            file: "record-write-zeroes.bin",
            header: header(
                RecordKind::WriteZeroes,
                8,
                0x10_0000,
                64 << 10,
                1003,
                at(1024),
                RECORD_HEADER_LEN as u32,
                &[],
            ),
            payload: Vec::new(),
        },
        GoldenRecord {
            file: "record-void.bin",
            header: header(RecordKind::Void, 0, 0, 0, 1004, at(1104), 352, &[]),
            payload: Vec::new(),
        },
        GoldenRecord {
            file: "record-volume-created.bin",
            header: header(
                RecordKind::VolumeCreated,
                9,
                10 << 30,
                4096,
                1005,
                at(1184),
                RECORD_HEADER_LEN as u32,
                &[],
            ),
            payload: Vec::new(),
        },
        GoldenRecord {
            file: "record-volume-resized.bin",
            header: header(
                RecordKind::VolumeResized,
                9,
                20 << 30,
                0,
                1006,
                at(1536),
                RECORD_HEADER_LEN as u32,
                &[],
            ),
            payload: Vec::new(),
        },
        GoldenRecord {
            file: "record-volume-deleted.bin",
            header: header(
                RecordKind::VolumeDeleted,
                9,
                0,
                0,
                1007,
                at(1616),
                RECORD_HEADER_LEN as u32,
                &[],
            ),
            payload: Vec::new(),
        },
        GoldenRecord {
            file: "record-history-gap.bin",
            header: header(
                RecordKind::HistoryGap,
                7,
                1_700_000_000_000_000_500,
                0,
                1008,
                at(1696),
                272,
                &[],
            ),
            payload: Vec::new(),
        },
    ]
}

fn encode_record(h: &RecordHeader, payload: &[u8]) -> Vec<u8> {
    let mut hb = [0u8; RECORD_HEADER_LEN];
    h.encode(LOG_ID, &mut hb);
    let mut out = hb.to_vec();
    out.extend_from_slice(payload);
    out
}

/// Device, offset and back pointer of the golden batch: the second batch of segment 4 on
/// device 1, after a first batch of one 1024-byte record.
const BATCH_DEV: u8 = 1;
fn batch_offset() -> u64 {
    superblock().segment_offset(4) + 1024
}
fn batch_back() -> LogAddr {
    LogAddr::new(BATCH_DEV, superblock().segment_offset(4))
}

/// The golden batch's records before layout: generation, back pointer and span are the
/// writer's to fill in.
fn batch_entries() -> Vec<(RecordHeader, Vec<u8>)> {
    let data = pattern(512, 200);
    let write = header(
        RecordKind::Write,
        3,
        8192,
        512,
        2000,
        LogAddr::NONE,
        0,
        &data,
    );
    let trim = header(
        RecordKind::Trim,
        3,
        1 << 30,
        256 << 10,
        2001,
        LogAddr::NONE,
        0,
        &[],
    );
    vec![(write, data), (trim, Vec::new())]
}

/// Lays a batch out exactly as `writer::start_write` does: records back to back from `offset`
/// (a multiple of `align`), each with the segment's generation and a back pointer to the
/// previous record on the device; each record's span is its header plus payload, except the
/// last's, which also covers the zero padding up to the alignment.
fn lay_out(
    dev: u8,
    offset: u64,
    align: u64,
    generation: u64,
    mut back: LogAddr,
    entries: &[(RecordHeader, Vec<u8>)],
) -> (Vec<u8>, Vec<Found>) {
    let bytes: u64 = entries
        .iter()
        .map(|(h, _)| RECORD_HEADER_LEN as u64 + u64::from(h.payload_len))
        .sum();
    let padded = round_up(bytes, align) as usize;
    let mut buf = vec![0u8; padded];
    let mut found = Vec::new();
    let mut pos = 0usize;
    for (i, (h, payload)) in entries.iter().enumerate() {
        let mut h = *h;
        let addr = LogAddr::new(dev, offset + pos as u64);
        let span = if i + 1 == entries.len() {
            padded - pos
        } else {
            RECORD_HEADER_LEN + payload.len()
        };
        h.generation = generation;
        h.back = back;
        h.span = span as u32;
        let rec = encode_record(&h, payload);
        buf[pos..pos + rec.len()].copy_from_slice(&rec);
        found.push(Found { header: h, addr });
        back = addr;
        pos += span;
    }
    (buf, found)
}

fn golden_batch() -> (Vec<u8>, Vec<Found>) {
    lay_out(
        BATCH_DEV,
        batch_offset(),
        ALIGN,
        GENERATION,
        batch_back(),
        &batch_entries(),
    )
}

// ---------------------------------------------------------------------------------------------
// Encoding matches the committed files; the committed files decode to the structs

#[test]
fn superblock_matches_its_golden_file() {
    let sb = superblock();
    let committed = golden("superblock.bin", &sb.encode());
    assert_eq!(committed.len(), SUPERBLOCK_LEN);
    assert_eq!(Superblock::decode(&committed), Ok(sb));
}

#[test]
fn records_match_their_golden_files() {
    for r in records() {
        let committed = golden(r.file, &encode_record(&r.header, &r.payload));
        assert_eq!(
            committed.len(),
            RECORD_HEADER_LEN + r.payload.len(),
            "{}",
            r.file
        );
        let expected_gen = Some(r.header.generation);
        for expected in [None, expected_gen] {
            let h = RecordHeader::decode(&committed, LOG_ID, expected).unwrap();
            assert_eq!(h, r.header, "{}", r.file);
            assert_eq!(
                h.verify_payload(&committed[RECORD_HEADER_LEN..]),
                Ok(()),
                "{}",
                r.file
            );
        }
        assert_eq!(
            r.header.payload_len > 0,
            r.header.kind.has_payload(),
            "{}",
            r.file
        );
    }
}

#[test]
fn the_golden_set_has_one_record_of_each_kind() {
    let kinds: Vec<RecordKind> = records().iter().map(|r| r.header.kind).collect();
    assert_eq!(
        kinds,
        [
            RecordKind::Write,
            RecordKind::Trim,
            RecordKind::WriteZeroes,
            RecordKind::Void,
            RecordKind::VolumeCreated,
            RecordKind::VolumeResized,
            RecordKind::VolumeDeleted,
            RecordKind::HistoryGap,
        ]
    );
}

/// Version 1 records (committed before version 2 existed, `tests/golden/v1/`) still decode:
/// the bytes version 2 gives the volume sequence number were reserved zeros, so they read as
/// 0, not stamped.
#[test]
fn version_1_records_still_decode_unstamped() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/v1");
    for r in records().into_iter().take(2) {
        let committed = std::fs::read(dir.join(r.file)).unwrap();
        assert_eq!(u16::from_le_bytes([committed[4], committed[5]]), 1);
        let h = RecordHeader::decode(&committed, LOG_ID, None).unwrap();
        let want = RecordHeader {
            volume_seq: 0,
            ..r.header
        };
        assert_eq!(h, want, "{}", r.file);
        h.verify_payload(&committed[RECORD_HEADER_LEN..]).unwrap();
    }
}

#[test]
fn batch_matches_its_golden_file_and_parses_back() {
    let (encoded, expected) = golden_batch();
    let committed = golden("batch.bin", &encoded);
    // 80 + 512 + 80 bytes of records, padded to 1024.
    assert_eq!(committed.len(), 1024);
    assert_eq!(expected[0].header.span, 592);
    assert_eq!(expected[1].header.span, 1024 - 592);
    assert!(committed[592 + RECORD_HEADER_LEN..].iter().all(|&b| b == 0));

    // The batch alone: the spans tile it exactly.
    let scan = parse_segment(LOG_ID, BATCH_DEV, 4, batch_offset(), &committed);
    assert_eq!(scan.records, expected);
    assert_eq!(scan.generation, Some(GENERATION));
    assert_eq!(scan.stop, Stop::End);
    assert_eq!(scan.used_bytes, 1024);

    // Followed by the zeros of unwritten space: the parse stops there.
    let mut segment = committed.clone();
    segment.resize(8192, 0);
    let scan = parse_segment(LOG_ID, BATCH_DEV, 4, batch_offset(), &segment);
    assert_eq!(scan.records, expected);
    assert_eq!(scan.stop, Stop::NoRecord);
    assert_eq!(scan.used_bytes, 1024);

    // Back pointers chain the device's records.
    assert_eq!(scan.records[0].header.back, batch_back());
    assert_eq!(scan.records[1].header.back, scan.records[0].addr);
    assert_eq!(
        scan.records[1].addr,
        LogAddr::new(BATCH_DEV, batch_offset() + 592)
    );
}

// ---------------------------------------------------------------------------------------------
// Damage to any single byte is caught

#[test]
fn every_damaged_byte_of_a_golden_record_is_caught() {
    for r in records() {
        let committed = golden(r.file, &encode_record(&r.header, &r.payload));
        each_damaged_byte(&committed, |c, i, mask| {
            for expected in [None, Some(GENERATION)] {
                let ok = RecordHeader::decode(c, LOG_ID, expected)
                    .and_then(|h| h.verify_payload(&c[RECORD_HEADER_LEN..]));
                assert!(
                    ok.is_err(),
                    "{}: byte {i} ^ {mask:#04x} went unnoticed (expected generation {expected:?})",
                    r.file
                );
            }
        });
    }
}

#[test]
fn every_damaged_byte_of_the_golden_superblock_is_caught() {
    let committed = golden("superblock.bin", &superblock().encode());
    each_damaged_byte(&committed, |c, i, mask| {
        assert!(
            Superblock::decode(c).is_err(),
            "byte {i} ^ {mask:#04x} went unnoticed"
        );
    });
}

/// Damage inside a record ends the parse before that record; the zero padding after the last
/// record is covered by its span but by no checksum, so damage there changes nothing.
#[test]
fn every_damaged_byte_of_the_golden_batch_ends_the_parse_at_its_record() {
    let (encoded, expected) = golden_batch();
    let committed = golden("batch.bin", &encoded);
    let second = 592;
    let records_end = second + RECORD_HEADER_LEN;
    for i in 0..committed.len() {
        let mut c = committed.clone();
        c[i] ^= 0xff;
        let scan = parse_segment(LOG_ID, BATCH_DEV, 4, batch_offset(), &c);
        let intact = if i < second {
            0
        } else if i < records_end {
            1
        } else {
            2
        };
        assert_eq!(scan.records, expected[..intact], "byte {i}");
        if intact < 2 {
            assert_ne!(scan.stop, Stop::End, "byte {i}");
        }
    }
}

#[test]
fn a_golden_record_read_with_another_generation_or_log_fails() {
    for r in records() {
        let committed = golden(r.file, &encode_record(&r.header, &r.payload));
        assert_eq!(
            RecordHeader::decode(&committed, LOG_ID, Some(GENERATION + 1)),
            Err(FormatError::BadChecksum),
            "{}",
            r.file
        );
        assert_eq!(
            RecordHeader::decode(&committed, LOG_ID ^ 1, None),
            Err(FormatError::BadChecksum),
            "{}",
            r.file
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The documented layout

fn le_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().unwrap())
}
fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

#[test]
fn constants_are_the_documented_ones() {
    assert_eq!(RECORD_HEADER_LEN, 80);
    assert_eq!(SUPERBLOCK_LEN, 128);
    assert_eq!(DATA_OFFSET, 64 * 1024);
    assert_eq!(RECORD_MAGIC.to_le_bytes(), *b"MRNR");
    assert_eq!(RECORD_MAGIC, 0x524e_524d);
    assert_eq!(SUPERBLOCK_MAGIC, *b"MRNRLOG\0");
    assert_eq!(FormatVersion::CURRENT.code(), 2);
    assert_eq!(FormatVersion::from_code(1), Ok(FormatVersion::V1));
    assert_eq!(FormatVersion::from_code(2), Ok(FormatVersion::V2));
    for code in [0, 3, u16::MAX] {
        assert_eq!(
            FormatVersion::from_code(code),
            Err(FormatError::UnsupportedVersion(code))
        );
    }
    let kinds = [
        (1, RecordKind::Write, true),
        (2, RecordKind::Trim, false),
        (3, RecordKind::WriteZeroes, false),
        (4, RecordKind::Void, false),
        (5, RecordKind::VolumeCreated, false),
        (6, RecordKind::VolumeResized, false),
        (7, RecordKind::VolumeDeleted, false),
        (8, RecordKind::HistoryGap, false),
    ];
    for (code, kind, payload) in kinds {
        assert_eq!(kind.code(), code);
        assert_eq!(RecordKind::from_code(code), Ok(kind));
        assert_eq!(kind.has_payload(), payload);
        assert_eq!(kind.changes_data(), code <= 3);
    }
    for code in [0, 9, u8::MAX] {
        assert_eq!(
            RecordKind::from_code(code),
            Err(FormatError::UnknownKind(code))
        );
    }
    // The CRC32C the docs name (Castagnoli; standard check value).
    assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
    assert_eq!(crc32c::crc32c(&[]), 0);
}

#[test]
fn log_addr_packing_is_the_documented_one() {
    let a = LogAddr::new(0xab, 0x0012_3456_789a_bcde);
    assert_eq!(a.0, 0xab12_3456_789a_bcde);
    assert_eq!((a.dev(), a.offset()), (0xab, 0x0012_3456_789a_bcde));
    // The offset is masked to 56 bits.
    assert_eq!(LogAddr::new(1, (1 << 56) | 5), LogAddr::new(1, 5));
    assert_eq!(LogAddr::NONE.0, 0);
    assert_eq!(LogAddr::new(0, 0), LogAddr::NONE);
}

#[test]
fn record_fields_sit_at_documented_offsets() {
    let h = RecordHeader {
        kind: RecordKind::Write,
        volume: 0xa1a2_a3a4,
        length: 0x0b1b_2b3b,
        seq: 0xd1d2_d3d4_d5d6_d7d8,
        timestamp_ns: 0xe1e2_e3e4_e5e6_e7e8,
        offset: 0x0f1f_2f3f_4f5f_6f7f,
        generation: 0x1112_1314_1516_1718,
        back: LogAddr(0x2122_2324_2526_2728),
        span: 0x0c1c_2c3c,
        payload_len: 0x0b1b_2b3b,
        payload_crc: 0x3132_3334,
        volume_seq: 0x7172_7374_7576_7778,
    };
    let mut b = [0u8; RECORD_HEADER_LEN];
    h.encode(LOG_ID, &mut b);

    assert_eq!(&b[0..4], b"MRNR");
    assert_eq!(le_u16(&b, 4), 2, "version");
    assert_eq!(b[6], 1, "kind");
    assert_eq!(b[7], 0, "flags");
    assert_eq!(le_u32(&b, 8), h.volume);
    assert_eq!(le_u32(&b, 12), h.length);
    assert_eq!(le_u64(&b, 16), h.seq);
    assert_eq!(le_u64(&b, 24), h.timestamp_ns);
    assert_eq!(le_u64(&b, 32), h.offset);
    assert_eq!(le_u64(&b, 40), h.generation);
    assert_eq!(le_u64(&b, 48), h.back.0);
    assert_eq!(le_u32(&b, 56), h.span);
    assert_eq!(le_u32(&b, 60), h.payload_len);
    assert_eq!(le_u32(&b, 64), h.payload_crc);
    assert_eq!(le_u64(&b, 68), h.volume_seq, "volume_seq");

    // header_crc = CRC32C(log_id LE 16 bytes ‖ generation LE 8 bytes ‖ header bytes 0..76).
    let mut salted = Vec::new();
    salted.extend_from_slice(&LOG_ID.to_le_bytes());
    salted.extend_from_slice(&h.generation.to_le_bytes());
    salted.extend_from_slice(&b[..76]);
    assert_eq!(le_u32(&b, 76), crc32c::crc32c(&salted), "header_crc");

    assert_eq!(RecordHeader::decode(&b, LOG_ID, Some(h.generation)), Ok(h));
}

#[test]
fn superblock_fields_sit_at_documented_offsets() {
    let s = Superblock {
        log_id: 0x3132_3334_3536_3738_393a_3b3c_3d3e_3f40,
        device_index: 0x0102,
        device_count: 0x0304,
        device_bytes: 0x4142_4344_4546_4748,
        segment_bytes: 0x5152_5354_5556_5758,
        segment_count: 0x6162_6364_6566_6768,
        data_offset: 0x7172_7374_7576_7778,
        align_bytes: 0x8182_8384,
        created_ns: 0x9192_9394_9596_9798,
    };
    let b = s.encode();

    assert_eq!(&b[0..8], b"MRNRLOG\0");
    assert_eq!(le_u16(&b, 8), 2, "version");
    assert_eq!(le_u16(&b, 10), s.device_index);
    assert_eq!(le_u16(&b, 12), s.device_count);
    assert_eq!(b[14..16], [0; 2], "reserved");
    assert_eq!(b[16..32], s.log_id.to_le_bytes());
    assert_eq!(le_u64(&b, 32), s.device_bytes);
    assert_eq!(le_u64(&b, 40), s.segment_bytes);
    assert_eq!(le_u64(&b, 48), s.segment_count);
    assert_eq!(le_u64(&b, 56), s.data_offset);
    assert_eq!(le_u32(&b, 64), s.align_bytes);
    assert_eq!(b[68..72], [0; 4], "reserved");
    assert_eq!(le_u64(&b, 72), s.created_ns);
    assert!(b[80..124].iter().all(|&x| x == 0), "reserved");
    assert_eq!(le_u32(&b, 124), crc32c::crc32c(&b[..124]), "crc");
}
