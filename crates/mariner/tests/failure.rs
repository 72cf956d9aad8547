//! The failure path: when a log device starts failing, the volume turns read-only, visibly, the
//! sync is not retried, acknowledged data stays readable, and a restart recovers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::process::Command;

fn qemu_io(url: &str, cmd: &str) -> std::process::Output {
    Command::new("qemu-io")
        .args(["-f", "raw", "-c", cmd, url])
        .output()
        .unwrap()
}

fn qemu_io_ro(url: &str, cmd: &str) -> std::process::Output {
    Command::new("qemu-io")
        .args(["-r", "-f", "raw", "-c", cmd, url])
        .output()
        .unwrap()
}

#[test]
fn a_failing_log_device_turns_volumes_read_only_until_restart() {
    require("qemu-io");
    let dir = scratch("failure");
    let data = dir.path().join("data");
    let small = ["--default-volume-size", "64MiB", "--log-size", "64MiB"];
    let mut args = small.to_vec();
    args.extend(["--test-fail-log-after", "30"]);
    let mut s = Server::start(&data, &args);
    let url = s.url("vol0");
    // Writes succeed until the device fails; the first failure is reported as an I/O error.
    let mut acked = Vec::new();
    let mut failed = false;
    for i in 0..100u64 {
        let out = qemu_io(&url, &format!("write -P {} {} 4k", i % 250 + 1, i * 4096));
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        if text.contains("wrote 4096/4096") {
            acked.push(i);
        } else {
            failed = true;
            break;
        }
    }
    assert!(failed, "the injected failure must surface");
    assert!(!acked.is_empty(), "some writes succeed before the failure");
    // Visibly read-only: CLI, metrics, and later writes are refused.
    let list = String::from_utf8_lossy(&s.cli(&["volume", "list"]).stdout).to_string();
    assert!(list.contains("read-only: log failed"), "{list}");
    let metrics = run(Command::new("curl")
        .args(["-s", "--unix-socket"])
        .arg(data.join("admin.sock"))
        .arg("http://x/metrics"));
    assert!(metrics.contains("mariner_log_failed 1"), "{metrics}");
    let out = qemu_io(&url, "write -P 9 0 4k");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("wrote 4096/4096"),
        "write after failure accepted"
    );
    // A new client sees a read-only export; acknowledged data is still readable.
    let info = run(Command::new("nbdinfo").arg(&url));
    assert!(info.contains("is_read_only: true"), "{info}");
    for &i in &acked {
        let out = qemu_io_ro(&url, &format!("read -P {} {} 4k", i % 250 + 1, i * 4096));
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("read 4096/4096"),
            "block {i}: {out:?}"
        );
    }
    s.kill();
    // A restart without the fault recovers every acknowledged write and accepts writes again.
    let mut s = Server::start(&data, &small);
    let url = s.url("vol0");
    for &i in &acked {
        let out = qemu_io(&url, &format!("read -P {} {} 4k", i % 250 + 1, i * 4096));
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("read 4096/4096"),
            "block {i} after restart: {out:?}"
        );
    }
    let out = qemu_io(&url, "write -P 7 0 4k");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("wrote 4096/4096"),
        "{out:?}"
    );
    assert!(s.stop().success());
}
