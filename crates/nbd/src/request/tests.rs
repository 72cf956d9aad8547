#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use crate::backend::ExportInfo;
use crate::negotiation::transmission_flags;

const SIZE: u64 = 1 << 20;

fn info(read_only: bool) -> ExportInfo {
    ExportInfo {
        name: "t".into(),
        description: String::new(),
        size_bytes: SIZE,
        block_size_min: 512,
        block_size_preferred: 4096,
        max_payload_bytes: 64 * 1024,
        read_only,
        can_trim: true,
        can_write_zeroes: true,
        can_multi_conn: true,
    }
}

fn ctx(structured: bool, read_only: bool) -> TransmissionContext {
    let info = info(read_only);
    TransmissionContext {
        size_bytes: SIZE,
        block_sizes: BlockSizes::from_info(&info).unwrap(),
        flags: transmission_flags(&info, structured),
        structured,
        base_allocation: structured.then_some(1),
    }
}

fn header(command: CommandType, flags: CommandFlags, offset: u64, length: u32) -> RequestHeader {
    RequestHeader {
        flags,
        command,
        cookie: 0xc0ff_ee00,
        offset,
        length,
    }
}

fn bytes(h: &RequestHeader) -> Vec<u8> {
    let mut out = Vec::new();
    h.encode(&mut out);
    out
}

fn code(h: RequestHeader, ctx: &TransmissionContext) -> Option<ErrorCode> {
    check(&h, ctx).err().map(|r| r.error)
}

#[test]
fn header_golden_bytes() {
    let raw: [u8; 28] = *b"\x25\x60\x95\x13\x00\x01\x00\x01\
        \x00\x00\x00\x00\x00\x00\x00\x2a\
        \x00\x00\x00\x00\x00\x00\x10\x00\
        \x00\x00\x02\x00";
    let h = RequestHeader::parse(&raw).unwrap();
    assert_eq!(
        h,
        RequestHeader {
            flags: CommandFlags::FUA,
            command: CommandType::Write,
            cookie: 42,
            offset: 4096,
            length: 512
        }
    );
    assert_eq!(bytes(&h), raw);
}

#[test]
fn header_bad_magic() {
    let mut raw = [0u8; 28];
    raw[..4].copy_from_slice(b"\x25\x60\x95\x14");
    assert_eq!(
        RequestHeader::parse(&raw),
        Err(BadRequestMagic(0x2560_9514))
    );
}

#[test]
fn checks_follow_the_spec() {
    use CommandType::*;
    let none = CommandFlags::EMPTY;
    let plain = ctx(false, false);
    let sr = ctx(true, false);
    let ro = ctx(false, true);
    // In range and aligned.
    assert_eq!(code(header(Read, none, 0, 4096), &plain), None);
    assert_eq!(code(header(Read, none, SIZE - 512, 512), &plain), None);
    // Past the end: EINVAL for reads and trims, ENOSPC for writes and zeroing.
    assert_eq!(
        code(header(Read, none, SIZE, 512), &plain),
        Some(ErrorCode::Inval)
    );
    assert_eq!(
        code(header(Read, none, u64::MAX - 511, 512), &plain),
        Some(ErrorCode::Inval)
    );
    assert_eq!(
        code(header(Trim, none, SIZE - 512, 1024), &plain),
        Some(ErrorCode::Inval)
    );
    assert_eq!(
        code(header(Write, none, SIZE, 512), &plain),
        Some(ErrorCode::NoSpc)
    );
    assert_eq!(
        code(header(WriteZeroes, none, SIZE - 512, 1024), &plain),
        Some(ErrorCode::NoSpc)
    );
    // Misaligned.
    assert_eq!(
        code(header(Read, none, 100, 512), &plain),
        Some(ErrorCode::Inval)
    );
    assert_eq!(
        code(header(Write, none, 0, 100), &plain),
        Some(ErrorCode::Inval)
    );
    // Payload caps: EINVAL, or EOVERFLOW for structured reads.
    assert_eq!(
        code(header(Read, none, 0, 128 * 1024), &plain),
        Some(ErrorCode::Inval)
    );
    assert_eq!(
        code(header(Read, none, 0, 128 * 1024), &sr),
        Some(ErrorCode::Overflow)
    );
    assert_eq!(
        code(header(Write, none, 0, 128 * 1024), &plain),
        Some(ErrorCode::Inval)
    );
    // Zeroing has no payload: beyond max payload is fine.
    assert_eq!(code(header(WriteZeroes, none, 0, 512 * 1024), &plain), None);
    // Read-only.
    assert_eq!(
        code(header(Write, none, 0, 512), &ro),
        Some(ErrorCode::Perm)
    );
    assert_eq!(code(header(Trim, none, 0, 512), &ro), Some(ErrorCode::Perm));
    assert_eq!(
        code(header(WriteZeroes, none, 0, 512), &ro),
        Some(ErrorCode::Perm)
    );
    assert_eq!(code(header(Read, none, 0, 512), &ro), None);
    // Unknown commands.
    assert_eq!(
        code(header(Unknown(99), none, 0, 0), &plain),
        Some(ErrorCode::Inval)
    );
    assert_eq!(
        code(header(Resize, none, 0, 0), &plain),
        Some(ErrorCode::Inval)
    );
    // Flush, disc and cache.
    assert_eq!(code(header(Flush, none, 0, 0), &plain), None);
    assert_eq!(code(header(Disc, none, 0, 0), &plain), None);
    assert_eq!(code(header(Cache, none, 0, 4096), &plain), None);
}

