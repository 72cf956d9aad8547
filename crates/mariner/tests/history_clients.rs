//! History with real clients end to end (issue 17 M3): ext4 file systems copied onto a volume
//! in stages come back byte for byte as of each stage's bookmark, over NBD and iSCSI; a live
//! sqlite database on ext4 (nbdfuse + fuse2fs) exported as of instants taken while it commits
//! holds every row acknowledged before the instant; a rollback under a real client restores a
//! stage, writes no more than what changed, and is undone.
//!
//! FUSE needs root (CI runs the suite as root); mounts and commands are bounded in time.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::cli::*;
use common::fuse::*;
use common::history::*;
use common::*;
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A 256 MiB log and 64 MiB volumes: an ext4 image fills the volume exactly.
const ARGS: &[&str] = &["--log-size", "256MiB", "--default-volume-size", "64MiB"];
const IMAGE_SIZE: &str = "64M";

/// The directory tree of stage `stage`: files come and go and are rewritten from stage to
/// stage (file i exists unless (i + stage) % 5 == 0; its contents change when i % 3 ==
/// stage % 3), of sizes from a byte to 1.5 MiB, in four directories.
fn stage_tree(root: &Path, stage: u64) {
    let sizes = [1usize, 700, 4096, 5000, 70_000, 400_000, 1_500_000];
    for i in 0..24u64 {
        if (i + stage).is_multiple_of(5) {
            continue;
        }
        let version = if i % 3 == stage % 3 { stage + 1 } else { 0 };
        let dir = root.join(format!("d{}", i % 4));
        std::fs::create_dir_all(&dir).unwrap();
        let len = sizes[(i % 7) as usize];
        std::fs::write(
            dir.join(format!("f{i}")),
            random_bytes(i * 1000 + version, len),
        )
        .unwrap();
    }
    std::fs::write(root.join("stage"), format!("stage {stage}\n")).unwrap();
}

/// `mkfs.ext4 -d <tree>`: stage `stage` as a 64 MiB ext4 image in `dir`.
fn stage_image(dir: &Path, stage: u64) -> PathBuf {
    let tree = dir.join(format!("tree{stage}"));
    stage_tree(&tree, stage);
    let image = dir.join(format!("stage{stage}.img"));
    run_bounded(
        Command::new("mkfs.ext4")
            .args(["-F", "-q", "-b", "4096", "-d"])
            .arg(&tree)
            .arg(&image)
            .arg(IMAGE_SIZE),
    );
    image
}

/// `e2fsck -fn`: the file system in `image` is clean (nothing to fix, exit 0).
fn assert_fsck_clean(image: &Path, what: &str) {
    let out = bounded(Command::new("e2fsck").arg("-fn").arg(image));
    let report =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !report.contains("Fix?"),
        "{what}: e2fsck -fn ({}):\n{report}",
        out.status
    );
}

fn require_tools(tools: &[&str]) {
    for t in tools {
        require(t);
    }
}

#[test]
fn ext4_stages_come_back_byte_for_byte_over_nbd_and_iscsi() {
    require_tools(&["qemu-img", "nbdcopy", "mkfs.ext4", "e2fsck", "timeout"]);
    let dir = scratch("hist-ext4");
    let s = Server::start(&dir.path().join("data"), ARGS);
    let images: Vec<PathBuf> = (0..3).map(|i| stage_image(dir.path(), i)).collect();
    for (i, image) in images.iter().enumerate() {
        for earlier in &images[..i] {
            assert_ne!(
                std::fs::read(earlier).unwrap(),
                std::fs::read(image).unwrap(),
                "stages must differ"
            );
        }
        copy_in(image, &s.url("vol0"));
        mark(&s, "vol0", &format!("stage{i}"));
    }
    for (i, image) in images.iter().enumerate() {
        let e = export(&s, "vol0", &format!("mark:stage{i}"), &format!("s{i}"));
        let out = dir.path().join("out.img");
        copy_out(&url_of(&e, "nbd"), &out);
        assert_same_bytes(image, &out, &format!("stage {i} over NBD"));
        assert_fsck_clean(&out, &format!("stage {i} over NBD"));
        // nbdcopy: several connections, many requests in flight.
        std::fs::remove_file(&out).unwrap();
        run_bounded(Command::new("nbdcopy").arg(url_of(&e, "nbd")).arg(&out));
        assert_same_bytes(image, &out, &format!("stage {i} over NBD (nbdcopy)"));
        copy_out(&url_of(&e, "iscsi"), &out);
        assert_same_bytes(image, &out, &format!("stage {i} over iSCSI"));
        std::fs::remove_file(&out).unwrap();
    }
    // The volume itself is the last stage.
    let out = dir.path().join("now.img");
    copy_out(&s.url("vol0"), &out);
    assert_same_bytes(&images[2], &out, "the volume now");
}

