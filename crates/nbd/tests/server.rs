//! End-to-end tests of the tokio server against the in-memory export, driven by the minimal
//! client in `common`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_possible_truncation
)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BufMut};
use common::*;
use mariner_nbd::memory::{MemoryExport, MemoryExports};
use mariner_nbd::{Export, ExportInfo, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SIZE: usize = 4 << 20;

fn exports() -> Arc<MemoryExports> {
    let set = Arc::new(MemoryExports::new());
    set.add(Arc::new(MemoryExport::new("disk", SIZE)));
    set
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn structured() -> Want<'static> {
    Want {
        structured: true,
        ..Want::default()
    }
}

fn with_base_allocation() -> Want<'static> {
    Want {
        structured: true,
        base_allocation: true,
        ..Want::default()
    }
}

#[tokio::test]
async fn write_read_back_and_flush() {
    let set = exports();
    let server = Server::start(set.clone()).await;
    let mut c = Client::handshake(server.addr, Want::default()).await;
    assert_eq!(c.session.size, SIZE as u64);
    assert_eq!(
        (c.session.block_min, c.session.max_payload),
        (512, 32 << 20)
    );
    // HAS_FLAGS, SEND_FLUSH, SEND_FUA, SEND_TRIM, SEND_WRITE_ZEROES, CAN_MULTI_CONN; no DF
    // without structured replies.
    assert_eq!(c.session.flags, 1 | 4 | 8 | 32 | 64 | 256);
    let data = pattern(64 * 1024, 7);
    assert_eq!(c.write(8192, &data).await, 0);
    assert_eq!(c.read(8192, 64 * 1024).await.unwrap(), data);
    assert_eq!(c.command(CMD_WRITE, FLAG_FUA, 0, 512, &[9; 512]).await, 0);
    assert_eq!(c.flush().await, 0);
    assert_eq!(set.get("disk").unwrap().flush_count(), 1);
    assert_eq!(set.get("disk").unwrap().contents(0, 512), vec![9; 512]);
    c.disconnect().await;
    eventually(|| set.connections("disk") == 0).await;
    server.stop().await;
}

#[tokio::test]
async fn structured_read_is_one_data_chunk() {
    let server = Server::start(exports()).await;
    let mut c = Client::handshake(server.addr, structured()).await;
    assert_ne!(c.session.flags & 128, 0, "SEND_DF with structured replies");
    let data = pattern(4096, 1);
    assert_eq!(c.write(4096, &data).await, 0);
    let cookie = c.cookie();
    c.send(cookie, CMD_READ, FLAG_DF, 4096, 4096, &[]).await;
    let chunks = c.chunks().await;
    assert_eq!(chunks.len(), 1);
    assert_eq!(
        (chunks[0].kind, chunks[0].flags, chunks[0].cookie),
        (TYPE_OFFSET_DATA, 1, cookie)
    );
    let mut p = &chunks[0].payload[..];
    assert_eq!(p.get_u64(), 4096);
    assert_eq!(p, &data[..]);
    // A zero-length read is a lone NONE chunk.
    let cookie = c.cookie();
    c.send(cookie, CMD_READ, 0, 0, 0, &[]).await;
    let chunks = c.chunks().await;
    assert_eq!(
        (chunks.len(), chunks[0].kind, chunks[0].flags),
        (1, TYPE_NONE, 1)
    );
    c.disconnect().await;
    server.stop().await;
}

