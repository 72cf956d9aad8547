//! The narrow disk trait every Mariner component does its I/O through.
//!
//! Five operations (`read_at`, `write_at`, `sync`, `len`, `set_len`) plus two for thin
//! provisioning (`punch_hole`, `allocation`). Implementations:
//!
//! - [`FileDisk`]: a regular file or block device, optionally opened with `O_DIRECT` / `O_DSYNC`.
//! - [`MemDisk`]: memory only, for unit tests.
//! - [`FaultyDisk`]: keeps a *live* and a *durable* image; can crash (drop every unsynced
//!   write), tear in-flight writes, corrupt sectors and fail the next I/O. The fault model of
//!   STYLE.md (redb `crash_consistency.rs`, TigerBeetle `testing/storage.zig`).
//! - [`FullDisk`]: wraps a disk whose file system can fill up: writes, punches and (on
//!   demand) syncs fail with ENOSPC, and a failed sync loses what it should have made durable.
//! - [`VolatileDisk`]: wraps a file and holds writes in memory until `sync`, so a process killed
//!   with `kill -9` loses exactly what it had not synced. Used by the crash tests of the real
//!   binary: a build that acknowledges before syncing fails them. Its write-through mode
//!   stands for an `O_DSYNC` device: a write is durable when it returns.
//!
//! All offsets and lengths are bytes, `u64`. Reads past the end fail with `UnexpectedEof`.

use std::io;

mod aligned;
mod extent;
mod fail_after;
mod faulty;
mod file;
mod full;
mod mem;
mod range;
mod rng;
mod volatile;

pub use aligned::AlignedBuf;
pub use fail_after::FailAfter;
pub use faulty::{CrashMode, Faults, FaultyDisk, DEFAULT_SECTOR_SIZE};
pub use file::{FileDisk, OpenOptions};
pub use full::FullDisk;
pub use mem::MemDisk;
pub use volatile::VolatileDisk;

/// One extent of a [`Disk::allocation`] answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub offset: u64,
    pub len: u64,
    /// `false`: a hole, reads as zeros and costs no space.
    pub allocated: bool,
}

/// The disk trait. Implementations must be usable from several threads at once; writes to
/// disjoint ranges may proceed in parallel.
// `len` is fallible I/O, not a container size; an `is_empty` would only add a second syscall.
#[allow(clippy::len_without_is_empty)]
pub trait Disk: Send + Sync + std::fmt::Debug {
    /// Fill `buf` from `offset`. Fails with `UnexpectedEof` if the range passes the end.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Fill `buf` from `offset` only if that needs no wait for the device (the bytes are in
    /// memory: the page cache, or a disk that lives in memory). `Ok(false)`: it would have to
    /// wait, `buf` holds nothing usable and the caller reads with [`Disk::read_at`] where
    /// blocking is allowed. Lets an async server answer a cached read on its own thread
    /// instead of handing it to a blocking pool. The default never tries.
    fn read_cached(&self, _buf: &mut [u8], _offset: u64) -> io::Result<bool> {
        Ok(false)
    }
    /// A hint that `[offset, offset + len)` will be read soon: a buffered file starts reading
    /// it into the page cache and returns without waiting for it. Lets a reader of many
    /// scattered pieces have the device fetch them together instead of one after another.
    /// Changes nothing a read returns; the default does nothing.
    fn prefetch(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }
    /// Write all of `buf` at `offset`. Not durable until [`Disk::sync`] returns.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Make every completed write durable (fdatasync). An error here is final: callers must not
    /// retry and assume the data is safe (the fsync-gate lesson).
    fn sync(&self) -> io::Result<()>;
    /// Sends what was written to `[offset, offset+len)` on to the device and waits for it,
    /// without the cache flush that ends [`Disk::sync`]: not a durability point (a `sync` must
    /// still follow). Lets a writer of a large batch hand it to the device in small pieces
    /// instead of one burst at its `sync`, so the device's queue never holds much of it
    /// ahead of another writer's small durable writes. The default does nothing.
    fn write_out(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }
    /// Current length in bytes.
    fn len(&self) -> io::Result<u64>;
    /// Grow or shrink. Growing adds a hole.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Deallocate `[offset, offset+len)`: it reads back as zeros afterwards. Files punch a hole;
    /// the default writes zeros.
    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        write_zeros(self, offset, len)
    }
    /// Allocated and unallocated extents covering `[offset, offset+len)`, in order. The default
    /// reports everything allocated.
    fn allocation(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
        Ok(vec![Extent {
            offset,
            len,
            allocated: true,
        }])
    }
    /// Whether `write_at` needs buffers, offsets and lengths aligned to this many bytes
    /// (`O_DIRECT`). 1 when any alignment works.
    fn alignment(&self) -> usize {
        1
    }
}

/// Writes zeros over a range in bounded chunks, from a buffer aligned to the disk's
/// [`Disk::alignment`] (so an `O_DIRECT` disk takes it when `offset` and `len` are aligned).
pub fn write_zeros<D: Disk + ?Sized>(disk: &D, offset: u64, len: u64) -> io::Result<()> {
    const CHUNK: u64 = 1 << 20;
    let zeros = AlignedBuf::new(range::to_usize(CHUNK.min(len))?, disk.alignment())?;
    let mut done = 0u64;
    while done < len {
        let n = CHUNK.min(len - done);
        disk.write_at(&zeros[..range::to_usize(n)?], offset + done)?;
        done += n;
    }
    Ok(())
}

impl<D: Disk + ?Sized> Disk for std::sync::Arc<D> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        (**self).read_at(buf, offset)
    }
    fn read_cached(&self, buf: &mut [u8], offset: u64) -> io::Result<bool> {
        (**self).read_cached(buf, offset)
    }
    fn prefetch(&self, offset: u64, len: u64) -> io::Result<()> {
        (**self).prefetch(offset, len)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        (**self).write_at(buf, offset)
    }
    fn sync(&self) -> io::Result<()> {
        (**self).sync()
    }
    fn write_out(&self, offset: u64, len: u64) -> io::Result<()> {
        (**self).write_out(offset, len)
    }
    fn len(&self) -> io::Result<u64> {
        (**self).len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        (**self).set_len(len)
    }
    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        (**self).punch_hole(offset, len)
    }
    fn allocation(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
        (**self).allocation(offset, len)
    }
    fn alignment(&self) -> usize {
        (**self).alignment()
    }
}
