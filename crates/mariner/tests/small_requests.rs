//! Requests smaller than a block, from real clients against the real binary: qemu-io sends a
//! 256-byte write and a 100-byte read at odd offsets as they are (the server advertises a
//! minimum block size of 1), and the nbdfuse + fuse2fs stack, whose 256-byte inode writes the
//! server once refused, keeps a copied tree across unmounts and passes `e2fsck -fn`.
//!
//! FUSE needs root (CI runs the suite as root). Every mount is undone by a guard even when a
//! check fails, and every external command runs under `timeout`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output};
use std::time::{Duration, Instant};

/// The most any one external command may take.
const COMMAND_SECONDS: u64 = 300;

/// `cmd` under `timeout` (SIGKILL 10 s after the SIGTERM), so a hung FUSE request cannot hang
/// the test; returns the output whatever the status.
fn bounded(cmd: &mut Command) -> Output {
    let mut t = Command::new("timeout");
    t.args(["--kill-after=10", &COMMAND_SECONDS.to_string()])
        .arg(cmd.get_program())
        .args(cmd.get_args());
    t.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

/// Like `run`, bounded in time.
fn run_bounded(cmd: &mut Command) -> String {
    let out = bounded(cmd);
    assert_success(cmd, &out)
}

fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn is_mounted(dir: &Path) -> bool {
    let dir = dir.to_str().unwrap();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(dir))
}

/// A FUSE file system served by a foreground child process; unmounted (lazily if it must be)
/// and its process reaped on drop.
struct Mount {
    dir: PathBuf,
    child: Option<Child>,
    /// Where the process's stderr goes.
    stderr: PathBuf,
    /// `fusermount3` for libfuse 3 (nbdfuse), `fusermount` for libfuse 2 (fuse2fs).
    fusermount: &'static str,
    what: &'static str,
}

