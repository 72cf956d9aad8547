//! The interface a volume implements to be served as a SCSI logical unit.
//!
//! The executor checks every request against [`Geometry`] (range, transfer limits, read-only)
//! before calling a [`BlockBackend`] method, so implementations see only in-range requests in
//! whole blocks. Every method may run concurrently with the others.

use async_trait::async_trait;
use bytes::Bytes;

/// What the executor needs to know about a logical unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Geometry {
    /// Logical block size in bytes (512 or 4096).
    pub block_size: u32,
    /// Number of logical blocks.
    pub block_count: u64,
    /// Writes are refused with DATA PROTECT.
    pub read_only: bool,
    /// UNMAP and WRITE SAME with UNMAP deallocate blocks, which then read as zeros.
    pub can_unmap: bool,
    /// Largest READ/WRITE transfer in blocks (reported in the Block Limits VPD page).
    pub max_transfer_blocks: u32,
    /// Bytes the medium stores as one unit: a power-of-two multiple of `block_size`; a write of
    /// fewer bytes costs the medium a read-modify-write (READ CAPACITY(16) reports the ratio).
    pub physical_block_size: u32,
    /// Largest write, in blocks, that is atomic (all of it or none, whatever the power loss or
    /// concurrent command): WRITE ATOMIC(16) accepts up to this many. Zero: no atomic writes.
    pub max_atomic_blocks: u32,
    /// Unit serial number (ASCII, VPD page 0x80). Shared, not owned: the geometry is built
    /// for every command, and a backend can hand out the same string each time.
    pub serial: std::sync::Arc<str>,
    /// 16-byte identifier reported as an NAA-6 designator (VPD page 0x83); byte 0's high nibble
    /// is replaced by the NAA type.
    pub naa_id: [u8; 16],
}

impl Geometry {
    /// Logical blocks per physical block (at least one).
    pub fn blocks_per_physical_block(&self) -> u32 {
        (self.physical_block_size / self.block_size.max(1)).max(1)
    }

    /// LOGICAL BLOCKS PER PHYSICAL BLOCK EXPONENT of READ CAPACITY(16): log2 of
    /// [`Geometry::blocks_per_physical_block`].
    pub fn physical_block_exponent(&self) -> u8 {
        self.blocks_per_physical_block().ilog2() as u8
    }
}

/// Errors a backend reports; each maps to sense data.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// A read failed (MEDIUM ERROR / UNRECOVERED READ ERROR).
    #[error("read error: {0}")]
    Read(String),
    /// A write or flush failed (MEDIUM ERROR / WRITE ERROR).
    #[error("write error: {0}")]
    Write(String),
    /// The volume refuses writes (DATA PROTECT / WRITE PROTECTED).
    #[error("volume is read-only")]
    ReadOnly,
    /// No room to store a write, for now (DATA PROTECT / SPACE ALLOCATION FAILED WRITE
    /// PROTECT, what a thinly provisioned unit reports).
    #[error("no space left")]
    NoSpace,
}

/// Result of an atomic compare-and-write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompareOutcome {
    /// The data matched and the new data is durable.
    Written,
    /// The data differed at this byte offset of the compared range; nothing was written.
    Mismatch {
        /// Offset of the first differing byte.
        offset: u64,
    },
}

/// Provisioning state of a run of blocks (GET LBA STATUS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provisioning {
    /// Mapped: holds written data.
    Mapped,
    /// Deallocated: reads as zeros and costs no space.
    Deallocated,
}

/// One logical unit's storage. Calls may run concurrently.
#[async_trait]
pub trait BlockBackend: Send + Sync {
    /// Current geometry; read on every command (cheap, may change between commands).
    fn geometry(&self) -> Geometry;
    /// The logical block size alone: asked for every command, so a backend whose geometry
    /// costs more to build (strings, locks) may answer it directly.
    fn block_size(&self) -> u32 {
        self.geometry().block_size
    }
    /// Reads `blocks` blocks starting at `lba`.
    async fn read(&self, lba: u64, blocks: u32) -> Result<Vec<u8>, BackendError>;
    /// Writes whole blocks at `lba`; the data is durable when this returns. The buffer is
    /// handed over (usually a slice of the transport's data-out buffer, never copied).
    async fn write(&self, lba: u64, data: Bytes) -> Result<(), BackendError>;
    /// Makes every completed write durable (a no-op when writes are durable on return).
    async fn flush(&self) -> Result<(), BackendError>;
    /// Deallocates `blocks` blocks at `lba`; they read as zeros afterwards. Durable on return.
    async fn unmap(&self, lba: u64, blocks: u64) -> Result<(), BackendError>;
    /// Atomically, against every other writer of the volume: compares the blocks at `lba`
    /// with `expected` and, only if equal, writes `data` (same length) durably.
    async fn compare_and_write(
        &self,
        lba: u64,
        expected: &[u8],
        data: &[u8],
    ) -> Result<CompareOutcome, BackendError>;
    /// Atomically, against every other writer of the volume: reads the blocks at `lba`,
    /// bitwise-ORs `data` into them and writes the result durably (ORWRITE).
    async fn or_write(&self, lba: u64, data: &[u8]) -> Result<(), BackendError>;
    /// Provisioning state of the run of blocks starting at `lba`: the state and how many
    /// blocks (at least one) share it.
    async fn lba_status(&self, lba: u64) -> Result<(Provisioning, u64), BackendError>;
}
