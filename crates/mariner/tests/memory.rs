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

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

const LIMIT_BYTES: u64 = 256 << 20;
const LOG_BYTES: u64 = 64 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    V1,
    V2,
}

/// A memory cgroup made for this test; removed (its processes killed first) when dropped.
struct Cgroup {
    path: PathBuf,
    version: Version,
}

impl Cgroup {
    fn create(limit: u64) -> Cgroup {
        let name = format!("mariner-memtest.{}.{}", std::process::id(), nanos());
        let (path, version) = if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
            (Path::new("/sys/fs/cgroup").join(&name), Version::V2)
        } else if Path::new("/sys/fs/cgroup/memory").is_dir() {
            (Path::new("/sys/fs/cgroup/memory").join(&name), Version::V1)
        } else {
            panic!("no memory cgroup controller on this machine (neither v2 nor v1)");
        };
        std::fs::create_dir(&path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
        let cg = Cgroup { path, version };
        match version {
            Version::V2 => {
                cg.write("memory.max", &limit.to_string());
                // No swap on most test machines; where there is, keep it out of the picture.
                let _ = std::fs::write(cg.path.join("memory.swap.max"), "0");
            }
            Version::V1 => cg.write("memory.limit_in_bytes", &limit.to_string()),
        }
        cg
    }

    fn write(&self, file: &str, value: &str) {
        let p = self.path.join(file);
        std::fs::write(&p, value).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
    }

    fn read(&self, file: &str) -> Option<String> {
        std::fs::read_to_string(self.path.join(file)).ok()
    }

    /// A `key value` line of a flat-keyed file (memory.events, memory.oom_control).
    fn key(&self, file: &str, key: &str) -> Option<u64> {
        let text = self.read(file)?;
        text.lines()
            .filter_map(|l| l.split_once(' '))
            .find(|(k, _)| *k == key)
            .and_then(|(_, v)| v.trim().parse().ok())
    }

    fn value(&self, file: &str) -> Option<u64> {
        self.read(file).and_then(|t| t.trim().parse().ok())
    }

    fn procs_file(&self) -> PathBuf {
        self.path.join("cgroup.procs")
    }

    /// Peak usage (process memory and page cache) since creation.
    fn peak(&self) -> Option<u64> {
        match self.version {
            Version::V2 => self.value("memory.peak"),
            Version::V1 => self.value("memory.max_usage_in_bytes"),
        }
    }

    /// Processes the kernel OOM-killed in this cgroup (None: the kernel does not say).
    fn oom_kills(&self) -> Option<u64> {
        match self.version {
            Version::V2 => self.key("memory.events", "oom_kill"),
            Version::V1 => self.key("memory.oom_control", "oom_kill"),
        }
    }

    /// How often usage hit the limit (and page cache was reclaimed): informative only, hitting
    /// the limit is expected when the page cache counts.
    fn limit_hits(&self) -> Option<u64> {
        match self.version {
            Version::V2 => self.key("memory.events", "max"),
            Version::V1 => self.value("memory.failcnt"),
        }
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            let procs = self.read("cgroup.procs").unwrap_or_default();
            for pid in procs.split_whitespace() {
                let _ = Command::new("kill").args(["-9", pid]).status();
            }
            if std::fs::remove_dir(&self.path).is_ok() || !self.path.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("could not remove cgroup {}", self.path.display());
    }
}

fn nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

fn require_root() {
    let uid = run(Command::new("id").arg("-u"));
    assert_eq!(
        uid.trim(),
        "0",
        "the memory test creates a memory cgroup and needs root: run the suite as root \
         (CI does), e.g. `sudo -E cargo test --release -p mariner --test memory`"
    );
}

/// Starts `mariner serve` as the first process of `cg` (the shell joins the cgroup, then execs
/// the server, so the server and everything it allocates or caches is charged there).
fn start_in_cgroup(cg: &Cgroup, data: &Path, extra: &[&str]) -> Server {
    let mut launcher = Command::new("sh");
    launcher
        .arg("-c")
        .arg(r#"echo $$ > "$0" && exec "$@""#)
        .arg(cg.procs_file())
        .arg(mariner_bin());
    Server::launch(launcher, data, extra)
}

/// The server's peak resident set (VmHWM), from /proc.
fn vm_hwm(s: &mut Server) -> Option<String> {
    let pid = s.child.as_ref()?.id();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmHWM"))
        .map(|l| l.split_whitespace().skip(1).collect::<Vec<_>>().join(" "))
}

fn assert_alive(s: &mut Server, cg: &Cgroup, when: &str) {
    let status = s.child.as_mut().unwrap().try_wait().unwrap();
    assert!(
        status.is_none(),
        "{when}: the server died ({status:?}; oom_kill {:?}): {}",
        cg.oom_kills(),
        s.log()
    );
    assert_eq!(
        cg.oom_kills().unwrap_or(0),
        0,
        "{when}: the kernel OOM-killed in the cgroup"
    );
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

/// Copies `src` onto the volume with nbdcopy (its defaults: 4 connections, 64 requests of 256 KiB
/// in flight each); on failure, says whether the server died and why.
fn copy_in(s: &mut Server, cg: &Cgroup, src: &Path) {
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
    require_root();
    require("nbdcopy");
    require("qemu-img");
    let dir = scratch(name);
    let data = dir.path().join("data");
    let src = dir.path().join("src.raw");
    random_file(&src, write_bytes, 0x6d65_6d6f_7279 ^ write_bytes);

    let cg = Cgroup::create(LIMIT_BYTES);
    let log_size = LOG_BYTES.to_string();
    let vol_size = volume_bytes.to_string();
    let args = ["--log-size", &log_size, "--default-volume-size", &vol_size];
    let started = Instant::now();
    let mut s = start_in_cgroup(&cg, &data, &args);
    copy_in(&mut s, &cg, &src);
    let wrote = started.elapsed();
    assert_alive(&mut s, &cg, "after writing");
    run(Command::new("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(&src)
        .arg(s.url("")));
    assert_alive(&mut s, &cg, "after reading back");

    let hwm = vm_hwm(&mut s).unwrap_or_else(|| "?".into());
    println!(
        "{name} (cgroup {:?}): wrote {} ({}x the {} log) into a {} volume in {:.1} s, read back \
         identical; cgroup peak {} of limit {}; server VmHWM {hwm}; limit hits {:?}; oom kills {:?}",
        cg.version,
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

/// The issue's requirement: 4× (here 5×) the log size into a volume, within 256 MiB.
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
