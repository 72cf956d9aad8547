//! Transmission-phase replies: simple replies and structured reply chunks.
//!
//! ```text
//! simple reply (16 bytes)             structured chunk (20-byte header)
//! +0  u32 0x67446698                  +0  u32 0x668e33ef
//! +4  u32 error (0 = success)         +4  u16 flags (NBD_REPLY_FLAG_DONE = 1)
//! +8  u64 cookie                      +6  u16 type (NBD_REPLY_TYPE_*)
//! +16 READ data on success            +8  u64 cookie
//!                                     +16 u32 payload length
//! payloads:
//!   OFFSET_DATA  (1):      u64 offset, data
//!   OFFSET_HOLE  (2):      u64 offset, u32 hole size
//!   BLOCK_STATUS (5):      u32 context id, n x (u32 extent length, u32 status flags)
//!   ERROR        (0x8001): u32 error, u16 message length, message
//!   ERROR_OFFSET (0x8002): u32 error, u16 message length, message, u64 offset
//! ```

use bytes::BufMut;

use crate::backend::Allocation;
use crate::wire::{
    AllocationState, ErrorCode, ReplyChunkType, ReplyFlags, WireString, SIMPLE_REPLY_MAGIC,
    STRUCTURED_REPLY_MAGIC,
};

/// Most extents sent in one BLOCK_STATUS chunk (the spec's 2^20 recommendation).
pub const MAX_EXTENTS: usize = 1 << 20;

/// Appends a simple reply header; `error` `None` is success. READ data, if any, follows it.
pub fn encode_simple_reply(cookie: u64, error: Option<ErrorCode>, out: &mut Vec<u8>) {
    out.put_u32(SIMPLE_REPLY_MAGIC);
    out.put_u32(error.map_or(0, u32::from));
    out.put_u64(cookie);
}

/// One extent of a `base:allocation` BLOCK_STATUS reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Length in bytes (non-zero).
    pub length: u32,
    /// `NBD_STATE_*` flags.
    pub flags: AllocationState,
}

/// The `base:allocation` flags of an allocation state.
pub fn allocation_flags(state: Allocation) -> AllocationState {
    match state {
        Allocation::Data => AllocationState::EMPTY,
        Allocation::Hole => AllocationState::HOLE | AllocationState::ZERO,
        Allocation::Zero => AllocationState::ZERO,
    }
}

/// A structured reply chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Chunk<'a> {
    /// `NBD_REPLY_TYPE_NONE`.
    None,
    /// `NBD_REPLY_TYPE_OFFSET_DATA` header: the caller sends `data_len` bytes right after it.
    OffsetData {
        /// Offset of the data.
        offset: u64,
        /// Length of the data that follows.
        data_len: u32,
    },
    /// `NBD_REPLY_TYPE_OFFSET_HOLE`.
    OffsetHole {
        /// Offset of the hole.
        offset: u64,
        /// Size of the hole (non-zero).
        size: u32,
    },
    /// `NBD_REPLY_TYPE_BLOCK_STATUS`.
    BlockStatus {
        /// Metadata context id.
        context_id: u32,
        /// At least one extent.
        extents: &'a [Extent],
    },
    /// `NBD_REPLY_TYPE_ERROR`.
    Error {
        /// Error (non-zero).
        error: ErrorCode,
        /// Message for a human.
        message: &'a WireString,
    },
    /// `NBD_REPLY_TYPE_ERROR_OFFSET`.
    ErrorOffset {
        /// Error (non-zero).
        error: ErrorCode,
        /// Message for a human.
        message: &'a WireString,
        /// Where the error occurred.
        offset: u64,
    },
}

