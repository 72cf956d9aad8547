//! A data directory's first start: its log devices created and formatted and `mariner.json`
//! written — and, if the start fails anywhere (no space for the log, a default volume the file
//! system cannot hold...), all of that removed again, so the next attempt begins clean instead
//! of finding a directory it refuses to initialise.

use std::fs::{self, File};
use std::io::ErrorKind;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use mariner_disk::Disk;
use mariner_log::Log;

use crate::config::Config;
use crate::datadir::{DataDir, NodeState, FORMAT_VERSION};
use crate::node::{log_config, now_ns, open_disk};
use crate::{human_bytes, logdevices, NodeError};

/// What a start created, to be removed if it fails.
#[derive(Debug)]
pub(crate) struct FirstStart {
    root: PathBuf,
    /// The levels of the data directory's path that did not exist, deepest first.
    missing: Vec<PathBuf>,
    /// Whether `<root>/lock` existed.
    had_lock: bool,
    /// Set once the directory turned out to be new: everything in it is this start's.
    initialising: bool,
    /// Log device files and directories made outside the data directory, in order.
    created: Vec<PathBuf>,
    /// Log devices that existed, with the bytes at their start before formatting.
    formatted: Vec<(PathBuf, Vec<u8>)>,
}

/// The bytes formatting overwrites at the start of a device (one superblock block).
const FORMAT_BYTES: u64 = 64 * 1024;

impl FirstStart {
    /// Notes what exists of the data directory `root` before a start.
    pub(crate) fn before(root: &Path) -> Self {
        let missing = root
            .ancestors()
            .take_while(|p| !p.as_os_str().is_empty() && !p.exists())
            .map(Path::to_path_buf)
            .collect();
        Self {
            root: root.to_path_buf(),
            missing,
            had_lock: root.join("lock").exists(),
            initialising: false,
            created: Vec::new(),
            formatted: Vec::new(),
        }
    }

    /// Removes what the failed start made. Runs with the directory's lock taken again: if
    /// another server took it meanwhile, the directory is that server's and stays as it is.
    pub(crate) fn undo(self) {
        if self.initialising || !self.had_lock {
            let Ok(guard) = DataDir::open(&self.root) else {
                return;
            };
            if self.initialising {
                self.remove_contents();
            }
            if !self.had_lock {
                // Unlinked while still held: a server that opened it fails to lock it.
                let _ = fs::remove_file(self.root.join("lock"));
            }
            drop(guard);
        }
        for dir in &self.missing {
            if fs::remove_dir(dir).is_err() {
                break;
            }
        }
    }

    fn remove_contents(&self) {
        if let Ok(entries) = fs::read_dir(&self.root) {
            for e in entries.flatten() {
                let p = e.path();
                if e.file_name() == "lock" {
                    continue;
                }
                let _ = if p.is_dir() && !p.is_symlink() {
                    fs::remove_dir_all(&p)
                } else {
                    fs::remove_file(&p)
                };
            }
        }
        for p in self.created.iter().rev() {
            let _ = if p.is_dir() {
                fs::remove_dir(p)
            } else {
                fs::remove_file(p)
            };
        }
        for (p, bytes) in &self.formatted {
            let restored = File::options()
                .write(true)
                .open(p)
                .and_then(|f| f.write_all_at(bytes, 0).and_then(|()| f.sync_all()));
            if let Err(e) = restored {
                tracing::warn!(device = %p.display(), error = %e, "could not unformat log device");
            }
        }
    }

    /// `create_dir_all`, noting every level it makes.
    fn create_dir_all(&mut self, dir: &Path) -> Result<(), NodeError> {
        let mut missing: Vec<PathBuf> = dir
            .ancestors()
            .take_while(|p| !p.as_os_str().is_empty() && !p.exists())
            .map(Path::to_path_buf)
            .collect();
        fs::create_dir_all(dir).map_err(|e| io_at(dir, e))?;
        missing.reverse();
        self.created.extend(missing);
        Ok(())
    }

    /// Keeps the first bytes of an existing device, to restore if the start fails.
    fn keep_start_of(&mut self, path: &Path) -> Result<(), NodeError> {
        let f = File::open(path).map_err(|e| io_at(path, e))?;
        // Read to the end or FORMAT_BYTES (a block device's metadata shows no length).
        let mut bytes = vec![0u8; FORMAT_BYTES as usize];
        let mut got = 0;
        while got < bytes.len() {
            match f.read_at(&mut bytes[got..], got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(io_at(path, e)),
            }
        }
        bytes.truncate(got);
        self.formatted.push((path.to_path_buf(), bytes));
        Ok(())
    }
}

