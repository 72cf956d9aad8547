//! Big-endian field access. SCSI is big-endian on the wire; these helpers are the only place
//! the crate turns bytes into numbers, built from shifts so no host-endian method is involved.
//! Every reader takes a slice of the exact width (callers index with fixed ranges of a CDB or
//! buffer whose length they have already checked).

/// Reads a big-endian number of up to 8 bytes.
pub fn be(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b))
}

/// Reads a big-endian `u16` from the first two bytes of `bytes` (missing bytes read as zero).
pub fn be16(bytes: &[u8]) -> u16 {
    be(bytes.get(..2).unwrap_or(bytes)) as u16
}

/// Reads a big-endian `u32` from the first four bytes of `bytes`.
pub fn be32(bytes: &[u8]) -> u32 {
    be(bytes.get(..4).unwrap_or(bytes)) as u32
}

/// Reads a big-endian `u64` from the first eight bytes of `bytes`.
pub fn be64(bytes: &[u8]) -> u64 {
    be(bytes.get(..8).unwrap_or(bytes))
}

/// Writes `value` big-endian into all of `out` (its low `out.len()` bytes).
pub fn put_be(out: &mut [u8], value: u64) {
    let len = out.len();
    for (i, byte) in out.iter_mut().enumerate() {
        let shift = 8 * (len - 1 - i);
        *byte = if shift >= 64 {
            0
        } else {
            (value >> shift) as u8
        };
    }
}

/// Appends `value` as `width` big-endian bytes.
pub fn push_be(out: &mut Vec<u8>, value: u64, width: usize) {
    let start = out.len();
    out.resize(start + width, 0);
    put_be(&mut out[start..], value);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let mut buf = [0u8; 8];
        put_be(&mut buf, 0x0102_0304_0506_0708);
        assert_eq!(buf, [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(be64(&buf), 0x0102_0304_0506_0708);
        assert_eq!(be32(&buf), 0x0102_0304);
        assert_eq!(be16(&buf[6..]), 0x0708);
        let mut three = [0u8; 3];
        put_be(&mut three, 0xAB_CDEF);
        assert_eq!(be(&three), 0xAB_CDEF);
        let mut v = Vec::new();
        push_be(&mut v, 0x1234, 2);
        assert_eq!(v, [0x12, 0x34]);
    }
}
