#![allow(clippy::unwrap_used, clippy::expect_used)]

//! Golden files for the BOSC formats (docs/FORMATS.md, "BOSC data disk and records").
//!
//! Fixed examples of every structure BOSC writes — checkpoint slot, sealed block, B+tree leaf
//! payload and leaf modifications, hash page and hash put, and a whole small data disk after
//! format, three modifications and one commit cycle — are encoded and compared byte for byte with the files committed under
//! `tests/golden/`; the committed files are then decoded and compared with the values. A
//! change to the byte layout therefore fails here until the files are regenerated on purpose
//! (and the format version and docs changed with them):
//!
//! ```text
//! MARINER_REGENERATE_GOLDEN=1 cargo test -p mariner-bosc --test golden
//! ```
//!
//! The B+tree and hash modification encoders are private to their modules; their golden files
//! are built here from the documented layout and pinned against the public commit functions
//! (`LeafApp`, `HashApp`) that decode them. The `*_sit_at_documented_offsets` tests pin the
//! tables of docs/FORMATS.md, with the checksums computed independently of the crate. The
//! own-log payloads have theirs in `golden_own_log.rs`, the router image in `golden_router.rs`;
//! the fixed values they share are in `support/golden_values.rs`.

use std::sync::Arc;

use mariner_bosc::btree::{leaf_capacity, leaf_payload, Key, LeafApp, LEAF_HEADER_LEN, LEAF_MAGIC};
use mariner_bosc::format::{
    check_block, seal_block, BlockError, BlockHeader, Checkpoint, CheckpointError, DiskId,
    Geometry, BLOCK_HEADER_LEN, BLOCK_MAGIC, CKPT_LEN, CKPT_MAGIC, CKPT_SLOTS, CKPT_VERSION,
    DW_OFFSET, FORMAT_VERSION, RECORD_PREFIX_LEN, RECORD_VERSION,
};
use mariner_bosc::hash::{
    check_page, page_capacity, page_count, page_get, page_put, HashApp, PAGE_HEADER_LEN, PAGE_MAGIC,
};
use mariner_bosc::{btree, hash, BlockApp, Bosc, BoscConfig, Durability, Error, Op};
use mariner_disk::{Disk, MemDisk};

// ---------------------------------------------------------------------------------------------
// Golden file plumbing (as in crates/log/tests/golden.rs)

#[path = "../../../tests/support/golden.rs"]
mod support;
use support::{each_damaged_byte, golden};

#[path = "support/golden_values.rs"]
mod values;
use values::{
    golden_leaf, le_u16, le_u32, le_u64, leaf_fence, leaf_mod, leaf_records, pattern, BLOCK,
    DISK_ID, OTHER_DISK, PAYLOAD,
};

// ---------------------------------------------------------------------------------------------
// The fixed values

fn checkpoint() -> Checkpoint {
    Checkpoint {
        geometry: Geometry {
            block_bytes: 4096,
            block_count: 1 << 20,
            max_run: 32,
            dw_runs: 8,
            shadow: false,
        },
        counter: 7,
        checkpoint: 0x0123_4567,
        disk_id: DISK_ID,
    }
}

const BLOCK_LSN: u64 = 0x0102_0304_0506_0708;
const BLOCK_NO: u64 = 7;

/// A sealed 512-byte block: header, then a patterned payload.
fn sealed_block() -> Vec<u8> {
    let mut img = vec![0u8; BLOCK];
    img[BLOCK_HEADER_LEN..].copy_from_slice(&pattern(PAYLOAD, 5));
    seal_block(&mut img, DISK_ID, BLOCK_LSN, BLOCK_NO);
    img
}

fn hash_records() -> Vec<(u64, u64)> {
    vec![
        (0x0a0a_0a0a_0a0a_0a01, 0xb0b0_b0b0_b0b0_b001),
        (42, 4242),
        (u64::MAX, 1),
    ]
}

fn golden_hash_page() -> Vec<u8> {
    let mut p = vec![0u8; PAYLOAD];
    for (k, v) in hash_records() {
        assert!(page_put(&mut p, k, v));
    }
    p
}

