#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use crate::memory::{MemoryExport, MemoryExports};
use crate::option::{ClientOption, InfoRequest};
use crate::wire::{InfoType, WireString, OPTION_REPLY_MAGIC};

const FLAGS_FIXED: &[u8] = &[0, 0, 0, 1];
const FLAGS_FIXED_NO_ZEROES: &[u8] = &[0, 0, 0, 3];

fn exports() -> Arc<MemoryExports> {
    let set = Arc::new(MemoryExports::new());
    set.add(Arc::new(MemoryExport::new("disk", 1 << 20)));
    set
}

fn machine(set: &Arc<MemoryExports>) -> Handshake {
    let mut m = Handshake::new(set.clone(), HandshakeConfig::default());
    m.take_output();
    m
}

fn option(opt: ClientOption) -> Vec<u8> {
    let mut out = Vec::new();
    opt.encode(&mut out);
    out
}

fn go(name: &str) -> Vec<u8> {
    let name = WireString::parse(name.as_bytes()).unwrap();
    option(ClientOption::Go(InfoRequest {
        name,
        requests: vec![InfoType::BlockSize],
    }))
}

/// Splits server output into (option, reply type, data) triples.
fn replies(mut out: &[u8]) -> Vec<(u32, u32, Vec<u8>)> {
    let mut parsed = Vec::new();
    while !out.is_empty() {
        let mut r = Reader::new(out);
        assert_eq!(r.u64().unwrap(), OPTION_REPLY_MAGIC);
        let (option, kind, len) = (r.u32().unwrap(), r.u32().unwrap(), r.u32().unwrap());
        parsed.push((option, kind, r.bytes(len as usize).unwrap().to_vec()));
        out = r.rest();
    }
    parsed
}

#[test]
fn greeting_golden_bytes() {
    let mut m = Handshake::new(exports(), HandshakeConfig::default());
    assert_eq!(m.take_output(), b"NBDMAGICIHAVEOPT\x00\x03");
    assert!(!m.has_output());
    assert_eq!(m.wanted(), 4);
}

#[test]
fn client_flags_are_checked() {
    let set = exports();
    assert_eq!(
        machine(&set).receive(&[0, 0, 0, 0]).unwrap_err(),
        HandshakeError::NotFixedNewstyle
    );
    assert_eq!(
        machine(&set).receive(&[0, 0, 0, 2]).unwrap_err(),
        HandshakeError::NotFixedNewstyle
    );
    assert_eq!(
        machine(&set).receive(&[0, 0, 0, 5]).unwrap_err(),
        HandshakeError::UnknownClientFlags(5)
    );
    assert!(machine(&set).receive(FLAGS_FIXED).unwrap().is_none());
}

#[test]
fn go_fed_one_byte_at_a_time() {
    let set = exports();
    let mut m = machine(&set);
    let mut input = FLAGS_FIXED.to_vec();
    input.extend(option(ClientOption::StructuredReply));
    input.extend(go("disk"));
    let mut outcome = None;
    for byte in &input {
        assert!(outcome.is_none(), "outcome before the last byte");
        outcome = m.receive(std::slice::from_ref(byte)).unwrap();
    }
    let Some(Outcome::Go {
        negotiated,
        leftover,
    }) = outcome
    else {
        panic!("expected Go")
    };
    assert!(leftover.is_empty());
    assert!(negotiated.structured);
    let kinds: Vec<u32> = replies(&m.take_output()).iter().map(|r| r.1).collect();
    assert_eq!(kinds, vec![1, 3, 3, 1]); // ACK, INFO export, INFO block size, ACK
    assert_eq!(m.receive(b"x").unwrap_err(), HandshakeError::Finished);
}

#[test]
fn export_name_reply_with_and_without_zeroes() {
    let set = exports();
    for (flags, len) in [(FLAGS_FIXED, 134), (FLAGS_FIXED_NO_ZEROES, 10)] {
        let mut m = machine(&set);
        let mut input = flags.to_vec();
        input.extend(option(ClientOption::ExportName(WireString::default())));
        input.extend(b"trailing request bytes");
        let Some(Outcome::Go {
            negotiated,
            leftover,
        }) = m.receive(&input).unwrap()
        else {
            panic!("expected Go");
        };
        assert_eq!(leftover, b"trailing request bytes");
        let out = m.take_output();
        assert_eq!(out.len(), len);
        assert_eq!(Reader::new(&out).u64().unwrap(), 1 << 20);
        assert_eq!(negotiated.name, "disk");
    }
}

