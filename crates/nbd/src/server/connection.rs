//! One connection: handshake over the socket, then the transmission loop.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use bytes::BytesMut;
use futures_util::FutureExt;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::time::{timeout_at, Instant};

use mariner_limits::{Limits, PayloadShare};

use crate::backend::{ConnectionGuard, Export, Exports};
use crate::handshake::{Handshake, Outcome};
use crate::negotiation::Negotiated;
use crate::request::{Command, Event, Rejection, Request, RequestDecoder, TransmissionContext};
use crate::server::execute::{execute, ReplyStyle};
use crate::server::writer::{write_loop, Frame};
use crate::server::{ConnectionError, ServerConfig, Shutdown};
use crate::wire::ErrorCode;

/// Bytes asked of the socket per read.
const READ_CHUNK: usize = 64 * 1024;
/// Replies queued for the writer.
const REPLY_QUEUE: usize = 64;

/// Runs a connection and logs how it ended.
pub(crate) async fn run_logged<S>(
    stream: S,
    peer: String,
    exports: Arc<dyn Exports>,
    config: ServerConfig,
    shutdown: Shutdown,
) where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    tracing::debug!(%peer, "NBD connection opened");
    match run(stream, exports, config, shutdown).await {
        Ok(()) => tracing::debug!(%peer, "NBD connection closed"),
        // A stalled client held payload budget others wait for: worth an operator's eye.
        Err(e @ (ConnectionError::PayloadTimeout(_) | ConnectionError::ReplyTimeout(_))) => {
            tracing::warn!(%peer, "NBD connection closed: {e}")
        }
        Err(e) => tracing::debug!(%peer, "NBD connection closed: {e}"),
    }
}

/// Handshake, then transmission.
pub(crate) async fn run<S>(
    mut stream: S,
    exports: Arc<dyn Exports>,
    config: ServerConfig,
    mut shutdown: Shutdown,
) -> Result<(), ConnectionError>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let negotiated = tokio::select! {
        result = handshake(&mut stream, exports, &config) => result?,
        () = shutdown.wait() => return Ok(()),
    };
    let Some((negotiated, leftover)) = negotiated else {
        return Ok(());
    };
    tracing::debug!(
        export = %negotiated.name,
        structured = negotiated.structured,
        base_allocation = ?negotiated.base_allocation,
        flags = negotiated.flags.0,
        "NBD transmission started"
    );
    transmission(stream, *negotiated, leftover, config, shutdown).await
}

/// Drives the sans-I/O handshake. `None`: the client aborted.
async fn handshake<S>(
    stream: &mut S,
    exports: Arc<dyn Exports>,
    config: &ServerConfig,
) -> Result<Option<(Box<Negotiated>, Vec<u8>)>, ConnectionError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let deadline = Instant::now() + config.handshake_timeout;
    let mut machine = Handshake::new(exports, config.handshake);
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        send_output(stream, &mut machine).await?;
        let read = timeout_at(deadline, stream.read(&mut buf)).await;
        let n = read.map_err(|_| ConnectionError::HandshakeTimeout)??;
        if n == 0 {
            return Err(ConnectionError::HandshakeEof);
        }
        let outcome = machine.receive(&buf[..n]);
        // Replies queued before an error or the final option are sent either way.
        send_output(stream, &mut machine).await?;
        match outcome? {
            None => {}
            Some(Outcome::Abort) => return Ok(None),
            Some(Outcome::Go {
                negotiated,
                leftover,
            }) => return Ok(Some((negotiated, leftover))),
        }
    }
}

async fn send_output<S: AsyncWrite + Unpin>(
    stream: &mut S,
    machine: &mut Handshake,
) -> std::io::Result<()> {
    if machine.has_output() {
        stream.write_all(&machine.take_output()).await?;
        stream.flush().await?;
    }
    Ok(())
}

/// Why the reader stopped.
#[derive(Debug)]
enum End {
    Disconnect,
    Eof { mid_request: bool },
    Shutdown,
    WriterGone,
}

/// The reader side of transmission.
struct Reader<S> {
    read: ReadHalf<S>,
    buf: BytesMut,
    decoder: RequestDecoder,
    style: ReplyStyle,
    replies: mpsc::Sender<Frame>,
    in_flight: Arc<Semaphore>,
    budget: Arc<Semaphore>,
    budget_max: u32,
    limits: Limits,
    export: Arc<dyn Export>,
    connection: Arc<ConnectionGuard>,
}

