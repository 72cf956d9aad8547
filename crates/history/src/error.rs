//! The history engine's errors.

use std::path::PathBuf;

/// Why a history operation failed.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("I/O on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is damaged at byte {at}: {why}")]
    Corrupt { path: PathBuf, at: u64, why: String },
    #[error("log: {0}")]
    Log(#[from] mariner_log::LogError),
    #[error("index: {0}")]
    Index(#[from] mariner_bosc::Error),
    #[error("{0}")]
    Config(String),
    #[error("volume {volume}: {asked} is outside the history window ({window})")]
    Expired {
        volume: u32,
        asked: String,
        window: String,
    },
    #[error("volume {0}: its history was lost when the log filled faster than it could be kept, and is not readable until it is seeded again")]
    Broken(u32),
    #[error("volume {0} has no history")]
    UnknownVolume(u32),
    #[error("bytes {offset}+{len} are not whole 512-byte sectors of the volume, or lie past its end ({size} bytes)")]
    BadRange { offset: u64, len: u64, size: u64 },
    #[error("digest append refused: {0}")]
    DigestAppend(String),
    #[error("digests unusable after an earlier failure ({0}); reopen them")]
    DigestsFailed(String),
    #[error("volume {0}: a rollback is already pending or running")]
    RollbackRunning(u32),
    #[error("volume {0} has no pending rollback")]
    NoRollback(u32),
    #[error("volume {volume}: a rollback write failed: {why}")]
    RollbackWrite { volume: u32, why: String },
    /// Refused for now; the same call may succeed later.
    #[error("{0}")]
    Retry(String),
}
