//! A RAM-backed [`BlockBackend`] for tests and examples, with thin provisioning: unmapped
//! blocks hold no memory and read as zeros.

use std::collections::BTreeMap;
use std::sync::RwLock;

use async_trait::async_trait;
use bytes::Bytes;

use crate::backend::{BackendError, BlockBackend, CompareOutcome, Geometry, Provisioning};

/// An in-memory logical unit. Blocks live in a map keyed by LBA; absent means deallocated.
#[derive(Debug)]
pub struct MemoryBackend {
    geometry: Geometry,
    blocks: RwLock<BTreeMap<u64, Box<[u8]>>>,
}

impl MemoryBackend {
    /// A zeroed, fully deallocated unit of `block_count` blocks of `block_size` bytes.
    pub fn new(serial: &str, block_size: u32, block_count: u64) -> Self {
        let mut naa_id = [0u8; 16];
        for (i, b) in serial.bytes().enumerate() {
            naa_id[i % 16] ^= b;
        }
        Self {
            geometry: Geometry {
                block_size,
                block_count,
                read_only: false,
                can_unmap: true,
                max_transfer_blocks: (8 << 20) / block_size,
                physical_block_size: block_size,
                // Every write holds the map's write lock throughout.
                max_atomic_blocks: (8 << 20) / block_size,
                serial: serial.into(),
                naa_id,
            },
            blocks: RwLock::new(BTreeMap::new()),
        }
    }

    /// The same unit, refusing writes.
    pub fn read_only(mut self) -> Self {
        self.geometry.read_only = true;
        self
    }

    /// The same unit, reporting physical blocks of `bytes` (a power-of-two multiple of the
    /// block size), as a device with a larger internal page would.
    pub fn with_physical_block_size(mut self, bytes: u32) -> Self {
        self.geometry.physical_block_size = bytes;
        self
    }

    /// The same unit, promising atomicity for writes of at most `blocks` blocks (zero: none).
    pub fn with_max_atomic_blocks(mut self, blocks: u32) -> Self {
        self.geometry.max_atomic_blocks = blocks;
        self
    }

    fn bs(&self) -> usize {
        self.geometry.block_size as usize
    }

    fn read_locked(&self, map: &BTreeMap<u64, Box<[u8]>>, lba: u64, blocks: u64) -> Vec<u8> {
        let bs = self.bs();
        let mut out = vec![0u8; blocks as usize * bs];
        for (&at, block) in map.range(lba..lba + blocks) {
            let start = (at - lba) as usize * bs;
            out[start..start + bs].copy_from_slice(block);
        }
        out
    }

    fn write_locked(&self, map: &mut BTreeMap<u64, Box<[u8]>>, lba: u64, data: &[u8]) {
        for (i, chunk) in data.chunks_exact(self.bs()).enumerate() {
            map.insert(lba + i as u64, chunk.into());
        }
    }
}

fn poisoned() -> BackendError {
    BackendError::Write("memory backend lock poisoned".into())
}

#[async_trait]
impl BlockBackend for MemoryBackend {
    fn geometry(&self) -> Geometry {
        self.geometry.clone()
    }

    async fn read(&self, lba: u64, blocks: u32) -> Result<Vec<u8>, BackendError> {
        let map = self.blocks.read().map_err(|_| poisoned())?;
        Ok(self.read_locked(&map, lba, u64::from(blocks)))
    }

    async fn write(&self, lba: u64, data: Bytes) -> Result<(), BackendError> {
        if self.geometry.read_only {
            return Err(BackendError::ReadOnly);
        }
        let mut map = self.blocks.write().map_err(|_| poisoned())?;
        self.write_locked(&mut map, lba, &data);
        Ok(())
    }

    async fn flush(&self) -> Result<(), BackendError> {
        Ok(())
    }

    async fn unmap(&self, lba: u64, blocks: u64) -> Result<(), BackendError> {
        if self.geometry.read_only {
            return Err(BackendError::ReadOnly);
        }
        let mut map = self.blocks.write().map_err(|_| poisoned())?;
        let doomed: Vec<u64> = map.range(lba..lba + blocks).map(|(k, _)| *k).collect();
        for key in doomed {
            map.remove(&key);
        }
        Ok(())
    }

