//! [`FileDisk`]: a regular file or a block device.

use std::fs::File;
use std::io::{self, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::Path;

use crate::range::{end, eof, invalid};
use crate::{extent, Disk, Extent};

/// The alignment promised for `O_DIRECT`: no device in use has a logical block larger than a page,
/// so 4096 is always accepted, if sometimes stricter than needed.
const DIRECT_ALIGN: usize = 4096;

/// How to open a [`FileDisk`]. All flags default to `false`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpenOptions {
    /// Create the file if it does not exist (not with `read_only`).
    pub create: bool,
    /// `O_DIRECT`: bypass the page cache. Buffers, offsets and lengths must then be aligned to
    /// [`Disk::alignment`].
    pub direct: bool,
    /// `O_DSYNC`: every write is durable when it returns.
    pub dsync: bool,
    /// Open for reading only; writes fail.
    pub read_only: bool,
    /// Random access: `posix_fadvise(POSIX_FADV_RANDOM)`, so a buffered read of one block
    /// reads that block and no read-ahead around it. For files read a block at a time at
    /// random (an index's leaves or pages), where read-ahead fetches pages nobody asked for
    /// and, under a memory limit, evicts pages that were wanted.
    pub random: bool,
}

impl OpenOptions {
    pub fn new() -> OpenOptions {
        OpenOptions::default()
    }

    pub fn create(mut self, create: bool) -> OpenOptions {
        self.create = create;
        self
    }

    pub fn direct(mut self, direct: bool) -> OpenOptions {
        self.direct = direct;
        self
    }

    pub fn dsync(mut self, dsync: bool) -> OpenOptions {
        self.dsync = dsync;
        self
    }

    pub fn read_only(mut self, read_only: bool) -> OpenOptions {
        self.read_only = read_only;
        self
    }

    pub fn random(mut self, random: bool) -> OpenOptions {
        self.random = random;
        self
    }

    fn custom_flags(&self) -> i32 {
        let mut flags = 0;
        if self.direct {
            flags |= libc::O_DIRECT;
        }
        if self.dsync {
            flags |= libc::O_DSYNC;
        }
        flags
    }
}

/// A regular file or a block device, read and written with `pread`/`pwrite` so that several
/// threads can use it at once.
#[derive(Debug)]
pub struct FileDisk {
    file: File,
    direct: bool,
    block_device: bool,
}