#[test]
fn flag_checks() {
    use CommandType::*;
    let plain = ctx(false, false);
    let sr = ctx(true, false);
    // FUA is accepted on everything.
    assert_eq!(code(header(Flush, CommandFlags::FUA, 0, 0), &plain), None);
    assert_eq!(code(header(Read, CommandFlags::FUA, 0, 512), &plain), None);
    // DF only on reads with structured replies.
    assert_eq!(
        code(header(Read, CommandFlags::DF, 0, 512), &plain),
        Some(ErrorCode::Inval)
    );
    assert_eq!(code(header(Read, CommandFlags::DF, 0, 512), &sr), None);
    assert_eq!(
        code(header(Write, CommandFlags::DF, 0, 512), &sr),
        Some(ErrorCode::Inval)
    );
    // NO_HOLE only on zeroing; FAST_ZERO is not advertised.
    assert_eq!(
        code(header(WriteZeroes, CommandFlags::NO_HOLE, 0, 512), &plain),
        None
    );
    assert_eq!(
        code(header(Trim, CommandFlags::NO_HOLE, 0, 512), &plain),
        Some(ErrorCode::Inval)
    );
    let fast = CommandFlags::NO_HOLE | CommandFlags::FAST_ZERO;
    assert_eq!(
        code(header(WriteZeroes, fast, 0, 512), &plain),
        Some(ErrorCode::Inval)
    );
    // Unknown bits.
    assert_eq!(
        code(header(Read, CommandFlags(0x8000), 0, 512), &plain),
        Some(ErrorCode::Inval)
    );
}

#[test]
fn block_status_needs_a_context() {
    let plain = ctx(false, false);
    let sr = ctx(true, false);
    let req_one = CommandFlags::REQ_ONE;
    let bs = |flags, offset, length| header(CommandType::BlockStatus, flags, offset, length);
    assert_eq!(
        code(bs(CommandFlags::EMPTY, 0, 4096), &plain),
        Some(ErrorCode::Inval)
    );
    assert_eq!(code(bs(req_one, 0, 4096), &sr), None);
    assert_eq!(
        code(bs(CommandFlags::EMPTY, 0, 0), &sr),
        Some(ErrorCode::Inval)
    );
    assert_eq!(
        code(bs(CommandFlags::EMPTY, SIZE, 512), &sr),
        Some(ErrorCode::Inval)
    );
}

#[test]
fn trim_and_zeroes_need_to_be_advertised() {
    let mut c = ctx(false, false);
    c.flags = TransmissionFlags::HAS_FLAGS | TransmissionFlags::SEND_FLUSH;
    assert_eq!(
        code(header(CommandType::Trim, CommandFlags::EMPTY, 0, 512), &c),
        Some(ErrorCode::Inval)
    );
    let zeroes = header(CommandType::WriteZeroes, CommandFlags::EMPTY, 0, 512);
    assert_eq!(code(zeroes, &c), Some(ErrorCode::Inval));
}

fn decode_all(decoder: &mut RequestDecoder, input: &[u8], chunk: usize) -> Vec<Event> {
    let mut buf = BytesMut::new();
    let mut events = Vec::new();
    for piece in input.chunks(chunk) {
        buf.extend_from_slice(piece);
        while let Some(event) = decoder.decode(&mut buf).unwrap() {
            events.push(event);
        }
    }
    assert!(buf.is_empty());
    events
}

