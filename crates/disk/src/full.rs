//! A disk on a file system that can fill up: while full, every write and punch fails with
//! ENOSPC; syncs can be made to fail with ENOSPC too. Lets the store's tests drive the
//! applier into running out of space and back out of it.
//!
//! A failed sync loses what was written since the last good one (the inner disk's ranges
//! written since then read as zeros afterwards): the worst Linux may do after a writeback
//! error, where the dirty pages can be dropped and a later fsync reports success. So a caller
//! that re-applies only from where it stopped, not from its last good sync, loses data.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Mutex;

use crate::{write_zeros, Disk, Extent};

#[derive(Debug)]
pub struct FullDisk<D> {
    inner: D,
    full: AtomicBool,
    /// Syncs left to fail with ENOSPC.
    failing_syncs: AtomicU64,
    /// Ranges written (or punched) since the last good sync, lost if the next sync fails.
    unsynced: Mutex<Vec<(u64, u64)>>,
    writes: AtomicU64,
}

fn no_space() -> io::Error {
    io::Error::from_raw_os_error(libc::ENOSPC)
}

impl<D: Disk> FullDisk<D> {
    /// `inner`, with room to spare until [`FullDisk::set_full`].
    pub fn new(inner: D) -> Self {
        Self {
            inner,
            full: AtomicBool::new(false),
            failing_syncs: AtomicU64::new(0),
            unsynced: Mutex::new(Vec::new()),
            writes: AtomicU64::new(0),
        }
    }

    /// While `full`, writes and punches fail with ENOSPC and change nothing.
    pub fn set_full(&self, full: bool) {
        self.full.store(full, SeqCst);
    }

    /// The next `n` syncs fail with ENOSPC, each losing what was written since the last good
    /// sync.
    pub fn fail_syncs(&self, n: u64) {
        self.failing_syncs.store(n, SeqCst);
    }

    /// Writes (and punches) that succeeded so far.
    pub fn writes(&self) -> u64 {
        self.writes.load(SeqCst)
    }

    fn room(&self) -> io::Result<()> {
        if self.full.load(SeqCst) {
            return Err(no_space());
        }
        Ok(())
    }

    fn wrote(&self, offset: u64, len: u64) {
        self.writes.fetch_add(1, SeqCst);
        if let Ok(mut u) = self.unsynced.lock() {
            u.push((offset, len));
        }
    }

    fn take_unsynced(&self) -> Vec<(u64, u64)> {
        self.unsynced
            .lock()
            .map(|mut u| std::mem::take(&mut *u))
            .unwrap_or_default()
    }
}

impl<D: Disk> Disk for FullDisk<D> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.room()?;
        self.inner.write_at(buf, offset)?;
        self.wrote(offset, buf.len() as u64);
        Ok(())
    }
    fn sync(&self) -> io::Result<()> {
        let failing = self
            .failing_syncs
            .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
            .is_ok();
        let lost = self.take_unsynced();
        if !failing {
            return self.inner.sync();
        }
        let len = self.inner.len()?;
        for (offset, n) in lost {
            let n = n.min(len.saturating_sub(offset));
            write_zeros(&self.inner, offset, n)?;
        }
        Err(no_space())
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        self.room()?;
        self.inner.punch_hole(offset, len)?;
        self.wrote(offset, len);
        Ok(())
    }
    fn allocation(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
        self.inner.allocation(offset, len)
    }
    fn alignment(&self) -> usize {
        self.inner.alignment()
    }
    fn prefetch(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.prefetch(offset, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemDisk;

    fn read(d: &impl Disk, offset: u64) -> [u8; 512] {
        let mut b = [0u8; 512];
        d.read_at(&mut b, offset).unwrap();
        b
    }

    #[test]
    fn full_refuses_writes_and_punches_with_enospc() {
        let d = FullDisk::new(MemDisk::new(4096));
        d.write_at(&[1; 512], 0).unwrap();
        d.set_full(true);
        let e = d.write_at(&[2; 512], 0).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
        assert_eq!(e.kind(), io::ErrorKind::StorageFull);
        assert!(d.punch_hole(0, 512).is_err());
        assert_eq!(read(&d, 0), [1; 512], "a refused write changes nothing");
        d.sync().unwrap();
        d.set_full(false);
        d.write_at(&[3; 512], 0).unwrap();
        assert_eq!(read(&d, 0), [3; 512]);
        assert_eq!(d.writes(), 2);
    }

    #[test]
    fn a_failed_sync_loses_what_was_written_since_the_last_good_one() {
        let d = FullDisk::new(MemDisk::new(4096));
        d.write_at(&[1; 512], 0).unwrap();
        d.sync().unwrap();
        d.write_at(&[2; 512], 512).unwrap();
        d.fail_syncs(1);
        assert_eq!(d.sync().unwrap_err().raw_os_error(), Some(libc::ENOSPC));
        assert_eq!(read(&d, 0), [1; 512], "synced before: kept");
        assert_eq!(read(&d, 512), [0; 512], "unsynced: lost");
        d.write_at(&[2; 512], 512).unwrap();
        d.sync().unwrap();
        assert_eq!(read(&d, 512), [2; 512]);
    }
}
