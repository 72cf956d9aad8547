//! Wires Mariner's components into a node: the data directory, the log devices and the Trail
//! log (mariner-log), the current-image store (mariner-store), the volumes, the NBD front end
//! (mariner-nbd), the iSCSI front end (mariner-iscsi), the admin API with `/metrics`, and graceful shutdown.
//!
//! The embedded default (`mariner serve` with no configuration) runs every role in this one
//! process: the gateway stamps each write with a sequence number and timestamp (the log does
//! it), the trail makes it durable, the store applies it (DESIGN.md "Roles and data flow").

pub mod admin;
pub mod config;
pub mod datadir;
pub mod iscsi;
pub mod metrics;
mod node;
pub mod reservations;
pub mod serve;
pub mod volume;

pub use config::Config;
pub use node::{valid_volume_name, Node, RecoveryReport, VolumeInfo};

/// Errors at the node level; each says what the operator can do about it.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("configuration: {0}")]
    Config(String),
    #[error("data directory {0} is in use by another mariner server")]
    Locked(std::path::PathBuf),
    #[error("{0}")]
    Io(String),
    #[error("corrupt: {0}")]
    Corrupt(String),
    #[error("log: {0}")]
    Log(#[from] mariner_log::LogError),
    #[error("no volume named {0:?}")]
    NotFound(String),
    #[error("a volume named {0:?} already exists")]
    Exists(String),
    #[error("{0}")]
    Busy(String),
    #[error("{0}")]
    BadRequest(String),
}
