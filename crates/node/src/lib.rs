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
pub mod history;
mod image;
mod initialise;
pub mod iscsi;
pub mod log_grow;
pub mod logdevices;
pub mod metrics;
pub mod nbd;
mod node;
mod read_buffers;
pub mod reservations;
pub mod serve;
pub mod snapshot;
pub mod volume;

pub use config::Config;
pub use history::{instant, HistoryInfo, MarkInfo};
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

/// `n` bytes for a person: exact in the largest binary unit that divides it ("256 MiB"),
/// else to a tenth ("63.9 MiB").
pub(crate) fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut unit = "bytes";
    let mut scale = 1u64;
    for (i, u) in UNITS.iter().enumerate() {
        let s = 1u64 << (10 * (i + 1));
        if n >= s {
            (unit, scale) = (u, s);
        }
    }
    if n.is_multiple_of(scale) {
        format!("{} {unit}", n / scale)
    } else {
        format!("{:.1} {unit}", n as f64 / scale as f64)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn human_bytes_are_exact_when_they_can_be() {
        use super::human_bytes as h;
        assert_eq!(h(0), "0 bytes");
        assert_eq!(h(1000), "1000 bytes");
        assert_eq!(h(256 << 20), "256 MiB");
        assert_eq!(h(1 << 50), "1 PiB");
        assert_eq!(h(67_000_000), "63.9 MiB");
        assert_eq!(h((1 << 44) - 4096), "16.0 TiB");
    }
}