/// The hash put as `HashApp` reads it: key u64, value u64.
fn hash_put(key: u64, value: u64) -> Vec<u8> {
    let mut m = key.to_le_bytes().to_vec();
    m.extend_from_slice(&value.to_le_bytes());
    m
}

/// The golden data disk: 4 blocks of 512 bytes, runs of at most 2.
fn disk_cfg() -> BoscConfig {
    BoscConfig {
        block_bytes: BLOCK as u32,
        block_count: 4,
        max_run: 2,
        dw_runs: 2,
        background: None,
        ..BoscConfig::default()
    }
}

/// Caller positions and hash puts of the golden data disk: (position, block, key, value).
const DISK_PUTS: [(u64, u64, u64, u64); 3] = [(1, 0, 11, 111), (2, 1, 22, 222), (3, 0, 33, 333)];

/// Formats a fresh disk, applies `DISK_PUTS` in caller-durable mode and runs one commit cycle:
/// blocks 0 and 1 are one run, so the double-write area holds them, they are written in place
/// and checkpoint counter 2 (position 3) goes to its slot.
fn build_disk() -> Vec<u8> {
    let disk = Arc::new(MemDisk::new(0));
    let dyn_disk: Arc<dyn Disk> = disk.clone();
    Bosc::<HashApp>::format_with_id(dyn_disk.as_ref(), &disk_cfg(), DISK_ID).unwrap();
    let (b, report) = Bosc::open(
        dyn_disk.clone(),
        disk_cfg(),
        Durability::Caller,
        Arc::new(HashApp),
    )
    .unwrap();
    assert_eq!(report.checkpoint, 0);
    for (pos, block, k, v) in DISK_PUTS {
        b.modify_at(block, &hash_put(k, v), pos).unwrap();
    }
    assert_eq!(b.commit_cycle().unwrap(), 2);
    assert_eq!(b.checkpoint(), 3);
    b.close();
    drop(b);
    let mut image = vec![0u8; dyn_disk.len().unwrap() as usize];
    dyn_disk.read_at(&mut image, 0).unwrap();
    image
}

fn disk_geometry() -> Geometry {
    Geometry {
        block_bytes: BLOCK as u32,
        block_count: 4,
        max_run: 2,
        dw_runs: 2,
        shadow: false,
    }
}

// ---------------------------------------------------------------------------------------------
// Encoding matches the committed files; the committed files decode to the values

#[test]
fn checkpoint_matches_its_golden_file() {
    let c = checkpoint();
    let committed = golden("checkpoint.bin", &c.encode());
    assert_eq!(committed.len(), CKPT_LEN);
    assert_eq!(Checkpoint::decode(&committed), Ok(c));
}

#[test]
fn block_matches_its_golden_file() {
    let committed = golden("block.bin", &sealed_block());
    assert_eq!(committed.len(), BLOCK);
    assert_eq!(
        check_block(&committed, DISK_ID, Some(BLOCK_NO)),
        Ok(BlockHeader {
            lsn: BLOCK_LSN,
            block: BLOCK_NO
        })
    );
    assert_eq!(
        check_block(&committed, DISK_ID, None).map(|h| h.block),
        Ok(BLOCK_NO)
    );
    assert_eq!(
        check_block(&committed, DISK_ID, Some(BLOCK_NO + 1)),
        Err(BlockError::Misdirected {
            found: BLOCK_NO,
            expected: BLOCK_NO + 1
        })
    );
    assert_eq!(committed[BLOCK_HEADER_LEN..], pattern(PAYLOAD, 5)[..]);
}

#[test]
fn leaf_payload_matches_its_golden_file() {
    let committed = golden("btree-leaf.bin", &golden_leaf());
    assert_eq!(committed.len(), PAYLOAD);
    // Decoded by the documented layout: the leaf decoder is private to the tree.
    assert_eq!(committed[0..4], LEAF_MAGIC);
    let count = le_u32(&committed, 4) as usize;
    assert_eq!(Key::decode(&committed[8..28]), leaf_fence());
    let records: Vec<(Key, u64)> = (0..count)
        .map(|i| {
            let at = LEAF_HEADER_LEN + i * btree::RECORD_LEN;
            (
                Key::decode(&committed[at..at + 20]),
                le_u64(&committed, at + 20),
            )
        })
        .collect();
    assert_eq!(records, leaf_records());
    let end = LEAF_HEADER_LEN + count * btree::RECORD_LEN;
    assert!(committed[end..].iter().all(|&b| b == 0), "unused tail");
}

