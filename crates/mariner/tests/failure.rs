//! The failure path: when a log device starts failing, the volume turns read-only, visibly, the
//! sync is not retried, acknowledged data stays readable, and a restart recovers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::process::{Command, Output};

fn qemu_io(url: &str, cmd: &str) -> Output {
    qemu_io_output(&[], url, &[cmd])
}

fn qemu_io_ro(url: &str, cmd: &str) -> Output {
    qemu_io_output(&["-r"], url, &[cmd])
}

/// Asserts qemu-io exited 0, reported no failed command (a pattern mismatch), and printed
/// `done` (e.g. "read 4096/4096").
fn assert_done(out: &Output, done: &str, what: &str) {
    let text = output_text(out);
    assert!(
        qemu_io_succeeded(out) && text.contains(done),
        "{what}: {}\n{text}",
        out.status
    );
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
        if qemu_io_succeeded(&out) && output_text(&out).contains("wrote 4096/4096") {
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
        !out.status.success() && !output_text(&out).contains("wrote 4096/4096"),
        "write after failure accepted: {}",
        output_text(&out)
    );
    // A new client sees a read-only export; acknowledged data is still readable.
    let info = run(Command::new("nbdinfo").arg(&url));
    assert!(info.contains("is_read_only: true"), "{info}");
    for &i in &acked {
        let out = qemu_io_ro(&url, &format!("read -P {} {} 4k", i % 250 + 1, i * 4096));
        assert_done(&out, "read 4096/4096", &format!("block {i}"));
    }
    s.kill();
    // A restart without the fault recovers every acknowledged write and accepts writes again.
    let mut s = Server::start(&data, &small);
    let url = s.url("vol0");
    for &i in &acked {
        let out = qemu_io(&url, &format!("read -P {} {} 4k", i % 250 + 1, i * 4096));
        assert_done(&out, "read 4096/4096", &format!("block {i} after restart"));
    }
    let out = qemu_io(&url, "write -P 7 0 4k");
    assert_done(&out, "wrote 4096/4096", "write after restart");
    let out = qemu_io(&url, "read -P 7 0 4k");
    assert_done(&out, "read 4096/4096", "read of the write after restart");
    assert!(s.stop().success());
}
