#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use crate::memory::{MemoryExport, MemoryExports};

fn ws(s: &str) -> WireString {
    WireString::parse(s.as_bytes()).unwrap()
}

fn exports() -> Arc<MemoryExports> {
    let set = Arc::new(MemoryExports::new());
    set.add(Arc::new(MemoryExport::new("disk", 1 << 20)));
    set.add(Arc::new(MemoryExport::new("other", 4096)));
    set
}

fn negotiation(set: &Arc<MemoryExports>) -> Negotiation {
    Negotiation::new(set.clone(), NegotiationConfig::default())
}

fn go(name: &str, requests: Vec<InfoType>) -> ClientOption {
    ClientOption::Go(InfoRequest {
        name: ws(name),
        requests,
    })
}

fn types(replies: &[OptionReply]) -> Vec<OptionReplyType> {
    replies.iter().map(OptionReply::reply_type).collect()
}

fn continued(step: Step) -> Vec<OptionReply> {
    match step {
        Step::Continue(replies) => replies,
        other => panic!("expected Continue, got {other:?}"),
    }
}

#[test]
fn go_on_default_export_reports_info_and_registers_the_connection() {
    let set = exports();
    let mut n = negotiation(&set);
    let wanted = vec![InfoType::Name, InfoType::Description, InfoType::BlockSize];
    let Step::Go(replies, negotiated) = n.handle_option(go("", wanted)) else {
        panic!("expected Go");
    };
    let flags = TransmissionFlags::HAS_FLAGS
        | TransmissionFlags::SEND_FLUSH
        | TransmissionFlags::SEND_FUA
        | TransmissionFlags::SEND_TRIM
        | TransmissionFlags::SEND_WRITE_ZEROES
        | TransmissionFlags::CAN_MULTI_CONN;
    let expect = vec![
        OptionReply::info(
            OptionType::Go,
            InfoReply::Export {
                size_bytes: 1 << 20,
                flags,
            },
        ),
        OptionReply::info(OptionType::Go, InfoReply::Name(ws("disk"))),
        OptionReply::info(
            OptionType::Go,
            InfoReply::Description(ws("in-memory export disk")),
        ),
        OptionReply::info(
            OptionType::Go,
            InfoReply::BlockSize {
                min: 512,
                preferred: 4096,
                max_payload: 32 << 20,
            },
        ),
        OptionReply::ack(OptionType::Go),
    ];
    assert_eq!(replies, expect);
    assert_eq!(negotiated.name, "disk");
    assert!(negotiated.block_size_negotiated);
    assert!(!negotiated.structured);
    assert_eq!(negotiated.base_allocation, None);
    assert_eq!(set.connections("disk"), 1);
    drop(negotiated);
    assert_eq!(set.connections("disk"), 0);
}

#[test]
fn info_does_not_end_negotiation_and_always_sends_export_and_block_size() {
    let set = exports();
    let mut n = negotiation(&set);
    let replies = continued(n.handle_option(ClientOption::Info(InfoRequest {
        name: ws("other"),
        requests: vec![],
    })));
    assert_eq!(
        types(&replies),
        vec![
            OptionReplyType::Info,
            OptionReplyType::Info,
            OptionReplyType::Ack
        ]
    );
    assert_eq!(set.connections("other"), 0);
}

#[test]
fn unknown_export_is_err_unknown_for_go_and_close_for_export_name() {
    let set = exports();
    let mut n = negotiation(&set);
    let replies = continued(n.handle_option(go("nope", vec![])));
    assert_eq!(types(&replies), vec![OptionReplyType::ErrUnknown]);
    let step = n.handle_option(ClientOption::ExportName(ws("nope")));
    assert!(matches!(step, Step::Close(HandshakeError::UnknownExport(name)) if name == "nope"));
    set.set_default(None);
    let replies = continued(n.handle_option(go("", vec![])));
    assert_eq!(types(&replies), vec![OptionReplyType::ErrUnknown]);
}

#[test]
fn export_name_enters_transmission_without_block_size_commitment() {
    let set = exports();
    let mut n = negotiation(&set);
    let Step::ExportName(negotiated) = n.handle_option(ClientOption::ExportName(ws("other")))
    else {
        panic!("expected ExportName");
    };
    assert_eq!(negotiated.name, "other");
    assert!(!negotiated.block_size_negotiated);
    assert_eq!(set.connections("other"), 1);
}

