//! History under a stream of self-describing writes (issue 17 M3): every 4 KiB block written
//! names itself and its generation, so an export as of a bookmark can be checked block by
//! block against the writes acknowledged before it — and exactly against the writes the
//! bookmark's write number says it holds. Then kill -9: during writes (exports made before
//! survive and read the same, nothing acknowledged is lost), during an export's reads (it is
//! back and reads the same), and during a rollback (it resumes on its own and ends equal to
//! its target).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::big_endian_bytes)]

mod common;

use common::history::*;
use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BLOCK: u64 = 4096;
/// The written area: the first 8 MiB of the volume.
const AREA_BLOCKS: u64 = 2048;
/// Most blocks per write.
const MAX_BLOCKS: u64 = 4;
/// At most one write per millisecond (about 10 MiB/s): seconds of writes stay well inside
/// what the 256 MiB log keeps before history shrinks and drops the oldest bookmarks.
const PACE: Duration = Duration::from_millis(1);

/// A block that names itself: (block, generation) in every 16 bytes.
fn stamp(out: &mut Vec<u8>, block: u64, generation: u64) {
    for _ in 0..BLOCK / 16 {
        out.extend_from_slice(&block.to_le_bytes());
        out.extend_from_slice(&generation.to_le_bytes());
    }
}

/// The generation a block holds (0: never written), or what is wrong with it.
fn generation_of(b: &[u8], block: u64) -> Result<u64, String> {
    if b.iter().all(|&x| x == 0) {
        return Ok(0);
    }
    let first = &b[..16];
    if b.chunks(16).any(|c| c != first) {
        return Err(format!("block {block} is torn or foreign"));
    }
    let named = u64::from_le_bytes(first[..8].try_into().unwrap());
    if named != block {
        return Err(format!("block {block} holds block {named}'s data"));
    }
    Ok(u64::from_le_bytes(first[8..].try_into().unwrap()))
}

/// One NBD connection (simple replies), from common::nbd_connect.
struct Nbd(TcpStream);

impl Nbd {
    fn open(addr: &str, export: &str) -> Nbd {
        let (s, size, _) = nbd_connect(addr, export);
        assert!(size >= AREA_BLOCKS * BLOCK, "{export}: {size} bytes");
        s.set_nodelay(true).unwrap();
        Nbd(s)
    }

    fn request(&mut self, cmd: u16, offset: u64, data: &[u8], len: u32) -> std::io::Result<()> {
        let mut h = Vec::with_capacity(28 + data.len());
        h.extend_from_slice(&0x2560_9513u32.to_be_bytes());
        h.extend_from_slice(&0u16.to_be_bytes());
        h.extend_from_slice(&cmd.to_be_bytes());
        h.extend_from_slice(&offset.to_be_bytes()); // cookie: the offset
        h.extend_from_slice(&offset.to_be_bytes());
        h.extend_from_slice(&len.to_be_bytes());
        h.extend_from_slice(data);
        self.0.write_all(&h)?;
        let mut r = [0u8; 16];
        self.0.read_exact(&mut r)?;
        let magic = u32::from_be_bytes(r[..4].try_into().unwrap());
        let error = u32::from_be_bytes(r[4..8].try_into().unwrap());
        let cookie = u64::from_be_bytes(r[8..].try_into().unwrap());
        if magic != 0x6744_6698 || cookie != offset || error != 0 {
            return Err(std::io::Error::other(format!(
                "reply magic {magic:#x} cookie {cookie} error {error}"
            )));
        }
        Ok(())
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.request(1, offset, data, data.len() as u32)
    }

    /// The written area, 1 MiB at a time.
    fn read_area(&mut self) -> std::io::Result<Vec<u8>> {
        let mut out = vec![0u8; (AREA_BLOCKS * BLOCK) as usize];
        for (i, chunk) in out.chunks_mut(1 << 20).enumerate() {
            self.request(0, (i as u64) << 20, &[], chunk.len() as u32)?;
            self.0.read_exact(chunk)?;
        }
        Ok(out)
    }
}

