#![allow(clippy::unwrap_used, clippy::expect_used)]

//! Golden files for the TL digest format (docs/FORMATS.md, "History: TL digests") and the
//! history state's slot ("History state") and the pending-rollback file ("History: pending
//! rollback").
//!
//! A small fixed digest — two frames, every record kind, four volumes — is written by
//! `Digests` itself and compared byte for byte with `tests/golden/digest_v1.tld`; the
//! committed file is then decoded and compared with the entries, encoded again from them, and
//! opened as the digests of a directory. A change to the byte layout therefore fails here until the
//! file is regenerated on purpose (and the format version and docs changed with it):
//!
//! ```text
//! MARINER_REGENERATE_GOLDEN=1 cargo test -p mariner-history --test golden
//! ```

use mariner_history::digest::format::{
    self, ENTRY_LEN, FILE_HEADER_LEN, FRAME_HEADER_LEN, MAX_FRAME_ENTRIES, SUMMARY_LEN, VERSION,
};
use std::collections::BTreeMap;
use std::sync::Arc;

use mariner_disk::{Disk, MemDisk};
use mariner_history::digest::Digests;
use mariner_history::files::{DirFiles, Files};
use mariner_history::rollback_file::{self, RollbackRecord};
use mariner_history::state::{self, State, VolumeState, FLAG_BROKEN, FLAG_DELETED};
use mariner_history::DigestEntry;
use mariner_log::{LogAddr, RecordKind};

#[path = "../../../tests/support/golden.rs"]
mod support;
use support::{each_damaged_byte, golden};

const FIRST_SEQ: u64 = 1001;
const T0: u64 = 1_700_000_000_000_000_000;

#[allow(clippy::too_many_arguments)]
fn e(
    seq: u64,
    volume: u32,
    kind: RecordKind,
    volume_seq: u64,
    dt: u64,
    offset: u64,
    length: u32,
    addr: u64,
) -> DigestEntry {
    DigestEntry {
        seq,
        volume,
        kind,
        volume_seq,
        timestamp_ns: T0 + dt,
        offset,
        length,
        addr: LogAddr(addr),
    }
}

/// The fixed frames: one record of each kind over volumes 0 (the void), 7, 8 and 9, then two
/// more writes of volume 7 after a gap in the sequence numbers.
fn frames() -> Vec<Vec<DigestEntry>> {
    let at = |off: u64| LogAddr::new(1, (64 << 10) + off).0;
    vec![
        vec![
            e(
                1001,
                7,
                RecordKind::Write,
                41,
                10,
                0x0001_0000_2000,
                512,
                at(0),
            ),
            e(
                1002,
                7,
                RecordKind::Trim,
                42,
                20,
                0x40_0000,
                1 << 20,
                at(1024),
            ),
            e(
                1003,
                8,
                RecordKind::WriteZeroes,
                3,
                30,
                0x10_0000,
                64 << 10,
                at(1104),
            ),
            e(1004, 0, RecordKind::Void, 0, 40, 0, 0, at(1184)),
            e(
                1005,
                9,
                RecordKind::VolumeCreated,
                1,
                50,
                10 << 30,
                4096,
                at(1536),
            ),
            e(
                1006,
                9,
                RecordKind::VolumeResized,
                2,
                60,
                20 << 30,
                0,
                at(1616),
            ),
            e(1007, 9, RecordKind::VolumeDeleted, 3, 70, 0, 0, at(1696)),
            e(1008, 7, RecordKind::HistoryGap, 43, 80, T0 + 5, 0, at(2048)),
        ],
        vec![
            e(
                1010,
                7,
                RecordKind::Write,
                44,
                1_000_000_090,
                8192,
                4096,
                at(4096),
            ),
            e(
                1011,
                7,
                RecordKind::Write,
                45,
                1_000_000_090,
                12288,
                4096,
                at(8704),
            ),
        ],
    ]
}

/// The digests' name prefix, as the history engine uses it.
const PREFIX: &str = "digest-";

fn dir_files(dir: &std::path::Path) -> Arc<dyn Files> {
    Arc::new(DirFiles::new(dir).unwrap())
}

