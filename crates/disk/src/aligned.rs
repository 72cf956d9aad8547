//! A zeroed heap buffer with a chosen alignment, for `O_DIRECT` I/O.

use std::alloc::{self, Layout};
use std::fmt;
use std::io;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// A heap buffer of `len` bytes whose start is aligned to `align` (a power of two), zero on
/// creation. `O_DIRECT` wants the memory, the offset and the length aligned to the device's
/// logical block size; `Vec<u8>` only promises an alignment of 1.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    layout: Layout,
}

impl AlignedBuf {
    /// Allocates `len` zero bytes aligned to `align`. Fails with `InvalidInput` if `align` is not
    /// a power of two or the size overflows.
    pub fn new(len: usize, align: usize) -> io::Result<AlignedBuf> {
        // A zero-size allocation is undefined behaviour for `alloc`; allocate one byte instead
        // and still report `len == 0`.
        let layout = Layout::from_size_align(len.max(1), align)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        Ok(AlignedBuf::zeroed(layout, len))
    }

    /// Allocates `layout`, which must have a non-zero size of at least `len`.
    fn zeroed(layout: Layout, len: usize) -> AlignedBuf {
        debug_assert!(layout.size() >= len.max(1));
        // SAFETY: `layout` has a non-zero size (checked by both callers: `new` allocates at least
        // one byte, `clone` reuses such a layout).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout);
        };
        AlignedBuf { ptr, len, layout }
    }

    /// The alignment the buffer was allocated with.
    pub fn align(&self) -> usize {
        self.layout.align()
    }

    /// The bytes allocated, the most [`AlignedBuf::reset`] can make it hold.
    pub fn capacity(&self) -> usize {
        self.layout.size()
    }

    /// Makes the buffer `len` zero bytes long, reusing its allocation; `false` (and nothing
    /// changed) when `len` exceeds the capacity.
    pub fn reset(&mut self, len: usize) -> bool {
        if len > self.capacity() {
            return false;
        }
        self.len = len;
        self.fill(0);
        true
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` points to an allocation of at least `len` bytes, all initialised (zeroed
        // at allocation), owned by `self` and alive for the borrow of `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; `&mut self` guarantees the access is unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: `ptr` was returned by `alloc_zeroed` with exactly `self.layout` and is freed
        // only here, once.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

// SAFETY: `AlignedBuf` owns its allocation exclusively, like `Vec<u8>`; nothing in it is tied to
// a thread.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out `&[u8]`, which is `Sync`.
unsafe impl Sync for AlignedBuf {}

impl Clone for AlignedBuf {
    fn clone(&self) -> AlignedBuf {
        let mut copy = AlignedBuf::zeroed(self.layout, self.len);
        copy.copy_from_slice(self);
        copy
    }
}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len", &self.len)
            .field("align", &self.align())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alignment_holds_and_contents_are_zero() -> io::Result<()> {
        for align in [1, 8, 512, 4096, 1 << 16] {
            for len in [0, 1, 511, 4096, 100_000] {
                let buf = AlignedBuf::new(len, align)?;
                assert_eq!(buf.len(), len);
                assert_eq!(buf.as_ptr() as usize % align, 0, "len {len} align {align}");
                assert!(buf.iter().all(|&b| b == 0));
            }
        }
        Ok(())
    }

    #[test]
    fn writes_stick_and_clone_copies() -> io::Result<()> {
        let mut buf = AlignedBuf::new(8192, 4096)?;
        buf[4095] = 7;
        buf[..3].copy_from_slice(b"abc");
        let copy = buf.clone();
        assert_eq!(&copy[..3], b"abc");
        assert_eq!(copy[4095], 7);
        assert_eq!(copy.as_ptr() as usize % 4096, 0);
        Ok(())
    }

    #[test]
    fn reset_reuses_the_allocation_zeroed_within_its_capacity() -> io::Result<()> {
        let mut buf = AlignedBuf::new(8192, 4096)?;
        buf.fill(9);
        let at = buf.as_ptr();
        assert!(buf.reset(4096));
        assert_eq!((buf.len(), buf.as_ptr()), (4096, at));
        assert!(buf.iter().all(|&b| b == 0));
        assert!(buf.reset(8192));
        assert!(
            buf.iter().all(|&b| b == 0),
            "bytes past the shorter length too"
        );
        assert!(!buf.reset(8193));
        assert_eq!(buf.len(), 8192);
        Ok(())
    }

    #[test]
    fn bad_alignment_is_an_error() {
        assert!(AlignedBuf::new(16, 3).is_err());
        assert!(AlignedBuf::new(16, 0).is_err());
    }
}
