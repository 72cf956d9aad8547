//! Buffers for large reads, kept for the next read instead of freed.
//!
//! A new buffer per 1 MiB NBD read cost 256 page faults and as many zeroed pages (glibc
//! serves such sizes with a fresh `mmap` and unmaps them on free): about a fifth of the
//! server's CPU on 1 MiB sequential reads (`perf`: `clear_page_erms`, `exc_page_fault`,
//! `unmap_page_range`), on a machine whose page-cache copy already runs at 1.3–1.6 GB/s per
//! core. A buffer handed to the client's reply as [`Bytes`] comes back here when the reply
//! has been sent.

use std::sync::Mutex;

use bytes::Bytes;

/// Reads shorter than this take a new buffer: the allocator serves them from its free lists
/// without a page fault, and a pooled one would cost an allocation of its own (the owner of
/// the [`Bytes`]).
pub(crate) const POOLED_MIN: usize = 64 << 10;

/// The largest buffer kept.
const POOLED_MAX: usize = 32 << 20;

/// Bytes of buffers kept at most, all sizes together.
const KEPT_MAX: usize = 64 << 20;

/// The node's read buffers (one set for every connection).
pub(crate) static READ_BUFFERS: ReadBuffers = ReadBuffers::new();

/// Free buffers, with their capacity in total.
pub(crate) struct ReadBuffers {
    free: Mutex<(Vec<Vec<u8>>, usize)>,
}

impl ReadBuffers {
    pub(crate) const fn new() -> Self {
        Self {
            free: Mutex::new((Vec::new(), 0)),
        }
    }

    /// A buffer of exactly `len` bytes, kept or new. Its contents are whatever an earlier
    /// read left: the reader must overwrite all of it.
    pub(crate) fn take(&self, len: usize) -> Vec<u8> {
        let kept = self.free.lock().ok().and_then(|mut free| {
            let at = free.0.iter().position(|b| b.capacity() >= len)?;
            let buf = free.0.swap_remove(at);
            free.1 -= buf.capacity();
            Some(buf)
        });
        match kept {
            Some(mut buf) => {
                // Cuts it to length, or zeroes what lies past the length it last had (reads
                // of one size, the common case, zero nothing).
                buf.resize(len, 0);
                buf
            }
            None => vec![0u8; len],
        }
    }

    /// Keeps `buf` for a later [`ReadBuffers::take`], within the bounds.
    pub(crate) fn put(&self, buf: Vec<u8>) {
        let cap = buf.capacity();
        if !(POOLED_MIN..=POOLED_MAX).contains(&cap) {
            return;
        }
        if let Ok(mut free) = self.free.lock() {
            if free.1 + cap <= KEPT_MAX {
                free.1 += cap;
                free.0.push(buf);
            }
        }
    }

    /// `buf` as [`Bytes`] that give it back to [`READ_BUFFERS`] once dropped.
    pub(crate) fn shared(buf: Vec<u8>) -> Bytes {
        Bytes::from_owner(Returned(buf))
    }

    #[cfg(test)]
    fn kept(&self) -> (usize, usize) {
        self.free
            .lock()
            .map(|f| (f.0.len(), f.1))
            .unwrap_or_default()
    }

    #[cfg(test)]
    fn kept_has(&self, ptr: *const u8) -> bool {
        self.free
            .lock()
            .map(|f| f.0.iter().any(|b| b.as_ptr() == ptr))
            .unwrap_or_default()
    }
}

/// A buffer lent to a reply.
struct Returned(Vec<u8>);

impl AsRef<[u8]> for Returned {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Returned {
    fn drop(&mut self) {
        READ_BUFFERS.put(std::mem::take(&mut self.0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_comes_back_and_is_reused_at_any_length_it_holds() {
        let pool = ReadBuffers::new();
        let mut a = pool.take(1 << 20);
        assert_eq!(a.len(), 1 << 20);
        a.fill(7);
        let ptr = a.as_ptr();
        pool.put(a);
        assert_eq!(pool.kept(), (1, 1 << 20));
        // Shorter: the same memory, cut to length.
        let b = pool.take(256 << 10);
        assert_eq!((b.as_ptr(), b.len()), (ptr, 256 << 10));
        assert_eq!(pool.kept(), (0, 0));
        pool.put(b);
        // Longer again, within its capacity: the same memory.
        let c = pool.take(1 << 20);
        assert_eq!((c.as_ptr(), c.len()), (ptr, 1 << 20));
        let d = pool.take(1 << 20);
        assert_ne!(d.as_ptr(), ptr, "a buffer is lent once at a time");
        assert!(d.iter().all(|&x| x == 0), "a new buffer is zeroed");
    }

    #[test]
    fn small_huge_and_surplus_buffers_are_not_kept() {
        let pool = ReadBuffers::new();
        pool.put(vec![0; 4096]);
        pool.put(vec![0; POOLED_MAX + 1]);
        assert_eq!(pool.kept(), (0, 0));
        for _ in 0..KEPT_MAX / POOLED_MAX + 1 {
            pool.put(vec![0; POOLED_MAX]);
        }
        assert_eq!(pool.kept(), (KEPT_MAX / POOLED_MAX, KEPT_MAX));
    }

    #[test]
    fn bytes_give_their_buffer_back_when_dropped() {
        let buf = READ_BUFFERS.take(3 << 20);
        let ptr = buf.as_ptr();
        let bytes = ReadBuffers::shared(buf);
        assert_eq!(bytes.len(), 3 << 20);
        let part = bytes.slice(1..10);
        drop(bytes);
        // A slice still holds it.
        assert!(!READ_BUFFERS.kept_has(ptr));
        drop(part);
        assert!(READ_BUFFERS.kept_has(ptr));
    }
}
