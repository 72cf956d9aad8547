#![allow(clippy::unwrap_used, clippy::expect_used)]

//! Golden files for BOSC's own-log payloads (docs/FORMATS.md, "Own-log records"): the single
//! modification (`LoggedMod`) of both kinds and the batch record (`LoggedBatch`) are encoded and
//! compared byte for byte with `tests/golden/logged-*.bin`, the committed files decoded back,
//! and the fields found at the documented offsets. These payloads carry no checksum of their
//! own: the log record's payload CRC32C covers them (crates/log's golden files). Regenerate
//! only with a version change:
//!
//! ```text
//! MARINER_REGENERATE_GOLDEN=1 cargo test -p mariner-bosc --test golden_own_log
//! ```

use mariner_bosc::btree::Key;
use mariner_bosc::format::{
    LoggedBatch, LoggedMod, BATCH_CODE, BATCH_ENTRY_HEADER_LEN, BATCH_PREFIX_LEN, RECORD_PREFIX_LEN,
};
use mariner_bosc::Op;

#[path = "../../../tests/support/golden.rs"]
mod support;
use support::golden;

#[path = "support/golden_values.rs"]
mod values;
use values::{golden_leaf, le_u16, le_u32, le_u64, leaf_mod, PAYLOAD};

const GF: u64 = 0x0000_0011_2233_4455;
const LF: u64 = 0x0000_0011_2233_4400;

fn logged_app() -> LoggedMod {
    LoggedMod {
        op: Op::App,
        global_frontier: GF,
        local_frontier: LF,
        bytes: leaf_mod(1, Key::new(3, 100, 7), 0x1000_0000_0000_0013),
    }
}

fn logged_write() -> LoggedMod {
    LoggedMod {
        op: Op::Write,
        global_frontier: GF + 1,
        local_frontier: 0,
        bytes: golden_leaf(),
    }
}

fn encode_logged(m: &LoggedMod) -> Vec<u8> {
    LoggedMod::encode(m.op, m.global_frontier, m.local_frontier, &m.bytes)
}

#[test]
fn logged_modifications_match_their_golden_files() {
    for (file, m) in [
        ("logged-mod-app.bin", logged_app()),
        ("logged-mod-write.bin", logged_write()),
    ] {
        let committed = golden(file, &encode_logged(&m));
        assert_eq!(committed.len(), RECORD_PREFIX_LEN + m.bytes.len(), "{file}");
        assert_eq!(LoggedMod::decode(&committed), Some(m), "{file}");
    }
}

/// A batch record: a put to block 5, a whole-block write of block 6, a second put to block 5.
fn golden_batch() -> Vec<u8> {
    let mut b = LoggedBatch::new(GF);
    assert!(b.push(5, Op::App, LF, &leaf_mod(1, Key::new(3, 100, 7), 0x13)));
    assert!(b.push(6, Op::Write, 0, &golden_leaf()));
    assert!(b.push(5, Op::App, LF, &leaf_mod(1, Key::new(3, 100, 8), 0x14)));
    b.finish()
}

#[test]
fn logged_batch_matches_its_golden_file() {
    let committed = golden("logged-batch.bin", &golden_batch());
    let (gf, entries) = LoggedBatch::decode(&committed).unwrap();
    assert_eq!(gf, GF);
    let got: Vec<_> = entries
        .iter()
        .map(|e| (e.block, e.op, e.local_frontier, e.bytes.len()))
        .collect();
    assert_eq!(
        got,
        [
            (5, Op::App, LF, 29),
            (6, Op::Write, 0, PAYLOAD),
            (5, Op::App, LF, 29)
        ]
    );
    assert_eq!(entries[1].bytes, golden_leaf());
    assert_eq!(
        committed.len(),
        BATCH_PREFIX_LEN + 3 * BATCH_ENTRY_HEADER_LEN + 2 * 29 + PAYLOAD
    );
}

#[test]
fn logged_batch_fields_sit_at_documented_offsets() {
    let mut b = LoggedBatch::new(0xa1a2_a3a4_a5a6_a7a8);
    assert!(b.push(
        0xc1c2_c3c4_c5c6_c7c8,
        Op::Write,
        0xb1b2_b3b4_b5b6_b7b8,
        b"xyz"
    ));
    assert!(b.push(9, Op::App, 1, b""));
    let b = b.finish();
    assert_eq!(le_u16(&b, 0), 3, "version");
    assert_eq!(b[2], BATCH_CODE, "code");
    assert_eq!(b[2], 3);
    assert_eq!(le_u64(&b, 3), 0xa1a2_a3a4_a5a6_a7a8, "global frontier");
    assert_eq!(le_u32(&b, 11), 2, "count");
    assert_eq!(BATCH_PREFIX_LEN, 15);
    let e = BATCH_PREFIX_LEN;
    assert_eq!(le_u64(&b, e), 0xc1c2_c3c4_c5c6_c7c8, "block");
    assert_eq!(b[e + 8], 2, "op");
    assert_eq!(le_u64(&b, e + 9), 0xb1b2_b3b4_b5b6_b7b8, "local frontier");
    assert_eq!(le_u32(&b, e + 17), 3, "length");
    assert_eq!(BATCH_ENTRY_HEADER_LEN, 21);
    assert_eq!(&b[e + 21..e + 24], b"xyz");
    assert_eq!(le_u64(&b, e + 24), 9, "second entry's block");
    assert_eq!(b.len(), e + 24 + 21);
}

/// `LoggedMod` has no checksum of its own (the log record's payload CRC covers it); decode
/// rejects another version, unknown tags and short payloads.
#[test]
fn logged_modification_rejects_other_versions_unknown_tags_and_short_payloads() {
    let committed = golden("logged-mod-app.bin", &encode_logged(&logged_app()));
    for version in [0u16, 1, 2, 4, u16::MAX] {
        let mut c = committed.clone();
        c[0..2].copy_from_slice(&version.to_le_bytes());
        assert_eq!(LoggedMod::decode(&c), None, "version {version}");
    }
    for tag in [0u8, 3, 0xff] {
        let mut c = committed.clone();
        c[2] = tag;
        assert_eq!(LoggedMod::decode(&c), None, "tag {tag}");
    }
    assert_eq!(LoggedMod::decode(&committed[..RECORD_PREFIX_LEN - 1]), None);
    let empty = LoggedMod::decode(&committed[..RECORD_PREFIX_LEN]).unwrap();
    assert!(empty.bytes.is_empty());
}

#[test]
fn logged_mod_fields_sit_at_documented_offsets() {
    let b = LoggedMod::encode(
        Op::Write,
        0xa1a2_a3a4_a5a6_a7a8,
        0xb1b2_b3b4_b5b6_b7b8,
        b"xyz",
    );
    assert_eq!(le_u16(&b, 0), 3, "version");
    assert_eq!(b[2], 2, "op");
    assert_eq!(le_u64(&b, 3), 0xa1a2_a3a4_a5a6_a7a8, "global frontier");
    assert_eq!(le_u64(&b, 11), 0xb1b2_b3b4_b5b6_b7b8, "local frontier");
    assert_eq!(&b[19..], b"xyz");
}
