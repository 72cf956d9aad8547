//! End-to-end tests of starting a server: a data directory opens from any working directory
//! (and a data directory written by the release before, format 1, keeps opening); every TCP
//! port is bound before anything is created; a first start that fails leaves nothing behind;
//! a volume larger than the file system can hold is refused without a trace.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const MIB: u64 = 1 << 20;

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Asserts `o` failed (exit 1) and its message mentions every one of `needles`.
fn assert_fails(o: &Output, needles: &[&str], what: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(1), "{what}: {}: {err}", o.status);
    for n in needles {
        assert!(
            err.contains(n),
            "{what}: message {err:?} should mention {n:?}"
        );
    }
}

fn mariner_json(data: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(data.join("mariner.json")).unwrap()).unwrap()
}

/// Every path under `dir` (relative), with its size for files, sorted.
fn tree(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let meta = std::fs::symlink_metadata(e.path()).unwrap();
            let rel = e.path().strip_prefix(dir).unwrap().to_path_buf();
            if meta.is_dir() {
                todo.push(e.path());
                out.push((rel, 0));
            } else {
                out.push((rel, meta.len()));
            }
        }
    }
    out.sort();
    out
}

const SMALL_LOG: &[&str] = &["--log-size", "16MiB", "--default-volume-size", "16MiB"];

#[test]
fn a_data_directory_opens_from_any_working_directory() {
    require("qemu-io");
    let dir = scratch("anycwd");
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();

    // Created with a relative --data from A.
    let mut s = Server::start_in(&a, Path::new("mdata"), SMALL_LOG);
    qemu_io(&s.url("vol0"), &["write -P 0xa1 0 1M"]);
    assert!(s.stop().success(), "{}", s.log());
    assert_eq!(mariner_json(&a.join("mdata"))["log_devices"][0], "log/log0");

    // A directory of the same name in B, a data directory of its own with other data.
    let mut other = Server::start_in(&b, Path::new("mdata"), SMALL_LOG);
    qemu_io(&other.url("vol0"), &["write -P 0xb2 0 1M"]);
    assert!(other.stop().success(), "{}", other.log());

    // A's directory from B (relative --data): A's data, not B's log.
    let mut s = Server::start_in(&b, Path::new("../a/mdata"), &[]);
    qemu_io(
        &s.url("vol0"),
        &["read -P 0xa1 0 1M", "write -P 0xa3 1M 1M"],
    );
    assert!(s.stop().success(), "{}", s.log());
    // And from / (systemd-style), with an absolute --data.
    let mut s = Server::start_in(Path::new("/"), &a.join("mdata"), &[]);
    qemu_io(&s.url("vol0"), &["read -P 0xa1 0 1M", "read -P 0xa3 1M 1M"]);
    assert!(s.stop().success(), "{}", s.log());
    // B's directory, from A, still holds B's data.
    let mut other = Server::start_in(&a, Path::new("../b/mdata"), &[]);
    qemu_io(
        &other.url("vol0"),
        &["read -P 0xb2 0 1M", "read -P 0 1M 1M"],
    );
    assert!(other.stop().success(), "{}", other.log());
}

#[test]
fn log_devices_given_relative_are_recorded_so_they_open_from_anywhere() {
    require("qemu-io");
    let dir = scratch("relogdev");
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::create_dir_all(a.join("ext")).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    // One device outside the data directory, one inside it, both relative to A.
    let devs = [
        "--log-dev",
        "ext/log-a",
        "--log-dev",
        "mdata/own-log",
        "--log-size",
        "16MiB",
        "--default-volume-size",
        "16MiB",
    ];
    let mut s = Server::start_in(&a, Path::new("mdata"), &devs);
    qemu_io(&s.url("vol0"), &["write -P 0x5c 0 2M"]);
    assert!(s.stop().success(), "{}", s.log());
    let state = mariner_json(&a.join("mdata"));
    assert_eq!(state["format_version"], 2, "{state}");
    let ext = a.join("ext/log-a");
    assert_eq!(state["log_devices"][0], ext.to_str().unwrap(), "{state}");
    assert_eq!(state["log_devices"][1], "own-log", "{state}");

    // The same devices spelled from B are the same devices.
    let from_b = [
        "--log-dev",
        "../a/ext/log-a",
        "--log-dev",
        "../a/mdata/own-log",
    ];
    let mut s = Server::start_in(&b, Path::new("../a/mdata"), &from_b);
    qemu_io(&s.url("vol0"), &["read -P 0x5c 0 2M"]);
    assert!(s.stop().success(), "{}", s.log());
    // Without --log-dev, from /.
    let mut s = Server::start_in(Path::new("/"), &a.join("mdata"), &[]);
    qemu_io(&s.url("vol0"), &["read -P 0x5c 0 2M"]);
    assert!(s.stop().success(), "{}", s.log());
    // Other devices are still refused.
    let o = serve_must_exit(
        &b,
        Path::new("../a/mdata"),
        &["--listen", "127.0.0.1:0", "--iscsi-listen", "127.0.0.1:0"]
            .into_iter()
            .chain(["--log-dev", "ext/log-a", "--log-dev", "../a/mdata/own-log"])
            .collect::<Vec<_>>(),
    );
    assert_fails(&o, &["differ"], "other log devices");
}

