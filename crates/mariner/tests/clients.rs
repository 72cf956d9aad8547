//! End-to-end tests with real NBD clients against the real binary: qemu-img, qemu-io, nbdinfo,
//! nbdcopy and fio. Every test checks that what it wrote survives a graceful (SIGTERM) restart
//! and a kill -9 restart on the ordinary (non-volatile) backend.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::cli::{nbd_map, types_in};
use common::*;
use std::path::Path;
use std::process::Command;

const MIB: u64 = 1 << 20;
const VOLUME_BYTES: u64 = 64 * MIB;

/// A server on a fresh data directory with a 64 MiB `vol0` and a 256 MiB log, configured so
/// the store does not sync during the test: whatever the test writes stays in the log only, and
/// the first kill -9 restart must rebuild it by replaying the log.
fn small_server(name: &str) -> (tempfile::TempDir, Server) {
    let dir = scratch(name);
    let config = dir.path().join("nosync.toml");
    std::fs::write(
        &config,
        "[store]\nsync_interval_ms = 3600000\nsync_size = \"64GiB\"\n[log]\nfile_size = \"256MiB\"\n",
    )
    .unwrap();
    let s = Server::start(
        &dir.path().join("data"),
        &[
            "--config",
            config.to_str().unwrap(),
            "--default-volume-size",
            "64MiB",
        ],
    );
    (dir, s)
}

/// Runs `check` now (reads served partly from unsynced state), after a kill -9 restart that
/// must replay the log, and after a SIGTERM restart. Restarts use the default configuration.
fn check_across_restarts(s: &mut Server, what: &str, check: impl Fn(&Server)) {
    check(s);
    assert_eq!(
        s.metric("mariner_store_syncs_total"),
        0.0,
        "the store synced: no replay test"
    );
    s.restart_after_kill9(&[]);
    let replayed = s.metric("mariner_recovery_records");
    assert!(
        replayed > 0.0,
        "{what}: kill -9 restart replayed no records"
    );
    eprintln!("{what}: checking after a kill -9 restart ({replayed} records replayed)");
    check(s);
    s.restart_after_sigterm(&[]);
    eprintln!("{what}: checking after a SIGTERM restart");
    check(s);
}

/// Writes a 64 MiB raw image: random data in [0, 16M) and [24M, 40M), a written zero range in
/// [16M, 24M) and a sparse tail, so converters meet data, zeros and holes.
fn mixed_image(path: &Path, seed: u64) -> Vec<u8> {
    let mut img = vec![0u8; VOLUME_BYTES as usize];
    img[..16 << 20].copy_from_slice(&random_bytes(seed, 16 << 20));
    img[24 << 20..40 << 20].copy_from_slice(&random_bytes(seed + 1, 16 << 20));
    let f = std::fs::File::create(path).unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(&img[..40 << 20], 0).unwrap();
    f.set_len(VOLUME_BYTES).unwrap();
    img
}

fn qemu_img_compare(a: &str, b: &str) -> std::process::Output {
    Command::new("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw", a, b])
        .output()
        .unwrap()
}

fn assert_identical(a: &str, b: &str) {
    let out = qemu_img_compare(a, b);
    assert!(
        out.status.success(),
        "qemu-img compare {a} {b}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Reads the whole export into memory with qemu-img convert.
fn read_back(s: &Server, export: &str, tmp: &Path) -> Vec<u8> {
    let out = tmp.join(format!("readback-{export}.raw"));
    let _ = std::fs::remove_file(&out);
    run(Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "raw", &s.url(export)])
        .arg(&out));
    std::fs::read(&out).unwrap()
}

fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    if a.len() != b.len() {
        return Some(a.len().min(b.len()));
    }
    a.iter().zip(b).position(|(x, y)| x != y)
}

#[test]
fn qemu_img_convert_then_compare_both_ways() {
    require("qemu-img");
    let (dir, mut s) = small_server("qimg");
    let src = dir.path().join("src.raw");
    let image = mixed_image(&src, 7);
    let src = src.to_str().unwrap().to_string();
    run(Command::new("qemu-img").args([
        "convert",
        "-n",
        "-f",
        "raw",
        "-O",
        "raw",
        &src,
        &s.url("vol0"),
    ]));

    // The comparison must be able to fail: a copy with one flipped byte differs.
    let bad = dir.path().join("bad.raw");
    let mut flipped = image.clone();
    flipped[30 << 20] ^= 0x5a;
    std::fs::write(&bad, &flipped).unwrap();
    let out = qemu_img_compare(bad.to_str().unwrap(), &s.url("vol0"));
    assert_eq!(
        out.status.code(),
        Some(1),
        "compare must report the difference: {out:?}"
    );

    check_across_restarts(&mut s, "qemu-img", |s| {
        assert_identical(&src, &s.url("vol0"));
        assert_identical(&s.url("vol0"), &src);
        assert_identical(&s.url(""), &src);
        let back = read_back(s, "vol0", dir.path());
        assert_eq!(
            first_difference(&back, &image),
            None,
            "converted back differs"
        );
    });
    assert!(s.stop().success(), "{}", s.log());
}

