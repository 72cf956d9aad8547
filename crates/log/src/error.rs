//! Typed errors of the log.

use std::io;

/// A byte sequence that is not a valid record or superblock.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("truncated")]
    Truncated,
    #[error("bad magic")]
    BadMagic,
    #[error("checksum mismatch")]
    BadChecksum,
    #[error("unsupported format version {0}")]
    UnsupportedVersion(u16),
    #[error("unknown record kind {0}")]
    UnknownKind(u8),
    #[error("inconsistent: {0}")]
    Inconsistent(&'static str),
}

/// Errors of opening, writing and reading the log.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("log device {dev}: {source}")]
    Io { dev: usize, source: io::Error },
    #[error("log device {dev} is not a Mariner log device: no valid superblock ({source})")]
    NotFormatted { dev: usize, source: FormatError },
    #[error("log device {dev} already holds a Mariner log; refusing to overwrite it")]
    AlreadyFormatted { dev: usize },
    #[error("log device {dev} belongs to log {found:032x}, expected {expected:032x}")]
    ForeignDevice {
        dev: usize,
        found: u128,
        expected: u128,
    },
    #[error("log device {dev} says it is device {found} of {count}; the configuration lists it as {dev} of {configured} (if a `mariner log grow` was cut short, run it again)")]
    WrongPosition {
        dev: usize,
        found: u16,
        count: u16,
        configured: usize,
    },
    #[error("log device {dev} geometry differs from device 0")]
    GeometryMismatch { dev: usize },
    #[error("log device {dev} is too small: {bytes} bytes, need at least {need}")]
    TooSmall { dev: usize, bytes: u64, need: u64 },
    #[error("invalid log configuration: {0}")]
    Config(String),
    #[error("record of {bytes} bytes exceeds the largest record {max}")]
    TooLarge { bytes: u64, max: u64 },
    #[error("the log has failed after an I/O error and is read-only: {0}")]
    Failed(String),
    #[error("the log is shut down")]
    Shutdown,
    #[error("record at {addr:#x} is no longer in the log")]
    Gone { addr: u64 },
    #[error("corrupt record at {addr:#x}: {source}")]
    Corrupt { addr: u64, source: FormatError },
}
