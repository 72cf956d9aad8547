//! Crash consistency of the real binary: kill -9 while several clients write, restart, check.
//!
//! The server runs with `--test-volatile`, which keeps every unsynced write to the log devices
//! and the images in process memory, so SIGKILL loses exactly what was not synced: a build that
//! acknowledged a write before its batch was durable loses acknowledged writes here. One
//! variant adds `--direct-io`: the log devices are then written with `O_DSYNC` and never
//! synced, each write durable when it returns (the direct-io durability path, without the page
//! cache bypass).
//!
//! Each cycle: start (recover) the server on the same data directory, read the test region back
//! and check it against what the clients saw in the previous cycle, then let several writer
//! connections (each with its own queue depth) write overlapping 1–16 block requests with
//! self-describing sectors, and SIGKILL the server: a third of the cycles at a random moment,
//! the others at the first acknowledgement a client receives after a random delay (microseconds
//! after the server acknowledged, where a build whose acknowledgement races its sync is exposed).
//!
//! The check, per 4 KiB block of the region, with S = submit time and A = ack time on one
//! monotonic clock shared by all writers, and "V certainly precedes W" meaning A(V) < S(W):
//! - every sector is intact (magic, its own sector number, checksum) and all eight sectors of a
//!   block come from the same request: never a torn block;
//! - the block shows a write W of this cycle that covers it, or the block's content found at the
//!   start of the cycle (the baseline, which is what earlier cycles proved durable);
//! - no acknowledged write X covering the block certainly follows what it shows: S(X) > A(W)
//!   (for the baseline: any acknowledged write of this cycle) — never older than the last
//!   acknowledged write, but possibly a later in-flight one;
//! - a write that was not acknowledged is all-or-nothing: if some of its blocks show it, none of
//!   its other blocks shows something that certainly precedes it.
//!
//! MARINER_CRASH_CYCLES sets the total number of kill cycles (split over the variants);
//! MARINER_CRASH_SEED fixes the random choices (the interleaving stays nondeterministic).
#![allow(clippy::unwrap_used, clippy::expect_used)]
// NBD is big-endian on the wire.
#![allow(clippy::big_endian_bytes)]

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Child;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, RecvTimeoutError};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use common::*;

const SECTOR: usize = 512;
const BLOCK: usize = 4096;
/// The region the writers share: 4 MiB of 4 KiB blocks, starting 1 MiB into the volume.
const REGION_OFFSET: u64 = 1 << 20;
const REGION_BLOCKS: u64 = 1024;
/// Half of the requests start in this many first blocks, so concurrent writes collide often.
const HOT_BLOCKS: u64 = 32;
const MAX_REQUEST_BLOCKS: u64 = 16;
/// Queue depth of each writer connection (one entry per writer).
const WRITER_DEPTHS: [usize; 6] = [1, 2, 4, 8, 1, 4];
const DEFAULT_CYCLES: u64 = 40;
const SECTOR_MAGIC: u64 = u64::from_le_bytes(*b"CRASHTST");
const CHECKSUM_AT: usize = SECTOR - 8;

// ---------------------------------------------------------------------------------------------
// Clock and randomness

/// Nanoseconds on the monotonic clock every thread of the test shares.
fn now_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// SplitMix64: small, seedable, good enough to pick offsets and fill sectors.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

