//! A disk that starts failing: after a number of successful writes and syncs, every write and
//! sync fails with EIO. Lets end-to-end tests drive the real server into its failure path.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::{Disk, Extent};

#[derive(Debug)]
pub struct FailAfter<D> {
    inner: D,
    remaining: AtomicU64,
}

impl<D: Disk> FailAfter<D> {
    /// `inner` accepts `ops` more writes and syncs, then fails them all.
    pub fn new(inner: D, ops: u64) -> Self {
        Self {
            inner,
            remaining: AtomicU64::new(ops),
        }
    }

    fn take(&self) -> io::Result<()> {
        let ok = self
            .remaining
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if ok {
            Ok(())
        } else {
            Err(io::Error::from_raw_os_error(libc::EIO))
        }
    }
}

impl<D: Disk> Disk for FailAfter<D> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.take()?;
        self.inner.write_at(buf, offset)
    }
    fn sync(&self) -> io::Result<()> {
        self.take()?;
        self.inner.sync()
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        self.take()?;
        self.inner.punch_hole(offset, len)
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

    #[test]
    fn fails_after_the_budget() {
        let d = FailAfter::new(MemDisk::new(4096), 2);
        d.write_at(&[1; 512], 0).unwrap();
        d.sync().unwrap();
        assert_eq!(
            d.write_at(&[1; 512], 0).unwrap_err().raw_os_error(),
            Some(libc::EIO)
        );
        assert!(d.sync().is_err());
        let mut b = [0u8; 512];
        d.read_at(&mut b, 0).unwrap();
        assert_eq!(b, [1; 512]);
    }
}
