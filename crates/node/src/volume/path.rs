//! The seam between a volume and the front ends: the read path and the write path, in bytes.
//!
//! [`crate::volume::Volume`] implements both; a point-in-time view of history (read path
//! only, writes refused) or a replication gateway can implement them later and be served by
//! the NBD and SCSI adapters unchanged. The methods return their futures as
//! `impl Future` (no box, no allocation per request through the seam itself).

use std::future::Future;

use bytes::Bytes;
use mariner_store::Allocation;

use super::{Volume, VolumeError, PAGE_BYTES};

/// What the front ends announce of a volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    pub name: String,
    pub size_bytes: u64,
    /// The logical block: SCSI's unit of addressing; NBD serves any byte range.
    pub block_size: u32,
    /// The preferred I/O size and the physical block: a smaller write costs a
    /// read-modify-write of the page.
    pub physical_block_bytes: u32,
    /// The largest read or write; a write of up to this size is atomic.
    pub max_io_bytes: u64,
    /// Read-only until an operator acts (running out of space passes, so it is not here).
    pub read_only: bool,
}

/// How [`WritePath::zero`] zeroes a range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Zeroing {
    /// Deallocates: reads as zeros and costs no space once applied (NBD TRIM, SCSI UNMAP).
    Trim,
    /// Writes zeros (NBD WRITE_ZEROES).
    Write,
}

/// Reads of a volume.
pub trait ReadPath: Send + Sync {
    fn shape(&self) -> Shape;

    /// Reads `[offset, offset + len)`: every write acknowledged before the read began.
    fn read(
        &self,
        offset: u64,
        len: u64,
    ) -> impl Future<Output = Result<Vec<u8>, VolumeError>> + Send;

    /// [`ReadPath::read`] into `buf`: `buf.len()` bytes at `offset`. Every byte of `buf` is
    /// overwritten, so a front end may reuse its buffers (a new one per large read cost a
    /// page fault per 4 KiB of it).
    fn read_into(
        &self,
        offset: u64,
        buf: Vec<u8>,
    ) -> impl Future<Output = Result<Vec<u8>, VolumeError>> + Send;

    /// How `[offset, offset + len)` (clipped to the volume) is allocated, as runs in order.
    fn allocation(
        &self,
        offset: u64,
        len: u64,
    ) -> impl Future<Output = Result<Vec<(u64, Allocation)>, VolumeError>> + Send;

    /// Whether every completed write is durable (it is, unless the volume failed).
    fn flush(&self) -> Result<(), VolumeError>;
}

/// Writes of a volume. Each returns once what it wrote is durable.
pub trait WritePath: ReadPath {
    /// Writes any byte range; a write of up to [`Shape::max_io_bytes`] is atomic.
    fn write(
        &self,
        offset: u64,
        data: Bytes,
    ) -> impl Future<Output = Result<(), VolumeError>> + Send;

    /// Zeroes any byte range.
    fn zero(
        &self,
        offset: u64,
        len: u64,
        how: Zeroing,
    ) -> impl Future<Output = Result<(), VolumeError>> + Send;

    /// If the bytes at `offset` equal `expected`, writes `data` (same length), atomically
    /// against every other writer; else returns the offset of the first differing byte.
    fn compare_and_write(
        &self,
        offset: u64,
        expected: &[u8],
        data: Bytes,
    ) -> impl Future<Output = Result<Option<u64>, VolumeError>> + Send;

    /// ORs `data` into the bytes at `offset`, atomically against every other writer.
    fn or_write(
        &self,
        offset: u64,
        data: &[u8],
    ) -> impl Future<Output = Result<(), VolumeError>> + Send;

    /// Whether a writer that is not a registered SCSI initiator (an NBD client) may write
    /// now: [`VolumeError::Reserved`] while a reservation excludes it.
    fn unregistered_may_write(&self) -> Result<(), VolumeError>;
}

impl ReadPath for Volume {
    fn shape(&self) -> Shape {
        let (name, size_bytes, block_size) =
            self.with_meta(|m| (m.name.clone(), m.size_bytes, m.block_size));
        Shape {
            name,
            size_bytes,
            block_size,
            physical_block_bytes: PAGE_BYTES.max(block_size),
            max_io_bytes: self.max_io_bytes(),
            read_only: self.read_only_lasting(),
        }
    }

    async fn read(&self, offset: u64, len: u64) -> Result<Vec<u8>, VolumeError> {
        self.read_bytes(offset, len).await
    }

    async fn read_into(&self, offset: u64, buf: Vec<u8>) -> Result<Vec<u8>, VolumeError> {
        self.read_bytes_into(offset, buf).await
    }

    async fn allocation(
        &self,
        offset: u64,
        len: u64,
    ) -> Result<Vec<(u64, Allocation)>, VolumeError> {
        self.allocated(offset, len).await
    }

    fn flush(&self) -> Result<(), VolumeError> {
        match self.failure() {
            Some(why) => Err(VolumeError::Failed(why)),
            None => Ok(()),
        }
    }
}

impl WritePath for Volume {
    async fn write(&self, offset: u64, data: Bytes) -> Result<(), VolumeError> {
        self.write_bytes(offset, data).await
    }

    async fn zero(&self, offset: u64, len: u64, how: Zeroing) -> Result<(), VolumeError> {
        match how {
            Zeroing::Trim => self.trim_bytes(offset, len).await,
            Zeroing::Write => self.zero_bytes(offset, len).await,
        }
    }

    async fn compare_and_write(
        &self,
        offset: u64,
        expected: &[u8],
        data: Bytes,
    ) -> Result<Option<u64>, VolumeError> {
        self.compare_and_write_bytes(offset, expected, data).await
    }

    async fn or_write(&self, offset: u64, data: &[u8]) -> Result<(), VolumeError> {
        self.or_write_bytes(offset, data).await
    }

    fn unregistered_may_write(&self) -> Result<(), VolumeError> {
        Volume::unregistered_may_write(self)
    }
}