/// Rewrites `data`'s mariner.json as the release before wrote it: format 1, log devices as
/// given relative to the working directory at creation (`created_as`).
fn make_format_1(data: &Path, created_as: &[&str]) {
    let mut state = mariner_json(data);
    state["format_version"] = 1.into();
    state["log_devices"] = created_as.iter().map(|p| Value::from(*p)).collect();
    std::fs::write(
        data.join("mariner.json"),
        serde_json::to_vec_pretty(&state).unwrap(),
    )
    .unwrap();
}

#[test]
fn a_format_1_data_directory_keeps_opening_and_is_converted() {
    require("qemu-io");
    let dir = scratch("format1");
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    let mut s = Server::start_in(&a, Path::new("mdata"), SMALL_LOG);
    qemu_io(&s.url("vol0"), &["write -P 0x71 0 1M"]);
    assert!(s.stop().success(), "{}", s.log());
    // A same-named data directory in B, whose log a cwd-relative reading would open.
    let mut other = Server::start_in(&b, Path::new("mdata"), SMALL_LOG);
    assert!(other.stop().success(), "{}", other.log());

    // As the release before wrote it with `--data mdata` from A.
    make_format_1(&a.join("mdata"), &["mdata/log/log0"]);
    // From the directory it was created in, as before.
    let mut s = Server::start_in(&a, Path::new("mdata"), &[]);
    qemu_io(&s.url("vol0"), &["read -P 0x71 0 1M"]);
    assert!(s.stop().success(), "{}", s.log());
    let state = mariner_json(&a.join("mdata"));
    assert_eq!(
        (&state["format_version"], &state["log_devices"][0]),
        (&Value::from(2), &Value::from("log/log0")),
        "converted: {state}"
    );

    // Format 1 again, opened from B, where mdata/log/log0 is B's own log.
    make_format_1(&a.join("mdata"), &["mdata/log/log0"]);
    let mut s = Server::start_in(&b, Path::new("../a/mdata"), &[]);
    qemu_io(
        &s.url("vol0"),
        &["read -P 0x71 0 1M", "write -P 0x72 1M 1M"],
    );
    assert!(s.stop().success(), "{}", s.log());
    assert_eq!(mariner_json(&a.join("mdata"))["log_devices"][0], "log/log0");
    // And from /.
    make_format_1(&a.join("mdata"), &["mdata/log/log0"]);
    let mut s = Server::start_in(Path::new("/"), &a.join("mdata"), &[]);
    qemu_io(&s.url("vol0"), &["read -P 0x71 0 1M", "read -P 0x72 1M 1M"]);
    assert!(s.stop().success(), "{}", s.log());
    assert_eq!(mariner_json(&a.join("mdata"))["format_version"], 2);

    // Created with an absolute --data, then moved: the recorded path no longer exists.
    let old_abs = a.join("mdata/log/log0");
    let moved = b.join("moved");
    std::fs::rename(a.join("mdata"), &moved).unwrap();
    make_format_1(&moved, &[old_abs.to_str().unwrap()]);
    let mut s = Server::start_in(Path::new("/"), &moved, &[]);
    qemu_io(&s.url("vol0"), &["read -P 0x71 0 1M", "read -P 0x72 1M 1M"]);
    assert!(s.stop().success(), "{}", s.log());
    assert_eq!(mariner_json(&moved)["log_devices"][0], "log/log0");
}