impl Mount {
    /// Starts `cmd` (which must stay in the foreground) and waits until `dir` is mounted.
    fn start(mut cmd: Command, dir: &Path, fusermount: &'static str, what: &'static str) -> Mount {
        std::fs::create_dir_all(dir).unwrap();
        let dir = dir.canonicalize().unwrap();
        let stderr = dir.with_extension("stderr");
        let child = cmd
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let mut m = Mount {
            dir,
            child: Some(child),
            stderr,
            fusermount,
            what,
        };
        let start = Instant::now();
        while !is_mounted(&m.dir) {
            if let Some(status) = m.child.as_mut().unwrap().try_wait().unwrap() {
                m.child = None;
                panic!(
                    "{what} exited with {status} before mounting: {}",
                    m.errors()
                );
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "{what}: not mounted in 60 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        m
    }

    /// What the process wrote to stderr so far.
    fn errors(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Unmounts, waits for the process to finish its work and exit, and asserts it exited 0;
    /// returns the errors it reported (fuse2fs exits 0 after failing to write the superblock
    /// when it closes the file system).
    fn unmount(self) -> Vec<String> {
        let what = self.what;
        let stderr = self.stderr.clone();
        let status = self.unmount_status();
        let errors = std::fs::read_to_string(&stderr).unwrap_or_default();
        assert!(status.success(), "{what} exited with {status}: {errors}");
        // e2fsprogs reports a failure as "<error> while <doing>", libnbd as "<call>: <error>".
        errors
            .lines()
            .filter(|l| {
                [" while ", "Invalid argument", "nbd_"]
                    .iter()
                    .any(|b| l.contains(b))
            })
            .map(|l| format!("{what}: {l}"))
            .collect()
    }

    fn unmount_status(mut self) -> ExitStatus {
        run_bounded(Command::new(self.fusermount).arg("-u").arg(&self.dir));
        let mut child = self.child.take().unwrap();
        let start = Instant::now();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            if start.elapsed() > Duration::from_secs(COMMAND_SECONDS) {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "{}: no exit {COMMAND_SECONDS} s after the unmount",
                    self.what
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if is_mounted(&self.dir) {
            let _ = bounded(
                Command::new(self.fusermount)
                    .arg("-u")
                    .arg("-z")
                    .arg(&self.dir),
            );
        }
        let start = Instant::now();
        while child.try_wait().ok().flatten().is_none() && start.elapsed() < Duration::from_secs(30)
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// `nbdfuse <dir> <url>`: the export as the file `<dir>/nbd`.
fn nbdfuse(dir: &Path, url: &str) -> Mount {
    let mut cmd = Command::new("nbdfuse");
    cmd.arg(dir).arg(url);
    let m = Mount::start(cmd, dir, "fusermount3", "nbdfuse");
    let image = m.dir.join("nbd");
    wait_until("nbdfuse's file", Duration::from_secs(30), || image.exists());
    m
}

/// `fuse2fs -f <image> <dir>`, in the foreground so the unmount can wait for it to close the
/// file system.
fn fuse2fs(image: &Path, dir: &Path, options: &str) -> Mount {
    let mut cmd = Command::new("fuse2fs");
    cmd.arg(image).arg(dir).arg("-f").args(["-o", options]);
    Mount::start(cmd, dir, "fusermount", "fuse2fs")
}

/// A tree of files of many sizes (empty, under a block, odd, several MiB), nested directories
/// and a symlink.
fn make_tree(root: &Path) {
    let sizes = [
        0usize, 1, 100, 511, 4095, 4096, 4097, 70_001, 300_000, 1_500_003,
    ];
    for d in 0..4 {
        let dir = root.join(format!("dir{d}")).join(format!("sub{d}"));
        std::fs::create_dir_all(&dir).unwrap();
        for (i, &len) in sizes.iter().enumerate() {
            let seed = (d * 100 + i) as u64;
            std::fs::write(dir.join(format!("f{i}.bin")), random_bytes(seed, len)).unwrap();
        }
    }
    std::os::unix::fs::symlink("dir0/sub0/f3.bin", root.join("link")).unwrap();
}

/// `diff -r` of the source tree and a mounted copy (which also holds mkfs's lost+found).
fn diff(tree: &Path, copy: &Path) {
    run_bounded(
        Command::new("diff")
            .args(["-r", "--no-dereference", "-x", "lost+found"])
            .arg(tree)
            .arg(copy),
    );
}

#[test]
fn nbdfuse_and_fuse2fs_keep_a_copied_tree_across_unmounts() {
    for tool in [
        "nbdfuse",
        "fuse2fs",
        "mkfs.ext4",
        "e2fsck",
        "fusermount",
        "fusermount3",
        "timeout",
    ] {
        require(tool);
    }
    let dir = scratch("fuse2fs");
    let s = Server::start(&dir.path().join("data"), SMALL);
    let tree = dir.path().join("tree");
    make_tree(&tree);
    let nbd = nbdfuse(&dir.path().join("nbd"), &s.url("vol0"));
    let image = nbd.dir.join("nbd");
    // 4 KiB blocks and 256-byte inodes (ext4's defaults above 512 MiB): fuse2fs writes one
    // inode as 256 bytes at a 256-byte offset.
    run_bounded(
        Command::new("mkfs.ext4")
            .args(["-F", "-q", "-b", "4096", "-I", "256"])
            .arg(&image),
    );
    let mnt = dir.path().join("mnt");
    let fs = fuse2fs(&image, &mnt, "rw");
    run_bounded(
        Command::new("cp")
            .arg("-a")
            .arg(tree.join("."))
            .arg(&fs.dir),
    );
    run_bounded(&mut Command::new("sync"));
    diff(&tree, &fs.dir);
    let close_errors = fs.unmount();

    let fsck = bounded(Command::new("e2fsck").arg("-fn").arg(&image));
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&fsck.stdout),
        String::from_utf8_lossy(&fsck.stderr)
    );
    // A summary count left stale (a lost superblock write) is a question e2fsck answers "no"
    // to under -n, and it still exits 0.
    assert!(
        fsck.status.success() && !report.contains("Fix?") && close_errors.is_empty(),
        "e2fsck -fn after the unmount ({}):\n{report}\nerrors while mounted: {close_errors:#?}",
        fsck.status
    );

    let fs = fuse2fs(&image, &mnt, "ro");
    diff(&tree, &fs.dir);
    assert_eq!(fs.unmount(), Vec::<String>::new(), "read-only mount");
    assert_eq!(nbd.unmount(), Vec::<String>::new(), "nbdfuse");
}

/// qemu-io's output for `cmds` (each a `-c` command) on `url`, asserting it exits 0 and reports
/// no failed command.
fn qemu_io(url: &str, cmds: &[&str]) -> String {
    let mut cmd = Command::new("qemu-io");
    cmd.args(["-f", "raw"]);
    for c in cmds {
        cmd.args(["-c", c]);
    }
    let out = run_bounded(cmd.arg(url));
    for bad in ["failed", "error", "Error"] {
        assert!(!out.contains(bad), "qemu-io {cmds:?}: {out}");
    }
    out
}

/// The bytes of qemu-io's `read -v` hex dump (`00000000:  ab ab ... ascii`).
fn hex_dump_bytes(out: &str) -> Vec<u8> {
    out.lines()
        .filter_map(|l| l.split_once(":  "))
        .flat_map(|(_, rest)| {
            rest.split_whitespace()
                .take_while(|w| w.len() == 2)
                .map(|w| u8::from_str_radix(w, 16).unwrap())
                .collect::<Vec<_>>()
        })
        .collect()
}

const WRITE_BYTES: &str = "mariner_volume_write_bytes_total{volume=\"vol0\"}";
const READ_BYTES: &str = "mariner_volume_read_bytes_total{volume=\"vol0\"}";

#[test]
fn qemu_io_sends_a_256_byte_write_and_a_100_byte_read_as_they_are() {
    require("qemu-io");
    let dir = scratch("qemu-bytes");
    let s = Server::start(&dir.path().join("data"), SMALL);
    let url = s.url("vol0");
    // Surround the target with data, so a write that lost its neighbours shows.
    qemu_io(&url, &["write -P 0x11 0 4096"]);
    let written = s.metric(WRITE_BYTES);
    qemu_io(&url, &["write -P 0xab 1001 256"]);
    // The server got 256 bytes, not the covering blocks a client pads an unaligned write to
    // when the server refuses partial blocks.
    assert_eq!(
        s.metric(WRITE_BYTES) - written,
        256.0,
        "bytes the server was asked to write"
    );
    let read = s.metric(READ_BYTES);
    let out = qemu_io(&url, &["read -v 997 100"]);
    assert_eq!(
        s.metric(READ_BYTES) - read,
        100.0,
        "bytes the server was asked to read"
    );
    let mut want = vec![0x11u8; 4];
    want.extend_from_slice(&[0xab; 96]);
    assert_eq!(hex_dump_bytes(&out), want, "read -v 997 100:\n{out}");
    // Every byte around the write is as it was.
    qemu_io(
        &url,
        &[
            "read -P 0x11 0 1001",
            "read -P 0xab 1001 256",
            "read -P 0x11 1257 2839",
        ],
    );
}
