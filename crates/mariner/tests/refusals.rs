//! End-to-end tests of what a server refuses to start on: a data directory another server
//! holds, bad configuration, missing or foreign log devices, a directory Mariner did not
//! create; each with a clear message and nothing changed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::cli::*;
use common::*;
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

const MIB: u64 = 1 << 20;

/// Runs `mariner serve --data <data> <args>` expecting it to exit within 20 s; returns the
/// output. A server that keeps running fails the test. iSCSI takes a free port unless `args`
/// say otherwise: the ports are bound before the data directory is looked at, and tests in
/// parallel must not contend for 3260.
fn serve_expect_exit(data: &Path, args: &[&str]) -> Output {
    let iscsi: &[&str] = if args.contains(&"--iscsi-listen") {
        &[]
    } else {
        &["--iscsi-listen", "127.0.0.1:0"]
    };
    let mut serve = Command::new(mariner_bin());
    serve
        .arg("serve")
        .arg("--data")
        .arg(data)
        .args(iscsi)
        .args(args);
    output_within(&mut serve, Duration::from_secs(20))
}

fn assert_fails(o: &Output, msg: &str, what: &str) {
    let err = stderr(o);
    assert!(!o.status.success(), "{what}: exited 0: {err}");
    assert!(
        err.contains(msg),
        "{what}: message {err:?} should mention {msg:?}"
    );
}

#[test]
fn a_second_server_on_the_same_data_directory_is_refused() {
    require("nbdinfo");
    let (_dir, mut s) = small_server("locked");
    let o = serve_expect_exit(&s.data, &["--listen", "127.0.0.1:0"]);
    assert_fails(&o, "in use", "second server");
    s.assert_running();
    assert_eq!(export_size(&s.url("")), 64 * MIB);
    ok(&s, &["volume", "list"]);
    assert!(
        s.data.join("admin.sock").exists(),
        "the second server removed admin.sock"
    );
    assert!(s.stop().success(), "{}", s.log());
}

#[test]
fn bad_configuration_fails_with_a_clear_message() {
    let dir = scratch("badconfig");
    let cfg = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    let fresh = dir.path().join("never");
    let cases = [
        (cfg("unknown.toml", "bogus_key = 1\n"), "bogus_key"),
        (cfg("unknown2.toml", "[log]\nt_wiat_us = 5\n"), "t_wiat_us"),
        (
            cfg("badlisten.toml", "[nbd]\nlisten = [\"not-an-address\"]\n"),
            "socket address",
        ),
        (
            cfg("badtype.toml", "[log]\nt_wait_us = \"soon\"\n"),
            "t_wait_us",
        ),
        (
            cfg("badseg.toml", "[log]\nsegment_size = \"1KiB\"\n"),
            "segment_size",
        ),
        (
            cfg("badblock.toml", "[volume]\nblock_size = 1000\n"),
            "block_size",
        ),
        (cfg("syntax.toml", "[log\n"), "syntax.toml"),
    ];
    for (path, msg) in &cases {
        let o = serve_expect_exit(&fresh, &["--config", path, "--listen", "127.0.0.1:0"]);
        assert_fails(&o, msg, path);
    }
    let o = serve_expect_exit(&fresh, &["--config", "/nonexistent/mariner.toml"]);
    assert_fails(&o, "/nonexistent/mariner.toml", "missing config file");
    let o = serve_expect_exit(&fresh, &["--listen", "nonsense"]);
    assert_fails(&o, "invalid value 'nonsense'", "--listen nonsense");
    let o = serve_expect_exit(&fresh, &["--log-size", "lots"]);
    assert_fails(&o, "invalid value 'lots'", "--log-size lots");
    assert!(
        !fresh.join("mariner.json").exists(),
        "a bad configuration initialised {fresh:?}"
    );
    // An address this machine does not have (TEST-NET-1).
    let o = serve_expect_exit(
        &dir.path().join("nolisten"),
        &["--listen", "192.0.2.1:10809"],
    );
    assert_fails(&o, "192.0.2.1:10809", "unassignable listen address");
}