#[tokio::test]
async fn trim_shows_up_as_a_hole_in_block_status() {
    let server = Server::start(exports()).await;
    let mut c = Client::handshake(server.addr, with_base_allocation()).await;
    let id = c.session.context_id.unwrap();
    let all_hole = (16384, STATE_HOLE | STATE_ZERO);
    assert_eq!(c.block_status(0, 16384, 0).await, Ok((id, vec![all_hole])));
    assert_eq!(c.write(0, &pattern(8192, 3)).await, 0);
    let expect = vec![(8192, 0), (8192, STATE_HOLE | STATE_ZERO)];
    assert_eq!(c.block_status(0, 16384, 0).await, Ok((id, expect)));
    assert_eq!(c.trim(0, 4096).await, 0);
    let expect = vec![
        (4096, STATE_HOLE | STATE_ZERO),
        (4096, 0),
        (8192, STATE_HOLE | STATE_ZERO),
    ];
    assert_eq!(c.block_status(0, 16384, 0).await, Ok((id, expect)));
    // REQ_ONE: exactly one extent, never longer than the request.
    assert_eq!(
        c.block_status(0, 2048, FLAG_REQ_ONE).await,
        Ok((id, vec![(2048, 3)]))
    );
    assert_eq!(
        c.block_status(4096, 16384, FLAG_REQ_ONE).await,
        Ok((id, vec![(4096, 0)]))
    );
    // Zeroing without NO_HOLE may punch; with NO_HOLE it stays allocated (and reads zero).
    assert_eq!(c.command(CMD_WRITE_ZEROES, 0, 4096, 4096, &[]).await, 0);
    assert_eq!(
        c.block_status(4096, 4096, 0).await,
        Ok((id, vec![(4096, 3)]))
    );
    assert_eq!(
        c.command(CMD_WRITE_ZEROES, FLAG_NO_HOLE, 4096, 4096, &[])
            .await,
        0
    );
    assert_eq!(
        c.block_status(4096, 4096, 0).await,
        Ok((id, vec![(4096, STATE_ZERO)]))
    );
    assert_eq!(c.read(4096, 4096).await.unwrap(), vec![0; 4096]);
    // Past the end.
    assert_eq!(c.block_status(SIZE as u64, 512, 0).await, Err(EINVAL));
    c.disconnect().await;
    server.stop().await;
}

#[tokio::test]
async fn block_status_without_a_context_is_einval() {
    let server = Server::start(exports()).await;
    let mut c = Client::handshake(server.addr, structured()).await;
    assert_eq!(c.block_status(0, 4096, 0).await, Err(EINVAL));
    c.disconnect().await;
    server.stop().await;
}

#[tokio::test]
async fn errors_for_bad_requests() {
    let server = Server::start(exports()).await;
    for want in [Want::default(), structured()] {
        let mut c = Client::handshake(server.addr, want).await;
        // Out of range.
        assert_eq!(c.read(SIZE as u64, 512).await, Err(EINVAL));
        assert_eq!(c.read(SIZE as u64 - 512, 1024).await, Err(EINVAL));
        assert_eq!(c.read(u64::MAX - 511, 512).await, Err(EINVAL));
        assert_eq!(c.write(SIZE as u64, &[0; 512]).await, ENOSPC);
        assert_eq!(c.trim(SIZE as u64, 512).await, EINVAL);
        // Misaligned.
        assert_eq!(c.read(100, 512).await, Err(EINVAL));
        assert_eq!(c.write(0, &[0; 100]).await, EINVAL);
        // Unknown command and unknown flag.
        assert_eq!(c.command(0x42, 0, 0, 0, &[]).await, EINVAL);
        assert_eq!(c.command(CMD_FLUSH, 0x4000, 0, 0, &[]).await, EINVAL);
        // The connection is still fine.
        assert_eq!(c.read(0, 512).await, Ok(vec![0; 512]));
        c.disconnect().await;
    }
    server.stop().await;
}

#[tokio::test]
async fn read_only_and_failing_exports() {
    let set = exports();
    let mut info = set.get("disk").unwrap().info();
    info.name = "ro".into();
    info.read_only = true;
    set.add(Arc::new(MemoryExport::with_info(info, 1 << 20)));
    let server = Server::start(set.clone()).await;
    let mut c = Client::handshake(
        server.addr,
        Want {
            export: "ro",
            ..Want::default()
        },
    )
    .await;
    assert_ne!(c.session.flags & 2, 0, "READ_ONLY advertised");
    assert_eq!(c.write(0, &[1; 512]).await, EPERM);
    assert_eq!(c.read(0, 512).await, Ok(vec![0; 512]));
    c.disconnect().await;

    let mut c = Client::handshake(server.addr, structured()).await;
    set.get("disk").unwrap().set_failing(true);
    assert_eq!(c.read(0, 512).await, Err(EIO));
    assert_eq!(c.flush().await, EIO);
    set.get("disk").unwrap().set_failing(false);
    c.disconnect().await;
    server.stop().await;
}

