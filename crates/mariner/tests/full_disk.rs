//! A full disk: the data directory on a 300 MiB tmpfs, a thin volume larger than the room
//! left. The write that cannot be stored gets ENOSPC (not EPERM), only that volume refuses
//! writes and `volume list` and /metrics say why, every acknowledged write reads back, and
//! once space is freed the volume takes writes again without a restart.
//!
//! Needs root (to mount the tmpfs); run as root, as scripts/test.sh does in CI.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::*;

/// History off: its base images and index would share the 300 MiB with the images, and this
/// test is about the store's images filling the file system.
const ARGS: &[&str] = &[
    "--log-size",
    "64MiB",
    "--default-volume-size",
    "1GiB",
    "--no-history",
];

/// A tmpfs mounted for the test, unmounted when dropped (after the server, declared later,
/// has been killed).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Tmpfs {
        let uid = run(Command::new("id").arg("-u"));
        assert_eq!(
            uid.trim(),
            "0",
            "full_disk mounts a tmpfs and must run as root (scripts/test.sh runs the suite as root)"
        );
        std::fs::create_dir_all(at).unwrap();
        run(Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("size={size}"))
            .arg("tmpfs")
            .arg(at));
        Tmpfs(at.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(&self.0)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

/// qemu-io, bounded in time: a write waiting on a full log would otherwise hang the test.
fn qemu_io(args: &[&str], url: &str, cmds: &[String]) -> Output {
    let mut c = Command::new("timeout");
    c.args(["-k", "10", "120", "qemu-io"]);
    c.args(args).args(["-f", "raw"]);
    for cmd in cmds {
        c.arg("-c").arg(cmd);
    }
    c.arg(url).output().unwrap()
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr)
}

/// The pattern byte of 1 MiB chunk `i` of the big volume.
fn pattern(i: u64) -> u64 {
    i % 250 + 1
}

/// Writes chunk `i` (1 MiB at `i` MiB); the client's output on failure.
fn write_chunk(url: &str, i: u64, p: u64) -> Result<(), Output> {
    let out = qemu_io(&[], url, &[format!("write -P {p} {}M 1M", i)]);
    if out.status.success() && text(&out).contains("wrote 1048576/1048576") {
        Ok(())
    } else {
        Err(out)
    }
}

/// Reads every chunk of `chunks` (index, pattern) back in one client run, read-only.
fn assert_chunks(url: &str, chunks: &[(u64, u64)], when: &str) {
    for part in chunks.chunks(64) {
        let cmds: Vec<String> = part
            .iter()
            .map(|(i, p)| format!("read -P {p} {i}M 1M"))
            .collect();
        let out = qemu_io(&["-r"], url, &cmds);
        let t = text(&out);
        let ok = t.matches("read 1048576/1048576").count();
        assert!(
            out.status.success() && ok == part.len() && !t.contains("verification failed"),
            "{when}: {ok} of {} chunks read back ({}): {t}",
            part.len(),
            out.status
        );
    }
}

/// The line of `volume list` for `name`.
fn list_line(s: &Server, name: &str) -> String {
    let out = s.cli(&["volume", "list"]);
    assert!(out.status.success(), "volume list: {out:?}");
    let list = String::from_utf8_lossy(&out.stdout).to_string();
    list.lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no {name} in:\n{list}"))
        .to_string()
}

fn out_of_space(s: &Server, volume: &str) -> f64 {
    s.metric(&format!(
        "mariner_volume_out_of_space{{volume=\"{volume}\"}}"
    ))
}

/// Fills the big volume chunk by chunk until a write fails; returns the chunks written.
fn fill(url: &str) -> (Vec<(u64, u64)>, Output) {
    let mut acked = Vec::new();
    for i in 0..1024 {
        match write_chunk(url, i, pattern(i)) {
            Ok(()) => acked.push((i, pattern(i))),
            Err(out) => return (acked, out),
        }
    }
    panic!("1 GiB written to a 300 MiB file system without an error");
}

