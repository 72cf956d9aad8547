//! The digest files: naming, positioned reads of frame parts, and the scan that validates a
//! file at open. Each file is a [`Disk`] of the history's [`Files`], so the model tests can
//! put the digests on fault-injecting disks and crash them.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use mariner_disk::Disk;

use super::format::{self, Damage, FrameHeader, Summary, FRAME_HEADER_LEN};
use crate::files::{FileUse, Files};
use crate::{DigestEntry, HistoryError};

/// A file's name: the prefix, its first sequence number as 16 lowercase hex digits, `.tld`.
pub fn file_name(prefix: &str, first_seq: u64) -> String {
    format!("{prefix}{first_seq:016x}.tld")
}

/// The digest files named with `prefix`, by first sequence number, ascending. Other names
/// are not ours and are left alone.
pub fn list(files: &dyn Files, prefix: &str) -> Result<Vec<(u64, String)>, HistoryError> {
    let names = files.list(prefix).map_err(|source| HistoryError::Io {
        path: files.path(prefix),
        source,
    })?;
    let mut out = Vec::new();
    for name in names {
        let Some(hex) = name
            .strip_prefix(prefix)
            .and_then(|rest| rest.strip_suffix(".tld"))
        else {
            continue;
        };
        if hex.len() != 16 || !hex.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')) {
            continue;
        }
        if let Ok(seq) = u64::from_str_radix(hex, 16) {
            out.push((seq, name));
        }
    }
    out.sort();
    Ok(out)
}

/// One open digest file.
#[derive(Debug)]
pub struct DigestFile {
    pub first_seq: u64,
    /// The sequence number of its last entry.
    pub last_seq: u64,
    /// Its name among the history's files.
    pub name: String,
    /// Where it is, for messages.
    pub path: PathBuf,
    pub disk: Arc<dyn Disk>,
    /// Bytes in it: header and whole frames.
    pub len: u64,
    /// Written since the last sync.
    pub dirty: bool,
}

/// A frame's header and summaries: what a reader needs to decide whether to read its entries.
#[derive(Debug, Clone)]
pub struct Head {
    pub offset: u64,
    pub header: FrameHeader,
    pub summaries: Vec<Summary>,
}

impl Head {
    pub fn end(&self) -> u64 {
        self.offset + self.header.frame_len()
    }
    pub fn summary(&self, volume: u32) -> Option<&Summary> {
        self.summaries
            .binary_search_by_key(&volume, |s| s.volume)
            .ok()
            .map(|i| &self.summaries[i])
    }
    fn entries_at(&self) -> u64 {
        self.offset + FRAME_HEADER_LEN as u64 + self.header.summaries_len()
    }
}

impl DigestFile {
    /// Syncs what was written since the last sync, if anything.
    pub fn settle(&mut self) -> Result<(), HistoryError> {
        if self.dirty {
            self.disk.sync().map_err(|e| self.io(e))?;
            self.dirty = false;
        }
        Ok(())
    }

    pub fn io(&self, source: std::io::Error) -> HistoryError {
        HistoryError::Io {
            path: self.path.clone(),
            source,
        }
    }

    pub fn corrupt(&self, d: Damage, base: u64) -> HistoryError {
        HistoryError::Corrupt {
            path: self.path.clone(),
            at: base + d.at,
            why: d.why,
        }
    }

    /// Reads `len` bytes at `offset`, counting them in `counter`; bytes the file does not have
    /// are damage (the frame said they would be there), not an I/O error.
    fn read(
        &self,
        offset: u64,
        len: u64,
        counter: &AtomicU64,
    ) -> Result<Result<Vec<u8>, Damage>, HistoryError> {
        if offset.saturating_add(len) > self.len {
            return Ok(Err(Damage {
                at: 0,
                why: format!("frame part of {len} bytes runs past the end of the file"),
            }));
        }
        let n =
            usize::try_from(len).map_err(|_| self.io(std::io::ErrorKind::InvalidInput.into()))?;
        let mut buf = vec![0u8; n];
        self.disk
            .read_at(&mut buf, offset)
            .map_err(|e| self.io(e))?;
        counter.fetch_add(len, Ordering::Relaxed);
        Ok(Ok(buf))
    }

