//! Text key=value parameters (RFC 7143 §6): NUL-terminated `key=value` pairs.

/// Longest key accepted (RFC 7143 §6.1: 63 bytes).
pub const MAX_KEY_LEN: usize = 63;
/// Longest value accepted (RFC 7143 §6.1: 255 bytes, except CHAP binary values up to 8192).
pub const MAX_VALUE_LEN: usize = 8192;
/// Most pairs accepted in one text exchange.
pub const MAX_PAIRS: usize = 256;

/// Why a text segment does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TextError {
    /// A pair had no `=`.
    #[error("pair without '='")]
    NoEquals,
    /// A key was empty, too long, or not printable ASCII.
    #[error("invalid key")]
    BadKey,
    /// A value was too long or not UTF-8.
    #[error("invalid value")]
    BadValue,
    /// Too many pairs.
    #[error("too many pairs")]
    TooMany,
    /// A key appeared twice.
    #[error("duplicate key {0}")]
    Duplicate(String),
}

/// Parses a text segment into pairs in order. Trailing NULs (padding) are ignored; a
/// final pair without its NUL is accepted.
pub fn parse(data: &[u8]) -> Result<Vec<(String, String)>, TextError> {
    let mut pairs: Vec<(String, String)> = Vec::new();
    for item in data.split(|b| *b == 0).filter(|s| !s.is_empty()) {
        if pairs.len() == MAX_PAIRS {
            return Err(TextError::TooMany);
        }
        let eq = item
            .iter()
            .position(|b| *b == b'=')
            .ok_or(TextError::NoEquals)?;
        let (key, value) = (&item[..eq], &item[eq + 1..]);
        if key.is_empty() || key.len() > MAX_KEY_LEN || !key.iter().all(|b| b.is_ascii_graphic()) {
            return Err(TextError::BadKey);
        }
        if value.len() > MAX_VALUE_LEN {
            return Err(TextError::BadValue);
        }
        let key = String::from_utf8(key.to_vec()).map_err(|_| TextError::BadKey)?;
        let value = String::from_utf8(value.to_vec()).map_err(|_| TextError::BadValue)?;
        if pairs.iter().any(|(k, _)| *k == key) {
            return Err(TextError::Duplicate(key));
        }
        pairs.push((key, value));
    }
    Ok(pairs)
}

/// Encodes pairs as `key=value\0...`.
pub fn encode(pairs: &[(String, String)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in pairs {
        out.extend_from_slice(k.as_bytes());
        out.push(b'=');
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_encodes() {
        let pairs = parse(b"InitiatorName=iqn.x\0SessionType=Normal\0\0\0").unwrap();
        assert_eq!(pairs.len(), 2);
        assert_eq!(pairs[1], ("SessionType".into(), "Normal".into()));
        assert_eq!(parse(&encode(&pairs)).unwrap(), pairs);
        assert_eq!(parse(b"a=").unwrap(), vec![("a".into(), String::new())]);
    }

    #[test]
    fn rejects_malformed() {
        assert_eq!(parse(b"novalue\0"), Err(TextError::NoEquals));
        assert_eq!(parse(b"=x\0"), Err(TextError::BadKey));
        assert!(matches!(parse(b"a=1\0a=2\0"), Err(TextError::Duplicate(_))));
        assert_eq!(parse(&[b'a', b'=', 0xff]), Err(TextError::BadValue));
    }
}
