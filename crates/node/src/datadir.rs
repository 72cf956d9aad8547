//! The data directory: its lock, its identity file, volume metadata, ports.json.
//!
//! ```text
//! <data>/
//!   lock              flock'ed by the running server: one server per directory
//!   mariner.json      format version, log id, next volume id (never reused)
//!   log/log0          the default log device (when none is configured)
//!   store.progress    the store's durable watermark
//!   volumes/<name>/volume.json, image
//!   admin.sock        admin API (mode 0600)
//!   ports.json        every bound address
//! ```

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::NodeError;

/// Format 2 records paths inside the data directory relative to it; format 1 (still read, and
/// rewritten as 2 once its log is found) recorded them relative to the working directory at
/// creation. See docs/FORMATS.md.
pub const FORMAT_VERSION: u32 = 2;

/// `mariner.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeState {
    pub format_version: u32,
    /// The log's identity, as a hex string (it is a u128).
    pub log_id: String,
    /// Log devices as formatted, in order: relative to the data directory, or absolute
    /// (format 1: as given, relative to the working directory at creation).
    pub log_devices: Vec<PathBuf>,
    pub next_volume_id: u32,
    pub created_ns: u64,
}

impl NodeState {
    pub fn log_id(&self) -> Result<u128, NodeError> {
        u128::from_str_radix(&self.log_id, 16)
            .map_err(|_| NodeError::Corrupt(format!("mariner.json: bad log_id {:?}", self.log_id)))
    }
}

/// `volumes/<name>/volume.json`. A field added later has a default, so older files load.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct VolumeMeta {
    pub id: u32,
    pub name: String,
    pub size_bytes: u64,
    pub block_size: u32,
    pub created_ns: u64,
    /// Set by an operator (`mariner volume set NAME --read-only true`): every write is
    /// refused until it is cleared. Absent in files written before it existed.
    #[serde(default)]
    pub read_only: bool,
}

/// An open, locked data directory.
#[derive(Debug)]
pub struct DataDir {
    root: PathBuf,
    _lock: File,
}

impl DataDir {
    /// Creates the directory if needed and takes its lock.
    pub fn open(root: &Path) -> Result<Self, NodeError> {
        if root.exists() && !root.is_dir() {
            return Err(NodeError::Config(format!(
                "{} is not a directory: the data directory must be a directory (it is created \
                 if absent)",
                root.display()
            )));
        }
        fs::create_dir_all(root).map_err(|e| io_at(root, e))?;
        let lock_path = root.join("lock");
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| io_at(&lock_path, e))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => {
                return Err(NodeError::Locked(root.to_path_buf()));
            }
            Err(fs::TryLockError::Error(e)) => return Err(io_at(&lock_path, e)),
        }
        Ok(Self {
            root: root.to_path_buf(),
            _lock: lock,
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    fn state_path(&self) -> PathBuf {
        self.path("mariner.json")
    }

    /// The identity file, or `None` for a directory that was never initialised. A directory
    /// holding anything but our own lock and socket without it is refused: it is not ours.
    pub fn load_state(&self) -> Result<Option<NodeState>, NodeError> {
        let state = read_state(&self.root)?;
        if state.is_none() {
            self.refuse_foreign()?;
        }
        Ok(state)
    }

    /// Fails if another server holds `root`'s lock, creating nothing: lets a second server
    /// say so before it tries the ports the first one holds.
    pub fn check_unlocked(root: &Path) -> Result<(), NodeError> {
        let lock_path = root.join("lock");
        let lock = match File::open(&lock_path) {
            Ok(f) => f,
            Err(_) => return Ok(()), // no lock file, or none we can open: the real open decides
        };
        match lock.try_lock() {
            Err(fs::TryLockError::WouldBlock) => Err(NodeError::Locked(root.to_path_buf())),
            _ => Ok(()),
        }
    }

    fn refuse_foreign(&self) -> Result<(), NodeError> {
        let ours = ["lock", "admin.sock", "ports.json"];
        for entry in fs::read_dir(&self.root).map_err(|e| io_at(&self.root, e))? {
            let entry = entry.map_err(|e| io_at(&self.root, e))?;
            let name = entry.file_name();
            if !ours.iter().any(|o| name == *o) {
                return Err(NodeError::Config(format!(
                    "{} is not empty and holds no mariner.json; refusing to initialise over {:?}",
                    self.root.display(),
                    name
                )));
            }
        }
        Ok(())
    }

    pub fn save_state(&self, s: &NodeState) -> Result<(), NodeError> {
        let bytes = serde_json::to_vec_pretty(s).map_err(|e| NodeError::Corrupt(e.to_string()))?;
        write_atomic(&self.state_path(), &bytes)
    }

    pub fn volume_dir(&self, name: &str) -> PathBuf {
        self.root.join("volumes").join(name)
    }

    /// Every volume's metadata.
    pub fn load_volumes(&self) -> Result<Vec<VolumeMeta>, NodeError> {
        let dir = self.root.join("volumes");
        let mut out = Vec::new();
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(io_at(&dir, e)),
        };
        for entry in entries {
            let entry = entry.map_err(|e| io_at(&dir, e))?;
            let p = entry.path().join("volume.json");
            if !p.exists() {
                continue; // a half-created or half-deleted volume
            }
            let b = fs::read(&p).map_err(|e| io_at(&p, e))?;
            let m: VolumeMeta = serde_json::from_slice(&b)
                .map_err(|e| NodeError::Corrupt(format!("{}: {e}", p.display())))?;
            out.push(m);
        }
        out.sort_by_key(|m| m.id);
        Ok(out)
    }

    pub fn save_volume(&self, m: &VolumeMeta) -> Result<(), NodeError> {
        let dir = self.volume_dir(&m.name);
        fs::create_dir_all(&dir).map_err(|e| io_at(&dir, e))?;
        let bytes = serde_json::to_vec_pretty(m).map_err(|e| NodeError::Corrupt(e.to_string()))?;
        write_atomic(&dir.join("volume.json"), &bytes)
    }

    /// Removes a volume's metadata first (so a crash halfway leaves no volume), then its files.
    pub fn delete_volume(&self, name: &str) -> Result<(), NodeError> {
        let dir = self.volume_dir(name);
        let meta = dir.join("volume.json");
        fs::remove_file(&meta).map_err(|e| io_at(&meta, e))?;
        sync_dir(&dir)?;
        fs::remove_dir_all(&dir).map_err(|e| io_at(&dir, e))
    }

    /// Writes `ports.json`.
    pub fn write_ports(&self, ports: &serde_json::Value) -> Result<(), NodeError> {
        let bytes =
            serde_json::to_vec_pretty(ports).map_err(|e| NodeError::Corrupt(e.to_string()))?;
        write_atomic(&self.path("ports.json"), &bytes)
    }
}