#[test]
fn block_size_can_be_required() {
    let set = exports();
    let config = NegotiationConfig {
        require_block_size: true,
    };
    let mut n = Negotiation::new(set.clone(), config);
    let replies = continued(n.handle_option(go("disk", vec![])));
    assert_eq!(
        replies.last().unwrap().reply_type(),
        OptionReplyType::ErrBlockSizeReqd
    );
    // The block size info is sent first, to save the client a round trip.
    assert!(replies
        .iter()
        .any(|r| matches!(r.body, OptionReplyBody::Info(InfoReply::BlockSize { .. }))));
    assert!(matches!(
        n.handle_option(go("disk", vec![InfoType::BlockSize])),
        Step::Go(..)
    ));
    let step = n.handle_option(ClientOption::ExportName(ws("disk")));
    assert!(matches!(
        step,
        Step::Close(HandshakeError::ExportUnusable { .. })
    ));
}

#[test]
fn structured_replies_and_base_allocation() {
    let set = exports();
    let mut n = negotiation(&set);
    let set_meta = |export: &str, queries: &[&str]| {
        ClientOption::SetMetaContext(MetaContextRequest {
            export: ws(export),
            queries: queries.iter().map(|q| ws(q)).collect(),
        })
    };
    // Meta contexts need structured replies first.
    let replies = continued(n.handle_option(set_meta("disk", &[BASE_ALLOCATION])));
    assert_eq!(types(&replies), vec![OptionReplyType::ErrInvalid]);
    let replies = continued(n.handle_option(ClientOption::StructuredReply));
    assert_eq!(types(&replies), vec![OptionReplyType::Ack]);
    let replies =
        continued(n.handle_option(set_meta("disk", &["qemu:dirty-bitmap:x", BASE_ALLOCATION])));
    let context = OptionReplyBody::MetaContext {
        id: BASE_ALLOCATION_ID,
        name: ws(BASE_ALLOCATION),
    };
    assert_eq!(replies[0].body, context);
    assert_eq!(types(&replies)[1], OptionReplyType::Ack);
    // Selected for "disk": GO on the default (= "disk") gets it, with DF advertised.
    let Step::Go(_, negotiated) = n.handle_option(go("", vec![])) else {
        panic!("expected Go")
    };
    assert_eq!(negotiated.base_allocation, Some(BASE_ALLOCATION_ID));
    assert!(negotiated.structured);
    assert!(negotiated.flags.contains(TransmissionFlags::SEND_DF));
    // A different export does not.
    let Step::Go(_, other) = n.handle_option(go("other", vec![])) else {
        panic!("expected Go")
    };
    assert_eq!(other.base_allocation, None);
    // An unknown export clears the selection and fails.
    let replies = continued(n.handle_option(set_meta("nope", &[BASE_ALLOCATION])));
    assert_eq!(types(&replies), vec![OptionReplyType::ErrUnknown]);
    let Step::Go(_, cleared) = n.handle_option(go("disk", vec![])) else {
        panic!("expected Go")
    };
    assert_eq!(cleared.base_allocation, None);
}

#[test]
fn list_meta_context_queries() {
    let set = exports();
    let mut n = negotiation(&set);
    let list = |queries: &[&str]| {
        ClientOption::ListMetaContext(MetaContextRequest {
            export: ws("disk"),
            queries: queries.iter().map(|q| ws(q)).collect(),
        })
    };
    assert_eq!(
        types(&continued(n.handle_option(list(&[])))),
        vec![OptionReplyType::ErrInvalid]
    );
    n.handle_option(ClientOption::StructuredReply);
    for queries in [&[][..], &["base:"][..], &[BASE_ALLOCATION][..]] {
        let replies = continued(n.handle_option(list(queries)));
        let context = OptionReplyBody::MetaContext {
            id: 0,
            name: ws(BASE_ALLOCATION),
        };
        assert_eq!(replies[0].body, context);
        assert_eq!(types(&replies)[1], OptionReplyType::Ack);
    }
    let replies = continued(n.handle_option(list(&["qemu:", "base:nothing"])));
    assert_eq!(types(&replies), vec![OptionReplyType::Ack]);
}

