#![allow(clippy::unwrap_used, clippy::expect_used)]

//! Golden files for shadow extents (docs/FORMATS.md, "Shadow extents"): a home map slot and a
//! `LoggedHomes` own-log payload are encoded and compared byte for byte with
//! `tests/golden/home-map.bin` and `tests/golden/logged-homes.bin`, the committed files decoded
//! back, the fields found at the documented offsets (the checksum computed independently of
//! the crate), every damaged byte of the map caught, and the data-disk layout of a disk of
//! shadow extents pinned. Regenerate only with a version change:
//!
//! ```text
//! MARINER_REGENERATE_GOLDEN=1 cargo test -p mariner-bosc --test golden_homes
//! ```

use mariner_bosc::format::homes::{
    HomeMap, HomeMapError, LoggedHomes, HOMES_CODE, HOMES_ENTRY_LEN, HOMES_PREFIX_LEN,
    HOME_MAP_HEADER_LEN, HOME_MAP_MAGIC,
};
use mariner_bosc::format::{Checkpoint, DiskId, Geometry, CKPT_VERSION_SHADOW, MAP_OFFSET};

#[path = "../../../tests/support/golden.rs"]
mod support;
use support::{each_damaged_byte, golden};

#[path = "support/golden_values.rs"]
mod values;
use values::{le_u16, le_u32, le_u64, DISK_ID, OTHER_DISK};

/// 10 extents of 4 blocks of 512 bytes (the last of 2): 38 blocks.
fn geo() -> Geometry {
    Geometry {
        block_bytes: 512,
        block_count: 38,
        max_run: 4,
        dw_runs: 0,
        shadow: true,
    }
}

/// Extents 0, 3 and 9 in home 1.
fn map() -> HomeMap {
    let mut m = HomeMap::fresh(&geo(), 0x0102_0304_0506_0708);
    m.checkpoint = 0x1112_1314_1516_1718;
    for e in [0, 3, 9] {
        m.set(e, 1);
    }
    m
}

const MOVES: [(u64, u8); 3] = [(0, 1), (3, 1), (0x0a0b_0c0d_0e0f_1011, 0)];

#[test]
fn home_map_matches_its_golden_file() {
    let committed = golden("home-map.bin", &map().encode(&geo(), DISK_ID));
    assert_eq!(committed.len(), 4096);
    let back = HomeMap::decode(&committed, &geo(), DISK_ID).unwrap();
    assert_eq!(back, map());
    let homes: Vec<u8> = (0..10).map(|e| back.home(e)).collect();
    assert_eq!(homes, [1, 0, 0, 1, 0, 0, 0, 0, 0, 1]);
}

#[test]
fn home_map_fields_sit_at_documented_offsets() {
    let b = map().encode(&geo(), DISK_ID);
    assert_eq!(&b[0..8], &HOME_MAP_MAGIC);
    assert_eq!(&b[0..8], b"BOSCHOME");
    assert_eq!(le_u16(&b, 8), 3, "version");
    assert_eq!(le_u16(&b, 10), 0);
    let mut zeroed = b.clone();
    zeroed[12..16].fill(0);
    assert_eq!(le_u32(&b, 12), crc32c::crc32c(&zeroed), "crc over the slot");
    assert_eq!(le_u64(&b, 16), 0x0102_0304_0506_0708, "counter");
    assert_eq!(le_u64(&b, 24), 0x1112_1314_1516_1718, "checkpoint");
    assert_eq!(le_u64(&b, 32), 10, "extents");
    assert_eq!(&b[40..56], &DISK_ID.0.to_le_bytes(), "disk id");
    assert_eq!(HOME_MAP_HEADER_LEN, 56);
    assert_eq!(b[56], 0b0000_1001, "extents 0 and 3");
    assert_eq!(b[57], 0b0000_0010, "extent 9");
    assert!(b[58..].iter().all(|&x| x == 0));
}

#[test]
fn every_damaged_byte_of_the_home_map_is_caught() {
    let b = map().encode(&geo(), DISK_ID);
    each_damaged_byte(&b, |d, i, mask| {
        assert!(
            HomeMap::decode(d, &geo(), DISK_ID).is_err(),
            "byte {i} ^ {mask:#04x} went unnoticed"
        );
    });
}

