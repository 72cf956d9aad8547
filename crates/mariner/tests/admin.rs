//! End-to-end tests of operating Mariner: the volume CLI over the admin socket (including the
//! read-only flag, as NBD and iSCSI clients see it) and the admin API's own checks. What a
//! server refuses to start on is in refusals.rs; the log tools, `/metrics`, logs and shutdown
//! are in observing.rs.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(clippy::big_endian_bytes)] // the NBD wire is big-endian

mod common;

use common::cli::*;
use common::*;
use serde_json::Value;
use std::io::Write;
use std::process::Command;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

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
