//! End-to-end tests of operating Mariner: the volume CLI over the admin socket (including the
//! read-only flag, as NBD and iSCSI clients see it), the data directory's lock and identity
//! checks, configuration errors, the offline log tools, `/metrics`, graceful shutdown and the
//! beyond-loopback warning.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(clippy::big_endian_bytes)] // the NBD wire is big-endian

mod common;

use common::*;
use serde_json::Value;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

fn small_server(name: &str) -> (tempfile::TempDir, Server) {
    let dir = scratch(name);
    let s = Server::start(&dir.path().join("data"), SMALL);
    (dir, s)
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs a CLI command that must succeed; returns stdout.
fn ok(s: &Server, args: &[&str]) -> String {
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
fn refused(s: &Server, args: &[&str], msg: &str) -> String {
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

fn json(s: &Server, args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.push("--json");
    serde_json::from_str(&ok(s, &a)).unwrap()
}

fn names(list: &Value) -> Vec<String> {
    let mut n: Vec<String> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap().to_string())
        .collect();
    n.sort();
    n
}

fn export_size(url: &str) -> u64 {
    run(Command::new("nbdinfo").arg("--size").arg(url))
        .trim()
        .parse()
        .unwrap()
}

/// The table row of volume `name`.
fn row<'a>(table: &'a str, name: &str) -> Option<&'a str> {
    table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
}

#[test]
fn volume_create_list_info_grow_delete() {
    require("nbdinfo");
    require("qemu-io");
    let (_dir, mut s) = small_server("lifecycle");

    let table = ok(&s, &["volume", "list"]);
    let header = table.lines().next().unwrap();
    for col in ["NAME", "ID", "SIZE", "ALLOCATED", "BLOCK", "CONNS", "STATE"] {
        assert!(header.contains(col), "{table}");
    }
    let vol0 = row(&table, "vol0").unwrap_or_else(|| panic!("{table}"));
    assert!(vol0.contains("64.0 MiB") && vol0.contains("ok"), "{table}");
    let list = json(&s, &["volume", "list"]);
    assert_eq!(names(&list), ["vol0"]);
    let v0 = &list[0];
    assert_eq!(v0["size_bytes"].as_u64(), Some(64 * MIB), "{v0}");
    assert_eq!(v0["block_size"].as_u64(), Some(512), "{v0}");
    assert_eq!(v0["connections"].as_u64(), Some(0), "{v0}");
    assert_eq!(v0["allocated_bytes"].as_u64(), Some(0), "{v0}");
    assert!(v0["read_only"].is_null(), "{v0}");

    // Create: table and JSON answers.
    let table = ok(&s, &["volume", "create", "data-1", "--size", "16MiB"]);
    assert!(
        row(&table, "data-1").is_some_and(|r| r.contains("16.0 MiB")),
        "{table}"
    );
    let created = json(&s, &["volume", "create", "data_2.x", "--size", "8MiB"]);
    assert_eq!(created["name"], "data_2.x", "{created}");
    assert_eq!(created["size_bytes"].as_u64(), Some(8 * MIB), "{created}");
    assert_eq!(created["block_size"].as_u64(), Some(512), "{created}");
    let big = json(
        &s,
        &[
            "volume",
            "create",
            "big-blocks",
            "--size",
            "8MiB",
            "--block-size",
            "4096",
        ],
    );
    assert_eq!(big["block_size"].as_u64(), Some(4096), "{big}");
    for bad in ["100", "8192"] {
        refused(
            &s,
            &[
                "volume",
                "create",
                "bb",
                "--size",
                "8MiB",
                "--block-size",
                bad,
            ],
            "block size",
        );
    }
    ok(&s, &["volume", "delete", "big-blocks"]);
    assert_eq!(
        names(&json(&s, &["volume", "list"])),
        ["data-1", "data_2.x", "vol0"]
    );
    let info = json(&s, &["volume", "info", "data-1"]);
    assert_eq!(info["size_bytes"].as_u64(), Some(16 * MIB), "{info}");
    let ids = [
        v0["id"].as_u64(),
        info["id"].as_u64(),
        created["id"].as_u64(),
    ];
    assert!(
        ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2],
        "ids {ids:?}"
    );
    let table = ok(&s, &["volume", "info", "data-1"]);
    assert!(row(&table, "data-1").is_some(), "{table}");
    refused(
        &s,
        &["volume", "create", "data-1", "--size", "1MiB"],
        "already exists",
    );
    assert_eq!(export_size(&s.url("data-1")), 16 * MIB);

    // Grow: visible to a new client, and the new space is usable and persistent.
    qemu_io(&s.url("data-1"), &["write -P 0x31 0 1M"]);
    let grown = json(&s, &["volume", "grow", "data-1", "--size", "48MiB"]);
    assert_eq!(grown["size_bytes"].as_u64(), Some(48 * MIB), "{grown}");
    assert_eq!(export_size(&s.url("data-1")), 48 * MIB);
    qemu_io(&s.url("data-1"), &["write -P 0x32 47M 1M"]);
    let table = ok(&s, &["volume", "grow", "data-1", "--size", "64MiB"]);
    assert!(
        row(&table, "data-1").is_some_and(|r| r.contains("64.0 MiB")),
        "{table}"
    );
    refused(
        &s,
        &["volume", "grow", "data-1", "--size", "32MiB"],
        "at least the current",
    );
    refused(
        &s,
        &["volume", "grow", "nope", "--size", "32MiB"],
        "no volume named",
    );
    assert_eq!(
        json(&s, &["volume", "info", "data-1"])["allocated_bytes"].as_u64(),
        Some(2 * MIB)
    );

    // Delete.
    let out = ok(&s, &["volume", "delete", "data_2.x"]);
    assert!(out.contains("deleted data_2.x"), "{out}");
    assert_eq!(names(&json(&s, &["volume", "list"])), ["data-1", "vol0"]);
    refused(&s, &["volume", "info", "data_2.x"], "no volume named");
    refused(&s, &["volume", "delete", "data_2.x"], "no volume named");
    let gone = Command::new("nbdinfo")
        .arg(s.url("data_2.x"))
        .output()
        .unwrap();
    assert!(!gone.status.success(), "a deleted volume is still served");

    // All of it persists.
    s.restart_after_sigterm(&[]);
    assert_eq!(names(&json(&s, &["volume", "list"])), ["data-1", "vol0"]);
    assert_eq!(export_size(&s.url("data-1")), 64 * MIB);
    qemu_io(
        &s.url("data-1"),
        &[
            "read -P 0x31 0 1M",
            "read -P 0 1M 46M",
            "read -P 0x32 47M 1M",
        ],
    );
    s.restart_after_kill9(&[]);
    assert_eq!(names(&json(&s, &["volume", "list"])), ["data-1", "vol0"]);
    qemu_io(
        &s.url("data-1"),
        &[
            "read -P 0x31 0 1M",
            "read -P 0x32 47M 1M",
            "read -P 0 48M 16M",
        ],
    );
    assert!(
        !s.log().contains("beyond loopback"),
        "loopback-only server warned:\n{}",
        s.log()
    );
    assert!(s.stop().success(), "{}", s.log());
}

