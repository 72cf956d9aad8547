//! Superblocks and generation floors: writing them at format time (and a grown log's device
//! count in place), reading and checking them at open (docs/FORMATS.md), and the limits the
//! configuration and the superblock set.

use std::sync::Arc;

use mariner_disk::{AlignedBuf, Disk};

use crate::clock::{Clock, SystemClock};
use crate::format::{self, Superblock, DATA_OFFSET, RECORD_HEADER_LEN};
use crate::{LogConfig, LogError};

/// Reads device `dev`'s superblock.
pub fn read_superblock(disk: &dyn Disk, dev: usize) -> Result<Superblock, LogError> {
    let align = disk.alignment().max(512);
    let io = |source| LogError::Io { dev, source };
    let mut buf = AlignedBuf::new(align.max(format::SUPERBLOCK_LEN), align).map_err(io)?;
    disk.read_at(&mut buf, 0)
        .map_err(|source| LogError::Io { dev, source })?;
    Superblock::decode(&buf).map_err(|source| LogError::NotFormatted { dev, source })
}

/// Reads the device's generation floor, writes a new one above both it and `found` (the
/// newest generation in the segments), syncs, and returns the generation the device resumes
/// from: its first new segment gets the one after.
pub(crate) fn raise_generation_floor(
    disk: &dyn Disk,
    dev: usize,
    found: u64,
) -> Result<u64, LogError> {
    let io = |source| LogError::Io { dev, source };
    let align = disk.alignment().max(512);
    let mut buf = AlignedBuf::new(align, align).map_err(io)?;
    let mut current: Option<format::GenFloor> = None;
    for slot in format::GEN_FLOOR_SLOTS {
        disk.read_at(&mut buf, slot).map_err(io)?;
        if let Some(f) = format::GenFloor::decode(&buf) {
            if current.is_none_or(|c| f.counter > c.counter) {
                current = Some(f);
            }
        }
    }
    let (old_floor, counter) = current.map_or((0, 0), |c| (c.floor, c.counter + 1));
    // At most one segment per device was entered without a durable first record, so +2 clears
    // every generation the previous session could have used.
    let floor = found.max(old_floor) + 2;
    buf.fill(0);
    buf[..format::GEN_FLOOR_LEN].copy_from_slice(&format::GenFloor { floor, counter }.encode());
    disk.write_at(&buf, format::GEN_FLOOR_SLOTS[(counter % 2) as usize])
        .map_err(io)?;
    disk.sync().map_err(io)?;
    Ok(floor - 1)
}

/// Writes a new device's superblock: block 0 holds it and zeros (no generation floor yet),
/// then syncs. A new log ([`crate::Log::format`]) and a grown one's new devices (`grow.rs`).
pub(crate) fn write_new_superblock(
    disk: &dyn Disk,
    dev: usize,
    sb: &Superblock,
) -> Result<(), LogError> {
    let io = |source| LogError::Io { dev, source };
    let align = disk.alignment().max(sb.align_bytes as usize);
    let buf = AlignedBuf::new(align.max(4096), align).map_err(io)?;
    put_block0(disk, dev, buf, sb)
}

/// Rewrites device `dev`'s superblock in place: the block holding it is read and written back
/// whole, so whatever else an aligned block at offset 0 holds stays; then syncs.
pub(crate) fn rewrite_superblock(
    disk: &dyn Disk,
    dev: usize,
    sb: &Superblock,
) -> Result<(), LogError> {
    let io = |source| LogError::Io { dev, source };
    let align = disk.alignment().max(512);
    let len = align.max(format::SUPERBLOCK_LEN);
    let mut buf = AlignedBuf::new(len, align).map_err(io)?;
    disk.read_at(&mut buf, 0).map_err(io)?;
    put_block0(disk, dev, buf, sb)
}

