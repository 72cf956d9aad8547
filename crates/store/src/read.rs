//! Reads: the overlay first (records not yet applied), the image for the rest.

use std::sync::atomic::Ordering::Relaxed;

use mariner_disk::{Disk, Extent};
use mariner_log::{LogAddr, LogError, RecordHeader};

use crate::extents::Source;
use crate::{Allocation, Image, Store, StoreError};

impl Store {
    /// Reads `len` bytes at `offset` of volume `id`: every acknowledged write is visible,
    /// applied or not.
    pub fn read(&self, id: u32, offset: u64, len: u64) -> Result<Vec<u8>, StoreError> {
        let image = self.image(id)?;
        Self::check_range(&image, offset, len)?;
        let mut out = vec![0u8; len as usize];
        // A record read back from the log may be reused under us once applied and released;
        // then its range is in the image, and the next lookup says so.
        for _ in 0..8 {
            match self.read_once(&image, offset, &mut out) {
                Err(StoreError::Log(LogError::Gone { .. })) => continue,
                other => return other.map(|()| out),
            }
        }
        Err(StoreError::Failed("record kept moving under a read".into()))
    }

    fn read_once(&self, image: &Image, offset: u64, out: &mut [u8]) -> Result<(), StoreError> {
        let end = offset + out.len() as u64;
        let spans = match image.overlay.lock() {
            Ok(o) => o.lookup(offset, end),
            Err(_) => return Err(StoreError::Failed("lock poisoned".into())),
        };
        for s in spans {
            let dst = &mut out[(s.start - offset) as usize..(s.end - offset) as usize];
            match s.piece {
                None => image.disk.read_at(dst, s.start)?,
                Some((_, Source::Zero)) => dst.fill(0),
                Some((
                    _,
                    Source::Log {
                        base,
                        payload: Some(p),
                        ..
                    },
                )) => {
                    let from = (s.start - base) as usize;
                    dst.copy_from_slice(&p[from..from + dst.len()]);
                }
                Some((
                    seq,
                    Source::Log {
                        addr,
                        base,
                        payload: None,
                    },
                )) => {
                    let (_, payload) = self.log_read(addr, seq)?;
                    let from = (s.start - base) as usize;
                    dst.copy_from_slice(&payload[from..from + dst.len()]);
                }
            }
        }
        Ok(())
    }

    fn log_read(&self, addr: LogAddr, seq: u64) -> Result<(RecordHeader, Vec<u8>), StoreError> {
        let log = self
            .log
            .get()
            .ok_or_else(|| StoreError::Failed("no log attached".into()))?;
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
        let log = self
            .log
            .get()
            .ok_or_else(|| StoreError::Failed("no log attached".into()))?;
        Ok(log.read_cached(addr, seq).ok().flatten())
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
        let spans = match image.overlay.lock() {
            Ok(o) => o.lookup(offset, offset + len),
            Err(_) => return Err(StoreError::Failed("lock poisoned".into())),
        };
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
    /// [`Store::read`] into `out` if it can be done without waiting for a device: every
    /// piece is zeros, a payload the store holds in memory, or bytes of the image or of a
    /// record in the log that are in the page cache ([`Disk::read_cached`]). `Ok(false)`: some piece needs a read of the log or of the
    /// disk, `out` holds nothing usable, and the caller uses [`Store::read`] where it may
    /// block. An async front end serves most reads of recent or hot data on its own thread
    /// this way, without a hand-off to a blocking pool.
    pub fn read_cached(&self, id: u32, offset: u64, out: &mut [u8]) -> Result<bool, StoreError> {
        let image = self.image(id)?;
        Self::check_range(&image, offset, out.len() as u64)?;
        let spans = match image.overlay.lock() {
            Ok(o) => o.lookup(offset, offset + out.len() as u64),
            Err(_) => return Err(StoreError::Failed("lock poisoned".into())),
        };
        for s in spans {
            let dst = &mut out[(s.start - offset) as usize..(s.end - offset) as usize];
            match s.piece {
                None => {
                    if !image.disk.read_cached(dst, s.start)? {
                        return Ok(false);
                    }
                }
                Some((_, Source::Zero)) => dst.fill(0),
                Some((
                    _,
                    Source::Log {
                        base,
                        payload: Some(p),
                        ..
                    },
                )) => {
                    let from = (s.start - base) as usize;
                    dst.copy_from_slice(&p[from..from + dst.len()]);
                }
                Some((
                    seq,
                    Source::Log {
                        addr,
                        base,
                        payload: None,
                    },
                )) => {
                    let Some((_, payload)) = self.log_read_cached(addr, seq)? else {
                        return Ok(false);
                    };
                    let from = (s.start - base) as usize;
                    dst.copy_from_slice(&payload[from..from + dst.len()]);
                }
            }
        }
        self.stats.cached_reads.fetch_add(1, Relaxed);
        Ok(true)
    }
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