/// A sqlite3 shell committing one row per transaction; each row id is recorded, with the
/// time, only after sqlite3 has printed it, i.e. after the commit returned.
struct Committer {
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<(Instant, u64)>>>,
    thread: Option<std::thread::JoinHandle<Result<(), String>>>,
}

impl Committer {
    /// Opens (creating) the database `db` and commits rows until stopped. WAL with
    /// synchronous=FULL: a commit returns once its WAL frames are synced (in the default
    /// rollback-journal mode the journal's deletion, the commit point, is not synced under
    /// FULL); exclusive locking keeps the WAL index in memory, not in a shared-memory file
    /// FUSE would have to map.
    fn start(db: &Path) -> Committer {
        let mut child = Command::new("stdbuf")
            .args(["-oL", "sqlite3", "-batch", "-bail"])
            .arg(db)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(Mutex::new(Vec::new()));
        let (stop2, acked2) = (Arc::clone(&stop), Arc::clone(&acked));
        let thread = std::thread::spawn(move || {
            let mut line = String::new();
            let mut ask = |cmd: &str, line: &mut String| -> Result<String, String> {
                writeln!(stdin, "{cmd}").map_err(|e| format!("{cmd}: {e}"))?;
                line.clear();
                stdout.read_line(line).map_err(|e| format!("{cmd}: {e}"))?;
                if line.is_empty() {
                    return Err(format!("{cmd}: sqlite3 exited"));
                }
                Ok(line.trim().to_string())
            };
            let setup = [
                ("PRAGMA locking_mode=EXCLUSIVE;", "exclusive"),
                ("PRAGMA journal_mode=WAL;", "wal"),
                (
                    "PRAGMA synchronous=FULL; PRAGMA synchronous;",
                    "2", // FULL
                ),
                (
                    "CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB); SELECT count(*) FROM t;",
                    "0",
                ),
            ];
            for (cmd, want) in setup {
                let got = ask(cmd, &mut line)?;
                if got != want {
                    return Err(format!("{cmd}: {got:?}, want {want:?}"));
                }
            }
            while !stop2.load(Ordering::Relaxed) {
                let cmd = "INSERT INTO t(v) VALUES (randomblob(3000)); SELECT last_insert_rowid();";
                let got = ask(cmd, &mut line)?;
                let id: u64 = got.parse().map_err(|_| format!("{cmd}: {got:?}"))?;
                acked2.lock().unwrap().push((Instant::now(), id));
            }
            drop(stdin);
            let out = child.wait_with_output().map_err(|e| e.to_string())?;
            if !out.status.success() {
                return Err(format!(
                    "sqlite3 exited with {}: {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            Ok(())
        });
        Committer {
            stop,
            acked,
            thread: Some(thread),
        }
    }

    /// Rows acknowledged before `t`.
    fn acked_before(&self, t: Instant) -> Vec<u64> {
        let a = self.acked.lock().unwrap();
        a.iter()
            .filter(|(at, _)| *at < t)
            .map(|&(_, id)| id)
            .collect()
    }

    fn finish(mut self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        let thread = self.thread.take().unwrap();
        wait_until("sqlite3's last commit", Duration::from_secs(60), || {
            thread.is_finished()
        });
        let r = thread.join().unwrap();
        r.unwrap_or_else(|e| panic!("the committing sqlite3: {e}"));
        let n = self.acked.lock().unwrap().len();
        n
    }
}

impl Drop for Committer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The rows of the database in an exported instant: the copy's journal replayed (and
/// whatever a crash at that instant left repaired) by `e2fsck -fy`, the database directory
/// taken out with debugfs, `PRAGMA integrity_check` ok; returns the row ids.
fn rows_in_copy(image: &Path, out: &Path, what: &str) -> BTreeSet<u64> {
    let fsck = bounded(Command::new("e2fsck").arg("-fy").arg(image));
    // 0: clean; 1: errors corrected. Anything else left it broken.
    assert!(
        matches!(fsck.status.code(), Some(0 | 1)),
        "{what}: e2fsck -fy ({}):\n{}{}",
        fsck.status,
        String::from_utf8_lossy(&fsck.stdout),
        String::from_utf8_lossy(&fsck.stderr)
    );
    let repaired = String::from_utf8_lossy(&fsck.stdout).contains("backup");
    eprintln!(
        "{what}: e2fsck -fy {} (from a backup superblock: {repaired})",
        fsck.status
    );
    let _ = std::fs::remove_dir_all(out);
    std::fs::create_dir_all(out).unwrap();
    let rdump = format!("rdump /db {}", out.display());
    run_bounded(Command::new("debugfs").args(["-R", &rdump]).arg(image));
    let db = out.join("db/t.db");
    assert!(db.exists(), "{what}: no database in the copy");
    let sql = |q: &str| {
        run_bounded(
            Command::new("sqlite3")
                .args(["-batch", "-bail"])
                .arg(&db)
                .arg(q),
        )
    };
    assert_eq!(sql("PRAGMA integrity_check;").trim(), "ok", "{what}");
    sql("SELECT id FROM t ORDER BY id;")
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect()
}

#[test]
fn a_live_sqlite_database_keeps_every_acknowledged_row_in_each_instant() {
    require_tools(&[
        "nbdfuse",
        "fuse2fs",
        "mkfs.ext4",
        "e2fsck",
        "debugfs",
        "sqlite3",
        "stdbuf",
        "qemu-img",
        "fusermount",
        "fusermount3",
        "timeout",
    ]);
    let dir = scratch("hist-sqlite");
    // 160 MiB: two block groups of 4 KiB blocks, so the file system has a backup superblock
    // where e2fsck looks for one. fuse2fs (libext2fs) rewrites the primary superblock a
    // changed field at a time, so an instant between two of those writes holds a torn
    // superblock (as a crash there would), which e2fsck repairs from the backup.
    let args = ["--log-size", "256MiB", "--default-volume-size", "160MiB"];
    let s = Server::start(&dir.path().join("data"), &args);
    let nbd = nbdfuse(&dir.path().join("nbd"), &s.url("vol0"));
    let image = nbd.dir.join("nbd");
    run_bounded(
        Command::new("mkfs.ext4")
            .args(["-F", "-q", "-b", "4096", "-I", "256"])
            .arg(&image),
    );
    let fs = fuse2fs(&image, &dir.path().join("mnt"), "rw");
    std::fs::create_dir(fs.dir.join("db")).unwrap();
    let committer = Committer::start(&fs.dir.join("db/t.db"));

    // Bookmarks while it commits, each with the rows acknowledged before it was asked for,
    // a second and at least 20 commits apart (sqlite's checkpoints, every 1000 WAL pages,
    // stall commits for a second or more on a busy machine).
    let mut instants = Vec::new();
    let start = Instant::now();
    let mut last = 0;
    while instants.len() < 4 {
        std::thread::sleep(Duration::from_secs(1));
        wait_until("20 more commits", Duration::from_secs(60), || {
            committer.acked_before(Instant::now()).len() >= last + 20
        });
        let asked = Instant::now();
        let name = format!("i{}", instants.len());
        mark(&s, "vol0", &name);
        let by_answer = committer.acked_before(Instant::now()).len();
        let acked = committer.acked_before(asked);
        last = acked.len();
        instants.push((name, acked, by_answer));
        assert!(start.elapsed() < Duration::from_secs(60), "marks too slow");
    }
    let committed = committer.finish();
    assert_eq!(fs.unmount(), Vec::<String>::new(), "fuse2fs");
    assert_eq!(nbd.unmount(), Vec::<String>::new(), "nbdfuse");

    let mut before = 0;
    for (name, acked, by_answer) in &instants {
        assert!(
            acked.len() > before,
            "no commit between instants ({} rows in all): the test proves nothing",
            committed
        );
        before = acked.len();
        let e = export(&s, "vol0", &format!("mark:{name}"), name);
        let copy = dir.path().join("copy.img");
        copy_out(&url_of(&e, "nbd"), &copy);
        let rows = rows_in_copy(&copy, &dir.path().join("out"), name);
        let missing: Vec<u64> = acked
            .iter()
            .filter(|id| !rows.contains(id))
            .copied()
            .collect();
        assert!(
            missing.is_empty(),
            "{name}: {} acknowledged row(s) missing, e.g. {:?} ({} in the copy, {} acknowledged)",
            missing.len(),
            &missing[..missing.len().min(5)],
            rows.len(),
            acked.len()
        );
        // Rows are committed one at a time in id order: the copy has a prefix of them.
        let max = rows.last().copied().unwrap_or(0);
        assert_eq!(rows.len() as u64, max, "{name}: rows are not 1..={max}");
        // ... and none committed after the instant: at most the one in flight when the
        // bookmark's answer came.
        assert!(
            rows.len() <= by_answer + 1,
            "{name}: {} rows, but only {by_answer} were acknowledged by the bookmark's answer",
            rows.len()
        );
        eprintln!(
            "{name}: {} rows acknowledged before it, {} in the copy",
            acked.len(),
            rows.len()
        );
        std::fs::remove_file(&copy).unwrap();
    }
}

/// `mariner_log_bytes_written_total`: bytes written to the log devices.
fn log_bytes(s: &Server) -> f64 {
    s.metric("mariner_log_bytes_written_total")
}

#[test]
fn a_rollback_under_a_real_client_restores_a_stage_and_is_undone() {
    require_tools(&["qemu-img", "qemu-io", "mkfs.ext4", "e2fsck", "timeout"]);
    let dir = scratch("hist-rollback");
    let s = Server::start(&dir.path().join("data"), ARGS);
    let a = stage_image(dir.path(), 0);
    let b = stage_image(dir.path(), 1);
    copy_in(&a, &s.url("vol0"));
    mark(&s, "vol0", "a");
    copy_in(&b, &s.url("vol0"));
    mark(&s, "vol0", "b");
    let d = json(&s, &["diff", "vol0", "--from", "mark:a"]);
    let changed = d["changed_bytes"].as_u64().unwrap();
    assert!(changed > 0, "{d}");

    // A client is connected: refused, unless forced.
    let mut held = Command::new("qemu-io")
        .args(["-f", "raw", &s.url("vol0")])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_until("the client is connected", Duration::from_secs(30), || {
        json(&s, &["volume", "info", "vol0"])["connections"].as_u64() == Some(1)
    });
    refused(
        &s,
        &["rollback", "vol0", "--to", "mark:a"],
        "connected client",
    );
    let newest = newest_seq(&s, "vol0");
    let before = log_bytes(&s);
    let t = Instant::now();
    let r = rollback(&s, "vol0", "mark:a", true);
    let took = t.elapsed();
    let written = log_bytes(&s) - before;
    let _ = held.kill();
    let _ = held.wait();
    assert_eq!(r["from"]["volume_seq"].as_u64(), Some(newest), "{r}");
    assert_eq!(r["total_bytes"].as_u64(), Some(changed), "{r}");
    assert_eq!(r["done_bytes"], r["total_bytes"], "{r}");
    assert!(
        written <= 1.1 * changed as f64,
        "the rollback wrote {written} log bytes for {changed} changed bytes"
    );
    eprintln!("rollback: {changed} bytes changed since A, {written} log bytes, {took:?}");
    let out = dir.path().join("out.img");
    copy_out(&s.url("vol0"), &out);
    assert_same_bytes(&a, &out, "the volume rolled back to A");
    assert_fsck_clean(&out, "the volume rolled back to A");

    // The rollback is history: rolling back to the instant before it gives B again.
    let from = r["from"]["volume_seq"].as_u64().unwrap();
    let undo = rollback(&s, "vol0", &format!("@{from}"), false);
    assert_eq!(undo["to"]["volume_seq"].as_u64(), Some(from), "{undo}");
    copy_out(&s.url("vol0"), &out);
    assert_same_bytes(&b, &out, "the rollback undone");
    // And stage A is still an instant of its own.
    let e = export(&s, "vol0", "mark:a", "a");
    copy_out(&url_of(&e, "nbd"), &out);
    assert_same_bytes(&a, &out, "A after the rollback and its undo");
}
