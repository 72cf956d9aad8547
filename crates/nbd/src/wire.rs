//! Wire constants of the NBD protocol: magics, open enums for every code space, flag sets, and
//! the bounded string type the protocol uses for names and messages.
//!
//! Every multi-byte field on the NBD wire is big-endian (network order). Reading and writing go
//! through [`bytes::Buf`] / [`bytes::BufMut`] (`get_u32`, `put_u32`, ...), which are big-endian,
//! so no host-order integer conversion appears anywhere in this crate.
//!
//! Code spaces are *open*: a value this crate does not know decodes to `Unknown(raw)` and is
//! answered with a protocol error, never a panic.

use std::fmt;

use bytes::Buf;

/// `NBDMAGIC`, the first 8 bytes the server sends.
pub const NBD_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: sent by the server after [`NBD_MAGIC`], and by the client before every option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Magic of every fixed-newstyle option reply.
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// `NBD_REQUEST_MAGIC`, first field of every transmission request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// `NBD_SIMPLE_REPLY_MAGIC`.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// `NBD_STRUCTURED_REPLY_MAGIC`.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Length of the server greeting: `NBDMAGIC`, `IHAVEOPT`, 16-bit handshake flags.
pub const GREETING_LEN: usize = 18;
/// Length of the client flags field.
pub const CLIENT_FLAGS_LEN: usize = 4;
/// Length of an option header: magic (8), option (4), data length (4).
pub const OPTION_HEADER_LEN: usize = 16;
/// Length of an option reply header: magic (8), option (4), reply type (4), length (4).
pub const OPTION_REPLY_HEADER_LEN: usize = 20;
/// Length of a transmission request header.
pub const REQUEST_HEADER_LEN: usize = 28;
/// Length of a simple reply header.
pub const SIMPLE_REPLY_HEADER_LEN: usize = 16;
/// Length of a structured reply chunk header.
pub const STRUCTURED_REPLY_HEADER_LEN: usize = 20;
/// Zero padding after the `NBD_OPT_EXPORT_NAME` reply unless `NO_ZEROES` was negotiated.
pub const EXPORT_NAME_PADDING_LEN: usize = 124;
/// Longest string (export name, query, message) the protocol allows, in bytes.
pub const MAX_STRING_LEN: usize = 4096;

const _: () = assert!(GREETING_LEN == 8 + 8 + 2);
const _: () = assert!(OPTION_HEADER_LEN == 8 + 4 + 4);
const _: () = assert!(OPTION_REPLY_HEADER_LEN == 8 + 4 + 4 + 4);
const _: () = assert!(REQUEST_HEADER_LEN == 4 + 2 + 2 + 8 + 8 + 4);
const _: () = assert!(SIMPLE_REPLY_HEADER_LEN == 4 + 4 + 8);
const _: () = assert!(STRUCTURED_REPLY_HEADER_LEN == 4 + 2 + 2 + 8 + 4);

/// Declares an open wire enum: known codes get a variant, anything else is `Unknown(raw)`.
macro_rules! open_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident: $repr:ty {
            $( $(#[$vmeta:meta])* $variant:ident = $value:expr, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $(
                $(#[$vmeta])*
                #[doc = concat!("Wire value `", stringify!($value), "`.")]
                $variant,
            )+
            /// A code this implementation does not know.
            Unknown($repr),
        }

        impl From<$repr> for $name {
            fn from(raw: $repr) -> Self {
                match raw {
                    $( x if x == $value => Self::$variant, )+
                    x => Self::Unknown(x),
                }
            }
        }

        impl From<$name> for $repr {
            fn from(value: $name) -> $repr {
                match value {
                    $( $name::$variant => $value, )+
                    $name::Unknown(x) => x,
                }
            }
        }
    };
}

open_enum! {
    /// Option codes sent by the client during option haggling (`NBD_OPT_*`).
    pub enum OptionType: u32 {
        ExportName = 1,
        Abort = 2,
        List = 3,
        /// Withdrawn experimental extension; answered with `NBD_REP_ERR_UNSUP`.
        PeekExport = 4,
        StartTls = 5,
        Info = 6,
        Go = 7,
        StructuredReply = 8,
        ListMetaContext = 9,
        SetMetaContext = 10,
        /// Experimental extension this server does not implement.
        ExtendedHeaders = 11,
    }
}

