//! [`VolatileDisk`]: a file whose unsynced writes live only in this process's memory.
//!
//! Writes, punched holes and length changes are held in an overlay until `sync`, which applies
//! them to the file in offset order and then fdatasyncs it. Reads see the overlay on top of the
//! file. A process killed with `kill -9` loses exactly what it had not synced — unlike a plain
//! file, whose unsynced writes survive in the page cache — so a crash test over the real binary
//! catches a build that acknowledges a write before syncing it.
//!
//! [`VolatileDisk::write_through`] models a device opened with `O_DSYNC` (the `--direct-io`
//! log): each write goes to the file, opened with `O_DSYNC` too, before it returns, so it
//! survives the kill; only punched holes and length changes wait for `sync`. A build that
//! acknowledges a batch before its write returned then loses acknowledged writes.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::file::check_aligned;
use crate::range::{end, eof, past_end, to_usize};
use crate::{extent, Disk, Extent, FileDisk};

/// Unsynced content of one byte range.
#[derive(Debug)]
enum Chunk {
    Data(Vec<u8>),
    /// A punched hole of this many bytes.
    Zeros(u64),
}

impl Chunk {
    fn len(&self) -> u64 {
        match self {
            Chunk::Data(data) => data.len() as u64,
            Chunk::Zeros(len) => *len,
        }
    }

    /// Keeps the first `at` bytes and returns the rest.
    fn split_off(&mut self, at: u64) -> io::Result<Chunk> {
        Ok(match self {
            Chunk::Data(data) => Chunk::Data(data.split_off(to_usize(at)?)),
            Chunk::Zeros(len) => {
                let rest = *len - at;
                *len = at;
                Chunk::Zeros(rest)
            }
        })
    }
}

/// Everything not yet synced, and the lengths needed to tell which file bytes are still valid.
#[derive(Default)]
struct Overlay {
    /// Non-overlapping chunks by start offset.
    chunks: BTreeMap<u64, Chunk>,
    /// The length reads and `len()` see.
    len: u64,
    /// The file's length at the last sync.
    file_len: u64,
    /// The lowest length set since the last sync (at most `file_len`): file bytes from here on
    /// were cut off and read as zeros even if the disk has grown again.
    base_limit: u64,
}

impl fmt::Debug for Overlay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Overlay")
            .field("chunks", &self.chunks.len())
            .field("len", &self.len)
            .field("file_len", &self.file_len)
            .field("base_limit", &self.base_limit)
            .finish()
    }
}

impl Overlay {
    fn new(file_len: u64) -> Overlay {
        Overlay {
            chunks: BTreeMap::new(),
            len: file_len,
            file_len,
            base_limit: file_len,
        }
    }

    /// Chunks that intersect `[start, end)`, in order.
    fn overlapping(&self, start: u64, end: u64) -> impl Iterator<Item = (u64, &Chunk)> {
        let before = self.chunks.range(..start).next_back();
        let before = before.filter(|(&s, c)| s + c.len() > start);
        before
            .into_iter()
            .chain(self.chunks.range(start..end))
            .map(|(&s, c)| (s, c))
    }

    /// Removes `[start, end)` from the overlay, trimming chunks that stick out of it.
    fn clear_range(&mut self, start: u64, end: u64) -> io::Result<()> {
        if let Some((&s, chunk)) = self.chunks.range_mut(..start).next_back() {
            let chunk_end = s + chunk.len();
            if chunk_end > start {
                let mut tail = chunk.split_off(start - s)?;
                if chunk_end > end {
                    let rest = tail.split_off(end - start)?;
                    self.chunks.insert(end, rest);
                }
            }
        }
        let inside: Vec<u64> = self.chunks.range(start..end).map(|(&s, _)| s).collect();
        for s in inside {
            let Some(mut chunk) = self.chunks.remove(&s) else {
                continue;
            };
            if s + chunk.len() > end {
                let rest = chunk.split_off(end - s)?;
                self.chunks.insert(end, rest);
            }
        }
        Ok(())
    }

    /// Puts `chunk` at `start`, replacing whatever the overlay held there (newest wins).
    fn insert(&mut self, start: u64, chunk: Chunk) -> io::Result<()> {
        let len = chunk.len();
        if len == 0 {
            return Ok(());
        }
        self.clear_range(start, end(start, len)?)?;
        self.chunks.insert(start, chunk);
        Ok(())
    }

