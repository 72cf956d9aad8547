//! PDU layout and a sans-I/O codec (RFC 7143 §11).
//!
//! ```text
//! BHS (48 bytes)
//!   0      I (0x40) | opcode (6 bits)
//!   1      F (0x80) | opcode-specific flags
//!   2..4   opcode-specific
//!   4      TotalAHSLength (4-byte words)
//!   5..8   DataSegmentLength (bytes, before padding)
//!   8..16  LUN or opcode-specific
//!   16..20 Initiator Task Tag
//!   20..48 opcode-specific
//! AHS (TotalAHSLength * 4), [header digest 4], data segment, pad to 4, [data digest 4]
//! ```
//!
//! Digests are CRC32C, sent least-significant byte first.

use crate::wire::{be, put_be};

/// Length of the basic header segment.
pub const BHS_LEN: usize = 48;
/// Reserved tag value ("no task").
pub const RESERVED_TAG: u32 = 0xffff_ffff;
const _: () = assert!(BHS_LEN == 48);

/// Operation codes (open: unknown ones are kept, and answered with a Reject).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum Opcode {
    NopOut,
    ScsiCommand,
    TaskMgmtRequest,
    LoginRequest,
    TextRequest,
    DataOut,
    LogoutRequest,
    SnackRequest,
    NopIn,
    ScsiResponse,
    TaskMgmtResponse,
    LoginResponse,
    TextResponse,
    DataIn,
    LogoutResponse,
    R2t,
    AsyncMessage,
    Reject,
    Unknown(u8),
}

impl From<u8> for Opcode {
    fn from(code: u8) -> Self {
        match code & 0x3f {
            0x00 => Self::NopOut,
            0x01 => Self::ScsiCommand,
            0x02 => Self::TaskMgmtRequest,
            0x03 => Self::LoginRequest,
            0x04 => Self::TextRequest,
            0x05 => Self::DataOut,
            0x06 => Self::LogoutRequest,
            0x10 => Self::SnackRequest,
            0x20 => Self::NopIn,
            0x21 => Self::ScsiResponse,
            0x22 => Self::TaskMgmtResponse,
            0x23 => Self::LoginResponse,
            0x24 => Self::TextResponse,
            0x25 => Self::DataIn,
            0x26 => Self::LogoutResponse,
            0x31 => Self::R2t,
            0x32 => Self::AsyncMessage,
            0x3f => Self::Reject,
            other => Self::Unknown(other),
        }
    }
}

impl From<Opcode> for u8 {
    fn from(op: Opcode) -> u8 {
        match op {
            Opcode::NopOut => 0x00,
            Opcode::ScsiCommand => 0x01,
            Opcode::TaskMgmtRequest => 0x02,
            Opcode::LoginRequest => 0x03,
            Opcode::TextRequest => 0x04,
            Opcode::DataOut => 0x05,
            Opcode::LogoutRequest => 0x06,
            Opcode::SnackRequest => 0x10,
            Opcode::NopIn => 0x20,
            Opcode::ScsiResponse => 0x21,
            Opcode::TaskMgmtResponse => 0x22,
            Opcode::LoginResponse => 0x23,
            Opcode::TextResponse => 0x24,
            Opcode::DataIn => 0x25,
            Opcode::LogoutResponse => 0x26,
            Opcode::R2t => 0x31,
            Opcode::AsyncMessage => 0x32,
            Opcode::Reject => 0x3f,
            Opcode::Unknown(code) => code & 0x3f,
        }
    }
}

/// One PDU: header, additional header segments and data segment (without padding/digests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pdu {
    /// The basic header segment.
    pub bhs: [u8; BHS_LEN],
    /// Additional header segments (a multiple of 4 bytes).
    pub ahs: Vec<u8>,
    /// The data segment.
    pub data: Vec<u8>,
}

impl Pdu {
    /// A PDU with `opcode`, the final bit set and everything else zero.
    pub fn new(opcode: Opcode) -> Self {
        let mut bhs = [0u8; BHS_LEN];
        bhs[0] = u8::from(opcode);
        bhs[1] = 0x80;
        Self {
            bhs,
            ahs: Vec::new(),
            data: Vec::new(),
        }
    }

