//! Options the client sends during fixed-newstyle option haggling.
//!
//! ```text
//! option header (16 bytes)            NBD_OPT_INFO / NBD_OPT_GO data
//! +0  u64 IHAVEOPT                    +0      u32 name length N (<= data length - 6)
//! +8  u32 option code                 +4      N bytes name
//! +12 u32 data length                 +4+N    u16 info request count M
//! +16 data                            +6+N    M x u16 NBD_INFO_* codes (exactly; no trailing bytes)
//!
//! NBD_OPT_LIST_META_CONTEXT / NBD_OPT_SET_META_CONTEXT data
//! +0  u32 export name length N, N bytes name, u32 query count Q,
//!     Q x (u32 query length L, L bytes query)
//! ```

use bytes::BufMut;

use crate::wire::{
    InfoType, OptionType, Reader, StringError, Truncated, WireString, IHAVEOPT, OPTION_HEADER_LEN,
};

/// The fixed 16-byte header in front of every option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    /// Option code.
    pub option: OptionType,
    /// Length of the option data that follows.
    pub length: u32,
}

/// The option header did not start with `IHAVEOPT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("bad option magic {0:#018x}")]
pub struct BadOptionMagic(pub u64);

impl OptionHeader {
    /// Parses the 16-byte header.
    pub fn parse(bytes: &[u8; OPTION_HEADER_LEN]) -> Result<Self, BadOptionMagic> {
        let mut r = Reader::new(bytes);
        let (magic, option, length) = match (r.u64(), r.u32(), r.u32()) {
            (Ok(m), Ok(o), Ok(l)) => (m, o, l),
            // Unreachable: the array has exactly the header length.
            _ => return Err(BadOptionMagic(0)),
        };
        if magic != IHAVEOPT {
            return Err(BadOptionMagic(magic));
        }
        Ok(Self {
            option: option.into(),
            length,
        })
    }

    /// Appends the header to `out` (client side; used by tests and tools).
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.put_u64(IHAVEOPT);
        out.put_u32(self.option.into());
        out.put_u32(self.length);
    }
}

/// The data of `NBD_OPT_INFO` and `NBD_OPT_GO`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct InfoRequest {
    /// Export name; empty selects the default export.
    pub name: WireString,
    /// Information items the client asked for, in its order.
    pub requests: Vec<InfoType>,
}

/// The data of `NBD_OPT_LIST_META_CONTEXT` and `NBD_OPT_SET_META_CONTEXT`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MetaContextRequest {
    /// Export the contexts are for.
    pub export: WireString,
    /// Query strings, each `namespace:leaf`.
    pub queries: Vec<WireString>,
}

/// A parsed client option.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientOption {
    /// `NBD_OPT_EXPORT_NAME`: enter transmission without a way to report errors.
    ExportName(WireString),
    /// `NBD_OPT_ABORT`.
    Abort,
    /// `NBD_OPT_LIST`.
    List,
    /// `NBD_OPT_STARTTLS`.
    StartTls,
    /// `NBD_OPT_INFO`.
    Info(InfoRequest),
    /// `NBD_OPT_GO`.
    Go(InfoRequest),
    /// `NBD_OPT_STRUCTURED_REPLY`.
    StructuredReply,
    /// `NBD_OPT_LIST_META_CONTEXT`.
    ListMetaContext(MetaContextRequest),
    /// `NBD_OPT_SET_META_CONTEXT`.
    SetMetaContext(MetaContextRequest),
    /// Any option this server does not implement (answered with `NBD_REP_ERR_UNSUP`).
    Unsupported(OptionType),
}