const K: u64 = 1024;

/// (pattern, offset, length) writes; 0 in the pattern is `write -z`; `None` is a discard.
fn qemu_io_plan() -> Vec<(Option<u8>, u64, u64)> {
    vec![
        (Some(0x11), 0, 4 * K),
        (Some(0x22), 12 * K, 512),
        (Some(0x33), MIB, MIB),         // a 1 MiB request
        (Some(0x44), 8 * MIB, 4 * MIB), // 4 MiB: above the advertised maximum, so split
        (Some(0x55), 20 * MIB, 64 * K),
        (Some(0), 20 * MIB + 16 * K, 16 * K), // write -z inside written data
        (Some(0x66), 30 * MIB, 2 * MIB),
        (None, 30 * MIB + 512 * K, MIB), // discard inside written data
        (Some(0x77), VOLUME_BYTES - 512 * K, 512 * K), // the very end of the volume
        (Some(0x88), 9 * MIB + 4 * K, 8 * K), // overwrite inside the 4 MiB write
        (Some(0), 40 * MIB, 2 * MIB),    // write -z over never-written space
        (None, 44 * MIB, MIB),           // discard of never-written space
    ]
}

/// The expected content of the volume after the plan, as (pattern, offset, length) runs
/// covering the whole volume.
fn expected_runs(plan: &[(Option<u8>, u64, u64)]) -> Vec<(u8, u64, u64)> {
    // Simulate at 512-byte granularity.
    let mut sectors = vec![0u8; (VOLUME_BYTES / 512) as usize];
    for &(p, off, len) in plan {
        for s in &mut sectors[(off / 512) as usize..((off + len) / 512) as usize] {
            *s = p.unwrap_or(0);
        }
    }
    let mut runs: Vec<(u8, u64, u64)> = Vec::new();
    for (i, &p) in sectors.iter().enumerate() {
        match runs.last_mut() {
            Some((q, _, len)) if *q == p => *len += 512,
            _ => runs.push((p, i as u64 * 512, 512)),
        }
    }
    runs
}

#[test]
fn qemu_io_pattern_writes_read_back() {
    require("qemu-io");
    let (_dir, mut s) = small_server("qio");
    let plan = qemu_io_plan();
    let out = qemu_io(&s.url("vol0"), &qemu_io_plan_commands(&plan));
    assert_eq!(out.matches("wrote ").count(), 10, "{out}");
    assert_eq!(out.matches("discard ").count(), 2, "{out}");
    let runs = expected_runs(&plan);
    // Reads up to 4 MiB each, so 1 MiB and 4 MiB read requests are exercised too.
    let reads: Vec<String> = runs
        .iter()
        .flat_map(|&(p, off, len)| {
            (0..len.div_ceil(4 * MIB)).map(move |i| {
                let o = off + i * 4 * MIB;
                format!("read -P {p:#x} {o} {}", (len - i * 4 * MIB).min(4 * MIB))
            })
        })
        .collect();
    assert!(reads.len() > 15, "{reads:?}");
    // The check must be able to fail.
    let wrong = Command::new("qemu-io")
        .args(["-f", "raw", "-c", "read -P 0x12 0 4096", &s.url("vol0")])
        .output()
        .unwrap();
    assert!(!wrong.status.success(), "qemu-io accepted a wrong pattern");
    check_across_restarts(&mut s, "qemu-io", |s| {
        let out = qemu_io(&s.url("vol0"), &reads);
        assert_eq!(out.matches("read ").count(), reads.len(), "{out}");
    });
    assert!(s.stop().success(), "{}", s.log());
}

/// `nbdinfo --json` of one export.
fn nbdinfo_json(url: &str) -> serde_json::Value {
    let out = run(Command::new("nbdinfo").arg("--json").arg(url));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["exports"][0].clone()
}

