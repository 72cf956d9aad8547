//! TL digests: a durable, append-only record of every durable log record's metadata (a
//! [`DigestEntry`]), in sequence order — lu-dissertation ch. 4's TL index, time-major. The
//! log is already in time order, so the TL index needs no tree: the digests are the log's
//! headers without payloads, and a sparse in-memory map from time (and volume sequence
//! number) to their position. Time → instant resolution, diff ("which extents of volume V
//! changed between T1 and T2"), activity ("writes and bytes per time bucket") and the base
//! images' roll-forward read them and never a payload.
//!
//! **Files.** `<prefix><first_seq:016x>.tld` among the history's [`Files`] (the engine's
//! prefix is `digest-`, beside the index and state files; a [`Files`] of fault-injecting
//! memory disks lets the model tests crash them), each a file header then frames, a new file once
//! the current one would pass `file_bytes` (64 MiB by default), so that
//! [`Digests::drop_through`] frees space in whole files. A frame is what one
//! [`Digests::append`] gives (split at [`format::MAX_FRAME_ENTRIES`]): a header, one summary
//! per volume in it, then 56-byte entries (docs/FORMATS.md "History: TL digests").
//!
//! **Checksums.** Three per frame: the header's own, then one over the summaries and one over
//! the entries, both kept in the header. The header is trusted before its lengths are used;
//! open and queries that skip a frame read header and summaries only, and the entries'
//! checksum is checked when they are read.
//!
//! **Crash and damage.** Only the newest file is ever appended to: a file is synced before
//! the next one is created. At most one write of a file is unsynced at any time: a new file's
//! header goes in one write with its first frame, and an append to a file holding an unsynced
//! write syncs it first (the history engine syncs after each append, so this costs it nothing).
//! Two unsynced writes could reach the disk in either order at a crash and leave a hole before
//! an intact frame, which open could not tell from damage; one write can only be lost, cut
//! short or leave zeros where it grew the file — a torn tail. Open checks every frame's header and summaries; the newest file
//! is read whole and its entries checked too. A damaged frame of the newest file after which
//! no intact frame follows is a torn tail, cut off (the file is truncated there, or removed if
//! nothing is left, and [`DigestsOpen::truncated`] says why); damage anywhere else — an older
//! file, or a frame followed by intact ones — is [`HistoryError::Corrupt`] with the file and
//! byte offset. What a cut drops was never synced: the history engine moves its log
//! watermark past records only once their digests are synced, so it appends them again from
//! the log from [`Digests::last_seq`] on.
//!
//! **Lookups** binary-search the in-memory samples (`digest/samples.rs`) and read a bounded
//! run of frames from there. [`Digests::newest_at_or_before`] and [`Digests::for_each_in_time`]
//! assume a volume's timestamps do not decrease as its volume sequence numbers rise (the log
//! stamps timestamps that rise with sequence numbers); [`Digests::by_volume_seq`] and
//! [`Digests::for_each`] assume nothing about order.
//!
//! **Errors.** After a failed write or sync the state on disk is unknown: the digests refuse
//! further appends and syncs ([`HistoryError::DigestsFailed`]) until reopened, which finds
//! the last intact frame.

pub mod format;

mod files;
mod open;
mod query;
mod samples;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::files::Files;
use crate::{DigestEntry, HistoryError};
use files::DigestFile;
use format::{FILE_HEADER_LEN, MAX_FRAME_ENTRIES};
use samples::Samples;

pub use samples::{SAMPLE_ENTRIES, SAMPLE_NS};

/// Default size at which a new file is started.
pub const DEFAULT_FILE_BYTES: u64 = 64 << 20;

/// How the digests are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DigestsConfig {
    /// A new file is started when a frame would take the current one past this (a frame
    /// larger than it gets a file of its own). Tests make it small to get many files.
    pub file_bytes: u64,
}

impl Default for DigestsConfig {
    fn default() -> Self {
        Self {
            file_bytes: DEFAULT_FILE_BYTES,
        }
    }
}

/// What [`Digests::open`] found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DigestsOpen {
    /// The highest sequence number kept (0 if none).
    pub last_seq: u64,
    /// Frames kept, over all files.
    pub frames: u64,
    pub files: u64,
    /// Why a torn tail of the newest file was cut (file, offset, what was wrong), if one was.
    pub truncated: Option<String>,
}

/// The digest files of one prefix; see the module documentation.
pub struct Digests {
    store: Arc<dyn Files>,
    /// What every digest file's name starts with.
    prefix: String,
    config: DigestsConfig,
    /// Ascending by first sequence number; the last one is appended to.
    files: Vec<DigestFile>,
    samples: Samples,
    last_seq: u64,
    /// A file was created since the directory was last synced.
    dir_dirty: bool,
    /// Set by a failed write or sync: why.
    failed: Option<String>,
    bytes_read: AtomicU64,
}

impl fmt::Debug for Digests {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Digests")
            .field("prefix", &self.prefix)
            .field("config", &self.config)
            .field("files", &self.files)
            .field("last_seq", &self.last_seq)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

impl Digests {
    /// Opens the digests named `prefix…` in `store` with the default configuration; see
    /// [`Digests::open_with`].
    pub fn open(store: Arc<dyn Files>, prefix: &str) -> Result<(Self, DigestsOpen), HistoryError> {
        Self::open_with(store, prefix, DigestsConfig::default())
    }

