//! Byte-range arithmetic and the errors it produces, shared by the implementations.

use std::io;
use std::ops::Range;

/// `[offset, offset+len)` as indices into a buffer of `size` bytes, if it fits entirely.
pub(crate) fn within(offset: u64, len: usize, size: usize) -> Option<Range<usize>> {
    let start = usize::try_from(offset).ok()?;
    let end = start.checked_add(len)?;
    (end <= size).then_some(start..end)
}

/// `offset + len`, or `InvalidInput` if that overflows.
pub(crate) fn end(offset: u64, len: u64) -> io::Result<u64> {
    offset
        .checked_add(len)
        .ok_or_else(|| invalid("byte range overflows u64"))
}

/// A byte count as `usize`, or `InvalidInput` on a target where it does not fit.
pub(crate) fn to_usize(n: u64) -> io::Result<usize> {
    usize::try_from(n).map_err(|_| invalid("byte count does not fit in usize"))
}

pub(crate) fn invalid(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg.to_string())
}

/// The error of a read that passes the end of the disk.
pub(crate) fn eof(offset: u64, len: usize, disk_len: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        format!("read of {len} bytes at {offset} passes the end of the disk ({disk_len} bytes)"),
    )
}

/// The error of a write that passes the end of a disk that does not grow implicitly.
pub(crate) fn past_end(offset: u64, len: u64, disk_len: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{len} bytes at {offset} pass the end of the disk ({disk_len} bytes)"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn within_checks_bounds_and_overflow() {
        assert_eq!(within(0, 4, 4), Some(0..4));
        assert_eq!(within(4, 0, 4), Some(4..4));
        assert_eq!(within(3, 2, 4), None);
        assert_eq!(within(u64::MAX, 2, 4), None);
        assert_eq!(within(1, usize::MAX, usize::MAX), None);
    }
}