#[tokio::test]
async fn a_panicking_export_fails_its_request_and_the_connection_goes_on() {
    let set = exports();
    let server = Server::start(set.clone()).await;
    let mut c = Client::handshake(server.addr, structured()).await;
    set.get("disk").unwrap().set_panicking(true);
    assert_eq!(c.write(0, &[7; 512]).await, EIO);
    set.get("disk").unwrap().set_panicking(false);
    assert_eq!(c.write(512, &[8; 512]).await, 0);
    assert_eq!(c.read(0, 1024).await.unwrap()[512..], [8; 512]);
    assert_eq!(set.get("disk").unwrap().contents(0, 512), vec![0; 512]);
    c.disconnect().await;
    server.stop().await;
}

#[tokio::test]
async fn bad_request_magic_closes_the_connection() {
    let set = exports();
    let server = Server::start(set.clone()).await;
    let mut c = Client::handshake(server.addr, Want::default()).await;
    c.stream.write_all(&[0xde; 28]).await.unwrap();
    assert_closed(&mut c.stream).await;
    eventually(|| set.connections("disk") == 0).await;
    server.stop().await;
}

#[tokio::test]
async fn huge_write_length_closes_without_waiting_for_the_payload() {
    let server = Server::start(exports()).await;
    let mut c = Client::handshake(server.addr, Want::default()).await;
    // Announce 4 GiB - 1 and send nothing: the server must not wait for (or allocate) it.
    let cookie = c.cookie();
    c.send(cookie, CMD_WRITE, 0, 0, u32::MAX, &[]).await;
    assert_closed(&mut c.stream).await;
    server.stop().await;
}

#[tokio::test]
async fn oversized_write_within_reason_is_einval_and_skipped() {
    let set = exports();
    let mut info = set.get("disk").unwrap().info();
    info.name = "small".into();
    info.max_payload_bytes = 64 * 1024;
    set.add(Arc::new(MemoryExport::with_info(info, 1 << 20)));
    let server = Server::start(set.clone()).await;
    let mut c = Client::handshake(
        server.addr,
        Want {
            export: "small",
            ..Want::default()
        },
    )
    .await;
    assert_eq!(c.session.max_payload, 64 * 1024);
    assert_eq!(c.write(0, &[0xee; 128 * 1024]).await, EINVAL);
    assert_eq!(
        c.read(0, 512).await,
        Ok(vec![0; 512]),
        "payload was not written"
    );
    c.disconnect().await;
    server.stop().await;
}

#[tokio::test]
async fn abrupt_disconnect_mid_request_leaves_the_server_serving() {
    let set = Arc::new(MemoryExports::new());
    let slow = MemoryExport::new("disk", SIZE).with_write_delay(Duration::from_millis(300));
    set.add(Arc::new(slow));
    let server = Server::start(set.clone()).await;

    // A complete write followed by an immediate hang-up: the write still lands.
    let mut a = Client::handshake(server.addr, Want::default()).await;
    let cookie = a.cookie();
    a.send(cookie, CMD_WRITE, 0, 0, 4096, &[0xab; 4096]).await;
    drop(a);
    // A write cut off in the middle of its payload.
    let mut b = Client::handshake(server.addr, Want::default()).await;
    let mut partial = Vec::new();
    partial.put_u32(REQUEST_MAGIC);
    partial.put_u16(0);
    partial.put_u16(CMD_WRITE);
    partial.put_u64(1);
    partial.put_u64(8192);
    partial.put_u32(4096);
    partial.put_slice(&[0xcd; 1000]);
    b.stream.write_all(&partial).await.unwrap();
    drop(b);
    // Hang-ups during the handshake.
    let mut h = connect(server.addr).await;
    h.write_all(&[0, 0]).await.unwrap();
    drop(h);
    let mut h = connect(server.addr).await;
    h.write_u32(3).await.unwrap();
    h.write_all(b"IHAVEOPT\x00\x00\x00\x07\x00\x00\x01\x00abc")
        .await
        .unwrap();
    drop(h);

    // The server keeps serving; the in-flight write completes on the export.
    let mut c = Client::handshake(server.addr, Want::default()).await;
    assert_eq!(c.read(16384, 512).await, Ok(vec![0; 512]));
    let export = set.get("disk").unwrap();
    eventually(|| export.writes_completed() == 1).await;
    let landed = c.read(0, 4096).await.unwrap();
    assert!(
        landed.iter().all(|b| *b == 0xab),
        "the hung-up client's write landed"
    );
    let cut = c.read(8192, 4096).await.unwrap();
    assert!(
        cut.iter().all(|b| *b == 0),
        "the cut-off write was not applied"
    );
    c.disconnect().await;
    eventually(|| set.connections("disk") == 0).await;
    server.stop().await;
}

