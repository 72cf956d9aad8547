//! Transmission-phase requests: the 28-byte header, the checks every request passes before it
//! reaches an export, and a sans-I/O decoder that turns a byte stream into requests.
//!
//! ```text
//! request header (28 bytes)
//! +0  u32 0x25609513 (NBD_REQUEST_MAGIC)
//! +4  u16 command flags (NBD_CMD_FLAG_*)
//! +6  u16 command type (NBD_CMD_*)
//! +8  u64 cookie (opaque, echoed in the reply)
//! +16 u64 offset
//! +24 u32 length
//! +28 length bytes of payload, for NBD_CMD_WRITE only
//! ```
//!
//! A WRITE payload is buffered only after its header passed the checks, which cap it at the
//! export's maximum payload. A rejected WRITE's payload is skipped without buffering if it is at
//! most [`DISCARD_LIMIT`] bytes; beyond that the connection is closed, since keeping the stream
//! in sync would mean reading an attacker-chosen amount.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::negotiation::{BlockSizes, Negotiated};
use crate::wire::{
    CommandFlags, CommandType, ErrorCode, Reader, TransmissionFlags, REQUEST_HEADER_LEN,
    REQUEST_MAGIC,
};

/// Longest rejected WRITE payload skipped to keep the connection usable (2^25, the payload
/// size the spec says should never be treated as denial of service).
pub const DISCARD_LIMIT: u32 = 1 << 25;

/// A parsed request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    /// Command flags.
    pub flags: CommandFlags,
    /// Command type.
    pub command: CommandType,
    /// Client cookie, echoed in replies.
    pub cookie: u64,
    /// Byte offset.
    pub offset: u64,
    /// Byte length (payload length for WRITE).
    pub length: u32,
}

/// The header did not start with `NBD_REQUEST_MAGIC`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("bad request magic {0:#010x}")]
pub struct BadRequestMagic(pub u32);

impl RequestHeader {
    /// Parses a 28-byte header.
    pub fn parse(bytes: &[u8; REQUEST_HEADER_LEN]) -> Result<Self, BadRequestMagic> {
        let mut r = Reader::new(bytes);
        let fields = (r.u32(), r.u16(), r.u16(), r.u64(), r.u64(), r.u32());
        let (Ok(magic), Ok(flags), Ok(command), Ok(cookie), Ok(offset), Ok(length)) = fields else {
            // Unreachable: the array has exactly the header length.
            return Err(BadRequestMagic(0));
        };
        if magic != REQUEST_MAGIC {
            return Err(BadRequestMagic(magic));
        }
        Ok(Self {
            flags: CommandFlags(flags),
            command: command.into(),
            cookie,
            offset,
            length,
        })
    }

    /// Appends the header to `out` (client side; used by tests and tools).
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.put_u32(REQUEST_MAGIC);
        out.put_u16(self.flags.0);
        out.put_u16(self.command.into());
        out.put_u64(self.cookie);
        out.put_u64(self.offset);
        out.put_u32(self.length);
    }

    /// Whether a payload of `length` bytes follows this header on the wire.
    pub fn has_payload(&self) -> bool {
        self.command == CommandType::Write
    }
}

/// What the checks need to know about the negotiated session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransmissionContext {
    /// Export size in bytes.
    pub size_bytes: u64,
    /// Block size constraints.
    pub block_sizes: BlockSizes,
    /// Transmission flags advertised.
    pub flags: TransmissionFlags,
    /// Structured replies were negotiated.
    pub structured: bool,
    /// Context id of `base:allocation`, if selected.
    pub base_allocation: Option<u32>,
}

impl TransmissionContext {
    /// The context of a finished negotiation.
    pub fn from_negotiated(n: &Negotiated) -> Self {
        Self {
            size_bytes: n.info.size_bytes,
            block_sizes: n.block_sizes,
            flags: n.flags,
            structured: n.structured,
            base_allocation: n.base_allocation,
        }
    }

    fn advertises(&self, flag: TransmissionFlags) -> bool {
        self.flags.contains(flag)
    }
}