/// Each leaf modification's golden bytes, replayed through `LeafApp`, do what the docs say.
#[test]
fn leaf_modifications_match_their_golden_files() {
    let [(k0, v0), (k1, v1), (k2, v2)]: [(Key, u64); 3] = leaf_records().try_into().unwrap();
    let put = golden("btree-mod-put.bin", &leaf_mod(1, k1, v1));
    let delete = golden("btree-mod-delete.bin", &leaf_mod(2, k0, 0));
    let keep_below = golden("btree-mod-keep-below.bin", &leaf_mod(3, k2, 0));
    // Drop volume 3's records numbered up to 5 (the key's LBA is unused).
    let drop_through = golden(
        "btree-mod-drop-through.bin",
        &leaf_mod(4, Key::new(3, 0, 5), 0),
    );
    for m in [&put, &delete, &keep_below, &drop_through] {
        assert_eq!(m.len(), 1 + btree::RECORD_LEN);
    }

    // Puts in any order build the golden leaf; the put golden file is one of them.
    let mut p = leaf_payload(PAYLOAD, leaf_fence(), &[]);
    LeafApp.apply(0, &mut p, &leaf_mod(1, k2, v2));
    LeafApp.apply(0, &mut p, &put);
    LeafApp.apply(0, &mut p, &leaf_mod(1, k0, 0xdead));
    LeafApp.apply(0, &mut p, &leaf_mod(1, k0, v0)); // a put of a present key replaces
    assert_eq!(p, golden("btree-leaf.bin", &golden_leaf()));

    LeafApp.apply(0, &mut p, &delete);
    assert_eq!(
        p,
        leaf_payload(PAYLOAD, leaf_fence(), &[(k1, v1), (k2, v2)])
    );
    LeafApp.apply(0, &mut p, &keep_below);
    assert_eq!(p, leaf_payload(PAYLOAD, leaf_fence(), &[(k1, v1)]));

    // From the golden leaf, drop through takes k0 and k2 (volume 3, timestamps 5 and 1, at
    // any LBA) and keeps k1 (timestamp 9).
    let mut p = golden_leaf();
    LeafApp.apply(0, &mut p, &drop_through);
    assert_eq!(p, leaf_payload(PAYLOAD, leaf_fence(), &[(k1, v1)]));
}

#[test]
fn hash_page_matches_its_golden_file() {
    let committed = golden("hash-page.bin", &golden_hash_page());
    assert_eq!(committed.len(), PAYLOAD);
    assert_eq!(page_count(&committed), 3);
    assert_eq!(committed[4..8], PAGE_MAGIC, "magic");
    assert!(check_page(&committed));
    for (i, (k, v)) in hash_records().into_iter().enumerate() {
        assert_eq!(page_get(&committed, k), Some(v));
        let at = PAGE_HEADER_LEN + i * hash::RECORD_LEN;
        assert_eq!((le_u64(&committed, at), le_u64(&committed, at + 8)), (k, v));
    }
    assert!(committed[PAGE_HEADER_LEN + 3 * hash::RECORD_LEN..]
        .iter()
        .all(|&b| b == 0));
}

#[test]
fn hash_put_matches_its_golden_file() {
    let (k, v) = hash_records()[0];
    let committed = golden("hash-mod-put.bin", &hash_put(k, v));
    assert_eq!(committed.len(), 16);
    let mut p = vec![0u8; PAYLOAD];
    HashApp.apply(0, &mut p, &committed);
    for (k, v) in &hash_records()[1..] {
        HashApp.apply(0, &mut p, &hash_put(*k, *v));
    }
    assert_eq!(p, golden("hash-page.bin", &golden_hash_page()));
}