#[tokio::test]
async fn disc_waits_for_in_flight_requests() {
    let set = Arc::new(MemoryExports::new());
    set.add(Arc::new(
        MemoryExport::new("disk", SIZE).with_write_delay(Duration::from_millis(200)),
    ));
    let server = Server::start(set.clone()).await;
    let mut c = Client::handshake(server.addr, Want::default()).await;
    c.send(77, CMD_WRITE, 0, 0, 512, &[1; 512]).await;
    c.send(78, CMD_DISC, 0, 0, 0, &[]).await;
    assert_eq!(
        c.reply().await,
        Reply::Simple {
            error: 0,
            cookie: 77
        }
    );
    assert_closed(&mut c.stream).await;
    assert_eq!(set.get("disk").unwrap().writes_completed(), 1);
    eventually(|| set.connections("disk") == 0).await;
    server.stop().await;
}

#[tokio::test]
async fn many_requests_in_flight() {
    let set = exports();
    let server = Server::start(set.clone()).await;
    let mut c = Client::handshake(server.addr, Want::default()).await;
    // Pipeline 64 writes without waiting, then 64 reads.
    for i in 0..64u64 {
        c.send(
            1000 + i,
            CMD_WRITE,
            0,
            i * 4096,
            4096,
            &pattern(4096, i as u8),
        )
        .await;
    }
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..64 {
        let reply = c.reply().await;
        assert_eq!(common::reply_error(&reply), 0);
        seen.insert(reply.cookie());
    }
    assert_eq!(seen, (1000..1064).collect());
    for i in 0..64u64 {
        c.send(2000 + i, CMD_READ, 0, i * 4096, 4096, &[]).await;
    }
    for _ in 0..64 {
        let Reply::Simple { error: 0, cookie } = c.reply().await else {
            panic!("bad reply")
        };
        let mut data = vec![0; 4096];
        within("a READ payload", c.stream.read_exact(&mut data))
            .await
            .unwrap();
        assert_eq!(data, pattern(4096, (cookie - 2000) as u8));
    }
    c.disconnect().await;
    server.stop().await;
}

#[tokio::test]
async fn multiple_connections_share_the_export() {
    let set = exports();
    let server = Server::start(set.clone()).await;
    let mut a = Client::handshake(server.addr, Want::default()).await;
    let mut b = Client::handshake(server.addr, structured()).await;
    assert_eq!(set.connections("disk"), 2);
    assert_eq!(a.write(0, &[5; 4096]).await, 0);
    assert_eq!(a.flush().await, 0);
    assert_eq!(b.read(0, 4096).await.unwrap(), vec![5; 4096]);
    a.disconnect().await;
    b.disconnect().await;
    eventually(|| set.connections("disk") == 0).await;
    server.stop().await;
}

