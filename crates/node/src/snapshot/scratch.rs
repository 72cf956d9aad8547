//! A writable snapshot export's own writes (`mariner snapshot export --scratch`): whole 4 KiB
//! pages in a sparse file, `volumes/<volume>/scratch/<snapshot>.img`, thrown away when the
//! export is removed. The file's allocation is the record of which pages it holds (every page
//! is written whole, zeros included, so an allocated page is a written one), so the export
//! keeps its writes across a restart without a second file to keep in step. Its writes
//! never reach the volume or its history.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, RwLock};

use mariner_disk::{Disk, FileDisk, OpenOptions};

use crate::volume::{VolumeError, PAGE_BYTES};

const PAGE: u64 = PAGE_BYTES as u64;

pub struct Scratch {
    disk: FileDisk,
    path: PathBuf,
    /// Pages the file holds.
    pages: RwLock<BTreeSet<u64>>,
    max_bytes: u64,
    /// Serialises read-modify-writes of partial pages against every other write.
    pub(super) writing: tokio::sync::Mutex<()>,
    /// Guards `pages` growth against `max_bytes` between check and insert.
    grow: Mutex<()>,
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> VolumeError + '_ {
    move |e| VolumeError::Failed(format!("scratch {}: {e}", path.display()))
}

impl Scratch {
    /// Opens (creating when new) the scratch file at `path`, learning from its allocation
    /// which pages it holds.
    pub fn open(path: &Path, max_bytes: u64) -> Result<Self, VolumeError> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io(path))?;
        }
        let disk = FileDisk::open(path, &OpenOptions::new().create(true)).map_err(io(path))?;
        let len = disk.len().map_err(io(path))?;
        let mut pages = BTreeSet::new();
        for e in disk.allocation(0, len).map_err(io(path))? {
            if e.allocated {
                let first = e.offset / PAGE;
                let end = (e.offset + e.len).div_ceil(PAGE);
                pages.extend(first..end);
            }
        }
        Ok(Self {
            disk,
            path: path.to_path_buf(),
            pages: RwLock::new(pages),
            max_bytes,
            writing: tokio::sync::Mutex::new(()),
            grow: Mutex::new(()),
        })
    }

    /// Bytes of writes held.
    pub fn bytes(&self) -> u64 {
        self.pages.read().map_or(0, |p| p.len() as u64 * PAGE)
    }

    /// The pages held that `[offset, offset + len)` touches, in order.
    pub fn pages_in(&self, offset: u64, len: u64) -> Result<Vec<u64>, VolumeError> {
        let p = self
            .pages
            .read()
            .map_err(|_| VolumeError::Task("poisoned".into()))?;
        Ok(p.range(offset / PAGE..(offset + len).div_ceil(PAGE))
            .copied()
            .collect())
    }

    /// Copies the held pages' bytes over `buf`, which holds the snapshot's bytes at `offset`.
    pub fn overlay(&self, offset: u64, buf: &mut [u8]) -> Result<(), VolumeError> {
        let len = buf.len() as u64;
        if len == 0 {
            return Ok(());
        }
        for page in self.pages_in(offset, len)? {
            let from = (page * PAGE).max(offset);
            let to = ((page + 1) * PAGE).min(offset + len);
            let out = &mut buf[(from - offset) as usize..(to - offset) as usize];
            self.disk.read_at(out, from).map_err(io(&self.path))?;
        }
        Ok(())
    }

    /// Writes whole pages starting at page `first`; refused with NoSpace beyond `max_bytes`.
    pub fn write_pages(&self, first: u64, data: &[u8]) -> Result<(), VolumeError> {
        let n = (data.len() as u64).div_ceil(PAGE);
        {
            let _g = self
                .grow
                .lock()
                .map_err(|_| VolumeError::Task("poisoned".into()))?;
            let p = self
                .pages
                .read()
                .map_err(|_| VolumeError::Task("poisoned".into()))?;
            let new = (first..first + n).filter(|x| !p.contains(x)).count() as u64;
            if (p.len() as u64 + new) * PAGE > self.max_bytes {
                return Err(VolumeError::NoSpace);
            }
        }
        self.disk
            .write_at(data, first * PAGE)
            .map_err(io(&self.path))?;
        let _g = self
            .grow
            .lock()
            .map_err(|_| VolumeError::Task("poisoned".into()))?;
        let mut p = self
            .pages
            .write()
            .map_err(|_| VolumeError::Task("poisoned".into()))?;
        p.extend(first..first + n);
        Ok(())
    }

    /// Makes the writes so far durable (NBD FLUSH, SCSI SYNCHRONIZE CACHE).
    pub fn sync(&self) -> Result<(), VolumeError> {
        self.disk.sync().map_err(io(&self.path))
    }

    /// Deletes the file (the export is being removed).
    pub fn discard(&self) {
        if let Err(e) = std::fs::remove_file(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %e, "could not delete a scratch file");
        }
    }
}