// ---------------------------------------------------------------------------------------------
// Self-describing sectors
//
// | bytes    | field                                   |
// |----------|-----------------------------------------|
// | 0..8     | magic "CRASHTST"                        |
// | 8..16    | request id (unique over the whole test) |
// | 16..24   | absolute sector number in the volume    |
// | 24..28   | writer id                               |
// | 28..32   | blocks in the request                   |
// | 32..504  | filler derived from id and sector       |
// | 504..512 | FNV-1a 64 of bytes 0..504               |

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn fill_sector(out: &mut [u8], id: u64, sector: u64, writer: u32, blocks: u32) {
    out[0..8].copy_from_slice(&SECTOR_MAGIC.to_le_bytes());
    out[8..16].copy_from_slice(&id.to_le_bytes());
    out[16..24].copy_from_slice(&sector.to_le_bytes());
    out[24..28].copy_from_slice(&writer.to_le_bytes());
    out[28..32].copy_from_slice(&blocks.to_le_bytes());
    let mut rng = Rng(id.rotate_left(32) ^ sector);
    for chunk in out[32..CHECKSUM_AT].chunks_mut(8) {
        let v = rng.next().to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
    let sum = fnv1a(&out[..CHECKSUM_AT]);
    out[CHECKSUM_AT..].copy_from_slice(&sum.to_le_bytes());
}

/// The payload of a request: `blocks` blocks starting at region block `first`.
fn payload(id: u64, writer: u32, first: u64, blocks: u64) -> Vec<u8> {
    let mut buf = vec![0u8; blocks as usize * BLOCK];
    let first_sector = (REGION_OFFSET + first * BLOCK as u64) / SECTOR as u64;
    for (i, s) in buf.chunks_mut(SECTOR).enumerate() {
        fill_sector(s, id, first_sector + i as u64, writer, blocks as u32);
    }
    buf
}

/// What a block of the region holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    Zero,
    Req(u64),
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// The request id one sector carries, after checking it is intact and in its own place.
fn decode_sector(s: &[u8], sector: u64) -> Result<Option<u64>, String> {
    if s.iter().all(|&b| b == 0) {
        return Ok(None);
    }
    if u64_at(s, 0) != SECTOR_MAGIC {
        return Err(format!("sector {sector}: bad magic {:#018x}", u64_at(s, 0)));
    }
    if u64_at(s, CHECKSUM_AT) != fnv1a(&s[..CHECKSUM_AT]) {
        return Err(format!("sector {sector}: checksum mismatch (torn sector)"));
    }
    if u64_at(s, 16) != sector {
        return Err(format!(
            "sector {sector}: holds data written for sector {}",
            u64_at(s, 16)
        ));
    }
    Ok(Some(u64_at(s, 8)))
}

/// Decodes region block `b`: all sectors intact, all from one request (or all zero).
fn decode_block(buf: &[u8], b: u64) -> Result<Seen, String> {
    let first_sector = (REGION_OFFSET + b * BLOCK as u64) / SECTOR as u64;
    let ids = buf
        .chunks(SECTOR)
        .enumerate()
        .map(|(i, s)| decode_sector(s, first_sector + i as u64))
        .collect::<Result<Vec<_>, _>>()?;
    if ids.iter().any(|id| *id != ids[0]) {
        return Err(format!(
            "block {b}: torn, sectors come from requests {ids:?}"
        ));
    }
    Ok(ids[0].map_or(Seen::Zero, Seen::Req))
}

// ---------------------------------------------------------------------------------------------
// A small blocking NBD client: fixed newstyle, NBD_OPT_GO for the default export, simple replies

const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
const OPT_GO: u32 = 7;
const REP_ACK: u32 = 1;
const REP_INFO: u32 = 3;
const INFO_EXPORT: u16 = 0;
const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_DISC: u16 = 2;

fn read_array<const N: usize>(s: &mut TcpStream) -> std::io::Result<[u8; N]> {
    let mut b = [0u8; N];
    s.read_exact(&mut b)?;
    Ok(b)
}

fn be_u64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().unwrap())
}

fn be_u32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().unwrap())
}

/// Connects and negotiates the default export; returns the stream and the export size.
fn nbd_connect(addr: &str) -> std::io::Result<(TcpStream, u64)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    let greeting: [u8; 18] = read_array(&mut s)?;
    assert_eq!(be_u64(&greeting[0..]), NBDMAGIC, "bad NBD greeting");
    assert_eq!(be_u64(&greeting[8..]), IHAVEOPT, "not a newstyle server");
    let flags = u16::from_be_bytes([greeting[16], greeting[17]]);
    assert!(flags & 1 != 0, "server is not fixed-newstyle");
    s.write_all(&u32::from(flags & 3).to_be_bytes())?;
    let mut opt = Vec::new();
    opt.extend_from_slice(&IHAVEOPT.to_be_bytes());
    opt.extend_from_slice(&OPT_GO.to_be_bytes());
    opt.extend_from_slice(&6u32.to_be_bytes()); // name length + info count
    opt.extend_from_slice(&0u32.to_be_bytes()); // empty name: the default export
    opt.extend_from_slice(&0u16.to_be_bytes()); // no info requests
    s.write_all(&opt)?;
    let mut size = None;
    loop {
        let h: [u8; 20] = read_array(&mut s)?;
        assert_eq!(be_u64(&h), OPT_REPLY_MAGIC, "bad option reply magic");
        let (kind, len) = (be_u32(&h[12..]), be_u32(&h[16..]) as usize);
        let mut data = vec![0u8; len];
        s.read_exact(&mut data)?;
        assert!(
            kind & 0x8000_0000 == 0,
            "NBD_OPT_GO refused: {kind:#x} {data:?}"
        );
        if kind == REP_INFO && len >= 10 && u16::from_be_bytes([data[0], data[1]]) == INFO_EXPORT {
            size = Some(be_u64(&data[2..]));
        }
        if kind == REP_ACK {
            break;
        }
    }
    Ok((
        s,
        size.expect("no NBD_INFO_EXPORT in the NBD_OPT_GO replies"),
    ))
}

