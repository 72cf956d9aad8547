#![allow(clippy::unwrap_used, clippy::expect_used)]

//! Decoding is canonical: frames whose checksums were recomputed after a change (so only the
//! semantic checks stand between them and acceptance) are refused, and no input panics.

use mariner_history::digest::format::{self, ENTRY_LEN, FILE_HEADER_LEN, FRAME_HEADER_LEN};
use mariner_history::DigestEntry;
use mariner_log::{LogAddr, RecordKind};

const SUMMARY_LEN: usize = format::SUMMARY_LEN;

fn entries() -> Vec<DigestEntry> {
    (0..6u64)
        .map(|i| DigestEntry {
            seq: 50 + i,
            volume: [3, 5, 3, 9, 5, 3][i as usize],
            kind: RecordKind::Write,
            volume_seq: 10 + i,
            timestamp_ns: 1000 + 10 * i,
            offset: 4096 * i,
            length: 4096,
            addr: LogAddr::new(0, 65536 + 8192 * i),
        })
        .collect()
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

/// Recomputes the three checksums of a frame from its (possibly edited) bytes.
fn reseal(b: &mut [u8]) {
    let volumes = le_u32(b, 12) as usize;
    let body = (FRAME_HEADER_LEN + volumes * SUMMARY_LEN).min(b.len());
    let s = crc32c::crc32c(&b[FRAME_HEADER_LEN..body]);
    let e = crc32c::crc32c(&b[body..]);
    b[48..52].copy_from_slice(&s.to_le_bytes());
    b[52..56].copy_from_slice(&e.to_le_bytes());
    let h = crc32c::crc32c(&b[..60]);
    b[60..64].copy_from_slice(&h.to_le_bytes());
}

/// The frame with `edit` applied and the checksums recomputed.
fn forged(edit: impl Fn(&mut Vec<u8>)) -> Vec<u8> {
    let mut b = format::encode_frame(&entries());
    edit(&mut b);
    reseal(&mut b);
    b
}

#[test]
fn a_resealed_frame_decodes_only_when_unchanged() {
    let b = forged(|_| {});
    assert_eq!(format::decode_frame(&b).unwrap(), entries());
    // 3 summaries (volumes 3, 5, 9) then 6 entries.
    let entry0 = FRAME_HEADER_LEN + 3 * SUMMARY_LEN;
    type Edit = Box<dyn Fn(&mut Vec<u8>)>;
    let cases: Vec<(&str, Edit)> = vec![
        ("entry reserved byte", Box::new(move |b| b[entry0 + 50] = 1)),
        ("unknown kind 0", Box::new(move |b| b[entry0 + 48] = 0)),
        ("unknown kind 9", Box::new(move |b| b[entry0 + 48] = 9)),
        ("header reserved u16", Box::new(|b| b[6] = 1)),
        ("header reserved u32", Box::new(|b| b[57] = 1)),
        ("min_ts", Box::new(|b| b[32] ^= 1)),
        ("max_ts", Box::new(|b| b[40] ^= 1)),
        ("first_seq", Box::new(|b| b[16] ^= 1)),
        ("last_seq", Box::new(|b| b[24] += 1)),
        (
            "summary counts moved between volumes",
            Box::new(|b| {
                b[FRAME_HEADER_LEN + 4] += 1;
                b[FRAME_HEADER_LEN + SUMMARY_LEN + 4] -= 1;
            }),
        ),
        (
            "summary max_vseq",
            Box::new(|b| b[FRAME_HEADER_LEN + 16] += 1),
        ),
        (
            "entries out of order",
            Box::new(move |b| {
                let (a, c) = (entry0, entry0 + ENTRY_LEN);
                let first: Vec<u8> = b[a..c].to_vec();
                b.copy_within(c..c + ENTRY_LEN, a);
                b[c..c + ENTRY_LEN].copy_from_slice(&first);
            }),
        ),
        ("entry volume", Box::new(move |b| b[entry0 + 40] = 4)),
        ("entry count zero", Box::new(|b| b[8..12].fill(0))),
        ("more volumes than bytes", Box::new(|b| b[12] = 200)),
        ("more entries than bytes", Box::new(|b| b[8] = 200)),
        ("version 2", Box::new(|b| b[4] = 2)),
        ("trailing byte", Box::new(|b| b.push(0))),
    ];
    for (what, edit) in cases {
        let b = forged(edit);
        assert!(format::decode_frame(&b).is_err(), "{what} was accepted");
    }
}

#[test]
fn a_file_image_needs_its_frames_in_order_from_its_first_sequence_number() {
    let e = entries();
    let good = format::encode_file_image(50, &[e[..3].to_vec(), e[3..].to_vec()]);
    assert!(format::decode_file_image(&good).is_ok());
    let wrong_start = format::encode_file_image(49, std::slice::from_ref(&e));
    assert!(format::decode_file_image(&wrong_start).is_err());
    let mut swapped = format::encode_file_header(53).to_vec();
    swapped.extend(format::encode_frame(&e[3..]));
    swapped.extend(format::encode_frame(&e[..3]));
    assert!(format::decode_file_image(&swapped).is_err());
    // Header only: a valid file without frames.
    let empty = format::encode_file_image(7, &[]);
    assert_eq!(empty.len(), FILE_HEADER_LEN);
    assert_eq!(format::decode_file_image(&empty).unwrap(), (7, vec![]));
}

#[test]
fn no_prefix_or_single_byte_edit_panics() {
    let e = entries();
    let file = format::encode_file_image(50, &[e[..3].to_vec(), e[3..].to_vec()]);
    for len in 0..=file.len() {
        mariner_history::fuzzing::fuzz_digest(&file[..len]);
        mariner_history::fuzzing::fuzz_digest(&file[FILE_HEADER_LEN.min(len)..len]);
    }
    for i in 0..file.len() {
        for v in [0u8, 1, 0x7f, 0xff] {
            let mut c = file.clone();
            c[i] = v;
            mariner_history::fuzzing::fuzz_digest(&c);
        }
    }
}
