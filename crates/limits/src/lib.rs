//! Node-wide admission limits shared by Mariner's front ends (NBD and iSCSI).
//!
//! Each front end already bounds what one connection may hold. Those bounds multiply with the
//! number of connections, so without a node-wide cap many connections together can make the
//! server buffer any amount of memory (500 connections each holding a 4 MiB WRITE one byte
//! short of its payload took a server from 18 MiB to 2 GiB). [`Limits`] adds two caps that
//! every connection of every front end shares:
//!
//! - **Connections**: [`Limits::admit`] hands out one [`ConnectionSlot`] per connection, at
//!   most `max_connections`; beyond that a connection is refused (closed at once) and the
//!   refusal is logged at most once a second, with a count of those not logged.
//! - **Payload bytes in flight**: [`Limits::reserve`] hands out a [`PayloadShare`] for a
//!   request's payload before it is buffered (a WRITE's data as it arrives, a READ's data until
//!   its reply is sent). When the budget is spent the caller waits, and while it waits it reads
//!   nothing more from its socket: TCP pushes back on the client. A request larger than the
//!   whole budget takes all of it rather than waiting forever.
//!
//! A share held while its client stalls (a WRITE payload one byte short, a READ reply nobody
//! reads) would hold the budget forever and starve every other connection; the front ends
//! therefore close a connection whose payload has not moved within
//! [`LimitsConfig::payload_timeout`] of getting its share.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How often a refused connection is logged, at most.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(1);

/// The node-wide caps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitsConfig {
    /// Connections open at once, all front ends together.
    pub max_connections: u32,
    /// Request payload bytes buffered at once, all connections together.
    pub max_in_flight_bytes: u32,
    /// How long a request may hold payload budget while its payload is still arriving (a
    /// WRITE) or its reply is still being sent (a READ); past it the connection is closed.
    pub payload_timeout: Duration,
}

impl LimitsConfig {
    /// No cap on connections or bytes (tests and examples of the protocol crates).
    pub const UNLIMITED: LimitsConfig = LimitsConfig {
        max_connections: u32::MAX,
        max_in_flight_bytes: u32::MAX,
        payload_timeout: Duration::from_secs(30),
    };
}

/// The shared state of the caps; cheap to clone (one `Arc`).
#[derive(Debug, Clone)]
pub struct Limits(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    config: LimitsConfig,
    connections: Arc<Semaphore>,
    payload: Arc<Semaphore>,
    refused: AtomicU64,
    refusal_log: Mutex<RefusalLog>,
}

/// Rate limiting of the refusal warning.
#[derive(Debug, Default)]
struct RefusalLog {
    last: Option<Instant>,
    suppressed: u64,
}

/// One admitted connection; the slot is free again when this is dropped.
#[derive(Debug)]
pub struct ConnectionSlot {
    _permit: OwnedSemaphorePermit,
}

/// Payload budget held by one request; released when dropped.
#[derive(Debug)]
pub struct PayloadShare(OwnedSemaphorePermit);

impl PayloadShare {
    /// Bytes of the budget this share holds.
    pub fn bytes(&self) -> u32 {
        u32::try_from(self.0.num_permits()).unwrap_or(u32::MAX)
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self::new(LimitsConfig::UNLIMITED)
    }
}

impl Limits {
    /// Caps as configured (zeros count as one).
    pub fn new(config: LimitsConfig) -> Self {
        let config = LimitsConfig {
            max_connections: config.max_connections.max(1),
            max_in_flight_bytes: config.max_in_flight_bytes.max(1),
            ..config
        };
        let permits = |n: u32| {
            usize::try_from(n)
                .unwrap_or(usize::MAX)
                .min(Semaphore::MAX_PERMITS)
        };
        Self(Arc::new(Inner {
            config,
            connections: Arc::new(Semaphore::new(permits(config.max_connections))),
            payload: Arc::new(Semaphore::new(permits(config.max_in_flight_bytes))),
            refused: AtomicU64::new(0),
            refusal_log: Mutex::new(RefusalLog::default()),
        }))
    }

    /// The caps in force.
    pub fn config(&self) -> LimitsConfig {
        self.0.config
    }

    /// A slot for a new connection from `peer` on `front_end` ("NBD", "iSCSI"), or `None`
    /// when every slot is taken: the caller closes the connection. Refusals are counted and
    /// logged (at most once a second).
    pub fn admit(&self, front_end: &str, peer: SocketAddr) -> Option<ConnectionSlot> {
        match Arc::clone(&self.0.connections).try_acquire_owned() {
            Ok(permit) => Some(ConnectionSlot { _permit: permit }),
            Err(_) => {
                self.0.refused.fetch_add(1, Ordering::Relaxed);
                self.log_refusal(front_end, peer);
                None
            }
        }
    }