    /// Operation code.
    pub fn opcode(&self) -> Opcode {
        Opcode::from(self.bhs[0])
    }
    /// The immediate-delivery bit.
    pub fn immediate(&self) -> bool {
        self.bhs[0] & 0x40 != 0
    }
    /// Byte 1 (final bit and opcode-specific flags).
    pub fn flags(&self) -> u8 {
        self.bhs[1]
    }
    /// The final bit.
    pub fn is_final(&self) -> bool {
        self.bhs[1] & 0x80 != 0
    }
    /// Bytes 8..16 as a number (the LUN field).
    pub fn lun(&self) -> u64 {
        be(&self.bhs[8..16])
    }
    /// Initiator task tag.
    pub fn itt(&self) -> u32 {
        self.u32_at(16)
    }
    /// The big-endian `u32` at `offset` of the BHS (`offset` + 4 <= 48).
    pub fn u32_at(&self, offset: usize) -> u32 {
        be(&self.bhs[offset..offset + 4]) as u32
    }
    /// Sets the big-endian `u32` at `offset`.
    pub fn set_u32(&mut self, offset: usize, value: u32) {
        put_be(&mut self.bhs[offset..offset + 4], u64::from(value));
    }
    /// Sets the LUN field.
    pub fn set_lun(&mut self, lun: u64) {
        put_be(&mut self.bhs[8..16], lun);
    }
    /// Sets the initiator task tag.
    pub fn set_itt(&mut self, itt: u32) {
        self.set_u32(16, itt);
    }

    /// Encodes the PDU, filling in the length fields, padding and digests.
    pub fn encode(&self, digests: Digests, out: &mut Vec<u8>) {
        let mut bhs = self.bhs;
        bhs[4] = (self.ahs.len() / 4) as u8;
        put_be(&mut bhs[5..8], self.data.len() as u64);
        let start = out.len();
        out.extend_from_slice(&bhs);
        out.extend_from_slice(&self.ahs);
        if digests.header {
            let crc = crc32c::crc32c(&out[start..]);
            out.extend_from_slice(&crc.to_le_bytes());
        }
        if self.data.is_empty() {
            return;
        }
        let data_start = out.len();
        out.extend_from_slice(&self.data);
        out.resize(out.len() + pad(self.data.len()), 0);
        if digests.data {
            let crc = crc32c::crc32c(&out[data_start..]);
            out.extend_from_slice(&crc.to_le_bytes());
        }
    }
}

fn pad(len: usize) -> usize {
    (4 - len % 4) % 4
}

/// Which digests are in use on a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Digests {
    /// CRC32C header digest.
    pub header: bool,
    /// CRC32C data digest.
    pub data: bool,
}

/// Why a byte stream is not a valid PDU stream. Every one ends the connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PduError {
    /// The data segment is longer than this side accepts.
    #[error("data segment of {len} bytes exceeds the limit of {max}")]
    DataTooLong {
        /// Announced length.
        len: usize,
        /// Limit.
        max: usize,
    },
    /// The header digest did not match.
    #[error("header digest mismatch")]
    HeaderDigest,
    /// The data digest did not match.
    #[error("data digest mismatch")]
    DataDigest,
}

/// Sans-I/O PDU decoder: feed it the bytes read so far, take complete PDUs out.
#[derive(Debug, Clone)]
pub struct Decoder {
    /// Digests expected on incoming PDUs.
    pub digests: Digests,
    /// Largest data segment accepted (our MaxRecvDataSegmentLength, or a login cap).
    pub max_data_len: usize,
}

impl Decoder {
    /// A decoder without digests accepting data segments up to `max_data_len` bytes.
    pub fn new(max_data_len: usize) -> Self {
        Self {
            digests: Digests::default(),
            max_data_len,
        }
    }

    /// Total length the PDU starting at `buf` occupies, once its BHS is available.
    fn frame_len(&self, bhs: &[u8]) -> Result<(usize, usize, usize), PduError> {
        let ahs_len = usize::from(bhs[4]) * 4;
        let data_len = be(&bhs[5..8]) as usize;
        if data_len > self.max_data_len {
            return Err(PduError::DataTooLong {
                len: data_len,
                max: self.max_data_len,
            });
        }
        let hd = if self.digests.header { 4 } else { 0 };
        let dd = if self.digests.data && data_len > 0 {
            4
        } else {
            0
        };
        let total = BHS_LEN + ahs_len + hd + data_len + pad(data_len) + dd;
        Ok((total, ahs_len, data_len))
    }

