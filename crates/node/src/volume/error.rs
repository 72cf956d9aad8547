//! Errors of a volume's reads and writes, whichever front end asked. The front ends map them
//! to their protocol's (`crate::nbd`, `crate::iscsi`).

use mariner_log::LogError;
use mariner_store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// The volume was deleted, or the node is shutting down.
    #[error("the volume is gone (deleted, or the node is shutting down)")]
    Gone,
    /// The range lies outside the volume.
    #[error("the range lies outside the volume")]
    OutOfRange,
    /// An operator set the volume read-only, or the log or the store failed.
    #[error("the volume is read-only")]
    ReadOnly,
    /// The volume's image has no room: writes are refused until there is.
    #[error("no space left for the volume's writes")]
    NoSpace,
    /// A request that must be whole blocks is not (or does not fit one record).
    #[error("the request is not made of whole blocks")]
    Unaligned,
    /// A SCSI reservation excludes writers that are not registered initiators.
    #[error("the volume is reserved by an iSCSI initiator (SCSI reservation)")]
    Reserved,
    /// The log or the store failed: the volume is read-only until a restart.
    #[error("the volume failed: {0}")]
    Failed(String),
    #[error("log: {0}")]
    Log(LogError),
    #[error("store: {0}")]
    Store(StoreError),
    /// A read of the past failed: the instant left the window (history shrank past it) or
    /// history broke. Never answered with other data.
    #[error("history: {0}")]
    History(String),
    /// A blocking read task could not run to its end.
    #[error("read task: {0}")]
    Task(String),
}