#[test]
fn list_starttls_abort_and_unsupported() {
    let set = exports();
    let mut n = negotiation(&set);
    let replies = continued(n.handle_option(ClientOption::List));
    assert_eq!(
        types(&replies),
        vec![
            OptionReplyType::Server,
            OptionReplyType::Server,
            OptionReplyType::Ack
        ]
    );
    let replies = continued(n.handle_option(ClientOption::StartTls));
    assert_eq!(types(&replies), vec![OptionReplyType::ErrPolicy]);
    let replies =
        continued(n.handle_option(ClientOption::Unsupported(OptionType::ExtendedHeaders)));
    assert_eq!(types(&replies), vec![OptionReplyType::ErrUnsup]);
    assert_eq!(replies[0].option, OptionType::ExtendedHeaders);
    assert!(
        matches!(n.handle_option(ClientOption::Abort), Step::Abort(r) if r.reply_type() == OptionReplyType::Ack)
    );
}

#[test]
fn malformed_option_data() {
    let set = exports();
    let mut n = negotiation(&set);
    let replies = continued(n.handle_raw(OptionType::Go, b"\x00\x00"));
    assert_eq!(types(&replies), vec![OptionReplyType::ErrInvalid]);
    let replies = continued(n.handle_raw(OptionType::List, b"x"));
    assert_eq!(types(&replies), vec![OptionReplyType::ErrInvalid]);
    let step = n.handle_raw(OptionType::ExportName, b"\xff");
    assert!(matches!(
        step,
        Step::Close(HandshakeError::BadExportName(_))
    ));
}

#[test]
fn misconfigured_export_is_refused() {
    let set = exports();
    let mut info = set.get("disk").unwrap().info();
    info.name = "bad".into();
    info.block_size_min = 3;
    set.add(Arc::new(MemoryExport::with_info(info, 4096)));
    let mut n = negotiation(&set);
    let replies = continued(n.handle_option(go("bad", vec![])));
    assert_eq!(types(&replies), vec![OptionReplyType::ErrPolicy]);
    assert_eq!(set.connections("bad"), 0);
}

#[test]
fn block_size_rules() {
    let base = MemoryExport::new("x", 0).info();
    let with = |min, preferred, max_payload| ExportInfo {
        block_size_min: min,
        block_size_preferred: preferred,
        max_payload_bytes: max_payload,
        ..base.clone()
    };
    assert!(BlockSizes::from_info(&with(512, 4096, 1 << 25)).is_ok());
    assert!(BlockSizes::from_info(&with(1, 512, 512)).is_ok());
    assert!(BlockSizes::from_info(&with(0, 4096, 1 << 25)).is_err());
    assert!(BlockSizes::from_info(&with(1 << 17, 1 << 17, 1 << 25)).is_err());
    assert!(BlockSizes::from_info(&with(512, 256, 1 << 25)).is_err());
    assert!(BlockSizes::from_info(&with(4096, 2048, 1 << 25)).is_err());
    assert!(BlockSizes::from_info(&with(512, 4096, 2048)).is_err());
    // Payloads beyond the server's limit are capped, not refused.
    let capped = BlockSizes::from_info(&with(512, 4096, u32::MAX)).unwrap();
    assert_eq!(capped.max_payload(), MAX_PAYLOAD_LIMIT);
    assert!(capped.is_aligned(1024) && !capped.is_aligned(1000));
}

#[test]
fn flags_follow_export_capabilities() {
    let mut info = MemoryExport::new("x", 0).info();
    info.read_only = true;
    info.can_trim = false;
    info.can_write_zeroes = false;
    info.can_multi_conn = false;
    let flags = transmission_flags(&info, false);
    let expect = TransmissionFlags::HAS_FLAGS
        | TransmissionFlags::SEND_FLUSH
        | TransmissionFlags::SEND_FUA
        | TransmissionFlags::READ_ONLY;
    assert_eq!(flags, expect);
    assert_eq!(
        transmission_flags(&info, true),
        expect | TransmissionFlags::SEND_DF
    );
}
