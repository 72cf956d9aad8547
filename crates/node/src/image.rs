//! Volume image files: made at their full, sparse size — or refused, naming the file system's
//! limit, when the file system cannot hold a file that large (ext4 with 4 KiB blocks: 16 TiB).

use std::fs::{self, File};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use crate::{human_bytes, NodeError};

/// Creates `<vdir>/image` of `size` bytes, synced, creating `vdir`. Leaves nothing behind on
/// failure (`vdir` is removed if this made it).
pub(crate) fn create(vdir: &Path, size: u64, block: u64) -> Result<PathBuf, NodeError> {
    let made_dir = !vdir.exists();
    let path = vdir.join("image");
    let result = fs::create_dir_all(vdir)
        .map_err(|e| io_at(vdir, e))
        .and_then(|()| File::create(&path).map_err(|e| io_at(&path, e)))
        .and_then(|f| sized(&f, &path, vdir, size, block));
    if result.is_err() {
        let _ = fs::remove_file(&path);
        if made_dir {
            let _ = fs::remove_dir_all(vdir);
        }
    }
    result.map(|()| path)
}

fn sized(f: &File, path: &Path, dir: &Path, size: u64, block: u64) -> Result<(), NodeError> {
    match f.set_len(size) {
        Err(e) if e.kind() == ErrorKind::FileTooLarge => Err(too_large(dir, size, block)),
        other => other
            .and_then(|()| f.sync_all())
            .map_err(|e| io_at(path, e)),
    }
}

/// The refusal of a `size` the file system holding `dir` cannot hold (`set_len` failed with
/// `EFBIG`), with its limit.
pub(crate) fn too_large(dir: &Path, size: u64, block: u64) -> NodeError {
    let limit = match largest_file(dir, size, block) {
        Some(max) => format!("at most {max} bytes ({})", human_bytes(max)),
        None => "its limit could not be determined".into(),
    };
    NodeError::BadRequest(format!(
        "volume size {size} bytes ({}) is larger than the file system holding {} can hold in \
         one file: {limit}",
        human_bytes(size),
        dir.display()
    ))
}

/// The largest multiple of `block` below `too_big` that a file in `dir` can be sized to: a
/// binary search with a sparse scratch file (no data is written), removed again.
fn largest_file(dir: &Path, too_big: u64, block: u64) -> Option<u64> {
    let probe = dir.join(".size-probe");
    let f = File::create(&probe).ok()?;
    let (mut good, mut bad) = (0u64, too_big / block.max(1));
    while bad - good > 1 {
        let mid = good + (bad - good) / 2;
        match f.set_len(mid * block) {
            Ok(()) => good = mid,
            Err(e) if e.kind() == ErrorKind::FileTooLarge => bad = mid,
            Err(_) => break,
        }
    }
    drop(f);
    let _ = fs::remove_file(&probe);
    (bad - good <= 1).then_some(good * block)
}

fn io_at(p: &Path, e: std::io::Error) -> NodeError {
    NodeError::Io(format!("{}: {e}", p.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_is_made_sparse_at_its_size() {
        let d = tempfile::tempdir().unwrap();
        let vdir = d.path().join("volumes/a");
        let p = create(&vdir, 1 << 30, 512).unwrap();
        assert_eq!(fs::metadata(&p).unwrap().len(), 1 << 30);
    }
}