/// Why option data is malformed; answered with `NBD_REP_ERR_INVALID`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionError {
    /// The option takes no data but some was sent.
    #[error("option {option:?} takes no data, got {length} bytes")]
    UnexpectedData {
        /// The option.
        option: OptionType,
        /// Bytes of data sent.
        length: usize,
    },
    /// A length field points past the end of the data.
    #[error("option data truncated: {0}")]
    Truncated(#[from] Truncated),
    /// Bytes were left after the last field.
    #[error("{0} trailing bytes after option data")]
    TrailingBytes(usize),
    /// A name or query is not a valid protocol string.
    #[error("bad string: {0}")]
    BadString(#[from] StringError),
}

impl ClientOption {
    /// Parses the data of option `option`. `data` is exactly the option's data bytes.
    pub fn parse(option: OptionType, data: &[u8]) -> Result<Self, OptionError> {
        match option {
            OptionType::ExportName => Ok(Self::ExportName(WireString::parse(data)?)),
            // The spec asks servers to ignore data sent with NBD_OPT_ABORT.
            OptionType::Abort => Ok(Self::Abort),
            OptionType::List => no_data(option, data, Self::List),
            OptionType::StartTls => no_data(option, data, Self::StartTls),
            OptionType::StructuredReply => no_data(option, data, Self::StructuredReply),
            OptionType::Info => Ok(Self::Info(parse_info_request(data)?)),
            OptionType::Go => Ok(Self::Go(parse_info_request(data)?)),
            OptionType::ListMetaContext => Ok(Self::ListMetaContext(parse_meta_request(data)?)),
            OptionType::SetMetaContext => Ok(Self::SetMetaContext(parse_meta_request(data)?)),
            other => Ok(Self::Unsupported(other)),
        }
    }

    /// The option code this option is sent with.
    pub fn option_type(&self) -> OptionType {
        match self {
            Self::ExportName(_) => OptionType::ExportName,
            Self::Abort => OptionType::Abort,
            Self::List => OptionType::List,
            Self::StartTls => OptionType::StartTls,
            Self::Info(_) => OptionType::Info,
            Self::Go(_) => OptionType::Go,
            Self::StructuredReply => OptionType::StructuredReply,
            Self::ListMetaContext(_) => OptionType::ListMetaContext,
            Self::SetMetaContext(_) => OptionType::SetMetaContext,
            Self::Unsupported(option) => *option,
        }
    }

    /// Appends header and data to `out` (client side; used by tests and tools).
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut data = Vec::new();
        match self {
            Self::ExportName(name) => data.put_slice(name.as_str().as_bytes()),
            Self::Info(req) | Self::Go(req) => encode_info_request(req, &mut data),
            Self::ListMetaContext(req) | Self::SetMetaContext(req) => {
                encode_meta_request(req, &mut data)
            }
            Self::Abort | Self::List | Self::StartTls | Self::StructuredReply => {}
            Self::Unsupported(_) => {}
        }
        let length = u32::try_from(data.len()).unwrap_or(u32::MAX);
        OptionHeader {
            option: self.option_type(),
            length,
        }
        .encode(out);
        out.put_slice(&data);
    }
}

fn no_data(
    option: OptionType,
    data: &[u8],
    parsed: ClientOption,
) -> Result<ClientOption, OptionError> {
    if data.is_empty() {
        Ok(parsed)
    } else {
        Err(OptionError::UnexpectedData {
            option,
            length: data.len(),
        })
    }
}

fn finish(r: &Reader<'_>) -> Result<(), OptionError> {
    match r.remaining() {
        0 => Ok(()),
        n => Err(OptionError::TrailingBytes(n)),
    }
}

/// Reads a `u32`-length-prefixed string.
fn read_string(r: &mut Reader<'_>) -> Result<WireString, OptionError> {
    let len = r.u32()?;
    let len = usize::try_from(len).unwrap_or(usize::MAX);
    Ok(WireString::parse(r.bytes(len)?)?)
}

fn parse_info_request(data: &[u8]) -> Result<InfoRequest, OptionError> {
    let mut r = Reader::new(data);
    let name = read_string(&mut r)?;
    let count = usize::from(r.u16()?);
    // The list must fill the rest exactly; checked before anything is allocated.
    let body = r.bytes(count * 2)?;
    finish(&r)?;
    let mut items = Reader::new(body);
    let mut requests = Vec::with_capacity(count);
    while let Ok(code) = items.u16() {
        requests.push(InfoType::from(code));
    }
    Ok(InfoRequest { name, requests })
}

fn parse_meta_request(data: &[u8]) -> Result<MetaContextRequest, OptionError> {
    let mut r = Reader::new(data);
    let export = read_string(&mut r)?;
    let count = r.u32()?;
    // No preallocation from the declared count: each query consumes at least 4 input bytes,
    // so the vector can only grow with the data actually received.
    let mut queries = Vec::new();
    for _ in 0..count {
        queries.push(read_string(&mut r)?);
    }
    finish(&r)?;
    Ok(MetaContextRequest { export, queries })
}

fn encode_info_request(req: &InfoRequest, out: &mut Vec<u8>) {
    out.put_u32(req.name.len_u32());
    out.put_slice(req.name.as_str().as_bytes());
    out.put_u16(u16::try_from(req.requests.len()).unwrap_or(u16::MAX));
    for item in req.requests.iter().take(usize::from(u16::MAX)) {
        out.put_u16((*item).into());
    }
}