#[test]
fn zero_length_option_needs_no_more_input() {
    let set = exports();
    let mut m = machine(&set);
    let mut input = FLAGS_FIXED.to_vec();
    input.extend(option(ClientOption::List));
    assert!(m.receive(&input).unwrap().is_none());
    let kinds: Vec<u32> = replies(&m.take_output()).iter().map(|r| r.1).collect();
    assert_eq!(kinds, vec![2, 1]); // SERVER, ACK
}

#[test]
fn oversized_option_is_skipped_and_answered_too_big() {
    let set = exports();
    let config = HandshakeConfig {
        max_option_bytes: 100,
        ..HandshakeConfig::default()
    };
    let mut m = Handshake::new(set.clone(), config);
    m.take_output();
    let mut input = FLAGS_FIXED.to_vec();
    let header = OptionHeader {
        option: OptionType::Go,
        length: 1000,
    };
    header.encode(&mut input);
    input.extend(vec![0xaa; 1000]);
    input.extend(option(ClientOption::List));
    // Feed in pieces so the skip spans several calls.
    for piece in input.chunks(77) {
        assert!(m.receive(piece).unwrap().is_none());
    }
    let parsed = replies(&m.take_output());
    assert_eq!(parsed[0].0, 7);
    assert_eq!(parsed[0].1, u32::from(OptionReplyType::ErrTooBig));
    assert_eq!(parsed.last().unwrap().1, 1);
}

#[test]
fn oversized_export_name_closes() {
    let set = exports();
    let mut m = machine(&set);
    let mut input = FLAGS_FIXED.to_vec();
    OptionHeader {
        option: OptionType::ExportName,
        length: 4097,
    }
    .encode(&mut input);
    assert_eq!(
        m.receive(&input).unwrap_err(),
        HandshakeError::ExportNameTooLong(4097)
    );
}

#[test]
fn bad_option_magic_closes_and_sticks() {
    let set = exports();
    let mut m = machine(&set);
    let mut input = FLAGS_FIXED.to_vec();
    input.extend(b"IHAVEOPZ\x00\x00\x00\x03\x00\x00\x00\x00");
    let err = m.receive(&input).unwrap_err();
    assert!(matches!(err, HandshakeError::BadOptionMagic(_)));
    assert_eq!(m.receive(&go("disk")).unwrap_err(), err);
}

#[test]
fn too_many_options_close() {
    let set = exports();
    let config = HandshakeConfig {
        max_options: 3,
        ..HandshakeConfig::default()
    };
    let mut m = Handshake::new(set.clone(), config);
    let mut input = FLAGS_FIXED.to_vec();
    for _ in 0..4 {
        input.extend(option(ClientOption::StartTls));
    }
    assert_eq!(
        m.receive(&input).unwrap_err(),
        HandshakeError::TooManyOptions(4)
    );
}

#[test]
fn abort_is_acknowledged() {
    let set = exports();
    let mut m = machine(&set);
    let mut input = FLAGS_FIXED.to_vec();
    input.extend(option(ClientOption::Abort));
    assert!(matches!(m.receive(&input).unwrap(), Some(Outcome::Abort)));
    assert_eq!(replies(&m.take_output()), vec![(2, 1, vec![])]);
}

#[test]
fn failed_go_lets_the_client_continue() {
    let set = exports();
    let mut m = machine(&set);
    let mut input = FLAGS_FIXED.to_vec();
    input.extend(go("missing"));
    assert!(m.receive(&input).unwrap().is_none());
    assert_eq!(
        replies(&m.take_output())[0].1,
        u32::from(OptionReplyType::ErrUnknown)
    );
    let outcome = m.receive(&go("disk")).unwrap();
    assert!(matches!(outcome, Some(Outcome::Go { .. })));
    assert_eq!(set.connections("disk"), 1);
    drop(outcome);
    assert_eq!(set.connections("disk"), 0);
}