    fn unsynced_bytes(&self) -> u64 {
        self.chunks.values().map(Chunk::len).sum()
    }
}

/// A [`FileDisk`] whose writes are held in memory until `sync` (see the module documentation).
/// Memory use is proportional to the unsynced data (a punched hole costs a few bytes).
///
/// It behaves like the file it wraps: writes past the end grow it, block devices refuse
/// `set_len`, and if the file was opened with `O_DIRECT` it still demands aligned buffers,
/// offsets and lengths (it turns `O_DIRECT` off underneath so it can flush any overlay).
#[derive(Debug)]
pub struct VolatileDisk {
    file: FileDisk,
    align: usize,
    /// Writes are durable when they return (`O_DSYNC`), not held until `sync`.
    write_through: bool,
    overlay: Mutex<Overlay>,
}

impl VolatileDisk {
    /// Wraps `file`; nothing written through the result reaches it before `sync`.
    pub fn new(file: FileDisk) -> io::Result<VolatileDisk> {
        VolatileDisk::with_mode(file, false)
    }

    /// Wraps `file`, which should be opened with `O_DSYNC`: every write reaches it before it
    /// returns; punched holes and length changes are held until `sync` (see the module doc).
    pub fn write_through(file: FileDisk) -> io::Result<VolatileDisk> {
        VolatileDisk::with_mode(file, true)
    }

    fn with_mode(mut file: FileDisk, write_through: bool) -> io::Result<VolatileDisk> {
        let align = file.alignment();
        file.make_buffered()?;
        let len = file.len()?;
        Ok(VolatileDisk {
            file,
            align,
            write_through,
            overlay: Mutex::new(Overlay::new(len)),
        })
    }

    /// Bytes written or punched since the last sync (counting overlapping writes once).
    pub fn unsynced_bytes(&self) -> u64 {
        self.lock().unsynced_bytes()
    }

    // A panic while holding the lock can only happen between whole-chunk updates of the
    // BTreeMap, which leave it consistent.
    fn lock(&self) -> MutexGuard<'_, Overlay> {
        self.overlay.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies the overlay's length changes to the file: cut what was truncated, then resize.
    fn flush_len(&self, overlay: &Overlay) -> io::Result<()> {
        if overlay.base_limit < overlay.file_len {
            self.file.set_len(overlay.base_limit)?;
        }
        if overlay.len != overlay.base_limit {
            self.file.set_len(overlay.len)?;
        }
        Ok(())
    }

    /// Applies the overlay to the file, fdatasyncs it and empties the overlay.
    fn flush(&self, overlay: &mut Overlay) -> io::Result<()> {
        self.flush_len(overlay)?;
        self.flush_chunks(overlay)?;
        self.file.sync()?;
        *overlay = Overlay::new(overlay.len);
        Ok(())
    }

    fn flush_chunks(&self, overlay: &Overlay) -> io::Result<()> {
        for (&offset, chunk) in &overlay.chunks {
            match chunk {
                Chunk::Data(data) => self.file.write_at(data, offset)?,
                Chunk::Zeros(len) => self.file.punch_hole(offset, *len)?,
            }
        }
        Ok(())
    }
}

