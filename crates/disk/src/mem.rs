//! [`MemDisk`]: a disk in memory, for unit tests.

use std::io;
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::range::{eof, past_end, to_usize, within};
use crate::Disk;

/// A disk held in a `Vec<u8>`. It only grows through [`Disk::set_len`]: a write past the end
/// fails with `InvalidInput`, so code that relies on a file growing implicitly is caught.
/// `sync` does nothing.
#[derive(Debug, Default)]
pub struct MemDisk {
    data: RwLock<Vec<u8>>,
}

impl MemDisk {
    /// A disk of `len` zero bytes.
    pub fn new(len: usize) -> MemDisk {
        MemDisk::from_vec(vec![0; len])
    }

    /// A disk holding `image`.
    pub fn from_vec(image: Vec<u8>) -> MemDisk {
        MemDisk {
            data: RwLock::new(image),
        }
    }

    /// A copy of the whole disk.
    pub fn to_vec(&self) -> Vec<u8> {
        self.read().clone()
    }

    // A panic while holding the lock leaves plain bytes behind, nothing half-updated that a
    // later reader could misinterpret, so poisoning is ignored.
    fn read(&self) -> RwLockReadGuard<'_, Vec<u8>> {
        self.data.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, Vec<u8>> {
        self.data.write().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Disk for MemDisk {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let data = self.read();
        let range = within(offset, buf.len(), data.len())
            .ok_or_else(|| eof(offset, buf.len(), data.len() as u64))?;
        buf.copy_from_slice(&data[range]);
        Ok(())
    }

    /// Always in memory: served when in range.
    fn read_cached(&self, buf: &mut [u8], offset: u64) -> io::Result<bool> {
        let data = self.read();
        let Some(range) = within(offset, buf.len(), data.len()) else {
            return Ok(false);
        };
        buf.copy_from_slice(&data[range]);
        Ok(true)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut data = self.write();
        let range = within(offset, buf.len(), data.len())
            .ok_or_else(|| past_end(offset, buf.len() as u64, data.len() as u64))?;
        data[range].copy_from_slice(buf);
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.read().len() as u64)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let len = to_usize(len)?;
        self.write().resize(len, 0);
        Ok(())
    }

    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        let mut data = self.write();
        let range = within(offset, to_usize(len)?, data.len())
            .ok_or_else(|| past_end(offset, len, data.len() as u64))?;
        data[range].fill(0);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_past_the_end_do_not_grow() -> io::Result<()> {
        let disk = MemDisk::new(10);
        let err = disk.write_at(b"abc", 8).err().map(|e| e.kind());
        assert_eq!(err, Some(io::ErrorKind::InvalidInput));
        assert_eq!(disk.len()?, 10);
        disk.set_len(11)?;
        disk.write_at(b"abc", 8)?;
        assert_eq!(&disk.to_vec()[8..], b"abc");
        Ok(())
    }

    #[test]
    fn punch_zeroes_and_reads_past_end_fail() -> io::Result<()> {
        let disk = MemDisk::from_vec(vec![1; 8]);
        disk.punch_hole(2, 3)?;
        assert_eq!(disk.to_vec(), [1, 1, 0, 0, 0, 1, 1, 1]);
        let mut buf = [0; 2];
        let err = disk.read_at(&mut buf, 7).err().map(|e| e.kind());
        assert_eq!(err, Some(io::ErrorKind::UnexpectedEof));
        Ok(())
    }
}