#[tokio::test]
async fn export_name_negotiation() {
    let server = Server::start(exports()).await;
    for (client_flags, reply_len) in [(1u32, 8 + 2 + 124), (3, 10)] {
        let mut s = connect(server.addr).await;
        s.write_u32(client_flags).await.unwrap();
        send_option(&mut s, OPT_EXPORT_NAME, b"").await; // default export
        let mut reply = vec![0; reply_len];
        within("the EXPORT_NAME reply", s.read_exact(&mut reply))
            .await
            .unwrap();
        let mut r = &reply[..];
        assert_eq!(r.get_u64(), SIZE as u64);
        assert_eq!(r.get_u16() & 1, 1);
        assert!(r.iter().all(|b| *b == 0));
        let mut c = Client::from_stream(s);
        assert_eq!(c.read(0, 512).await, Ok(vec![0; 512]));
        c.disconnect().await;
    }
    // Unknown name: the server can only hang up.
    let mut s = connect(server.addr).await;
    s.write_u32(1).await.unwrap();
    send_option(&mut s, OPT_EXPORT_NAME, b"nope").await;
    assert_closed(&mut s).await;
    server.stop().await;
}

#[tokio::test]
async fn option_haggling() {
    let set = exports();
    set.add(Arc::new(MemoryExport::new("second", 4096)));
    let server = Server::start(set).await;
    let mut s = connect(server.addr).await;
    s.write_u32(1).await.unwrap();

    send_option(&mut s, OPT_LIST, &[]).await;
    let replies = read_opt_replies(&mut s).await;
    let kinds: Vec<u32> = replies.iter().map(|r| r.kind).collect();
    assert_eq!(kinds, vec![REP_SERVER, REP_SERVER, REP_ACK]);
    let mut names = Vec::new();
    for r in &replies[..2] {
        let mut d = &r.data[..];
        let len = d.get_u32() as usize;
        names.push(String::from_utf8(d[..len].to_vec()).unwrap());
    }
    assert_eq!(names, vec!["disk", "second"]);

    send_option(&mut s, OPT_LIST, b"junk").await;
    assert_eq!(read_opt_reply(&mut s).await.kind, REP_ERR_INVALID);
    send_option(&mut s, OPT_STARTTLS, &[]).await;
    assert_eq!(read_opt_reply(&mut s).await.kind, REP_ERR_POLICY);
    send_option(&mut s, 0x1234, b"whatever").await;
    let unsup = read_opt_reply(&mut s).await;
    assert_eq!((unsup.option, unsup.kind), (0x1234, REP_ERR_UNSUP));
    send_option(&mut s, OPT_GO, &info_request("missing", &[])).await;
    assert_eq!(read_opt_reply(&mut s).await.kind, REP_ERR_UNKNOWN);
    send_option(&mut s, OPT_GO, b"\x00\x00\x00\x10ab").await;
    assert_eq!(read_opt_reply(&mut s).await.kind, REP_ERR_INVALID);
    // Meta contexts before structured replies are invalid; after, "base:" lists base:allocation.
    send_option(&mut s, OPT_LIST_META_CONTEXT, &meta_request("disk", &[])).await;
    assert_eq!(read_opt_reply(&mut s).await.kind, REP_ERR_INVALID);
    send_option(&mut s, OPT_STRUCTURED_REPLY, &[]).await;
    assert_eq!(read_opt_reply(&mut s).await.kind, REP_ACK);
    send_option(
        &mut s,
        OPT_LIST_META_CONTEXT,
        &meta_request("disk", &["base:"]),
    )
    .await;
    let replies = read_opt_replies(&mut s).await;
    assert_eq!(replies[0].kind, REP_META_CONTEXT);
    assert_eq!(&replies[0].data[4..], b"base:allocation");
    // Oversized option data is skipped and answered TOO_BIG.
    send_option(&mut s, OPT_INFO, &vec![0; 100_000]).await;
    assert_eq!(read_opt_reply(&mut s).await.kind, REP_ERR_TOO_BIG);
    // INFO with name and description.
    send_option(&mut s, OPT_INFO, &info_request("second", &[1, 2])).await;
    let replies = read_opt_replies(&mut s).await;
    let infos: Vec<u16> = replies
        .iter()
        .filter(|r| r.kind == REP_INFO)
        .map(|r| (&r.data[..]).get_u16())
        .collect();
    assert_eq!(infos, vec![0, 1, 2, 3]);
    assert_eq!(&replies[1].data[2..], b"second");
    // Abort is acknowledged, then the server closes.
    send_option(&mut s, OPT_ABORT, &[]).await;
    assert_eq!(read_opt_reply(&mut s).await.kind, REP_ACK);
    assert_closed(&mut s).await;
    server.stop().await;
}

