//! The interface the rest of Mariner implements to be served over NBD.
//!
//! The server validates every request against [`ExportInfo`] (range, alignment to
//! `block_size_min`, payload cap, read-only, trim/zero support) before calling an [`Export`]
//! method, so implementations receive only in-range, aligned requests. Implementations must
//! still treat their own invariants as theirs to check.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

use crate::wire::{CommandType, ErrorCode};

/// What the server needs to know about an export to negotiate and validate requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportInfo {
    /// Name clients select the export by (at most 4096 bytes of UTF-8).
    pub name: String,
    /// Human-readable description (may be empty).
    pub description: String,
    /// Size in bytes; should be a multiple of `block_size_min`.
    pub size_bytes: u64,
    /// Logical block size (power of two, 1..=65536), e.g. 512. Requests are aligned to it.
    pub block_size_min: u32,
    /// Preferred I/O size (power of two, >= max(block_size_min, 512)), e.g. 4096.
    pub block_size_preferred: u32,
    /// Largest READ/WRITE payload accepted, >= `block_size_preferred`, e.g. 32 MiB.
    pub max_payload_bytes: u32,
    /// Writes, trims and zeroing are refused with `EPERM`.
    pub read_only: bool,
    /// Advertise `NBD_CMD_TRIM`.
    pub can_trim: bool,
    /// Advertise `NBD_CMD_WRITE_ZEROES`.
    pub can_write_zeroes: bool,
    /// Advertise `NBD_FLAG_CAN_MULTI_CONN`: a flush on any connection covers every write
    /// completed on every connection.
    pub can_multi_conn: bool,
}

/// Allocation state of an extent, reported through the `base:allocation` context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Allocation {
    /// Allocated, contents unknown.
    Data,
    /// Unallocated; reads as zeros.
    Hole,
    /// Allocated but known to read as zeros.
    Zero,
}

/// Errors an export reports; each maps to an NBD error value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExportError {
    /// The storage failed (`NBD_EIO`).
    #[error("I/O error: {0}")]
    Io(String),
    /// Out of space (`NBD_ENOSPC`).
    #[error("no space left")]
    NoSpace,
    /// The export cannot be written (`NBD_EPERM`).
    #[error("export is read-only")]
    ReadOnly,
    /// The request is invalid for this export (`NBD_EINVAL`).
    #[error("invalid request")]
    Invalid,
    /// The range lies outside the export (`NBD_ENOSPC` for writes, else `NBD_EINVAL`).
    #[error("range outside the export")]
    OutOfRange,
    /// The export is shutting down (`NBD_ESHUTDOWN`).
    #[error("export is shutting down")]
    Shutdown,
    /// Refused by policy, e.g. a reservation conflict (`NBD_EPERM`).
    #[error("refused: {0}")]
    Refused(String),
}

impl ExportError {
    /// The NBD error value to report for this error on a `command` request.
    pub fn error_code(&self, command: CommandType) -> ErrorCode {
        match self {
            Self::Io(_) => ErrorCode::Io,
            Self::NoSpace => ErrorCode::NoSpc,
            Self::ReadOnly | Self::Refused(_) => ErrorCode::Perm,
            Self::Invalid => ErrorCode::Inval,
            Self::OutOfRange if is_write(command) => ErrorCode::NoSpc,
            Self::OutOfRange => ErrorCode::Inval,
            Self::Shutdown => ErrorCode::Shutdown,
        }
    }
}

fn is_write(command: CommandType) -> bool {
    matches!(command, CommandType::Write | CommandType::WriteZeroes)
}

/// One export (volume) as the NBD server sees it. Calls may run concurrently.
#[async_trait]
pub trait Export: Send + Sync {
    /// Current description; read once when a client negotiates.
    fn info(&self) -> ExportInfo;
    /// Reads exactly `len` bytes at `offset`.
    async fn read(&self, offset: u64, len: u32) -> Result<Bytes, ExportError>;
    /// Writes `data` at `offset`; with `fua`, durable before returning.
    async fn write(&self, offset: u64, data: Bytes, fua: bool) -> Result<(), ExportError>;
    /// Makes every write completed before this call durable.
    async fn flush(&self) -> Result<(), ExportError>;
    /// Discards a range; contents afterwards are unspecified until rewritten.
    async fn trim(&self, offset: u64, len: u32, fua: bool) -> Result<(), ExportError>;
    /// Zeroes a range; `may_trim` allows leaving a hole instead of allocating.
    async fn write_zeroes(
        &self,
        offset: u64,
        len: u32,
        fua: bool,
        may_trim: bool,
    ) -> Result<(), ExportError>;
    /// Allocation extents starting at `offset`, as `(length, state)` pairs covering at least
    /// part of `len` bytes. The server clips and merges the list before sending it.
    async fn block_status(
        &self,
        offset: u64,
        len: u32,
    ) -> Result<Vec<(u32, Allocation)>, ExportError>;
}

/// The set of exports a server offers.
pub trait Exports: Send + Sync {
    /// Every export, for `NBD_OPT_LIST`.
    fn list(&self) -> Vec<ExportInfo>;
    /// The export an empty name selects, if any.
    fn default_name(&self) -> Option<String>;
    /// Looks an export up by name.
    fn open(&self, name: &str) -> Option<Arc<dyn Export>>;
    /// A client entered transmission on `name`; paired with exactly one
    /// [`Exports::connection_closed`].
    fn connection_opened(&self, _name: &str) {}
    /// The connection announced by [`Exports::connection_opened`] is gone and has no request
    /// left in flight.
    fn connection_closed(&self, _name: &str) {}
}

/// Calls [`Exports::connection_opened`] on creation and [`Exports::connection_closed`] on drop,
/// so the pair is balanced on every path out of a connection.
pub struct ConnectionGuard {
    exports: Arc<dyn Exports>,
    name: String,
}

impl ConnectionGuard {
    /// Announces a connection to export `name`.
    pub fn new(exports: Arc<dyn Exports>, name: String) -> Self {
        exports.connection_opened(&name);
        Self { exports, name }
    }

    /// The export name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        self.exports.connection_closed(&self.name);
    }
}

impl std::fmt::Debug for ConnectionGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionGuard")
            .field("name", &self.name)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_codes_follow_the_spec() {
        let write = CommandType::Write;
        let read = CommandType::Read;
        assert_eq!(
            ExportError::Io("disk".into()).error_code(read),
            ErrorCode::Io
        );
        assert_eq!(ExportError::NoSpace.error_code(write), ErrorCode::NoSpc);
        assert_eq!(ExportError::ReadOnly.error_code(write), ErrorCode::Perm);
        assert_eq!(ExportError::Invalid.error_code(read), ErrorCode::Inval);
        assert_eq!(ExportError::OutOfRange.error_code(write), ErrorCode::NoSpc);
        assert_eq!(
            ExportError::OutOfRange.error_code(CommandType::WriteZeroes),
            ErrorCode::NoSpc
        );
        assert_eq!(ExportError::OutOfRange.error_code(read), ErrorCode::Inval);
        assert_eq!(
            ExportError::OutOfRange.error_code(CommandType::Trim),
            ErrorCode::Inval
        );
        assert_eq!(ExportError::Shutdown.error_code(read), ErrorCode::Shutdown);
        assert_eq!(
            ExportError::Refused("rsv".into()).error_code(write),
            ErrorCode::Perm
        );
    }
}
