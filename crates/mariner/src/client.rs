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
        "{:<w$} {:>6} {:>12} {:>12} {:>6} {:>5}  STATE\n",
        "NAME", "ID", "SIZE", "ALLOCATED", "BLOCK", "CONNS"
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
            "{:<w$} {:>6} {:>12} {:>12} {:>6} {:>5}  {state}",
            name(r),
            n("id"),
            size("size_bytes"),
            size("allocated_bytes"),
            n("block_size"),
            n("connections"),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