/// Creates and formats the log of a new data directory and writes its `mariner.json`, noting
/// in `first` everything made (and every existing device formatted).
pub(crate) fn initialise(
    dir: &DataDir,
    cfg: &Config,
    first: &mut FirstStart,
) -> Result<NodeState, NodeError> {
    first.initialising = true;
    let devices: Vec<PathBuf> = if cfg.log.devices.is_empty() {
        vec![dir.path("log/log0")]
    } else {
        cfg.log.devices.clone()
    };
    for d in &devices {
        if d.exists() {
            first.keep_start_of(d)?;
        } else {
            create_log_file(d, cfg.log.file_size.as_u64(), first)?;
        }
    }
    let log_id = uuid::Uuid::new_v4().as_u128();
    let disks = devices
        .iter()
        .map(|p| open_disk(p, cfg.log.direct_io, cfg.test.volatile))
        .collect::<Result<Vec<_>, _>>()?;
    format(&disks, cfg, log_id)?;
    let state = NodeState {
        format_version: FORMAT_VERSION,
        log_id: format!("{log_id:032x}"),
        log_devices: devices
            .iter()
            .map(|d| logdevices::recorded(dir.root(), d))
            .collect::<Result<_, _>>()?,
        next_volume_id: 1,
        created_ns: now_ns(),
    };
    dir.save_state(&state)?;
    tracing::info!(data = %dir.root().display(), "initialised a new data directory");
    Ok(state)
}

fn format(disks: &[Arc<dyn Disk>], cfg: &Config, log_id: u128) -> Result<(), NodeError> {
    let mut log_cfg = log_config(cfg);
    if cfg.log.segment_size.is_none() {
        let mut smallest = u64::MAX;
        for d in disks {
            smallest = smallest.min(d.len().map_err(|e| NodeError::Io(e.to_string()))?);
        }
        log_cfg.segment_bytes = crate::config::default_segment_bytes(smallest);
    }
    Log::format(disks, &log_cfg, log_id)?;
    for d in disks {
        d.sync().map_err(|e| NodeError::Io(e.to_string()))?;
    }
    Ok(())
}

/// Creates a log file of `size` zeroed bytes, after checking that its file system has room.
fn create_log_file(path: &Path, size: u64, first: &mut FirstStart) -> Result<(), NodeError> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        first.create_dir_all(parent)?;
    }
    create_zeroed(path, size, |p| first.created.push(p.to_path_buf()))
}

/// Creates the log file `path` of `size` bytes (it must not exist), calling `created` once it
/// exists, and writes it with zeros.
pub(crate) fn create_zeroed(
    path: &Path,
    size: u64,
    created: impl FnOnce(&Path),
) -> Result<(), NodeError> {
    let free = free_bytes(path);
    if free.is_some_and(|free| free < size) {
        return Err(no_space(path, size, free));
    }
    let f = File::options()
        .create_new(true)
        .write(true)
        .open(path)
        .map_err(|e| io_at(path, e))?;
    created(path);
    // Write zeros rather than fallocate: on ext4 a write into a fallocated (unwritten) extent
    // makes the next fdatasync commit the journal, which made 4 KiB log writes ~1.8x slower
    // here (docs/benchmarks.md). Zeroing once gives steady-state speed from the first write.
    let chunk = vec![0u8; 4 << 20];
    let mut done = 0u64;
    while done < size {
        let n = (size - done).min(chunk.len() as u64) as usize;
        match f.write_all_at(&chunk[..n], done) {
            Ok(()) => done += n as u64,
            // Another writer took the space, or metadata needed more than the count showed:
            // what was free is what is free now plus what this file took.
            Err(e) if e.kind() == ErrorKind::StorageFull => {
                return Err(no_space(path, size, free_bytes(path).map(|f| f + done)));
            }
            Err(e) => return Err(io_at(path, e)),
        }
    }
    f.sync_all().map_err(|e| io_at(path, e))
}

/// Bytes an unprivileged writer may still use on the file system that holds `path` (or would,
/// once created).
fn free_bytes(path: &Path) -> Option<u64> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let vfs = rustix::fs::statvfs(dir).ok()?;
    Some(vfs.f_bavail.saturating_mul(vfs.f_frsize))
}

fn no_space(path: &Path, size: u64, free: Option<u64>) -> NodeError {
    let free = match free {
        Some(f) => format!("has {} free", human_bytes(f)),
        None => "ran out of space".into(),
    };
    NodeError::Io(format!(
        "cannot create log file {}: it needs {} and the file system holding it {free}; \
         give a smaller --log-size (log.file_size) or make room",
        path.display(),
        human_bytes(size),
    ))
}

fn io_at(p: &Path, e: std::io::Error) -> NodeError {
    NodeError::Io(format!("{}: {e}", p.display()))
}