/// The area of `export` as the server reads it now.
fn read_export(s: &Server, export: &str) -> Vec<u8> {
    Nbd::open(&s.nbd, export).read_area().unwrap()
}

/// One write: blocks `first..first + blocks` (the writer's n-th write stamps them with
/// generation n, from 1).
#[derive(Debug, Clone, Copy)]
struct Write1 {
    first: u64,
    blocks: u64,
}

/// The write sequence, the same every run (xorshift).
fn plan(n: u64) -> Write1 {
    let mut x = n.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    let x = x.wrapping_mul(0x2545_F491_4F6C_DD1D);
    let blocks = 1 + (x >> 40) % MAX_BLOCKS;
    Write1 {
        first: x % (AREA_BLOCKS - blocks + 1),
        blocks,
    }
}

/// A writer on its own connection, one write at a time, paced: `submitted` counts the writes sent,
/// `acked` those the server acknowledged. It stops when told, or at the first error (the
/// server killed).
struct Writer {
    stop: Arc<AtomicBool>,
    submitted: Arc<AtomicU64>,
    acked: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<Option<String>>>,
}

impl Writer {
    fn start(addr: &str) -> Writer {
        let mut c = Nbd::open(addr, "vol0");
        let stop = Arc::new(AtomicBool::new(false));
        let submitted = Arc::new(AtomicU64::new(0));
        let acked = Arc::new(AtomicU64::new(0));
        let (stop2, sub2, ack2) = (stop.clone(), submitted.clone(), acked.clone());
        let thread = std::thread::spawn(move || {
            let mut buf = Vec::new();
            let start = Instant::now();
            for n in 1.. {
                if stop2.load(Ordering::SeqCst) {
                    return None;
                }
                let due = PACE * n as u32;
                if let Some(wait) = due.checked_sub(start.elapsed()) {
                    std::thread::sleep(wait);
                }
                let w = plan(n);
                buf.clear();
                for b in w.first..w.first + w.blocks {
                    stamp(&mut buf, b, n);
                }
                sub2.store(n, Ordering::SeqCst);
                if let Err(e) = c.write(w.first * BLOCK, &buf) {
                    return Some(format!("write {n}: {e}"));
                }
                ack2.store(n, Ordering::SeqCst);
            }
            None
        });
        Writer {
            stop,
            submitted,
            acked,
            thread: Some(thread),
        }
    }