impl Chunk<'_> {
    /// The chunk type.
    pub fn chunk_type(&self) -> ReplyChunkType {
        match self {
            Self::None => ReplyChunkType::None,
            Self::OffsetData { .. } => ReplyChunkType::OffsetData,
            Self::OffsetHole { .. } => ReplyChunkType::OffsetHole,
            Self::BlockStatus { .. } => ReplyChunkType::BlockStatus,
            Self::Error { .. } => ReplyChunkType::Error,
            Self::ErrorOffset { .. } => ReplyChunkType::ErrorOffset,
        }
    }

    /// Value of the header's payload length field.
    fn payload_len(&self) -> u32 {
        let extents = |n: usize| u32::try_from(n.min(MAX_EXTENTS) * 8).unwrap_or(u32::MAX);
        match self {
            Self::None => 0,
            Self::OffsetData { data_len, .. } => data_len.saturating_add(8),
            Self::OffsetHole { .. } => 12,
            Self::BlockStatus { extents: e, .. } => 4 + extents(e.len()),
            Self::Error { message, .. } => 6 + u32::from(message.len_u16()),
            Self::ErrorOffset { message, .. } => 14 + u32::from(message.len_u16()),
        }
    }

    /// Appends the chunk (for OFFSET_DATA, only header and offset) to `out`.
    pub fn encode(&self, cookie: u64, done: bool, out: &mut Vec<u8>) {
        let flags = if done {
            ReplyFlags::DONE
        } else {
            ReplyFlags::EMPTY
        };
        out.put_u32(STRUCTURED_REPLY_MAGIC);
        out.put_u16(flags.0);
        out.put_u16(self.chunk_type().into());
        out.put_u64(cookie);
        out.put_u32(self.payload_len());
        self.encode_payload(out);
    }

    fn encode_payload(&self, out: &mut Vec<u8>) {
        match self {
            Self::None => {}
            Self::OffsetData { offset, .. } => out.put_u64(*offset),
            Self::OffsetHole { offset, size } => {
                out.put_u64(*offset);
                out.put_u32(*size);
            }
            Self::BlockStatus {
                context_id,
                extents,
            } => {
                out.put_u32(*context_id);
                for extent in extents.iter().take(MAX_EXTENTS) {
                    out.put_u32(extent.length);
                    out.put_u32(extent.flags.0);
                }
            }
            Self::Error { error, message } => encode_error(*error, message, out),
            Self::ErrorOffset {
                error,
                message,
                offset,
            } => {
                encode_error(*error, message, out);
                out.put_u64(*offset);
            }
        }
    }
}

fn encode_error(error: ErrorCode, message: &WireString, out: &mut Vec<u8>) {
    out.put_u32(error.into());
    out.put_u16(message.len_u16());
    out.put_slice(message.as_str().as_bytes());
}