open_enum! {
    /// Option reply types (`NBD_REP_*`); errors have bit 31 set.
    pub enum OptionReplyType: u32 {
        Ack = 1,
        Server = 2,
        Info = 3,
        MetaContext = 4,
        ErrUnsup = 0x8000_0001,
        ErrPolicy = 0x8000_0002,
        ErrInvalid = 0x8000_0003,
        ErrPlatform = 0x8000_0004,
        ErrTlsReqd = 0x8000_0005,
        ErrUnknown = 0x8000_0006,
        ErrShutdown = 0x8000_0007,
        ErrBlockSizeReqd = 0x8000_0008,
        ErrTooBig = 0x8000_0009,
        ErrExtHeaderReqd = 0x8000_000a,
    }
}

impl OptionReplyType {
    /// Whether this reply type is an error (bit 31 set).
    pub fn is_error(self) -> bool {
        u32::from(self) & 0x8000_0000 != 0
    }
}

open_enum! {
    /// Information types of `NBD_OPT_INFO` / `NBD_OPT_GO` (`NBD_INFO_*`).
    pub enum InfoType: u16 {
        Export = 0,
        Name = 1,
        Description = 2,
        BlockSize = 3,
    }
}

open_enum! {
    /// Transmission-phase command types (`NBD_CMD_*`).
    pub enum CommandType: u16 {
        Read = 0,
        Write = 1,
        Disc = 2,
        Flush = 3,
        Trim = 4,
        Cache = 5,
        WriteZeroes = 6,
        BlockStatus = 7,
        /// Experimental extension this server does not implement.
        Resize = 8,
    }
}

open_enum! {
    /// Error values of simple replies and error chunks (`NBD_E*`).
    pub enum ErrorCode: u32 {
        Perm = 1,
        Io = 5,
        NoMem = 12,
        Inval = 22,
        NoSpc = 28,
        Overflow = 75,
        NotSup = 95,
        Shutdown = 108,
    }
}

open_enum! {
    /// Structured reply chunk types (`NBD_REPLY_TYPE_*`); error chunks have bit 15 set.
    pub enum ReplyChunkType: u16 {
        None = 0,
        OffsetData = 1,
        OffsetHole = 2,
        BlockStatus = 5,
        /// Experimental extended-headers chunk; never sent by this server.
        BlockStatusExt = 6,
        Error = 0x8001,
        ErrorOffset = 0x8002,
    }
}

