//! Recovery time: a 1 GiB log filled with applying paused (`--test-pause-apply`), then kill -9;
//! the restart must serve again within 5 s, and the data must read back intact.
//!
//! Two restarts are measured: the first with the log still in the page cache (apply still
//! paused, so the log stays full), the second after dropping the page cache (cold: the scan
//! reads the log from the disk), with applying resumed. Both are bounded. The time measured is
//! the client's: from spawning the process until an NBD read of the first block returns the
//! right bytes; the server's own recovery time is reported beside it. Dropping the page cache
//! needs root: without it the test fails rather than measure a warm cache twice.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

const LOG_BYTES: u64 = 1 << 30;
/// Written with apply paused: as much of the 1 GiB log as 128 KiB records fill without making
/// the writers wait (a record never spans a 4 MiB segment: 31 of them fit in one, 3.875 MiB).
const FILL_BYTES: u64 = 960 << 20;
const REQUEST_BYTES: u64 = 128 << 10;
const RECOVERY_LIMIT_MS: f64 = 5000.0;

/// GET `path` on the admin socket; the JSON body.
fn admin_get(data: &Path, path: &str) -> String {
    let mut s = UnixStream::connect(data.join("admin.sock")).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: mariner\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("no HTTP header end");
    assert!(head.starts_with("HTTP/1.1 200"), "GET {path}: {head}");
    body.to_string()
}

/// A value of one Prometheus sample line (`name value` or `name{...} value`).
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.split([' ', '{']).next() == Some(name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Runs `cmd` to completion within `limit`, or fails saying what probably happened.
fn run_within(cmd: &mut Command, limit: Duration, what: &str) {
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "{cmd:?} failed: {status}");
            return;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} did not finish in {limit:?}: {what}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What one restart reported.
#[derive(Debug)]
struct Recovery {
    elapsed_ms: f64,
    records_replayed: u64,
    voided: u64,
    bytes_scanned: u64,
    /// From spawning the process until an NBD read of the first block returned.
    until_serving: Duration,
}

/// NBD_CMD_READ of `len` bytes at offset 0 on a connection in the transmission phase (simple
/// replies: `nbd_connect` negotiates no structured replies).
#[allow(clippy::big_endian_bytes)] // the NBD wire is big-endian
fn nbd_read_start(s: &mut TcpStream, len: u32) -> Vec<u8> {
    let mut req = Vec::with_capacity(28);
    req.extend_from_slice(&0x2560_9513u32.to_be_bytes());
    req.extend_from_slice(&0u16.to_be_bytes()); // flags
    req.extend_from_slice(&0u16.to_be_bytes()); // NBD_CMD_READ
    req.extend_from_slice(&1u64.to_be_bytes()); // cookie
    req.extend_from_slice(&0u64.to_be_bytes()); // offset
    req.extend_from_slice(&len.to_be_bytes());
    s.write_all(&req).unwrap();
    let mut reply = [0u8; 16];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(
        reply[..4],
        0x6744_6698u32.to_be_bytes(),
        "simple reply magic"
    );
    assert_eq!(reply[4..8], [0; 4], "NBD read error");
    let mut data = vec![0; len as usize];
    s.read_exact(&mut data).unwrap();
    data
}

/// Starts the server and waits until it serves: its ports are published and a read of the
/// first block returns `first_block` (`nbd_connect` sets a 30 s read time-out).
fn restart(data: &Path, args: &[&str], first_block: &[u8]) -> (Server, Recovery) {
    let t = Instant::now();
    let s = Server::start(data, args);
    let (mut nbd, _, _) = nbd_connect(&s.nbd, "");
    let got = nbd_read_start(&mut nbd, first_block.len() as u32);
    let until_serving = t.elapsed();
    assert!(
        got == first_block,
        "the first block read back wrong after restart"
    );
    drop(nbd);
    let status: serde_json::Value = serde_json::from_str(&admin_get(data, "/v1/status")).unwrap();
    let r = &status["recovery"];
    let rec = Recovery {
        elapsed_ms: r["elapsed_ms"].as_f64().expect("recovery.elapsed_ms"),
        records_replayed: r["records_replayed"]
            .as_u64()
            .expect("recovery.records_replayed"),
        voided: r["voided"].as_u64().unwrap_or(0),
        bytes_scanned: r["bytes_scanned"].as_u64().unwrap_or(0),
        until_serving,
    };
    assert!(
        s.log().contains("recovery complete"),
        "no recovery line in the log: {}",
        s.log()
    );
    (s, rec)
}