    /// Reads and checks the header and summaries of the frame at `offset`. The outer error is
    /// I/O; the inner one damage, with `at` relative to `offset`.
    pub fn try_head(
        &self,
        offset: u64,
        counter: &AtomicU64,
    ) -> Result<Result<Head, Damage>, HistoryError> {
        let h = match self.read(offset, FRAME_HEADER_LEN as u64, counter)? {
            Ok(b) => match format::decode_frame_header(&b) {
                Ok(h) => h,
                Err(d) => return Ok(Err(d)),
            },
            Err(d) => return Ok(Err(d)),
        };
        if offset.saturating_add(h.frame_len()) > self.len {
            return Ok(Err(Damage {
                at: 0,
                why: format!(
                    "frame of {} bytes runs past the end of the file",
                    h.frame_len()
                ),
            }));
        }
        let at = offset + FRAME_HEADER_LEN as u64;
        let summaries = match self.read(at, h.summaries_len(), counter)? {
            Ok(b) => format::decode_summaries(&h, &b),
            Err(d) => Err(d),
        };
        Ok(summaries
            .map(|summaries| Head {
                offset,
                header: h,
                summaries,
            })
            .map_err(|d| format::shift(d, FRAME_HEADER_LEN)))
    }

    /// Reads and checks the entries of the frame `head`. Inner error as [`Self::try_head`].
    pub fn try_entries(
        &self,
        head: &Head,
        counter: &AtomicU64,
    ) -> Result<Result<Vec<DigestEntry>, Damage>, HistoryError> {
        let at = head.entries_at();
        let base = (at - head.offset) as usize;
        Ok(match self.read(at, head.header.entries_len(), counter)? {
            Ok(b) => format::decode_entries(&head.header, &head.summaries, &b),
            Err(d) => Err(d),
        }
        .map_err(|d| format::shift(d, base)))
    }

    /// The frame head at `offset`, damage being corruption (for queries, after open).
    pub fn head(&self, offset: u64, counter: &AtomicU64) -> Result<Head, HistoryError> {
        self.try_head(offset, counter)?
            .map_err(|d| self.corrupt(d, offset))
    }

    /// The entries of `head`, damage being corruption.
    pub fn entries(
        &self,
        head: &Head,
        counter: &AtomicU64,
    ) -> Result<Vec<DigestEntry>, HistoryError> {
        self.try_entries(head, counter)?
            .map_err(|d| self.corrupt(d, head.offset))
    }

    /// Whether an intact frame above `after` starts anywhere past `from`: a damaged frame
    /// followed by one is damage in the middle of the file, not a torn tail. Reads the rest of
    /// the file (at most one file's size, and only when something is damaged).
    pub fn intact_frame_after(&self, from: u64, after: u64) -> Result<bool, HistoryError> {
        if from >= self.len {
            return Ok(false);
        }
        let rest = match self.read(from, self.len - from, &AtomicU64::new(0))? {
            Ok(b) => b,
            Err(_) => return Ok(false),
        };
        let magic = format::FRAME_MAGIC;
        for i in 0..rest.len().saturating_sub(FRAME_HEADER_LEN - 1) {
            if rest[i..i + 4] != magic {
                continue;
            }
            let Ok(h) = format::decode_frame_header(&rest[i..]) else {
                continue;
            };
            let Some(frame) = usize::try_from(h.frame_len())
                .ok()
                .and_then(|n| rest.get(i..i.checked_add(n)?))
            else {
                continue;
            };
            if h.first_seq > after && format::decode_frame(frame).is_ok() {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

/// Creates the file of `first_seq`, empty: the caller writes its header with its first frame,
/// in one write. Refuses a name that exists: a file the listing did not show is not ours to
/// overwrite.
pub fn create(files: &dyn Files, prefix: &str, first_seq: u64) -> Result<DigestFile, HistoryError> {
    let name = file_name(prefix, first_seq);
    let path = files.path(&name);
    let io = |source| HistoryError::Io {
        path: path.clone(),
        source,
    };
    if files.exists(&name).map_err(io)? {
        return Err(io(std::io::ErrorKind::AlreadyExists.into()));
    }
    // Whatever length a new disk comes with, the first append sets the file's.
    let disk = files.open(&name, FileUse::Sequential).map_err(io)?;
    Ok(DigestFile {
        first_seq,
        last_seq: 0,
        name,
        path,
        disk,
        len: 0,
        dirty: false,
    })
}

/// Opens an existing file (the newest one is appended to, and cut if torn).
pub fn open(files: &dyn Files, first_seq: u64, name: String) -> Result<DigestFile, HistoryError> {
    let path = files.path(&name);
    let io = |source| HistoryError::Io {
        path: path.clone(),
        source,
    };
    let disk = files.open(&name, FileUse::Sequential).map_err(io)?;
    let len = disk.len().map_err(io)?;
    Ok(DigestFile {
        first_seq,
        last_seq: 0,
        name,
        path,
        disk,
        len,
        dirty: false,
    })
}

/// Makes the creation of files durable (a directory's fsync).
pub fn sync_dir(files: &dyn Files) -> Result<(), HistoryError> {
    files.sync_dir().map_err(|source| HistoryError::Io {
        path: files.path(""),
        source,
    })
}
