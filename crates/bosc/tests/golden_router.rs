#![allow(clippy::unwrap_used, clippy::expect_used)]

//! Golden files for the B+tree router image (docs/FORMATS.md, "B+tree router image"): a fixed
//! header and body are encoded and compared byte for byte with `tests/golden/router-image-*.bin`,
//! the committed files decoded back, the fields found at the documented offsets with the
//! checksums computed independently of the crate, and every damaged byte of the header caught.
//! Regenerate only with a version change:
//!
//! ```text
//! MARINER_REGENERATE_GOLDEN=1 cargo test -p mariner-bosc --test golden_router
//! ```

use mariner_bosc::btree::image::{
    ImageError, ImageHeader, RouterImage, IMAGE_BODY_PREFIX_LEN, IMAGE_BODY_START,
    IMAGE_FREE_RUN_LEN, IMAGE_HEADER_LEN, IMAGE_LEAF_LEN, IMAGE_MAGIC, IMAGE_SLOTS, IMAGE_VERSION,
};
use mariner_bosc::btree::Key;
use mariner_bosc::format::DiskId;

#[path = "../../../tests/support/golden.rs"]
mod support;
use support::{each_damaged_byte, golden};

fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

fn body() -> RouterImage {
    RouterImage {
        block_count: 0x0100,
        payload_bytes: 4072,
        leaves: vec![
            (Key::MIN, 0),
            (Key::new(1, 0x0203_0405_0607_0809, 0x0a0b), 7),
            (Key::new(2, 5, 0x1122_3344_5566_7788), 3),
        ],
        free: vec![(1, 3), (4, 7), (8, 0x0100)],
        lease_blocks: 40,
    }
}

fn header() -> ImageHeader {
    let b = body().encode();
    ImageHeader {
        generation: 0x0123_4567_89ab_cdef,
        disk_id: DiskId(0x0f0e_0d0c_0b0a_0908_0706_0504_0302_0100),
        body_offset: IMAGE_BODY_START,
        body_len: b.len() as u64,
        body_crc: crc32c::crc32c(&b),
    }
}

#[test]
fn router_image_matches_its_golden_files() {
    let h = golden("router-image-header.bin", &header().encode());
    let b = golden("router-image-body.bin", &body().encode());
    assert_eq!(ImageHeader::decode(&h), Ok(Some(header())));
    assert_eq!(RouterImage::decode(&b), Ok(body()));
}

#[test]
fn router_image_fields_sit_at_documented_offsets() {
    let h = header().encode();
    assert_eq!(h.len(), 64);
    assert_eq!(&h[0..8], b"BTROUTER");
    assert_eq!(u16::from_le_bytes([h[8], h[9]]), 1, "version");
    assert_eq!(&h[10..12], &[0, 0]);
    assert_eq!(le_u64(&h, 16), header().generation);
    assert_eq!(
        u128::from_le_bytes(h[24..40].try_into().unwrap()),
        header().disk_id.0
    );
    assert_eq!(le_u64(&h, 40), IMAGE_BODY_START);
    assert_eq!(le_u64(&h, 48), header().body_len);
    assert_eq!(le_u32(&h, 56), header().body_crc);
    assert_eq!(le_u32(&h, 60), 0);
    let mut z = h;
    z[12..16].fill(0);
    assert_eq!(le_u32(&h, 12), crc32c::crc32c(&z), "header crc");

    let b = body().encode();
    assert_eq!(le_u64(&b, 0), 0x0100);
    assert_eq!(le_u32(&b, 8), 4072);
    assert_eq!(le_u32(&b, 12), 3, "leaves");
    assert_eq!(le_u32(&b, 16), 3, "free runs");
    assert_eq!(le_u32(&b, 20), 0);
    assert_eq!(le_u64(&b, 24), 40, "lease");
    // Leaf 1: fence (volume u32, lba u64, timestamp u64) at 32 + 24, block at 52 + 24.
    assert_eq!(le_u32(&b, 56), 1);
    assert_eq!(le_u64(&b, 60), 0x0203_0405_0607_0809);
    assert_eq!(le_u64(&b, 68), 0x0a0b);
    assert_eq!(le_u32(&b, 76), 7);
    // Free run 1 at 32 + 24·3 + 16.
    assert_eq!(le_u64(&b, 32 + 72 + 16), 4);
    assert_eq!(le_u64(&b, 32 + 72 + 24), 7);
    assert_eq!(b.len(), 32 + 3 * 24 + 3 * 16);
}

#[test]
fn constants_are_the_documented_ones() {
    assert_eq!(IMAGE_MAGIC, *b"BTROUTER");
    assert_eq!(IMAGE_VERSION, 1);
    assert_eq!(IMAGE_HEADER_LEN, 64);
    assert_eq!(IMAGE_SLOTS, [0, 4096]);
    assert_eq!(IMAGE_BODY_START, 8192);
    assert_eq!(
        (IMAGE_BODY_PREFIX_LEN, IMAGE_LEAF_LEN, IMAGE_FREE_RUN_LEN),
        (32, 24, 16)
    );
}

#[test]
fn every_damaged_byte_of_the_golden_header_is_caught() {
    let h = golden("router-image-header.bin", &header().encode());
    each_damaged_byte(&h, |damaged, at, mask| {
        let got = ImageHeader::decode(damaged);
        assert!(
            got.is_err(),
            "byte {at} ^ {mask:#x} of the header passed: {got:?}"
        );
        // And open refuses the pair, whichever slot is damaged.
        assert!(ImageHeader::pick([damaged, &h]).is_err());
    });
    let mut other = header().encode();
    other[8] = 2;
    other[12..16].fill(0);
    let crc = crc32c::crc32c(&other);
    other[12..16].copy_from_slice(&crc.to_le_bytes());
    assert_eq!(
        ImageHeader::decode(&other),
        Err(ImageError::UnsupportedVersion(2))
    );
}

#[test]
fn a_damaged_golden_body_fails_its_checksum() {
    let b = golden("router-image-body.bin", &body().encode());
    each_damaged_byte(&b, |damaged, at, _| {
        assert_ne!(crc32c::crc32c(damaged), header().body_crc, "byte {at}");
    });
}
