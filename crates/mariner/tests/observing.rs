//! End-to-end tests of looking at a node: the offline log tools (`mariner log verify` and
//! `dump`), `/metrics`, the beyond-loopback warning, graceful shutdown with clients
//! connected, JSON logs, and every listen address recorded in ports.json.
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
    // The volume's creation is recorded before its writes, and the volume's own sequence
    // numbers (last column) count its records from 1 in log order.
    let of_volume: Vec<&Vec<&str>> = rows
        .iter()
        .filter(|r| {
            r.get(7)
                .is_some_and(|v| v.starts_with(&format!("{vol_id}:")))
        })
        .collect();
    assert_eq!(
        of_volume.first().and_then(|r| r.get(6)),
        Some(&"created"),
        "{dump}"
    );
    let vseqs: Vec<u64> = of_volume.iter().map(|r| r[9].parse().unwrap()).collect();
    assert_eq!(
        vseqs,
        (1..=vseqs.len() as u64).collect::<Vec<_>>(),
        "{dump}"
    );
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
    // The store is the log's one holder of space today; nothing was let go of past it.
    let held = metric_value(&m, "mariner_log_holder_segments{holder=\"store\"}").unwrap();
    assert!(held >= 1.0, "{m}");
    assert_eq!(
        metric_value(&m, "mariner_log_holder_cuts_total{holder=\"store\"}"),
        Some(0.0),
        "{m}"
    );
    assert!(metric_value(&m, "mariner_log_holder_released_seq{holder=\"store\"}").is_some());
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
