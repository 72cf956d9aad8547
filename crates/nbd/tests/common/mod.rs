//! A minimal hand-written NBD client for the integration tests. It deliberately does not use
//! the crate's own encoders, so a symmetric bug in encoder and parser cannot hide.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BufMut};
use mariner_nbd::memory::MemoryExports;
use mariner_nbd::{serve, Exports, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
pub const REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_MAGIC: u32 = 0x668e_33ef;

pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;

pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
pub const REP_ERR_UNSUP: u32 = 0x8000_0001;
pub const REP_ERR_POLICY: u32 = 0x8000_0002;
pub const REP_ERR_INVALID: u32 = 0x8000_0003;
pub const REP_ERR_UNKNOWN: u32 = 0x8000_0006;
pub const REP_ERR_TOO_BIG: u32 = 0x8000_0009;

pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

pub const FLAG_FUA: u16 = 1;
pub const FLAG_NO_HOLE: u16 = 2;
pub const FLAG_DF: u16 = 4;
pub const FLAG_REQ_ONE: u16 = 8;

pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;

pub const TYPE_NONE: u16 = 0;
pub const TYPE_OFFSET_DATA: u16 = 1;
pub const TYPE_BLOCK_STATUS: u16 = 5;
pub const TYPE_ERROR: u16 = 0x8001;

pub const STATE_HOLE: u32 = 1;
pub const STATE_ZERO: u32 = 2;

/// Bounds every wait so a broken server fails a test instead of hanging it.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// A running server.
pub struct Server {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

impl Server {
    pub async fn start(exports: Arc<MemoryExports>) -> Self {
        Self::start_with(exports, ServerConfig::default()).await
    }

    pub async fn start_with(exports: Arc<MemoryExports>, config: ServerConfig) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let exports: Arc<dyn Exports> = exports;
        let shutdown = async move {
            let _ = stopped.await;
        };
        let task = tokio::spawn(serve(listener, exports, config, shutdown));
        Self {
            addr,
            stop: Some(stop),
            task,
        }
    }

    /// Signals shutdown and waits for `serve` to return.
    pub async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        let joined = tokio::time::timeout(TIMEOUT, &mut self.task).await;
        joined.expect("serve did not return").unwrap().unwrap();
    }
}

/// One option reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptReply {
    pub option: u32,
    pub kind: u32,
    pub data: Vec<u8>,
}

/// One structured reply chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkMsg {
    pub flags: u16,
    pub kind: u16,
    pub cookie: u64,
    pub payload: Vec<u8>,
}

/// A reply of either kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Simple { error: u32, cookie: u64 },
    Chunk(ChunkMsg),
}

impl Reply {
    pub fn cookie(&self) -> u64 {
        match self {
            Self::Simple { cookie, .. } => *cookie,
            Self::Chunk(c) => c.cookie,
        }
    }
}

/// What the client negotiated.
#[derive(Debug, Clone, Default)]
pub struct Session {
    pub size: u64,
    pub flags: u16,
    pub structured: bool,
    pub context_id: Option<u32>,
    pub block_min: u32,
    pub max_payload: u32,
}

pub struct Client {
    pub stream: TcpStream,
    pub session: Session,
    next_cookie: u64,
}

/// Connects and reads the greeting, checking it.
pub async fn connect(addr: SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let mut greeting = [0u8; 18];
    tokio::time::timeout(TIMEOUT, stream.read_exact(&mut greeting))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&greeting[..16], b"NBDMAGICIHAVEOPT");
    assert_eq!(&greeting[16..], &[0, 3]); // FIXED_NEWSTYLE | NO_ZEROES
    stream
}

pub async fn send_option(stream: &mut TcpStream, option: u32, data: &[u8]) {
    let mut out = Vec::new();
    out.put_u64(IHAVEOPT);
    out.put_u32(option);
    out.put_u32(data.len() as u32);
    out.put_slice(data);
    stream.write_all(&out).await.unwrap();
}

pub async fn read_opt_reply(stream: &mut TcpStream) -> OptReply {
    let fut = async {
        assert_eq!(stream.read_u64().await.unwrap(), REPLY_MAGIC);
        let option = stream.read_u32().await.unwrap();
        let kind = stream.read_u32().await.unwrap();
        let len = stream.read_u32().await.unwrap();
        assert!(len < 1 << 20, "absurd option reply length {len}");
        let mut data = vec![0; len as usize];
        stream.read_exact(&mut data).await.unwrap();
        OptReply { option, kind, data }
    };
    tokio::time::timeout(TIMEOUT, fut)
        .await
        .expect("option reply timed out")
}

/// Reads replies up to and including the final one (ACK or error).
pub async fn read_opt_replies(stream: &mut TcpStream) -> Vec<OptReply> {
    let mut replies = Vec::new();
    loop {
        let reply = read_opt_reply(stream).await;
        let last = reply.kind == REP_ACK || reply.kind & 0x8000_0000 != 0;
        replies.push(reply);
        if last {
            return replies;
        }
    }
}

pub fn string_field(out: &mut Vec<u8>, s: &str) {
    out.put_u32(s.len() as u32);
    out.put_slice(s.as_bytes());
}