    /// Takes one complete PDU from the front of `buf`, or returns `Ok(None)` if more bytes
    /// are needed. On error the stream is unusable.
    pub fn decode(&self, buf: &mut Vec<u8>) -> Result<Option<Pdu>, PduError> {
        let Some((pdu, total)) = self.decode_prefix(buf)? else {
            return Ok(None);
        };
        buf.drain(..total);
        Ok(Some(pdu))
    }

    /// Decodes the PDU at the front of `buf` without consuming it: the PDU and the number of
    /// bytes it occupies, or `Ok(None)` if more bytes are needed. A reader holding many
    /// PDUs in one buffer advances an offset with this instead of shifting the rest of the
    /// buffer down after each one. On error the stream is unusable.
    pub fn decode_prefix(&self, buf: &[u8]) -> Result<Option<(Pdu, usize)>, PduError> {
        let Some(head) = buf.get(..BHS_LEN) else {
            return Ok(None);
        };
        let (total, ahs_len, data_len) = self.frame_len(head)?;
        if buf.len() < total {
            return Ok(None);
        }
        let header_end = BHS_LEN + ahs_len;
        let mut at = header_end;
        if self.digests.header {
            let want = crc32c::crc32c(&buf[..header_end]);
            if buf[at..at + 4] != want.to_le_bytes() {
                return Err(PduError::HeaderDigest);
            }
            at += 4;
        }
        let data_end = at + data_len;
        let padded_end = data_end + pad(data_len);
        if self.digests.data && data_len > 0 {
            let want = crc32c::crc32c(&buf[at..padded_end]);
            if buf[padded_end..padded_end + 4] != want.to_le_bytes() {
                return Err(PduError::DataDigest);
            }
        }
        let mut bhs = [0u8; BHS_LEN];
        bhs.copy_from_slice(&buf[..BHS_LEN]);
        let pdu = Pdu {
            bhs,
            ahs: buf[BHS_LEN..header_end].to_vec(),
            data: buf[at..data_end].to_vec(),
        };
        Ok(Some((pdu, total)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_with_digests() {
        let mut p = Pdu::new(Opcode::ScsiCommand);
        p.set_itt(7);
        p.set_lun(0x0001_0000_0000_0000);
        p.data = vec![1, 2, 3, 4, 5];
        let digests = Digests {
            header: true,
            data: true,
        };
        let mut out = Vec::new();
        p.encode(digests, &mut out);
        assert_eq!(out.len(), 48 + 4 + 8 + 4);
        let mut dec = Decoder::new(1024);
        dec.digests = digests;
        let mut partial = out[..50].to_vec();
        assert_eq!(dec.decode(&mut partial).unwrap(), None);
        let mut buf = out.clone();
        let got = dec.decode(&mut buf).unwrap().unwrap();
        assert!(buf.is_empty());
        assert_eq!(got.data, p.data);
        assert_eq!(got.itt(), 7);
        assert_eq!(got.opcode(), Opcode::ScsiCommand);
        let mut bad = out.clone();
        bad[60] ^= 1;
        assert_eq!(dec.decode(&mut bad), Err(PduError::DataDigest));
        let mut bad = out;
        bad[20] ^= 1;
        assert_eq!(dec.decode(&mut bad), Err(PduError::HeaderDigest));
    }

    #[test]
    fn data_length_is_capped() {
        let mut p = Pdu::new(Opcode::DataOut);
        p.data = vec![0; 100];
        let mut out = Vec::new();
        p.encode(Digests::default(), &mut out);
        assert!(matches!(
            Decoder::new(64).decode(&mut out),
            Err(PduError::DataTooLong { .. })
        ));
    }

    #[test]
    fn opcodes_round_trip() {
        for code in 0u8..64 {
            assert_eq!(u8::from(Opcode::from(code)), code);
        }
        assert_eq!(Opcode::from(0x43), Opcode::LoginRequest);
    }
}
