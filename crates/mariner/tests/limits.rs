//! Node-wide limits end to end (`[limits]`, docs/CONFIG.md): the real server, in a 256 MiB
//! memory cgroup whose limit includes its page cache and with the default limits, takes 500
//! hostile NBD connections that each send a 4 MiB WRITE one byte short of its payload. Without
//! a node-wide budget each connection buffered its 4 MiB (the server went from 18 MiB to 2 GiB
//! and is OOM-killed here); with it the server holds at most the budget, refuses connections
//! beyond the cap with a logged reason, and serves a normal client once the hostile ones
//! are gone.
//!
//! Needs root for the cgroup (CI runs the suite as root); fails, never skips, without it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

const MIB: u64 = 1 << 20;
/// The cgroup's limit (process memory and page cache).
const LIMIT_BYTES: u64 = 256 * MIB;
/// Hostile connections.
const HOSTILE: usize = 500;
/// Each one's WRITE: it fits one log record of the default 256 MiB log.
const WRITE_BYTES: usize = 4 << 20;
/// The default `limits.max_in_flight_bytes`.
const BUDGET: u64 = 64 * MIB;
/// The default `limits.max_connections`.
const MAX_CONNECTIONS: usize = 512;
/// What the server may hold beyond the budget: its own baseline and ~80 KiB of buffers per
/// connection waiting for budget (measured: 88 MiB peak in all with the debug build).
const MARGIN: u64 = 96 * MIB;

/// NBD_CMD_WRITE of `len` bytes at offset 0.
#[allow(clippy::big_endian_bytes)] // the NBD wire is big-endian
fn write_header(cookie: u64, len: u32) -> Vec<u8> {
    let mut h = Vec::with_capacity(28);
    h.extend_from_slice(&0x2560_9513u32.to_be_bytes());
    h.extend_from_slice(&0u16.to_be_bytes()); // flags
    h.extend_from_slice(&1u16.to_be_bytes()); // NBD_CMD_WRITE
    h.extend_from_slice(&cookie.to_be_bytes());
    h.extend_from_slice(&0u64.to_be_bytes());
    h.extend_from_slice(&len.to_be_bytes());
    h
}

/// A small send buffer, so the payloads the server does not read wait in this process rather
/// than in gigabytes of kernel socket buffers.
fn small_send_buffer(s: &TcpStream) {
    use std::os::fd::AsRawFd;
    let size: libc::c_int = 64 * 1024;
    // SAFETY: the descriptor is a socket `s` keeps open across the call; the option value is a
    // c_int that outlives the call, and its size is passed with it.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            std::ptr::from_ref(&size).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "SO_SNDBUF: {}", std::io::Error::last_os_error());
}

/// Sends on every connection a WRITE header and its payload but the last byte, as far as the
/// server takes them, until nothing has moved for a second. Returns the payload bytes sent.
fn push_partial_writes(conns: &mut [TcpStream]) -> u64 {
    let payload = vec![0xa5u8; WRITE_BYTES - 1];
    let headers: Vec<Vec<u8>> = (0..conns.len() as u64)
        .map(|cookie| write_header(cookie, WRITE_BYTES as u32))
        .collect();
    let whole = 28 + payload.len();
    let mut sent = vec![0usize; conns.len()];
    let (start, mut moved) = (Instant::now(), Instant::now());
    while moved.elapsed() < Duration::from_secs(1) && start.elapsed() < Duration::from_secs(40) {
        let mut progress = false;
        for (i, c) in conns.iter_mut().enumerate() {
            let rest = match sent[i] {
                n if n == whole => continue,
                n if n < 28 => &headers[i][n..],
                n => &payload[n - 28..],
            };
            match c.write(rest) {
                Ok(n) => {
                    sent[i] += n;
                    progress |= n > 0;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                // The server closed it (or died: checked by the caller).
                Err(_) => sent[i] = whole,
            }
        }
        if progress {
            moved = Instant::now();
        } else {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    sent.iter().map(|&n| n.saturating_sub(28) as u64).sum()
}

/// Polls `cond` for up to `limit`.
fn wait_until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "not within {limit:?}: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A connection beyond the cap is accepted and closed before the greeting.
fn assert_refused(addr: &str) {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut buf = [0u8; 18];
    match c.read(&mut buf) {
        Ok(0) => {}
        Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
        other => panic!("a connection beyond the cap was not closed at once: {other:?}"),
    }
}

#[test]
fn many_hostile_connections_stay_within_the_node_budget_and_the_connection_cap() {
    require_root("the limits test runs the server in a memory cgroup and");
    require("qemu-io");
    let dir = scratch("limits");
    let data = dir.path().join("data");
    let cg = MemCgroup::create(LIMIT_BYTES);
    // Default log (256 MiB, so a 4 MiB write is one record) and default limits.
    let mut s = cg.start_server(&data, &["--default-volume-size", "64MiB"]);

    let mut hostile: Vec<TcpStream> = (0..HOSTILE)
        .map(|_| {
            let (c, _, _) = nbd_connect(&s.nbd, "vol0");
            small_send_buffer(&c);
            c.set_nonblocking(true).unwrap();
            c
        })
        .collect();
    let sent = push_partial_writes(&mut hostile);
    cg.assert_alive(&mut s, "after the hostile writes");
    let hwm = hwm_kib(s.pid()) * 1024;
    println!(
        "{HOSTILE} hostile connections sent {} MiB of payload; server peak RSS {} MiB; cgroup \
         peak {:?} MiB",
        sent / MIB,
        hwm / MIB,
        cg.peak().map(|p| p / MIB)
    );
    assert!(sent >= BUDGET, "only {sent} bytes of payload went out");
    // The stalled writes hold the whole budget and no more; the server's memory follows.
    assert_eq!(s.metric("mariner_payload_in_flight_bytes"), BUDGET as f64);
    assert_eq!(s.metric("mariner_payload_budget_bytes"), BUDGET as f64);
    assert_eq!(s.metric("mariner_connections_open"), HOSTILE as f64);
    assert!(
        hwm < BUDGET + MARGIN,
        "server peak RSS {} MiB, beyond the {} MiB budget + {} MiB",
        hwm / MIB,
        BUDGET / MIB,
        MARGIN / MIB
    );

    // Up to the cap connections are served; the next one is refused, with a reason logged.
    let idle: Vec<TcpStream> = (HOSTILE..MAX_CONNECTIONS)
        .map(|_| nbd_connect(&s.nbd, "vol0").0)
        .collect();
    assert_refused(&s.nbd);
    let reason = format!("connection limit {MAX_CONNECTIONS} reached");
    wait_until("the refusal is logged", Duration::from_secs(10), || {
        s.log().contains(&reason)
    });
    assert!(s.metric("mariner_connections_refused_total") >= 1.0);

    drop(hostile);
    drop(idle);
    wait_until("every connection closed", Duration::from_secs(30), || {
        s.metric("mariner_connections_open") == 0.0
    });
    assert_eq!(s.metric("mariner_payload_in_flight_bytes"), 0.0);
    let out = run(Command::new("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "write -P 0x5a 0 4M",
        "-c",
        "read -P 0x5a 0 4M",
        &s.url("vol0"),
    ]));
    assert!(!out.contains("failed"), "qemu-io:\n{out}");
    cg.assert_alive(&mut s, "at the end");
    assert!(s.stop().success(), "unclean exit on SIGTERM: {}", s.log());
}
