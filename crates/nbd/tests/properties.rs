//! Property tests: arbitrary bytes never make a parser or state machine panic, and what the
//! encoders write parses back to the same value.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use bytes::BytesMut;
use mariner_nbd::fuzzing::{fuzz_option, fuzz_request};
use mariner_nbd::memory::{MemoryExport, MemoryExports};
use mariner_nbd::negotiation::{transmission_flags, BlockSizes};
use mariner_nbd::option::{ClientOption, InfoRequest, MetaContextRequest, OptionHeader};
use mariner_nbd::request::{RequestDecoder, RequestHeader, TransmissionContext};
use mariner_nbd::wire::{CommandFlags, CommandType, InfoType, OptionType, WireString};
use mariner_nbd::{Export, Handshake, HandshakeConfig};
use proptest::prelude::*;

fn wire_string() -> impl Strategy<Value = WireString> {
    "[a-zA-Z0-9:_ é-]{0,40}".prop_map(|s| WireString::new(s).unwrap())
}

fn info_request() -> impl Strategy<Value = InfoRequest> {
    (wire_string(), prop::collection::vec(any::<u16>(), 0..8)).prop_map(|(name, items)| {
        InfoRequest {
            name,
            requests: items.into_iter().map(InfoType::from).collect(),
        }
    })
}

fn meta_request() -> impl Strategy<Value = MetaContextRequest> {
    (wire_string(), prop::collection::vec(wire_string(), 0..6))
        .prop_map(|(export, queries)| MetaContextRequest { export, queries })
}

fn client_option() -> impl Strategy<Value = ClientOption> {
    prop_oneof![
        wire_string().prop_map(ClientOption::ExportName),
        Just(ClientOption::Abort),
        Just(ClientOption::List),
        Just(ClientOption::StartTls),
        Just(ClientOption::StructuredReply),
        info_request().prop_map(ClientOption::Info),
        info_request().prop_map(ClientOption::Go),
        meta_request().prop_map(ClientOption::ListMetaContext),
        meta_request().prop_map(ClientOption::SetMetaContext),
    ]
}

fn context() -> TransmissionContext {
    let info = MemoryExport::new("p", 1 << 20).info();
    TransmissionContext {
        size_bytes: info.size_bytes,
        block_sizes: BlockSizes::from_info(&info).unwrap(),
        flags: transmission_flags(&info, true),
        structured: true,
        base_allocation: Some(1),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn option_parser_never_panics(code in any::<u32>(), data in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = ClientOption::parse(OptionType::from(code), &data);
    }

    #[test]
    fn option_header_never_panics(bytes in prop::array::uniform16(any::<u8>())) {
        let _ = OptionHeader::parse(&bytes);
    }

    #[test]
    fn options_round_trip(option in client_option()) {
        let mut out = Vec::new();
        option.encode(&mut out);
        let mut header = [0u8; 16];
        header.copy_from_slice(&out[..16]);
        let header = OptionHeader::parse(&header).unwrap();
        prop_assert_eq!(header.length as usize, out.len() - 16);
        prop_assert_eq!(ClientOption::parse(header.option, &out[16..]).unwrap(), option);
    }

    #[test]
    fn handshake_never_panics(input in prop::collection::vec(any::<u8>(), 0..512), chunk in 1usize..64) {
        let exports = Arc::new(MemoryExports::new());
        exports.add(Arc::new(MemoryExport::new("disk", 4096)));
        let mut machine = Handshake::new(exports, HandshakeConfig::default());
        for piece in input.chunks(chunk) {
            if !matches!(machine.receive(piece), Ok(None)) {
                break;
            }
            let _ = machine.take_output();
        }
    }

    #[test]
    fn request_header_never_panics(bytes in prop::collection::vec(any::<u8>(), 28..=28)) {
        let mut raw = [0u8; 28];
        raw.copy_from_slice(&bytes);
        let _ = RequestHeader::parse(&raw);
    }

    #[test]
    fn request_headers_round_trip(
        flags in any::<u16>(), command in any::<u16>(), cookie in any::<u64>(),
        offset in any::<u64>(), length in any::<u32>(),
    ) {
        let header = RequestHeader {
            flags: CommandFlags(flags),
            command: CommandType::from(command),
            cookie,
            offset,
            length,
        };
        let mut out = Vec::new();
        header.encode(&mut out);
        let mut raw = [0u8; 28];
        raw.copy_from_slice(&out);
        prop_assert_eq!(RequestHeader::parse(&raw).unwrap(), header);
    }

    #[test]
    fn request_decoder_never_panics(input in prop::collection::vec(any::<u8>(), 0..1024), chunk in 1usize..100) {
        let mut decoder = RequestDecoder::new(context());
        let mut buf = BytesMut::new();
        for piece in input.chunks(chunk) {
            buf.extend_from_slice(piece);
            while let Ok(Some(_)) = decoder.decode(&mut buf) {}
        }
    }

    #[test]
    fn fuzz_entry_points_never_panic(input in prop::collection::vec(any::<u8>(), 0..512)) {
        fuzz_option(&input);
        fuzz_request(&input);
    }

    /// Valid request headers (with the request magic) reach deeper states than random bytes.
    #[test]
    fn fuzz_request_with_valid_headers(
        config in any::<u8>(),
        headers in prop::collection::vec((any::<u16>(), 0u16..10, any::<u64>(), 0u32..20_000), 1..8),
    ) {
        let mut input = vec![config];
        for (flags, command, offset, length) in headers {
            let header = RequestHeader {
                flags: CommandFlags(flags & 0x3f),
                command: CommandType::from(command),
                cookie: 1,
                offset: offset % (2 << 20),
                length,
            };
            header.encode(&mut input);
        }
        fuzz_request(&input);
    }
}
