//! The tokio server: accepts connections, runs the [`Login`] state machine, then the full
//! feature phase against the target's LUN 0.
//!
//! Per connection, the session loop reads PDUs and takes completed tasks back; nothing in it
//! waits for storage. Non-immediate requests are delivered in CmdSN order: one ahead of
//! ExpCmdSN waits until the gap fills, one outside the window is dropped (RFC 7143 §4.2.2.1);
//! immediate ones are delivered at once. A SCSI command becomes a task once all its data-out
//! has arrived (immediate, unsolicited, then solicited with R2T) and runs concurrently with the
//! session's other tasks; its completion comes back to the loop, which stamps StatSN,
//! ExpCmdSN and MaxCmdSN and writes the data-in and response. Task management aborts tasks
//! waiting for data, queued or running; an aborted task sends nothing.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use mariner_limits::Limits;

use crate::login::{Established, Login, Next, SessionKind};
use crate::params::TargetLimits;
use crate::pdu::{Decoder, Digests, Pdu, PduError};
use crate::session::Session;
use crate::targets::Targets;

/// Settings of the server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Our negotiation limits.
    pub limits: TargetLimits,
    /// Time a client gets to finish logging in.
    pub login_timeout: Duration,
    /// Node-wide caps shared with the node's other front ends; a connection beyond
    /// `max_connections` is closed as soon as it is accepted (default: none).
    pub node_limits: Limits,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            limits: TargetLimits::default(),
            login_timeout: Duration::from_secs(30),
            node_limits: Limits::default(),
        }
    }
}

/// Why a connection ended abnormally.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    /// Socket error.
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    /// Malformed PDU stream.
    #[error("PDU error: {0}")]
    Pdu(#[from] PduError),
    /// The initiator broke the protocol.
    #[error("protocol error: {0}")]
    Protocol(&'static str),
    /// Login took too long.
    #[error("login timed out")]
    LoginTimeout,
    /// A command's data did not arrive in time while it held payload budget.
    #[error("command data not received within {0:?} (limits.payload_timeout_ms); closing")]
    PayloadTimeout(Duration),
    /// The initiator took no response in time while responses held payload budget.
    #[error("initiator took no response within {0:?} (limits.payload_timeout_ms); closing")]
    ReplyTimeout(Duration),
}

/// Serves iSCSI on `listener` until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    targets: Arc<dyn Targets>,
    config: ServerConfig,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let tsih = Arc::new(AtomicU16::new(1));
    let portal = listener.local_addr()?;
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => {
                let (stream, peer) = accepted?;
                // Beyond the node's connection cap the socket is closed at once (logged).
                let Some(slot) = config.node_limits.admit("iSCSI", peer) else { continue };
                let (targets, config) = (targets.clone(), config.clone());
                let mut stop = stop_rx.clone();
                let handle = tsih.fetch_add(1, Ordering::Relaxed).max(1);
                tokio::spawn(async move {
                    tokio::select! {
                        r = serve_connection(stream, targets, config, portal, handle) => {
                            match r {
                                Ok(()) => {}
                                // A stalled initiator held payload budget others wait for.
                                Err(e @ (ConnectionError::PayloadTimeout(_)
                                | ConnectionError::ReplyTimeout(_))) => {
                                    tracing::warn!(%peer, "iSCSI connection closed: {e}");
                                }
                                Err(e) => {
                                    tracing::debug!(%peer, error = %e, "iSCSI connection ended");
                                }
                            }
                        }
                        _ = stop.changed() => {}
                    }
                    drop(slot);
                });
            }
        }
    }
    let _ = stop_tx.send(true);
    Ok(())
}