fn request_header(cmd: u16, cookie: u64, offset: u64, len: u32) -> Vec<u8> {
    let mut h = Vec::with_capacity(28);
    h.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
    h.extend_from_slice(&0u16.to_be_bytes());
    h.extend_from_slice(&cmd.to_be_bytes());
    h.extend_from_slice(&cookie.to_be_bytes());
    h.extend_from_slice(&offset.to_be_bytes());
    h.extend_from_slice(&len.to_be_bytes());
    h
}

/// Reads one simple reply header: (error, cookie).
fn read_reply(s: &mut TcpStream) -> std::io::Result<(u32, u64)> {
    let r: [u8; 16] = read_array(s)?;
    if be_u32(&r) != SIMPLE_REPLY_MAGIC {
        return Err(std::io::Error::other(format!(
            "bad reply magic {:#x}",
            be_u32(&r)
        )));
    }
    Ok((be_u32(&r[4..]), be_u64(&r[8..])))
}

/// Reads the whole region, 256 KiB at a time.
fn read_region(addr: &str) -> Vec<u8> {
    let (mut s, size) = nbd_connect(addr).unwrap();
    let len = REGION_BLOCKS as usize * BLOCK;
    assert!(
        size >= REGION_OFFSET + len as u64,
        "volume too small: {size}"
    );
    let mut out = vec![0u8; len];
    for (i, chunk) in out.chunks_mut(256 << 10).enumerate() {
        let offset = REGION_OFFSET + (i * (256 << 10)) as u64;
        s.write_all(&request_header(
            CMD_READ,
            i as u64,
            offset,
            chunk.len() as u32,
        ))
        .unwrap();
        let (err, cookie) = read_reply(&mut s).unwrap();
        assert_eq!((err, cookie), (0, i as u64), "read at {offset} failed");
        s.read_exact(chunk).unwrap();
    }
    let _ = s.write_all(&request_header(CMD_DISC, 0, 0, 0));
    out
}

// ---------------------------------------------------------------------------------------------
// Writers

/// One write request as its client saw it.
#[derive(Debug, Clone)]
struct Req {
    id: u64,
    writer: u32,
    /// First region block.
    first: u64,
    blocks: u64,
    submit_ns: u64,
    ack_ns: Option<u64>,
}

impl Req {
    fn covers(&self, b: u64) -> bool {
        (self.first..self.first + self.blocks).contains(&b)
    }
}

/// Something a writer connection saw go wrong, and when.
#[derive(Debug)]
struct Failure {
    at_ns: u64,
    what: String,
}

#[derive(Debug, Default)]
struct WriterLog {
    reqs: Vec<Req>,
    failures: Vec<Failure>,
}

impl WriterLog {
    fn fail(&mut self, what: String) {
        self.failures.push(Failure {
            at_ns: now_ns(),
            what,
        });
    }
}

struct WriterSpec {
    addr: String,
    writer: u32,
    depth: usize,
    seed: u64,
    next_id: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    killer: Arc<Killer>,
}

