//! Rollback: a volume made again what it was at an earlier instant by writing, as ordinary
//! new writes, only the extents changed since (mariner-paper.md §3). The rollback is itself
//! history: rolling back to the instant before it (its `from`) undoes it.
//!
//! Order, and why a crash anywhere resumes safely:
//! 1. `begin_rollback` pins `to` and `from` (expiry cannot take either away), computes the
//!    bytes to write, and saves the pending file (`rollback_file.rs`, cursor 0) durably;
//! 2. `run_rollback` walks the changed extents of `(to, from]` in ascending offset, rounded
//!    out to whole blocks, in chunks: each chunk is read as of `to` and handed to the node's
//!    write function, which returns once the write is durable in the log; every few MiB, the
//!    cursor (all bytes below it written) is saved;
//! 3. at the end the pending file is removed, then the pins.
//!
//! A crash between a write and the next saved cursor leaves the cursor behind: the resumed
//! rollback writes those chunks again, with the same bytes (they are read as of `to`, which
//! the pin keeps; and the extents of `(to, from]` never change, since `from` is in the past).
//! Writes made after `from` by others are overwritten where they touch changed extents and
//! kept elsewhere; the node quiesces the volume if it wants neither.

use std::collections::BTreeMap;
use std::sync::Arc;

use mariner_disk::Disk;

use crate::engine::{io_err, lock, History};
use crate::files::FileUse;
use crate::pins::PinId;
use crate::read::Point;
use crate::rollback_file::RollbackRecord;
use crate::HistoryError;

/// The pending file's name prefix.
const PREFIX: &str = "rollback-";

/// One chunk of a rollback, for the node to write through the volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RollbackWrite<'a> {
    Data {
        offset: u64,
        data: &'a [u8],
    },
    /// The chunk reads as zeros as of `to`.
    Zero {
        offset: u64,
        length: u64,
    },
}

/// Where a rollback stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RollbackStatus {
    pub volume: u32,
    /// The instant rolled back to.
    pub to: Point,
    /// The newest instant when the rollback began (undo = roll back to this).
    pub from: Point,
    /// Bytes written so far, of `total_bytes`: the changed extents of `(to, from]`, rounded
    /// out to whole blocks of the volume (what is written).
    pub done_bytes: u64,
    pub total_bytes: u64,
    pub finished: bool,
}

/// A rollback begun and not finished.
struct Pending {
    status: RollbackStatus,
    cursor: u64,
    generation: u64,
    pins: [PinId; 2],
    /// A `run_rollback` is driving it now.
    running: bool,
    disk: Arc<dyn Disk>,
}

/// Pending rollbacks by volume.
#[derive(Default)]
pub(crate) struct Rollbacks(BTreeMap<u32, Pending>);

fn file_name(volume: u32) -> String {
    format!("{PREFIX}{volume:08x}")
}

impl Pending {
    fn record(&self) -> RollbackRecord {
        let s = &self.status;
        RollbackRecord {
            volume: s.volume,
            generation: self.generation,
            to_vseq: s.to.volume_seq,
            to_ts: s.to.timestamp_ns,
            from_vseq: s.from.volume_seq,
            from_ts: s.from.timestamp_ns,
            cursor: self.cursor,
            done_bytes: s.done_bytes,
            total_bytes: s.total_bytes,
        }
    }
}

impl History {
    /// Records (durably, in history's files) that `volume` is rolling back to `to`; pins
    /// `to` (and `from`) until it finishes; fails if one is already pending for the volume.
    pub fn begin_rollback(&self, volume: u32, to: Point) -> Result<RollbackStatus, HistoryError> {
        let inner = &self.inner;
        if inner.log.get().is_none() {
            return Err(HistoryError::Config("history is not started".into()));
        }
        let mut rb = lock(&inner.rollbacks);
        if rb.0.contains_key(&volume) {
            return Err(HistoryError::RollbackRunning(volume));
        }
        let from = self.window(volume)?.newest;
        let pin_to = self.pin(volume, to.volume_seq)?;
        let pin_from = match self.pin(volume, from.volume_seq) {
            Ok(id) => id,
            Err(e) => {
                self.unpin(pin_to);
                return Err(e);
            }
        };
        match self.first_save(volume, to, from, [pin_to, pin_from]) {
            Ok(p) => {
                let status = p.status.clone();
                rb.0.insert(volume, p);
                Ok(status)
            }
            Err(e) => {
                self.unpin(pin_to);
                self.unpin(pin_from);
                // A file that may hold a torn first save goes: nothing was written yet. (Left
                // behind, open would drop it as a begin cut short.)
                let _ = inner.files.remove(&file_name(volume));
                Err(e)
            }
        }
    }