/// A request that passed every check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `NBD_CMD_READ`.
    Read {
        /// Offset.
        offset: u64,
        /// Length.
        length: u32,
    },
    /// `NBD_CMD_WRITE` with its payload.
    Write {
        /// Offset.
        offset: u64,
        /// Payload (exactly the header's length).
        data: Bytes,
        /// Force unit access.
        fua: bool,
    },
    /// `NBD_CMD_DISC`: finish in-flight requests, then close.
    Disconnect,
    /// `NBD_CMD_FLUSH`.
    Flush,
    /// `NBD_CMD_TRIM`.
    Trim {
        /// Offset.
        offset: u64,
        /// Length.
        length: u32,
        /// Force unit access.
        fua: bool,
    },
    /// `NBD_CMD_CACHE` (a hint; answered without doing anything).
    Cache {
        /// Offset.
        offset: u64,
        /// Length.
        length: u32,
    },
    /// `NBD_CMD_WRITE_ZEROES`.
    WriteZeroes {
        /// Offset.
        offset: u64,
        /// Length.
        length: u32,
        /// Force unit access.
        fua: bool,
        /// The client did not set `NBD_CMD_FLAG_NO_HOLE`.
        may_trim: bool,
    },
    /// `NBD_CMD_BLOCK_STATUS` for `base:allocation`.
    BlockStatus {
        /// Offset.
        offset: u64,
        /// Length.
        length: u32,
        /// `NBD_CMD_FLAG_REQ_ONE`: reply with exactly one extent.
        req_one: bool,
        /// Context id to answer with.
        context_id: u32,
    },
}

/// A checked request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Client cookie.
    pub cookie: u64,
    /// Command type as sent.
    pub kind: CommandType,
    /// What to do.
    pub command: Command,
}

/// Why a request was refused; answered with `error`, the connection carries on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rejection {
    /// Client cookie.
    pub cookie: u64,
    /// Command type as sent.
    pub kind: CommandType,
    /// NBD error to reply with.
    pub error: ErrorCode,
    /// Why, for logs and structured error messages.
    pub reason: &'static str,
}

/// What the decoder produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A request to execute.
    Request(Request),
    /// A request to answer with an error.
    Reject(Rejection),
}

/// A stream error after which the connection must be closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// A header did not start with the request magic.
    #[error(transparent)]
    BadMagic(#[from] BadRequestMagic),
    /// A rejected WRITE announced more payload than the server is willing to skip.
    #[error("write of {length} bytes (cookie {cookie:#x}) exceeds the payload limit")]
    OversizedPayload {
        /// Client cookie.
        cookie: u64,
        /// Announced payload length.
        length: u32,
    },
}

/// Checks a header against the session; `Ok` means the request may reach the export.
pub fn check(header: &RequestHeader, ctx: &TransmissionContext) -> Result<(), Rejection> {
    let reject = |error, reason| Rejection {
        cookie: header.cookie,
        kind: header.command,
        error,
        reason,
    };
    let unknown_flags = header.flags.without(allowed_flags(header.command, ctx));
    if !unknown_flags.is_empty() {
        return Err(reject(
            ErrorCode::Inval,
            "command flags not valid for this command",
        ));
    }
    check_command(header, ctx).map_err(|(error, reason)| reject(error, reason))
}

/// Flags valid on `command` in this session. FUA is accepted everywhere (clients are known to
/// set it on non-writes, and the spec requires accepting it once advertised).
fn allowed_flags(command: CommandType, ctx: &TransmissionContext) -> CommandFlags {
    let specific = match command {
        CommandType::Read if ctx.advertises(TransmissionFlags::SEND_DF) => CommandFlags::DF,
        CommandType::WriteZeroes => CommandFlags::NO_HOLE,
        CommandType::BlockStatus => CommandFlags::REQ_ONE,
        _ => CommandFlags::EMPTY,
    };
    CommandFlags::FUA | specific
}

