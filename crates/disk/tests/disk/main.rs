//! Integration tests of mariner-disk: the trait contract against every implementation, then
//! what each implementation adds. Files live under the target directory, whose file system
//! supports `O_DIRECT`, sparse files and hole punching (`/tmp` may be tmpfs).

mod contract;
mod faulty;
mod file;
mod model;
mod volatile;

use std::io;
use std::path::PathBuf;

use mariner_disk::Disk;
use tempfile::TempDir;

/// A fresh directory on the target directory's file system.
fn tempdir() -> io::Result<TempDir> {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR"))
}

/// A path for a disk file inside `dir`.
fn disk_path(dir: &TempDir) -> PathBuf {
    dir.path().join("disk.img")
}

/// The whole disk as a vector.
fn read_all<D: Disk + ?Sized>(disk: &D) -> io::Result<Vec<u8>> {
    let len = usize::try_from(disk.len()?).map_err(io::Error::other)?;
    let mut buf = vec![0; len];
    disk.read_at(&mut buf, 0)?;
    Ok(buf)
}

/// A recognisable, position-dependent pattern.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i % 251).to_le_bytes()[0] ^ seed)
        .collect()
}

/// `assert_eq!` for disk images, without printing kilobytes of bytes.
#[track_caller]
fn assert_same(actual: &[u8], expected: &[u8], context: &str) {
    if actual == expected {
        return;
    }
    let first = actual.iter().zip(expected).position(|(a, b)| a != b);
    panic!(
        "{context}: images differ (lengths {} and {}, first difference at {first:?})",
        actual.len(),
        expected.len()
    );
}
