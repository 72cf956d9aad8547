//! Entry points shared by the fuzz targets (`fuzz/fuzz_targets/`) and the corpus replay test
//! (`tests/corpus_replay.rs`). Each takes arbitrary bytes and must never panic; the few
//! `assert!`s below are invariants a fuzzer should report when broken.

use std::sync::Arc;

use bytes::BytesMut;

use crate::backend::{Allocation, ExportInfo, Exports};
use crate::handshake::{Handshake, HandshakeConfig, Outcome};
use crate::memory::{MemoryExport, MemoryExports};
use crate::negotiation::{transmission_flags, BlockSizes};
use crate::option::{ClientOption, OptionHeader};
use crate::reply::{clip_extents, encode_simple_reply, Chunk};
use crate::request::{Command, Event, RequestDecoder, RequestHeader, TransmissionContext};
use crate::wire::{Reader, WireString, OPTION_HEADER_LEN, REQUEST_HEADER_LEN};

/// Client flags prepended so the fuzzer reaches option handling without guessing them.
const FIXED_NEWSTYLE_NO_ZEROES: [u8; 4] = [0, 0, 0, 3];

/// Option-phase entry: `data` is a client byte stream starting right after the client flags
/// (a sequence of `IHAVEOPT` options). It is fed, in chunks whose size the first byte picks, to
/// the handshake state machine; if that reaches transmission, the leftover bytes go on to the
/// request decoder. The option parser and header parser are also run on `data` directly, and
/// the whole stream once more without the client flags.
pub fn fuzz_option(data: &[u8]) {
    if let Some(header) = data.get(..OPTION_HEADER_LEN) {
        let mut bytes = [0u8; OPTION_HEADER_LEN];
        bytes.copy_from_slice(header);
        if let Ok(header) = OptionHeader::parse(&bytes) {
            let _ = ClientOption::parse(header.option, &data[OPTION_HEADER_LEN..]);
        }
    }
    let chunk = usize::from(data.first().copied().unwrap_or(0) % 32) + 1;
    let mut stream = FIXED_NEWSTYLE_NO_ZEROES.to_vec();
    stream.extend_from_slice(data);
    run_handshake(&stream, chunk);
    run_handshake(data, chunk);
}

fn fuzz_exports() -> Arc<MemoryExports> {
    let exports = Arc::new(MemoryExports::new());
    exports.add(Arc::new(MemoryExport::new("disk", 64 * 1024)));
    let info = ExportInfo {
        name: "ro".into(),
        description: String::new(),
        size_bytes: 4096,
        block_size_min: 1,
        block_size_preferred: 4096,
        max_payload_bytes: 4096,
        read_only: true,
        can_trim: false,
        can_write_zeroes: false,
        can_multi_conn: false,
    };
    exports.add(Arc::new(MemoryExport::with_info(info, 4096)));
    exports
}

fn run_handshake(stream: &[u8], chunk: usize) {
    let exports = fuzz_exports();
    let config = HandshakeConfig {
        max_option_bytes: 1024,
        max_options: 256,
        require_block_size: false,
    };
    let dyn_exports: Arc<dyn Exports> = exports.clone();
    let mut machine = Handshake::new(dyn_exports, config);
    for (i, piece) in stream.chunks(chunk).enumerate() {
        match machine.receive(piece) {
            Ok(None) => {}
            Ok(Some(Outcome::Go {
                negotiated,
                leftover,
            })) => {
                let rest = &stream[stream.len().min((i + 1) * chunk)..];
                let mut tail = leftover;
                tail.extend_from_slice(rest);
                let ctx = TransmissionContext::from_negotiated(&negotiated);
                decode_all(ctx, &tail, chunk);
                assert_eq!(exports.connections(&negotiated.name), 1);
                break;
            }
            Ok(Some(Outcome::Abort)) | Err(_) => break,
        }
        check_output(&machine.take_output());
    }
    // Every connection_opened is matched once the negotiation result is gone.
    for info in exports.list() {
        assert_eq!(exports.connections(&info.name), 0);
    }
}

/// Server output during options is a sequence of well-formed option replies (until an
/// `NBD_OPT_EXPORT_NAME` reply, which has no header).
fn check_output(out: &[u8]) {
    let mut r = Reader::new(out);
    while r.remaining() >= 20 {
        let (Ok(magic), Ok(_), Ok(_), Ok(len)) = (r.u64(), r.u32(), r.u32(), r.u32()) else {
            return;
        };
        if magic != crate::wire::OPTION_REPLY_MAGIC {
            return;
        }
        assert!(
            r.bytes(usize::try_from(len).unwrap_or(usize::MAX)).is_ok(),
            "reply overruns"
        );
    }
}

