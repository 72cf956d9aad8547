//! Memory bound: the server, inside a 256 MiB memory cgroup whose limit includes its page cache,
//! takes many times its log size of writes (so the log wraps and the store applies under
//! pressure), is not OOM-killed, and serves the data back unchanged: 5× the log into a 512 MiB
//! volume, and 16× into a 2 GiB one (the bound must not depend on either).
//!
//! Supports cgroup v2 (`/sys/fs/cgroup/cgroup.controllers`) and v1 (`/sys/fs/cgroup/memory`), the
//! way the `in-memcg` tool does. Needs root: CI runs the suite as root; anywhere else the test
//! fails with a message saying so rather than silently passing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use common::*;

const LIMIT_BYTES: u64 = 256 << 20;
const LOG_BYTES: u64 = 64 << 20;

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

/// Copies `src` onto the volume with nbdcopy (its defaults: 4 connections, 64 requests of 256 KiB
/// in flight each); on failure, says whether the server died and why.
fn copy_in(s: &mut Server, cg: &MemCgroup, src: &Path) {
    let out = Command::new("nbdcopy")
        .arg(src)
        .arg(s.url(""))
        .output()
        .unwrap();
    if !out.status.success() {
        let status = s.child.as_mut().unwrap().try_wait().unwrap();
        panic!(
            "nbdcopy failed: {}; server {}; cgroup oom_kill {:?}, peak {}",
            String::from_utf8_lossy(&out.stderr).trim(),
            status.map_or("still alive".into(), |st| format!("died: {st}")),
            cg.oom_kills(),
            cg.peak().map_or("?".into(), mib)
        );
    }
}

/// Writes `write_bytes` of random data into a fresh `volume_bytes` volume of a server in a
/// 256 MiB cgroup, checks it survived and reads the data back identical.
fn fill_in_cgroup(name: &str, volume_bytes: u64, write_bytes: u64) {
    require_root("the memory test creates a memory cgroup and");
    require("nbdcopy");
    require("qemu-img");
    let dir = scratch(name);
    let data = dir.path().join("data");
    let src = dir.path().join("src.raw");
    random_file(&src, write_bytes, 0x6d65_6d6f_7279 ^ write_bytes);

    let cg = MemCgroup::create(LIMIT_BYTES);
    let log_size = LOG_BYTES.to_string();
    let vol_size = volume_bytes.to_string();
    let args = ["--log-size", &log_size, "--default-volume-size", &vol_size];
    let started = Instant::now();
    let mut s = cg.start_server(&data, &args);
    copy_in(&mut s, &cg, &src);
    let wrote = started.elapsed();
    cg.assert_alive(&mut s, "after writing");
    run(Command::new("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(&src)
        .arg(s.url("")));
    cg.assert_alive(&mut s, "after reading back");

    let hwm = hwm_kib(s.pid());
    println!(
        "{name} (cgroup {}): wrote {} ({}x the {} log) into a {} volume in {:.1} s, read back \
         identical; cgroup peak {} of limit {}; server VmHWM {hwm} kB; limit hits {:?}; oom kills {:?}",
        cg.version(),
        mib(write_bytes),
        write_bytes / LOG_BYTES,
        mib(LOG_BYTES),
        mib(volume_bytes),
        wrote.as_secs_f64(),
        cg.peak().map_or("?".into(), mib),
        mib(LIMIT_BYTES),
        cg.limit_hits(),
        cg.oom_kills()
    );
    assert!(s.stop().success(), "unclean exit on SIGTERM: {}", s.log());
}

/// The requirement: 4× (here 5×) the log size into a volume, within 256 MiB.
#[test]
fn writing_five_times_the_log_fits_in_256_mib() {
    fill_in_cgroup("memory-5x", 512 << 20, 5 * LOG_BYTES);
}

/// The bound must not depend on how much is written or how big the volume is: 16× the log into
/// a 2 GiB volume, same 256 MiB.
#[test]
fn writing_sixteen_times_the_log_into_a_larger_volume_fits_in_256_mib() {
    fill_in_cgroup("memory-16x", 2 << 30, 16 * LOG_BYTES);
}
