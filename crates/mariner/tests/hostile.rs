//! Hostile NBD clients against the real binary, over raw TCP: malformed handshakes and
//! options, oversized lengths, abrupt disconnects, bad requests. Each test ends by checking the
//! server is still up, a fresh client works and the volume's bytes are unchanged.
//!
//! The client here is written from the NBD protocol document (fixed newstyle, simple replies),
//! independently of mariner-nbd's encoders. Every integer on the wire is big-endian.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(clippy::big_endian_bytes)] // the NBD wire is big-endian

mod common;

use common::*;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const VOLUME_BYTES: u64 = 64 * MIB;
const SEED_BYTES: usize = 8 << 20;

const IHAVEOPT: &[u8; 8] = b"IHAVEOPT";
const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;

const FLAG_FIXED_NEWSTYLE: u32 = 1;
const FLAG_NO_ZEROES: u32 = 2;

const OPT_EXPORT_NAME: u32 = 1;
const OPT_ABORT: u32 = 2;
const OPT_LIST: u32 = 3;
const OPT_PEEK_EXPORT: u32 = 4;
const OPT_STARTTLS: u32 = 5;
const OPT_INFO: u32 = 6;
const OPT_GO: u32 = 7;

const OPT_STRUCTURED_REPLY: u32 = 8;
const OPT_SET_META_CONTEXT: u32 = 10;

const INFO_BLOCK_SIZE: u16 = 3;

const REP_ACK: u32 = 1;
const REP_META_CONTEXT: u32 = 4;
const REP_SERVER: u32 = 2;
const REP_INFO: u32 = 3;
const REP_ERR_UNSUP: u32 = 0x8000_0001;
const REP_ERR_POLICY: u32 = 0x8000_0002;
const REP_ERR_INVALID: u32 = 0x8000_0003;
const REP_ERR_UNKNOWN: u32 = 0x8000_0006;
const REP_ERR_TOO_BIG: u32 = 0x8000_0009;

const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_DISC: u16 = 2;
const CMD_FLUSH: u16 = 3;
const CMD_TRIM: u16 = 4;
const CMD_WRITE_ZEROES: u16 = 6;
const CMD_BLOCK_STATUS: u16 = 7;

const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;
const CHUNK_FLAG_DONE: u16 = 1;
const CHUNK_OFFSET_DATA: u16 = 1;
const CHUNK_BLOCK_STATUS: u16 = 5;
const CHUNK_ERROR: u16 = 0x8001;

const EINVAL: u32 = 22;
const EOVERFLOW: u32 = 75;
const ENOSPC: u32 = 28;

/// A raw NBD client connection.
struct Raw {
    s: TcpStream,
    /// Largest READ/WRITE payload, from NBD_INFO_BLOCK_SIZE (0 before NBD_OPT_GO).
    max_payload: u32,
}

/// One option reply: (option, reply type, data).
type OptReply = (u32, u32, Vec<u8>);

impl Raw {
    /// Connects and reads the server greeting.
    fn connect(addr: &str) -> Raw {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.set_nodelay(true).unwrap();
        let mut r = Raw { s, max_payload: 0 };
        let mut g = [0u8; 18];
        r.s.read_exact(&mut g).unwrap();
        assert_eq!(&g[..16], b"NBDMAGICIHAVEOPT", "greeting");
        let flags = u16::from_be_bytes([g[16], g[17]]);
        assert_eq!(flags & 1, 1, "server must offer fixed newstyle");
        r
    }

    /// Connects and sends the usual client flags.
    fn negotiating(addr: &str) -> Raw {
        let mut r = Raw::connect(addr);
        r.send(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
        r
    }

    /// Connects and enters transmission on `export` with NBD_OPT_GO.
    fn ready(addr: &str, export: &str) -> Raw {
        let mut r = Raw::negotiating(addr);
        let size = r.go(export);
        assert_eq!(size, VOLUME_BYTES);
        r
    }

    fn send(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).unwrap();
    }

    /// Sends, tolerating a server that already closed.
    fn send_lossy(&mut self, bytes: &[u8]) {
        let _ = self.s.write_all(bytes);
    }

    fn option_header(opt: u32, len: u32) -> Vec<u8> {
        let mut b = IHAVEOPT.to_vec();
        b.extend_from_slice(&opt.to_be_bytes());
        b.extend_from_slice(&len.to_be_bytes());
        b
    }

    fn option(&mut self, opt: u32, data: &[u8]) {
        let mut b = Self::option_header(opt, data.len() as u32);
        b.extend_from_slice(data);
        self.send(&b);
    }

