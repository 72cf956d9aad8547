//! Growing a closed log by devices: more room, every record and every holder's watermark kept
//! (issue 17: "the log can grow without losing history").
//!
//! A log grows by whole devices of its geometry (segment size and count), not by segments on
//! the devices it has. Each device is a ring written in order, `(segment + 1) %
//! segment_count`, and recovery finds the segments in use as one run around it from the
//! oldest still held to the newest ([`crate::recover`]). Segments added at a device's end lie
//! inside that run whenever it wraps — the common case for a log that has run a while — so
//! the writer would reach them only after everything before them (the oldest records,
//! history's window) was let go of. A new device is a ring of its own, all of it free at once:
//! the writer spreads batches over it beside the others, and recovery merges the devices by
//! sequence number as always. No record moves, so every address history's index keeps stays
//! valid.
//!
//! Crash safety: the new devices are formatted (naming the new device count) and synced before
//! any existing device's superblock is rewritten, one device at a time. A crash before the
//! first rewrite leaves the log as it was: it opens with its old devices (the new ones, which
//! nothing lists yet, hold no record). A crash after it leaves the superblocks disagreeing on
//! the device count, which an open refuses ([`LogError::WrongPosition`]) and the same grow,
//! run again, completes: it accepts new devices formatted by the run cut short.

use std::sync::Arc;

use mariner_disk::Disk;

use crate::format::Superblock;
use crate::superblocks::{
    check_superblocks_growing, read_superblock, rewrite_superblock, write_new_superblock,
};
use crate::{Log, LogError};

/// What [`Log::add_devices`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grown {
    pub devices_before: usize,
    pub devices_after: usize,
    /// Bytes of segments per device (every device has the same).
    pub device_log_bytes: u64,
}

impl Log {
    /// Adds `added` as the log's next devices (files are sized to the log's devices, a block
    /// device must be that large): the closed log `log_id` on `devices` then has
    /// `devices.len() + added.len()` of them, opened in that order.
    pub fn add_devices(
        devices: &[Arc<dyn Disk>],
        added: &[Arc<dyn Disk>],
        log_id: u128,
    ) -> Result<Grown, LogError> {
        let (n, total) = (devices.len(), devices.len() + added.len());
        let count = u16::try_from(total)
            .ok()
            .filter(|&c| c <= 64)
            .ok_or_else(|| LogError::Config("at most 64 log devices".into()))?;
        let sbs = check_superblocks_growing(devices, log_id, Some(count))?;
        let first = sbs[0];
        let grown = Grown {
            devices_before: n,
            devices_after: total,
            device_log_bytes: first.segment_count * first.segment_bytes,
        };
        let need = first.data_offset + first.segment_count * first.segment_bytes;
        for (j, disk) in added.iter().enumerate() {
            let dev = n + j;
            let io = |source| LogError::Io { dev, source };
            let sb = Superblock {
                device_index: dev as u16,
                device_count: count,
                device_bytes: need,
                ..first
            };
            match read_superblock(disk.as_ref(), dev) {
                // Formatted by a grow to the same devices that was cut short (every field
                // comes from device 0's superblock, its creation time too).
                Ok(found) if found == sb => continue,
                Ok(_) => return Err(LogError::AlreadyFormatted { dev }),
                Err(_) => {}
            }
            let len = disk.len().map_err(io)?;
            if len < need {
                disk.set_len(need).map_err(|_| LogError::TooSmall {
                    dev,
                    bytes: len,
                    need,
                })?;
            }
            write_new_superblock(disk.as_ref(), dev, &sb)?;
        }
        for (dev, (disk, sb)) in devices.iter().zip(&sbs).enumerate() {
            if sb.device_count != count {
                let sb = Superblock {
                    device_count: count,
                    ..*sb
                };
                rewrite_superblock(disk.as_ref(), dev, &sb)?;
            }
        }
        Ok(grown)
    }
}