impl Disk for VolatileDisk {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_aligned(self.align, buf, offset)?;
        let overlay = self.lock();
        let end = match offset.checked_add(buf.len() as u64) {
            Some(end) if end <= overlay.len => end,
            _ => return Err(eof(offset, buf.len(), overlay.len)),
        };
        let base_end = end.min(overlay.base_limit).max(offset);
        let (base, tail) = buf.split_at_mut(to_usize(base_end - offset)?);
        if !base.is_empty() {
            self.file.read_at(base, offset)?;
        }
        tail.fill(0);
        for (start, chunk) in overlay.overlapping(offset, end) {
            let lo = start.max(offset);
            let hi = (start + chunk.len()).min(end);
            let dst = &mut buf[to_usize(lo - offset)?..to_usize(hi - offset)?];
            match chunk {
                Chunk::Data(data) => {
                    dst.copy_from_slice(&data[to_usize(lo - start)?..to_usize(hi - start)?]);
                }
                Chunk::Zeros(_) => dst.fill(0),
            }
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        check_aligned(self.align, buf, offset)?;
        let end = end(offset, buf.len() as u64)?;
        let mut overlay = self.lock();
        if self.file.is_block_device() && end > overlay.len {
            return Err(past_end(offset, buf.len() as u64, overlay.len));
        }
        if self.write_through && end <= overlay.base_limit {
            // Over file bytes that are still valid: straight to the file, durable on return,
            // and newer than anything the overlay held there.
            self.file.write_at(buf, offset)?;
            return overlay.clear_range(offset, end);
        }
        overlay.insert(offset, Chunk::Data(buf.to_vec()))?;
        if !buf.is_empty() {
            overlay.len = overlay.len.max(end);
        }
        if self.write_through {
            // Past a pending truncation or the end: the file needs its length first.
            return self.flush(&mut overlay);
        }
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        self.flush(&mut self.lock())
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.lock().len)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        if self.file.is_block_device() {
            // Same refusal as the file itself.
            return self.file.set_len(len);
        }
        let mut overlay = self.lock();
        if len < overlay.len {
            let old = overlay.len;
            overlay.clear_range(len, old)?;
        }
        overlay.base_limit = overlay.base_limit.min(len);
        overlay.len = len;
        Ok(())
    }

    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        let mut overlay = self.lock();
        // Like FALLOC_FL_KEEP_SIZE: a hole past the end changes nothing.
        let end = end(offset, len)?.min(overlay.len);
        if end > offset {
            overlay.insert(offset, Chunk::Zeros(end - offset))?;
        }
        Ok(())
    }

    fn allocation(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
        let end = end(offset, len)?;
        let overlay = self.lock();
        let file_end = end.min(overlay.base_limit).max(offset);
        let mut list = if file_end > offset {
            self.file.allocation(offset, file_end - offset)?
        } else {
            Vec::new()
        };
        extent::push(&mut list, file_end, end - file_end, false);
        for (start, chunk) in overlay.overlapping(offset, end) {
            let lo = start.max(offset);
            let hi = (start + chunk.len()).min(end);
            list = extent::paint(&list, lo, hi - lo, matches!(chunk, Chunk::Data(_)));
        }
        Ok(list)
    }

    fn alignment(&self) -> usize {
        self.align
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn starts_and_lens(overlay: &Overlay) -> Vec<(u64, u64)> {
        overlay.chunks.iter().map(|(&s, c)| (s, c.len())).collect()
    }

    #[test]
    fn newest_write_wins_and_splits_older_chunks() -> io::Result<()> {
        let mut overlay = Overlay::new(100);
        overlay.insert(10, Chunk::Data(vec![1; 20]))?;
        overlay.insert(15, Chunk::Zeros(5))?;
        assert_eq!(starts_and_lens(&overlay), vec![(10, 5), (15, 5), (20, 10)]);
        overlay.insert(5, Chunk::Data(vec![2; 30]))?;
        assert_eq!(starts_and_lens(&overlay), vec![(5, 30)]);
        overlay.insert(0, Chunk::Data(vec![3; 6]))?;
        overlay.insert(34, Chunk::Data(vec![3; 2]))?;
        assert_eq!(starts_and_lens(&overlay), vec![(0, 6), (6, 28), (34, 2)]);
        overlay.clear_range(7, 34)?;
        assert_eq!(starts_and_lens(&overlay), vec![(0, 6), (6, 1), (34, 2)]);
        assert_eq!(overlay.unsynced_bytes(), 9);
        Ok(())
    }

    #[test]
    fn overlapping_includes_the_chunk_that_starts_before() -> io::Result<()> {
        let mut overlay = Overlay::new(100);
        overlay.insert(0, Chunk::Data(vec![1; 10]))?;
        overlay.insert(20, Chunk::Data(vec![1; 10]))?;
        let starts: Vec<u64> = overlay.overlapping(5, 21).map(|(s, _)| s).collect();
        assert_eq!(starts, vec![0, 20]);
        let starts: Vec<u64> = overlay.overlapping(10, 20).map(|(s, _)| s).collect();
        assert!(starts.is_empty());
        Ok(())
    }
}