    /// Stops it; returns the error that stopped it first, if any.
    fn finish(mut self) -> Option<String> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// The generation of every block after the writer's first `n` writes.
fn expected(n: u64) -> Vec<u64> {
    let mut g = vec![0; AREA_BLOCKS as usize];
    for k in 1..=n {
        let w = plan(k);
        for b in w.first..w.first + w.blocks {
            g[b as usize] = k;
        }
    }
    g
}

/// Asserts that `area` holds, block by block, exactly the writer's first `n` writes.
fn assert_holds(area: &[u8], n: u64, what: &str) {
    let want = expected(n);
    let mut wrong = Vec::new();
    for (b, chunk) in area.chunks(BLOCK as usize).enumerate() {
        match generation_of(chunk, b as u64) {
            Ok(g) if g == want[b] => {}
            Ok(g) => wrong.push(format!("block {b}: generation {g}, want {}", want[b])),
            Err(e) => wrong.push(e),
        }
    }
    assert!(
        wrong.is_empty(),
        "{what} (the first {n} writes): {} block(s) wrong: {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(8)]
    );
}

/// A bookmark taken while the writer ran: the writer's writes it holds, bounded by what the
/// writer had acknowledged before asking and submitted by the answer.
struct Bookmark {
    name: String,
    writes: u64,
}

/// Takes a bookmark every `every` while `w` writes; checks each one's write number against
/// the writer's counts (the volume's n-th write after `base` is the writer's n-th).
fn bookmarks(s: &Server, w: &Writer, base: u64, count: usize, every: Duration) -> Vec<Bookmark> {
    let mut out = Vec::new();
    for i in 0..count {
        std::thread::sleep(every);
        let name = format!("m{i}");
        let acked = w.acked.load(Ordering::SeqCst);
        let seq = mark(s, "vol0", &name);
        let submitted = w.submitted.load(Ordering::SeqCst);
        let writes = seq - base;
        assert!(
            acked <= writes && writes <= submitted,
            "{name} @{seq}: {writes} writes, but {acked} were acknowledged before it was \
             asked for and {submitted} sent by its answer"
        );
        let before = out.last().map_or(0, |b: &Bookmark| b.writes);
        assert!(writes > before, "{name}: no write since the last bookmark");
        out.push(Bookmark { name, writes });
    }
    out
}

const ARGS: &[&str] = &["--log-size", "256MiB", "--default-volume-size", "64MiB"];

#[test]
fn each_bookmark_holds_exactly_the_writes_acknowledged_before_it() {
    let dir = scratch("hist-marks");
    let s = Server::start(&dir.path().join("data"), ARGS);
    let base = newest_seq(&s, "vol0");
    let w = Writer::start(&s.nbd);
    let marks = bookmarks(&s, &w, base, 6, Duration::from_secs(1));
    assert_eq!(w.finish(), None, "the writer failed");
    let mut exports = Vec::new();
    for m in &marks {
        let e = export(&s, "vol0", &format!("mark:{}", m.name), &m.name);
        let area = read_export(&s, &format!("vol0@{}", m.name));
        assert_holds(&area, m.writes, &format!("export {}", m.name));
        exports.push(e);
    }
    // Over iSCSI too (qemu-img reads the whole export; the area is its start).
    let out = dir.path().join("m2.img");
    copy_out(&url_of(&exports[2], "iscsi"), &out);
    let image = std::fs::read(&out).unwrap();
    assert_holds(
        &image[..(AREA_BLOCKS * BLOCK) as usize],
        marks[2].writes,
        "m2 over iSCSI",
    );
    eprintln!(
        "{} writes; bookmarks at {:?}",
        newest_seq(&s, "vol0") - base,
        marks.iter().map(|m| m.writes).collect::<Vec<_>>()
    );
}

/// Reads an export's area over and over on its own connection until the server goes away;
/// returns how many whole passes it made.
fn reader(addr: String, export: String) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut c = Nbd::open(&addr, &export);
        let mut passes = 0;
        while c.read_area().is_ok() {
            passes += 1;
        }
        passes
    })
}

#[test]
fn kill_9_during_writes_and_export_reads_loses_no_instant() {
    let dir = scratch("hist-kill");
    let mut s = Server::start(&dir.path().join("data"), ARGS);
    let base = newest_seq(&s, "vol0");
    let w = Writer::start(&s.nbd);
    let marks = bookmarks(&s, &w, base, 3, Duration::from_millis(700));
    let mut areas = Vec::new();
    for m in &marks {
        export(&s, "vol0", &format!("mark:{}", m.name), &m.name);
        let area = read_export(&s, &format!("vol0@{}", m.name));
        assert_holds(&area, m.writes, &format!("export {}", m.name));
        areas.push(area);
    }
    // kill -9 while the writer writes and a client reads an export.
    let r = reader(s.nbd.clone(), "vol0@m0".into());
    std::thread::sleep(Duration::from_millis(500));
    s.kill();
    let acked = w.acked.load(Ordering::SeqCst);
    let submitted = w.submitted.load(Ordering::SeqCst);
    assert!(
        w.finish().is_some(),
        "the writer saw no error from a killed server"
    );
    assert!(
        r.join().unwrap() > 0,
        "the reader never read the export whole"
    );
    s = Server::start(&s.data.clone(), ARGS);

    // Nothing acknowledged is lost: the volume holds the first N writes, all acknowledged or
    // in flight, and the instant of the last acknowledged one still resolves.
    let writes = newest_seq(&s, "vol0") - base;
    assert!(
        acked <= writes && writes <= submitted,
        "after kill -9: {writes} writes in history; {acked} acknowledged, {submitted} sent"
    );
    assert_holds(&read_export(&s, "vol0"), writes, "the volume after kill -9");
    export(&s, "vol0", &format!("@{}", base + acked), "acked");
    assert_holds(
        &read_export(&s, "vol0@acked"),
        acked,
        "the last acknowledged instant",
    );
    // The exports made before came back and read the same; the bookmarks still resolve.
    for (m, area) in marks.iter().zip(&areas) {
        let again = read_export(&s, &format!("vol0@{}", m.name));
        assert!(
            again == *area,
            "export {} reads differently after kill -9",
            m.name
        );
        export(
            &s,
            "vol0",
            &format!("mark:{}", m.name),
            &format!("{}-again", m.name),
        );
        let by_mark = read_export(&s, &format!("vol0@{}-again", m.name));
        assert!(
            by_mark == *area,
            "mark:{} resolves differently after kill -9",
            m.name
        );
    }

    // kill -9 again while only an export is read: it is back and reads the same.
    let r = reader(s.nbd.clone(), "vol0@m1".into());
    std::thread::sleep(Duration::from_millis(500));
    s.restart_after_kill9(ARGS);
    assert!(
        r.join().unwrap() > 0,
        "the reader never read the export whole"
    );
    assert!(
        read_export(&s, "vol0@m1") == areas[1],
        "export m1 reads differently after kill -9 during its reads"
    );
    assert_eq!(newest_seq(&s, "vol0") - base, writes, "reads made instants");
}