pub fn info_request(name: &str, items: &[u16]) -> Vec<u8> {
    let mut data = Vec::new();
    string_field(&mut data, name);
    data.put_u16(items.len() as u16);
    for item in items {
        data.put_u16(*item);
    }
    data
}

pub fn meta_request(name: &str, queries: &[&str]) -> Vec<u8> {
    let mut data = Vec::new();
    string_field(&mut data, name);
    data.put_u32(queries.len() as u32);
    for q in queries {
        string_field(&mut data, q);
    }
    data
}

/// Options for [`Client::handshake`].
#[derive(Debug, Clone, Copy)]
pub struct Want<'a> {
    pub export: &'a str,
    pub structured: bool,
    pub base_allocation: bool,
}

impl Default for Want<'_> {
    fn default() -> Self {
        Self {
            export: "disk",
            structured: false,
            base_allocation: false,
        }
    }
}

impl Client {
    /// Connects and negotiates with NBD_OPT_GO (requesting block sizes).
    pub async fn handshake(addr: SocketAddr, want: Want<'_>) -> Self {
        let mut stream = connect(addr).await;
        stream.write_u32(3).await.unwrap(); // FIXED_NEWSTYLE | NO_ZEROES
        let mut session = Session::default();
        if want.structured {
            send_option(&mut stream, OPT_STRUCTURED_REPLY, &[]).await;
            assert_eq!(read_opt_reply(&mut stream).await.kind, REP_ACK);
            session.structured = true;
        }
        if want.base_allocation {
            let data = meta_request(want.export, &["base:allocation"]);
            send_option(&mut stream, OPT_SET_META_CONTEXT, &data).await;
            let replies = read_opt_replies(&mut stream).await;
            assert_eq!(replies.len(), 2, "{replies:?}");
            assert_eq!(replies[0].kind, REP_META_CONTEXT);
            let mut data = &replies[0].data[..];
            session.context_id = Some(data.get_u32());
            assert_eq!(data, b"base:allocation");
        }
        send_option(&mut stream, OPT_GO, &info_request(want.export, &[3])).await;
        let replies = read_opt_replies(&mut stream).await;
        assert_eq!(replies.last().unwrap().kind, REP_ACK, "{replies:?}");
        for reply in &replies[..replies.len() - 1] {
            assert_eq!(reply.kind, REP_INFO);
            let mut data = &reply.data[..];
            match data.get_u16() {
                0 => {
                    session.size = data.get_u64();
                    session.flags = data.get_u16();
                }
                3 => {
                    session.block_min = data.get_u32();
                    let _preferred = data.get_u32();
                    session.max_payload = data.get_u32();
                }
                _ => {}
            }
        }
        Self {
            stream,
            session,
            next_cookie: 1,
        }
    }

    /// Wraps a stream already in transmission (simple replies).
    pub fn from_stream(stream: TcpStream) -> Self {
        Self {
            stream,
            session: Session::default(),
            next_cookie: 1,
        }
    }

    pub fn cookie(&mut self) -> u64 {
        self.next_cookie += 1;
        self.next_cookie
    }

    /// Sends a request header (and payload) with the given cookie.
    pub async fn send(
        &mut self,
        cookie: u64,
        cmd: u16,
        flags: u16,
        offset: u64,
        len: u32,
        payload: &[u8],
    ) {
        let mut out = Vec::with_capacity(28 + payload.len());
        out.put_u32(REQUEST_MAGIC);
        out.put_u16(flags);
        out.put_u16(cmd);
        out.put_u64(cookie);
        out.put_u64(offset);
        out.put_u32(len);
        out.put_slice(payload);
        self.stream.write_all(&out).await.unwrap();
    }

    /// Reads one reply message (simple header, or one structured chunk with its payload).
    /// Simple READ replies' data must be read separately by the caller.
    pub async fn reply(&mut self) -> Reply {
        let fut = async {
            let magic = self.stream.read_u32().await.unwrap();
            match magic {
                SIMPLE_MAGIC => {
                    let error = self.stream.read_u32().await.unwrap();
                    let cookie = self.stream.read_u64().await.unwrap();
                    Reply::Simple { error, cookie }
                }
                STRUCTURED_MAGIC => {
                    let flags = self.stream.read_u16().await.unwrap();
                    let kind = self.stream.read_u16().await.unwrap();
                    let cookie = self.stream.read_u64().await.unwrap();
                    let len = self.stream.read_u32().await.unwrap();
                    assert!(len <= 64 << 20);
                    let mut payload = vec![0; len as usize];
                    self.stream.read_exact(&mut payload).await.unwrap();
                    Reply::Chunk(ChunkMsg {
                        flags,
                        kind,
                        cookie,
                        payload,
                    })
                }
                other => panic!("bad reply magic {other:#x}"),
            }
        };
        tokio::time::timeout(TIMEOUT, fut)
            .await
            .expect("reply timed out")
    }