#[test]
fn data_disk_matches_its_golden_file_and_opens() {
    let geo = disk_geometry();
    let committed = golden("data-disk.bin", &build_disk());
    assert_eq!(committed.len() as u64, geo.disk_bytes());
    assert_eq!(geo.disk_bytes(), 8192 + 2 * 2 * 512 + 4 * 512);

    // Checkpoint: format wrote counter 0 to slot A and counter 1 to slot B; counter 2 went to
    // slot 2 % 2 = A, so format's counter 1 still stands in slot B.
    let slot0 = &committed[CKPT_SLOTS[0] as usize..][..4096];
    let slot1 = &committed[CKPT_SLOTS[1] as usize..][..4096];
    let ck = |counter, checkpoint| Checkpoint {
        geometry: geo,
        counter,
        checkpoint,
        disk_id: DISK_ID,
    };
    assert_eq!(Checkpoint::decode(slot0), Ok(ck(2, 3)));
    assert_eq!(Checkpoint::decode(slot1), Ok(ck(1, 0)));
    for slot in [slot0, slot1] {
        assert!(slot[CKPT_LEN..].iter().all(|&b| b == 0));
    }

    // Blocks in place: 0 and 1 sealed with the LSN (here the caller position) of their last
    // modification; 2 and 3 never written (all zero).
    let block = |i: u64| &committed[geo.block_offset(i) as usize..][..BLOCK];
    let expect = [(0, 3, vec![(11, 111), (33, 333)]), (1, 2, vec![(22, 222)])];
    for (i, lsn, recs) in &expect {
        let img = block(*i);
        assert_eq!(
            check_block(img, DISK_ID, Some(*i)),
            Ok(BlockHeader {
                lsn: *lsn,
                block: *i
            })
        );
        let payload = &img[BLOCK_HEADER_LEN..];
        assert_eq!(page_count(payload), recs.len());
        for (k, v) in recs {
            assert_eq!(page_get(payload, *k), Some(*v));
        }
    }
    for i in 2..4 {
        assert!(block(i).iter().all(|&b| b == 0));
        assert_eq!(
            check_block(block(i), DISK_ID, Some(i)).map(|h| h.lsn),
            Ok(0)
        );
    }
    // Double-write area: the last batch (one run), slot j holding the run's j-th block; the
    // slots past it never written.
    for j in 0..2u64 {
        let dw = &committed[geo.dw_offset(j) as usize..][..BLOCK];
        assert_eq!(dw, block(j), "double-write slot {j}");
    }
    for j in 2..geo.dw_slots() {
        let dw = &committed[geo.dw_offset(j) as usize..][..BLOCK];
        assert!(dw.iter().all(|&b| b == 0), "double-write slot {j}");
    }

    // The golden disk opens, with nothing to repair, and serves the puts.
    let disk: Arc<dyn Disk> = Arc::new(MemDisk::from_vec(committed.clone()));
    let (b, report) = Bosc::open(disk, disk_cfg(), Durability::Caller, Arc::new(HashApp)).unwrap();
    assert_eq!(report.checkpoint, 3);
    assert_eq!(report.blocks_repaired, 0);
    for (_, block, k, v) in DISK_PUTS {
        assert_eq!(b.query(block, |p| page_get(p, k)).unwrap(), Some(v));
    }
}

// ---------------------------------------------------------------------------------------------
// Damage is caught where there is a checksum

#[test]
fn every_damaged_byte_of_the_golden_checkpoint_is_caught() {
    let committed = golden("checkpoint.bin", &checkpoint().encode());
    each_damaged_byte(&committed, |c, i, mask| {
        assert!(
            Checkpoint::decode(c).is_err(),
            "byte {i} ^ {mask:#04x} went unnoticed"
        );
    });
}

#[test]
fn every_damaged_byte_of_the_golden_block_is_caught() {
    let committed = golden("block.bin", &sealed_block());
    each_damaged_byte(&committed, |c, i, mask| {
        for expected in [None, Some(BLOCK_NO)] {
            assert_eq!(
                check_block(c, DISK_ID, expected),
                Err(BlockError::Checksum),
                "byte {i} ^ {mask:#04x} went unnoticed"
            );
        }
    });
}

