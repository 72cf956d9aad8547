//! Fuzz seed corpora for the crates' `tests/corpus_replay.rs` (included with `#[path]`): every
//! committed seed (and every crash reproducer added there) runs as an ordinary test through
//! the entry point its fuzz target calls, without a fuzzing toolchain.

use std::path::{Path, PathBuf};

/// The files of `fuzz/corpus/<target>/`, sorted by path; panics if there are none.
fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target);
    let mut files: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.is_file())
        .map(|path| {
            let data = std::fs::read(&path).unwrap();
            (path, data)
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "corpus {} is empty", dir.display());
    files
}

/// Runs `entry` on every seed of `fuzz/corpus/<target>/`.
pub fn replay(target: &str, entry: impl Fn(&[u8])) {
    for (path, data) in corpus(target) {
        eprintln!("replaying {}", path.display());
        entry(&data);
    }
}
