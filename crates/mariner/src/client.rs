//! A minimal HTTP/1.1 client for the admin socket: one request per connection.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

/// Sends one request to `<data>/admin.sock` and returns the JSON body; an error status becomes
/// the server's error message.
pub fn request(
    data: &Path,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Result<Value, String> {
    let sock = data.join("admin.sock");
    let mut s = UnixStream::connect(&sock).map_err(|e| {
        format!(
            "cannot reach the server at {}: {e} (is `mariner serve --data {}` running, and are you its owner?)",
            sock.display(),
            data.display()
        )
    })?;
    s.set_read_timeout(Some(Duration::from_secs(120)))
        .map_err(|e| e.to_string())?;
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: mariner\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(|e| e.to_string())?;
    let (status, body) = parse_response(&raw)?;
    let value: Value = if body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&body).map_err(|e| format!("bad answer from server: {e}"))?
    };
    if !(200..300).contains(&status) {
        let msg = value
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or("request failed");
        return Err(msg.to_string());
    }
    Ok(value)
}

/// `s` percent-encoded for a URL's path segment or query value (RFC 3986: everything but the
/// unreserved characters), so a TIME such as `2026-11-25T10:00:00+01:00` arrives intact.
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn parse_response(raw: &[u8]) -> Result<(u16, Vec<u8>), String> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("truncated answer from server")?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let body = &raw[split + 4..];
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or("bad status line from server")?;
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    Ok((
        status,
        if chunked {
            dechunk(body)?
        } else {
            body.to_vec()
        },
    ))
}

fn dechunk(mut b: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let eol = b
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("bad chunked body")?;
        let size_text = String::from_utf8_lossy(&b[..eol]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| "bad chunk size")?;
        b = &b[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        let chunk = b.get(..size).ok_or("truncated chunk")?;
        out.extend_from_slice(chunk);
        b = b.get(size + 2..).ok_or("truncated chunk")?;
    }
}

/// Prints one volume or a list of them as a table, the name column as wide as the longest
/// name (names run to 64 characters).
pub fn print_volumes(v: &Value) {
    print!("{}", volume_table(v));
}

fn volume_table(v: &Value) -> String {
    use std::fmt::Write;
    let rows: Vec<&Value> = match v {
        Value::Array(a) => a.iter().collect(),
        other => vec![other],
    };
    let name = |r: &Value| {
        r.get("name")
            .and_then(Value::as_str)
            .unwrap_or("?")
            .to_string()
    };
    let w = rows.iter().map(|r| name(r).len()).max().unwrap_or(0).max(4);
    let mut out = format!(
        "{:<w$} {:>6} {:>12} {:>12} {:>6} {:>5} {:>15}  STATE\n",
        "NAME", "ID", "SIZE", "ALLOCATED", "BLOCK", "CONNS", "HISTORY"
    );
    for r in rows {
        let n = |k: &str| r.get(k).and_then(Value::as_u64).unwrap_or(0);
        let size = |k: &str| bytesize::ByteSize(n(k)).display().iec().to_string();
        let state = match r.get("read_only").and_then(Value::as_str) {
            Some(why) => format!("read-only: {why}"),
            None => "ok".to_string(),
        };
        let _ = writeln!(
            out,
            "{:<w$} {:>6} {:>12} {:>12} {:>6} {:>5} {:>15}  {state}",
            name(r),
            n("id"),
            size("size_bytes"),
            size("allocated_bytes"),
            n("block_size"),
            n("connections"),
            history_cell(r.get("history")),
        );
    }
    out
}

/// "effective/configured", e.g. `2h13m/7d`; "off" without history, "lost" when unreadable.
fn history_cell(h: Option<&Value>) -> String {
    let Some(h) = h.filter(|h| !h.is_null()) else {
        return "off".into();
    };
    if h.get("unavailable").is_some_and(|u| !u.is_null()) {
        return "unavailable".into();
    }
    let secs = |k: &str| h.get(k).and_then(Value::as_f64).unwrap_or(0.0);
    format!(
        "{}/{}",
        short_duration(secs("effective_window_s")),
        short_duration(secs("configured_window_s"))
    )
}

