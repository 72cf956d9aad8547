//! The persisted form of [`PrState`] kept when APTPL is set (docs/FORMATS.md, "Persistent
//! reservations"): a 32-byte little-endian header, the registrations, a CRC32C of everything
//! before it. The whole file is one small write replaced atomically, so one checksum suffices.

use super::{PrState, PrType, Reservation, MAX_REGISTRATIONS};
use crate::nexus::Nexus;

/// First eight bytes of the file.
pub const MAGIC: [u8; 8] = *b"MRNPRSV\0";
/// Header length.
pub const HEADER_LEN: usize = 32;
/// Longest initiator name kept (iSCSI names are at most 223 bytes); REGISTER refuses longer.
pub const MAX_NAME_LEN: usize = 1024;
/// No reservation holder.
const NO_HOLDER: u32 = u32::MAX;

const OFF_VERSION: usize = 8;
const OFF_FLAGS: usize = 10;
const OFF_GENERATION: usize = 12;
const OFF_COUNT: usize = 16;
const OFF_HOLDER: usize = 20;
const OFF_TYPE: usize = 24;
const OFF_BODY_LEN: usize = 28;
const _: () = assert!(OFF_BODY_LEN + 4 == HEADER_LEN);

/// Format versions; retired codes are never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// The first layout.
    V1 = 1,
}

/// Why an image does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    /// Shorter than its header or body says.
    #[error("truncated reservation file")]
    Truncated,
    /// Not this format.
    #[error("bad magic")]
    Magic,
    /// A version this build does not know.
    #[error("unknown version {0}")]
    Version(u16),
    /// The checksum does not match.
    #[error("checksum mismatch")]
    Checksum,
    /// A field out of range, or bytes after the checksum.
    #[error("corrupt reservation file: {0}")]
    Corrupt(&'static str),
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Encodes the registrations and reservation (the SPC-2 reservation is never persisted).
pub fn encode(state: &PrState) -> Vec<u8> {
    let mut body = Vec::new();
    let mut holder = NO_HOLDER;
    for (i, (nexus, key)) in state.registrations.iter().enumerate() {
        if state
            .reservation
            .as_ref()
            .is_some_and(|r| &r.holder == nexus)
        {
            holder = i as u32;
        }
        let name = nexus.name.as_bytes();
        body.extend_from_slice(&key.to_le_bytes());
        body.extend_from_slice(&nexus.isid);
        body.extend_from_slice(&(name.len() as u16).to_le_bytes());
        body.extend_from_slice(name);
    }
    let kind = state.reservation.as_ref().map_or(0, |r| r.kind.code());
    let mut out = Vec::with_capacity(HEADER_LEN + body.len() + 4);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&(Version::V1 as u16).to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&state.generation.to_le_bytes());
    out.extend_from_slice(&(state.registrations.len() as u32).to_le_bytes());
    out.extend_from_slice(&holder.to_le_bytes());
    out.extend_from_slice(&[kind, 0, 0, 0]);
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&body);
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Decodes an image into a state with APTPL set and `ptpl_capable`.
pub fn decode(bytes: &[u8]) -> Result<PrState, ImageError> {
    if bytes.len() < HEADER_LEN + 4 {
        return Err(ImageError::Truncated);
    }
    if bytes[..8] != MAGIC {
        return Err(ImageError::Magic);
    }
    match le16(bytes, OFF_VERSION) {
        1 => {}
        v => return Err(ImageError::Version(v)),
    }
    let body_len = le32(bytes, OFF_BODY_LEN) as usize;
    let end = HEADER_LEN
        .checked_add(body_len)
        .filter(|e| e + 4 <= bytes.len())
        .ok_or(ImageError::Truncated)?;
    if end + 4 != bytes.len() {
        return Err(ImageError::Corrupt("trailing bytes"));
    }
    if crc32c::crc32c(&bytes[..end]) != le32(bytes, end) {
        return Err(ImageError::Checksum);
    }
    if le16(bytes, OFF_FLAGS) != 0 || bytes[OFF_TYPE + 1..OFF_BODY_LEN] != [0, 0, 0] {
        return Err(ImageError::Corrupt("reserved bits set"));
    }
    let count = le32(bytes, OFF_COUNT) as usize;
    if count > MAX_REGISTRATIONS {
        return Err(ImageError::Corrupt("too many registrations"));
    }
    let regs = registrations(&bytes[HEADER_LEN..end], count)?;
    let mut state = PrState::new(true);
    state.aptpl = true;
    state.generation = le32(bytes, OFF_GENERATION);
    state.reservation = reservation(bytes, &regs)?;
    state.registrations = regs.into_iter().collect();
    if state.registrations.len() != count {
        return Err(ImageError::Corrupt("duplicate registration"));
    }
    Ok(state)
}

fn registrations(mut body: &[u8], count: usize) -> Result<Vec<(Nexus, u64)>, ImageError> {
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        if body.len() < 16 {
            return Err(ImageError::Truncated);
        }
        let key = u64::from_le_bytes(body[..8].try_into().unwrap_or_default());
        let isid: [u8; 6] = body[8..14].try_into().unwrap_or_default();
        let name_len = usize::from(le16(body, 14));
        if name_len > MAX_NAME_LEN {
            return Err(ImageError::Corrupt("name too long"));
        }
        let name = body.get(16..16 + name_len).ok_or(ImageError::Truncated)?;
        let name = std::str::from_utf8(name).map_err(|_| ImageError::Corrupt("name not UTF-8"))?;
        if key == 0 {
            return Err(ImageError::Corrupt("zero key"));
        }
        out.push((Nexus::iscsi(name, isid), key));
        body = &body[16 + name_len..];
    }
    if !body.is_empty() {
        return Err(ImageError::Corrupt("body longer than its registrations"));
    }
    Ok(out)
}

fn reservation(bytes: &[u8], regs: &[(Nexus, u64)]) -> Result<Option<Reservation>, ImageError> {
    let code = bytes[OFF_TYPE];
    let holder = le32(bytes, OFF_HOLDER);
    if code == 0 {
        return match holder {
            NO_HOLDER => Ok(None),
            _ => Err(ImageError::Corrupt("holder without reservation")),
        };
    }
    let kind = PrType::from_code(code).ok_or(ImageError::Corrupt("reservation type"))?;
    let (holder, _) = regs
        .get(holder as usize)
        .ok_or(ImageError::Corrupt("holder index"))?;
    Ok(Some(Reservation {
        holder: holder.clone(),
        kind,
    }))
}