/// The leaf and hash payloads carry no checksum of their own: the block's CRC covers them.
#[test]
fn a_damaged_payload_inside_a_sealed_block_is_caught() {
    for (file, payload) in [
        ("btree-leaf.bin", golden_leaf()),
        ("hash-page.bin", golden_hash_page()),
    ] {
        let committed = golden(file, &payload);
        let mut img = vec![0u8; BLOCK];
        img[BLOCK_HEADER_LEN..].copy_from_slice(&committed);
        seal_block(&mut img, DISK_ID, 9, 1);
        assert!(check_block(&img, DISK_ID, Some(1)).is_ok(), "{file}");
        for i in BLOCK_HEADER_LEN..BLOCK {
            let mut c = img.clone();
            c[i] ^= 0x01;
            assert_eq!(
                check_block(&c, DISK_ID, Some(1)),
                Err(BlockError::Checksum),
                "{file}: byte {i}"
            );
        }
    }
}

/// A torn in-place block of the golden disk is restored from the double-write area at open.
#[test]
fn a_damaged_block_of_the_golden_disk_is_repaired_from_the_double_write_area() {
    let geo = disk_geometry();
    let mut image = golden("data-disk.bin", &build_disk());
    image[geo.block_offset(1) as usize + 100] ^= 0xff;
    let disk = Arc::new(MemDisk::from_vec(image));
    let dyn_disk: Arc<dyn Disk> = disk.clone();
    let (b, report) =
        Bosc::open(dyn_disk, disk_cfg(), Durability::Caller, Arc::new(HashApp)).unwrap();
    assert_eq!(report.blocks_repaired, 1);
    assert_eq!(b.query(1, |p| page_get(p, 22)).unwrap(), Some(222));
}

/// A block sealed on another BOSC disk of the same geometry fails the check here, and the
/// disk's sealed blocks fail on that other disk.
#[test]
fn a_block_of_another_disk_is_refused() {
    let committed = golden("block.bin", &sealed_block());
    assert_eq!(
        check_block(&committed, OTHER_DISK, Some(BLOCK_NO)),
        Err(BlockError::Checksum)
    );
    // Copy block 1 of the golden disk onto a disk formatted the same way but as OTHER_DISK.
    let geo = disk_geometry();
    let golden_disk = golden("data-disk.bin", &build_disk());
    let other = MemDisk::new(0);
    Bosc::<HashApp>::format_with_id(&other, &disk_cfg(), OTHER_DISK).unwrap();
    let at = geo.block_offset(1);
    other
        .write_at(&golden_disk[at as usize..][..BLOCK], at)
        .unwrap();
    let other: Arc<dyn Disk> = Arc::new(other);
    let (b, _) = Bosc::open(other, disk_cfg(), Durability::Caller, Arc::new(HashApp)).unwrap();
    let err = b.query(1, |p| page_get(p, 22)).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Block {
                block: 1,
                error: BlockError::Checksum
            }
        ),
        "{err}"
    );
}

/// A disk whose checkpoint names another format version (here the retired v1, and a future
/// v4) is refused with `UnsupportedVersion`, not read as unformatted or misread.
#[test]
fn a_disk_of_another_format_version_is_refused() {
    for version in [1u16, 2, 4] {
        let mut image = golden("data-disk.bin", &build_disk());
        let slot = &mut image[CKPT_SLOTS[0] as usize..][..CKPT_LEN];
        slot[8..10].copy_from_slice(&version.to_le_bytes());
        slot[28..32].fill(0);
        let crc = crc32c::crc32c(slot);
        slot[28..32].copy_from_slice(&crc.to_le_bytes());
        let disk: Arc<dyn Disk> = Arc::new(MemDisk::from_vec(image));
        let err = Bosc::open(disk, disk_cfg(), Durability::Caller, Arc::new(HashApp))
            .err()
            .unwrap();
        assert!(
            matches!(err, Error::UnsupportedVersion(v) if v == version),
            "{err}"
        );
    }
}

/// The first checkpoint after format goes to slot A; if that write tears, format's slot B
/// still holds a valid checkpoint and the disk opens (before, format left only slot A valid).
#[test]
fn a_torn_first_checkpoint_leaves_formats_checkpoint() {
    let mut image = golden("data-disk.bin", &build_disk());
    image[CKPT_SLOTS[0] as usize..][..CKPT_LEN / 2].fill(0xa5);
    let disk: Arc<dyn Disk> = Arc::new(MemDisk::from_vec(image));
    let (b, report) = Bosc::open(disk, disk_cfg(), Durability::Caller, Arc::new(HashApp)).unwrap();
    assert_eq!(report.checkpoint, 0);
    // The caller replays above position 0; the blocks' LSNs skip what is already applied.
    for (pos, block, k, v) in DISK_PUTS {
        b.modify_at(block, &hash_put(k, v), pos).unwrap();
    }
    assert_eq!(b.query(0, page_count).unwrap(), 2);
    assert_eq!(b.query(0, |p| page_get(p, 33)).unwrap(), Some(333));
}

