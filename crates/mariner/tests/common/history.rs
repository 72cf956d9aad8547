//! History as the end-to-end tests with real clients drive it (history_clients.rs,
//! history_writes.rs): bookmarks, snapshot exports, copies in and out with qemu-img, byte
//! comparisons, and rollbacks followed through the admin API.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::cli::json;
use super::{run, Server};

/// The volume's newest instant (its newest write's number), from `volume info`.
pub fn newest_seq(s: &Server, volume: &str) -> u64 {
    let v = json(s, &["volume", "info", volume]);
    v["history"]["newest_seq"]
        .as_u64()
        .unwrap_or_else(|| panic!("no history in volume info: {v}"))
}

/// `mariner history mark VOL NAME`: the bookmarked instant's write number.
pub fn mark(s: &Server, volume: &str, name: &str) -> u64 {
    let v = json(s, &["history", "mark", volume, name]);
    v["volume_seq"]
        .as_u64()
        .unwrap_or_else(|| panic!("mark {name}: {v}"))
}

/// `mariner snapshot export VOL --at AT --name NAME`: its description (`nbd`, `iscsi` URLs,
/// `volume_seq`).
pub fn export(s: &Server, volume: &str, at: &str, name: &str) -> Value {
    let v = json(
        s,
        &["snapshot", "export", volume, "--at", at, "--name", name],
    );
    assert_eq!(v["export"], format!("{volume}@{name}"), "{v}");
    v
}

/// The first URL of `kind` ("nbd" or "iscsi") an export description gives.
pub fn url_of(export: &Value, kind: &str) -> String {
    export[kind][0]
        .as_str()
        .unwrap_or_else(|| panic!("no {kind} URL in {export}"))
        .to_string()
}

/// `qemu-img convert -O raw <url> <file>`: an export (nbd:// or iscsi://) copied out to a file.
/// It only reads, so it opens read-only exports.
pub fn copy_out(url: &str, file: &Path) {
    let _ = std::fs::remove_file(file);
    run(Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "raw", url])
        .arg(file));
}

/// `qemu-img convert -n -O raw <file> <url>`: a raw image copied onto an existing export.
pub fn copy_in(file: &Path, url: &str) {
    run(Command::new("qemu-img")
        .args(["convert", "-n", "-f", "raw", "-O", "raw"])
        .arg(file)
        .arg(url));
}

/// Asserts that `got` holds exactly the bytes of `want` (then, if `got` is longer, only
/// zeros), saying where they first differ.
pub fn assert_same_bytes(want: &Path, got: &Path, what: &str) {
    let a = std::fs::read(want).unwrap();
    let b = std::fs::read(got).unwrap();
    assert!(
        b.len() >= a.len(),
        "{what}: {} bytes, want {}",
        b.len(),
        a.len()
    );
    if let Some(i) = a.iter().zip(&b).position(|(x, y)| x != y) {
        panic!(
            "{what}: differs from {} at byte {i} (block {}): {:#04x} != {:#04x}",
            want.display(),
            i / 4096,
            b[i],
            a[i]
        );
    }
    if let Some(i) = b[a.len()..].iter().position(|&x| x != 0) {
        panic!("{what}: byte {} past the image is not zero", a.len() + i);
    }
}

/// `POST /v1/volumes/VOL/rollback {to, force}` without waiting: the rollback as it began
/// (HTTP 202), or the refusal's text.
pub fn start_rollback(s: &Server, volume: &str, to: &str, force: bool) -> Result<Value, String> {
    let body = serde_json::json!({ "to": to, "force": force }).to_string();
    let out = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "30",
            "-w",
            "\n%{http_code}",
            "--unix-socket",
        ])
        .arg(s.data.join("admin.sock"))
        .args([
            "-X",
            "POST",
            "-H",
            "content-type: application/json",
            "-d",
            &body,
        ])
        .arg(format!("http://mariner/v1/volumes/{volume}/rollback"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or((&text, ""));
    if code.starts_with('2') {
        Ok(serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}")))
    } else {
        Err(format!("HTTP {code}: {body}"))
    }
}

/// `GET /v1/volumes/VOL/rollback`: the running or last rollback.
pub fn rollback_status(s: &Server, volume: &str) -> Value {
    let text = s.admin_get(&format!("/v1/volumes/{volume}/rollback"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// Polls the rollback until it finishes (within `limit`); panics if it reports an error.
pub fn wait_rollback(s: &Server, volume: &str, limit: Duration) -> Value {
    let t = Instant::now();
    loop {
        let v = rollback_status(s, volume);
        assert!(v["error"].is_null(), "rollback failed: {v}");
        if v["finished"] == true {
            return v;
        }
        assert!(
            t.elapsed() < limit,
            "rollback unfinished after {limit:?}: {v}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `mariner rollback VOL --to TIME [--force] --json`, which follows it to the end: its last
/// progress line (`from.volume_seq` is the instant that undoes it).
pub fn rollback(s: &Server, volume: &str, to: &str, force: bool) -> Value {
    let mut args = vec!["rollback", volume, "--to", to, "--json"];
    if force {
        args.push("--force");
    }
    let out = super::cli::ok(s, &args);
    let last = out.lines().last().unwrap_or_default();
    let v: Value = serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(v["finished"], true, "{out}");
    v
}
