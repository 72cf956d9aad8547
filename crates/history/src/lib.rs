//! History: every write of the protection window kept, and the volume readable as of any
//! instant in it (lu-dissertation ch. 4; ../shared/DESIGN.md "History").
//!
//! The history engine consumes the Trail log's durable records behind the write path — a
//! write is acknowledged when its log record is durable, as without history — and keeps:
//! - the **TL digests** ([`digest`]): per batch of records, in sequence (so time) order, what
//!   each record touched (volume, extent, kind, volume sequence number, timestamp, log
//!   address). Time → sequence number, diff and activity read these, never payloads.
//! - the **LT index** (`index`): a BOSC B+tree from (volume, piece, volume sequence number)
//!   to the record's log address, where a record's extent is cut into aligned pieces
//!   ([`pieces`]) so that a one-block lookup costs one seek per piece level, however often
//!   the neighbouring blocks were written.
//! - **base images**: each volume as of the window's start, rolled forward as records leave
//!   the window. A read as of T is "the newest version ≤ T in the index, else the base".
//!
//! The log keeps what history needs through a shrinkable holder ("history"): when the log
//! fills before the window ends, history shrinks from its old end, never silently.
//!
//! On top: pins hold instants against expiry (`pins`), diff and activity read the digests
//! only (`changes`), and a rollback rewrites a volume's changed blocks as of an earlier
//! instant as new writes, resumable after a crash (`rollback`, `rollback_file`).

mod changes;
pub mod digest;
mod engine;
mod error;
pub mod files;
pub mod fuzzing;
pub mod index;
mod lifecycle;
pub mod pieces;
mod pins;
mod read;
mod retention;
mod roll;
mod rollback;
pub mod rollback_file;
mod round;
mod seed;
mod sink;
pub mod state;
mod tail;
mod workers;

pub use changes::{Bucket, Changes, Extent};
pub use engine::{History, HistoryConfig, HistoryStats, HOLDER};
pub use error::HistoryError;
pub use index::IndexConfig;
pub use pins::PinId;
pub use read::{At, Held, Point, Window, ALLOCATION_SPAN};
pub use rollback::{RollbackStatus, RollbackWrite};
pub use seed::SeedPoint;

/// What history keeps of one durable record: everything but its payload, which stays in the
/// log at `addr` until the record leaves the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DigestEntry {
    /// The log's sequence number (global, over all volumes).
    pub seq: u64,
    pub volume: u32,
    pub kind: mariner_log::RecordKind,
    /// The volume's own sequence number: the `@N` of an instant.
    pub volume_seq: u64,
    pub timestamp_ns: u64,
    /// Volume byte offset (for `VolumeCreated`/`VolumeResized`: the new size).
    pub offset: u64,
    /// Bytes covered (for `VolumeCreated`: the block size).
    pub length: u32,
    /// Where the record lies in the log.
    pub addr: mariner_log::LogAddr,
}