/// A listener holding a port, so the server cannot have it.
fn busy_port() -> (std::net::TcpListener, String) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    (l, addr)
}

#[test]
fn a_busy_port_is_reported_before_anything_is_created() {
    let dir = scratch("busyport");
    let (_held, busy) = busy_port();
    let nbd_busy = ["--listen", &busy, "--iscsi-listen", "127.0.0.1:0"];
    let iscsi_busy = ["--listen", "127.0.0.1:0", "--iscsi-listen", &busy];
    for (args, what) in [(nbd_busy, "NBD"), (iscsi_busy, "iSCSI")] {
        // A data directory that does not exist yet is not created.
        let data = dir.path().join("fresh");
        let o = serve_must_exit(dir.path(), &data, &args);
        assert_fails(&o, &[&busy, what], "busy port");
        assert!(
            !data.exists(),
            "{what}: {data:?} created: {:?}",
            tree(dir.path())
        );
        // An empty one stays empty.
        std::fs::create_dir(&data).unwrap();
        let o = serve_must_exit(dir.path(), &data, &args);
        assert_fails(&o, &[&busy, what], "busy port, empty directory");
        assert_eq!(tree(&data), [], "{what}: the empty directory was changed");
        std::fs::remove_dir(&data).unwrap();
    }
    // An initialised one is left exactly as it was.
    let data = dir.path().join("used");
    let mut s = Server::start(&data, SMALL_LOG);
    assert!(s.stop().success(), "{}", s.log());
    let before = tree(&data);
    for args in [nbd_busy, iscsi_busy] {
        let o = serve_must_exit(dir.path(), &data, &args);
        assert_fails(&o, &[&busy], "busy port, existing directory");
        assert_eq!(tree(&data), before);
    }
    // A second server on the directory and ports of a running one is told about the
    // directory, the cause, rather than the ports.
    let s = Server::start(&data, &[]);
    let iscsi = s.iscsi();
    let same = ["--listen", &s.nbd, "--iscsi-listen", &iscsi];
    let o = serve_must_exit(dir.path(), &data, &same);
    assert_fails(&o, &["in use by another mariner server"], "second server");
    drop(s);
}

/// A file system mounted for one test, unmounted when dropped.
struct Mount(PathBuf);

impl Mount {
    fn new(args: &[&str], at: &Path) -> Mount {
        std::fs::create_dir_all(at).unwrap();
        run(Command::new("mount").args(args).arg(at));
        Mount(at.to_path_buf())
    }

    /// A tmpfs of `size` (e.g. "64m").
    fn tmpfs(at: &Path, size: &str) -> Mount {
        Mount::new(&["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"], at)
    }