    fn reply(&mut self) -> OptReply {
        let mut h = [0u8; 20];
        self.s.read_exact(&mut h).unwrap();
        assert_eq!(
            u64::from_be_bytes(h[..8].try_into().unwrap()),
            OPT_REPLY_MAGIC,
            "option reply magic"
        );
        let opt = u32::from_be_bytes(h[8..12].try_into().unwrap());
        let typ = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(h[16..20].try_into().unwrap());
        assert!(len <= 1 << 20, "option reply of {len} bytes");
        let mut data = vec![0u8; len as usize];
        self.s.read_exact(&mut data).unwrap();
        (opt, typ, data)
    }

    /// Sends an option and returns its single reply, checking it answers that option.
    fn ask(&mut self, opt: u32, data: &[u8]) -> OptReply {
        self.option(opt, data);
        let r = self.reply();
        assert_eq!(r.0, opt, "reply to the wrong option: {r:?}");
        r
    }

    fn go_data(name: &str) -> Vec<u8> {
        let mut d = (name.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(name.as_bytes());
        d.extend_from_slice(&0u16.to_be_bytes());
        d
    }

    /// NBD_OPT_GO asking for NBD_INFO_BLOCK_SIZE; returns the export size and records the
    /// maximum payload. Panics on refusal.
    fn go(&mut self, name: &str) -> u64 {
        let mut data = Self::go_data(name);
        let n = data.len();
        data[n - 2..].copy_from_slice(&1u16.to_be_bytes());
        data.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        self.option(OPT_GO, &data);
        let mut size = None;
        loop {
            let (opt, typ, data) = self.reply();
            assert_eq!(opt, OPT_GO);
            match typ {
                REP_ACK => {
                    assert!(
                        self.max_payload >= 64 << 10,
                        "max payload {}",
                        self.max_payload
                    );
                    return size.expect("NBD_INFO_EXPORT before the ACK");
                }
                REP_INFO if data.len() == 12 && data[..2] == [0, 0] => {
                    size = Some(u64::from_be_bytes(data[2..10].try_into().unwrap()));
                }
                REP_INFO if data.len() == 14 && data[..2] == INFO_BLOCK_SIZE.to_be_bytes() => {
                    let word = |i: usize| u32::from_be_bytes(data[i..i + 4].try_into().unwrap());
                    assert_eq!(
                        (word(2), word(6)),
                        (1, 4096),
                        "min and preferred block size"
                    );
                    self.max_payload = word(10);
                }
                REP_INFO => {}
                other => panic!(
                    "GO {name:?} refused: {other:#x} {}",
                    String::from_utf8_lossy(&data)
                ),
            }
        }
    }

    fn request_bytes(flags: u16, cmd: u16, cookie: u64, offset: u64, len: u32) -> Vec<u8> {
        let mut b = REQUEST_MAGIC.to_be_bytes().to_vec();
        b.extend_from_slice(&flags.to_be_bytes());
        b.extend_from_slice(&cmd.to_be_bytes());
        b.extend_from_slice(&cookie.to_be_bytes());
        b.extend_from_slice(&offset.to_be_bytes());
        b.extend_from_slice(&len.to_be_bytes());
        b
    }

    fn request(&mut self, cmd: u16, cookie: u64, offset: u64, len: u32, payload: &[u8]) {
        let mut b = Self::request_bytes(0, cmd, cookie, offset, len);
        b.extend_from_slice(payload);
        self.send(&b);
    }

    /// A simple reply header: (error, cookie).
    fn simple_reply(&mut self) -> (u32, u64) {
        let mut h = [0u8; 16];
        self.s.read_exact(&mut h).unwrap();
        assert_eq!(
            u32::from_be_bytes(h[..4].try_into().unwrap()),
            SIMPLE_REPLY_MAGIC,
            "reply magic"
        );
        let error = u32::from_be_bytes(h[4..8].try_into().unwrap());
        (error, u64::from_be_bytes(h[8..16].try_into().unwrap()))
    }

    /// Expects the reply to `cookie` and returns its error code.
    fn reply_to(&mut self, cookie: u64) -> u32 {
        let (error, got) = self.simple_reply();
        assert_eq!(got, cookie, "reply cookie");
        error
    }

    fn read(&mut self, offset: u64, len: u32) -> Vec<u8> {
        let cookie = 0x5EAD_0000 + offset;
        self.request(CMD_READ, cookie, offset, len, &[]);
        assert_eq!(self.reply_to(cookie), 0, "READ {offset} +{len}");
        let mut data = vec![0u8; len as usize];
        self.s.read_exact(&mut data).unwrap();
        data
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let cookie = 0x3217_0000 + offset;
        self.request(CMD_WRITE, cookie, offset, data.len() as u32, data);
        assert_eq!(self.reply_to(cookie), 0, "WRITE {offset} +{}", data.len());
    }

    /// A request that must be answered with an error (any nonzero code if `want` is None),
    /// after which the connection still works.
    fn refused(
        &mut self,
        what: &str,
        (cmd, flags): (u16, u16),
        offset: u64,
        len: u32,
        payload: &[u8],
        want: Option<u32>,
    ) {
        let cookie = 0xBAD0_0000_0000 + u64::from(cmd) * 0x1_0000 + u64::from(flags);
        let mut b = Self::request_bytes(flags, cmd, cookie, offset, len);
        b.extend_from_slice(payload);
        self.send(&b);
        let error = self.reply_to(cookie);
        match want {
            Some(code) => assert_eq!(error, code, "{what}: error code"),
            None => assert_ne!(error, 0, "{what}: accepted"),
        }
        // The stream is still in step: a valid request right after works.
        let seed = seed_data();
        assert_eq!(
            self.read(4096, 4096),
            &seed[4096..8192],
            "{what}: read after the refusal"
        );
    }

    /// A READ/WRITE size that fits the maximum payload: a power of two, at most 1 MiB.
    fn chunk(&self) -> u32 {
        let mut c = 1u32 << 20;
        while c > self.max_payload {
            c /= 2;
        }
        c
    }

    fn disconnect(mut self) {
        self.request(CMD_DISC, 0, 0, 0, &[]);
    }

    /// Waits until the server closes the connection; returns what it sent before.
    fn expect_closed(&mut self, what: &str) -> Vec<u8> {
        let start = Instant::now();
        let mut got = Vec::new();
        let mut buf = [0u8; 65536];
        loop {
            match self.s.read(&mut buf) {
                Ok(0) => return got,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::ConnectionReset => return got,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) => panic!("{what}: {e}"),
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "{what}: server kept the connection open"
            );
            assert!(got.len() < 1 << 20, "{what}: server keeps sending");
        }
    }
}

