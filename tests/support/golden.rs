//! Golden-file plumbing shared by the crates' `tests/golden.rs` (included with `#[path]`, so
//! `CARGO_MANIFEST_DIR` and `CARGO_PKG_NAME` are the including crate's).

use std::path::PathBuf;

/// Set to `1` to (re)write the golden files instead of only comparing with them.
pub const REGENERATE: &str = "MARINER_REGENERATE_GOLDEN";

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("golden")
}

fn regenerating() -> bool {
    std::env::var_os(REGENERATE).is_some_and(|v| v == "1")
}

/// Compares `encoded` with the committed file `name` and returns the committed bytes. With
/// `MARINER_REGENERATE_GOLDEN=1` it first (re)writes the file, atomically, so that tests running
/// in parallel never read a half-written file.
pub fn golden(name: &str, encoded: &[u8]) -> Vec<u8> {
    let dir = golden_dir();
    let path = dir.join(name);
    if regenerating() {
        std::fs::create_dir_all(&dir).unwrap();
        let thread = std::thread::current().id();
        let tmp = dir.join(format!(".{name}.{}.{thread:?}.tmp", std::process::id()));
        std::fs::write(&tmp, encoded).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    }
    let committed = std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; generate it with {REGENERATE}=1 cargo test -p {} --test golden",
            path.display(),
            env!("CARGO_PKG_NAME")
        )
    });
    if let Some(at) = first_difference(&committed, encoded) {
        panic!(
            "{name}: the encoding differs from the committed golden file at byte {at} \
             (committed {} bytes, encoded {} bytes). If the format change is intended, bump the \
             format version, update docs/FORMATS.md and regenerate with {REGENERATE}=1.",
            committed.len(),
            encoded.len()
        );
    }
    committed
}

/// The first offset at which `a` and `b` differ (a length difference counts).
fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .or((a.len() != b.len()).then(|| a.len().min(b.len())))
}

/// Every single-byte damage of `bytes`: each byte XORed with 0x01, 0x80 and 0xff in turn.
/// `check` gets the damaged copy, the byte's index and the mask, and asserts it is caught.
#[allow(dead_code)] // not every including crate damages bytes
pub fn each_damaged_byte(bytes: &[u8], mut check: impl FnMut(&[u8], usize, u8)) {
    for i in 0..bytes.len() {
        for mask in [0x01u8, 0x80, 0xff] {
            let mut c = bytes.to_vec();
            c[i] ^= mask;
            check(&c, i, mask);
        }
    }
}
