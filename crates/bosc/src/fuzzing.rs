//! Entry points for the fuzz targets (`fuzz/fuzz_targets/bosc_*.rs`): every parser of bytes
//! BOSC reads back from its disks, fed arbitrary input. None may panic.
#![doc(hidden)]

use std::sync::Arc;

use mariner_disk::{Disk, MemDisk};
use mariner_log::{Log, LogConfig};

use crate::btree::{BPlusTree, Key, LeafApp};
use crate::format::{check_block, seal_block, Checkpoint, DiskId, LoggedMod, BLOCK_HEADER_LEN};
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