#[test]
fn decoder_assembles_writes_across_reads() {
    let mut input = bytes(&header(CommandType::Write, CommandFlags::FUA, 512, 1024));
    input.extend(vec![0x5a; 1024]);
    input.extend(bytes(&header(
        CommandType::Flush,
        CommandFlags::EMPTY,
        0,
        0,
    )));
    input.extend(bytes(&header(CommandType::Disc, CommandFlags::EMPTY, 0, 0)));
    for chunk in [1, 7, 28, 100, 5000] {
        let mut decoder = RequestDecoder::new(ctx(false, false));
        let events = decode_all(&mut decoder, &input, chunk);
        assert_eq!(events.len(), 3);
        let Event::Request(Request {
            command: Command::Write { offset, data, fua },
            ..
        }) = &events[0]
        else {
            panic!("expected a write, got {:?}", events[0]);
        };
        assert_eq!((*offset, data.len(), *fua), (512, 1024, true));
        assert!(data.iter().all(|b| *b == 0x5a));
        assert!(matches!(
            &events[1],
            Event::Request(Request {
                command: Command::Flush,
                ..
            })
        ));
        assert!(matches!(
            &events[2],
            Event::Request(Request {
                command: Command::Disconnect,
                ..
            })
        ));
    }
}

#[test]
fn decoder_reports_pending_payload() {
    let mut decoder = RequestDecoder::new(ctx(false, false));
    let mut buf =
        BytesMut::from(&bytes(&header(CommandType::Write, CommandFlags::EMPTY, 0, 4096))[..]);
    assert_eq!(decoder.decode(&mut buf).unwrap(), None);
    assert_eq!(decoder.payload_pending(), Some(4096));
}

#[test]
fn rejected_write_payload_is_skipped() {
    let mut input = bytes(&header(CommandType::Write, CommandFlags::EMPTY, 0, 2048));
    input.extend(vec![1; 2048]);
    input.extend(bytes(&header(
        CommandType::Read,
        CommandFlags::EMPTY,
        0,
        512,
    )));
    let mut decoder = RequestDecoder::new(ctx(false, true));
    let events = decode_all(&mut decoder, &input, 300);
    assert!(matches!(
        events[0],
        Event::Reject(Rejection {
            error: ErrorCode::Perm,
            ..
        })
    ));
    assert!(matches!(
        events[1],
        Event::Request(Request {
            command: Command::Read { .. },
            ..
        })
    ));
}

#[test]
fn oversized_write_within_discard_limit_is_rejected_and_skipped() {
    let len = 128 * 1024; // over the 64 KiB max payload, under the discard limit
    let mut input = bytes(&header(CommandType::Write, CommandFlags::EMPTY, 0, len));
    input.extend(vec![0; len as usize]);
    let mut decoder = RequestDecoder::new(ctx(false, false));
    let events = decode_all(&mut decoder, &input, 4096);
    assert!(matches!(
        events[..],
        [Event::Reject(Rejection {
            error: ErrorCode::Inval,
            ..
        })]
    ));
}

#[test]
fn huge_write_closes_without_buffering() {
    let mut decoder = RequestDecoder::new(ctx(false, false));
    let mut buf = BytesMut::from(
        &bytes(&header(
            CommandType::Write,
            CommandFlags::EMPTY,
            0,
            u32::MAX,
        ))[..],
    );
    let err = decoder.decode(&mut buf).unwrap_err();
    assert_eq!(
        err,
        RequestError::OversizedPayload {
            cookie: 0xc0ff_ee00,
            length: u32::MAX
        }
    );
    assert!(buf.capacity() < 1024);
    // Sticky.
    assert_eq!(decoder.decode(&mut BytesMut::new()).unwrap_err(), err);
}

#[test]
fn bad_magic_is_fatal() {
    let mut decoder = RequestDecoder::new(ctx(false, false));
    let mut buf = BytesMut::from(&[0u8; 28][..]);
    assert_eq!(
        decoder.decode(&mut buf),
        Err(RequestError::BadMagic(BadRequestMagic(0)))
    );
}

#[test]
fn zeroes_and_block_status_commands() {
    let mut input = bytes(&header(
        CommandType::WriteZeroes,
        CommandFlags::NO_HOLE,
        0,
        4096,
    ));
    input.extend(bytes(&header(
        CommandType::WriteZeroes,
        CommandFlags::EMPTY,
        0,
        4096,
    )));
    input.extend(bytes(&header(
        CommandType::BlockStatus,
        CommandFlags::REQ_ONE,
        0,
        4096,
    )));
    let mut decoder = RequestDecoder::new(ctx(true, false));
    let commands: Vec<Command> = decode_all(&mut decoder, &input, 28)
        .into_iter()
        .map(|e| match e {
            Event::Request(r) => r.command,
            Event::Reject(r) => panic!("rejected: {r:?}"),
        })
        .collect();
    assert_eq!(
        commands,
        vec![
            Command::WriteZeroes {
                offset: 0,
                length: 4096,
                fua: false,
                may_trim: false
            },
            Command::WriteZeroes {
                offset: 0,
                length: 4096,
                fua: false,
                may_trim: true
            },
            Command::BlockStatus {
                offset: 0,
                length: 4096,
                req_one: true,
                context_id: 1
            },
        ]
    );
}