/// Sends `NBD_CMD_DISC` and closes.
fn disconnect(mut c: std::net::TcpStream) {
    let mut req = Vec::new();
    req.extend_from_slice(&0x2560_9513u32.to_be_bytes());
    req.extend_from_slice(&0u16.to_be_bytes());
    req.extend_from_slice(&2u16.to_be_bytes()); // NBD_CMD_DISC
    req.extend_from_slice(&[0u8; 8 + 8 + 4]);
    c.write_all(&req).unwrap();
    drop(c);
}

/// Retries `delete` until it succeeds (the server notices a close asynchronously).
fn delete_eventually(s: &Server, name: &str) {
    let start = Instant::now();
    loop {
        let o = s.cli(&["volume", "delete", name]);
        if o.status.success() {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "delete {name} still refused 10 s after the client left: {}",
            stderr(&o)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn delete_is_refused_while_a_client_is_connected() {
    require("qemu-io");
    require("nbdinfo");
    let (_dir, mut s) = small_server("busy");
    ok(&s, &["volume", "create", "busy", "--size", "8MiB"]);
    qemu_io(&s.url("busy"), &["write -P 0x42 0 1M"]);

    let (conn, size, _) = nbd_connect(&s.nbd, "busy");
    assert_eq!(size, 8 * MIB);
    assert_eq!(
        json(&s, &["volume", "info", "busy"])["connections"].as_u64(),
        Some(1)
    );
    let table = ok(&s, &["volume", "list"]);
    assert!(
        row(&table, "busy").unwrap().split_whitespace().nth(7) == Some("1"),
        "{table}"
    );
    let err = refused(&s, &["volume", "delete", "busy"], "busy");
    assert!(err.contains("connected"), "{err}");
    // A second connection, and the data is still there.
    let (conn2, _, _) = nbd_connect(&s.nbd, "busy");
    assert_eq!(
        json(&s, &["volume", "info", "busy"])["connections"].as_u64(),
        Some(2)
    );
    qemu_io(&s.url("busy"), &["read -P 0x42 0 1M"]);
    refused(&s, &["volume", "delete", "busy"], "connected");
    disconnect(conn);
    refused(&s, &["volume", "delete", "busy"], "connected");
    drop(conn2); // an abrupt close counts as leaving too
    delete_eventually(&s, "busy");
    assert_eq!(names(&json(&s, &["volume", "list"])), ["vol0"]);

    // The default volume through the empty export name counts as a client of vol0.
    let (conn, _, _) = nbd_connect(&s.nbd, "");
    refused(&s, &["volume", "delete", "vol0"], "connected");
    disconnect(conn);
    delete_eventually(&s, "vol0");
    assert!(names(&json(&s, &["volume", "list"])).is_empty());
    s.assert_running();
    assert!(s.stop().success(), "{}", s.log());
}

#[test]
fn a_recreated_volume_starts_empty_even_after_a_crash() {
    require("qemu-io");
    let (_dir, mut s) = small_server("recreate");
    ok(&s, &["volume", "create", "again", "--size", "8MiB"]);
    qemu_io(&s.url("again"), &["write -P 0x5a 0 4M"]);
    qemu_io(&s.url("vol0"), &["write -P 0x5b 0 1M"]);
    ok(&s, &["volume", "delete", "again"]);
    ok(&s, &["volume", "create", "again", "--size", "8MiB"]);
    qemu_io(&s.url("again"), &["read -P 0 0 8M"]);
    qemu_io(&s.url("again"), &["write -P 0x5c 4M 1M"]);
    // Recovery replays the log, which still holds the deleted volume's records.
    s.restart_after_kill9(&[]);
    qemu_io(
        &s.url("again"),
        &["read -P 0 0 4M", "read -P 0x5c 4M 1M", "read -P 0 5M 3M"],
    );
    qemu_io(&s.url("vol0"), &["read -P 0x5b 0 1M"]);
    ok(&s, &["volume", "delete", "again"]);
    s.restart_after_kill9(&[]);
    assert_eq!(names(&json(&s, &["volume", "list"])), ["vol0"]);
    qemu_io(&s.url("vol0"), &["read -P 0x5b 0 1M", "read -P 0 1M 63M"]);
    assert!(s.stop().success(), "{}", s.log());
}

#[test]
fn invalid_volume_names_and_sizes_are_rejected() {
    let (_dir, mut s) = small_server("invalid");
    let long = "x".repeat(65);
    for name in [
        "bad/name",
        ".hidden",
        "a b",
        "ünïcode",
        "semi;colon",
        "x?y",
        long.as_str(),
    ] {
        refused(
            &s,
            &["volume", "create", name, "--size", "1MiB"],
            "invalid volume name",
        );
    }
    // A name starting with a dash has to follow `--` to reach the server at all.
    let o = Command::new(mariner_bin())
        .args(["volume", "create", "--size", "1MiB", "--data"])
        .arg(&s.data)
        .args(["--", "-dash"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(stderr(&o).contains("invalid volume name"), "{}", stderr(&o));
    ok(&s, &["volume", "create", &"y".repeat(64), "--size", "1MiB"]);
    for size in ["0", "1000", "2PiB"] {
        let err = refused(&s, &["volume", "create", "sized", "--size", size], "size");
        assert!(err.contains("multiple of the block size"), "{err}");
    }
    // Unparseable sizes are refused by argument parsing (exit 2) with the offending value.
    for size in ["banana", "5MiBs", ""] {
        let o = s.cli(&["volume", "create", "sized", "--size", size]);
        assert_eq!(o.status.code(), Some(2), "{o:?}");
        assert!(stderr(&o).contains("invalid value"), "{}", stderr(&o));
    }
    let err = refused(
        &s,
        &["volume", "grow", "vol0", "--size", "67108964"],
        "multiple of 512",
    );
    assert!(err.contains("at least the current"), "{err}");
    let err = refused(
        &s,
        &["volume", "grow", "vol0", "--size", "65000KiB"],
        "multiple of 512",
    );
    assert!(err.contains("at least the current"), "{err}");
    let list = json(&s, &["volume", "list"]);
    assert_eq!(names(&list), ["vol0".to_string(), "y".repeat(64)]);
    assert!(s.stop().success(), "{}", s.log());
}

#[test]
fn volume_commands_explain_malformed_names() {
    // `info`, `delete` and `grow` put the name into the request path; a name that is not a
    // valid volume name must still get a clear answer, not a transport error.
    let (_dir, mut s) = small_server("badpath");
    for name in ["a b", "a/b", "", "x?y", "%zz"] {
        for args in [
            vec!["volume", "info", name],
            vec!["volume", "delete", name],
            vec!["volume", "grow", name, "--size", "1GiB"],
        ] {
            let o = s.cli(&args);
            let err = stderr(&o);
            assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
            assert!(
                err.contains("invalid volume name") || err.contains("no volume named"),
                "mariner {args:?}: unclear message {err:?}"
            );
        }
    }
    s.assert_running();
    assert_eq!(names(&json(&s, &["volume", "list"])), ["vol0"]);
    assert!(s.stop().success(), "{}", s.log());
}

#[test]
fn a_malformed_name_never_acts_on_another_volume() {
    // The name goes into the request path: `x?y` must not become volume `x` with a query.
    require("qemu-io");
    let (_dir, mut s) = small_server("wrongvol");
    ok(&s, &["volume", "create", "x", "--size", "8MiB"]);
    qemu_io(&s.url("x"), &["write -P 0x78 0 1M"]);
    for name in ["x?y", "x#y", "x?"] {
        let o = s.cli(&["volume", "delete", name]);
        assert!(
            names(&json(&s, &["volume", "list"])).contains(&"x".to_string()),
            "`mariner volume delete {name:?}` deleted volume x (exit {}, {:?})",
            o.status,
            stdout(&o)
        );
        assert!(
            !o.status.success(),
            "`volume delete {name:?}` succeeded: {}",
            stdout(&o)
        );
        let o = s.cli(&["volume", "info", name, "--json"]);
        assert!(
            !o.status.success(),
            "`volume info {name:?}` answered: {}",
            stdout(&o)
        );
    }
    qemu_io(&s.url("x"), &["read -P 0x78 0 1M"]);
    assert!(s.stop().success(), "{}", s.log());
}

#[test]
fn admin_api_rejects_malformed_requests_and_keeps_serving() {
    require("curl");
    let (_dir, mut s) = small_server("adminapi");
    let sock = s.data.join("admin.sock");
    let status = |args: &[&str]| -> u16 {
        let out = run(Command::new("curl")
            .args([
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "--max-time",
                "30",
                "--unix-socket",
            ])
            .arg(&sock)
            .args(args));
        out.trim().parse().unwrap()
    };
    let json_post = |body: &str, path: &str| {
        let url = format!("http://mariner{path}");
        status(&[
            "-X",
            "POST",
            "-H",
            "content-type: application/json",
            "-d",
            body,
            &url,
        ])
    };
    for (body, path) in [
        ("garbage", "/v1/volumes"),
        ("{\"name\":\"x\"}", "/v1/volumes"),
        ("{\"name\":\"x\",\"size_bytes\":-1}", "/v1/volumes"),
        ("{\"name\":\"x\",\"size_bytes\":\"1\"}", "/v1/volumes"),
        ("{\"size_bytes\":1}", "/v1/volumes/vol0/grow"),
        ("{}", "/v1/volumes/vol0/read-only"),
        ("{\"read_only\":\"yes\"}", "/v1/volumes/vol0/read-only"),
        ("{\"read_only\":true}", "/v1/volumes/nope/read-only"),
    ] {
        let code = json_post(body, path);
        assert!((400..500).contains(&code), "POST {path} {body}: {code}");
    }
    assert_eq!(status(&["http://mariner/v1/nothing"]), 404);
    assert_eq!(
        status(&["-X", "DELETE", "http://mariner/v1/volumes/nope"]),
        404
    );
    let st: Value = serde_json::from_str(&s.admin_get("/v1/status")).unwrap();
    assert_eq!(st["volumes"], serde_json::json!(["vol0"]), "{st}");
    assert!(
        st["log"]["failed"].is_null() && st["store"]["failed"].is_null(),
        "{st}"
    );
    s.assert_running();
    assert_eq!(names(&json(&s, &["volume", "list"])), ["vol0"]);
    assert!(s.stop().success(), "{}", s.log());
}

#[test]
fn admin_socket_is_private_and_removed_on_sigterm() {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let (_dir, mut s) = small_server("sock");
    let sock = s.data.join("admin.sock");
    let meta = std::fs::metadata(&sock).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o7777, 0o600, "admin.sock mode");
    let status = s.stop();
    assert_eq!(
        status.code(),
        Some(0),
        "SIGTERM exit: {status}\n{}",
        s.log()
    );
    assert!(!sock.exists(), "admin.sock left behind after SIGTERM");
    assert!(s.log().contains("stopped"), "{}", s.log());
    refused(&s, &["volume", "list"], "cannot reach the server");
    // The socket is recreated with the same mode on the next start.
    let s = Server::start(&s.data.clone(), &[]);
    let meta = std::fs::metadata(&sock).unwrap();
    assert_eq!(
        meta.permissions().mode() & 0o7777,
        0o600,
        "admin.sock mode after restart"
    );
    drop(s);
}

/// Runs `mariner serve --data <data> <args>` expecting it to exit within 20 s; returns the
/// output. A server that keeps running fails the test. iSCSI takes a free port unless `args`
/// say otherwise: the ports are bound before the data directory is looked at, and tests in
/// parallel must not contend for 3260.
fn serve_expect_exit(data: &Path, args: &[&str]) -> Output {
    let errfile = data.with_extension(format!("fail-{}.log", std::process::id()));
    let err = std::fs::File::create(&errfile).unwrap();
    let iscsi: &[&str] = if args.contains(&"--iscsi-listen") {
        &[]
    } else {
        &["--iscsi-listen", "127.0.0.1:0"]
    };
    let mut child = Command::new(mariner_bin())
        .arg("serve")
        .arg("--data")
        .arg(data)
        .args(iscsi)
        .args(args)
        .stdout(Stdio::null())
        .stderr(err)
        .spawn()
        .unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if start.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "mariner serve {args:?} kept running: {}",
                std::fs::read_to_string(&errfile).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stderr = std::fs::read(&errfile).unwrap();
    let _ = std::fs::remove_file(&errfile);
    Output {
        status,
        stdout: Vec::new(),
        stderr,
    }
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

#[test]
fn log_verify_and_dump_inspect_the_log_offline() {
    require("qemu-io");
    let (_dir, mut s) = small_server("logtool");
    qemu_io(
        &s.url("vol0"),
        &[
            "write -P 1 0 64k",
            "write -P 2 1M 4k",
            "write -P 3 2M 1M",
            "discard 2M 512k",
            // Zeroes over data (zeroing what already reads as zeros needs no record).
            "write -P 4 8M 64k",
            "write -z 8M 64k",
        ],
    );
    assert!(s.stop().success(), "{}", s.log());
    let logtool = |args: &[&str]| {
        Command::new(mariner_bin())
            .args(["log"])
            .args(args)
            .arg("--data")
            .arg(&s.data)
            .output()
            .unwrap()
    };
    let v = logtool(&["verify"]);
    assert_eq!(
        v.status.code(),
        Some(0),
        "log verify: {}{}",
        stdout(&v),
        stderr(&v)
    );
    assert!(stdout(&v).trim_end().ends_with("ok"), "{}", stdout(&v));
    let d = logtool(&["dump"]);
    assert!(d.status.success(), "log dump: {}", stderr(&d));
    let dump = stdout(&d);
    let rows: Vec<Vec<&str>> = dump
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim_start().starts_with("SEQ"))
        .map(|l| l.split_whitespace().collect())
        .collect();
    let vol_id = 1; // vol0 of a fresh directory
    let has = |kind: &str, at: u64, len: u64| {
        rows.iter().any(|r| {
            r.get(6) == Some(&kind)
                && r.get(7) == Some(&format!("{vol_id}:{at}").as_str())
                && r.get(8) == Some(&len.to_string().as_str())
        })
    };
    assert!(has("write", 0, 64 << 10), "{dump}");
    assert!(has("write", MIB, 4096), "{dump}");
    assert!(has("write", 2 * MIB, MIB), "{dump}");
    assert!(has("trim", 2 * MIB, 512 << 10), "{dump}");
    assert!(has("zeroes", 8 * MIB, 64 << 10), "{dump}");
    let seqs: Vec<u64> = rows.iter().map(|r| r[0].parse().unwrap()).collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "dump not in sequence order: {dump}"
    );
    let limited = logtool(&["dump", "--limit", "2"]);
    let n = stdout(&limited)
        .lines()
        .filter(|l| !l.starts_with('#') && !l.contains("SEQ"))
        .count();
    assert_eq!(n, 2, "{}", stdout(&limited));

    // A damaged device is reported with a nonzero exit.
    let log0 = s.data.join("log/log0");
    let f = std::fs::OpenOptions::new().write(true).open(&log0).unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(&[0u8; 512], 0).unwrap();
    let v = logtool(&["verify"]);
    assert!(
        !v.status.success(),
        "verify accepted a log without superblock: {}",
        stdout(&v)
    );
    assert!(stderr(&v).contains("superblock"), "{}", stderr(&v));
}

/// Parses the histogram `name`: (cumulative buckets, count).
fn histogram(metrics: &str, name: &str) -> (Vec<(String, u64)>, u64) {
    assert!(
        metrics.contains(&format!("# TYPE {name} histogram")),
        "no histogram {name}:\n{metrics}"
    );
    let buckets: Vec<(String, u64)> = metrics
        .lines()
        .filter_map(|l| l.strip_prefix(&format!("{name}_bucket{{le=\"")))
        .map(|rest| {
            let (le, v) = rest.split_once("\"} ").unwrap();
            (le.to_string(), v.parse().unwrap())
        })
        .collect();
    let count = metric_value(metrics, &format!("{name}_count")).unwrap() as u64;
    assert!(
        metric_value(metrics, &format!("{name}_sum")).is_some(),
        "{name}_sum"
    );
    assert!(buckets.len() >= 2, "{name}: {buckets:?}");
    assert!(
        buckets.windows(2).all(|w| w[0].1 <= w[1].1),
        "{name} buckets not cumulative: {buckets:?}"
    );
    assert_eq!(
        buckets.last().unwrap(),
        &("+Inf".to_string(), count),
        "{name}"
    );
    (buckets, count)
}

#[test]
fn metrics_report_latency_batches_fill_lag_and_volumes() {
    require("curl");
    require("qemu-io");
    let (_dir, mut s) = small_server("metrics");
    ok(&s, &["volume", "create", "other", "--size", "8MiB"]);
    qemu_io(
        &s.url("vol0"),
        &["write -P 1 0 4k", "write -P 2 64k 64k", "write -P 3 1M 1M"],
    );
    qemu_io(&s.url("vol0"), &["read -P 3 1M 1M"]);
    let m = s.metrics();
    let (_, acks) = histogram(&m, "mariner_ack_latency_seconds");
    assert!(acks >= 3, "acknowledged writes: {acks}");
    let (_, batches) = histogram(&m, "mariner_log_batch_records");
    assert!(batches >= 1, "{m}");
    let fill = metric_value(&m, "mariner_log_fill_ratio").unwrap();
    assert!(fill > 0.0 && fill <= 1.0, "fill ratio {fill}");
    let lag = metric_value(&m, "mariner_apply_lag_records").unwrap();
    assert!(lag >= 0.0, "apply lag {lag}");
    assert_eq!(
        metric_value(&m, "mariner_volume_writes_total{volume=\"vol0\"}"),
        Some(3.0),
        "{m}"
    );
    let bytes = (4 + 64 + 1024) * 1024;
    assert_eq!(
        metric_value(&m, "mariner_volume_write_bytes_total{volume=\"vol0\"}"),
        Some(bytes as f64),
        "{m}"
    );
    assert!(
        metric_value(&m, "mariner_volume_reads_total{volume=\"vol0\"}").unwrap() >= 1.0,
        "{m}"
    );
    assert!(
        metric_value(&m, "mariner_volume_read_bytes_total{volume=\"vol0\"}").unwrap() >= MIB as f64,
        "{m}"
    );
    assert_eq!(
        metric_value(&m, "mariner_volume_writes_total{volume=\"other\"}"),
        Some(0.0),
        "{m}"
    );
    assert_eq!(
        metric_value(&m, "mariner_volume_read_only{volume=\"vol0\"}"),
        Some(0.0),
        "{m}"
    );
    // Every sample line is `name[{labels}] number`.
    for l in m.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let (_, v) = l
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad line {l:?}"));
        assert!(v.parse::<f64>().is_ok(), "bad value in {l:?}");
    }
    // The applier catches up: lag drains to zero.
    let start = Instant::now();
    while s.metric("mariner_apply_lag_records") > 0.0 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "apply lag never drained:\n{}",
            s.metrics()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(s.stop().success(), "{}", s.log());
}

#[test]
fn listening_beyond_loopback_warns() {
    require("nbdinfo");
    let dir = scratch("anyaddr");
    let mut s = Server::start_listening(&dir.path().join("data"), &["0.0.0.0:0"], SMALL);
    assert!(s.nbd.starts_with("0.0.0.0:"), "ports.json: {}", s.nbd);
    // Connect only through loopback.
    let url = format!("nbd://127.0.0.1:{}/vol0", s.port());
    assert_eq!(export_size(&url), 64 * MIB);
    let log = s.log();
    let warning = log
        .lines()
        .find(|l| l.contains("beyond loopback"))
        .unwrap_or_else(|| panic!("no warning for 0.0.0.0:\n{log}"));
    assert!(warning.contains("WARN"), "{warning}");
    assert!(s.stop().success(), "{}", s.log());
}

#[test]
fn sigterm_with_clients_connected_exits_promptly() {
    let (_dir, mut s) = small_server("termconn");
    let (idle, _, _) = nbd_connect(&s.nbd, "vol0");
    // One client stuck in the handshake, one that never got past the greeting.
    let mut half = std::net::TcpStream::connect(&s.nbd).unwrap();
    half.write_all(&3u32.to_be_bytes()).unwrap();
    let silent = std::net::TcpStream::connect(&s.nbd).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let start = Instant::now();
    let status = s.stop();
    assert_eq!(status.code(), Some(0), "{}", s.log());
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "SIGTERM took {:?}",
        start.elapsed()
    );
    assert!(!s.data.join("admin.sock").exists());
    drop((idle, half, silent));
}

#[test]
fn json_logs_are_one_object_per_line() {
    require("qemu-io");
    let dir = scratch("jsonlog");
    let mut args = SMALL.to_vec();
    args.extend_from_slice(&["--log-format", "json"]);
    let mut s = Server::start_listening(&dir.path().join("data"), &["0.0.0.0:0"], &args);
    let url = format!("nbd://127.0.0.1:{}/vol0", s.port());
    qemu_io(&url, &["write -P 1 0 4k"]);
    assert!(s.stop().success(), "{}", s.log());
    let log = s.log();
    let lines: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}")))
        .collect();
    let message = |v: &Value| v["fields"]["message"].as_str().unwrap_or("").to_string();
    assert!(
        lines
            .iter()
            .all(|v| v["level"].is_string() && v["timestamp"].is_string()),
        "{log}"
    );
    let warn = lines
        .iter()
        .find(|v| message(v).contains("beyond loopback"));
    assert_eq!(warn.unwrap_or_else(|| panic!("{log}"))["level"], "WARN");
    assert!(
        lines.iter().any(|v| message(v) == "recovery complete"),
        "{log}"
    );
    assert!(lines.iter().any(|v| message(v) == "serving"), "{log}");
    assert!(lines.iter().any(|v| message(v) == "stopped"), "{log}");
}