/// Turns an export's raw extent list into a valid BLOCK_STATUS answer for a request of
/// `request_len` bytes: zero-length extents are dropped, neighbours with equal flags merged,
/// the list is cut so it never extends past the requested range (the last extent is clipped),
/// REQ_ONE keeps only the first extent, and at most [`MAX_EXTENTS`] are kept. An export that
/// reports nothing gets one extent with status 0 (allocated, contents unknown), which is always
/// a truthful answer.
pub fn clip_extents(raw: &[(u32, Allocation)], request_len: u32, req_one: bool) -> Vec<Extent> {
    let mut out: Vec<Extent> = Vec::new();
    let mut left = request_len;
    for &(len, state) in raw {
        if left == 0 || out.len() == MAX_EXTENTS {
            break;
        }
        let length = len.min(left);
        if length == 0 {
            continue;
        }
        left -= length;
        let flags = allocation_flags(state);
        match out.last_mut() {
            Some(last) if last.flags == flags => last.length += length,
            _ => out.push(Extent { length, flags }),
        }
    }
    if out.is_empty() && request_len > 0 {
        out.push(Extent {
            length: request_len,
            flags: AllocationState::EMPTY,
        });
    }
    if req_one {
        out.truncate(1);
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn encoded(chunk: &Chunk<'_>, cookie: u64, done: bool) -> Vec<u8> {
        let mut out = Vec::new();
        chunk.encode(cookie, done, &mut out);
        out
    }

    #[test]
    fn simple_reply_golden_bytes() {
        let mut out = Vec::new();
        encode_simple_reply(0x0102_0304_0506_0708, None, &mut out);
        assert_eq!(
            out,
            b"\x67\x44\x66\x98\x00\x00\x00\x00\x01\x02\x03\x04\x05\x06\x07\x08"
        );
        out.clear();
        encode_simple_reply(7, Some(ErrorCode::Inval), &mut out);
        assert_eq!(
            out,
            b"\x67\x44\x66\x98\x00\x00\x00\x16\x00\x00\x00\x00\x00\x00\x00\x07"
        );
    }

    #[test]
    fn none_chunk_golden_bytes() {
        let out = encoded(&Chunk::None, 9, true);
        assert_eq!(
            out,
            b"\x66\x8e\x33\xef\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x09\x00\x00\x00\x00"
        );
    }

    #[test]
    fn offset_data_header_golden_bytes() {
        let out = encoded(
            &Chunk::OffsetData {
                offset: 4096,
                data_len: 512,
            },
            1,
            true,
        );
        assert_eq!(&out[..8], b"\x66\x8e\x33\xef\x00\x01\x00\x01");
        assert_eq!(&out[16..20], &[0, 0, 0x02, 0x08]); // 512 + 8
        assert_eq!(&out[20..], &[0, 0, 0, 0, 0, 0, 0x10, 0]);
    }

    #[test]
    fn offset_hole_golden_bytes() {
        let out = encoded(
            &Chunk::OffsetHole {
                offset: 512,
                size: 1024,
            },
            2,
            false,
        );
        assert_eq!(&out[4..8], &[0, 0, 0, 2]);
        assert_eq!(
            &out[16..],
            &[0, 0, 0, 12, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 4, 0]
        );
    }

    #[test]
    fn block_status_golden_bytes() {
        let extents = [
            Extent {
                length: 4096,
                flags: AllocationState::HOLE | AllocationState::ZERO,
            },
            Extent {
                length: 512,
                flags: AllocationState::EMPTY,
            },
        ];
        let out = encoded(
            &Chunk::BlockStatus {
                context_id: 1,
                extents: &extents,
            },
            3,
            true,
        );
        assert_eq!(&out[4..8], &[0, 1, 0, 5]);
        assert_eq!(&out[16..20], &[0, 0, 0, 20]);
        assert_eq!(
            &out[20..],
            &[0, 0, 0, 1, 0, 0, 0x10, 0, 0, 0, 0, 3, 0, 0, 2, 0, 0, 0, 0, 0]
        );
    }

    #[test]
    fn error_chunks_golden_bytes() {
        let msg = WireString::parse(b"bad").unwrap();
        let out = encoded(
            &Chunk::Error {
                error: ErrorCode::Io,
                message: &msg,
            },
            4,
            true,
        );
        assert_eq!(&out[4..8], &[0, 1, 0x80, 0x01]);
        assert_eq!(
            &out[16..],
            &[0, 0, 0, 9, 0, 0, 0, 5, 0, 3, b'b', b'a', b'd']
        );
        let chunk = Chunk::ErrorOffset {
            error: ErrorCode::Io,
            message: &msg,
            offset: 8,
        };
        let out = encoded(&chunk, 4, false);
        assert_eq!(&out[4..8], &[0, 0, 0x80, 0x02]);
        assert_eq!(&out[16..20], &[0, 0, 0, 17]);
        assert_eq!(&out[out.len() - 8..], &[0, 0, 0, 0, 0, 0, 0, 8]);
    }

    #[test]
    fn extents_are_clipped_merged_and_limited() {
        use Allocation::*;
        let hz = AllocationState::HOLE | AllocationState::ZERO;
        let raw = [
            (512, Data),
            (0, Hole),
            (512, Data),
            (4096, Hole),
            (4096, Zero),
        ];
        let got = clip_extents(&raw, 2048, false);
        assert_eq!(
            got,
            vec![
                Extent {
                    length: 1024,
                    flags: AllocationState::EMPTY
                },
                Extent {
                    length: 1024,
                    flags: hz
                }
            ]
        );
        let one = clip_extents(&raw, 2048, true);
        assert_eq!(
            one,
            vec![Extent {
                length: 1024,
                flags: AllocationState::EMPTY
            }]
        );
        // REQ_ONE never exceeds the request length.
        assert_eq!(clip_extents(&[(8192, Hole)], 512, true)[0].length, 512);
        // Nothing reported: one extent of unknown status.
        assert_eq!(
            clip_extents(&[], 4096, false),
            vec![Extent {
                length: 4096,
                flags: AllocationState::EMPTY
            }]
        );
        // Sum never exceeds the request.
        let sum: u32 = clip_extents(&raw, 5000, false)
            .iter()
            .map(|e| e.length)
            .sum();
        assert_eq!(sum, 5000);
    }
}