/// A page that is neither empty nor magic-stamped is refused when the hash table opens.
#[test]
fn a_hash_table_refuses_pages_without_its_magic() {
    let mut p = golden("hash-page.bin", &golden_hash_page());
    assert!(check_page(&p));
    assert!(check_page(&vec![0u8; PAYLOAD]));
    p[4] ^= 1;
    assert!(!check_page(&p));
    let leaf = golden("btree-leaf.bin", &golden_leaf());
    assert!(!check_page(&leaf));

    // A B+tree leaf stored on the disk: the hash table will not open over it.
    let disk = Arc::new(MemDisk::new(0));
    let dyn_disk: Arc<dyn Disk> = disk.clone();
    Bosc::<HashApp>::format_with_id(dyn_disk.as_ref(), &disk_cfg(), DISK_ID).unwrap();
    let (b, _) = Bosc::open(
        dyn_disk.clone(),
        disk_cfg(),
        Durability::Caller,
        Arc::new(HashApp),
    )
    .unwrap();
    b.load(2, &leaf).unwrap();
    let err = hash::BoscHash::open(b).err().unwrap();
    assert!(
        matches!(&err, Error::Index(m) if m.contains("block 2")),
        "{err}"
    );
}

// ---------------------------------------------------------------------------------------------
// The documented layout

#[test]
fn constants_are_the_documented_ones() {
    assert_eq!(BLOCK_HEADER_LEN, 24);
    assert_eq!(BLOCK_MAGIC, *b"BOSC");
    assert_eq!(CKPT_MAGIC, *b"BOSCCKPT");
    assert_eq!((FORMAT_VERSION, CKPT_VERSION, RECORD_VERSION), (3, 3, 3));
    assert_eq!(CKPT_SLOTS, [0, 4096]);
    assert_eq!(CKPT_LEN, 64);
    assert_eq!(DW_OFFSET, 8192);
    assert_eq!(RECORD_PREFIX_LEN, 19);
    assert_eq!(PAGE_MAGIC, *b"HSHP");
    assert_eq!((Op::App.code(), Op::Write.code()), (1, 2));
    assert_eq!(Op::from_code(1), Some(Op::App));
    assert_eq!(Op::from_code(2), Some(Op::Write));
    for c in [0, 3, u8::MAX] {
        assert_eq!(Op::from_code(c), None);
    }
    assert_eq!(LEAF_MAGIC, *b"BTLF");
    assert_eq!(
        (LEAF_HEADER_LEN, btree::RECORD_LEN, Key::ENCODED_LEN),
        (28, 28, 20)
    );
    assert_eq!(leaf_capacity(PAYLOAD), (488 - 28) / 28);
    assert_eq!((PAGE_HEADER_LEN, hash::RECORD_LEN), (8, 16));
    assert_eq!(page_capacity(PAYLOAD), (488 - 8) / 16);
    // The CRC32C the docs name (Castagnoli; standard check value).
    assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
}

#[test]
fn geometry_places_things_where_documented() {
    let g = Geometry {
        block_bytes: 4096,
        block_count: 100,
        max_run: 32,
        dw_runs: 4,
        shadow: false,
    };
    assert_eq!(g.dw_slots(), 128);
    assert_eq!(g.dw_offset(0), 8192);
    assert_eq!(g.dw_offset(127), 8192 + 127 * 4096);
    assert_eq!(g.data_start(), 8192 + 128 * 4096);
    assert_eq!(g.block_offset(5), 8192 + 128 * 4096 + 5 * 4096);
    assert_eq!(g.disk_bytes(), 8192 + (128 + 100) * 4096);
    assert_eq!(g.payload_bytes(), 4096 - 24);
}

