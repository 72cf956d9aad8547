//! Where history's files live: a directory of real files in production, a map of fault-
//! injecting memory disks in the model tests (so every file history writes can lose its
//! unsynced writes at a simulated crash).

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use mariner_disk::{Disk, FileDisk, OpenOptions};

/// How a file is read, so a directory can open it the way that suits it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileUse {
    /// Appended and read back in order (logs, digests).
    Sequential,
    /// Read a block at a time at random (the index's leaves, base images).
    Random,
}

/// A flat set of named files, each a [`Disk`].
pub trait Files: Send + Sync {
    /// Opens `name`, creating it empty when missing.
    fn open(&self, name: &str, usage: FileUse) -> io::Result<Arc<dyn Disk>>;
    /// Whether `name` exists.
    fn exists(&self, name: &str) -> io::Result<bool>;
    /// Removes `name` (durably: the removal survives a crash once this returns).
    fn remove(&self, name: &str) -> io::Result<()>;
    /// Names starting with `prefix`, sorted.
    fn list(&self, prefix: &str) -> io::Result<Vec<String>>;
    /// Makes the creation of files durable (a directory's fsync).
    fn sync_dir(&self) -> io::Result<()>;
    /// For messages: where `name` is.
    fn path(&self, name: &str) -> PathBuf;
}

/// Real files in one directory.
#[derive(Debug, Clone)]
pub struct DirFiles {
    dir: PathBuf,
}

impl DirFiles {
    /// Creates the directory when missing.
    pub fn new(dir: &Path) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }
}

impl Files for DirFiles {
    fn open(&self, name: &str, usage: FileUse) -> io::Result<Arc<dyn Disk>> {
        let opts = OpenOptions::new()
            .create(true)
            .random(usage == FileUse::Random);
        Ok(Arc::new(FileDisk::open(self.dir.join(name), &opts)?))
    }
    fn exists(&self, name: &str) -> io::Result<bool> {
        self.dir.join(name).try_exists()
    }
    fn remove(&self, name: &str) -> io::Result<()> {
        match std::fs::remove_file(self.dir.join(name)) {
            Ok(()) => self.sync_dir(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }
    fn list(&self, prefix: &str) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(&self.dir)? {
            let name = e?.file_name();
            if let Some(n) = name.to_str().filter(|n| n.starts_with(prefix)) {
                out.push(n.to_string());
            }
        }
        out.sort();
        Ok(out)
    }
    fn sync_dir(&self) -> io::Result<()> {
        std::fs::File::open(&self.dir)?.sync_all()
    }
    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

/// Files that are memory disks chosen by the caller (fault-injecting ones in tests): `make`
/// creates a missing file's disk. A crash is simulated by building a new `MemFiles` from
/// [`MemFiles::disks`] after crashing each.
pub struct MemFiles {
    disks: Mutex<BTreeMap<String, Arc<dyn Disk>>>,
    make: Box<MakeDisk>,
}

/// Makes the disk of a file created by name.
pub type MakeDisk = dyn Fn(&str) -> Arc<dyn Disk> + Send + Sync;

impl MemFiles {
    pub fn new(
        disks: BTreeMap<String, Arc<dyn Disk>>,
        make: impl Fn(&str) -> Arc<dyn Disk> + Send + Sync + 'static,
    ) -> Self {
        Self {
            disks: Mutex::new(disks),
            make: Box::new(make),
        }
    }

    /// Every file and its disk.
    pub fn disks(&self) -> BTreeMap<String, Arc<dyn Disk>> {
        self.disks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Files for MemFiles {
    fn open(&self, name: &str, _usage: FileUse) -> io::Result<Arc<dyn Disk>> {
        let mut d = self.disks.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(Arc::clone(
            d.entry(name.to_string())
                .or_insert_with(|| (self.make)(name)),
        ))
    }
    fn exists(&self, name: &str) -> io::Result<bool> {
        let d = self.disks.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(d.contains_key(name))
    }
    fn remove(&self, name: &str) -> io::Result<()> {
        let mut d = self.disks.lock().unwrap_or_else(PoisonError::into_inner);
        d.remove(name);
        Ok(())
    }
    fn list(&self, prefix: &str) -> io::Result<Vec<String>> {
        let d = self.disks.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(d.keys()
            .filter(|k| k.starts_with(prefix))
            .cloned()
            .collect())
    }
    fn sync_dir(&self) -> io::Result<()> {
        Ok(())
    }
    fn path(&self, name: &str) -> PathBuf {
        PathBuf::from(format!("mem:{name}"))
    }
}
