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
    #[error("digest append refused: {0}")]
    DigestAppend(String),
    #[error("digests unusable after an earlier failure ({0}); reopen them")]
    DigestsFailed(String),
}