impl FileDisk {
    /// Opens `path` as a disk.
    pub fn open(path: impl AsRef<Path>, options: &OpenOptions) -> io::Result<FileDisk> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(!options.read_only)
            .create(options.create)
            .truncate(false)
            .custom_flags(options.custom_flags())
            .open(path)?;
        let block_device = file.metadata()?.file_type().is_block_device();
        if options.random {
            // SAFETY: the descriptor is open for as long as `file` lives; fadvise only records
            // an access-pattern hint for it.
            let rc =
                unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
            if rc != 0 {
                return Err(io::Error::from_raw_os_error(rc));
            }
        }
        Ok(FileDisk {
            file,
            direct: options.direct,
            block_device,
        })
    }

    /// Creates a sparse regular file of `len` bytes at `path`, discarding any previous content,
    /// and opens it with default options.
    pub fn create_sized(path: impl AsRef<Path>, len: u64) -> io::Result<FileDisk> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        file.set_len(len)?;
        Ok(FileDisk {
            file,
            direct: false,
            block_device: false,
        })
    }

    /// The underlying file.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Whether the disk is a block device rather than a regular file.
    pub fn is_block_device(&self) -> bool {
        self.block_device
    }

    /// Turns `O_DIRECT` off, so unaligned I/O works; used by [`crate::VolatileDisk`], which
    /// still enforces the alignment itself so its callers behave as they would on the real disk.
    pub(crate) fn make_buffered(&mut self) -> io::Result<()> {
        if !self.direct {
            return Ok(());
        }
        let fd = self.file.as_raw_fd();
        // SAFETY: `fd` is open for as long as `self.file` lives; F_GETFL takes no argument and
        // only reads the descriptor's status flags.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if flags < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: as above; F_SETFL takes an int argument and only changes status flags.
        if unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_DIRECT) } < 0 {
            return Err(io::Error::last_os_error());
        }
        self.direct = false;
        Ok(())
    }

    fn check_aligned(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        check_aligned(self.alignment(), buf, offset)
    }

    /// `fallocate(PUNCH_HOLE | KEEP_SIZE)`; `Ok(false)` when the file system does not support it.
    fn fallocate_punch(&self, offset: u64, len: u64) -> io::Result<bool> {
        let offset = off_t(offset)?;
        let len = off_t(len)?;
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        loop {
            // SAFETY: the descriptor is open for as long as `self.file` lives; fallocate touches
            // no memory of ours.
            let rc = unsafe { libc::fallocate(self.file.as_raw_fd(), mode, offset, len) };
            if rc == 0 {
                return Ok(true);
            }
            let err = io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EOPNOTSUPP) => return Ok(false),
                // Block devices refuse ranges not aligned to their sector size with EINVAL.
                Some(libc::EINVAL) if self.block_device => return Ok(false),
                _ => return Err(err),
            }
        }
    }

    /// `lseek(pos, whence)`; `None` on ENXIO (no data, or no hole, at or after `pos`).
    fn seek_data_or_hole(&self, pos: u64, whence: i32) -> io::Result<Option<u64>> {
        let pos = off_t(pos)?;
        // SAFETY: the descriptor is open for as long as `self.file` lives. The file position
        // moves, which nothing relies on: all I/O here is positional (pread/pwrite).
        let rc = unsafe { libc::lseek(self.file.as_raw_fd(), pos, whence) };
        if rc >= 0 {
            return Ok(Some(rc.unsigned_abs()));
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::ENXIO) => Ok(None),
            _ => Err(err),
        }
    }

    /// The extents of `[offset, end)` found with SEEK_DATA / SEEK_HOLE.
    fn seek_extents(&self, offset: u64, end: u64) -> io::Result<Vec<Extent>> {
        let mut list = Vec::new();
        let mut pos = offset;
        while pos < end {
            let data = self
                .seek_data_or_hole(pos, libc::SEEK_DATA)?
                .unwrap_or(end)
                .min(end);
            extent::push(&mut list, pos, data - pos, false);
            if data >= end {
                break;
            }
            let hole = self
                .seek_data_or_hole(data, libc::SEEK_HOLE)?
                .unwrap_or(end)
                .min(end);
            // SEEK_HOLE at a data offset always moves forward; guard against a loop anyway.
            let hole = hole.max(data + 1).min(end);
            extent::push(&mut list, data, hole - data, true);
            pos = hole;
        }
        Ok(list)
    }
}