    /// A new pending rollback: its size, and its first save (synced, with the directory).
    fn first_save(
        &self,
        volume: u32,
        to: Point,
        from: Point,
        pins: [PinId; 2],
    ) -> Result<Pending, HistoryError> {
        let mut p = Pending {
            status: RollbackStatus {
                volume,
                to,
                from,
                done_bytes: 0,
                total_bytes: 0,
                finished: false,
            },
            cursor: 0,
            generation: 1,
            pins,
            running: false,
            disk: self.rollback_disk(volume)?,
        };
        p.status.total_bytes = self.plan(&p.status)?.iter().map(|(s, e)| e - s).sum();
        self.save_pending(&p)?;
        Ok(p)
    }

    /// Runs the volume's pending rollback to its end (or resumes one found at open): extents of
    /// changes(to.volume_seq, from.volume_seq), in ascending offset, in chunks of at most
    /// `max_chunk` bytes aligned to the volume's block size; each chunk read as of `to`
    /// (read_at) and handed to `write`, which returns once durable; a chunk that reads all
    /// zeros is a Zero. Saves progress every few MiB and at the end; calls `progress` after each chunk.
    /// On finish removes the pending file and the pins.
    pub fn run_rollback(
        &self,
        volume: u32,
        max_chunk: u64,
        write: &mut dyn FnMut(RollbackWrite<'_>) -> Result<(), String>,
        progress: &mut dyn FnMut(&RollbackStatus),
    ) -> Result<RollbackStatus, HistoryError> {
        let (status, cursor) = {
            let mut rb = lock(&self.inner.rollbacks);
            let p =
                rb.0.get_mut(&volume)
                    .ok_or(HistoryError::NoRollback(volume))?;
            if p.running {
                return Err(HistoryError::RollbackRunning(volume));
            }
            p.running = true;
            (p.status.clone(), p.cursor)
        };
        let r = self.drive(status, cursor, max_chunk, write, progress);
        if let Some(p) = lock(&self.inner.rollbacks).0.get_mut(&volume) {
            p.running = false;
        }
        r
    }

    fn drive(
        &self,
        mut status: RollbackStatus,
        mut cursor: u64,
        max_chunk: u64,
        write: &mut dyn FnMut(RollbackWrite<'_>) -> Result<(), String>,
        progress: &mut dyn FnMut(&RollbackStatus),
    ) -> Result<RollbackStatus, HistoryError> {
        let volume = status.volume;
        let block = self.block_size(volume)?;
        let chunk = (max_chunk / block * block).max(block);
        let mut buf = Vec::new();
        let mut unsaved = 0u64;
        for (s, e) in self.plan(&status)? {
            let mut off = s.max(cursor);
            while off < e {
                let n = (e - off).min(chunk);
                buf.resize(n as usize, 0);
                self.read_at(volume, status.to.volume_seq, off, &mut buf)?;
                let w = if buf.iter().all(|&b| b == 0) {
                    RollbackWrite::Zero {
                        offset: off,
                        length: n,
                    }
                } else {
                    RollbackWrite::Data {
                        offset: off,
                        data: &buf,
                    }
                };
                write(w).map_err(|why| HistoryError::RollbackWrite { volume, why })?;
                off += n;
                cursor = off;
                status.done_bytes = status.done_bytes.saturating_add(n);
                unsaved += n;
                if unsaved >= self.inner.cfg.rollback_save_bytes {
                    self.save_cursor(volume, cursor, status.done_bytes)?;
                    unsaved = 0;
                }
                progress(&status);
            }
        }
        // The end: the pending file goes (durably), then the pins.
        let name = file_name(volume);
        let files = self.inner.files.as_ref();
        files.remove(&name).map_err(io_err(files, &name))?;
        if let Some(p) = lock(&self.inner.rollbacks).0.remove(&volume) {
            for id in p.pins {
                self.unpin(id);
            }
        }
        status.finished = true;
        Ok(status)
    }

    /// Drops `volume`'s pending rollback unfinished (its `to` may have been shrunk away, so
    /// it can never finish): the file and pins go; what was written stays written. Returns
    /// whether one was pending.
    pub fn cancel_rollback(&self, volume: u32) -> Result<bool, HistoryError> {
        let mut rb = lock(&self.inner.rollbacks);
        match rb.0.get(&volume) {
            None => return Ok(false),
            Some(p) if p.running => return Err(HistoryError::RollbackRunning(volume)),
            Some(_) => {}
        }
        let name = file_name(volume);
        let files = self.inner.files.as_ref();
        files.remove(&name).map_err(io_err(files, &name))?;
        if let Some(p) = rb.0.remove(&volume) {
            for id in p.pins {
                self.unpin(id);
            }
        }
        Ok(true)
    }

    /// Rollbacks begun and not finished (found at open, or begun since): the node resumes these at start.
    pub fn pending_rollbacks(&self) -> Vec<RollbackStatus> {
        lock(&self.inner.rollbacks)
            .0
            .values()
            .map(|p| p.status.clone())
            .collect()
    }

    /// At open: the pending files, their pins taken again (before `start`, unchecked).
    pub(crate) fn load_rollbacks(&self) -> Result<(), HistoryError> {
        let inner = &self.inner;
        let files = inner.files.as_ref();
        let names = files.list(PREFIX).map_err(io_err(files, PREFIX))?;
        for name in names {
            let disk = files
                .open(&name, FileUse::Random)
                .map_err(io_err(files, &name))?;
            let corrupt = |why: String| HistoryError::Corrupt {
                path: files.path(&name),
                at: 0,
                why,
            };
            let Some(r) = RollbackRecord::load(disk.as_ref()).map_err(corrupt)? else {
                tracing::warn!(file = %name, "history: a rollback whose start a crash cut short is dropped");
                files.remove(&name).map_err(io_err(files, &name))?;
                continue;
            };
            if name != file_name(r.volume) {
                return Err(corrupt(format!("names volume {}", r.volume)));
            }
            let to = Point {
                volume_seq: r.to_vseq,
                timestamp_ns: r.to_ts,
            };
            let from = Point {
                volume_seq: r.from_vseq,
                timestamp_ns: r.from_ts,
            };
            let pins = [
                self.pin(r.volume, r.to_vseq)?,
                self.pin(r.volume, r.from_vseq)?,
            ];
            let p = Pending {
                status: RollbackStatus {
                    volume: r.volume,
                    to,
                    from,
                    done_bytes: r.done_bytes,
                    total_bytes: r.total_bytes,
                    finished: false,
                },
                cursor: r.cursor,
                generation: r.generation,
                pins,
                running: false,
                disk,
            };
            lock(&inner.rollbacks).0.insert(r.volume, p);
        }
        Ok(())
    }

    fn rollback_disk(&self, volume: u32) -> Result<Arc<dyn Disk>, HistoryError> {
        let name = file_name(volume);
        let files = self.inner.files.as_ref();
        let disk = files
            .open(&name, FileUse::Random)
            .map_err(io_err(files, &name))?;
        Ok(disk)
    }

    /// Saves `p` durably (its file, and the file's creation).
    fn save_pending(&self, p: &Pending) -> Result<(), HistoryError> {
        let name = file_name(p.status.volume);
        let files = self.inner.files.as_ref();
        p.record()
            .save(p.disk.as_ref())
            .map_err(io_err(files, &name))?;
        if p.generation == 1 {
            files.sync_dir().map_err(io_err(files, "."))?;
        }
        Ok(())
    }

    fn save_cursor(&self, volume: u32, cursor: u64, done: u64) -> Result<(), HistoryError> {
        let mut rb = lock(&self.inner.rollbacks);
        let p =
            rb.0.get_mut(&volume)
                .ok_or(HistoryError::NoRollback(volume))?;
        let before = (p.cursor, p.status.done_bytes, p.generation);
        p.cursor = cursor;
        p.status.done_bytes = done;
        p.generation += 1;
        let r = self.save_pending(p);
        if r.is_err() {
            // Not saved: memory keeps saying what the file says.
            (p.cursor, p.status.done_bytes, p.generation) = before;
        }
        r
    }

    fn block_size(&self, volume: u32) -> Result<u64, HistoryError> {
        let b = u64::from(self.view(volume)?.state.block_size);
        Ok(if b < 512 || b % 512 != 0 { 512 } else { b })
    }

    /// The byte ranges a rollback writes: the changed extents of `(to, from]`, rounded out to
    /// whole blocks (within the volume), merged, ascending.
    fn plan(&self, s: &RollbackStatus) -> Result<Vec<(u64, u64)>, HistoryError> {
        let block = self.block_size(s.volume)?;
        let size = self.view(s.volume)?.state.size;
        let changes = self.changes(s.volume, s.to.volume_seq, s.from.volume_seq)?;
        let mut out: Vec<(u64, u64)> = Vec::new();
        for x in changes.extents {
            let start = x.offset / block * block;
            let end = (x.offset + x.length).div_ceil(block) * block;
            let end = end.min(size.max(x.offset + x.length));
            match out.last_mut() {
                Some(last) if last.1 >= start => last.1 = last.1.max(end),
                _ => out.push((start, end)),
            }
        }
        Ok(out)
    }
}