#[test]
fn missing_or_foreign_log_devices_are_refused() {
    require("nbdinfo");
    let dir = scratch("logdevs");
    let data = dir.path().join("data");
    let ext = dir.path().join("ext");
    std::fs::create_dir(&ext).unwrap();
    let (a, b) = (ext.join("log-a"), ext.join("log-b"));
    let devs = [
        "--log-dev",
        a.to_str().unwrap(),
        "--log-dev",
        b.to_str().unwrap(),
    ];
    let mut args: Vec<&str> = devs.to_vec();
    args.extend_from_slice(&["--log-size", "32MiB", "--default-volume-size", "16MiB"]);
    let mut s = Server::start(&data, &args);
    require("qemu-io");
    qemu_io(
        &s.url("vol0"),
        &["write -P 0x2d 0 4M", "write -P 0x2e 12M 1M"],
    );
    s.restart_after_kill9(&[]);
    qemu_io(
        &s.url("vol0"),
        &[
            "read -P 0x2d 0 4M",
            "read -P 0 4M 8M",
            "read -P 0x2e 12M 1M",
        ],
    );
    let state: Value =
        serde_json::from_slice(&std::fs::read(data.join("mariner.json")).unwrap()).unwrap();
    let listed: Vec<&str> = state["log_devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(listed, [a.to_str().unwrap(), b.to_str().unwrap()]);
    assert_eq!(std::fs::metadata(&a).unwrap().len(), 32 * MIB);
    assert!(s.stop().success(), "{}", s.log());
    let original_b = std::fs::read(&b).unwrap();

    std::fs::remove_file(&b).unwrap();
    let o = serve_expect_exit(&data, &["--listen", "127.0.0.1:0"]);
    assert_fails(&o, "missing", "missing log device");
    assert!(stderr(&o).contains(b.to_str().unwrap()), "{}", stderr(&o));
    assert!(!b.exists(), "the missing log device was recreated");

    std::fs::write(&b, vec![0u8; (32 * MIB) as usize]).unwrap();
    let o = serve_expect_exit(&data, &["--listen", "127.0.0.1:0"]);
    assert_fails(&o, "superblock", "blank log device");

    std::fs::copy(&a, &b).unwrap(); // the other device of the same log, in the wrong place
    let o = serve_expect_exit(&data, &["--listen", "127.0.0.1:0"]);
    assert_fails(&o, "device 0", "swapped log device");

    std::fs::write(&b, &original_b).unwrap();
    let o = serve_expect_exit(
        &data,
        &["--listen", "127.0.0.1:0", "--log-dev", a.to_str().unwrap()],
    );
    assert_fails(&o, "differ", "different --log-dev list");

    // With the right device back, the node serves again.
    let mut s = Server::start(&data, &[]);
    assert_eq!(export_size(&s.url("")), 16 * MIB);
    assert!(s.stop().success(), "{}", s.log());
}

#[test]
fn an_existing_foreign_directory_is_never_initialised() {
    let dir = scratch("foreign");
    let data = dir.path().join("precious");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("thesis.txt"), b"years of work").unwrap();
    std::fs::create_dir(data.join("photos")).unwrap();
    for _ in 0..2 {
        let o = serve_expect_exit(&data, &["--listen", "127.0.0.1:0"]);
        assert_fails(&o, "refusing to initialise", "foreign directory");
    }
    assert_eq!(
        std::fs::read(data.join("thesis.txt")).unwrap(),
        b"years of work"
    );
    for ours in [
        "mariner.json",
        "log",
        "volumes",
        "store.progress",
        "admin.sock",
    ] {
        assert!(
            !data.join(ours).exists(),
            "{ours} created in a foreign directory"
        );
    }
    // A file where the data directory should be.
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"not a directory").unwrap();
    let o = serve_expect_exit(&file, &["--listen", "127.0.0.1:0"]);
    assert!(
        !o.status.success(),
        "serving from a regular file: {}",
        stderr(&o)
    );
    assert_eq!(std::fs::read(&file).unwrap(), b"not a directory");
}