/// The file `Digests` writes for [`frames`].
fn written() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let (mut d, _) = Digests::open(dir_files(dir.path()), PREFIX).unwrap();
    for f in frames() {
        d.append(&f).unwrap();
    }
    d.sync().unwrap();
    std::fs::read(dir.path().join(format!("{PREFIX}{FIRST_SEQ:016x}.tld"))).unwrap()
}

fn committed() -> Vec<u8> {
    golden("digest_v1.tld", &written())
}

#[test]
fn the_golden_digest_decodes_to_its_entries_and_encodes_back() {
    let committed = committed();
    // 32-byte file header; frame 1: 64 + 4 summaries + 8 entries; frame 2: 64 + 40 + 2 × 56.
    assert_eq!(
        committed.len(),
        32 + (64 + 4 * 40 + 8 * 56) + (64 + 40 + 2 * 56)
    );
    let (first_seq, decoded) = format::decode_file_image(&committed).unwrap();
    assert_eq!(first_seq, FIRST_SEQ);
    assert_eq!(decoded, frames());
    assert_eq!(format::encode_file_image(FIRST_SEQ, &decoded), committed);
}

#[test]
fn the_golden_digest_opens_as_the_digests_of_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("digest-00000000000003e9.tld"), committed()).unwrap();
    let (d, opened) = Digests::open(dir_files(dir.path()), PREFIX).unwrap();
    assert_eq!((opened.last_seq, opened.frames, opened.files), (1011, 2, 1));
    assert_eq!(opened.truncated, None);
    let mut all = Vec::new();
    d.for_each(0, u64::MAX, None, |e| {
        all.push(*e);
        Ok(())
    })
    .unwrap();
    assert_eq!(all, frames().concat());
    let newest = d.newest_at_or_before(7, T0 + 1_000_000_000).unwrap();
    assert_eq!(newest.map(|e| e.seq), Some(1008));
    assert_eq!(d.by_volume_seq(9, 2).unwrap().map(|e| e.seq), Some(1006));
}

#[test]
fn every_damaged_byte_of_the_golden_digest_is_caught() {
    let committed = committed();
    each_damaged_byte(&committed, |c, i, mask| {
        assert!(
            format::decode_file_image(c).is_err(),
            "byte {i} ^ {mask:#04x} went unnoticed"
        );
    });
    for len in 0..committed.len() {
        let cut = &committed[..len];
        // A cut at a frame boundary is a shorter, valid file; anywhere else it is damage.
        let boundary = [32, 32 + 64 + 4 * 40 + 8 * 56].contains(&len);
        assert_eq!(
            format::decode_file_image(cut).is_ok(),
            boundary,
            "cut to {len}"
        );
    }
}

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
    assert_eq!(format::FILE_MAGIC, *b"MRNRTLD\0");
    assert_eq!(format::FRAME_MAGIC, *b"TLDF");
    assert_eq!(VERSION, 1);
    assert_eq!(
        (FILE_HEADER_LEN, FRAME_HEADER_LEN, SUMMARY_LEN, ENTRY_LEN),
        (32, 64, 40, 56)
    );
    assert_eq!(MAX_FRAME_ENTRIES, 65536);
}