/// Sends the server SIGKILL once: from the test's main thread at a random moment, or, once
/// armed, from the first reply reader that stamps an acknowledgement — microseconds after the
/// server acknowledged, where a build that acknowledges before its batch is durable (or
/// before the sync has even started) is most exposed.
struct Killer {
    child: Mutex<Option<Child>>,
    armed: AtomicBool,
    /// When the signal was sent; 0 before.
    kill_ns: AtomicU64,
}

impl Killer {
    fn kill(&self) {
        let mut child = self.child.lock().unwrap();
        if self.kill_ns.load(Ordering::SeqCst) == 0 {
            self.kill_ns.store(now_ns(), Ordering::SeqCst);
            if let Some(c) = child.as_mut() {
                let _ = c.kill();
            }
        }
    }

    fn acknowledged(&self) {
        if self.armed.load(Ordering::SeqCst) {
            self.kill();
        }
    }

    fn killed(&self) -> bool {
        self.kill_ns.load(Ordering::SeqCst) != 0
    }
}

/// Writes until the connection dies or `stop`; returns every request with its times.
fn writer(spec: WriterSpec) -> WriterLog {
    let log = Arc::new(Mutex::new(WriterLog::default()));
    let (mut out, _) = match nbd_connect(&spec.addr) {
        Ok(c) => c,
        Err(e) => {
            log.lock()
                .unwrap()
                .fail(format!("writer {}: connect: {e}", spec.writer));
            return Arc::try_unwrap(log).unwrap().into_inner().unwrap();
        }
    };
    let (tokens_tx, tokens) = sync_channel::<()>(spec.depth);
    for _ in 0..spec.depth {
        tokens_tx.send(()).unwrap();
    }
    let input = out.try_clone().unwrap();
    let reader = {
        let log = Arc::clone(&log);
        let killer = Arc::clone(&spec.killer);
        std::thread::spawn(move || reply_reader(input, &log, &tokens_tx, &killer))
    };
    let mut rng = Rng(spec.seed);
    loop {
        match tokens.recv_timeout(Duration::from_millis(20)) {
            Ok(()) => {}
            Err(RecvTimeoutError::Timeout) if !spec.stop.load(Ordering::Relaxed) => continue,
            Err(_) => break,
        }
        if spec.stop.load(Ordering::Relaxed) {
            break;
        }
        let blocks = rng.range(1, MAX_REQUEST_BLOCKS);
        let span = if rng.next().is_multiple_of(2) {
            HOT_BLOCKS
        } else {
            REGION_BLOCKS
        };
        let first = rng.range(0, span.max(blocks) - blocks);
        let id = spec.next_id.fetch_add(1, Ordering::Relaxed);
        let data = payload(id, spec.writer, first, blocks);
        let offset = REGION_OFFSET + first * BLOCK as u64;
        let cookie = {
            let mut l = log.lock().unwrap();
            let cookie = l.reqs.len() as u64;
            let req = Req {
                id,
                writer: spec.writer,
                first,
                blocks,
                submit_ns: now_ns(),
                ack_ns: None,
            };
            l.reqs.push(req);
            cookie
        };
        let mut msg = request_header(CMD_WRITE, cookie, offset, data.len() as u32);
        msg.extend_from_slice(&data);
        if let Err(e) = out.write_all(&msg) {
            log.lock().unwrap().fail(format!(
                "writer {}: send request {cookie}: {e}",
                spec.writer
            ));
            break;
        }
    }
    let _ = out.shutdown(std::net::Shutdown::Both);
    reader.join().unwrap();
    Arc::try_unwrap(log).unwrap().into_inner().unwrap()
}

/// Reads replies, stamps acknowledgements, hands queue slots back to the writer.
fn reply_reader(
    mut input: TcpStream,
    log: &Mutex<WriterLog>,
    tokens: &std::sync::mpsc::SyncSender<()>,
    killer: &Killer,
) {
    loop {
        let (err, cookie) = match read_reply(&mut input) {
            Ok(r) => r,
            Err(e) => {
                log.lock().unwrap().fail(format!("reply reader: {e}"));
                return;
            }
        };
        let at = now_ns();
        let mut acked = false;
        {
            let mut l = log.lock().unwrap();
            match l.reqs.get_mut(cookie as usize) {
                Some(r) if err == 0 && r.ack_ns.is_none() => {
                    r.ack_ns = Some(at);
                    acked = true;
                }
                Some(r) if err == 0 => {
                    let what = format!("request {} acknowledged twice", r.id);
                    l.fail(what);
                }
                Some(r) => {
                    let what = format!(
                        "write {} (blocks {}+{}) failed: NBD error {err}",
                        r.id, r.first, r.blocks
                    );
                    l.fail(what);
                }
                None => l.fail(format!("reply with unknown cookie {cookie}")),
            }
        }
        if acked {
            killer.acknowledged();
        }
        let _ = tokens.try_send(());
    }
}

