//! Entry points for the fuzz targets (`fuzz/fuzz_targets/bosc_*.rs`): every parser of bytes
//! BOSC reads back from its disks, fed arbitrary input. None may panic.
#![doc(hidden)]

use std::sync::Arc;

use mariner_disk::{Disk, MemDisk};
use mariner_log::{Log, LogConfig};

use crate::btree::image::{ImageHeader, RouterImage, IMAGE_BODY_START, IMAGE_SLOTS};
use crate::btree::{BPlusTree, Key, LeafApp};
use crate::format::homes::{HomeMap, LoggedHomes};
use crate::format::{
    check_block, seal_block, Checkpoint, DiskId, Geometry, LoggedBatch, LoggedMod, BLOCK_HEADER_LEN,
};
use crate::{Bosc, BoscConfig, Durability};

/// The data disk's on-disk structures: checkpoint slots, block headers (as read from the
/// double-write area, where the block number is not known, and in place), and logged
/// modifications.
pub fn fuzz_format(data: &[u8]) {
    let _ = Checkpoint::decode(data);
    let half = data.len() / 2;
    let _ = Checkpoint::pick([&data[..half], &data[half..]]);
    let disk = DiskId(0x5eed);
    let _ = check_block(data, disk, None);
    let _ = check_block(data, disk, Some(3));
    if data.len() >= BLOCK_HEADER_LEN {
        // A block sealed checks back with what it was sealed with, and fails on another disk.
        let mut image = data.to_vec();
        seal_block(&mut image, disk, 42, 3);
        let h = check_block(&image, disk, Some(3));
        assert!(h.is_ok_and(|h| h.lsn == 42 && h.block == 3));
        assert!(check_block(&image, DiskId(0x07e4), Some(3)).is_err());
    }
    if let Some(m) = LoggedMod::decode(data) {
        // What decodes encodes back to the same bytes.
        let again = LoggedMod::encode(m.op, m.global_frontier, m.local_frontier, &m.bytes);
        assert_eq!(again, data);
    }
    if let Some((gf, entries)) = LoggedBatch::decode(data) {
        let mut again = LoggedBatch::new(gf);
        for e in entries {
            assert!(again.push(e.block, e.op, e.local_frontier, e.bytes));
        }
        assert_eq!(again.finish(), data);
    }
    if let Some(moves) = LoggedHomes::decode(data) {
        assert_eq!(LoggedHomes::encode(&moves), data);
    }
    // A home map slot of a small disk of shadow extents (3 extents: one slot of 4096 bytes).
    let geo = Geometry {
        block_bytes: 512,
        block_count: 80,
        max_run: 32,
        dw_runs: 0,
        shadow: true,
    };
    let mut slot = vec![0u8; 4096];
    let n = data.len().min(slot.len());
    slot[..n].copy_from_slice(&data[..n]);
    if let Ok(map) = HomeMap::decode(&slot, &geo, disk) {
        assert_eq!(map.encode(&geo, disk), slot);
    }
}

/// Blocks of arbitrary payload, sealed with valid checksums as if written by BOSC (what a
/// bug or a foreign writer could leave), opened as a B+tree in own-log mode, then queried
/// and inserted into. Opening may refuse the disk; nothing may panic.
pub fn fuzz_btree(data: &[u8]) {
    const BLOCK: usize = 512;
    const BLOCKS: u64 = 16;
    const LOG_ID: u128 = 0xF022;
    let cfg = BoscConfig {
        block_bytes: BLOCK as u32,
        block_count: BLOCKS,
        background: None,
        ..BoscConfig::default()
    };
    let disk: Arc<dyn Disk> = Arc::new(MemDisk::new(0));
    if Bosc::<LeafApp>::format_with_id(disk.as_ref(), &cfg, DiskId(0xD15C)).is_err() {
        return;
    }
    let log_disk: Arc<dyn Disk> = Arc::new(MemDisk::new(1 << 20));
    let log_cfg = LogConfig {
        segment_bytes: 64 * 1024,
        t_wait_ns: 0,
        ..LogConfig::default()
    };
    if Log::format(&[Arc::clone(&log_disk)], &log_cfg, LOG_ID).is_err() {
        return;
    }
    let durability = Durability::OwnLog {
        devices: vec![log_disk],
        log: log_cfg,
        log_id: LOG_ID,
        volume: 1,
    };
    let Ok((bosc, _)) = Bosc::open(disk, cfg, durability, Arc::new(LeafApp)) else {
        return;
    };
    // The payloads sealed as BOSC seals blocks, by the bulk load (zero-padded to whole blocks).
    let payload = BLOCK - BLOCK_HEADER_LEN;
    let mut payloads = data[..data.len().min(payload * BLOCKS as usize)].to_vec();
    payloads.resize(payloads.len().next_multiple_of(payload), 0);
    if bosc.load(0, &payloads).is_err() {
        return;
    }
    let Ok(tree) = BPlusTree::open(bosc, None) else {
        return;
    };
    let keys: Vec<Key> = data
        .chunks_exact(Key::ENCODED_LEN)
        .take(24)
        .map(Key::decode)
        .collect();
    for k in &keys {
        let _ = tree.get(*k);
        let _ = tree.newest_at_or_before(k.volume, k.lba, k.timestamp);
    }
    let everything = |t: &BPlusTree| t.range(Key::MIN, Key::new(u32::MAX, 0, 0));
    let _ = everything(&tree);
    let batch: Vec<(Key, u64)> = keys.iter().map(|k| (*k, 1)).collect();
    let _ = tree.insert_batch(&batch);
    let _ = tree.insert_batch(&batch);
    let _ = tree.bosc().commit_all();
    let _ = everything(&tree);
}