#[test]
fn nbdinfo_reports_geometry_and_allocation_map() {
    require("nbdinfo");
    require("qemu-io");
    let (_dir, mut s) = small_server("nbdinfo");
    let info = nbdinfo_json(&s.url("vol0"));
    assert_eq!(info["export-name"], "vol0", "{info}");
    assert_eq!(info["export-size"].as_u64(), Some(VOLUME_BYTES), "{info}");
    assert_eq!(info["can_multi_conn"], true, "{info}");
    for flag in ["can_flush", "can_fua", "can_trim", "can_zero"] {
        assert_eq!(info[flag], true, "{flag}: {info}");
    }
    assert_eq!(info["is_read_only"], false, "{info}");
    assert_eq!(info["block_size_minimum"].as_u64(), Some(1), "{info}");
    assert_eq!(info["block_size_preferred"].as_u64(), Some(4096), "{info}");
    let max = info["block_size_maximum"].as_u64().unwrap();
    assert!(
        (MIB..=32 * MIB).contains(&max) && max.is_multiple_of(512),
        "maximum payload {max}: {info}"
    );
    let contexts = info["contexts"].as_array().unwrap();
    assert!(contexts.iter().any(|c| c == "base:allocation"), "{info}");
    // The empty export name selects the default volume.
    let default = nbdinfo_json(&s.url(""));
    assert_eq!(
        default["export-size"].as_u64(),
        Some(VOLUME_BYTES),
        "{default}"
    );
    let list = run(Command::new("nbdinfo").arg("--list").arg(s.url("")));
    assert!(list.contains("export=\"vol0\""), "{list}");

    let never_written = nbd_map(&s.url("vol0"));
    assert_eq!(
        never_written,
        vec![(0, VOLUME_BYTES, 3)],
        "fresh volume is one hole"
    );

    qemu_io(
        &s.url("vol0"),
        &[
            format!("write -P 1 0 {}", MIB),
            format!("write -P 2 {} {}", 8 * MIB, MIB),
            format!("discard {} {}", 8 * MIB + 256 * K, 512 * K),
            format!("write -P 3 {} {}", 16 * MIB, 2 * MIB),
            format!("write -z {} {}", 16 * MIB, MIB),
        ],
    );
    check_across_restarts(&mut s, "nbdinfo --map", |s| {
        // Trimmed ranges are holes once applied (before, they read as zero: see
        // `reads_see_acknowledged_writes_before_they_are_applied`).
        wait_applied(s);
        let map = nbd_map(&s.url("vol0"));
        let total: u64 = map.iter().map(|e| e.1).sum();
        assert_eq!(total, VOLUME_BYTES, "{map:?}");
        let expect = |off: u64, len: u64, want: &[u64], what: &str| {
            let got = types_in(&map, off, len);
            assert!(
                !got.is_empty() && got.iter().all(|t| want.contains(t)),
                "{what} [{off}, +{len}): types {got:?}, want {want:?}; map {map:?}"
            );
        };
        expect(0, MIB, &[0], "written");
        expect(MIB, 7 * MIB, &[3], "never written");
        expect(8 * MIB, 256 * K, &[0], "written");
        expect(8 * MIB + 256 * K, 512 * K, &[3], "trimmed");
        expect(8 * MIB + 768 * K, 256 * K, &[0], "written");
        expect(16 * MIB, MIB, &[2, 3], "written zeroes");
        expect(17 * MIB, MIB, &[0], "written");
        expect(18 * MIB, VOLUME_BYTES - 18 * MIB, &[3], "never written");
        // And the data behind the map is right.
        qemu_io(
            &s.url("vol0"),
            &[
                format!("read -P 1 0 {}", MIB),
                format!("read -P 0 {} {}", MIB, 7 * MIB),
                format!("read -P 2 {} {}", 8 * MIB, 256 * K),
                format!("read -P 0 {} {}", 8 * MIB + 256 * K, 512 * K),
                format!("read -P 2 {} {}", 8 * MIB + 768 * K, 256 * K),
                format!("read -P 0 {} {}", 16 * MIB, MIB),
                format!("read -P 3 {} {}", 17 * MIB, MIB),
            ],
        );
    });
    assert!(s.stop().success(), "{}", s.log());
}