impl Disk for FileDisk {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check_aligned(buf, offset)?;
        // No file reaches past off_t: report EOF as the contract says, not the kernel's EINVAL.
        let beyond_off_t = offset
            .checked_add(buf.len() as u64)
            .and_then(|e| off_t(e).ok());
        if beyond_off_t.is_none() {
            return Err(eof(offset, buf.len(), self.len()?));
        }
        self.file.read_exact_at(buf, offset)
    }

    /// `preadv2(RWF_NOWAIT)`: the kernel copies what the page cache holds and returns
    /// `EAGAIN` (or a short count) where it would have to read the device.
    fn read_cached(&self, buf: &mut [u8], offset: u64) -> io::Result<bool> {
        if self.direct {
            return Ok(false);
        }
        let mut done = 0usize;
        while done < buf.len() {
            let rest = &mut buf[done..];
            let iov = libc::iovec {
                iov_base: rest.as_mut_ptr().cast(),
                iov_len: rest.len(),
            };
            // Past off_t: read_at reports the end of the file.
            let Some(at) = offset
                .checked_add(done as u64)
                .and_then(|at| off_t(at).ok())
            else {
                return Ok(false);
            };
            // SAFETY: `iov` points at `rest`, a live, exclusively borrowed buffer of
            // `iov_len` bytes, for the duration of the call; the fd is owned by `self.file`.
            let n = unsafe { libc::preadv2(self.file.as_raw_fd(), &iov, 1, at, libc::RWF_NOWAIT) };
            match n {
                // Would block; an old kernel or file system without RWF_NOWAIT says so too.
                n if n < 0 => {
                    let e = io::Error::last_os_error();
                    return match e.raw_os_error() {
                        Some(libc::EAGAIN | libc::EOPNOTSUPP | libc::EINVAL) => Ok(false),
                        Some(libc::EINTR) => continue,
                        _ => Err(e),
                    };
                }
                // End of file, or the rest not cached: read_at decides which.
                0 => return Ok(false),
                n => done += n as usize,
            }
        }
        Ok(true)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.check_aligned(buf, offset)?;
        self.file.write_all_at(buf, offset)
    }

    fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    /// `posix_fadvise(POSIX_FADV_WILLNEED)`: the kernel queues reads of the range's pages not
    /// in the page cache and returns. Nothing for `O_DIRECT`, whose reads bypass the cache.
    fn prefetch(&self, offset: u64, len: u64) -> io::Result<()> {
        if self.direct || len == 0 {
            return Ok(());
        }
        let (off, n) = (off_t(offset)?, off_t(len)?);
        // SAFETY: fadvise takes the file's descriptor, owned by `self.file` and open for the
        // call's duration, and integers; it touches no memory of ours.
        let rc = unsafe {
            libc::posix_fadvise(self.file.as_raw_fd(), off, n, libc::POSIX_FADV_WILLNEED)
        };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(())
    }

    fn write_out(&self, offset: u64, len: u64) -> io::Result<()> {
        if self.direct || len == 0 {
            // `O_DIRECT` writes are on the device when they return.
            return Ok(());
        }
        let (Ok(off), Ok(n)) = (i64::try_from(offset), i64::try_from(len)) else {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        };
        let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
            | libc::SYNC_FILE_RANGE_WRITE
            | libc::SYNC_FILE_RANGE_WAIT_AFTER;
        // SAFETY: sync_file_range takes the file's descriptor, owned by `self.file` and open
        // for the call's duration, and integers; it touches no memory of ours.
        let rc = unsafe { libc::sync_file_range(self.file.as_raw_fd(), off, n, flags) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        if self.block_device {
            // `metadata().len()` is 0 for a block device; seeking to the end gives its size.
            return (&self.file).seek(SeekFrom::End(0));
        }
        Ok(self.file.metadata()?.len())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        if self.block_device {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "cannot change the size of a block device",
            ));
        }
        self.file.set_len(len)
    }

    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        let end = end(offset, len)?;
        if len == 0 || self.fallocate_punch(offset, len)? {
            return Ok(());
        }
        // Like KEEP_SIZE: writing zeros must not grow the file.
        let end = end.min(self.len()?);
        crate::write_zeros(self, offset, end.saturating_sub(offset))
    }

    fn allocation(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
        let end = end(offset, len)?;
        match self.seek_extents(offset, end) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                // No SEEK_DATA support (old kernels, some devices): everything is data.
                Ok(vec![Extent {
                    offset,
                    len,
                    allocated: true,
                }])
            }
            other => other,
        }
    }

    fn alignment(&self) -> usize {
        if self.direct {
            DIRECT_ALIGN
        } else {
            1
        }
    }
}

/// Rejects, with `InvalidInput`, a buffer, offset or length not aligned to `align`, as
/// `O_DIRECT` would (with a less helpful EINVAL).
pub(crate) fn check_aligned(align: usize, buf: &[u8], offset: u64) -> io::Result<()> {
    if align <= 1 {
        return Ok(());
    }
    let aligned = (buf.as_ptr() as usize).is_multiple_of(align)
        && buf.len().is_multiple_of(align)
        && offset.is_multiple_of(align as u64);
    if aligned {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "O_DIRECT I/O of {} bytes at {offset} is not aligned to {align} bytes",
                buf.len()
            ),
        ))
    }
}

fn off_t(n: u64) -> io::Result<libc::off_t> {
    libc::off_t::try_from(n).map_err(|_| invalid("offset does not fit in off_t"))
}