    fn log_refusal(&self, front_end: &str, peer: SocketAddr) {
        let Ok(mut log) = self.0.refusal_log.lock() else {
            return;
        };
        let now = Instant::now();
        if log
            .last
            .is_some_and(|t| now.duration_since(t) < REFUSAL_LOG_INTERVAL)
        {
            log.suppressed += 1;
            return;
        }
        let suppressed = std::mem::take(&mut log.suppressed);
        log.last = Some(now);
        tracing::warn!(
            limit = self.0.config.max_connections,
            suppressed,
            "connection limit {} reached (limits.max_connections); refusing {front_end} \
             connection from {peer} ({suppressed} more refused since the last message)",
            self.0.config.max_connections
        );
    }

    /// Waits until `bytes` of payload may be buffered; a request larger than the whole budget
    /// takes all of it. `None` never happens in practice (the semaphore is never closed).
    pub async fn reserve(&self, bytes: usize) -> Option<PayloadShare> {
        let payload = Arc::clone(&self.0.payload);
        let cost = self.cost(bytes);
        payload
            .acquire_many_owned(cost)
            .await
            .ok()
            .map(PayloadShare)
    }

    /// [`Limits::reserve`] without waiting: `None` when the budget cannot cover `bytes` now.
    pub fn try_reserve(&self, bytes: usize) -> Option<PayloadShare> {
        let payload = Arc::clone(&self.0.payload);
        payload
            .try_acquire_many_owned(self.cost(bytes))
            .ok()
            .map(PayloadShare)
    }

    /// Budget `bytes` takes: all of it for a request larger than the whole budget.
    fn cost(&self, bytes: usize) -> u32 {
        u32::try_from(bytes)
            .unwrap_or(u32::MAX)
            .clamp(1, self.0.config.max_in_flight_bytes)
    }

    /// How long a request may hold its share while its payload is still on the wire.
    pub fn payload_timeout(&self) -> Duration {
        self.0.config.payload_timeout
    }

    /// Connections admitted and not yet closed.
    pub fn connections_open(&self) -> u64 {
        let free = self.0.connections.available_permits();
        u64::from(self.0.config.max_connections).saturating_sub(free as u64)
    }

    /// Payload bytes reserved by requests now.
    pub fn in_flight_bytes(&self) -> u64 {
        let free = self.0.payload.available_permits();
        u64::from(self.0.config.max_in_flight_bytes).saturating_sub(free as u64)
    }

    /// Connections refused since start.
    pub fn refused_total(&self) -> u64 {
        self.0.refused.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn limits(max_connections: u32, max_in_flight_bytes: u32) -> Limits {
        Limits::new(LimitsConfig {
            max_connections,
            max_in_flight_bytes,
            payload_timeout: Duration::from_secs(1),
        })
    }

    fn peer() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 1234))
    }

    #[test]
    fn connections_beyond_the_cap_are_refused_and_counted() {
        let l = limits(2, 1024);
        let a = l.admit("NBD", peer()).unwrap();
        let _b = l.admit("iSCSI", peer()).unwrap();
        assert_eq!(l.connections_open(), 2);
        assert!(l.admit("NBD", peer()).is_none());
        assert!(l.admit("NBD", peer()).is_none());
        assert_eq!(l.refused_total(), 2);
        drop(a);
        assert_eq!(l.connections_open(), 1);
        assert!(l.admit("NBD", peer()).is_some());
    }

    #[tokio::test]
    async fn reservations_share_one_budget_and_wait_for_it() {
        let l = limits(8, 1000);
        let a = l.reserve(600).await.unwrap();
        assert_eq!((a.bytes(), l.in_flight_bytes()), (600, 600));
        let waiting = tokio::spawn({
            let l = l.clone();
            async move { l.reserve(600).await.unwrap().bytes() }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !waiting.is_finished(),
            "1200 bytes in flight of a 1000-byte budget"
        );
        drop(a);
        assert_eq!(waiting.await.unwrap(), 600);
        assert_eq!(l.in_flight_bytes(), 0);
    }

    #[tokio::test]
    async fn a_request_larger_than_the_budget_takes_all_of_it() {
        let l = limits(8, 1000);
        let big = l.reserve(5000).await.unwrap();
        assert_eq!((big.bytes(), l.in_flight_bytes()), (1000, 1000));
        assert!(l.try_reserve(1).is_none());
        drop(big);
        assert_eq!(l.reserve(0).await.unwrap().bytes(), 1);
        assert_eq!(l.try_reserve(5000).unwrap().bytes(), 1000);
    }

    #[test]
    fn unlimited_reports_no_use() {
        let l = Limits::default();
        let _slot = l.admit("NBD", peer()).unwrap();
        assert_eq!((l.connections_open(), l.in_flight_bytes()), (1, 0));
    }
}