// ---------------------------------------------------------------------------------------------
// The check

/// Checks the region read after a restart against the baseline (the region as found at the
/// start of the cycle) and the requests of the cycle. Returns the new baseline and violations.
fn check(baseline: &[Seen], reqs: &[Req], image: &[u8]) -> (Vec<Seen>, Vec<String>) {
    let mut bad = Vec::new();
    let by_id: HashMap<u64, &Req> = reqs.iter().map(|r| (r.id, r)).collect();
    // The acknowledged write to each block submitted last.
    let mut last_acked: Vec<Option<&Req>> = vec![None; REGION_BLOCKS as usize];
    for r in reqs.iter().filter(|r| r.ack_ns.is_some()) {
        for b in r.first..r.first + r.blocks {
            let slot = &mut last_acked[b as usize];
            if slot.is_none_or(|x| x.submit_ns < r.submit_ns) {
                *slot = Some(r);
            }
        }
    }
    let mut seen = Vec::with_capacity(REGION_BLOCKS as usize);
    for (b, buf) in image.chunks(BLOCK).enumerate() {
        let b = b as u64;
        match decode_block(buf, b) {
            Ok(s) => {
                check_block(
                    b,
                    s,
                    baseline[b as usize],
                    &by_id,
                    last_acked[b as usize],
                    &mut bad,
                );
                seen.push(s);
            }
            Err(e) => {
                bad.push(e);
                seen.push(baseline[b as usize]);
            }
        }
    }
    for w in reqs.iter().filter(|r| r.ack_ns.is_none()) {
        check_atomic(w, &seen, baseline, &by_id, &mut bad);
    }
    (seen, bad)
}

fn describe(r: &Req) -> String {
    let ack = r
        .ack_ns
        .map_or("never".to_string(), |a| format!("{:.3} ms", a as f64 / 1e6));
    format!(
        "request {} (writer {}, blocks {}+{}, submitted {:.3} ms, acked {ack})",
        r.id,
        r.writer,
        r.first,
        r.blocks,
        r.submit_ns as f64 / 1e6
    )
}

fn check_block(
    b: u64,
    s: Seen,
    base: Seen,
    by_id: &HashMap<u64, &Req>,
    last_acked: Option<&Req>,
    bad: &mut Vec<String>,
) {
    if s == base {
        if let Some(x) = last_acked {
            bad.push(format!(
                "block {b}: still shows {s:?} from before this cycle, but {} was acknowledged",
                describe(x)
            ));
        }
        return;
    }
    let Seen::Req(id) = s else {
        bad.push(format!(
            "block {b}: reads zeros, but held {base:?} before this cycle"
        ));
        return;
    };
    let Some(w) = by_id.get(&id) else {
        bad.push(format!(
            "block {b}: shows request {id}, neither a write of this cycle nor its content {base:?} \
             before it (a lost write came back, or an old one)"
        ));
        return;
    };
    if !w.covers(b) {
        bad.push(format!(
            "block {b}: shows {}, which does not cover it",
            describe(w)
        ));
        return;
    }
    if let (Some(a), Some(x)) = (w.ack_ns, last_acked) {
        if x.submit_ns > a {
            bad.push(format!(
                "block {b}: shows {} but {} was submitted after that was acknowledged, and was \
                 acknowledged itself: an acknowledged write was lost",
                describe(w),
                describe(x)
            ));
        }
    }
}