/// Payload budget one request holds until it is done: its share of the connection's budget
/// and of the node's.
#[derive(Debug)]
pub(crate) struct Budget {
    _connection: OwnedSemaphorePermit,
    _node: Option<PayloadShare>,
}

/// What a request task holds until it has finished: its in-flight slot, and a share of the
/// connection registration, so the export sees the connection as open while any of its
/// requests still runs (even if the connection task itself is aborted).
struct Ticket {
    _slot: Option<OwnedSemaphorePermit>,
    _connection: Arc<ConnectionGuard>,
}

async fn transmission<S>(
    stream: S,
    negotiated: Negotiated,
    leftover: Vec<u8>,
    config: ServerConfig,
    mut shutdown: Shutdown,
) -> Result<(), ConnectionError>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let ctx = TransmissionContext::from_negotiated(&negotiated);
    let Negotiated {
        export,
        name,
        guard,
        structured,
        ..
    } = negotiated;
    let connection = Arc::new(guard);
    let (read, write) = tokio::io::split(stream);
    let (replies, frames) = mpsc::channel(REPLY_QUEUE);
    let payload_timeout = config.limits.payload_timeout();
    let mut writer = tokio::spawn(write_loop(write, frames, payload_timeout));
    let max_in_flight = config.max_in_flight.max(1);
    let budget_max = config.max_in_flight_bytes.max(1);
    let in_flight = Arc::new(Semaphore::new(max_in_flight as usize));
    let mut reader = Reader {
        read,
        buf: BytesMut::from(&leftover[..]),
        decoder: RequestDecoder::new(ctx),
        style: ReplyStyle { structured },
        replies,
        in_flight: Arc::clone(&in_flight),
        budget: Arc::new(Semaphore::new(budget_max as usize)),
        budget_max,
        limits: config.limits.clone(),
        export,
        connection: Arc::clone(&connection),
    };
    let ended = reader.read_loop(&mut shutdown).await;
    log_end(&name, &ended);
    // Every request already accepted finishes on the export; the writer sends their replies
    // and closes the socket once the last one is in. A client that stops reading would block
    // the writer forever, so after `drain_timeout` it is aborted: the requests still complete,
    // their replies are dropped.
    drop(reader);
    let written = match tokio::time::timeout(config.drain_timeout, &mut writer).await {
        Ok(written) => written,
        Err(_) => {
            tracing::debug!(export = %name, "client is not reading replies; closing");
            writer.abort();
            writer.await
        }
    };
    let _drained = in_flight.acquire_many(max_in_flight).await;
    match written {
        Ok(Ok(())) => {}
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::TimedOut => {
            drop(connection);
            return Err(ConnectionError::ReplyTimeout(payload_timeout));
        }
        Ok(Err(e)) => tracing::debug!(export = %name, "NBD reply writer: {e}"),
        Err(e) if e.is_cancelled() => {}
        Err(e) => tracing::error!(export = %name, "NBD reply writer failed: {e}"),
    }
    // The last share of the registration: the export learns the connection is gone.
    drop(connection);
    ended.map(|_| ())
}

fn log_end(export: &str, ended: &Result<End, ConnectionError>) {
    match ended {
        Ok(End::Disconnect) => tracing::debug!(export, "client sent NBD_CMD_DISC"),
        Ok(End::Eof { mid_request: false }) => tracing::debug!(export, "client closed"),
        Ok(End::Eof { mid_request: true }) => {
            tracing::debug!(export, "client closed in the middle of a request")
        }
        Ok(End::Shutdown) => tracing::debug!(export, "server shutting down"),
        Ok(End::WriterGone) => tracing::debug!(export, "reply writer stopped"),
        Err(e) => tracing::debug!(export, "closing connection: {e}"),
    }
}