    /// An ext4 file system with 4 KiB blocks in a `size`-byte image file, loop-mounted.
    fn ext4(image: &Path, size: u64, at: &Path) -> Mount {
        std::fs::File::create(image).unwrap().set_len(size).unwrap();
        run(Command::new("mkfs.ext4")
            .args(["-q", "-F", "-b", "4096"])
            .arg(image));
        Mount::new(&["-o", "loop", image.to_str().unwrap()], at)
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let ok = Command::new("umount").arg(&self.0).status();
        if !ok.is_ok_and(|s| s.success()) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

#[test]
fn a_first_start_without_space_leaves_nothing_behind() {
    require("mount");
    let dir = scratch("nospace");
    let mnt = Mount::tmpfs(&dir.path().join("mnt"), "64m");
    let data = mnt.0.join("data");
    let ports = ["--listen", "127.0.0.1:0", "--iscsi-listen", "127.0.0.1:0"];
    let mut args = ports.to_vec();
    args.extend_from_slice(&["--log-size", "256MiB", "--default-volume-size", "16MiB"]);
    for _ in 0..2 {
        let o = serve_must_exit(dir.path(), &data, &args);
        assert_fails(&o, &["256 MiB", "free"], "log larger than the file system");
        assert_eq!(tree(&mnt.0), [], "a failed first start left files behind");
    }
    // A log device outside the data directory, on the small file system.
    let elsewhere = dir.path().join("data-elsewhere");
    let dev = mnt.0.join("logs/log-a");
    let mut ext = args.clone();
    ext.extend_from_slice(&["--log-dev", dev.to_str().unwrap()]);
    let o = serve_must_exit(dir.path(), &elsewhere, &ext);
    assert_fails(&o, &["256 MiB", "free"], "external log device");
    assert_eq!(tree(&mnt.0), [], "a failed first start left its log device");
    assert!(!elsewhere.exists(), "{elsewhere:?} left behind");

    // The next attempt, with a log that fits, starts clean.
    let mut s = Server::start(&data, SMALL_LOG);
    require("qemu-io");
    qemu_io(&s.url("vol0"), &["write -P 0x3e 0 1M", "read -P 0x3e 0 1M"]);
    assert!(s.stop().success(), "{}", s.log());
    drop(s);
}

/// `mariner volume <args> --data <data> --json`.
fn cli(data: &Path, args: &[&str]) -> Output {
    Command::new(mariner_bin())
        .args(args)
        .arg("--data")
        .arg(data)
        .arg("--json")
        .output()
        .unwrap()
}

fn cli_ok(data: &Path, args: &[&str]) -> Value {
    let o = cli(data, args);
    assert!(o.status.success(), "mariner {args:?}: {}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// `volume list` without what changes by itself as time passes (how far back history
/// reaches, counted from now).
fn volume_list(data: &Path) -> Value {
    let mut v = cli_ok(data, &["volume", "list"]);
    for vol in v.as_array_mut().into_iter().flatten() {
        if let Some(h) = vol.get_mut("history").and_then(Value::as_object_mut) {
            h.remove("effective_window_s");
        }
    }
    v
}

#[test]
fn volumes_larger_than_the_file_system_allows_are_refused_without_a_trace() {
    require("mkfs.ext4");
    let dir = scratch("hugevol");
    // ext4 with 4 KiB blocks holds files of at most 16 TiB - 4 KiB.
    let limit = "17592186040320";
    let mnt = Mount::ext4(
        &dir.path().join("ext4.img"),
        256 * MIB,
        &dir.path().join("mnt"),
    );
    let data = mnt.0.join("data");

    // The default volume of a first start: refused, and nothing is left — the log device
    // that existed before is there, unformatted again.
    let dev = mnt.0.join("log-dev");
    std::fs::write(&dev, vec![0u8; (16 * MIB) as usize]).unwrap();
    let dev_arg = ["--log-dev", dev.to_str().unwrap()];
    let mut args = vec!["--listen", "127.0.0.1:0", "--iscsi-listen", "127.0.0.1:0"];
    args.extend_from_slice(&["--default-volume-size", "1PiB"]);
    args.extend_from_slice(&dev_arg);
    let o = serve_must_exit(dir.path(), &data, &args);
    assert_fails(&o, &["file system", limit], "1 PiB default volume");
    assert!(!data.exists(), "left behind: {:?}", tree(&mnt.0));
    assert!(
        std::fs::read(&dev).unwrap() == vec![0u8; (16 * MIB) as usize],
        "the log device was left formatted"
    );

    let mut small = SMALL_LOG.to_vec();
    small.extend_from_slice(&dev_arg);
    let mut s = Server::start(&data, &small);
    let before = volume_list(&data);
    let files = tree(&data);
    for size in ["1PiB", "17TiB"] {
        let o = cli(&data, &["volume", "create", "big", "--size", size]);
        assert_fails(&o, &["file system", limit], "create past the limit");
        assert_eq!(volume_list(&data), before);
        assert_eq!(tree(&data), files, "a refused create left files");
    }
    let o = cli(&data, &["volume", "grow", "vol0", "--size", "1PiB"]);
    assert_fails(&o, &["file system", limit], "grow past the limit");
    assert!(
        !stderr(&o).contains("at least the current"),
        "{}",
        stderr(&o)
    );
    assert_eq!(volume_list(&data), before);
    assert_eq!(tree(&data), files, "a refused grow left files");

    // No volume id was used up: vol0 has 1, the next volume gets 2.
    assert_eq!(before[0]["id"], 1, "{before}");
    let next = cli_ok(&data, &["volume", "create", "next", "--size", "1TiB"]);
    assert_eq!(next["id"], 2, "{next}");
    assert!(s.stop().success(), "{}", s.log());
}