/// The tables of docs/FORMATS.md: fields at their documented offsets, checksums over the
/// documented ranges.
#[test]
fn fields_sit_at_documented_offsets() {
    let b = committed();
    let fr = frames();
    // File header.
    assert_eq!(&b[0..8], b"MRNRTLD\0");
    assert_eq!(le_u16(&b, 8), 1);
    assert!(b[10..16].iter().all(|&x| x == 0));
    assert_eq!(le_u64(&b, 16), FIRST_SEQ);
    assert_eq!(le_u32(&b, 24), 0);
    assert_eq!(le_u32(&b, 28), crc32c::crc32c(&b[0..28]));
    // Frame 1 header at 32.
    let h = &b[32..32 + 64];
    assert_eq!(&h[0..4], b"TLDF");
    assert_eq!(le_u16(h, 4), 1);
    assert_eq!(le_u16(h, 6), 0);
    assert_eq!(le_u32(h, 8), 8, "entries");
    assert_eq!(le_u32(h, 12), 4, "volumes");
    assert_eq!(le_u64(h, 16), 1001, "first_seq");
    assert_eq!(le_u64(h, 24), 1008, "last_seq");
    assert_eq!(le_u64(h, 32), T0 + 10, "min_ts");
    assert_eq!(le_u64(h, 40), T0 + 80, "max_ts");
    let summaries = &b[96..96 + 4 * 40];
    let entries = &b[96 + 4 * 40..96 + 4 * 40 + 8 * 56];
    assert_eq!(le_u32(h, 48), crc32c::crc32c(summaries));
    assert_eq!(le_u32(h, 52), crc32c::crc32c(entries));
    assert_eq!(le_u32(h, 56), 0);
    assert_eq!(le_u32(h, 60), crc32c::crc32c(&h[0..60]));
    // Summaries, volumes ascending: 0, 7, 8, 9. Volume 7: three entries, numbers 41..43.
    let volumes: Vec<u32> = (0..4).map(|i| le_u32(summaries, i * 40)).collect();
    assert_eq!(volumes, [0, 7, 8, 9]);
    let s7 = &summaries[40..80];
    assert_eq!(le_u32(s7, 4), 3, "count");
    assert_eq!(
        (le_u64(s7, 8), le_u64(s7, 16)),
        (41, 43),
        "volume_seq min, max"
    );
    assert_eq!(
        (le_u64(s7, 24), le_u64(s7, 32)),
        (T0 + 10, T0 + 80),
        "ts min, max"
    );
    // Entries.
    for (i, want) in fr[0].iter().enumerate() {
        let x = &entries[i * 56..(i + 1) * 56];
        assert_eq!(le_u64(x, 0), want.seq);
        assert_eq!(le_u64(x, 8), want.volume_seq);
        assert_eq!(le_u64(x, 16), want.timestamp_ns);
        assert_eq!(le_u64(x, 24), want.offset);
        assert_eq!(le_u64(x, 32), want.addr.0);
        assert_eq!(le_u32(x, 40), want.volume);
        assert_eq!(le_u32(x, 44), want.length);
        assert_eq!(x[48], want.kind.code());
        assert!(x[49..56].iter().all(|&z| z == 0));
    }
}

/// The fixed state: every field set, each to its own value, so that two fields swapped or
/// moved change the bytes. Volume 5 is mid roll-forward and deleted; volume 0x1234_5678 broken.
fn fixed_state() -> State {
    let mut volumes = BTreeMap::new();
    volumes.insert(
        5,
        VolumeState {
            flags: FLAG_DELETED,
            levels: 0b1000_0101,
            block_size: 4096,
            size: 40 << 30,
            base_seq: 70_001,
            base_vseq: 3_002,
            base_ts: T0 + 11,
            rolling_seq: 80_003,
            rolling_vseq: 3_504,
            rolling_ts: T0 + 22,
        },
    );
    volumes.insert(
        0x1234_5678,
        VolumeState {
            flags: FLAG_BROKEN,
            levels: 1,
            block_size: 512,
            size: 1 << 20,
            base_seq: 60_005,
            base_vseq: 6,
            base_ts: T0 + 33,
            rolling_seq: 0,
            rolling_vseq: 0,
            rolling_ts: 0,
        },
    );
    State {
        generation: 9,
        indexed_seq: 90_007,
        indexed_ts: T0 + 44,
        pruned_seq: 50_008,
        volumes,
    }
}

fn committed_state() -> Vec<u8> {
    golden("state_v1.bin", &fixed_state().encode().unwrap())
}