    /// Appends one frame (more if `entries` exceeds [`MAX_FRAME_ENTRIES`]) holding
    /// `entries`: non-empty, `seq` strictly ascending, the first above [`Self::last_seq`],
    /// volumes mixed. Not durable until [`Self::sync`].
    pub fn append(&mut self, entries: &[DigestEntry]) -> Result<(), HistoryError> {
        self.check_usable()?;
        let Some(first) = entries.first() else {
            return Err(HistoryError::DigestAppend("no entries".into()));
        };
        if first.seq <= self.last_seq {
            return Err(HistoryError::DigestAppend(format!(
                "sequence number {} is not above the last one kept, {}",
                first.seq, self.last_seq
            )));
        }
        if let Some(w) = entries.windows(2).find(|w| w[1].seq <= w[0].seq) {
            return Err(HistoryError::DigestAppend(format!(
                "sequence number {} follows {}",
                w[1].seq, w[0].seq
            )));
        }
        for chunk in entries.chunks(MAX_FRAME_ENTRIES as usize) {
            let r = self.append_frame(chunk);
            if let Err(e) = &r {
                self.failed = Some(e.to_string());
            }
            r?;
        }
        Ok(())
    }

    fn append_frame(&mut self, entries: &[DigestEntry]) -> Result<(), HistoryError> {
        let (Some(first), Some(last)) = (entries.first(), entries.last()) else {
            return Ok(());
        };
        let bytes = format::encode_frame(entries);
        let len = bytes.len() as u64;
        let roll = match self.files.last() {
            None => true,
            Some(f) => f.len > FILE_HEADER_LEN as u64 && f.len + len > self.config.file_bytes,
        };
        if roll {
            // Only the newest file may hold a torn tail: seal the current one first.
            if let Some(f) = self.files.last_mut() {
                f.settle()?;
            }
            self.files
                .push(files::create(self.store.as_ref(), &self.prefix, first.seq)?);
            self.dir_dirty = true;
        }
        let Some(f) = self.files.last_mut() else {
            return Err(HistoryError::DigestsFailed("no file to append to".into()));
        };
        // At most one write of a file is ever unsynced (module documentation, "Crash").
        f.settle()?;
        // A new file's header goes in the same write as its first frame.
        let header = if f.len == 0 {
            format::encode_file_header(f.first_seq).to_vec()
        } else {
            Vec::new()
        };
        let write_at = f.len;
        let at = write_at + header.len() as u64;
        let end = at + len;
        let buf = [header, bytes].concat();
        // Memory disks grow only through `set_len`. A crash may keep the longer length and
        // not the bytes: zeros, which open cuts as a torn tail.
        f.disk.set_len(end).map_err(|e| f.io(e))?;
        f.disk.write_at(&buf, write_at).map_err(|e| f.io(e))?;
        f.len = end;
        f.last_seq = last.seq;
        f.dirty = true;
        let (summaries, _, _) = format::summarize(entries);
        self.samples
            .add_frame(f.first_seq, at, first.seq, &summaries);
        self.last_seq = last.seq;
        Ok(())
    }

    /// Makes what was appended durable: sync of the current file, and of the directory if a
    /// file was created since.
    pub fn sync(&mut self) -> Result<(), HistoryError> {
        self.check_usable()?;
        let r = self.sync_inner();
        if let Err(e) = &r {
            self.failed = Some(e.to_string());
        }
        r
    }

    fn sync_inner(&mut self) -> Result<(), HistoryError> {
        if let Some(f) = self.files.last_mut() {
            f.settle()?;
        }
        if self.dir_dirty {
            files::sync_dir(self.store.as_ref())?;
            self.dir_dirty = false;
        }
        Ok(())
    }

    fn check_usable(&self) -> Result<(), HistoryError> {
        match &self.failed {
            Some(why) => Err(HistoryError::DigestsFailed(why.clone())),
            None => Ok(()),
        }
    }

    /// The highest sequence number appended (0 if none).
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// Deletes the files all of whose entries have `seq <= seq` (the history engine calls it
    /// as records leave the window), never the one being appended to. Returns the bytes freed.
    pub fn drop_through(&mut self, seq: u64) -> Result<u64, HistoryError> {
        let keep_last = self.files.len().saturating_sub(1);
        let n = self.files[..keep_last]
            .iter()
            .take_while(|f| f.last_seq <= seq)
            .count();
        if n == 0 {
            return Ok(0);
        }
        // Removed files leave the list one by one, so a failed removal leaves the list true.
        // [`Files::remove`] is durable when it returns.
        let (mut freed, mut removed, mut result) = (0u64, 0usize, Ok(()));
        for f in &self.files[..n] {
            if let Err(e) = self.store.remove(&f.name) {
                result = Err(f.io(e));
                break;
            }
            freed += f.len;
            removed += 1;
        }
        if let Some(last) = removed.checked_sub(1).map(|i| self.files[i].first_seq) {
            self.samples.drop_files_through(last);
        }
        self.files.drain(..removed);
        result?;
        Ok(freed)
    }

    /// Bytes of the digest files on disk.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.len).sum()
    }

    /// Bytes read from the files by queries since open (not counting open itself): tests and
    /// benchmarks use it to show what a query skips.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read.load(Ordering::Relaxed)
    }

    /// In-memory samples over all volumes (`digest/samples.rs` gives their bound).
    pub fn samples(&self) -> usize {
        self.samples.len()
    }

    /// Files kept.
    pub fn files(&self) -> usize {
        self.files.len()
    }
}
