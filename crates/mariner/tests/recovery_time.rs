//! Recovery time: a 1 GiB log filled with applying paused (`--test-pause-apply`), then kill -9;
//! the restart must replay the whole log in at most 5 s, and the data must read back intact.
//!
//! Two restarts are measured: the first with the log still in the page cache (apply still
//! paused, so the log stays full), the second after dropping the page cache when running as
//! root (cold: the scan reads the log from the disk), with applying resumed. Both are bounded.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
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
    /// From spawning the process to its ports being published.
    until_serving: Duration,
}

fn restart(data: &Path, args: &[&str]) -> (Server, Recovery) {
    let t = Instant::now();
    let s = Server::start(data, args);
    let until_serving = t.elapsed();
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

/// Drops the page cache so the next scan reads the disk; needs root, else says so.
fn drop_caches() -> &'static str {
    let _ = Command::new("sync").status();
    match std::fs::write("/proc/sys/vm/drop_caches", "1") {
        Ok(()) => "cold cache",
        Err(_) => "warm cache (not root: could not drop the page cache)",
    }
}

fn report(label: &str, r: &Recovery, expected_records: u64) {
    println!(
        "recovery ({label}): {:.1} ms for {} records replayed ({} expected), {} voided, {:.1} MiB \
         scanned; {:.0} ms from spawn to serving",
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
    assert!(
        r.elapsed_ms <= RECOVERY_LIMIT_MS,
        "{label}: recovery took {:.1} ms, over the {RECOVERY_LIMIT_MS} ms budget",
        r.elapsed_ms
    );
}

#[test]
fn a_full_one_gib_log_recovers_within_five_seconds() {
    require("nbdcopy");
    require("qemu-img");
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
    let (mut s, warm) = restart(&data, &paused);
    report("warm cache, apply paused", &warm, expected);
    s.kill();

    let cache = drop_caches();
    let (mut s, cold) = restart(&data, &unpaused);
    report(cache, &cold, expected);
    run(Command::new("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(&src)
        .arg(s.url("")));
    assert!(s.stop().success(), "unclean exit on SIGTERM: {}", s.log());
}