/// `<root>/mariner.json` (format 1 or 2), read without the lock; `None` if there is none.
pub fn read_state(root: &Path) -> Result<Option<NodeState>, NodeError> {
    let p = root.join("mariner.json");
    let b = match fs::read(&p) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_at(&p, e)),
    };
    let s: NodeState = serde_json::from_slice(&b)
        .map_err(|e| NodeError::Corrupt(format!("{}: {e}", p.display())))?;
    if !(1..=FORMAT_VERSION).contains(&s.format_version) {
        return Err(NodeError::Corrupt(format!(
            "{}: format version {} (this build reads 1 to {FORMAT_VERSION})",
            p.display(),
            s.format_version
        )));
    }
    Ok(Some(s))
}

fn io_at(p: &Path, e: std::io::Error) -> NodeError {
    NodeError::Io(format!("{}: {e}", p.display()))
}

/// A JSON file of the data directory that carries its own `format_version` (read with
/// `version_of`): `None` when absent; `Corrupt` when unreadable or of another version.
pub fn load_versioned<T: serde::de::DeserializeOwned>(
    path: &Path,
    version: u32,
    version_of: impl Fn(&T) -> u32,
) -> Result<Option<T>, NodeError> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_at(path, e)),
    };
    let f: T = serde_json::from_slice(&bytes)
        .map_err(|e| NodeError::Corrupt(format!("{}: {e}", path.display())))?;
    let found = version_of(&f);
    if found != version {
        return Err(NodeError::Corrupt(format!(
            "{}: format version {found} (this build reads {version})",
            path.display()
        )));
    }
    Ok(Some(f))
}

/// Replaces a file atomically and durably.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), NodeError> {
    let tmp = path.with_extension("tmp");
    let mut f = File::create(&tmp).map_err(|e| io_at(&tmp, e))?;
    f.write_all(bytes).map_err(|e| io_at(&tmp, e))?;
    f.sync_all().map_err(|e| io_at(&tmp, e))?;
    fs::rename(&tmp, path).map_err(|e| io_at(path, e))?;
    if let Some(dir) = path.parent() {
        sync_dir(dir)?;
    }
    Ok(())
}

/// Removes a file if it exists, durably.
pub fn remove_durably(path: &Path) -> Result<(), NodeError> {
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_at(path, e)),
    }
    match path.parent() {
        Some(dir) => sync_dir(dir),
        None => Ok(()),
    }
}

fn sync_dir(dir: &Path) -> Result<(), NodeError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_at(dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_server_is_locked_out() {
        let d = tempfile::tempdir().unwrap();
        let a = DataDir::open(d.path()).unwrap();
        assert!(matches!(DataDir::open(d.path()), Err(NodeError::Locked(_))));
        drop(a);
        DataDir::open(d.path()).unwrap();
    }

    #[test]
    fn a_file_is_not_taken_for_a_data_directory() {
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("file");
        fs::write(&file, b"x").unwrap();
        let err = DataDir::open(&file).unwrap_err().to_string();
        assert!(err.contains("is not a directory"), "{err}");
    }

    #[test]
    fn foreign_directories_are_not_initialised() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("precious.txt"), b"x").unwrap();
        let dd = DataDir::open(d.path()).unwrap();
        assert!(matches!(dd.load_state(), Err(NodeError::Config(_))));
    }

    #[test]
    fn volumes_roundtrip() {
        let d = tempfile::tempdir().unwrap();
        let dd = DataDir::open(d.path()).unwrap();
        let m = VolumeMeta {
            id: 3,
            name: "a".into(),
            size_bytes: 1 << 20,
            block_size: 512,
            created_ns: 1,
            read_only: true,
        };
        dd.save_volume(&m).unwrap();
        assert_eq!(dd.load_volumes().unwrap(), vec![m]);
        dd.delete_volume("a").unwrap();
        assert!(dd.load_volumes().unwrap().is_empty());
    }

    #[test]
    fn volume_metadata_without_the_read_only_field_loads_writable() {
        let d = tempfile::tempdir().unwrap();
        let dd = DataDir::open(d.path()).unwrap();
        let dir = dd.volume_dir("old");
        fs::create_dir_all(&dir).unwrap();
        let old = r#"{"id": 1, "name": "old", "size_bytes": 1048576, "block_size": 512,
                      "created_ns": 7}"#;
        fs::write(dir.join("volume.json"), old).unwrap();
        let loaded = dd.load_volumes().unwrap();
        assert_eq!(loaded.len(), 1);
        assert_eq!((loaded[0].id, loaded[0].read_only), (1, false));
    }
}