/// Drops the page cache so the next scan reads the disk (needs root: checked up front).
fn drop_caches() {
    run(&mut Command::new("sync"));
    if let Err(e) = std::fs::write("/proc/sys/vm/drop_caches", "1") {
        panic!("could not drop the page cache, so the cold restart would be warm: {e}");
    }
}

fn report(label: &str, r: &Recovery, expected_records: u64) {
    println!(
        "recovery ({label}): server reports {:.1} ms for {} records replayed ({} expected), {} voided, {:.1} MiB \
         scanned; {:.0} ms from spawn to serving the first read",
        r.elapsed_ms,
        r.records_replayed,
        expected_records,
        r.voided,
        r.bytes_scanned as f64 / (1 << 20) as f64,
        r.until_serving.as_secs_f64() * 1000.0
    );
    assert!(r.records_replayed > 0, "{label}: nothing replayed");
    assert!(
        r.records_replayed >= expected_records,
        "{label}: replayed {} records, but {expected_records} writes were acknowledged and none \
         applied",
        r.records_replayed
    );
    let serving_ms = r.until_serving.as_secs_f64() * 1000.0;
    assert!(
        serving_ms <= RECOVERY_LIMIT_MS,
        "{label}: serving again took {serving_ms:.1} ms from spawn, over the \
         {RECOVERY_LIMIT_MS} ms budget"
    );
}

#[test]
fn a_full_one_gib_log_recovers_within_five_seconds() {
    require("nbdcopy");
    require("qemu-img");
    require_root("the cold restart (dropping the page cache)");
    let dir = scratch("recovery");
    let data = dir.path().join("data");
    let src = dir.path().join("src.raw");
    random_file(&src, FILL_BYTES, 0x0072_6563_6f76_6572);
    let log_size = LOG_BYTES.to_string();
    let unpaused = ["--log-size", &log_size, "--default-volume-size", "2GiB"];
    let paused = [&unpaused[..], &["--test-pause-apply"]].concat();

    let mut s = Server::start(&data, &paused);
    let t = Instant::now();
    let request = format!("--request-size={REQUEST_BYTES}");
    run_within(
        Command::new("nbdcopy")
            .arg(&request)
            .arg(&src)
            .arg(s.url("")),
        Duration::from_secs(600),
        "writers blocked: the paused log is full before FILL_BYTES",
    );
    let fill_s = t.elapsed().as_secs_f64();
    let metrics = admin_get(&data, "/metrics");
    let fill = metric(&metrics, "mariner_log_fill_ratio").unwrap_or(f64::NAN);
    println!(
        "filled: {} MiB in {REQUEST_BYTES}-byte writes in {fill_s:.1} s; log fill ratio {fill:.3}",
        FILL_BYTES >> 20
    );
    s.kill();

    let expected = FILL_BYTES / REQUEST_BYTES;
    let first_block = first_block_of(&src);
    let (mut s, warm) = restart(&data, &paused, &first_block);
    report("warm cache, apply paused", &warm, expected);
    s.kill();

    drop_caches();
    let (mut s, cold) = restart(&data, &unpaused, &first_block);
    report("cold cache", &cold, expected);
    run(Command::new("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(&src)
        .arg(s.url("")));
    assert!(s.stop().success(), "unclean exit on SIGTERM: {}", s.log());
}

/// The first 4 KiB of `path`.
fn first_block_of(path: &Path) -> Vec<u8> {
    let mut block = vec![0; 4096];
    std::fs::File::open(path)
        .unwrap()
        .read_exact(&mut block)
        .unwrap();
    block
}