    /// Reads structured chunks of one reply until DONE.
    pub async fn chunks(&mut self) -> Vec<ChunkMsg> {
        let mut chunks = Vec::new();
        loop {
            match self.reply().await {
                Reply::Chunk(c) => {
                    let done = c.flags & 1 != 0;
                    chunks.push(c);
                    if done {
                        return chunks;
                    }
                }
                Reply::Simple { .. } => panic!("simple reply in the middle of a structured one"),
            }
        }
    }

    /// READ; `Err(errno)` on error. Handles both reply styles.
    pub async fn read(&mut self, offset: u64, len: u32) -> Result<Vec<u8>, u32> {
        self.read_flags(offset, len, 0).await
    }

    pub async fn read_flags(&mut self, offset: u64, len: u32, flags: u16) -> Result<Vec<u8>, u32> {
        let cookie = self.cookie();
        self.send(cookie, CMD_READ, flags, offset, len, &[]).await;
        if !self.session.structured {
            let Reply::Simple { error, cookie: got } = self.reply().await else {
                panic!("structured reply without negotiation");
            };
            assert_eq!(got, cookie);
            if error != 0 {
                return Err(error);
            }
            let mut data = vec![0; len as usize];
            within("the READ payload", self.stream.read_exact(&mut data))
                .await
                .unwrap();
            return Ok(data);
        }
        let mut data = vec![0; len as usize];
        for chunk in self.chunks().await {
            assert_eq!(chunk.cookie, cookie);
            let mut p = &chunk.payload[..];
            match chunk.kind {
                TYPE_OFFSET_DATA => {
                    let at = (p.get_u64() - offset) as usize;
                    data[at..at + p.len()].copy_from_slice(p);
                }
                TYPE_NONE => {}
                TYPE_ERROR => return Err(p.get_u32()),
                other => panic!("unexpected chunk type {other}"),
            }
        }
        Ok(data)
    }

    /// A command without reply payload; returns the error (0 = success).
    pub async fn command(
        &mut self,
        cmd: u16,
        flags: u16,
        offset: u64,
        len: u32,
        payload: &[u8],
    ) -> u32 {
        let cookie = self.cookie();
        self.send(cookie, cmd, flags, offset, len, payload).await;
        let reply = self.reply().await;
        assert_eq!(reply.cookie(), cookie);
        reply_error(&reply)
    }

    pub async fn write(&mut self, offset: u64, data: &[u8]) -> u32 {
        self.command(CMD_WRITE, 0, offset, data.len() as u32, data)
            .await
    }

    pub async fn flush(&mut self) -> u32 {
        self.command(CMD_FLUSH, 0, 0, 0, &[]).await
    }

    pub async fn trim(&mut self, offset: u64, len: u32) -> u32 {
        self.command(CMD_TRIM, 0, offset, len, &[]).await
    }

    /// BLOCK_STATUS; returns (context id, [(length, flags)]).
    pub async fn block_status(
        &mut self,
        offset: u64,
        len: u32,
        flags: u16,
    ) -> Result<(u32, Vec<(u32, u32)>), u32> {
        let cookie = self.cookie();
        self.send(cookie, CMD_BLOCK_STATUS, flags, offset, len, &[])
            .await;
        let chunks = self.chunks().await;
        assert_eq!(chunks.len(), 1, "{chunks:?}");
        let chunk = &chunks[0];
        let mut p = &chunk.payload[..];
        match chunk.kind {
            TYPE_BLOCK_STATUS => {
                let id = p.get_u32();
                let mut extents = Vec::new();
                while p.has_remaining() {
                    extents.push((p.get_u32(), p.get_u32()));
                }
                Ok((id, extents))
            }
            TYPE_ERROR => Err(p.get_u32()),
            other => panic!("unexpected chunk type {other}"),
        }
    }

    pub async fn disconnect(mut self) {
        let cookie = self.cookie();
        self.send(cookie, CMD_DISC, 0, 0, 0, &[]).await;
        assert_closed(&mut self.stream).await;
    }
}

/// The error of a non-read reply (simple, or a single structured chunk).
pub fn reply_error(reply: &Reply) -> u32 {
    match reply {
        Reply::Simple { error, .. } => *error,
        Reply::Chunk(c) if c.kind == TYPE_ERROR => (&c.payload[..]).get_u32(),
        Reply::Chunk(c) if c.kind == TYPE_NONE => 0,
        Reply::Chunk(c) => panic!("unexpected chunk {c:?}"),
    }
}

/// Waits until the server closes the connection (EOF or reset); other data is an error.
pub async fn assert_closed(stream: &mut TcpStream) {
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(TIMEOUT, stream.read(&mut buf)).await;
    match read.expect("server did not close the connection") {
        Ok(0) | Err(_) => {}
        Ok(n) => panic!("expected close, got {n} bytes: {:?}", &buf[..n]),
    }
}

/// Polls `cond` until it holds or the timeout passes.
pub async fn eventually(mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "condition not reached in time"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Awaits `f`, failing the test with `what` if it takes longer than [`TIMEOUT`]: a server that
/// stops short of what it owes must fail a test, not hang it.
pub async fn within<F: std::future::Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(TIMEOUT, f)
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing within {TIMEOUT:?}"))
}