/// `sb` over the start of `buf`, written at offset 0 and synced.
fn put_block0(
    disk: &dyn Disk,
    dev: usize,
    mut buf: AlignedBuf,
    sb: &Superblock,
) -> Result<(), LogError> {
    let io = |source| LogError::Io { dev, source };
    buf[..format::SUPERBLOCK_LEN].copy_from_slice(&sb.encode());
    disk.write_at(&buf, 0).map_err(io)?;
    disk.sync().map_err(io)
}

/// The largest write payload: what fits a segment, at most 4 MiB so a segment holds several.
pub(crate) fn max_payload(sb: &Superblock) -> u32 {
    let max = sb.segment_bytes - RECORD_HEADER_LEN as u64 - u64::from(sb.align_bytes);
    u32::try_from(max.min(4 << 20)).unwrap_or(u32::MAX)
}

pub(crate) fn check_config(cfg: &LogConfig) -> Result<(), LogError> {
    let a = u64::from(cfg.align_bytes);
    if !a.is_power_of_two() || !(512..=65536).contains(&a) {
        return Err(LogError::Config(
            "alignment must be a power of two in 512..=65536".into(),
        ));
    }
    if cfg.segment_bytes < 64 * 1024
        || !cfg.segment_bytes.is_multiple_of(a)
        || cfg.segment_bytes > 1 << 30
    {
        return Err(LogError::Config(
            "segment size must be a multiple of the alignment, 64 KiB..=1 GiB".into(),
        ));
    }
    Ok(())
}

pub(crate) fn new_superblock(
    disk: &dyn Disk,
    dev: usize,
    count: u16,
    cfg: &LogConfig,
    log_id: u128,
) -> Result<Superblock, LogError> {
    let bytes = disk.len().map_err(|source| LogError::Io { dev, source })?;
    let need = DATA_OFFSET + 2 * cfg.segment_bytes;
    if bytes < need {
        return Err(LogError::TooSmall { dev, bytes, need });
    }
    Ok(Superblock {
        log_id,
        device_index: dev as u16,
        device_count: count,
        device_bytes: bytes,
        segment_bytes: cfg.segment_bytes,
        segment_count: (bytes - DATA_OFFSET) / cfg.segment_bytes,
        data_offset: DATA_OFFSET,
        align_bytes: cfg.align_bytes,
        created_ns: SystemClock.wall_ns(),
    })
}

pub(crate) fn check_superblocks(
    devices: &[Arc<dyn Disk>],
    log_id: u128,
) -> Result<Vec<Superblock>, LogError> {
    check_superblocks_growing(devices, log_id, None)
}

/// As [`check_superblocks`], except that a device may already count `grown_to` devices (a
/// grow to that many cut short: `grow.rs`).
pub(crate) fn check_superblocks_growing(
    devices: &[Arc<dyn Disk>],
    log_id: u128,
    grown_to: Option<u16>,
) -> Result<Vec<Superblock>, LogError> {
    if devices.is_empty() {
        return Err(LogError::Config("no log devices".into()));
    }
    let mut sbs = Vec::with_capacity(devices.len());
    for (dev, disk) in devices.iter().enumerate() {
        let sb = read_superblock(disk.as_ref(), dev)?;
        if sb.log_id != log_id {
            return Err(LogError::ForeignDevice {
                dev,
                found: sb.log_id,
                expected: log_id,
            });
        }
        let counted = usize::from(sb.device_count) == devices.len()
            || grown_to.is_some_and(|n| sb.device_count == n);
        if usize::from(sb.device_index) != dev || !counted {
            return Err(LogError::WrongPosition {
                dev,
                found: sb.device_index,
                count: sb.device_count,
                configured: devices.len(),
            });
        }
        if let Some(first) = sbs.first() {
            let same = |a: &Superblock| {
                (
                    a.segment_bytes,
                    a.segment_count,
                    a.align_bytes,
                    a.data_offset,
                )
            };
            if same(first) != same(&sb) {
                return Err(LogError::GeometryMismatch { dev });
            }
        }
        sbs.push(sb);
    }
    Ok(sbs)
}
