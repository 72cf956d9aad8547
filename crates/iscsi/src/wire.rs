//! Big-endian field access within a PDU (iSCSI is big-endian on the wire). Built from
//! shifts so no host- or big-endian method is involved (the workspace lints deny them).

/// Reads a big-endian number from up to 8 bytes.
pub fn be(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b))
}

/// Writes `value` big-endian into all of `out`.
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
