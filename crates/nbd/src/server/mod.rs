//! The tokio NBD server: accepts connections, runs the sans-I/O handshake over the socket,
//! then serves requests concurrently against the negotiated [`Export`](crate::Export).
//!
//! Per connection, one reader task decodes requests; each request runs in its own task (at
//! most [`ServerConfig::max_in_flight`] at once, and at most
//! [`ServerConfig::max_in_flight_bytes`] of READ/WRITE payload buffered); replies go through an
//! mpsc channel to a single writer task, in completion order. On `NBD_CMD_DISC`, EOF, a protocol
//! error or server shutdown the reader stops, in-flight requests still run to completion on
//! the export, and only then is the connection closed and the export's connection count
//! released.
//!
//! Node-wide caps come from [`ServerConfig::limits`], shared with the node's other front ends:
//! a connection beyond `max_connections` is closed as soon as it is accepted, and a request
//! takes its share of the node's payload budget (after its connection's) before its WRITE
//! payload is read or its READ is run. A connection waiting for budget reads nothing more, so
//! TCP pushes back on its client. A WRITE payload that has not fully arrived, or a reply not
//! taken by the client, within the payload time-out closes the connection and frees its budget:
//! a stalled client must not hold the node's budget forever.

mod connection;
mod execute;
mod writer;

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use mariner_limits::Limits;

use crate::backend::Exports;
use crate::handshake::HandshakeConfig;
use crate::negotiation::HandshakeError;
use crate::request::RequestError;

/// Settings of the server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Handshake limits.
    pub handshake: HandshakeConfig,
    /// Time a client gets to finish the handshake.
    pub handshake_timeout: Duration,
    /// Requests executing at once per connection.
    pub max_in_flight: u32,
    /// READ/WRITE payload bytes buffered at once per connection.
    pub max_in_flight_bytes: u32,
    /// How long a closing connection waits for the client to take its last replies.
    pub drain_timeout: Duration,
    /// Node-wide caps on connections and payload bytes, shared with other servers holding a
    /// clone (default: none).
    pub limits: Limits,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            handshake: HandshakeConfig::default(),
            handshake_timeout: Duration::from_secs(60),
            max_in_flight: 128,
            max_in_flight_bytes: 128 << 20,
            drain_timeout: Duration::from_secs(30),
            limits: Limits::default(),
        }
    }
}

/// Why a connection ended abnormally.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    /// Socket error.
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    /// The handshake required a hard disconnect.
    #[error("handshake failed: {0}")]
    Handshake(#[from] HandshakeError),
    /// The client did not finish the handshake in time.
    #[error("handshake timed out")]
    HandshakeTimeout,
    /// The client closed the connection during the handshake.
    #[error("client disconnected during the handshake")]
    HandshakeEof,
    /// The request stream broke the protocol.
    #[error("protocol error: {0}")]
    Protocol(#[from] RequestError),
    /// A WRITE payload did not arrive in time while holding payload budget.
    #[error("WRITE payload not received within {0:?} (limits.payload_timeout_ms); closing")]
    PayloadTimeout(Duration),
    /// The client took no reply in time while replies held payload budget.
    #[error("client took no reply within {0:?} (limits.payload_timeout_ms); closing")]
    ReplyTimeout(Duration),
}

/// Tells connections that the server is shutting down.
#[derive(Debug, Clone)]
pub(crate) struct Shutdown(watch::Receiver<bool>);

impl Shutdown {
    /// A signal that never fires.
    fn never() -> Self {
        let (tx, rx) = watch::channel(false);
        // Leak nothing: a dropped sender is treated as "never" by `wait`.
        drop(tx);
        Self(rx)
    }

    /// Resolves once shutdown has been requested (never, if the sender is gone unsignalled).
    pub(crate) async fn wait(&mut self) {
        loop {
            if *self.0.borrow_and_update() {
                return;
            }
            if self.0.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }
}

/// Serves `exports` on `listener` until `shutdown` resolves; then stops accepting, lets every
/// connection finish its in-flight requests, and returns once all are closed.
pub async fn serve(
    listener: TcpListener,
    exports: Arc<dyn Exports>,
    config: ServerConfig,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();
    let mut accept_errors = 0u32;
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    accept_errors = 0;
                    // Beyond the node's connection cap the socket is closed at once (logged).
                    let Some(slot) = config.limits.admit("NBD", peer) else { continue };
                    if let Err(e) = stream.set_nodelay(true) {
                        tracing::debug!(%peer, "cannot set TCP_NODELAY: {e}");
                    }
                    let (exports, stop) = (Arc::clone(&exports), Shutdown(stop_rx.clone()));
                    let run = connection::run_logged(stream, peer.to_string(), exports, config.clone(), stop);
                    tasks.spawn(async move {
                        run.await;
                        drop(slot);
                    });
                }
                Err(e) => accept_failed(e, &mut accept_errors).await?,
            },
            Some(joined) = tasks.join_next(), if !tasks.is_empty() => log_join(joined),
        }
    }
    tracing::debug!(connections = tasks.len(), "shutting down NBD server");
    drop(listener);
    let _ = stop_tx.send(true);
    while let Some(joined) = tasks.join_next().await {
        log_join(joined);
    }
    Ok(())
}

/// Transient accept errors (aborted handshakes, fd exhaustion) are retried; a listener that
/// keeps failing is reported.
async fn accept_failed(e: io::Error, consecutive: &mut u32) -> io::Result<()> {
    use io::ErrorKind::*;
    if matches!(
        e.kind(),
        ConnectionAborted | ConnectionReset | Interrupted | WouldBlock
    ) {
        return Ok(());
    }
    *consecutive += 1;
    if *consecutive > 1000 {
        return Err(e);
    }
    tracing::warn!("accept failed: {e}");
    tokio::time::sleep(Duration::from_millis(100)).await;
    Ok(())
}

fn log_join(joined: Result<(), tokio::task::JoinError>) {
    if let Err(e) = joined {
        tracing::error!("NBD connection task failed: {e}");
    }
}

/// Serves one already-accepted connection (any byte stream) until the client disconnects.
///
/// Returns `Ok` for every orderly end (`NBD_OPT_ABORT`, `NBD_CMD_DISC`, the client closing
/// the connection between or even in the middle of requests) and `Err` when the server had
/// to hard-disconnect.
pub async fn serve_connection<S>(
    stream: S,
    exports: Arc<dyn Exports>,
    config: ServerConfig,
) -> Result<(), ConnectionError>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    connection::run(stream, exports, config, Shutdown::never()).await
}