/// Request-phase entry: the first byte picks the session (block size, structured replies,
/// `base:allocation`, read-only, trim/zero support, chunking); the rest is the client's
/// transmission byte stream. The 28-byte header parser also runs on the stream directly.
pub fn fuzz_request(data: &[u8]) {
    let Some((&config, stream)) = data.split_first() else {
        return;
    };
    if let Some(raw) = stream.get(..REQUEST_HEADER_LEN) {
        let mut bytes = [0u8; REQUEST_HEADER_LEN];
        bytes.copy_from_slice(raw);
        let _ = RequestHeader::parse(&bytes);
    }
    let chunk = usize::from(config >> 5) * 9 + 1;
    decode_all(session(config), stream, chunk);
}

/// A session chosen by the bits of `config`.
fn session(config: u8) -> TransmissionContext {
    let bit = |n: u8| config & (1 << n) != 0;
    let info = ExportInfo {
        name: "fuzz".into(),
        description: String::new(),
        size_bytes: 1 << 20,
        block_size_min: if bit(0) { 512 } else { 1 },
        block_size_preferred: 4096,
        max_payload_bytes: 64 * 1024,
        read_only: bit(3),
        can_trim: bit(4),
        can_write_zeroes: bit(4),
        can_multi_conn: false,
    };
    let structured = bit(1);
    let block_sizes = BlockSizes::from_info(&info).unwrap_or_else(|_| BlockSizes::spec_default());
    TransmissionContext {
        size_bytes: info.size_bytes,
        block_sizes,
        flags: transmission_flags(&info, structured),
        structured,
        base_allocation: (structured && bit(2)).then_some(1),
    }
}

/// Feeds `stream` in `chunk`-sized pieces and answers every event.
fn decode_all(ctx: TransmissionContext, stream: &[u8], chunk: usize) {
    let mut decoder = RequestDecoder::new(ctx);
    let mut buf = BytesMut::new();
    for piece in stream.chunks(chunk.max(1)) {
        buf.extend_from_slice(piece);
        loop {
            match decoder.decode(&mut buf) {
                Ok(Some(event)) => answer(&ctx, event),
                Ok(None) => break,
                Err(_) => return,
            }
        }
        assert!(buf.len() <= REQUEST_HEADER_LEN + chunk + ctx.block_sizes.max_payload() as usize);
    }
}

/// Checks an event against the session and encodes a reply for it.
fn answer(ctx: &TransmissionContext, event: Event) {
    let mut out = Vec::new();
    match event {
        Event::Reject(r) => {
            let message = WireString::lossy(r.reason);
            Chunk::Error {
                error: r.error,
                message: &message,
            }
            .encode(r.cookie, true, &mut out);
            encode_simple_reply(r.cookie, Some(r.error), &mut out);
        }
        Event::Request(request) => {
            check_in_range(ctx, &request.command);
            if let Command::BlockStatus {
                length,
                req_one,
                context_id,
                ..
            } = request.command
            {
                let raw = [(length / 3, Allocation::Data), (length, Allocation::Hole)];
                let extents = clip_extents(&raw, length, req_one);
                let total: u64 = extents.iter().map(|e| u64::from(e.length)).sum();
                assert!(total <= u64::from(length) && !extents.is_empty());
                Chunk::BlockStatus {
                    context_id,
                    extents: &extents,
                }
                .encode(request.cookie, true, &mut out);
            }
            encode_simple_reply(request.cookie, None, &mut out);
        }
    }
}

/// Every accepted request lies inside the export, aligned, with a capped payload.
fn check_in_range(ctx: &TransmissionContext, command: &Command) {
    let (offset, length) = match command {
        Command::Read { offset, length }
        | Command::Trim { offset, length, .. }
        | Command::Cache { offset, length }
        | Command::WriteZeroes { offset, length, .. }
        | Command::BlockStatus { offset, length, .. } => (*offset, u64::from(*length)),
        Command::Write { offset, data, .. } => {
            assert!(data.len() <= ctx.block_sizes.max_payload() as usize);
            (*offset, data.len() as u64)
        }
        Command::Disconnect | Command::Flush => return,
    };
    assert!(
        offset + length <= ctx.size_bytes,
        "accepted request beyond the export"
    );
    assert!(ctx.block_sizes.is_aligned(offset) && ctx.block_sizes.is_aligned(length));
}