fn seed_data() -> Vec<u8> {
    random_bytes(0x0405_711e, SEED_BYTES)
}

/// A server whose vol0 holds the seed in [0, 8 MiB) and zeros after.
fn seeded_server(name: &str) -> (tempfile::TempDir, Server) {
    let dir = scratch(name);
    let s = Server::start(&dir.path().join("data"), SMALL);
    let seed = seed_data();
    let mut c = Raw::ready(&s.nbd, "vol0");
    let step = c.chunk();
    for (i, chunk) in seed.chunks(step as usize).enumerate() {
        c.write(i as u64 * u64::from(step), chunk);
    }
    c.disconnect();
    (dir, s)
}

/// The server is up, a fresh client (raw and real) works, and the volume holds exactly the
/// seed followed by zeros.
fn assert_intact(s: &mut Server) {
    s.assert_running();
    let mut c = Raw::ready(&s.nbd, "");
    let seed = seed_data();
    let mut at = 0u64;
    while at < VOLUME_BYTES {
        let len = c.chunk().min((VOLUME_BYTES - at) as u32);
        let got = c.read(at, len);
        for (i, chunk) in got.chunks(512).enumerate() {
            let off = at as usize + i * 512;
            let want: &[u8] = if off < SEED_BYTES {
                &seed[off..off + 512]
            } else {
                &[0u8; 512]
            };
            assert!(chunk == want, "volume changed at byte offset {off}");
        }
        at += u64::from(len);
    }
    c.disconnect();
    require("nbdinfo");
    let out = run(std::process::Command::new("nbdinfo")
        .arg("--size")
        .arg(s.url("vol0")));
    assert_eq!(out.trim(), VOLUME_BYTES.to_string());
    s.assert_running();
}

