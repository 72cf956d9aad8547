//! Replays the committed fuzz seed corpora (`fuzz/corpus/iscsi_pdu/`, `iscsi_login_text/`)
//! through the entry points the fuzz targets call, so every seed (and every crash reproducer
//! added there) runs as an ordinary test without a fuzzing toolchain.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use mariner_iscsi::fuzzing::{fuzz_login_text, fuzz_pdu};

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
fn replay_iscsi_pdu_corpus() {
    for (path, data) in corpus("iscsi_pdu") {
        eprintln!("replaying {}", path.display());
        fuzz_pdu(&data);
    }
}

#[test]
fn replay_iscsi_login_text_corpus() {
    for (path, data) in corpus("iscsi_login_text") {
        eprintln!("replaying {}", path.display());
        fuzz_login_text(&data);
    }
}
