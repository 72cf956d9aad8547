//! Reads: the overlay first (records not yet applied), the image for the rest.

use std::sync::atomic::Ordering::Relaxed;

use mariner_disk::{Disk, Extent};
use mariner_log::{Log, LogAddr, LogError, RecordHeader};

use crate::extents::{Source, Span};
use crate::{Allocation, Image, Store, StoreError};

impl Store {
    /// Reads `len` bytes at `offset` of volume `id`: every acknowledged write is visible,
    /// applied or not.
    pub fn read(&self, id: u32, offset: u64, len: u64) -> Result<Vec<u8>, StoreError> {
        let image = self.image(id)?;
        Self::check_range(&image, offset, len)?;
        let mut out = vec![0u8; len as usize];
        self.read_checked(&image, offset, &mut out)?;
        Ok(out)
    }

    /// [`Store::read`] into `out` (`out.len()` bytes at `offset`), which it overwrites whole:
    /// a buffer a caller reuses reads the same as a new one.
    pub fn read_into(&self, id: u32, offset: u64, out: &mut [u8]) -> Result<(), StoreError> {
        let image = self.image(id)?;
        Self::check_range(&image, offset, out.len() as u64)?;
        self.read_checked(&image, offset, out)
    }

    fn read_checked(&self, image: &Image, offset: u64, out: &mut [u8]) -> Result<(), StoreError> {
        // A record read back from the log may be reused under us once applied and released;
        // then its range is in the image, and the next lookup says so.
        for _ in 0..8 {
            match self.read_once(image, offset, out) {
                Err(StoreError::Log(LogError::Gone { .. })) => continue,
                other => return other,
            }
        }
        Err(StoreError::Failed("record kept moving under a read".into()))
    }

    fn read_once(&self, image: &Image, offset: u64, out: &mut [u8]) -> Result<(), StoreError> {
        self.fill(image, offset, out, Wait::Allowed).map(|_| ())
    }

    /// [`Store::read`] into `out` if it can be done without waiting for a device: every
    /// piece is zeros, a payload the store holds in memory, or bytes of the image or of a
    /// record in the log that are in the page cache ([`Disk::read_cached`]). `Ok(false)`:
    /// some piece needs a read of the log or of the disk, `out` holds nothing usable, and
    /// the caller uses [`Store::read`] where it may block. An async front end serves most
    /// reads of recent or hot data on its own thread this way, without a hand-off to a
    /// blocking pool.
    pub fn read_cached(&self, id: u32, offset: u64, out: &mut [u8]) -> Result<bool, StoreError> {
        let image = self.image(id)?;
        Self::check_range(&image, offset, out.len() as u64)?;
        let served = self.fill(&image, offset, out, Wait::Never)?;
        if served {
            self.stats.cached_reads.fetch_add(1, Relaxed);
        }
        Ok(served)
    }

    /// Fills `out` with the volume's bytes at `offset`, piece by piece as the overlay maps
    /// them. With [`Wait::Never`], stops at the first piece that would wait for a device and
    /// returns `false`.
    fn fill(
        &self,
        image: &Image,
        offset: u64,
        out: &mut [u8],
        wait: Wait,
    ) -> Result<bool, StoreError> {
        for s in Self::lookup(image, offset, offset + out.len() as u64)? {
            let dst = &mut out[(s.start - offset) as usize..(s.end - offset) as usize];
            let served = match s.piece {
                None if wait == Wait::Allowed => image.disk.read_at(dst, s.start).map(|()| true)?,
                None => image.disk.read_cached(dst, s.start)?,
                Some((_, Source::Zero)) => {
                    dst.fill(0);
                    true
                }
                Some((
                    seq,
                    Source::Log {
                        addr,
                        base,
                        payload,
                    },
                )) => {
                    let read;
                    let bytes: &[u8] = match (&payload, wait) {
                        (Some(p), _) => p,
                        (None, Wait::Allowed) => {
                            read = self.log_read(addr, seq)?.1;
                            &read
                        }
                        (None, Wait::Never) => match self.log_read_cached(addr, seq)? {
                            Some((_, p)) => {
                                read = p;
                                &read
                            }
                            None => return Ok(false),
                        },
                    };
                    let from = (s.start - base) as usize;
                    dst.copy_from_slice(&bytes[from..from + dst.len()]);
                    true
                }
            };
            if !served {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The overlay's spans over `[start, end)`.
    fn lookup(image: &Image, start: u64, end: u64) -> Result<Vec<Span>, StoreError> {
        match image.overlay.lock() {
            Ok(o) => Ok(o.lookup(start, end)),
            Err(_) => Err(StoreError::Failed("lock poisoned".into())),
        }
    }

    fn log(&self) -> Result<&Log, StoreError> {
        self.log
            .get()
            .ok_or_else(|| StoreError::Failed("no log attached".into()))
    }

    fn log_read(&self, addr: LogAddr, seq: u64) -> Result<(RecordHeader, Vec<u8>), StoreError> {
        let log = self.log()?;
        self.stats.log_reads.fetch_add(1, Relaxed);
        Ok(log.read(addr, seq)?)
    }

    /// [`Store::log_read`] if the record is in memory; `None` if it would wait, or on any
    /// error: its space may have been reused between the overlay lookup and this read (then
    /// the range is in the image), and the blocking read, which looks again, decides. An
    /// error of this path alone never reaches the client.
    fn log_read_cached(
        &self,
        addr: LogAddr,
        seq: u64,
    ) -> Result<Option<(RecordHeader, Vec<u8>)>, StoreError> {
        Ok(self.log()?.read_cached(addr, seq).ok().flatten())
    }

    /// Allocation of `[offset, offset+len)`, overlay first, then the image.
    pub fn allocation(
        &self,
        id: u32,
        offset: u64,
        len: u64,
    ) -> Result<Vec<(u64, Allocation)>, StoreError> {
        let image = self.image(id)?;
        Self::check_range(&image, offset, len)?;
        let spans = Self::lookup(&image, offset, offset + len)?;
        let mut out: Vec<(u64, Allocation)> = Vec::new();
        for s in spans {
            match s.piece {
                Some((_, Source::Zero)) => push_merged(&mut out, s.end - s.start, Allocation::Zero),
                Some(_) => push_merged(&mut out, s.end - s.start, Allocation::Data),
                None => {
                    for e in image.disk.allocation(s.start, s.end - s.start)? {
                        push_merged(&mut out, e.len, extent_kind(e));
                    }
                }
            }
        }
        Ok(out)
    }
}

/// Whether a read may wait for a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// On a blocking thread: [`Store::read`].
    Allowed,
    /// On an async thread: [`Store::read_cached`] declines instead.
    Never,
}

fn extent_kind(e: Extent) -> Allocation {
    if e.allocated {
        Allocation::Data
    } else {
        Allocation::Hole
    }
}

fn push_merged(out: &mut Vec<(u64, Allocation)>, len: u64, kind: Allocation) {
    if len == 0 {
        return;
    }
    match out.last_mut() {
        Some((l, k)) if *k == kind => *l += len,
        _ => out.push((len, kind)),
    }
}