#[test]
fn the_golden_state_decodes_to_its_fields_and_encodes_back() {
    let b = committed_state();
    assert_eq!(b.len(), 56 + 2 * 80);
    let s = State::decode(&b).unwrap().unwrap();
    assert_eq!(
        (s.generation, s.indexed_seq, s.indexed_ts, s.pruned_seq),
        (9, 90_007, T0 + 44, 50_008)
    );
    assert_eq!(
        s.volumes.keys().copied().collect::<Vec<_>>(),
        [5, 0x1234_5678]
    );
    let v = s.volumes[&5];
    assert_eq!(
        (v.flags, v.levels, v.block_size, v.size),
        (FLAG_DELETED, 0b1000_0101, 4096, 40 << 30)
    );
    assert_eq!(
        (v.base_seq, v.base_vseq, v.base_ts),
        (70_001, 3_002, T0 + 11)
    );
    assert_eq!(
        (v.rolling_seq, v.rolling_vseq, v.rolling_ts),
        (80_003, 3_504, T0 + 22)
    );
    let v = s.volumes[&0x1234_5678];
    assert_eq!(
        (v.flags, v.levels, v.block_size, v.size),
        (FLAG_BROKEN, 1, 512, 1 << 20)
    );
    assert_eq!((v.base_seq, v.base_vseq, v.base_ts), (60_005, 6, T0 + 33));
    assert_eq!((v.rolling_seq, v.rolling_vseq, v.rolling_ts), (0, 0, 0));
    assert_eq!(s.encode().unwrap(), b);
    // A slot is the same bytes padded with zeros, and `save` writes exactly that.
    let mut slot = b.clone();
    slot.resize(state::SLOT_BYTES, 0);
    assert_eq!(State::decode(&slot).unwrap(), Some(s.clone()));
    let disk = MemDisk::new(0);
    let mut saved = State {
        generation: 8,
        ..s.clone()
    };
    saved.save(&disk).unwrap();
    let mut got = vec![0u8; state::SLOT_BYTES];
    disk.read_at(&mut got, state::SLOT_BYTES as u64).unwrap();
    assert!(
        got == slot,
        "generation 9 is saved in slot B as the golden bytes"
    );
    assert_eq!(State::load(&disk).unwrap(), Some(s));
}

#[test]
fn every_damaged_byte_of_the_golden_state_is_caught() {
    let b = committed_state();
    each_damaged_byte(&b, |c, i, mask| {
        assert!(
            State::decode(c).is_err(),
            "byte {i} ^ {mask:#04x} went unnoticed"
        );
    });
}

/// The table of docs/FORMATS.md "History state": fields at their documented offsets.
#[test]
fn state_fields_sit_at_documented_offsets() {
    let b = committed_state();
    assert_eq!(state::MAGIC, *b"MRHSTATE");
    assert_eq!(
        (state::VERSION, state::HEADER_LEN, state::VOLUME_LEN),
        (1, 56, 80)
    );
    assert_eq!(state::SLOT_BYTES, 262_144);
    assert_eq!(state::MAX_VOLUMES, 3_276);
    assert_eq!(&b[0..8], b"MRHSTATE");
    assert_eq!(le_u16(&b, 8), 1);
    assert_eq!(le_u16(&b, 10), 0);
    assert_eq!(le_u32(&b, 12), 2, "count");
    assert_eq!(le_u64(&b, 16), 9, "generation");
    assert_eq!(le_u64(&b, 24), 90_007, "indexed_seq");
    assert_eq!(le_u64(&b, 32), T0 + 44, "indexed_ts");
    assert_eq!(le_u64(&b, 40), 50_008, "pruned_seq");
    let mut zeroed = b.clone();
    zeroed[48..52].fill(0);
    assert_eq!(le_u32(&b, 48), crc32c::crc32c(&zeroed), "crc");
    assert_eq!(le_u32(&b, 52), 0);
    let v = &b[56..136];
    assert_eq!(le_u32(v, 0), 5, "volume");
    assert_eq!(le_u32(v, 4), FLAG_DELETED, "flags");
    assert_eq!(le_u32(v, 8), 0b1000_0101, "levels");
    assert_eq!(le_u32(v, 12), 4096, "block_size");
    let fields = [40 << 30, 70_001, 3_002, T0 + 11, 80_003, 3_504, T0 + 22, 0];
    for (i, want) in fields.into_iter().enumerate() {
        assert_eq!(
            le_u64(v, 16 + 8 * i),
            want,
            "volume field at {}",
            16 + 8 * i
        );
    }
    assert_eq!(le_u32(&b[136..216], 0), 0x1234_5678);
    assert_eq!(le_u32(&b[136..216], 4), FLAG_BROKEN);
}