#[test]
fn checkpoint_fields_sit_at_documented_offsets() {
    let c = Checkpoint {
        geometry: Geometry {
            block_bytes: 0xa1a2_a3a4,
            block_count: 0xb1b2_b3b4_b5b6_b7b8,
            max_run: 0xc1c2_c3c4,
            dw_runs: 0x9192,
            shadow: false,
        },
        counter: 0xd1d2_d3d4_d5d6_d7d8,
        checkpoint: 0xe1e2_e3e4_e5e6_e7e8,
        disk_id: DiskId(0xf1f2_f3f4_f5f6_f7f8_f9fa_fbfc_fdfe_ff00),
    };
    let b = c.encode();
    assert_eq!(&b[0..8], b"BOSCCKPT");
    assert_eq!(le_u16(&b, 8), 3, "version");
    assert_eq!(le_u16(&b, 10), c.geometry.dw_runs);
    assert_eq!(le_u32(&b, 12), c.geometry.block_bytes);
    assert_eq!(le_u64(&b, 16), c.geometry.block_count);
    assert_eq!(le_u32(&b, 24), c.geometry.max_run);
    assert_eq!(le_u64(&b, 32), c.counter);
    assert_eq!(le_u64(&b, 40), c.checkpoint);
    assert_eq!(
        u128::from_le_bytes(b[48..64].try_into().unwrap()),
        c.disk_id.0
    );
    // crc = CRC32C of the 64 bytes with the crc field (28..32) zeroed.
    let mut z = b;
    z[28..32].fill(0);
    assert_eq!(le_u32(&b, 28), crc32c::crc32c(&z), "crc");
    assert_eq!(Checkpoint::decode(&b), Ok(c));
    // Another version is refused by name, even with a matching CRC.
    for version in [1u16, 2, 4] {
        let mut other = z;
        other[8..10].copy_from_slice(&version.to_le_bytes());
        let crc = crc32c::crc32c(&other);
        other[28..32].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(
            Checkpoint::decode(&other),
            Err(CheckpointError::UnsupportedVersion(version))
        );
    }
}

#[test]
fn block_header_fields_sit_at_documented_offsets() {
    let mut img = vec![0x5au8; BLOCK];
    seal_block(
        &mut img,
        DISK_ID,
        0xf1f2_f3f4_f5f6_f7f8,
        0x0102_0304_0506_0708,
    );
    assert_eq!(&img[4..8], b"BOSC");
    assert_eq!(le_u64(&img, 8), 0xf1f2_f3f4_f5f6_f7f8, "lsn");
    assert_eq!(le_u64(&img, 16), 0x0102_0304_0506_0708, "block");
    assert!(img[24..].iter().all(|&b| b == 0x5a), "payload untouched");
    // crc = CRC32C of (disk id LE 16 bytes, version LE 2 bytes, the whole block with the crc
    // field (0..4) zeroed).
    let mut salted = DISK_ID.0.to_le_bytes().to_vec();
    salted.extend_from_slice(&3u16.to_le_bytes());
    salted.extend_from_slice(&[0; 4]);
    salted.extend_from_slice(&img[4..]);
    assert_eq!(le_u32(&img, 0), crc32c::crc32c(&salted), "crc");
}

#[test]
fn leaf_and_key_fields_sit_at_documented_offsets() {
    let key = Key::new(0xa1a2_a3a4, 0xb1b2_b3b4_b5b6_b7b8, 0xc1c2_c3c4_c5c6_c7c8);
    let mut k = [0u8; 20];
    key.encode(&mut k);
    assert_eq!(le_u32(&k, 0), key.volume);
    assert_eq!(le_u64(&k, 4), key.lba);
    assert_eq!(le_u64(&k, 12), key.timestamp);
    assert_eq!(Key::decode(&k), key);

    let fence = Key::new(1, 2, 3);
    let p = leaf_payload(PAYLOAD, fence, &[(key, 0xd1d2_d3d4_d5d6_d7d8)]);
    assert_eq!(&p[0..4], b"BTLF");
    assert_eq!(le_u32(&p, 4), 1, "count");
    assert_eq!(Key::decode(&p[8..28]), fence);
    assert_eq!(p[28..48], k, "record 0 key");
    assert_eq!(le_u64(&p, 48), 0xd1d2_d3d4_d5d6_d7d8, "record 0 value");
}