/// A duration in its two largest units: `6d23h`, `2h13m`, `45s`.
pub fn short_duration(secs: f64) -> String {
    let s = secs.max(0.0) as u64;
    let units = [(86_400, "d"), (3_600, "h"), (60, "m"), (1, "s")];
    let mut out = String::new();
    let mut left = s;
    let mut parts = 0;
    for (size, name) in units {
        if left >= size || (parts == 0 && size == 1) {
            out.push_str(&format!("{}{name}", left / size));
            left %= size;
            parts += 1;
            if parts == 2 || left == 0 {
                break;
            }
        } else if parts > 0 {
            break;
        }
    }
    out
}

/// `mariner status` as text.
pub fn status_text(v: &Value) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let get = |path: &[&str]| {
        path.iter()
            .try_fold(v, |v, k| v.get(*k))
            .filter(|x| !x.is_null())
    };
    let s = |path: &[&str]| get(path).map_or("-".to_string(), |x| x.to_string());
    let _ = writeln!(out, "data       {}", s(&["data"]).trim_matches('"'));
    let _ = writeln!(
        out,
        "log        {} device(s), {} segments of {} each; failed: {}",
        s(&["log", "devices"]),
        s(&["log", "segments_per_device"]),
        get(&["log", "segment_bytes"])
            .and_then(Value::as_u64)
            .map_or("-".into(), |b| bytesize::ByteSize(b)
                .display()
                .iec()
                .to_string()),
        s(&["log", "failed"]),
    );
    let _ = writeln!(
        out,
        "store      applied through #{}; failed: {}",
        s(&["store", "progress_seq"]),
        s(&["store", "failed"])
    );
    match get(&["history", "enabled"]).and_then(Value::as_bool) {
        Some(true) => {
            let configured = get(&["history", "configured_window_s"])
                .and_then(Value::as_f64)
                .unwrap_or(0.0);
            let _ = writeln!(
                out,
                "history    window {}; shrank {} time(s), cut {} time(s); failed: {}",
                short_duration(configured),
                s(&["history", "shrinks"]),
                s(&["history", "cuts"]),
                s(&["history", "failed"])
            );
            if let Some(Value::Object(vols)) = get(&["history", "volumes"]) {
                for (name, h) in vols {
                    let cell = history_cell(Some(h));
                    let note = match h.get("effective_window_s").and_then(Value::as_f64) {
                        Some(e) if e < configured / 2.0 => "  (below half the window)",
                        _ => "",
                    };
                    let _ = writeln!(out, "  {name:<20} {cell}{note}");
                }
            }
        }
        _ => {
            let _ = writeln!(out, "history    off");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_names_are_encoded_for_urls() {
        assert_eq!(encode("vol0@12"), "vol0%4012");
        assert_eq!(
            encode("2026-11-25T10:00:00+01:00"),
            "2026-11-25T10%3A00%3A00%2B01%3A00"
        );
        assert_eq!(encode("-10m"), "-10m");
    }

    #[test]
    fn parses_plain_and_chunked_answers() {
        let (s, b) =
            parse_response(b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\n{}").unwrap();
        assert_eq!((s, b.as_slice()), (201, &b"{}"[..]));
        let raw = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        let (s, b) = parse_response(raw).unwrap();
        assert_eq!((s, b.as_slice()), (200, &b"abcde"[..]));
        assert!(parse_response(b"garbage").is_err());
    }

    #[test]
    fn the_table_stays_aligned_with_long_names() {
        let long = "n".repeat(64);
        let v = serde_json::json!([
            { "name": "a", "id": 1, "size_bytes": 1u64 << 30, "block_size": 512 },
            { "name": long, "id": 2, "size_bytes": 1u64 << 40, "block_size": 4096,
              "read_only": "set read-only by an operator" },
        ]);
        let table = volume_table(&v);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3, "{table}");
        // Every column after the name starts at the same place on every line.
        let id_end = |l: &str| l.find(" ok").or_else(|| l.find(" read-only")).unwrap();
        let header_state = lines[0].find(" STATE").unwrap();
        assert_eq!(id_end(lines[1]), header_state, "{table}");
        assert_eq!(id_end(lines[2]), header_state, "{table}");
        assert!(lines[2].starts_with(&long));
    }

    #[test]
    fn durations_print_in_their_two_largest_units() {
        assert_eq!(short_duration(7.0 * 86_400.0), "7d");
        assert_eq!(short_duration(2.0 * 3_600.0 + 13.0 * 60.0 + 5.0), "2h13m");
        assert_eq!(short_duration(45.0), "45s");
        assert_eq!(short_duration(0.0), "0s");
        assert_eq!(short_duration(86_400.0 + 59.0), "1d");
    }
}