fn encode_meta_request(req: &MetaContextRequest, out: &mut Vec<u8>) {
    out.put_u32(req.export.len_u32());
    out.put_slice(req.export.as_str().as_bytes());
    out.put_u32(u32::try_from(req.queries.len()).unwrap_or(u32::MAX));
    for query in &req.queries {
        out.put_u32(query.len_u32());
        out.put_slice(query.as_str().as_bytes());
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn ws(s: &str) -> WireString {
        WireString::parse(s.as_bytes()).unwrap()
    }

    #[test]
    fn header_golden_bytes() {
        let bytes: [u8; 16] = *b"IHAVEOPT\x00\x00\x00\x07\x00\x00\x00\x0c";
        let h = OptionHeader::parse(&bytes).unwrap();
        assert_eq!(
            h,
            OptionHeader {
                option: OptionType::Go,
                length: 12
            }
        );
        let mut out = Vec::new();
        h.encode(&mut out);
        assert_eq!(out, bytes);
    }

    #[test]
    fn header_rejects_bad_magic() {
        let bytes: [u8; 16] = *b"IHAVEOPX\x00\x00\x00\x07\x00\x00\x00\x0c";
        assert_eq!(
            OptionHeader::parse(&bytes),
            Err(BadOptionMagic(0x4948_4156_454f_5058))
        );
    }

    #[test]
    fn go_golden_bytes() {
        // name "disk" (4), two info requests: NBD_INFO_NAME, NBD_INFO_BLOCK_SIZE.
        let data = b"\x00\x00\x00\x04disk\x00\x02\x00\x01\x00\x03";
        let parsed = ClientOption::parse(OptionType::Go, data).unwrap();
        let expect = ClientOption::Go(InfoRequest {
            name: ws("disk"),
            requests: vec![InfoType::Name, InfoType::BlockSize],
        });
        assert_eq!(parsed, expect);
        let mut out = Vec::new();
        expect.encode(&mut out);
        assert_eq!(&out[..16], b"IHAVEOPT\x00\x00\x00\x07\x00\x00\x00\x0e");
        assert_eq!(&out[16..], data);
    }

    #[test]
    fn info_with_empty_name_and_unknown_item() {
        let data = b"\x00\x00\x00\x00\x00\x01\x12\x34";
        let parsed = ClientOption::parse(OptionType::Info, data).unwrap();
        let expect = InfoRequest {
            name: ws(""),
            requests: vec![InfoType::Unknown(0x1234)],
        };
        assert_eq!(parsed, ClientOption::Info(expect));
    }

    #[test]
    fn info_rejects_bad_lengths() {
        // Name length beyond the data.
        let r = ClientOption::parse(OptionType::Go, b"\x00\x00\x00\x09disk\x00\x00");
        assert!(matches!(r, Err(OptionError::Truncated(_))));
        // Count says 2 items, only one present.
        let r = ClientOption::parse(OptionType::Go, b"\x00\x00\x00\x00\x00\x02\x00\x01");
        assert!(matches!(r, Err(OptionError::Truncated(_))));
        // A trailing byte.
        let r = ClientOption::parse(OptionType::Go, b"\x00\x00\x00\x00\x00\x00\x07");
        assert_eq!(r, Err(OptionError::TrailingBytes(1)));
        // Name length u32::MAX must not overflow or allocate.
        let r = ClientOption::parse(OptionType::Info, b"\xff\xff\xff\xff\x00\x00");
        assert!(matches!(r, Err(OptionError::Truncated(_))));
    }

    #[test]
    fn meta_context_golden_bytes() {
        let data = b"\x00\x00\x00\x01d\x00\x00\x00\x02\x00\x00\x00\x0fbase:allocation\x00\x00\x00\x05base:";
        let parsed = ClientOption::parse(OptionType::SetMetaContext, data).unwrap();
        let expect = ClientOption::SetMetaContext(MetaContextRequest {
            export: ws("d"),
            queries: vec![ws("base:allocation"), ws("base:")],
        });
        assert_eq!(parsed, expect);
        let mut out = Vec::new();
        expect.encode(&mut out);
        assert_eq!(&out[16..], data);
    }

    #[test]
    fn meta_context_huge_count_is_truncation_not_allocation() {
        let data = b"\x00\x00\x00\x00\xff\xff\xff\xff";
        let r = ClientOption::parse(OptionType::ListMetaContext, data);
        assert!(matches!(r, Err(OptionError::Truncated(_))));
    }

    #[test]
    fn no_data_options() {
        assert_eq!(
            ClientOption::parse(OptionType::List, b""),
            Ok(ClientOption::List)
        );
        assert_eq!(
            ClientOption::parse(OptionType::List, b"x"),
            Err(OptionError::UnexpectedData {
                option: OptionType::List,
                length: 1
            })
        );
        assert_eq!(
            ClientOption::parse(OptionType::Abort, b"junk"),
            Ok(ClientOption::Abort)
        );
        assert!(ClientOption::parse(OptionType::StructuredReply, b"x").is_err());
        assert!(ClientOption::parse(OptionType::StartTls, b"x").is_err());
    }

    #[test]
    fn export_name_and_unknown() {
        assert_eq!(
            ClientOption::parse(OptionType::ExportName, b"vol1"),
            Ok(ClientOption::ExportName(ws("vol1")))
        );
        assert!(ClientOption::parse(OptionType::ExportName, &[0xc3]).is_err());
        assert_eq!(
            ClientOption::parse(OptionType::from(0x4242), b"anything"),
            Ok(ClientOption::Unsupported(OptionType::Unknown(0x4242)))
        );
        assert_eq!(
            ClientOption::parse(OptionType::ExtendedHeaders, b""),
            Ok(ClientOption::Unsupported(OptionType::ExtendedHeaders))
        );
    }
}
