//! BOSC, the update-aware block engine of lu-dissertation ch. 3, and index structures on it.
//!
//! - [`Bosc`]: `modify(block, modification)` hands a modification to the application's
//!   update function ([`BlockApp`]) without reading the block; modifications wait in per-block
//!   in-memory queues under a memory budget (applied at once when the block is in memory), and
//!   a commit cycle sweeps the data disk in runs ([`runs`]), applying and writing them back.
//!   `query(block, f)` sees every acknowledged modification. Plain `read`/`write` remain.
//!   `modify_batch` logs many modifications with one group commit; `load` bulk-loads a fresh
//!   disk; `scan` reads blocks sequentially as `query` sees them (opens of the indexes).
//! - Durability ([`Durability`]): own-log mode logs each modification to a mariner-log before
//!   acknowledging it (sequence number, back pointer and CRC32C from the log; global and local
//!   frontiers in the payload, [`mod@format`]); caller-durable mode keeps only a checkpoint of the
//!   caller's log position. In own-log mode a modification is queued (and visible to queries)
//!   as it is handed to the log, so a caller can prepare more while the log writes; the
//!   write-ahead rule holds at the commit instead: no block is written in place before every
//!   modification merged into it is durable, and a modification the log fails to make durable
//!   fails the engine before it can reach the data disk (`tests/write_ahead.rs`).
//! - [`btree`]: the B+tree on BOSC (§3.3), keyed for the CDP version index; [`hash`]: the
//!   hash table on BOSC (§3.4.4) and the same table over plain read/write.
//!
//! Recovery argument (data disk; the log has its own in mariner-log):
//!
//! | crash during                         | on disk after                       | open does                      |
//! |--------------------------------------|-------------------------------------|--------------------------------|
//! | double-write of a batch of runs      | DW torn, in-place blocks untouched  | DW copies fail CRC: ignored    |
//! | in-place write of a batch            | DW complete, in-place maybe torn    | restore newest copies from DW  |
//! | checkpoint write                     | one slot torn, the other valid      | older checkpoint: replays more |
//! | anything, own-log mode               | records above the checkpoint        | requeue window; LSN skips dups |
//! | in-place write, no DW area (`dw_runs` 0, own log) | in-place maybe torn    | read every requeued block without an image: one torn fails open (`Error::Torn`) |
//! | move of shadow extents, before its `LoggedHomes` is durable | other homes maybe torn, current homes whole | map and log name the current homes; the move's modifications are requeued |
//! | after its `LoggedHomes` is durable   | moved extents synced in their new homes | the record moves them in the map; later frontiers drop what they carry |
//! | checkpoint write, shadow extents     | checkpoint or its map slot torn     | the newest checkpoint whose map slot has its counter, the older one otherwise |
//!
//! Media assumptions: writes may be lost, reordered or torn at sector granularity until
//! `sync` returns; synced data stays.

#![forbid(unsafe_code)]

pub mod btree;
pub mod format;
pub mod fuzzing;
pub mod hash;
pub mod runs;

mod engine;

pub use engine::{BlockApp, Bosc, BoscConfig, BoscStats, Change, Durability, OpenReport, WriteGap};
pub use format::Op;

/// What can go wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("log: {0}")]
    Log(#[from] mariner_log::LogError),
    #[error("configuration: {0}")]
    Config(String),
    #[error("the data disk holds no BOSC checkpoint")]
    NotFormatted,
    #[error("the data disk has BOSC format version {0}; this build reads only version {v}", v = format::FORMAT_VERSION)]
    UnsupportedVersion(u16),
    #[error("block {0} is outside the data disk")]
    OutOfRange(u64),
    #[error("block {block}: {error}")]
    Block {
        block: u64,
        error: format::BlockError,
    },
    /// Open found blocks a crash tore in place on a disk without a double-write area
    /// (`dw_runs` 0): what they held before the torn write is lost, so the tree is too. The
    /// application rebuilds it from what it was made from (history's LT index: its digests).
    #[error(
        "{count} block(s) torn by a crash (the first: block {first}) on a disk without a \
         double-write area: what they held is lost"
    )]
    Torn { first: u64, count: u64 },
    #[error("log record {0} is not a BOSC modification")]
    BadRecord(u64),
    #[error("operation does not match the durability mode")]
    WrongMode,
    #[error("caller position {position} is not above the last one, {last}")]
    PositionNotIncreasing { position: u64, last: u64 },
    #[error("engine failed earlier: {0}")]
    Failed(String),
    #[error("index: {0}")]
    Index(String),
}
