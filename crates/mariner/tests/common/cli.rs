//! The `mariner` CLI as the operations tests drive it: a small server, commands that must
//! succeed or be refused, their output as text or JSON.

use std::process::{Command, Output};

use serde_json::Value;

use super::{run, scratch, Server, SMALL};

/// A server on a new data directory with a small log and default volume.
pub fn small_server(name: &str) -> (tempfile::TempDir, Server) {
    let dir = scratch(name);
    let s = Server::start(&dir.path().join("data"), SMALL);
    (dir, s)
}

/// A command's standard output as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A command's standard error as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs a CLI command that must succeed; returns stdout.
pub fn ok(s: &Server, args: &[&str]) -> String {
    let o = s.cli(args);
    assert!(
        o.status.success(),
        "mariner {args:?}: {}\n{}{}",
        o.status,
        stdout(&o),
        stderr(&o)
    );
    stdout(&o)
}

/// Runs a CLI command that must fail with exit code 1 and a message containing `msg`.
pub fn refused(s: &Server, args: &[&str], msg: &str) -> String {
    let o = s.cli(args);
    let err = stderr(&o);
    assert_eq!(
        o.status.code(),
        Some(1),
        "mariner {args:?} should fail: {}\n{err}",
        stdout(&o)
    );
    assert!(
        err.contains(msg),
        "mariner {args:?}: message {err:?} should mention {msg:?}"
    );
    err
}

/// Runs a CLI command with `--json` that must succeed; returns its parsed output.
pub fn json(s: &Server, args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.push("--json");
    serde_json::from_str(&ok(s, &a)).unwrap()
}

/// The size in bytes of the NBD export at `url`, as `nbdinfo` reports it.
pub fn export_size(url: &str) -> u64 {
    run(Command::new("nbdinfo").arg("--size").arg(url))
        .trim()
        .parse()
        .unwrap()
}

/// `nbdinfo --map --json`: (offset, length, type) extents; type bit 0 = hole, bit 1 = zero.
pub fn nbd_map(url: &str) -> Vec<(u64, u64, u64)> {
    let out = run(Command::new("nbdinfo").args(["--map", "--json"]).arg(url));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let n = |k: &str| e[k].as_u64().unwrap();
            (n("offset"), n("length"), n("type"))
        })
        .collect()
}

/// Types of the extents overlapping [offset, offset + len).
pub fn types_in(map: &[(u64, u64, u64)], offset: u64, len: u64) -> Vec<u64> {
    map.iter()
        .filter(|&&(o, l, _)| o < offset + len && offset < o + l)
        .map(|&(_, _, t)| t)
        .collect()
}