type Refusal = (ErrorCode, &'static str);

fn check_command(h: &RequestHeader, ctx: &TransmissionContext) -> Result<(), Refusal> {
    match h.command {
        CommandType::Read => check_read(h, ctx),
        CommandType::Write => {
            writable(ctx)?;
            if h.length > ctx.block_sizes.max_payload() {
                return Err((
                    ErrorCode::Inval,
                    "write payload exceeds the maximum payload size",
                ));
            }
            check_range(h, ctx, ErrorCode::NoSpc)
        }
        CommandType::Disc | CommandType::Flush => Ok(()),
        CommandType::Trim => {
            advertised(ctx, TransmissionFlags::SEND_TRIM, "trim is not supported")?;
            writable(ctx)?;
            check_range(h, ctx, ErrorCode::Inval)
        }
        CommandType::WriteZeroes => {
            advertised(
                ctx,
                TransmissionFlags::SEND_WRITE_ZEROES,
                "write zeroes is not supported",
            )?;
            writable(ctx)?;
            check_range(h, ctx, ErrorCode::NoSpc)
        }
        CommandType::Cache => check_range(h, ctx, ErrorCode::Inval),
        CommandType::BlockStatus => check_block_status(h, ctx),
        CommandType::Resize | CommandType::Unknown(_) => Err((ErrorCode::Inval, "unknown command")),
    }
}

fn check_read(h: &RequestHeader, ctx: &TransmissionContext) -> Result<(), Refusal> {
    if h.length > ctx.block_sizes.max_payload() {
        // With structured replies the spec names EOVERFLOW for reads refused for size.
        let code = if ctx.structured {
            ErrorCode::Overflow
        } else {
            ErrorCode::Inval
        };
        return Err((code, "read length exceeds the maximum payload size"));
    }
    check_range(h, ctx, ErrorCode::Inval)
}

fn check_block_status(h: &RequestHeader, ctx: &TransmissionContext) -> Result<(), Refusal> {
    if ctx.base_allocation.is_none() {
        return Err((ErrorCode::Inval, "no metadata context was negotiated"));
    }
    if h.length == 0 {
        return Err((ErrorCode::Inval, "block status of zero length"));
    }
    check_range(h, ctx, ErrorCode::Inval)
}

fn advertised(
    ctx: &TransmissionContext,
    flag: TransmissionFlags,
    reason: &'static str,
) -> Result<(), Refusal> {
    if ctx.advertises(flag) {
        Ok(())
    } else {
        Err((ErrorCode::Inval, reason))
    }
}

fn writable(ctx: &TransmissionContext) -> Result<(), Refusal> {
    if ctx.advertises(TransmissionFlags::READ_ONLY) {
        return Err((ErrorCode::Perm, "export is read-only"));
    }
    Ok(())
}

/// Range inside the export (else `past_end`) and aligned to the minimum block size.
fn check_range(
    h: &RequestHeader,
    ctx: &TransmissionContext,
    past_end: ErrorCode,
) -> Result<(), Refusal> {
    let inside = h
        .offset
        .checked_add(u64::from(h.length))
        .is_some_and(|end| end <= ctx.size_bytes);
    if !inside {
        return Err((past_end, "range extends beyond the end of the export"));
    }
    let sizes = &ctx.block_sizes;
    if !sizes.is_aligned(h.offset) || !sizes.is_aligned(u64::from(h.length)) {
        return Err((
            ErrorCode::Inval,
            "request not aligned to the minimum block size",
        ));
    }
    Ok(())
}

/// Builds the command of a checked header (`data` is the WRITE payload).
fn command(h: &RequestHeader, data: Bytes, ctx: &TransmissionContext) -> Command {
    let (offset, length) = (h.offset, h.length);
    let fua = h.flags.contains(CommandFlags::FUA);
    match h.command {
        CommandType::Read => Command::Read { offset, length },
        CommandType::Write => Command::Write { offset, data, fua },
        CommandType::Flush => Command::Flush,
        CommandType::Trim => Command::Trim {
            offset,
            length,
            fua,
        },
        CommandType::Cache => Command::Cache { offset, length },
        CommandType::WriteZeroes => {
            let may_trim = !h.flags.contains(CommandFlags::NO_HOLE);
            Command::WriteZeroes {
                offset,
                length,
                fua,
                may_trim,
            }
        }
        CommandType::BlockStatus => Command::BlockStatus {
            offset,
            length,
            req_one: h.flags.contains(CommandFlags::REQ_ONE),
            context_id: ctx.base_allocation.unwrap_or(0),
        },
        // Everything else was rejected by `check` except DISC.
        _ => Command::Disconnect,
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum DecodeState {
    Header,
    Payload {
        header: RequestHeader,
        length: usize,
    },
    Discard {
        rejection: Rejection,
        remaining: usize,
    },
    Failed(RequestError),
}

/// Turns transmission-phase bytes into [`Event`]s (sans I/O, like a codec's decoder).
#[derive(Debug, Clone)]
pub struct RequestDecoder {
    ctx: TransmissionContext,
    state: DecodeState,
}

impl RequestDecoder {
    /// A decoder for a session with context `ctx`.
    pub fn new(ctx: TransmissionContext) -> Self {
        Self {
            ctx,
            state: DecodeState::Header,
        }
    }

    /// The session context.
    pub fn context(&self) -> &TransmissionContext {
        &self.ctx
    }

    /// Length of the WRITE payload being assembled, once its header has been accepted. Lets
    /// the I/O layer reserve memory budget before the payload is buffered.
    pub fn payload_pending(&self) -> Option<usize> {
        match self.state {
            DecodeState::Payload { length, .. } => Some(length),
            _ => None,
        }
    }

    /// Decodes the next event from the front of `buf`, consuming what it used. `Ok(None)`
    /// means more input is needed. Errors stick.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Event>, RequestError> {
        loop {
            match self.state.clone() {
                DecodeState::Failed(e) => return Err(e),
                DecodeState::Header => match self.header(buf) {
                    Ok(Some(event)) => return Ok(Some(event)),
                    Ok(None) if matches!(self.state, DecodeState::Header) => return Ok(None),
                    Ok(None) => {}
                    Err(e) => {
                        self.state = DecodeState::Failed(e);
                        return Err(e);
                    }
                },
                DecodeState::Payload { header, length } => {
                    if buf.len() < length {
                        return Ok(None);
                    }
                    let data = buf.split_to(length).freeze();
                    self.state = DecodeState::Header;
                    return Ok(Some(self.request(&header, data)));
                }
                DecodeState::Discard {
                    rejection,
                    remaining,
                } => {
                    let n = remaining.min(buf.len());
                    buf.advance(n);
                    if n < remaining {
                        self.state = DecodeState::Discard {
                            rejection,
                            remaining: remaining - n,
                        };
                        return Ok(None);
                    }
                    self.state = DecodeState::Header;
                    return Ok(Some(Event::Reject(rejection)));
                }
            }
        }
    }

    /// Parses a header if one is complete; a WRITE moves to payload or discard state.
    fn header(&mut self, buf: &mut BytesMut) -> Result<Option<Event>, RequestError> {
        let Some(raw) = buf.get(..REQUEST_HEADER_LEN) else {
            return Ok(None);
        };
        let mut bytes = [0u8; REQUEST_HEADER_LEN];
        bytes.copy_from_slice(raw);
        let header = RequestHeader::parse(&bytes)?;
        buf.advance(REQUEST_HEADER_LEN);
        let length = usize::try_from(header.length).unwrap_or(usize::MAX);
        match check(&header, &self.ctx) {
            Ok(()) if header.has_payload() => {
                self.state = DecodeState::Payload { header, length };
                Ok(None)
            }
            Ok(()) => Ok(Some(self.request(&header, Bytes::new()))),
            Err(rejection) if header.has_payload() && length > 0 => {
                if header.length > DISCARD_LIMIT {
                    let (cookie, length) = (header.cookie, header.length);
                    return Err(RequestError::OversizedPayload { cookie, length });
                }
                self.state = DecodeState::Discard {
                    rejection,
                    remaining: length,
                };
                Ok(None)
            }
            Err(rejection) => Ok(Some(Event::Reject(rejection))),
        }
    }

    fn request(&self, header: &RequestHeader, data: Bytes) -> Event {
        Event::Request(Request {
            cookie: header.cookie,
            kind: header.command,
            command: command(header, data, &self.ctx),
        })
    }
}

#[cfg(test)]
mod tests;