#[test]
fn malformed_handshakes_are_cut_off() {
    let (_dir, mut s) = seeded_server("hs");
    // Connect and leave during the greeting.
    drop(TcpStream::connect(&s.nbd).unwrap());
    drop(Raw::connect(&s.nbd));
    // Client flags without fixed newstyle, or with unknown bits.
    for flags in [0u32, FLAG_NO_ZEROES, 0xFFFF_FFFF, 1 << 7 | 1] {
        let mut c = Raw::connect(&s.nbd);
        c.send(&flags.to_be_bytes());
        c.expect_closed(&format!("client flags {flags:#x}"));
    }
    // An option with a bad magic.
    let mut c = Raw::negotiating(&s.nbd);
    let mut bad = b"IHAVEOPX".to_vec();
    bad.extend_from_slice(&OPT_GO.to_be_bytes());
    bad.extend_from_slice(&0u32.to_be_bytes());
    c.send(&bad);
    c.expect_closed("bad option magic");
    // A bad magic after a good option.
    let mut c = Raw::negotiating(&s.nbd);
    assert_eq!(c.ask(OPT_STARTTLS, &[]).1, REP_ERR_POLICY);
    c.send(&[0xFF; 16]);
    c.expect_closed("bad option magic after a good option");
    // Something that is not NBD at all.
    let mut c = Raw::connect(&s.nbd);
    c.send_lossy(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    c.expect_closed("HTTP request");
    let mut c = Raw::connect(&s.nbd);
    c.send_lossy(&random_bytes(5, 64 << 10));
    c.expect_closed("random bytes");
    assert_intact(&mut s);
    assert!(s.stop().success(), "{}", s.log());
}

#[test]
fn bad_options_get_error_replies_and_the_session_continues() {
    let (_dir, mut s) = seeded_server("opts");
    let mut c = Raw::negotiating(&s.nbd);
    // STARTTLS is refused by policy (TLS is not offered).
    let (_, typ, msg) = c.ask(OPT_STARTTLS, &[]);
    assert_eq!(
        typ,
        REP_ERR_POLICY,
        "STARTTLS: {}",
        String::from_utf8_lossy(&msg)
    );
    // Unknown and withdrawn options.
    assert_eq!(c.ask(0x1234, b"whatever").1, REP_ERR_UNSUP);
    assert_eq!(c.ask(0x7FFF_FFFF, &[]).1, REP_ERR_UNSUP);
    assert_eq!(c.ask(OPT_PEEK_EXPORT, &[]).1, REP_ERR_UNSUP);
    // Option data beyond the server's limit is skipped and refused.
    let big = vec![0xAB; 100 << 10];
    let (_, typ, _) = c.ask(OPT_INFO, &big);
    assert_eq!(typ, REP_ERR_TOO_BIG, "100 KiB NBD_OPT_INFO");
    // Malformed option data.
    let mut liar = 1000u32.to_be_bytes().to_vec(); // name length beyond the data
    liar.extend_from_slice(b"vol0\0\0");
    assert_eq!(c.ask(OPT_GO, &liar).1, REP_ERR_INVALID);
    let mut trailing = Raw::go_data("vol0");
    trailing.extend_from_slice(b"junk");
    assert_eq!(
        c.ask(OPT_INFO, &trailing).1,
        REP_ERR_INVALID,
        "trailing bytes"
    );
    assert_eq!(c.ask(OPT_GO, &[0, 0]).1, REP_ERR_INVALID, "short GO");
    // Names that do not exist.
    for name in ["nope", "vol0 ", "VOL0", "../vol0", "vol0/"] {
        assert_eq!(
            c.ask(OPT_GO, &Raw::go_data(name)).1,
            REP_ERR_UNKNOWN,
            "GO {name:?}"
        );
        assert_eq!(
            c.ask(OPT_INFO, &Raw::go_data(name)).1,
            REP_ERR_UNKNOWN,
            "INFO {name:?}"
        );
    }
    // A NUL in a name: not a valid name or not an export; either way an error.
    let typ = c.ask(OPT_GO, &Raw::go_data("vol0\0")).1;
    assert!(
        typ == REP_ERR_UNKNOWN || typ == REP_ERR_INVALID,
        "GO \"vol0\\0\": {typ:#x}"
    );
    // LIST names the volume.
    c.option(OPT_LIST, &[]);
    let (_, typ, data) = c.reply();
    assert_eq!(typ, REP_SERVER);
    assert_eq!(&data[4..8], b"vol0", "{data:?}");
    assert_eq!(c.reply().1, REP_ACK);
    assert_eq!(c.ask(OPT_LIST, b"x").1, REP_ERR_INVALID, "LIST with data");
    // After all that, the same session can still select the export and use it.
    assert_eq!(c.go("vol0"), VOLUME_BYTES);
    assert_eq!(c.read(0, 4096), &seed_data()[..4096]);
    c.disconnect();

    // NBD_OPT_ABORT is acknowledged and the connection closed.
    let mut c = Raw::negotiating(&s.nbd);
    assert_eq!(c.ask(OPT_ABORT, &[]).1, REP_ACK);
    c.expect_closed("after NBD_OPT_ABORT");
    // An unknown name through NBD_OPT_EXPORT_NAME can only be answered by closing.
    let mut c = Raw::negotiating(&s.nbd);
    c.option(OPT_EXPORT_NAME, b"nope");
    assert!(c.expect_closed("EXPORT_NAME nope").is_empty());
    let mut c = Raw::negotiating(&s.nbd);
    c.send(&Raw::option_header(OPT_EXPORT_NAME, 5000));
    c.send_lossy(&[b'a'; 5000]);
    c.expect_closed("EXPORT_NAME of 5000 bytes");
    // The old way in still works: size, flags, no zero padding (NO_ZEROES).
    let mut c = Raw::negotiating(&s.nbd);
    c.option(OPT_EXPORT_NAME, b"vol0");
    let mut r = [0u8; 10];
    c.s.read_exact(&mut r).unwrap();
    assert_eq!(u64::from_be_bytes(r[..8].try_into().unwrap()), VOLUME_BYTES);
    assert_eq!(
        c.read(MIB, 4096),
        &seed_data()[MIB as usize..MIB as usize + 4096]
    );
    c.disconnect();
    // Too many options.
    let mut c = Raw::negotiating(&s.nbd);
    let mut many = Vec::new();
    for _ in 0..1100 {
        many.extend_from_slice(&Raw::option_header(0x1234, 0));
    }
    c.send_lossy(&many);
    let sent = c.expect_closed("1100 options");
    assert!(
        sent.len() >= 20 && sent.len() < 1100 * 20,
        "{} bytes of replies",
        sent.len()
    );
    assert_intact(&mut s);
    assert!(s.stop().success(), "{}", s.log());
}

#[test]
fn huge_option_lengths_neither_allocate_nor_hang() {
    let (_dir, mut s) = seeded_server("bigopt");
    let rss = rss_kib(s.pid());
    for opt in [OPT_GO, OPT_INFO, OPT_LIST, 0x4242] {
        let mut c = Raw::negotiating(&s.nbd);
        c.send(&Raw::option_header(opt, u32::MAX));
        c.send_lossy(&vec![0x55; 1 << 20]);
        drop(c);
    }
    // A client that announces 4 GiB and keeps the connection open does not block others.
    let mut stuck = Raw::negotiating(&s.nbd);
    stuck.send(&Raw::option_header(OPT_INFO, u32::MAX));
    stuck.send(&[0u8; 4096]);
    let mut c = Raw::ready(&s.nbd, "vol0");
    assert_eq!(c.read(0, 512), &seed_data()[..512]);
    c.disconnect();
    drop(stuck);
    let grown = rss_kib(s.pid()).saturating_sub(rss);
    eprintln!("server RSS grew by {grown} KiB");
    assert!(grown < 64 * 1024, "server grew by {grown} KiB");
    assert_intact(&mut s);
    assert!(s.stop().success(), "{}", s.log());
}

#[test]
fn abrupt_disconnects_mid_option_and_mid_write_change_nothing() {
    let (_dir, mut s) = seeded_server("abrupt");
    for round in 0..10u64 {
        // Mid option header, mid option data.
        let mut c = Raw::negotiating(&s.nbd);
        c.send(&IHAVEOPT[..5]);
        drop(c);
        let mut c = Raw::negotiating(&s.nbd);
        c.send(&Raw::option_header(OPT_GO, 100));
        c.send(&Raw::go_data("vol0")[..6]);
        drop(c);
        // Mid request header.
        let mut c = Raw::ready(&s.nbd, "vol0");
        c.send(&Raw::request_bytes(0, CMD_WRITE, 1, 0, 4096)[..10]);
        drop(c);
        // Mid write payload: 1000 of 1 MiB, over seeded data and over zeros.
        for offset in [round * 512 * 1024, 32 * MIB + round * MIB] {
            let mut c = Raw::ready(&s.nbd, "vol0");
            c.request(CMD_WRITE, 2, offset, MIB as u32, &[0xEE; 1000]);
            drop(c);
        }
        // A full write payload minus one byte.
        let mut c = Raw::ready(&s.nbd, "vol0");
        c.request(CMD_WRITE, 3, 40 * MIB, 65536, &[0xEE; 65535]);
        drop(c);
        // Requests in flight when the client vanishes.
        let mut c = Raw::ready(&s.nbd, "vol0");
        for i in 0..16u64 {
            c.request(CMD_READ, i, i * MIB, MIB as u32, &[]);
        }
        drop(c);
    }
    assert_intact(&mut s);
    assert!(s.stop().success(), "{}", s.log());
}

#[test]
fn bad_request_magic_closes_the_connection() {
    let (_dir, mut s) = seeded_server("reqmagic");
    let mut c = Raw::ready(&s.nbd, "vol0");
    assert_eq!(c.read(0, 512), &seed_data()[..512]);
    let mut bad = Raw::request_bytes(0, CMD_WRITE, 9, 0, 512);
    bad[..4].copy_from_slice(&0x2560_9514u32.to_be_bytes());
    bad.extend_from_slice(&[0xEE; 512]);
    c.send(&bad);
    c.expect_closed("bad request magic");
    // Request bytes shifted by one (a client that lost its framing).
    let mut c = Raw::ready(&s.nbd, "vol0");
    let mut shifted = vec![0u8];
    shifted.extend_from_slice(&Raw::request_bytes(0, CMD_WRITE, 9, 0, 512));
    shifted.extend_from_slice(&[0xEE; 512]);
    c.send_lossy(&shifted);
    c.expect_closed("misframed request");
    // An option during transmission.
    let mut c = Raw::ready(&s.nbd, "vol0");
    let mut opt = Raw::option_header(OPT_GO, 10);
    opt.extend_from_slice(&Raw::go_data("vol0"));
    opt.extend_from_slice(&[0; 16]);
    c.send_lossy(&opt);
    c.expect_closed("option during transmission");
    assert_intact(&mut s);
    assert!(s.stop().success(), "{}", s.log());
}

#[test]
fn a_write_header_announcing_one_gib_is_refused_without_allocating() {
    let (_dir, mut s) = seeded_server("gibwrite");
    let rss = rss_kib(s.pid());
    for len in [1u32 << 30, u32::MAX, (32 << 20) + 512] {
        let mut c = Raw::ready(&s.nbd, "vol0");
        let cookie = 77;
        c.request(CMD_WRITE, cookie, 0, len, &[0xEE; 4096]);
        // Either an EINVAL reply or a closed connection, promptly, without the payload.
        let got = c.expect_closed(&format!("WRITE of {len} bytes"));
        if !got.is_empty() {
            assert!(got.len() >= 16, "{got:?}");
            assert_eq!(&got[..4], &SIMPLE_REPLY_MAGIC.to_be_bytes());
            assert_eq!(u32::from_be_bytes(got[4..8].try_into().unwrap()), EINVAL);
            assert_eq!(u64::from_be_bytes(got[8..16].try_into().unwrap()), cookie);
        }
    }
    let grown = rss_kib(s.pid()).saturating_sub(rss);
    eprintln!("server RSS grew by {grown} KiB");
    assert!(grown < 64 * 1024, "server grew by {grown} KiB");
    // A READ that large is refused, the connection stays usable.
    let mut c = Raw::ready(&s.nbd, "vol0");
    c.refused("1 GiB READ", (CMD_READ, 0), 0, 1 << 30, &[], Some(EINVAL));
    // A WRITE above the advertised maximum but small enough to skip: refused, its payload
    // skipped, not parsed. The payload is made of valid WRITE requests that would overwrite the
    // seed if the server took them for requests.
    let mut payload = Vec::new();
    while payload.len() < (8 << 20) {
        payload.extend_from_slice(&Raw::request_bytes(0, CMD_WRITE, 5, 0, 512));
        payload.extend_from_slice(&[0xEE; 512]);
    }
    payload.truncate(8 << 20);
    c.refused(
        "8 MiB WRITE",
        (CMD_WRITE, 0),
        0,
        8 << 20,
        &payload,
        Some(EINVAL),
    );
    c.disconnect();
    assert_intact(&mut s);
    assert!(s.stop().success(), "{}", s.log());
}

#[test]
fn out_of_range_and_unknown_requests_get_errors_and_partial_blocks_work() {
    let (_dir, mut s) = seeded_server("badreq");
    let mut c = Raw::ready(&s.nbd, "vol0");
    let end = VOLUME_BYTES;
    let p512 = [0xEE; 512];
    // Out of range: READ/TRIM answer EINVAL, WRITE/WRITE_ZEROES ENOSPC (the spec's choice).
    c.refused(
        "READ at the end",
        (CMD_READ, 0),
        end,
        512,
        &[],
        Some(EINVAL),
    );
    c.refused(
        "READ across the end",
        (CMD_READ, 0),
        end - 512,
        1024,
        &[],
        Some(EINVAL),
    );
    c.refused(
        "READ far away",
        (CMD_READ, 0),
        1 << 62,
        512,
        &[],
        Some(EINVAL),
    );
    c.refused(
        "READ wrapping u64",
        (CMD_READ, 0),
        u64::MAX - 511,
        1024,
        &[],
        Some(EINVAL),
    );
    c.refused(
        "WRITE at the end",
        (CMD_WRITE, 0),
        end,
        512,
        &p512,
        Some(ENOSPC),
    );
    c.refused(
        "WRITE across the end",
        (CMD_WRITE, 0),
        end - 512,
        1024,
        &[0xEE; 1024],
        Some(ENOSPC),
    );
    c.refused(
        "WRITE wrapping u64",
        (CMD_WRITE, 0),
        u64::MAX - 511,
        1024,
        &[0xEE; 1024],
        Some(ENOSPC),
    );
    c.refused(
        "TRIM across the end",
        (CMD_TRIM, 0),
        end - 512,
        4096,
        &[],
        Some(EINVAL),
    );
    c.refused(
        "WRITE_ZEROES across the end",
        (CMD_WRITE_ZEROES, 0),
        end - 512,
        4096,
        &[],
        Some(ENOSPC),
    );
    // Partial blocks are served (the minimum block size is 1), in the zero area at 40 MiB;
    // everything is zero again afterwards.
    let base = 40 * MIB;
    c.write(base + 256, &p512);
    c.write(base + 1000, &[0xEE; 700]);
    let mut want = vec![0u8; 4096];
    want[256..768].fill(0xEE);
    want[1000..1700].fill(0xEE);
    assert_eq!(c.read(base + 1, 4095), &want[1..], "READ at an odd offset");
    assert_eq!(
        c.read(base + 250, 100),
        &want[250..350],
        "READ of 100 bytes"
    );
    c.request(CMD_WRITE_ZEROES, 3, base + 300, 10, &[]);
    assert_eq!(c.reply_to(3), 0, "WRITE_ZEROES of 10 bytes");
    want[300..310].fill(0);
    c.request(CMD_TRIM, 4, base + 100, 1500, &[]);
    assert_eq!(c.reply_to(4), 0, "TRIM at offset 100");
    want[100..1600].fill(0);
    assert_eq!(
        c.read(base, 4096),
        want,
        "after the partial zeroing and trim"
    );
    c.request(CMD_WRITE_ZEROES, 5, base, 4096, &[]);
    assert_eq!(c.reply_to(5), 0, "WRITE_ZEROES of the page");
    // Unknown commands and flags.
    for cmd in [8u16, 42, 0x7FFF, 0xFFFF] {
        c.refused(
            &format!("command {cmd}"),
            (cmd, 0),
            0,
            512,
            &[],
            Some(EINVAL),
        );
    }
    c.refused(
        "BLOCK_STATUS without a metadata context",
        (CMD_BLOCK_STATUS, 0),
        0,
        4096,
        &[],
        Some(EINVAL),
    );
    c.refused(
        "READ with unknown flag",
        (CMD_READ, 0x8000),
        0,
        512,
        &[],
        Some(EINVAL),
    );
    c.refused(
        "WRITE with unknown flag",
        (CMD_WRITE, 0x4000),
        0,
        512,
        &p512,
        Some(EINVAL),
    );
    // Valid requests still work, including FLUSH and a write to the zero area that we undo.
    c.request(CMD_FLUSH, 1, 0, 0, &[]);
    assert_eq!(c.reply_to(1), 0, "FLUSH");
    c.write(50 * MIB, &[0xEE; 4096]);
    assert_eq!(c.read(50 * MIB, 4096), vec![0xEE; 4096]);
    c.request(CMD_TRIM, 2, 50 * MIB, 4096, &[]);
    assert_eq!(c.reply_to(2), 0, "TRIM");
    assert_eq!(c.read(50 * MIB, 4096), vec![0; 4096]);
    c.disconnect();
    assert_intact(&mut s);
    assert!(s.stop().success(), "{}", s.log());
}

#[test]
fn a_client_that_never_reads_its_replies_does_not_stall_others() {
    let (_dir, mut s) = seeded_server("noread");
    let rss = rss_kib(s.pid());
    let mut greedy = Raw::ready(&s.nbd, "vol0");
    let mut pipelined = Vec::new();
    let len = greedy.chunk();
    for i in 0..800u64 {
        pipelined.extend_from_slice(&Raw::request_bytes(
            0,
            CMD_READ,
            i,
            (i % 32) * u64::from(len),
            len,
        ));
    }
    // Hundreds of MiB of replies requested; the socket fills and the server must stop reading.
    greedy
        .s
        .set_write_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let _ = greedy.s.write_all(&pipelined);
    std::thread::sleep(Duration::from_millis(500));
    let mut other = Raw::ready(&s.nbd, "vol0");
    assert_eq!(
        other.read(2 * MIB, 4096),
        &seed_data()[2 * MIB as usize..2 * MIB as usize + 4096]
    );
    other.write(60 * MIB, &[0xEE; 4096]);
    other.request(CMD_TRIM, 9, 60 * MIB, 4096, &[]);
    assert_eq!(other.reply_to(9), 0);
    other.disconnect();
    let grown = rss_kib(s.pid()).saturating_sub(rss);
    eprintln!("server RSS grew by {grown} KiB");
    assert!(
        grown < 100 * 1024,
        "server grew by {grown} KiB for one slow client"
    );
    drop(greedy);
    assert_intact(&mut s);
    assert!(s.stop().success(), "{}", s.log());
}

/// One structured reply chunk: (flags, type, cookie, payload).
fn chunk(c: &mut Raw) -> (u16, u16, u64, Vec<u8>) {
    let mut h = [0u8; 20];
    c.s.read_exact(&mut h).unwrap();
    assert_eq!(
        u32::from_be_bytes(h[..4].try_into().unwrap()),
        STRUCTURED_REPLY_MAGIC,
        "chunk magic"
    );
    let flags = u16::from_be_bytes([h[4], h[5]]);
    let typ = u16::from_be_bytes([h[6], h[7]]);
    let cookie = u64::from_be_bytes(h[8..16].try_into().unwrap());
    let len = u32::from_be_bytes(h[16..20].try_into().unwrap());
    assert!(len <= 8 << 20, "chunk of {len} bytes");
    let mut payload = vec![0u8; len as usize];
    c.s.read_exact(&mut payload).unwrap();
    (flags, typ, cookie, payload)
}

/// Sends a request expected to fail and returns the error code from its error chunk.
fn structured_error(c: &mut Raw, what: &str, cmd: u16, offset: u64, len: u32) -> u32 {
    let cookie = 0xE000 + u64::from(cmd);
    c.request(cmd, cookie, offset, len, &[]);
    let (flags, typ, got, payload) = chunk(c);
    assert_eq!(got, cookie, "{what}: cookie");
    assert_eq!(typ, CHUNK_ERROR, "{what}: chunk type");
    assert_ne!(
        flags & CHUNK_FLAG_DONE,
        0,
        "{what}: error chunk must end the reply"
    );
    assert!(payload.len() >= 6, "{what}: {payload:?}");
    let msg_len = u16::from_be_bytes([payload[4], payload[5]]) as usize;
    assert_eq!(payload.len(), 6 + msg_len, "{what}: error message length");
    u32::from_be_bytes(payload[..4].try_into().unwrap())
}

#[test]
fn structured_replies_report_errors_in_chunks() {
    let (_dir, mut s) = seeded_server("structured");
    let mut c = Raw::negotiating(&s.nbd);
    assert_eq!(c.ask(OPT_STRUCTURED_REPLY, &[]).1, REP_ACK);
    let mut meta = Vec::new();
    meta.extend_from_slice(&4u32.to_be_bytes());
    meta.extend_from_slice(b"vol0");
    meta.extend_from_slice(&1u32.to_be_bytes());
    meta.extend_from_slice(&15u32.to_be_bytes());
    meta.extend_from_slice(b"base:allocation");
    c.option(OPT_SET_META_CONTEXT, &meta);
    let (_, typ, data) = c.reply();
    assert_eq!(typ, REP_META_CONTEXT, "{}", String::from_utf8_lossy(&data));
    let context = u32::from_be_bytes(data[..4].try_into().unwrap());
    assert_eq!(&data[4..], b"base:allocation");
    assert_eq!(c.reply().1, REP_ACK);
    assert_eq!(c.go("vol0"), VOLUME_BYTES);

    let end = VOLUME_BYTES;
    assert_eq!(
        structured_error(&mut c, "READ past the end", CMD_READ, end, 512),
        EINVAL
    );
    assert_eq!(
        structured_error(&mut c, "READ of 1 GiB", CMD_READ, 0, 1 << 30),
        EOVERFLOW
    );
    assert_eq!(
        structured_error(&mut c, "odd READ across the end", CMD_READ, end - 3, 512),
        EINVAL
    );
    assert_eq!(
        structured_error(
            &mut c,
            "BLOCK_STATUS past the end",
            CMD_BLOCK_STATUS,
            end,
            4096
        ),
        EINVAL
    );
    assert_eq!(
        structured_error(&mut c, "BLOCK_STATUS of 0 bytes", CMD_BLOCK_STATUS, 0, 0),
        EINVAL
    );
    assert_eq!(
        structured_error(&mut c, "unknown command", 42, 0, 512),
        EINVAL
    );

    // Still in step: a structured READ and a BLOCK_STATUS answer correctly.
    c.request(CMD_READ, 1, 0, 8192, &[]);
    let mut data = Vec::new();
    loop {
        let (flags, typ, cookie, payload) = chunk(&mut c);
        assert_eq!(cookie, 1);
        if typ == CHUNK_OFFSET_DATA {
            let at = u64::from_be_bytes(payload[..8].try_into().unwrap());
            assert_eq!(at, data.len() as u64, "chunks in order for this check");
            data.extend_from_slice(&payload[8..]);
        } else {
            assert_eq!(typ, 0, "READ chunk type {typ:#x}");
        }
        if flags & CHUNK_FLAG_DONE != 0 {
            break;
        }
    }
    assert_eq!(data, &seed_data()[..8192]);
    c.request(CMD_BLOCK_STATUS, 2, 6 * MIB, (4 * MIB) as u32, &[]);
    let (flags, typ, cookie, payload) = chunk(&mut c);
    assert_eq!((typ, cookie), (CHUNK_BLOCK_STATUS, 2));
    assert_ne!(flags & CHUNK_FLAG_DONE, 0);
    assert_eq!(
        u32::from_be_bytes(payload[..4].try_into().unwrap()),
        context
    );
    let extents: Vec<(u32, u32)> = payload[4..]
        .chunks(8)
        .map(|e| {
            (
                u32::from_be_bytes(e[..4].try_into().unwrap()),
                u32::from_be_bytes(e[4..].try_into().unwrap()),
            )
        })
        .collect();
    assert!(!extents.is_empty(), "{extents:?}");
    assert_eq!(
        extents[0].1 & 1,
        0,
        "seeded data reported as a hole: {extents:?}"
    );
    let data_len: u64 = extents
        .iter()
        .take_while(|e| e.1 & 1 == 0)
        .map(|e| u64::from(e.0))
        .sum();
    assert_eq!(
        data_len,
        2 * MIB,
        "data up to the end of the seed: {extents:?}"
    );
    c.disconnect();
    assert_intact(&mut s);
    assert!(s.stop().success(), "{}", s.log());
}