impl<S: AsyncRead + AsyncWrite + Send + Unpin + 'static> Reader<S> {
    async fn read_loop(&mut self, shutdown: &mut Shutdown) -> Result<End, ConnectionError> {
        // The writer gives up on a client that takes no replies; reading more requests for
        // it would only run them for nothing.
        let replies = self.replies.clone();
        loop {
            let next = tokio::select! {
                next = self.next_event() => next?,
                () = shutdown.wait() => return Ok(End::Shutdown),
                () = replies.closed() => return Ok(End::WriterGone),
            };
            let (event, budget) = match next {
                Ok(next) => next,
                Err(end) => return Ok(end),
            };
            match event {
                Event::Reject(rejection) => self.reject(rejection).await,
                Event::Request(Request {
                    command: Command::Disconnect,
                    ..
                }) => return Ok(End::Disconnect),
                Event::Request(request) => self.dispatch(request, budget).await,
            }
        }
    }

    /// The next decoded event with the payload budget it holds, or why the stream ended.
    /// Cancel-safe: all progress lives in `self.buf` and the decoder.
    async fn next_event(
        &mut self,
    ) -> Result<Result<(Event, Option<Budget>), End>, ConnectionError> {
        let mut budget = None;
        // Set once budget is held for a payload: it must arrive by then.
        let mut deadline = None;
        loop {
            if let Some(event) = self.decoder.decode(&mut self.buf)? {
                return Ok(Ok((event, budget)));
            }
            if let (Some(len), None) = (self.decoder.payload_pending(), &budget) {
                // Reserve budget before buffering a WRITE payload the checks already capped.
                budget = self.acquire_budget(len).await;
                deadline = Some(Instant::now() + self.limits.payload_timeout());
                self.buf.reserve(len.saturating_sub(self.buf.len()));
            }
            self.buf.reserve(READ_CHUNK);
            if self.read_more(deadline).await? == 0 {
                let mid_request = !self.buf.is_empty() || self.decoder.payload_pending().is_some();
                return Ok(Err(End::Eof { mid_request }));
            }
        }
    }

    /// Reads what the socket has, failing once `deadline` (if any) has passed.
    async fn read_more(&mut self, deadline: Option<Instant>) -> Result<usize, ConnectionError> {
        let Some(deadline) = deadline else {
            return Ok(self.read.read_buf(&mut self.buf).await?);
        };
        match timeout_at(deadline, self.read.read_buf(&mut self.buf)).await {
            Ok(read) => Ok(read?),
            Err(_) => Err(ConnectionError::PayloadTimeout(
                self.limits.payload_timeout(),
            )),
        }
    }

    /// Waits until `bytes` of payload may be buffered: first the connection's share (so a
    /// connection at its own cap holds none of the node's), then the node's. (The semaphores
    /// are never closed, so `None` does not happen in practice.)
    async fn acquire_budget(&self, bytes: usize) -> Option<Budget> {
        let cost = u32::try_from(bytes)
            .unwrap_or(u32::MAX)
            .clamp(1, self.budget_max);
        let connection = Arc::clone(&self.budget)
            .acquire_many_owned(cost)
            .await
            .ok()?;
        Some(Budget {
            _connection: connection,
            _node: self.limits.reserve(bytes).await,
        })
    }

    async fn reject(&mut self, rejection: Rejection) {
        tracing::debug!(
            cookie = rejection.cookie,
            kind = ?rejection.kind,
            error = ?rejection.error,
            "rejected request: {}",
            rejection.reason
        );
        let frame = self
            .style
            .error(rejection.cookie, rejection.error, rejection.reason);
        // A send error means the writer is gone (client vanished); reading will notice too.
        let _ = self.replies.send(frame).await;
    }

    async fn dispatch(&mut self, request: Request, mut budget: Option<Budget>) {
        if let Command::Read { length, .. } = request.command {
            budget = self
                .acquire_budget(usize::try_from(length).unwrap_or(usize::MAX))
                .await;
        }
        let ticket = Ticket {
            _slot: Arc::clone(&self.in_flight).acquire_owned().await.ok(),
            _connection: Arc::clone(&self.connection),
        };
        let (export, style, replies) = (Arc::clone(&self.export), self.style, self.replies.clone());
        tokio::spawn(run_request(export, request, style, replies, ticket, budget));
    }
}

/// Runs one request in its own task; a panicking export becomes an `EIO` reply (caught where
/// it happens: a second task per request only to catch it cost a spawn and a wake-up).
async fn run_request(
    export: Arc<dyn Export>,
    request: Request,
    style: ReplyStyle,
    replies: mpsc::Sender<Frame>,
    _ticket: Ticket,
    budget: Option<Budget>,
) {
    let (cookie, kind) = (request.cookie, request.kind);
    // The export is shared with other requests; a panic leaves it as its own locks and
    // invariants do (a poisoned lock fails later requests with an error, not a panic).
    let executed = AssertUnwindSafe(execute(export, request, style)).catch_unwind();
    let mut frame = match executed.await {
        Ok(frame) => frame,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            tracing::error!(cookie, ?kind, "NBD request panicked: {what}");
            style.error(cookie, ErrorCode::Io, "internal server error")
        }
    };
    // Read data stays accounted for until the writer has sent it.
    frame._budget = budget;
    let _ = replies.send(frame).await;
}