/// A request not acknowledged shows in all its blocks or none, except where something that
/// may have been ordered after it shows instead.
fn check_atomic(
    w: &Req,
    seen: &[Seen],
    baseline: &[Seen],
    by_id: &HashMap<u64, &Req>,
    bad: &mut Vec<String>,
) {
    let blocks = w.first..w.first + w.blocks;
    let shown = blocks
        .clone()
        .filter(|&b| seen[b as usize] == Seen::Req(w.id))
        .count();
    if shown == 0 || shown == w.blocks as usize {
        return;
    }
    for b in blocks {
        let s = seen[b as usize];
        let older = match s {
            _ if s == Seen::Req(w.id) => false,
            _ if s == baseline[b as usize] => true,
            Seen::Req(v) => by_id
                .get(&v)
                .is_some_and(|v| v.ack_ns.is_some_and(|a| a < w.submit_ns)),
            Seen::Zero => true,
        };
        if older {
            bad.push(format!(
                "block {b}: {} is only partly there ({shown} of {} blocks); this block shows {s:?}, \
                 which certainly precedes it: not atomic",
                describe(w),
                w.blocks
            ));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Cycles

/// The last "recovery complete" line of the server's JSON log, as a short summary.
fn recovery_line(log: &str) -> String {
    let Some(line) = log.lines().rev().find(|l| l.contains("recovery complete")) else {
        return "no recovery line".into();
    };
    let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
        return line.to_string();
    };
    let f = &v["fields"];
    format!(
        "replayed {} voided {} torn_tails {} scanned {} B in {:.1} ms",
        f["records_replayed"],
        f["voided"],
        f["torn_tails"],
        f["bytes_scanned"],
        f["elapsed_ms"].as_f64().unwrap_or(f64::NAN)
    )
}

struct CycleStats {
    submitted: usize,
    acked: usize,
    in_flight: usize,
}

/// Runs the writers against the server and SIGKILLs it after `run_ms`, at once or (`on_ack`)
/// at the next acknowledgement a client receives.
fn write_and_kill(
    server: &mut Server,
    run_ms: u64,
    on_ack: bool,
    rng: &mut Rng,
    next_id: &Arc<AtomicU64>,
) -> (Vec<Req>, Vec<String>) {
    let stop = Arc::new(AtomicBool::new(false));
    let killer = Arc::new(Killer {
        child: Mutex::new(server.child.take()),
        armed: AtomicBool::new(false),
        kill_ns: AtomicU64::new(0),
    });
    let handles: Vec<_> = WRITER_DEPTHS
        .iter()
        .enumerate()
        .map(|(w, &depth)| {
            let spec = WriterSpec {
                addr: server.nbd.clone(),
                writer: w as u32,
                depth,
                seed: rng.next(),
                next_id: Arc::clone(next_id),
                stop: Arc::clone(&stop),
                killer: Arc::clone(&killer),
            };
            std::thread::spawn(move || writer(spec))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(run_ms));
    if on_ack {
        killer.armed.store(true, Ordering::SeqCst);
        let deadline = Instant::now() + Duration::from_secs(2);
        while !killer.killed() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    killer.kill();
    let kill_ns = killer.kill_ns.load(Ordering::SeqCst);
    server.child = killer.child.lock().unwrap().take();
    server.kill(); // reaps it
    stop.store(true, Ordering::Relaxed);
    let mut reqs = Vec::new();
    let mut bad = Vec::new();
    for h in handles {
        let log = h.join().unwrap();
        reqs.extend(log.reqs);
        let early = log
            .failures
            .into_iter()
            .filter(|f| f.at_ns < kill_ns || f.what.contains("NBD error"));
        bad.extend(early.map(|f| format!("before the kill: {}", f.what)));
    }
    (reqs, bad)
}

fn summarize(reqs: &[Req]) -> CycleStats {
    let acked = reqs.iter().filter(|r| r.ack_ns.is_some()).count();
    CycleStats {
        submitted: reqs.len(),
        acked,
        in_flight: reqs.len() - acked,
    }
}

fn fail_keeping(
    dir: tempfile::TempDir,
    name: &str,
    cycle: u64,
    bad: &[String],
    server_log: &str,
) -> ! {
    let kept = dir.keep();
    let tail: Vec<&str> = server_log.lines().rev().take(30).collect();
    panic!(
        "{name}: cycle {cycle}: {} violation(s); data kept in {}:\n{}\n--- server log (last lines, newest first) ---\n{}",
        bad.len(),
        kept.display(),
        bad.iter().take(40).cloned().collect::<Vec<_>>().join("\n"),
        tail.join("\n")
    );
}

/// `cycles` kill cycles on a fresh data directory started with `args`, then a clean stop and
/// a final comparison.
fn crash_cycles(name: &str, cycles: u64, args: &[String]) {
    let seed = env_u64("MARINER_CRASH_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
    });
    println!("{name}: {cycles} kill cycles, seed {seed} (MARINER_CRASH_SEED)");
    let mut rng = Rng(seed);
    let dir = scratch(name);
    let data = dir.path().join("data");
    let args: Vec<String> = args
        .iter()
        .map(|a| a.replace("{dir}", &dir.path().display().to_string()))
        .collect();
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let next_id = Arc::new(AtomicU64::new(1));
    let mut baseline = vec![Seen::Zero; REGION_BLOCKS as usize];
    let mut reqs: Vec<Req> = Vec::new();
    let started = Instant::now();
    let mut totals = (0usize, 0usize, 0usize, 0usize);
    for cycle in 0..=cycles {
        let mut server = Server::start(&data, &argv);
        let image = read_region(&server.nbd);
        let (seen, bad) = check(&baseline, &reqs, &image);
        if !bad.is_empty() {
            let log = server.log();
            server.kill();
            fail_keeping(dir, name, cycle, &bad, &log);
        }
        let survived = count_visible(&reqs, &seen);
        if cycle > 0 {
            println!(
                "{name}: cycle {cycle}/{cycles}: in-flight writes visible after restart {survived}; {}",
                recovery_line(&server.log())
            );
            totals.3 += survived;
        }
        baseline = seen;
        if cycle == cycles {
            final_clean_restart(&mut server, &data, &argv, &baseline, name);
            break;
        }
        let run_ms = if rng.next().is_multiple_of(4) {
            rng.range(5, 100)
        } else {
            rng.range(100, 1500)
        };
        let on_ack = !rng.next().is_multiple_of(3);
        let (new_reqs, bad) = write_and_kill(&mut server, run_ms, on_ack, &mut rng, &next_id);
        if !bad.is_empty() {
            fail_keeping(dir, name, cycle, &bad, &server.log());
        }
        let st = summarize(&new_reqs);
        println!(
            "{name}: cycle {}/{cycles}: killed after {run_ms} ms{}: {} writes submitted, {} \
             acknowledged, {} in flight",
            cycle + 1,
            if on_ack { " at an acknowledgement" } else { "" },
            st.submitted,
            st.acked,
            st.in_flight
        );
        totals.0 += st.submitted;
        totals.1 += st.acked;
        totals.2 += st.in_flight;
        reqs = new_reqs;
    }
    println!(
        "{name}: PASS {cycles} kill cycles in {:.1} s: {} writes, {} acknowledged, {} in flight at a kill ({} of them visible after restart)",
        started.elapsed().as_secs_f64(),
        totals.0,
        totals.1,
        totals.2,
        totals.3
    );
    assert!(
        totals.1 > 0,
        "{name}: no write was ever acknowledged: the test proved nothing"
    );
}

/// In-flight writes of the last cycle that show in at least one block.
fn count_visible(reqs: &[Req], seen: &[Seen]) -> usize {
    let visible: std::collections::HashSet<u64> = seen
        .iter()
        .filter_map(|s| {
            if let Seen::Req(id) = s {
                Some(*id)
            } else {
                None
            }
        })
        .collect();
    reqs.iter()
        .filter(|r| r.ack_ns.is_none() && visible.contains(&r.id))
        .count()
}

/// After the last cycle: a clean stop and start must show exactly the same region.
fn final_clean_restart(
    server: &mut Server,
    data: &Path,
    argv: &[&str],
    baseline: &[Seen],
    name: &str,
) {
    assert!(
        server.stop().success(),
        "{name}: unclean exit on SIGTERM: {}",
        server.log()
    );
    let mut again = Server::start(data, argv);
    let image = read_region(&again.nbd);
    let (seen, bad) = check(baseline, &[], &image);
    assert!(bad.is_empty(), "{name}: after a clean restart: {bad:?}");
    assert_eq!(
        seen, baseline,
        "{name}: region changed across a clean restart"
    );
    assert!(
        again.stop().success(),
        "{name}: unclean exit on SIGTERM: {}",
        again.log()
    );
}

/// Total kill cycles: MARINER_CRASH_CYCLES or the default, split over the three variants.
fn cycles_for(variant: u64) -> u64 {
    let total = env_u64("MARINER_CRASH_CYCLES")
        .unwrap_or(DEFAULT_CYCLES)
        .max(3);
    total / 3 + if variant == 0 { total % 3 } else { 0 }
}

fn base_args() -> Vec<String> {
    let a = [
        "--test-volatile",
        "--log-format",
        "json",
        "--log-size",
        "32MiB",
        "--default-volume-size",
        "64MiB",
    ];
    a.iter().map(|s| s.to_string()).collect()
}

#[test]
fn kill_cycles_one_log_device() {
    crash_cycles("crash-1dev", cycles_for(0), &base_args());
}

#[test]
fn kill_cycles_two_log_devices() {
    let mut args = base_args();
    args.extend(["--log-dev", "{dir}/logA", "--log-dev", "{dir}/logB"].map(String::from));
    crash_cycles("crash-2dev", cycles_for(1), &args);
}

#[test]
fn kill_cycles_direct_io() {
    let mut args = base_args();
    args.push("--direct-io".into());
    crash_cycles("crash-direct", cycles_for(2), &args);
}

// ---------------------------------------------------------------------------------------------
// The checker itself: it must flag what it is meant to flag.

fn req(id: u64, first: u64, blocks: u64, submit_ns: u64, ack_ns: Option<u64>) -> Req {
    Req {
        id,
        writer: 0,
        first,
        blocks,
        submit_ns,
        ack_ns,
    }
}

fn image_of(blocks: &[(u64, &Req)]) -> Vec<u8> {
    let mut img = vec![0u8; REGION_BLOCKS as usize * BLOCK];
    for &(b, r) in blocks {
        let p = payload(r.id, 0, b, 1);
        img[b as usize * BLOCK..(b as usize + 1) * BLOCK].copy_from_slice(&p);
    }
    img
}

#[test]
fn checker_flags_lost_torn_and_partial_writes() {
    let zero = vec![Seen::Zero; REGION_BLOCKS as usize];
    let a = req(1, 0, 2, 10, Some(20));
    let b = req(2, 0, 2, 30, Some(40)); // certainly after a
    let c = req(3, 4, 2, 50, None); // in flight at the kill
                                    // Everything there: fine.
    let img = image_of(&[(0, &b), (1, &b), (4, &c), (5, &c)]);
    let (_, bad) = check(&zero, &[a.clone(), b.clone(), c.clone()], &img);
    assert!(bad.is_empty(), "{bad:?}");
    // The in-flight write lost entirely: fine.
    let img = image_of(&[(0, &b), (1, &b)]);
    assert!(check(&zero, &[a.clone(), b.clone(), c.clone()], &img)
        .1
        .is_empty());
    // An acknowledged write lost (older one shows): flagged.
    let img = image_of(&[(0, &a), (1, &b)]);
    assert_eq!(check(&zero, &[a.clone(), b.clone()], &img).1.len(), 1);
    // An acknowledged write lost (zeros show): flagged.
    let img = image_of(&[(0, &b)]);
    assert_eq!(check(&zero, &[a.clone(), b.clone()], &img).1.len(), 1);
    // The in-flight write half there: flagged.
    let img = image_of(&[(0, &b), (1, &b), (4, &c)]);
    assert_eq!(
        check(&zero, &[a.clone(), b.clone(), c.clone()], &img)
            .1
            .len(),
        1
    );
    // A torn block: flagged.
    let mut img = image_of(&[(0, &b), (1, &b)]);
    img[SECTOR..2 * SECTOR].copy_from_slice(&payload(a.id, 0, 0, 1)[SECTOR..2 * SECTOR]);
    assert!(check(&zero, &[a.clone(), b.clone()], &img)
        .1
        .iter()
        .any(|e| e.contains("torn")));
    // A write from an earlier cycle that was not the baseline: flagged.
    let img = image_of(&[(7, &req(99, 7, 1, 0, None))]);
    assert_eq!(check(&zero, &[], &img).1.len(), 1);
}
