//! Fetching the neighbourhood of scattered parts: history reads the past one version at a
//! time ([`crate::Log::read_part`]), and the versions an instant still uses lie anywhere in
//! the log, but densely where the writes before that instant were not yet overwritten. Read
//! one after another they cost a small device read each (a whole export of a volume after a
//! million random overwrites: ~180 k reads of ~24 KiB, the device saturated at ~8 k a second
//! while it reads 256 KiB pieces at ~850 MB/s). So once a [`CHUNK`] of a device has been
//! read from twice within [`WINDOW`], the rest of it is hinted to the device whole
//! ([`mariner_disk::Disk::prefetch`]): the reads that follow find it in the page cache. A
//! chunk read from once stays a small read, so a sparse reader (one version per chunk) pays
//! nothing; a dense one pays two reads per chunk instead of one per version.
//!
//! The table is a fixed array of hash slots, one atomic word each, no lock: two chunks that
//! share a slot, or two readers racing on one, can only cause a hint too many or too few,
//! and a hint changes nothing a read returns.

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use mariner_disk::Disk;

/// The stretch of a device hinted at once.
pub const CHUNK: u64 = 256 << 10;

/// How long a chunk's first read counts towards its second (and a hint stands before the
/// chunk may be hinted again, in case its pages have left the cache since).
pub const WINDOW: Duration = Duration::from_secs(30);

/// Hash slots: 1 MiB of table, room for 64 GiB of chunks touched within a window.
const SLOTS: usize = 1 << 18;

// A slot: [tag: 8][seconds since the table's start, + 1: 23][hinted: 1]; 0 is empty.
const TAG_SHIFT: u32 = 24;
const SECS_MASK: u32 = (1 << 23) - 1;

/// What a touch of a chunk asks of the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Touch {
    /// The first read of it within the window, or one after its hint: nothing.
    Noted,
    /// The second read within the window: hint the chunk whole.
    Hint,
}

/// The chunks read from lately, per device.
#[derive(Debug, Default)]
pub(crate) struct ChunkPrefetch {
    /// Made at the first touch: a log no one reads the past of pays nothing.
    slots: OnceLock<(Instant, Box<[AtomicU32]>)>,
}

impl ChunkPrefetch {
    /// Notes a read of `len` bytes at `offset` of device `dev` at `now`, and says whether
    /// to hint its chunk. Reads of a chunk's size or more are large already: nothing.
    pub(crate) fn touch(&self, dev: usize, offset: u64, len: usize, now: Instant) -> Touch {
        if len as u64 >= CHUNK {
            return Touch::Noted;
        }
        let (start, slots) = self.slots.get_or_init(|| {
            let slots = (0..SLOTS).map(|_| AtomicU32::new(0)).collect();
            (now, slots)
        });
        let chunk = offset / CHUNK;
        // Fibonacci hashing of (device, chunk): consecutive chunks spread over the slots.
        let h = (chunk ^ ((dev as u64) << 56)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let slot = &slots[(h >> (64 - SLOTS.trailing_zeros())) as usize];
        let tag = (h >> 8) as u32 & 0xFF;
        let elapsed = now.saturating_duration_since(*start).as_secs() as u32;
        let secs = (elapsed.wrapping_add(1) & SECS_MASK).max(1);
        let old = slot.load(Relaxed);
        let fresh = old != 0 && old >> TAG_SHIFT == tag && {
            let then = (old >> 1) & SECS_MASK;
            u64::from(secs.wrapping_sub(then) & SECS_MASK) <= WINDOW.as_secs()
        };
        let (next, touch) = match (fresh, old & 1 == 1) {
            (true, true) => return Touch::Noted,
            (true, false) => (1, Touch::Hint),
            (false, _) => (0, Touch::Noted),
        };
        slot.store(tag << TAG_SHIFT | secs << 1 | next, Relaxed);
        touch
    }

    /// [`Self::touch`] for a read just made, and the hint itself when it says so: after the
    /// read, so the read that finds a chunk dense waits only for its own bytes, not for the
    /// whole chunk (a random reader at depth 1 would, at each chunk's second read), and the
    /// rest arrives behind it. Only a hint: a device that cannot take it is not an error here.
    pub(crate) fn after_read(
        &self,
        disk: &dyn Disk,
        dev: usize,
        offset: u64,
        len: usize,
        now: Instant,
    ) {
        if self.touch(dev, offset, len, now) == Touch::Hint {
            let _ = disk.prefetch(offset / CHUNK * CHUNK, CHUNK);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_is_hinted_at_its_second_read_within_the_window_and_once() {
        let p = ChunkPrefetch::default();
        let t = Instant::now();
        assert_eq!(p.touch(0, 5 * CHUNK + 100, 4096, t), Touch::Noted);
        // Another chunk, another device: their own.
        assert_eq!(p.touch(0, 6 * CHUNK, 4096, t), Touch::Noted);
        assert_eq!(p.touch(1, 5 * CHUNK, 4096, t), Touch::Noted);
        assert_eq!(p.touch(0, 5 * CHUNK + 9000, 4096, t), Touch::Hint);
        // Hinted: the reads that follow are cached, nothing more to ask.
        for s in 0..=WINDOW.as_secs() {
            let at = t + Duration::from_secs(s);
            assert_eq!(p.touch(0, 5 * CHUNK + 200, 4096, at), Touch::Noted);
        }
        // Once the hint is older than the window, the chunk starts over.
        let later = t + WINDOW + Duration::from_secs(2);
        assert_eq!(p.touch(0, 5 * CHUNK, 4096, later), Touch::Noted);
        assert_eq!(p.touch(0, 5 * CHUNK, 4096, later), Touch::Hint);
    }

    #[test]
    fn reads_far_apart_in_time_or_large_ones_hint_nothing() {
        let p = ChunkPrefetch::default();
        let t = Instant::now();
        assert_eq!(p.touch(0, 0, 4096, t), Touch::Noted);
        let late = t + WINDOW + Duration::from_secs(1);
        assert_eq!(p.touch(0, 0, 4096, late), Touch::Noted);
        assert_eq!(p.touch(0, 0, CHUNK as usize, late), Touch::Noted);
        assert_eq!(p.touch(0, 0, CHUNK as usize, late), Touch::Noted);
        // The small read after `late` is the chunk's second within the window.
        assert_eq!(p.touch(0, 0, 4096, late), Touch::Hint);
    }

    #[test]
    fn a_sparse_reader_hints_nothing() {
        let p = ChunkPrefetch::default();
        let t = Instant::now();
        let hints = (0..50_000u64)
            .filter(|i| p.touch(0, i * CHUNK + 4096, 4096, t) == Touch::Hint)
            .count();
        // One read per chunk: only slots two chunks share can hint (tags tell most apart).
        assert!(hints < 50, "{hints} hints for 50,000 chunks read once each");
    }
}
