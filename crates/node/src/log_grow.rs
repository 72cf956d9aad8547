//! `mariner log grow`: more log room for a stopped server's data directory, so history keeps
//! a longer window (issue 17), without losing any of it. The log grows by devices of its own
//! size, files `log/log<N>` in the data directory (crates/log/src/grow.rs says why devices,
//! not segments, and how a grow cut short is finished by running it again).
//!
//! Order: the new files are created and zeroed, the log takes them (`Log::add_devices`:
//! formats them, then rewrites the existing devices' superblocks), and only then does
//! `mariner.json` list them. Run again after a crash, the same command finds the same files
//! and finishes.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use mariner_disk::Disk;
use mariner_log::{read_superblock, Log};

use crate::datadir::DataDir;
use crate::initialise::create_zeroed;
use crate::node::open_disk;
use crate::{human_bytes, logdevices, NodeError};

/// What a grow did.
#[derive(Debug, Clone)]
pub struct LogGrown {
    /// Bytes of log devices before and now, over all of them.
    pub bytes_before: u64,
    pub bytes_after: u64,
    pub devices_before: usize,
    /// The files added (empty: the log held `size` already).
    pub added: Vec<PathBuf>,
}

impl std::fmt::Display for LogGrown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.added.is_empty() {
            return write!(
                f,
                "the log holds {} already ({}); nothing to do",
                human_bytes(self.bytes_before),
                devices(self.devices_before)
            );
        }
        let names: Vec<String> = self.added.iter().map(|p| p.display().to_string()).collect();
        write!(
            f,
            "log grown from {} ({}) to {} ({}): added {}",
            human_bytes(self.bytes_before),
            devices(self.devices_before),
            human_bytes(self.bytes_after),
            devices(self.devices_before + self.added.len()),
            names.join(", ")
        )
    }
}

fn devices(n: usize) -> String {
    if n == 1 {
        "1 device".into()
    } else {
        format!("{n} devices")
    }
}

/// Grows the log of the data directory `root` (no server may run on it) to hold at least
/// `size` bytes in all, adding devices the size of its first.
pub fn grow_log(root: &Path, size: u64) -> Result<LogGrown, NodeError> {
    if !root.join("mariner.json").is_file() {
        return Err(NodeError::Config(format!(
            "{} is not a Mariner data directory (no mariner.json)",
            root.display()
        )));
    }
    let dir = DataDir::open(root)?;
    let mut state = dir
        .load_state()?
        .ok_or_else(|| NodeError::Config(format!("{}: no mariner.json", root.display())))?;
    let log_id = state.log_id()?;
    let paths = logdevices::resolve(root, &state)?;
    let devices = paths
        .iter()
        .map(|p| open_disk(p, false, false))
        .collect::<Result<Vec<_>, _>>()?;
    // The unit is the first device as the user sized it (`--log-size`), not its segments.
    let sb = read_superblock(devices[0].as_ref(), 0)?;
    let per_device = devices[0]
        .len()
        .map_err(|e| NodeError::Io(format!("{}: {e}", paths[0].display())))?
        .max(sb.data_offset + sb.segment_count * sb.segment_bytes);
    let n = devices.len();
    let wanted = size.div_ceil(per_device.max(1)) as usize;
    let mut grown = LogGrown {
        bytes_before: per_device * n as u64,
        bytes_after: per_device * n as u64,
        devices_before: n,
        added: Vec::new(),
    };
    if wanted <= n {
        return Ok(grown);
    }
    if wanted > 64 {
        return Err(NodeError::Config(format!(
            "{} needs {wanted} log devices of {}; a log has at most 64: grow by less, or \
             make a new data directory with larger log files (--log-size)",
            human_bytes(size),
            human_bytes(per_device)
        )));
    }
    std::fs::create_dir_all(dir.path("log"))
        .map_err(|e| NodeError::Io(format!("{}: {e}", dir.path("log").display())))?;
    let mut added: Vec<Arc<dyn Disk>> = Vec::new();
    for i in n..wanted {
        let path = dir.path(&format!("log/log{i}"));
        if !path.exists() {
            let mut made = false;
            let r = create_zeroed(&path, per_device, |_| made = true);
            if let Err(e) = r {
                if made {
                    let _ = std::fs::remove_file(&path);
                }
                return Err(e);
            }
        }
        added.push(open_disk(&path, false, false)?);
        grown.added.push(path);
    }
    Log::add_devices(&devices, &added, log_id)?;
    for p in &grown.added {
        state.log_devices.push(logdevices::recorded(root, p)?);
    }
    dir.save_state(&state)?;
    grown.bytes_after = per_device * wanted as u64;
    tracing::info!(
        before = grown.bytes_before,
        after = grown.bytes_after,
        "log grown"
    );
    Ok(grown)
}