/// Waits until the store has applied every durable record.
fn wait_applied(s: &Server) {
    let start = std::time::Instant::now();
    while s.metric("mariner_apply_lag_records") > 0.0 {
        assert!(
            start.elapsed().as_secs() < 10,
            "apply lag does not drain:\n{}",
            s.metrics()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Connections nbdcopy opened to one side, from its -v trace (handles are named
/// `<side>0`, `<side>1`, ...).
fn connections_used(trace: &str, side: &str) -> usize {
    let mut seen = std::collections::BTreeSet::new();
    for word in trace.split_whitespace() {
        if let Some(rest) = word.strip_prefix(side).and_then(|w| w.strip_suffix(':')) {
            if !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit()) {
                seen.insert(rest.to_string());
            }
        }
    }
    seen.len()
}

fn nbdcopy(args: &[&str]) -> String {
    let out = Command::new("nbdcopy")
        .arg("-v")
        .args(args)
        .output()
        .unwrap();
    let trace = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "nbdcopy {args:?}: {}\n{}",
        out.status,
        trace.lines().rev().take(30).collect::<Vec<_>>().join("\n")
    );
    trace
}

#[test]
fn nbdcopy_round_trip_over_several_connections() {
    require("nbdcopy");
    let (dir, mut s) = small_server("nbdcopy");
    let src = dir.path().join("src.raw");
    let image = mixed_image(&src, 21);
    let url = s.url("vol0");
    // nbdcopy's defaults: several connections when the server offers multi-conn.
    let trace = nbdcopy(&[src.to_str().unwrap(), &url]);
    let conns = connections_used(&trace, "dst");
    assert!(
        conns >= 2,
        "nbdcopy used {conns} connection(s) to the volume"
    );
    check_across_restarts(&mut s, "nbdcopy", |s| {
        let back = dir.path().join("back.raw");
        let _ = std::fs::remove_file(&back);
        let trace = nbdcopy(&[&s.url("vol0"), back.to_str().unwrap()]);
        assert!(
            connections_used(&trace, "src") >= 2,
            "reading used one connection"
        );
        let got = std::fs::read(&back).unwrap();
        assert_eq!(
            first_difference(&got, &image),
            None,
            "nbdcopy read back differs"
        );
    });
    assert!(s.stop().success(), "{}", s.log());
}

/// fio job arguments: 4 KiB random writes over the first 32 MiB by four jobs (four NBD
/// connections, 8 MiB each), crc32c verification.
fn fio_args(url: &str) -> Vec<String> {
    [
        "--name=mariner",
        "--ioengine=nbd",
        "--rw=randwrite",
        "--bs=4k",
        "--size=8M",
        "--numjobs=4",
        "--offset_increment=8M",
        "--group_reporting",
        "--iodepth=16",
        "--verify=crc32c",
        "--verify_fatal=1",
        "--verify_state_save=0",
        "--randseed=4242",
        "--output-format=json",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([format!("--uri={url}")])
    .collect()
}

fn fio(dir: &Path, args: &[String]) -> std::process::Output {
    Command::new("fio")
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap()
}

/// Bytes fio read and wrote, from its JSON output; asserts no job error.
fn fio_bytes(out: &std::process::Output) -> (u64, u64) {
    let text = String::from_utf8_lossy(&out.stdout);
    let start = text
        .find('{')
        .unwrap_or_else(|| panic!("no JSON from fio: {text}"));
    let v: serde_json::Value = serde_json::from_str(&text[start..]).unwrap();
    let jobs = v["jobs"].as_array().unwrap();
    let mut total = (0, 0);
    for job in jobs {
        assert_eq!(job["error"].as_u64(), Some(0), "{job}");
        total.0 += job["read"]["io_bytes"].as_u64().unwrap();
        total.1 += job["write"]["io_bytes"].as_u64().unwrap();
    }
    total
}

#[test]
fn fio_randwrite_verifies_and_survives_restarts() {
    require("fio");
    require("qemu-io");
    let (dir, mut s) = small_server("fio");
    let out = fio(dir.path(), &fio_args(&s.url("vol0")));
    assert!(
        out.status.success(),
        "fio: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (read, written) = fio_bytes(&out);
    assert_eq!(written, 32 * MIB, "fio wrote");
    assert_eq!(read, 32 * MIB, "fio verified");
    check_across_restarts(&mut s, "fio --verify_only", |s| {
        let mut args = fio_args(&s.url("vol0"));
        args.push("--verify_only".into());
        let out = fio(dir.path(), &args);
        assert!(
            out.status.success(),
            "fio --verify_only: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
        assert_eq!(fio_bytes(&out).0, 32 * MIB, "fio verified");
    });
    // The verification must be able to fail: zero one block fio wrote.
    qemu_io(&s.url("vol0"), &[format!("write -z {} 4096", 5 * MIB)]);
    let mut args = fio_args(&s.url("vol0"));
    args.push("--verify_only".into());
    let out = fio(dir.path(), &args);
    assert!(
        !out.status.success(),
        "fio --verify_only missed a zeroed block"
    );
    assert!(s.stop().success(), "{}", s.log());
}

#[test]
fn two_exports_hold_separate_data() {
    require("qemu-io");
    require("nbdinfo");
    require("nbdcopy");
    let (dir, mut s) = small_server("twoexports");
    let out = s.cli(&["volume", "create", "second", "--size", "32MiB"]);
    assert!(out.status.success(), "{out:?}");
    let info = nbdinfo_json(&s.url("second"));
    assert_eq!(info["export-size"].as_u64(), Some(32 * MIB), "{info}");

    // The same offsets on both volumes, different data.
    qemu_io(&s.url("vol0"), &[format!("write -P 0xa0 0 {}", 4 * MIB)]);
    qemu_io(&s.url("second"), &[format!("write -P 0xb0 0 {}", 2 * MIB)]);
    let second = dir.path().join("second.raw");
    let second_image = random_bytes(99, (8 * MIB) as usize);
    std::fs::write(&second, &second_image).unwrap();
    qemu_io(
        &s.url("vol0"),
        &[format!("write -P 0xa1 {} {}", 16 * MIB, 8 * MIB)],
    );
    // nbdcopy writes the 8 MiB file over the start of `second`.
    nbdcopy(&[second.to_str().unwrap(), &s.url("second")]);
    qemu_io(
        &s.url("second"),
        &[format!("write -P 0xb1 {} {}", 16 * MIB, MIB)],
    );

    check_across_restarts(&mut s, "two exports", |s| {
        qemu_io(
            &s.url("vol0"),
            &[
                format!("read -P 0xa0 0 {}", 4 * MIB),
                format!("read -P 0 {} {}", 4 * MIB, 12 * MIB),
                format!("read -P 0xa1 {} {}", 16 * MIB, 8 * MIB),
                format!("read -P 0 {} {}", 24 * MIB, 40 * MIB),
            ],
        );
        qemu_io(&s.url(""), &[format!("read -P 0xa0 0 {}", 4 * MIB)]);
        let back = read_back(s, "second", dir.path());
        assert_eq!(back.len() as u64, 32 * MIB);
        assert_eq!(
            first_difference(&back[..(8 * MIB) as usize], &second_image),
            None
        );
        assert!(back[(8 * MIB) as usize..(16 * MIB) as usize]
            .iter()
            .all(|&b| b == 0));
        assert!(back[(16 * MIB) as usize..(17 * MIB) as usize]
            .iter()
            .all(|&b| b == 0xb1));
        assert!(back[(17 * MIB) as usize..].iter().all(|&b| b == 0));
    });
    assert!(s.stop().success(), "{}", s.log());
}

#[test]
fn direct_io_log_with_immediate_dispatch_keeps_data_across_kill9() {
    // The same qemu-io plan on a log opened with O_DIRECT|O_DSYNC and T_wait = 0.
    require("qemu-io");
    let dir = scratch("directio");
    let flags = ["--direct-io", "--t-wait-us", "0"];
    let mut args = SMALL.to_vec();
    args.extend_from_slice(&flags);
    let mut s = Server::start(&dir.path().join("data"), &args);
    let plan = qemu_io_plan();
    qemu_io(&s.url("vol0"), &qemu_io_plan_commands(&plan));
    let reads: Vec<String> = expected_runs(&plan)
        .iter()
        .map(|&(p, off, len)| format!("read -P {p:#x} {off} {len}"))
        .collect();
    qemu_io(&s.url("vol0"), &reads);
    s.restart_after_kill9(&flags);
    qemu_io(&s.url("vol0"), &reads);
    assert!(s.stop().success(), "{}", s.log());
}

fn qemu_io_plan_commands(plan: &[(Option<u8>, u64, u64)]) -> Vec<String> {
    plan.iter()
        .map(|&(p, off, len)| match p {
            Some(0) => format!("write -z {off} {len}"),
            Some(p) => format!("write -P {p:#x} {off} {len}"),
            None => format!("discard {off} {len}"),
        })
        .collect()
}

/// Checks the allocation map against the plan: written data is data, never-written space a
/// hole, zeroed or trimmed space reads as zero (`trimmed_hole`: and is a hole).
fn check_map(url: &str, plan: &[(Option<u8>, u64, u64)], trimmed_hole: bool) {
    let map = nbd_map(url);
    assert_eq!(
        map.iter().map(|e| e.1).sum::<u64>(),
        VOLUME_BYTES,
        "{map:?}"
    );
    // Sector by sector: what the plan last did there.
    let mut last: Vec<Option<Option<u8>>> = vec![None; (VOLUME_BYTES / 512) as usize];
    for &(p, off, len) in plan {
        for s in &mut last[(off / 512) as usize..((off + len) / 512) as usize] {
            *s = Some(p);
        }
    }
    // The map may be as coarse as the image file's 4 KiB blocks: a block holding any data
    // may be reported as data throughout. Data must never be reported as a hole or zero.
    let data_in_block = |sector: usize| {
        let first = sector / 8 * 8;
        last[first..first + 8]
            .iter()
            .any(|p| matches!(p, Some(Some(b)) if *b != 0))
    };
    for &(off, len, typ) in &map {
        for sector in off / 512..(off + len) / 512 {
            if typ == 0 && data_in_block(sector as usize) {
                continue;
            }
            let ok = match last[sector as usize] {
                None => typ == 3,
                Some(Some(0)) => typ & 2 != 0,
                Some(None) if trimmed_hole => typ == 3,
                Some(None) => typ & 2 != 0,
                Some(Some(_)) => typ == 0,
            };
            assert!(
                ok,
                "sector {sector} (byte {}): type {typ} after {:?}; map {map:?}",
                sector * 512,
                last[sector as usize]
            );
        }
    }
}

#[test]
fn reads_see_acknowledged_writes_before_they_are_applied() {
    // With applying paused, every read and the allocation map come from the log alone.
    require("qemu-io");
    require("nbdinfo");
    let dir = scratch("unapplied");
    let mut args = SMALL.to_vec();
    args.push("--test-pause-apply");
    let mut s = Server::start(&dir.path().join("data"), &args);
    let plan = qemu_io_plan();
    qemu_io(&s.url("vol0"), &qemu_io_plan_commands(&plan));
    assert_eq!(
        s.metric("mariner_store_applied_seq"),
        0.0,
        "applying was not paused"
    );
    assert!(s.metric("mariner_apply_lag_records") >= plan.len() as f64);
    let reads: Vec<String> = expected_runs(&plan)
        .iter()
        .map(|&(p, off, len)| format!("read -P {p:#x} {off} {len}"))
        .collect();
    qemu_io(&s.url("vol0"), &reads);
    check_map(&s.url("vol0"), &plan, false);
    // Then the same after the log is replayed and applied.
    s.restart_after_kill9(&[]);
    assert!(s.metric("mariner_recovery_records") >= plan.len() as f64);
    qemu_io(&s.url("vol0"), &reads);
    wait_applied(&s);
    qemu_io(&s.url("vol0"), &reads);
    check_map(&s.url("vol0"), &plan, true);
    assert!(s.stop().success(), "{}", s.log());
}

#[test]
fn writing_several_times_the_log_size_keeps_the_latest_data() {
    // A 64 MiB log under 3 x 64 MiB of writes: log space must be reused behind the store.
    require("nbdcopy");
    require("qemu-img");
    let (dir, mut s) = {
        let dir = scratch("wrap");
        let s = Server::start(&dir.path().join("data"), SMALL);
        (dir, s)
    };
    let src = dir.path().join("src.raw");
    let mut image = Vec::new();
    for round in 0..3u64 {
        image = random_bytes(1000 + round, VOLUME_BYTES as usize);
        std::fs::write(&src, &image).unwrap();
        nbdcopy(&[src.to_str().unwrap(), &s.url("vol0")]);
        assert_identical(src.to_str().unwrap(), &s.url("vol0"));
    }
    let written = s.metric("mariner_log_bytes_written_total");
    assert!(
        written > 3.0 * VOLUME_BYTES as f64,
        "log bytes written {written}"
    );
    s.restart_after_kill9(&[]);
    let back = read_back(&s, "vol0", dir.path());
    assert_eq!(first_difference(&back, &image), None, "after kill -9");
    s.restart_after_sigterm(&[]);
    assert_identical(src.to_str().unwrap(), &s.url("vol0"));
    assert!(s.stop().success(), "{}", s.log());
}