/// Declares a flag-set newtype over an unsigned integer with named bits.
macro_rules! flag_set {
    (
        $(#[$meta:meta])*
        pub struct $name:ident($repr:ty) {
            $( $(#[$fmeta:meta])* const $flag:ident = $value:expr; )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub struct $name(pub $repr);

        impl $name {
            $(
                $(#[$fmeta])*
                #[doc = concat!("Bit `", stringify!($value), "`.")]
                pub const $flag: Self = Self($value);
            )+
            /// Every bit this implementation knows.
            pub const KNOWN: Self = Self(0 $( | $value )+);
            /// No bits set.
            pub const EMPTY: Self = Self(0);

            /// Whether every bit of `other` is set in `self`.
            pub fn contains(self, other: Self) -> bool {
                self.0 & other.0 == other.0
            }

            /// The bits of `self` outside `allowed`.
            pub fn without(self, allowed: Self) -> Self {
                Self(self.0 & !allowed.0)
            }

            /// Whether no bit is set.
            pub fn is_empty(self) -> bool {
                self.0 == 0
            }
        }

        impl std::ops::BitOr for $name {
            type Output = Self;
            fn bitor(self, rhs: Self) -> Self {
                Self(self.0 | rhs.0)
            }
        }

        impl std::ops::BitOrAssign for $name {
            fn bitor_assign(&mut self, rhs: Self) {
                self.0 |= rhs.0;
            }
        }
    };
}

flag_set! {
    /// Handshake flags sent by the server in the greeting (`NBD_FLAG_*`, 16 bits).
    pub struct HandshakeFlags(u16) {
        const FIXED_NEWSTYLE = 1 << 0;
        const NO_ZEROES = 1 << 1;
    }
}

flag_set! {
    /// Client flags sent in reply to the greeting (`NBD_FLAG_C_*`, 32 bits).
    pub struct ClientFlags(u32) {
        const FIXED_NEWSTYLE = 1 << 0;
        const NO_ZEROES = 1 << 1;
    }
}

flag_set! {
    /// Transmission flags describing an export (`NBD_FLAG_*`, 16 bits).
    pub struct TransmissionFlags(u16) {
        const HAS_FLAGS = 1 << 0;
        const READ_ONLY = 1 << 1;
        const SEND_FLUSH = 1 << 2;
        const SEND_FUA = 1 << 3;
        const ROTATIONAL = 1 << 4;
        const SEND_TRIM = 1 << 5;
        const SEND_WRITE_ZEROES = 1 << 6;
        const SEND_DF = 1 << 7;
        const CAN_MULTI_CONN = 1 << 8;
        const SEND_RESIZE = 1 << 9;
        const SEND_CACHE = 1 << 10;
        const SEND_FAST_ZERO = 1 << 11;
    }
}

flag_set! {
    /// Per-request command flags (`NBD_CMD_FLAG_*`, 16 bits).
    pub struct CommandFlags(u16) {
        const FUA = 1 << 0;
        const NO_HOLE = 1 << 1;
        const DF = 1 << 2;
        const REQ_ONE = 1 << 3;
        const FAST_ZERO = 1 << 4;
        const PAYLOAD_LEN = 1 << 5;
    }
}

flag_set! {
    /// Structured reply chunk flags (`NBD_REPLY_FLAG_*`, 16 bits).
    pub struct ReplyFlags(u16) {
        const DONE = 1 << 0;
    }
}

flag_set! {
    /// Extent status flags of the `base:allocation` context (`NBD_STATE_*`, 32 bits).
    pub struct AllocationState(u32) {
        const HOLE = 1 << 0;
        const ZERO = 1 << 1;
    }
}

/// Why bytes are not a valid NBD string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum StringError {
    /// Longer than [`MAX_STRING_LEN`].
    #[error("string of {0} bytes exceeds the 4096-byte limit")]
    TooLong(usize),
    /// Not UTF-8.
    #[error("string is not valid UTF-8")]
    NotUtf8,
    /// Contains a NUL character, which the protocol forbids.
    #[error("string contains NUL")]
    Nul,
}

/// A protocol string: UTF-8, no NUL, at most [`MAX_STRING_LEN`] bytes.
///
/// Holding one proves the bound, so encoders can write its length without checks.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct WireString(String);

impl WireString {
    /// Parses wire bytes.
    pub fn parse(bytes: &[u8]) -> Result<Self, StringError> {
        if bytes.len() > MAX_STRING_LEN {
            return Err(StringError::TooLong(bytes.len()));
        }
        let text = std::str::from_utf8(bytes).map_err(|_| StringError::NotUtf8)?;
        Self::new(text.to_owned())
    }

    /// Validates an owned string.
    pub fn new(text: String) -> Result<Self, StringError> {
        if text.len() > MAX_STRING_LEN {
            return Err(StringError::TooLong(text.len()));
        }
        if text.contains('\0') {
            return Err(StringError::Nul);
        }
        Ok(Self(text))
    }

    /// Makes a wire string out of arbitrary text for display purposes (descriptions, error
    /// messages): NULs are dropped and the text is cut at a character boundary to fit.
    pub fn lossy(text: &str) -> Self {
        let mut out: String = text.chars().filter(|c| *c != '\0').collect();
        if out.len() > MAX_STRING_LEN {
            let mut cut = MAX_STRING_LEN;
            while !out.is_char_boundary(cut) {
                cut -= 1;
            }
            out.truncate(cut);
        }
        Self(out)
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Length in bytes, at most [`MAX_STRING_LEN`].
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the string is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Length in bytes as a `u32` wire field.
    pub fn len_u32(&self) -> u32 {
        // The bound is an invariant of the type, so this never saturates.
        u32::try_from(self.0.len()).unwrap_or(u32::MAX)
    }

    /// Length in bytes as a `u16` wire field (error chunk messages).
    pub fn len_u16(&self) -> u16 {
        u16::try_from(self.0.len()).unwrap_or(u16::MAX)
    }

    /// Consumes the wrapper.
    pub fn into_string(self) -> String {
        self.0
    }
}

impl fmt::Display for WireString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Input ran out before a fixed-size field was complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("truncated: needed {needed} more bytes, {available} available")]
pub struct Truncated {
    /// Bytes the field needed.
    pub needed: usize,
    /// Bytes that were left.
    pub available: usize,
}

/// A bounds-checked big-endian cursor over a byte slice.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    /// Starts reading at the beginning of `bytes`.
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { rest: bytes }
    }

    /// Bytes not yet consumed.
    pub fn remaining(&self) -> usize {
        self.rest.len()
    }

    fn need(&self, needed: usize) -> Result<(), Truncated> {
        if self.rest.len() < needed {
            return Err(Truncated {
                needed,
                available: self.rest.len(),
            });
        }
        Ok(())
    }

    /// Reads a big-endian `u16`.
    pub fn u16(&mut self) -> Result<u16, Truncated> {
        self.need(2)?;
        Ok(self.rest.get_u16())
    }

    /// Reads a big-endian `u32`.
    pub fn u32(&mut self) -> Result<u32, Truncated> {
        self.need(4)?;
        Ok(self.rest.get_u32())
    }

    /// Reads a big-endian `u64`.
    pub fn u64(&mut self) -> Result<u64, Truncated> {
        self.need(8)?;
        Ok(self.rest.get_u64())
    }

    /// Takes the next `len` bytes.
    pub fn bytes(&mut self, len: usize) -> Result<&'a [u8], Truncated> {
        self.need(len)?;
        let (head, tail) = self.rest.split_at(len);
        self.rest = tail;
        Ok(head)
    }

    /// Takes everything that is left.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_enums_round_trip_known_and_unknown() {
        assert_eq!(OptionType::from(7), OptionType::Go);
        assert_eq!(u32::from(OptionType::Go), 7);
        assert_eq!(OptionType::from(99), OptionType::Unknown(99));
        assert_eq!(u32::from(OptionType::Unknown(99)), 99);
        assert_eq!(CommandType::from(0xffff), CommandType::Unknown(0xffff));
        assert_eq!(u32::from(OptionReplyType::ErrTooBig), 0x8000_0009);
        assert!(OptionReplyType::ErrUnsup.is_error());
        assert!(!OptionReplyType::Ack.is_error());
        assert_eq!(u16::from(ReplyChunkType::ErrorOffset), 0x8002);
        assert_eq!(u32::from(ErrorCode::Shutdown), 108);
    }

    #[test]
    fn magics_spell_their_ascii_names() {
        use bytes::BufMut;
        let mut out = Vec::new();
        out.put_u64(NBD_MAGIC);
        out.put_u64(IHAVEOPT);
        assert_eq!(out, b"NBDMAGICIHAVEOPT");
    }

    #[test]
    fn flag_sets() {
        let f = TransmissionFlags::HAS_FLAGS | TransmissionFlags::SEND_FLUSH;
        assert_eq!(f.0, 0b101);
        assert!(f.contains(TransmissionFlags::SEND_FLUSH));
        assert!(!f.contains(TransmissionFlags::READ_ONLY));
        assert_eq!(
            ClientFlags(0b111).without(ClientFlags::KNOWN),
            ClientFlags(0b100)
        );
        assert_eq!(CommandFlags::KNOWN.0, 0b11_1111);
    }

    #[test]
    fn wire_strings_enforce_the_rules() {
        assert_eq!(
            WireString::parse(b"disk0").map(|s| s.into_string()),
            Ok("disk0".into())
        );
        assert_eq!(WireString::parse(&[0xff]), Err(StringError::NotUtf8));
        assert_eq!(WireString::parse(b"a\0b"), Err(StringError::Nul));
        assert_eq!(
            WireString::parse(&[b'a'; 4097]),
            Err(StringError::TooLong(4097))
        );
        assert!(WireString::parse(&[b'a'; 4096]).is_ok());
        let long = "é".repeat(3000);
        let cut = WireString::lossy(&long);
        assert_eq!(cut.len(), MAX_STRING_LEN);
        assert!(cut.as_str().chars().all(|c| c == 'é'));
        assert_eq!(WireString::lossy("a\0b").as_str(), "ab");
    }

    #[test]
    fn reader_is_bounds_checked() {
        let mut r = Reader::new(&[0, 1, 0, 0, 0, 2, 9]);
        assert_eq!(r.u16(), Ok(1));
        assert_eq!(r.u32(), Ok(2));
        assert_eq!(
            r.u64(),
            Err(Truncated {
                needed: 8,
                available: 1
            })
        );
        assert_eq!(r.bytes(1), Ok(&[9u8][..]));
        assert_eq!(r.remaining(), 0);
    }
}