#[test]
fn a_full_disk_refuses_writes_with_enospc_and_recovers_when_space_is_freed() {
    require("qemu-io");
    require("fallocate");
    require("curl");
    let dir = scratch("full_disk");
    let data = dir.path().join("data");
    let _fs = Tmpfs::mount(&data, "300m");
    let mut s = Server::start(&data, ARGS);
    let ok = s.cli(&["volume", "create", "small", "--size", "64MiB"]);
    assert!(ok.status.success(), "volume create: {ok:?}");
    let (big, small) = (s.url("vol0"), s.url("small"));
    write_chunk(&small, 0, 201).unwrap();
    // Room for the images: 300 MiB less the 64 MiB log and this ballast, freed later.
    let ballast = data.join("ballast");
    run(Command::new("fallocate")
        .args(["-l", "100MiB"])
        .arg(&ballast));

    let (mut acked, failed) = fill(&big);
    let t = text(&failed);
    assert!(
        !failed.status.success(),
        "qemu-io exits non-zero on the failed write: {t}"
    );
    assert!(
        t.contains("No space left on device"),
        "ENOSPC expected: {t}"
    );
    assert!(!t.contains("not permitted"), "EPERM is for read-only: {t}");
    assert!(acked.len() as u64 >= 64, "only {} MiB stored", acked.len());
    let stuck = acked.len() as u64;
    eprintln!("{stuck} MiB stored, then: {}", t.trim());

    // Only the big volume refuses writes, and says why.
    let line = list_line(&s, "vol0");
    assert!(line.contains("read-only: out of space"), "{line}");
    assert!(line.contains("No space left on device"), "{line}");
    assert!(
        list_line(&s, "small").ends_with(" ok"),
        "{}",
        list_line(&s, "small")
    );
    assert_eq!(out_of_space(&s, "vol0"), 1.0);
    assert_eq!(out_of_space(&s, "small"), 0.0);
    assert_eq!(s.metric("mariner_volume_read_only{volume=\"vol0\"}"), 1.0);
    assert_eq!(
        s.metric("mariner_store_failed"),
        0.0,
        "out of space is no failure"
    );
    assert_eq!(s.metric("mariner_log_failed"), 0.0);
    let again = write_chunk(&big, stuck, 7).unwrap_err();
    assert!(
        text(&again).contains("No space left on device"),
        "{}",
        text(&again)
    );

    // Reads see every acknowledged write; the other volume still takes writes (they wait in
    // the log behind the big volume's records, which is why it cannot be more than that).
    assert_chunks(&big, &acked, "out of space");
    write_chunk(&small, 1, 202).unwrap();
    assert_chunks(&small, &[(0, 201), (1, 202)], "other volume, out of space");

    // Free space: the volume takes writes again without a restart.
    std::fs::remove_file(&ballast).unwrap();
    let start = Instant::now();
    while out_of_space(&s, "vol0") != 0.0 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "still out of space 60 s after space was freed: {}",
            s.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("writable again {:?} after space was freed", start.elapsed());
    assert!(
        list_line(&s, "vol0").ends_with(" ok"),
        "{}",
        list_line(&s, "vol0")
    );
    for i in stuck..stuck + 16 {
        write_chunk(&big, i, pattern(i)).unwrap_or_else(|o| panic!("after freeing: {}", text(&o)));
        acked.push((i, pattern(i)));
    }
    assert_chunks(&big, &acked, "space freed");

    s.restart_after_sigterm(ARGS);
    let (big, small) = (s.url("vol0"), s.url("small"));
    assert_chunks(&big, &acked, "after restart");
    assert_chunks(&small, &[(0, 201), (1, 202)], "other volume, after restart");
    assert!(
        list_line(&s, "vol0").ends_with(" ok"),
        "{}",
        list_line(&s, "vol0")
    );
    s.kill();
}
