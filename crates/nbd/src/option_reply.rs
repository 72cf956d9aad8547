//! Server replies during option haggling.
//!
//! ```text
//! option reply (20-byte header)       NBD_REP_INFO data
//! +0  u64 0x0003e889045565a9          +0 u16 NBD_INFO_* type, then per type:
//! +8  u32 option being answered          EXPORT (0):     u64 size, u16 transmission flags
//! +12 u32 NBD_REP_* reply type           NAME (1):       name bytes
//! +16 u32 data length                    DESCRIPTION (2): text bytes
//! +20 data                               BLOCK_SIZE (3): u32 min, u32 preferred, u32 max payload
//!
//! NBD_REP_SERVER data: u32 name length, name, optional human-readable details
//! NBD_REP_META_CONTEXT data: u32 context id, context name
//! NBD_REP_ERR_* data: optional human-readable message
//!
//! NBD_OPT_EXPORT_NAME reply (no header): u64 size, u16 transmission flags, 124 zero bytes
//!   unless the client set NBD_FLAG_C_NO_ZEROES
//! ```

use bytes::BufMut;

use crate::wire::{
    InfoType, OptionReplyType, OptionType, TransmissionFlags, WireString, EXPORT_NAME_PADDING_LEN,
    OPTION_REPLY_MAGIC,
};

/// One `NBD_REP_INFO` item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InfoReply {
    /// `NBD_INFO_EXPORT`: size and transmission flags.
    Export {
        /// Export size in bytes.
        size_bytes: u64,
        /// Transmission flags.
        flags: TransmissionFlags,
    },
    /// `NBD_INFO_NAME`: the canonical export name.
    Name(WireString),
    /// `NBD_INFO_DESCRIPTION`.
    Description(WireString),
    /// `NBD_INFO_BLOCK_SIZE`.
    BlockSize {
        /// Minimum block size.
        min: u32,
        /// Preferred block size.
        preferred: u32,
        /// Maximum payload size.
        max_payload: u32,
    },
}

impl InfoReply {
    fn info_type(&self) -> InfoType {
        match self {
            Self::Export { .. } => InfoType::Export,
            Self::Name(_) => InfoType::Name,
            Self::Description(_) => InfoType::Description,
            Self::BlockSize { .. } => InfoType::BlockSize,
        }
    }

    fn encode_data(&self, out: &mut Vec<u8>) {
        out.put_u16(self.info_type().into());
        match self {
            Self::Export { size_bytes, flags } => {
                out.put_u64(*size_bytes);
                out.put_u16(flags.0);
            }
            Self::Name(text) | Self::Description(text) => out.put_slice(text.as_str().as_bytes()),
            Self::BlockSize {
                min,
                preferred,
                max_payload,
            } => {
                out.put_u32(*min);
                out.put_u32(*preferred);
                out.put_u32(*max_payload);
            }
        }
    }
}

/// The body of an option reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OptionReplyBody {
    /// `NBD_REP_ACK`.
    Ack,
    /// `NBD_REP_SERVER`: one export of an `NBD_OPT_LIST`.
    Server {
        /// Export name.
        name: WireString,
        /// Human-readable details (may be empty).
        details: WireString,
    },
    /// `NBD_REP_INFO`.
    Info(InfoReply),
    /// `NBD_REP_META_CONTEXT`.
    MetaContext {
        /// Context id (0 in replies to `NBD_OPT_LIST_META_CONTEXT`).
        id: u32,
        /// Context name, e.g. `base:allocation`.
        name: WireString,
    },
    /// An error reply (`kind` must have bit 31 set) with an optional message.
    Error {
        /// The `NBD_REP_ERR_*` code.
        kind: OptionReplyType,
        /// Message for a human; may be empty.
        message: WireString,
    },
}

/// A complete option reply: which option it answers and what it says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionReply {
    /// The option being answered.
    pub option: OptionType,
    /// The reply.
    pub body: OptionReplyBody,
}

