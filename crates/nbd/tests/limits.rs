//! Node-wide limits ([`ServerConfig::limits`]) over real sockets, with the in-memory export:
//! connections together never hold more payload than the node's budget, a request larger than
//! the budget still completes, a stalled client loses its budget after the payload time-out,
//! and connections beyond the cap are closed.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use mariner_limits::{Limits, LimitsConfig};
use mariner_nbd::memory::{MemoryExport, MemoryExports};
use mariner_nbd::ServerConfig;
use tokio::io::AsyncWriteExt;

const SIZE: usize = 8 << 20;
const MIB: u32 = 1 << 20;

fn exports() -> Arc<MemoryExports> {
    let set = Arc::new(MemoryExports::new());
    set.add(Arc::new(MemoryExport::new("disk", SIZE)));
    set
}

fn limited(max_connections: u32, max_in_flight_bytes: u32, payload_timeout: Duration) -> Limits {
    Limits::new(LimitsConfig {
        max_connections,
        max_in_flight_bytes,
        payload_timeout,
    })
}

async fn server(limits: &Limits) -> Server {
    let config = ServerConfig {
        limits: limits.clone(),
        ..ServerConfig::default()
    };
    Server::start_with(exports(), config).await
}

/// Polls `cond` for up to [`TIMEOUT`].
async fn eventually(what: &str, cond: impl Fn() -> bool) {
    let start = tokio::time::Instant::now();
    while !cond() {
        assert!(start.elapsed() < TIMEOUT, "not within {TIMEOUT:?}: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn two_connections_never_hold_more_than_the_node_budget() {
    let limits = limited(16, MIB, Duration::from_secs(60));
    let server = server(&limits).await;
    let mut a = Client::handshake(server.addr, Want::default()).await;
    let mut b = Client::handshake(server.addr, Want::default()).await;
    // A: a 1 MiB WRITE one byte short. It holds the whole node budget.
    let data = vec![0xa5u8; MIB as usize];
    a.send(1, CMD_WRITE, 0, 0, MIB, &data[..data.len() - 1])
        .await;
    eventually("A holds the budget", || {
        limits.in_flight_bytes() == u64::from(MIB)
    })
    .await;
    // B: a whole 1 MiB WRITE; its connection budget is free, the node's is not.
    let b_write = tokio::spawn(async move {
        let error = b.write(u64::from(MIB), &vec![0x5au8; MIB as usize]).await;
        (b, error)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !b_write.is_finished(),
        "B wrote while A held the node budget"
    );
    assert_eq!(limits.in_flight_bytes(), u64::from(MIB));
    // A's last byte: A completes, then B gets the budget.
    a.stream.write_all(&data[data.len() - 1..]).await.unwrap();
    assert_eq!(reply_error(&a.reply().await), 0);
    let (mut b, error) = tokio::time::timeout(TIMEOUT, b_write)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(error, 0);
    assert_eq!(b.read(u64::from(MIB), 512).await.unwrap(), [0x5a; 512]);
    assert_eq!(a.read(0, 512).await.unwrap(), [0xa5; 512]);
    eventually("budget released", || limits.in_flight_bytes() == 0).await;
    a.disconnect().await;
    b.disconnect().await;
    server.stop().await;
}

#[tokio::test]
async fn a_request_larger_than_the_node_budget_still_completes() {
    let limits = limited(16, 64 * 1024, Duration::from_secs(60));
    let server = server(&limits).await;
    let mut c = Client::handshake(server.addr, Want::default()).await;
    let data: Vec<u8> = (0..4 * MIB).map(|i| (i % 251) as u8).collect();
    // Sending is bounded too: a server waiting for budget it can never get stops reading.
    let written = tokio::time::timeout(TIMEOUT, c.write(0, &data)).await;
    assert_eq!(
        written.expect("a request larger than the budget never completed"),
        0
    );
    assert_eq!(c.read(0, 4 * MIB).await.unwrap(), data);
    eventually("budget released", || limits.in_flight_bytes() == 0).await;
    c.disconnect().await;
    server.stop().await;
}

#[tokio::test]
async fn a_stalled_write_payload_loses_its_budget_after_the_timeout() {
    let limits = limited(16, MIB, Duration::from_millis(300));
    let server = server(&limits).await;
    let mut stalled = Client::handshake(server.addr, Want::default()).await;
    let data = vec![1u8; MIB as usize];
    stalled
        .send(1, CMD_WRITE, 0, 0, MIB, &data[..data.len() - 1])
        .await;
    eventually("the stalled write holds the budget", || {
        limits.in_flight_bytes() == u64::from(MIB)
    })
    .await;
    // Another client's write waits for the budget, then goes through once the stalled
    // connection has been closed for its payload time-out.
    let mut other = Client::handshake(server.addr, Want::default()).await;
    assert_eq!(other.write(0, &vec![2u8; MIB as usize]).await, 0);
    assert_closed(&mut stalled.stream).await;
    assert_eq!(other.read(0, 512).await.unwrap(), [2; 512]);
    other.disconnect().await;
    server.stop().await;
}

#[tokio::test]
async fn a_client_that_takes_no_replies_loses_its_budget_after_the_timeout() {
    let limits = limited(16, 4 * MIB, Duration::from_millis(300));
    let server = server(&limits).await;
    let mut deaf = Client::handshake(server.addr, Want::default()).await;
    // 16 MiB of READ replies the client never reads: far more than socket buffers hold, and
    // four times the node's budget.
    for cookie in 0..16u64 {
        deaf.send(cookie, CMD_READ, 0, 0, MIB, &[]).await;
    }
    let mut other = Client::handshake(server.addr, Want::default()).await;
    assert_eq!(other.read(0, MIB).await.unwrap().len(), MIB as usize);
    eventually("the deaf connection released its budget", || {
        limits.in_flight_bytes() == 0
    })
    .await;
    other.disconnect().await;
    server.stop().await;
}

#[tokio::test]
async fn connections_beyond_the_cap_are_closed_and_counted() {
    let limits = limited(2, 16 * MIB, Duration::from_secs(60));
    let server = server(&limits).await;
    let a = Client::handshake(server.addr, Want::default()).await;
    let mut b = Client::handshake(server.addr, Want::default()).await;
    let mut refused = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    assert_closed(&mut refused).await;
    assert_eq!(limits.refused_total(), 1);
    assert_eq!(limits.connections_open(), 2);
    // Closing one frees its slot for the next client.
    a.disconnect().await;
    eventually("the slot is free", || limits.connections_open() == 1).await;
    let mut c = Client::handshake(server.addr, Want::default()).await;
    assert_eq!(c.write(0, &[7u8; 512]).await, 0);
    assert_eq!(b.read(0, 512).await.unwrap(), [7u8; 512]);
    b.disconnect().await;
    c.disconnect().await;
    server.stop().await;
}
