//! The process heap as the system sees it.
//!
//! A component that keeps a memory budget (BOSC's queues) frees memory in bulk, thousands of
//! allocations at a time, from the middle of the allocator's heap. glibc's allocator returns
//! to the system only the top of its heap, so such memory stays resident: freed, counted by
//! nobody, and charged to the process's memory cgroup. Under the index benchmark BOSC held
//! 40–60 MiB of it beside a 64 MiB budget, enough to be OOM-killed in a cgroup of twice the
//! budget. [`trim`] hands every whole free page back; [`usage`] says what the allocator
//! holds, in use and free, for reports.
//!
//! glibc only; elsewhere both do nothing (another allocator returns memory its own way). A
//! program whose global allocator is not the system's trims only the system heap, which is
//! harmless.

/// Returns the heap's whole free pages to the system (glibc's `malloc_trim(0)`, all arenas).
/// Took 2–4 ms on a heap of about 100 MiB; the pages fault back in as the heap grows.
/// Returns whether anything was returned (always false where unsupported).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn trim() -> bool {
    // SAFETY: malloc_trim takes no pointer and touches only the allocator's own free chunks,
    // under the allocator's own locks.
    unsafe { libc::malloc_trim(0) == 1 }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn trim() -> bool {
    false
}

/// What the allocator holds, all arenas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Bytes handed out and not freed (large chunks mapped on their own included).
    pub in_use: u64,
    /// Bytes freed and kept by the allocator, resident unless trimmed.
    pub free: u64,
}

/// What the allocator holds now (glibc's `mallinfo2`); `None` where unsupported.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn usage() -> Option<Usage> {
    // SAFETY: mallinfo2 takes no argument and only reads the allocator's counters.
    let m = unsafe { libc::mallinfo2() };
    let n = |v: usize| u64::try_from(v).unwrap_or(u64::MAX);
    Some(Usage {
        in_use: n(m.uordblks).saturating_add(n(m.hblkhd)),
        free: n(m.fordblks),
    })
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn usage() -> Option<Usage> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn freed_memory_shows_as_free_and_trim_returns_it() {
        // Many chunks below the mmap threshold, every other one freed: holes in the middle
        // of the heap that only a trim can return.
        let mut chunks: Vec<Vec<u8>> = (0..4096).map(|i| vec![i as u8; 16 << 10]).collect();
        let before = usage().expect("glibc");
        let mut i = 0;
        chunks.retain(|_| {
            i += 1;
            i % 2 == 0
        });
        let after = usage().expect("glibc");
        assert!(
            after.in_use + (16 << 20) <= before.in_use + (1 << 20),
            "{before:?} {after:?}"
        );
        assert!(after.free >= 30 << 20, "{after:?}");
        assert!(trim(), "32 MiB of whole free pages and nothing returned");
        drop(chunks);
    }
}