#[test]
fn kill_9_during_a_rollback_resumes_it_at_start_up() {
    require("qemu-img");
    require("nbdinfo");
    let dir = scratch("hist-kill-rollback");
    // 96 MiB stages: the rollback writes 96 MiB, long enough to be killed in its middle; the
    // log holds both stages and has room for the rollback below history's 60 %.
    let args = ["--log-size", "768MiB", "--default-volume-size", "128MiB"];
    let mut s = Server::start(&dir.path().join("data"), &args);
    let a = dir.path().join("a.img");
    let b = dir.path().join("b.img");
    random_file(&a, 96 << 20, 1);
    random_file(&b, 96 << 20, 2);
    copy_in(&a, &s.url("vol0"));
    mark(&s, "vol0", "a");
    copy_in(&b, &s.url("vol0"));
    let begun = start_rollback(&s, "vol0", "mark:a", false).unwrap_or_else(|e| panic!("{e}"));
    // While it runs, new connections to the volume are refused, over NBD and iSCSI.
    let nbd = Command::new("nbdinfo")
        .arg("--size")
        .arg(s.url("vol0"))
        .output()
        .unwrap();
    let lun = format!("iscsi://{}/iqn.2026-11.dev.mariner:vol0/0", s.iscsi());
    let iscsi = Command::new("qemu-img")
        .args(["info", &lun])
        .output()
        .unwrap();
    let status = rollback_status(&s, "vol0");
    s.kill();
    let total = begun["total_bytes"].as_u64().unwrap();
    assert!(total >= 96 << 20, "{begun}");
    assert!(
        status["finished"] == false,
        "the rollback ended before the kill: make it larger ({status})"
    );
    for (what, o) in [("NBD", &nbd), ("iSCSI", &iscsi)] {
        assert!(
            !o.status.success(),
            "a new {what} connection was accepted during the rollback: {}",
            String::from_utf8_lossy(&o.stdout)
        );
    }

    s = Server::start(&s.data.clone(), &args);
    let t = Instant::now();
    let done = wait_rollback(&s, "vol0", Duration::from_secs(90));
    assert_eq!(done["resumed"], true, "{done}");
    assert_eq!(done["done_bytes"].as_u64(), Some(total), "{done}");
    eprintln!(
        "rollback of {total} bytes: {} done before kill -9, resumed and finished in {:?}",
        status["done_bytes"],
        t.elapsed()
    );
    let out = dir.path().join("out.img");
    copy_out(&s.url("vol0"), &out);
    assert_same_bytes(&a, &out, "the volume after the resumed rollback");
}