/// The fixed pending rollback: every field its own value.
fn fixed_rollback() -> RollbackRecord {
    RollbackRecord {
        volume: 0x0102_0304,
        generation: 7,
        to_vseq: 1_001,
        to_ts: T0 + 55,
        from_vseq: 2_002,
        from_ts: T0 + 66,
        cursor: 3 << 20,
        done_bytes: 2 << 20,
        total_bytes: 9 << 20,
    }
}

fn committed_rollback() -> Vec<u8> {
    golden("rollback_v1.bin", &fixed_rollback().encode())
}

#[test]
fn the_golden_rollback_decodes_to_its_fields_and_saves_in_its_slot() {
    let b = committed_rollback();
    assert_eq!(b.len(), rollback_file::RECORD_LEN);
    assert_eq!(RollbackRecord::decode(&b).unwrap(), Some(fixed_rollback()));
    let mut slot = b.clone();
    slot.resize(rollback_file::SLOT_BYTES, 0);
    assert_eq!(
        RollbackRecord::decode(&slot).unwrap(),
        Some(fixed_rollback())
    );
    // Generation 7 is odd: slot A; the next save (8) goes to B and wins; a torn B leaves A.
    let disk = MemDisk::new(0);
    fixed_rollback().save(&disk).unwrap();
    let mut got = vec![0u8; 2 * rollback_file::SLOT_BYTES];
    disk.read_at(&mut got, 0).unwrap();
    assert!(got[..rollback_file::SLOT_BYTES] == slot[..]);
    assert!(got[rollback_file::SLOT_BYTES..].iter().all(|&x| x == 0));
    let next = RollbackRecord {
        generation: 8,
        cursor: 4 << 20,
        ..fixed_rollback()
    };
    next.save(&disk).unwrap();
    assert_eq!(RollbackRecord::load(&disk).unwrap(), Some(next));
    disk.write_at(&[0xAB; 40], rollback_file::SLOT_BYTES as u64 + 30)
        .unwrap();
    assert_eq!(RollbackRecord::load(&disk).unwrap(), Some(fixed_rollback()));
    // Both slots damaged is an error; a first save cut short (B never written) is none.
    disk.write_at(&[0xAB; 40], 30).unwrap();
    assert!(RollbackRecord::load(&disk).is_err());
    let fresh = MemDisk::new(2 * rollback_file::SLOT_BYTES);
    fresh.write_at(&b[..40], 0).unwrap();
    assert_eq!(RollbackRecord::load(&fresh).unwrap(), None);
}

#[test]
fn every_damaged_byte_of_the_golden_rollback_is_caught() {
    let b = committed_rollback();
    each_damaged_byte(&b, |c, i, mask| {
        assert!(
            RollbackRecord::decode(c).is_err(),
            "byte {i} ^ {mask:#04x} went unnoticed"
        );
    });
}

/// The table of docs/FORMATS.md "History: pending rollback".
#[test]
fn rollback_fields_sit_at_documented_offsets() {
    let b = committed_rollback();
    assert_eq!(rollback_file::MAGIC, *b"MRHROLLB");
    assert_eq!(
        (
            rollback_file::VERSION,
            rollback_file::RECORD_LEN,
            rollback_file::SLOT_BYTES
        ),
        (1, 88, 512)
    );
    assert_eq!(&b[0..8], b"MRHROLLB");
    assert_eq!(le_u16(&b, 8), 1);
    assert_eq!(le_u16(&b, 10), 0);
    assert_eq!(le_u32(&b, 12), 0x0102_0304, "volume");
    let fields = [7, 1_001, T0 + 55, 2_002, T0 + 66, 3 << 20, 2 << 20, 9 << 20];
    for (i, want) in fields.into_iter().enumerate() {
        assert_eq!(le_u64(&b, 16 + 8 * i), want, "field at {}", 16 + 8 * i);
    }
    let mut zeroed = b.clone();
    zeroed[80..84].fill(0);
    assert_eq!(le_u32(&b, 80), crc32c::crc32c(&zeroed), "crc");
    assert_eq!(le_u32(&b, 84), 0);
}