#[tokio::test]
async fn clients_without_fixed_newstyle_are_disconnected() {
    let server = Server::start(exports()).await;
    let mut s = connect(server.addr).await;
    s.write_u32(0).await.unwrap();
    assert_closed(&mut s).await;
    let mut s = connect(server.addr).await;
    s.write_u32(0x81).await.unwrap();
    assert_closed(&mut s).await;
    server.stop().await;
}

#[tokio::test]
async fn handshake_timeout_disconnects_idle_clients() {
    let config = ServerConfig {
        handshake_timeout: Duration::from_millis(100),
        ..ServerConfig::default()
    };
    let server = Server::start_with(exports(), config).await;
    let mut s = connect(server.addr).await;
    assert_closed(&mut s).await;
    server.stop().await;
}

#[tokio::test]
async fn shutdown_closes_idle_connections_and_returns() {
    let set = exports();
    let server = Server::start(set.clone()).await;
    let mut c = Client::handshake(server.addr, Want::default()).await;
    let mut h = connect(server.addr).await;
    server.stop().await;
    assert_closed(&mut c.stream).await;
    assert_closed(&mut h).await;
    assert_eq!(set.connections("disk"), 0);
}

#[tokio::test]
async fn shutdown_does_not_hang_on_a_client_that_stops_reading() {
    let config = ServerConfig {
        drain_timeout: Duration::from_millis(200),
        ..ServerConfig::default()
    };
    let server = Server::start_with(exports(), config).await;
    let mut c = Client::handshake(server.addr, Want::default()).await;
    // 48 MiB of read replies the client never reads: more than the socket buffers hold.
    for i in 0..48u64 {
        c.send(i, CMD_READ, 0, 0, 1 << 20, &[]).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.stop().await;
}

#[tokio::test]
async fn serve_connection_over_any_stream() {
    let set = exports();
    let (client, server_side) = tokio::io::duplex(1 << 16);
    let exports: Arc<dyn mariner_nbd::Exports> = set.clone();
    let task = tokio::spawn(mariner_nbd::serve_connection(
        server_side,
        exports,
        ServerConfig::default(),
    ));
    let (mut rd, mut wr) = tokio::io::split(client);
    let mut greeting = [0u8; 18];
    within("the greeting", rd.read_exact(&mut greeting))
        .await
        .unwrap();
    wr.write_u32(3).await.unwrap();
    let mut opt = Vec::new();
    opt.put_u64(IHAVEOPT);
    opt.put_u32(OPT_ABORT);
    opt.put_u32(0);
    wr.write_all(&opt).await.unwrap();
    assert_eq!(
        within("the option reply", rd.read_u64()).await.unwrap(),
        REPLY_MAGIC
    );
    tokio::time::timeout(TIMEOUT, task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn misconfigured_export_is_refused_with_policy() {
    let set = exports();
    let info = ExportInfo {
        name: "weird".into(),
        description: String::new(),
        size_bytes: 4096,
        block_size_min: 3,
        block_size_preferred: 4096,
        max_payload_bytes: 1 << 20,
        read_only: false,
        can_trim: false,
        can_write_zeroes: false,
        can_multi_conn: false,
    };
    set.add(Arc::new(MemoryExport::with_info(info, 4096)));
    let server = Server::start(set).await;
    let mut s = connect(server.addr).await;
    s.write_u32(1).await.unwrap();
    send_option(&mut s, OPT_GO, &info_request("weird", &[3])).await;
    assert_eq!(read_opt_reply(&mut s).await.kind, REP_ERR_POLICY);
    server.stop().await;
}