    async fn compare_and_write(
        &self,
        lba: u64,
        expected: &[u8],
        data: &[u8],
    ) -> Result<CompareOutcome, BackendError> {
        if self.geometry.read_only {
            return Err(BackendError::ReadOnly);
        }
        // One write lock covers the compare and the write, which is what makes it atomic.
        let mut map = self.blocks.write().map_err(|_| poisoned())?;
        let blocks = (expected.len() / self.bs()) as u64;
        let current = self.read_locked(&map, lba, blocks);
        if let Some(offset) = current.iter().zip(expected).position(|(a, b)| a != b) {
            return Ok(CompareOutcome::Mismatch {
                offset: offset as u64,
            });
        }
        self.write_locked(&mut map, lba, data);
        Ok(CompareOutcome::Written)
    }

    async fn or_write(&self, lba: u64, data: &[u8]) -> Result<(), BackendError> {
        if self.geometry.read_only {
            return Err(BackendError::ReadOnly);
        }
        let mut map = self.blocks.write().map_err(|_| poisoned())?;
        let blocks = (data.len() / self.bs()) as u64;
        let mut merged = self.read_locked(&map, lba, blocks);
        for (m, d) in merged.iter_mut().zip(data) {
            *m |= d;
        }
        self.write_locked(&mut map, lba, &merged);
        Ok(())
    }

    async fn lba_status(&self, lba: u64) -> Result<(Provisioning, u64), BackendError> {
        let map = self.blocks.read().map_err(|_| poisoned())?;
        let end = self.geometry.block_count;
        let mapped = map.contains_key(&lba);
        let mut run = 1;
        while lba + run < end && map.contains_key(&(lba + run)) == mapped {
            run += 1;
        }
        let state = if mapped {
            Provisioning::Mapped
        } else {
            Provisioning::Deallocated
        };
        Ok((state, run))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn thin_provisioning() {
        let m = MemoryBackend::new("s", 512, 16);
        assert_eq!(m.read(0, 2).await.unwrap(), vec![0; 1024]);
        m.write(2, Bytes::from_static(&[7u8; 1024])).await.unwrap();
        assert_eq!(
            m.lba_status(0).await.unwrap(),
            (Provisioning::Deallocated, 2)
        );
        assert_eq!(m.lba_status(2).await.unwrap(), (Provisioning::Mapped, 2));
        m.unmap(3, 1).await.unwrap();
        assert_eq!(m.read(3, 1).await.unwrap(), vec![0; 512]);
        assert_eq!(
            m.lba_status(4).await.unwrap(),
            (Provisioning::Deallocated, 12)
        );
    }

    #[tokio::test]
    async fn compare_and_write_is_conditional() {
        let m = MemoryBackend::new("s", 512, 4);
        let mut wrong = vec![0u8; 512];
        wrong[10] = 1;
        let out = m.compare_and_write(0, &wrong, &[9; 512]).await.unwrap();
        assert_eq!(out, CompareOutcome::Mismatch { offset: 10 });
        let out = m.compare_and_write(0, &[0; 512], &[9; 512]).await.unwrap();
        assert_eq!(out, CompareOutcome::Written);
        assert_eq!(m.read(0, 1).await.unwrap(), vec![9; 512]);
    }

    #[tokio::test]
    async fn or_write_merges_bits() {
        let m = MemoryBackend::new("s", 512, 4);
        m.write(1, Bytes::from_static(&[0x0f; 512])).await.unwrap();
        m.or_write(1, &[0x30; 1024]).await.unwrap();
        assert_eq!(m.read(1, 1).await.unwrap(), vec![0x3f; 512]);
        assert_eq!(m.read(2, 1).await.unwrap(), vec![0x30; 512]);
        assert_eq!(m.lba_status(2).await.unwrap().0, Provisioning::Mapped);
        let ro = MemoryBackend::new("s", 512, 4).read_only();
        assert_eq!(ro.or_write(0, &[1; 512]).await, Err(BackendError::ReadOnly));
    }
}