#[test]
fn a_home_map_of_another_disk_or_geometry_is_refused() {
    let b = map().encode(&geo(), DISK_ID);
    assert_eq!(
        HomeMap::decode(&b, &geo(), OTHER_DISK),
        Err(HomeMapError::Foreign)
    );
    let other = Geometry {
        block_count: 60,
        ..geo()
    };
    assert_eq!(
        HomeMap::decode(&b, &other, DISK_ID),
        Err(HomeMapError::Foreign)
    );
    assert_eq!(
        HomeMap::decode(&b[..100], &geo(), DISK_ID),
        Err(HomeMapError::Magic)
    );
}

#[test]
fn logged_homes_matches_its_golden_file() {
    let committed = golden("logged-homes.bin", &LoggedHomes::encode(&MOVES));
    assert_eq!(committed.len(), HOMES_PREFIX_LEN + 3 * HOMES_ENTRY_LEN);
    assert_eq!(LoggedHomes::decode(&committed).unwrap(), MOVES);
}

#[test]
fn logged_homes_fields_sit_at_documented_offsets() {
    let b = LoggedHomes::encode(&MOVES);
    assert_eq!(le_u16(&b, 0), 3, "version");
    assert_eq!(b[2], HOMES_CODE);
    assert_eq!(b[2], 4, "code");
    assert_eq!(le_u32(&b, 3), 3, "count");
    assert_eq!(HOMES_PREFIX_LEN, 7);
    assert_eq!(HOMES_ENTRY_LEN, 9);
    assert_eq!(le_u64(&b, 7), 0, "extent");
    assert_eq!(b[15], 1, "home");
    assert_eq!(le_u64(&b, 25), 0x0a0b_0c0d_0e0f_1011, "third extent");
    assert_eq!(b[33], 0, "third home");
}

#[test]
fn logged_homes_rejects_other_versions_codes_counts_and_homes() {
    let good = LoggedHomes::encode(&MOVES);
    let mut v = good.clone();
    v[0] = 9;
    assert_eq!(LoggedHomes::decode(&v), None, "version");
    let mut c = good.clone();
    c[2] = 3;
    assert_eq!(LoggedHomes::decode(&c), None, "code");
    assert_eq!(LoggedHomes::decode(&good[..good.len() - 1]), None, "short");
    let mut n = good.clone();
    n[3] = 4;
    assert_eq!(LoggedHomes::decode(&n), None, "count");
    let mut h = good.clone();
    h[15] = 2;
    assert_eq!(LoggedHomes::decode(&h), None, "home 2");
    assert_eq!(LoggedHomes::decode(&LoggedHomes::encode(&[])), Some(vec![]));
}

/// The layout of a disk of shadow extents: map slots from 8192, then home 0 and home 1.
#[test]
fn a_disk_of_shadow_extents_is_laid_out_as_documented() {
    let g = geo();
    assert_eq!(MAP_OFFSET, 8192);
    assert_eq!(g.extents(), 10);
    assert_eq!(g.map_slot_bytes(), 4096);
    assert_eq!(g.map_slot(6), 8192);
    assert_eq!(g.map_slot(7), 8192 + 4096);
    assert_eq!(g.data_start(), 8192 + 2 * 4096);
    assert_eq!(g.home_offset(0, 5), g.data_start() + 5 * 512);
    assert_eq!(g.home_offset(1, 5), g.data_start() + (38 + 5) * 512);
    assert_eq!(g.disk_bytes(), g.data_start() + 2 * 38 * 512);
    let c = Checkpoint {
        geometry: g,
        counter: 3,
        checkpoint: 9,
        disk_id: DiskId(1),
    };
    let b = c.encode();
    assert_eq!(le_u16(&b, 8), CKPT_VERSION_SHADOW);
    assert_eq!(CKPT_VERSION_SHADOW, 5);
    assert_eq!(Checkpoint::decode(&b), Ok(c));
}