impl OptionReply {
    /// `NBD_REP_ACK` for `option`.
    pub fn ack(option: OptionType) -> Self {
        Self {
            option,
            body: OptionReplyBody::Ack,
        }
    }

    /// An error reply for `option`.
    pub fn error(option: OptionType, kind: OptionReplyType, message: &str) -> Self {
        let message = WireString::lossy(message);
        Self {
            option,
            body: OptionReplyBody::Error { kind, message },
        }
    }

    /// `NBD_REP_INFO` for `option`.
    pub fn info(option: OptionType, info: InfoReply) -> Self {
        Self {
            option,
            body: OptionReplyBody::Info(info),
        }
    }

    /// The reply type code.
    pub fn reply_type(&self) -> OptionReplyType {
        match &self.body {
            OptionReplyBody::Ack => OptionReplyType::Ack,
            OptionReplyBody::Server { .. } => OptionReplyType::Server,
            OptionReplyBody::Info(_) => OptionReplyType::Info,
            OptionReplyBody::MetaContext { .. } => OptionReplyType::MetaContext,
            OptionReplyBody::Error { kind, .. } => *kind,
        }
    }

    /// Whether this reply ends the answer to its option (anything but SERVER/INFO/META_CONTEXT).
    pub fn is_final(&self) -> bool {
        matches!(
            self.body,
            OptionReplyBody::Ack | OptionReplyBody::Error { .. }
        )
    }

    /// Appends the encoded reply to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut data = Vec::new();
        self.encode_data(&mut data);
        out.put_u64(OPTION_REPLY_MAGIC);
        out.put_u32(self.option.into());
        out.put_u32(self.reply_type().into());
        // Every body is bounded by a few strings of at most 4096 bytes.
        out.put_u32(u32::try_from(data.len()).unwrap_or(u32::MAX));
        out.put_slice(&data);
    }

    fn encode_data(&self, out: &mut Vec<u8>) {
        match &self.body {
            OptionReplyBody::Ack => {}
            OptionReplyBody::Server { name, details } => {
                out.put_u32(name.len_u32());
                out.put_slice(name.as_str().as_bytes());
                out.put_slice(details.as_str().as_bytes());
            }
            OptionReplyBody::Info(info) => info.encode_data(out),
            OptionReplyBody::MetaContext { id, name } => {
                out.put_u32(*id);
                out.put_slice(name.as_str().as_bytes());
            }
            OptionReplyBody::Error { message, .. } => out.put_slice(message.as_str().as_bytes()),
        }
    }
}