/// Serves one connection: login, then the full feature phase.
pub async fn serve_connection(
    mut stream: TcpStream,
    targets: Arc<dyn Targets>,
    config: ServerConfig,
    portal: SocketAddr,
    tsih: u16,
) -> Result<(), ConnectionError> {
    let _ = stream.set_nodelay(true);
    let mut io = PduStream {
        buf: Vec::new(),
        start: 0,
        decoder: Decoder::new(64 * 1024),
        digests: Digests::default(),
        out: Vec::new(),
    };
    let established = tokio::time::timeout(
        config.login_timeout,
        login(&mut stream, &mut io, targets.clone(), config.limits, tsih),
    )
    .await
    .map_err(|_| ConnectionError::LoginTimeout)??;
    let Some(est) = established else {
        return Ok(());
    };
    io.decoder.digests = Digests {
        header: est.params.header_digest,
        data: est.params.data_digest,
    };
    io.decoder.max_data_len = est.params.target_max_recv as usize;
    io.digests = io.decoder.digests;
    // A normal session holds its target (e.g. the volume cannot be deleted) while it lasts.
    let _hold = match &est.kind {
        SessionKind::Normal(t) => Some(targets.hold(t)),
        SessionKind::Discovery => None,
    };
    let mut session = Session::new(*est, targets, portal, config.node_limits.clone());
    session.run(&mut stream, &mut io).await
}

pub(crate) struct PduStream {
    /// Bytes received; those before `start` are decoded already.
    buf: Vec<u8>,
    /// Where the next PDU starts in `buf`. One read brings many PDUs at depth (a dozen 4 KiB
    /// writes); taking each off the front would shift the rest down every time, so the
    /// decoded ones are dropped only before the next read, when at most a partial PDU is
    /// left to move.
    start: usize,
    decoder: Decoder,
    digests: Digests,
    /// Encoded PDUs on their way out, reused from write to write.
    out: Vec<u8>,
}

impl PduStream {
    /// Cancel-safe: bytes read are kept in `buf` before the next await.
    pub(crate) async fn read(
        &mut self,
        stream: &mut (impl AsyncRead + Unpin),
    ) -> Result<Option<Pdu>, ConnectionError> {
        loop {
            if let Some(pdu) = self.decoded()? {
                return Ok(Some(pdu));
            }
            self.buf.drain(..self.start);
            self.start = 0;
            self.buf.reserve(64 * 1024);
            let n = stream.read_buf(&mut self.buf).await?;
            if n == 0 {
                return Ok(None);
            }
        }
    }

    /// The next PDU already received in full, without reading from the connection.
    pub(crate) fn decoded(&mut self) -> Result<Option<Pdu>, ConnectionError> {
        let rest = self.buf.get(self.start..).unwrap_or_default();
        let Some((pdu, len)) = self.decoder.decode_prefix(rest)? else {
            return Ok(None);
        };
        self.start += len;
        Ok(Some(pdu))
    }

    pub(crate) async fn write(
        &mut self,
        stream: &mut (impl AsyncWrite + Unpin),
        pdus: &[Pdu],
    ) -> io::Result<()> {
        // The encoding buffer is kept for the next write (it grew by doubling on every write
        // before), unless a large data-in made it big.
        const KEEP: usize = 1 << 20;
        self.out.clear();
        for p in pdus {
            p.encode(self.digests, &mut self.out);
        }
        let result = stream.write_all(&self.out).await;
        if self.out.capacity() > KEEP {
            self.out = Vec::new();
        }
        result
    }
}

async fn login(
    stream: &mut TcpStream,
    io: &mut PduStream,
    targets: Arc<dyn Targets>,
    limits: TargetLimits,
    tsih: u16,
) -> Result<Option<Box<Established>>, ConnectionError> {
    let mut machine = Login::new(targets, limits, tsih);
    loop {
        let Some(req) = io.read(stream).await? else {
            return Ok(None);
        };
        let (resp, next) = machine.handle(&req);
        io.write(stream, &[resp]).await?;
        match next {
            Next::Continue => {}
            Next::Close => return Ok(None),
            Next::FullFeature(est) => return Ok(Some(est)),
        }
    }
}