/// The router image's decoders, then an open of a small real tree (a few splits) with the
/// input as the image: verbatim (mostly refused by its checksums), and as the body of a
/// header with a valid CRC and the disk's id, so the body's own checks and a lying image
/// are reached. Open may fall back or refuse; queries and inserts may fail; nothing may panic.
pub fn fuzz_router_image(data: &[u8]) {
    let _ = ImageHeader::decode(data);
    let half = data.len() / 2;
    let _ = ImageHeader::pick([&data[..half], &data[half..]]);
    if let Ok(img) = RouterImage::decode(data) {
        // What decodes encodes back to the same bytes.
        assert_eq!(img.encode(), data);
        let _ = img.lease_runs();
    }
    const LOG_ID: u128 = 0x1A6E;
    let cfg = BoscConfig {
        block_bytes: 512,
        block_count: 64,
        background: None,
        ..BoscConfig::default()
    };
    let disk: Arc<dyn Disk> = Arc::new(MemDisk::new(0));
    let log_disk: Arc<dyn Disk> = Arc::new(MemDisk::new(1 << 20));
    let log_cfg = LogConfig {
        segment_bytes: 64 * 1024,
        t_wait_ns: 0,
        ..LogConfig::default()
    };
    let engine = || {
        let durability = Durability::OwnLog {
            devices: vec![Arc::clone(&log_disk)],
            log: log_cfg.clone(),
            log_id: LOG_ID,
            volume: 1,
        };
        Bosc::open(
            Arc::clone(&disk),
            cfg.clone(),
            durability,
            Arc::new(LeafApp),
        )
        .map(|b| b.0)
    };
    if Bosc::<LeafApp>::format_with_id(disk.as_ref(), &cfg, DiskId(0xD15C)).is_err()
        || Log::format(&[Arc::clone(&log_disk)], &log_cfg, LOG_ID).is_err()
    {
        return;
    }
    let Ok(tree) = engine().and_then(|b| BPlusTree::open(b, None)) else {
        return;
    };
    let keys: Vec<(Key, u64)> = (0..40).map(|i| (Key::new(1, i * 7, 0), i)).collect();
    if tree.insert_batch(&keys).is_err() {
        return;
    }
    drop(tree);
    let verbatim: Arc<dyn Disk> = Arc::new(MemDisk::new(0));
    let _ = verbatim.set_len(data.len() as u64);
    let _ = verbatim.write_at(data, 0);
    let wrapped: Arc<dyn Disk> = Arc::new(MemDisk::new(0));
    let h = ImageHeader {
        generation: 1,
        disk_id: DiskId(0xD15C),
        body_offset: IMAGE_BODY_START,
        body_len: data.len() as u64,
        body_crc: crc32c::crc32c(data),
    };
    let _ = wrapped.set_len(IMAGE_BODY_START + data.len() as u64);
    let _ = wrapped.write_at(&h.encode(), IMAGE_SLOTS[1]);
    let _ = wrapped.write_at(data, IMAGE_BODY_START);
    for image in [verbatim, wrapped] {
        let Ok(tree) = engine().and_then(|b| BPlusTree::open_with_router(b, None, image)) else {
            continue;
        };
        for (k, _) in &keys {
            let _ = tree.get(*k);
            let _ = tree.newest_at_or_before(k.volume, k.lba, 1);
        }
        let _ = tree.range(Key::MIN, Key::new(u32::MAX, 0, 0));
        let more: Vec<(Key, u64)> = (0..40).map(|i| (Key::new(1, i * 7 + 3, 0), i)).collect();
        let _ = tree.insert_batch(&more);
        let _ = tree.delete(Key::new(1, 7, 0));
        let _ = tree.drop_through(&[Key::new(1, 3, 0), Key::new(2, 0, 0)], |_| Some(5));
        let _ = tree.bosc().commit_all();
        let _ = tree.range(Key::MIN, Key::new(u32::MAX, 0, 0));
    }
}
