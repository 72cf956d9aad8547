//! Requests smaller than a block, from real clients against the real binary: qemu-io sends a
//! 256-byte write and a 100-byte read at odd offsets as they are (the server advertises a
//! minimum block size of 1), and the nbdfuse + fuse2fs stack, whose 256-byte inode writes the
//! server once refused, keeps a copied tree across unmounts and passes `e2fsck -fn`.
//!
//! FUSE needs root (CI runs the suite as root); the mounts are common::fuse's.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::fuse::*;
use common::*;
use std::path::Path;
use std::process::Command;

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