/// Encodes the reply to `NBD_OPT_EXPORT_NAME`: size, flags, and the zero padding unless the
/// client negotiated `NBD_FLAG_C_NO_ZEROES`.
pub fn encode_export_name_reply(
    size_bytes: u64,
    flags: TransmissionFlags,
    no_zeroes: bool,
    out: &mut Vec<u8>,
) {
    out.put_u64(size_bytes);
    out.put_u16(flags.0);
    if !no_zeroes {
        out.put_bytes(0, EXPORT_NAME_PADDING_LEN);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const HDR: &[u8] = b"\x00\x03\xe8\x89\x04\x55\x65\xa9";

    fn encoded(reply: &OptionReply) -> Vec<u8> {
        let mut out = Vec::new();
        reply.encode(&mut out);
        out
    }

    fn ws(s: &str) -> WireString {
        WireString::parse(s.as_bytes()).unwrap()
    }

    #[test]
    fn ack_golden_bytes() {
        let out = encoded(&OptionReply::ack(OptionType::StructuredReply));
        let mut expect = HDR.to_vec();
        expect.extend_from_slice(b"\x00\x00\x00\x08\x00\x00\x00\x01\x00\x00\x00\x00");
        assert_eq!(out, expect);
    }

    #[test]
    fn info_export_golden_bytes() {
        let info = InfoReply::Export {
            size_bytes: 0x1_0000_0000,
            flags: TransmissionFlags::HAS_FLAGS | TransmissionFlags::SEND_FLUSH,
        };
        let out = encoded(&OptionReply::info(OptionType::Go, info));
        let mut expect = HDR.to_vec();
        expect.extend_from_slice(b"\x00\x00\x00\x07\x00\x00\x00\x03\x00\x00\x00\x0c");
        expect.extend_from_slice(b"\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x05");
        assert_eq!(out, expect);
    }

    #[test]
    fn info_block_size_golden_bytes() {
        let info = InfoReply::BlockSize {
            min: 512,
            preferred: 4096,
            max_payload: 1 << 25,
        };
        let out = encoded(&OptionReply::info(OptionType::Info, info));
        assert_eq!(
            &out[8..20],
            b"\x00\x00\x00\x06\x00\x00\x00\x03\x00\x00\x00\x0e"
        );
        assert_eq!(
            &out[20..],
            b"\x00\x03\x00\x00\x02\x00\x00\x00\x10\x00\x02\x00\x00\x00"
        );
    }

    #[test]
    fn info_name_and_description() {
        let out = encoded(&OptionReply::info(
            OptionType::Go,
            InfoReply::Name(ws("vol")),
        ));
        assert_eq!(&out[16..], b"\x00\x00\x00\x05\x00\x01vol");
        let desc = InfoReply::Description(ws("hi"));
        let out = encoded(&OptionReply::info(OptionType::Go, desc));
        assert_eq!(&out[16..], b"\x00\x00\x00\x04\x00\x02hi");
    }

    #[test]
    fn server_golden_bytes() {
        let reply = OptionReply {
            option: OptionType::List,
            body: OptionReplyBody::Server {
                name: ws("a"),
                details: ws("desc"),
            },
        };
        let out = encoded(&reply);
        assert_eq!(
            &out[8..20],
            b"\x00\x00\x00\x03\x00\x00\x00\x02\x00\x00\x00\x09"
        );
        assert_eq!(&out[20..], b"\x00\x00\x00\x01adesc");
        assert!(!reply.is_final());
    }

    #[test]
    fn meta_context_golden_bytes() {
        let reply = OptionReply {
            option: OptionType::SetMetaContext,
            body: OptionReplyBody::MetaContext {
                id: 1,
                name: ws("base:allocation"),
            },
        };
        let out = encoded(&reply);
        assert_eq!(
            &out[8..20],
            b"\x00\x00\x00\x0a\x00\x00\x00\x04\x00\x00\x00\x13"
        );
        assert_eq!(&out[20..], b"\x00\x00\x00\x01base:allocation");
    }

    #[test]
    fn error_golden_bytes() {
        let reply = OptionReply::error(OptionType::StartTls, OptionReplyType::ErrPolicy, "no");
        let out = encoded(&reply);
        assert_eq!(
            &out[8..],
            b"\x00\x00\x00\x05\x80\x00\x00\x02\x00\x00\x00\x02no"
        );
        assert!(reply.is_final());
        let unsup = OptionReply::error(OptionType::Unknown(42), OptionReplyType::ErrUnsup, "");
        assert_eq!(
            &encoded(&unsup)[8..],
            b"\x00\x00\x00\x2a\x80\x00\x00\x01\x00\x00\x00\x00"
        );
    }

    #[test]
    fn export_name_reply_padding() {
        let mut out = Vec::new();
        encode_export_name_reply(1024, TransmissionFlags::HAS_FLAGS, false, &mut out);
        assert_eq!(out.len(), 8 + 2 + 124);
        assert_eq!(&out[..10], b"\x00\x00\x00\x00\x00\x00\x04\x00\x00\x01");
        assert!(out[10..].iter().all(|b| *b == 0));
        out.clear();
        encode_export_name_reply(1024, TransmissionFlags::HAS_FLAGS, true, &mut out);
        assert_eq!(out.len(), 10);
    }
}
