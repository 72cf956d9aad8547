//! Replays the committed fuzz seed corpora (`fuzz/corpus/<target>/`) through the same entry
//! points the fuzz targets call, so every seed (and every crash reproducer added there) runs
//! as an ordinary test without a fuzzing toolchain.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use mariner_nbd::fuzzing::{fuzz_option, fuzz_request};

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

#[test]
fn replay_nbd_option_corpus() {
    for (path, data) in corpus("nbd_option") {
        eprintln!("replaying {}", path.display());
        fuzz_option(&data);
    }
}

#[test]
fn replay_nbd_request_corpus() {
    for (path, data) in corpus("nbd_request") {
        eprintln!("replaying {}", path.display());
        fuzz_request(&data);
    }
}
