//! Where a data directory's log devices are: the paths `mariner.json` records, and how they
//! are found again from whatever the working directory is.
//!
//! Format 2 records a device inside the data directory relative to the data directory
//! (`log/log0`) and any other device absolute, as the user named it against the working
//! directory of the first start (symbolic links are kept: `/dev/disk/by-id/...` stays that
//! name). Format 1 recorded the paths as given, relative to the working directory at creation
//! (`mdata/log/log0` for `--data mdata`) or absolute; such a path is looked for inside the
//! data directory first, then where it points, and a candidate is taken only if its superblock
//! names this log and this device position.

use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use mariner_disk::{FileDisk, OpenOptions};

use crate::datadir::NodeState;
use crate::NodeError;

/// `p` made absolute against the current directory, lexically.
pub fn absolute(p: &Path) -> Result<PathBuf, NodeError> {
    std::path::absolute(p).map_err(|e| NodeError::Io(format!("{}: {e}", p.display())))
}

/// How `mariner.json` records `device` (a path that opens from the current directory) of the
/// data directory `root`: relative to `root` if it lies inside it, else absolute.
pub fn recorded(root: &Path, device: &Path) -> Result<PathBuf, NodeError> {
    let dev = absolute(device)?;
    let root = absolute(root)?;
    Ok(match dev.strip_prefix(&root) {
        Ok(rel) if is_plain(rel) => rel.to_path_buf(),
        _ => dev,
    })
}

/// A non-empty relative path of plain names only (no `..`, no root), so it stays inside.
fn is_plain(rel: &Path) -> bool {
    rel.components().next().is_some() && rel.components().all(|c| matches!(c, Component::Normal(_)))
}

/// The paths to open for the devices `state` records, for the data directory `root` as named
/// from the current directory.
pub fn resolve(root: &Path, state: &NodeState) -> Result<Vec<PathBuf>, NodeError> {
    let log_id = state.log_id()?;
    let mut out = Vec::with_capacity(state.log_devices.len());
    for (index, p) in state.log_devices.iter().enumerate() {
        out.push(if state.format_version < 2 {
            resolve_format_1(root, p, log_id, index)
        } else if p.is_absolute() {
            p.clone()
        } else {
            root.join(p)
        });
    }
    Ok(out)
}

/// Format 1's `p`: the first candidate that is device `index` of log `log_id` — `p` less
/// leading components inside `root` (longest first: `mdata/log/log0` is `log/log0` there),
/// then `p` itself (against the current directory if relative), what format 1 meant. The data
/// directory comes first so that a copy of it opens its own log, not the original's. If no
/// candidate is, `p` as format 1 meant it, so the error names what was recorded.
fn resolve_format_1(root: &Path, p: &Path, log_id: u128, index: usize) -> PathBuf {
    let parts: Vec<Component<'_>> = p.components().collect();
    let inside = (0..parts.len())
        .map(|skip| parts[skip..].iter().collect::<PathBuf>())
        .filter(|tail| is_plain(tail))
        .map(|tail| root.join(tail));
    inside
        .chain(std::iter::once(p.to_path_buf()))
        .find(|c| is_device_of(c, log_id, index))
        .unwrap_or_else(|| p.to_path_buf())
}

/// Whether `path` holds the superblock of device `index` of log `log_id`.
fn is_device_of(path: &Path, log_id: u128, index: usize) -> bool {
    let Ok(disk) = FileDisk::open(path, &OpenOptions::new().read_only(true)) else {
        return false;
    };
    mariner_log::read_superblock(&disk, index)
        .is_ok_and(|sb| sb.log_id == log_id && usize::from(sb.device_index) == index)
}

/// Whether two paths (each opening from the current directory) name the same device: the same
/// absolute path, or the same file.
pub fn same_device(a: &Path, b: &Path) -> bool {
    if let (Ok(x), Ok(y)) = (absolute(a), absolute(b)) {
        if x == y {
            return true;
        }
    }
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => (x.dev(), x.ino()) == (y.dev(), y.ino()),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_inside_the_data_directory_are_recorded_relative_to_it() {
        let cwd = std::env::current_dir().unwrap();
        let rec = |root: &str, dev: &str| recorded(Path::new(root), Path::new(dev)).unwrap();
        assert_eq!(rec("mdata", "mdata/log/log0"), Path::new("log/log0"));
        assert_eq!(rec("./mdata", "mdata/./own"), Path::new("own"));
        assert_eq!(rec("/srv/m", "/srv/m/log/log0"), Path::new("log/log0"));
        assert_eq!(
            rec("/srv/m", "/dev/disk/by-id/x"),
            Path::new("/dev/disk/by-id/x")
        );
        assert_eq!(rec("mdata", "ext/log-a"), cwd.join("ext/log-a"));
        // Out through `..` is not inside.
        assert_eq!(
            rec("/srv/m", "/srv/m/../other/log"),
            Path::new("/srv/m/../other/log")
        );
        assert_eq!(rec("/srv/m", "/srv/m"), Path::new("/srv/m"));
    }
}