#[test]
fn every_listen_address_is_served_and_recorded_in_ports_json() {
    require("nbdinfo");
    let dir = scratch("ports");
    let data = dir.path().join("data");
    let mut s = Server::start_listening(&data, &["127.0.0.1:0", "127.0.0.1:0"], SMALL);
    let ports: Value =
        serde_json::from_slice(&std::fs::read(data.join("ports.json")).unwrap()).unwrap();
    let nbd: Vec<&str> = ports["nbd"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(nbd.len(), 2, "{ports}");
    assert_ne!(nbd[0], nbd[1], "{ports}");
    for addr in &nbd {
        assert!(!addr.ends_with(":0"), "unresolved port in {ports}");
        assert_eq!(export_size(&format!("nbd://{addr}/vol0")), 64 * MIB);
    }
    assert_eq!(ports["pid"].as_u64(), Some(u64::from(s.pid())), "{ports}");
    assert!(
        ports["admin"].as_str().unwrap().ends_with("admin.sock"),
        "{ports}"
    );
    assert!(!s.log().contains("beyond loopback"), "{}", s.log());
    assert!(s.stop().success(), "{}", s.log());
}

/// One NBD request with a simple reply over a socket from [`nbd_connect`]; returns the reply's
/// error code and, for a successful read, the data.
#[allow(clippy::big_endian_bytes)]
fn nbd_request(
    s: &mut std::net::TcpStream,
    kind: u16,
    offset: u64,
    data: &[u8],
    len: u32,
) -> (u32, Vec<u8>) {
    use std::io::Read;
    let mut r = Vec::with_capacity(28 + data.len());
    r.extend_from_slice(&0x2560_9513u32.to_be_bytes());
    r.extend_from_slice(&0u16.to_be_bytes());
    r.extend_from_slice(&kind.to_be_bytes());
    r.extend_from_slice(&7u64.to_be_bytes());
    r.extend_from_slice(&offset.to_be_bytes());
    r.extend_from_slice(&len.to_be_bytes());
    r.extend_from_slice(data);
    s.write_all(&r).unwrap();
    let mut reply = [0u8; 16];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(
        reply[..4],
        0x6744_6698u32.to_be_bytes(),
        "simple reply magic"
    );
    let error = u32::from_be_bytes(reply[4..8].try_into().unwrap());
    let mut out = Vec::new();
    if kind == 0 && error == 0 {
        out.resize(len as usize, 0);
        s.read_exact(&mut out).unwrap();
    }
    (error, out)
}

const NBD_FLAG_READ_ONLY: u16 = 1 << 1;
const NBD_EPERM: u32 = 1;

#[test]
fn volume_set_read_only_is_shown_kept_across_restarts_and_cleared() {
    let (_dir, mut s) = small_server("read-only-flag");
    let info = json(&s, &["volume", "info", "vol0"]);
    assert_eq!(info["read_only_set"], false, "{info}");
    let table = ok(&s, &["volume", "set", "vol0", "--read-only", "true"]);
    let vol0 = row(&table, "vol0").unwrap_or_else(|| panic!("{table}"));
    assert!(
        vol0.contains("read-only: set read-only by an operator"),
        "{table}"
    );
    let list = json(&s, &["volume", "list"]);
    assert_eq!(list[0]["read_only_set"], true, "{list}");
    assert_eq!(
        list[0]["read_only"], "set read-only by an operator",
        "{list}"
    );
    let meta = std::fs::read_to_string(s.data.join("volumes/vol0/volume.json")).unwrap();
    assert!(meta.contains("\"read_only\": true"), "{meta}");
    // The failure gauge stays for I/O errors.
    assert_eq!(s.metric("mariner_volume_read_only{volume=\"vol0\"}"), 0.0);

    s.restart_after_sigterm(SMALL);
    assert_eq!(json(&s, &["volume", "info", "vol0"])["read_only_set"], true);
    // Setting what is already set answers the same.
    let again = json(&s, &["volume", "set", "vol0", "--read-only", "true"]);
    assert_eq!(again["read_only_set"], true, "{again}");
    let cleared = json(&s, &["volume", "set", "vol0", "--read-only", "false"]);
    assert_eq!(cleared["read_only_set"], false, "{cleared}");
    assert!(cleared["read_only"].is_null(), "{cleared}");
    s.restart_after_sigterm(SMALL);
    assert_eq!(
        json(&s, &["volume", "info", "vol0"])["read_only_set"],
        false
    );

    refused(&s, &["volume", "set", "vol0"], "nothing to set");
    refused(
        &s,
        &["volume", "set", "nosuch", "--read-only", "true"],
        "nosuch",
    );
    let o = s.cli(&["volume", "set", "vol0", "--read-only", "maybe"]);
    assert!(!o.status.success(), "--read-only maybe accepted");
    assert!(s.stop().success(), "{}", s.log());
}

#[test]
fn a_read_only_volume_refuses_writes_over_nbd_and_iscsi_and_still_reads() {
    require("qemu-io");
    let (_dir, mut s) = small_server("read-only-clients");
    let nbd = s.url("vol0");
    let iscsi = format!("iscsi://{}/iqn.2026-11.dev.mariner:vol0/0", s.iscsi());
    qemu_io(&nbd, &["write -P 0x5a 0 64k"]);
    // A client connected before the flag is set keeps its (writable) transmission flags.
    let (mut early, _, flags) = nbd_connect(&s.nbd, "vol0");
    assert_eq!(flags & NBD_FLAG_READ_ONLY, 0);

    ok(&s, &["volume", "set", "vol0", "--read-only", "true"]);
    let (error, _) = nbd_request(&mut early, 1, 0, &[0x11; 4096], 4096);
    assert_eq!(error, NBD_EPERM, "NBD write to a read-only volume");
    let (error, data) = nbd_request(&mut early, 0, 0, &[], 4096);
    assert_eq!((error, data), (0, vec![0x5a; 4096]), "NBD read");
    let (_late, _, flags) = nbd_connect(&s.nbd, "vol0");
    assert_ne!(flags & NBD_FLAG_READ_ONLY, 0, "NBD_FLAG_READ_ONLY");
    // qemu opens neither export read-write: NBD says read-only, iSCSI MODE SENSE says WP.
    for (url, why) in [(&nbd, "Permission denied"), (&iscsi, "write protected")] {
        let out = Command::new("qemu-io")
            .args(["-f", "raw", "-c", "write -P 0x11 0 4k"])
            .arg(url)
            .output()
            .unwrap();
        assert!(!out.status.success(), "qemu-io wrote to {url}");
        assert!(stderr(&out).contains(why), "{url}: {}", stderr(&out));
        let out = run(Command::new("qemu-io")
            .args(["-r", "-f", "raw", "-c", "read -P 0x5a 0 64k"])
            .arg(url));
        assert!(!out.contains("failed"), "qemu-io -r {url}:\n{out}");
    }

    ok(&s, &["volume", "set", "vol0", "--read-only", "false"]);
    let (error, _) = nbd_request(&mut early, 1, 0, &[0x11; 4096], 4096);
    assert_eq!(error, 0, "NBD write after the flag is cleared");
    qemu_io(
        &iscsi,
        &[
            "write -P 0x22 4k 4k",
            "read -P 0x11 0 4k",
            "read -P 0x22 4k 4k",
        ],
    );
    drop(early);
    s.assert_running();
}
