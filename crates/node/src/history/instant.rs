//! TIME as a user writes it (`--at`, `--to`, `--from`): an RFC 3339 time, a time relative to
//! now, a write number of the volume, or a bookmark. Parsing is pure; resolving it against a
//! volume's history is [`crate::Node::resolve_instant`].

use std::time::Duration;

/// An instant as written, before it is resolved against a volume's history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Instant {
    /// `now`: the newest write history has.
    Now,
    /// An RFC 3339 time, in nanoseconds since the Unix epoch.
    Time(u64),
    /// `-10m`: this long before now (`-0s` is now, by the clock).
    Ago(Duration),
    /// `@123456`: the volume after its write number 123456.
    Seq(u64),
    /// `mark:NAME`: a bookmark set with `mariner history mark`.
    Mark(String),
}

/// What the error for an unreadable TIME says it accepts.
pub const FORMS: &str = "an RFC 3339 time (2026-11-25T10:00:00.25Z), a time before now (-10m, \
                         -2h, -3d), a write number (@123456), a bookmark (mark:NAME) or now";

/// Parses TIME.
pub fn parse(s: &str) -> Result<Instant, String> {
    let s = s.trim();
    let bad = |why: &str| format!("cannot read the time {s:?}{why}: use {FORMS}");
    if s.eq_ignore_ascii_case("now") {
        return Ok(Instant::Now);
    }
    if let Some(n) = s.strip_prefix('@') {
        return n
            .parse()
            .map(Instant::Seq)
            .map_err(|_| bad(" (a write number is digits after @)"));
    }
    if let Some(name) = s.strip_prefix("mark:") {
        if !crate::valid_volume_name(name) {
            return Err(bad(" (a bookmark name is 1-64 of A-Z a-z 0-9 . _ -)"));
        }
        return Ok(Instant::Mark(name.to_string()));
    }
    if let Some(ago) = s.strip_prefix('-') {
        return humantime::parse_duration(ago)
            .map(Instant::Ago)
            .map_err(|e| bad(&format!(" ({e})")));
    }
    let t: jiff::Timestamp = s.parse().map_err(|e| bad(&format!(" ({e})")))?;
    let ns = t.as_nanosecond();
    if ns < 0 {
        return Err(bad(" (before 1970)"));
    }
    // Past what u64 nanoseconds hold (the year 2554) is in the future all the same.
    Ok(Instant::Time(u64::try_from(ns).unwrap_or(u64::MAX)))
}

/// `ns` since the Unix epoch as RFC 3339 in UTC, to the nanosecond: a time printed for an
/// instant names that instant when given back as TIME.
pub fn format_ns(ns: u64) -> String {
    match jiff::Timestamp::from_nanosecond(i128::from(ns)) {
        Ok(t) => format!("{t}"),
        Err(_) => format!("{ns} ns"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_documented_form_parses() {
        assert_eq!(parse("now"), Ok(Instant::Now));
        assert_eq!(parse("@123456"), Ok(Instant::Seq(123_456)));
        assert_eq!(
            parse("mark:before-upgrade"),
            Ok(Instant::Mark("before-upgrade".into()))
        );
        assert_eq!(parse("-10m"), Ok(Instant::Ago(Duration::from_secs(600))));
        assert_eq!(parse("-2h"), Ok(Instant::Ago(Duration::from_secs(7200))));
        assert_eq!(
            parse("-3d"),
            Ok(Instant::Ago(Duration::from_secs(3 * 86_400)))
        );
        assert_eq!(parse("-0s"), Ok(Instant::Ago(Duration::ZERO)));
        let t = 1_764_064_800_250_000_000; // 2025-11-25T10:00:00.25Z
        assert_eq!(parse("2025-11-25T10:00:00.25Z"), Ok(Instant::Time(t)));
        assert_eq!(parse("2025-11-25T11:00:00.25+01:00"), Ok(Instant::Time(t)));
    }

    #[test]
    fn bad_forms_say_what_is_accepted() {
        for s in [
            "",
            "@",
            "@-1",
            "@12x",
            "mark:",
            "mark:a/b",
            "-",
            "-10 parsecs",
            "yesterday",
        ] {
            let e = parse(s).unwrap_err();
            assert!(
                e.contains("RFC 3339") && e.contains("mark:NAME"),
                "{s:?}: {e}"
            );
        }
    }

    #[test]
    fn times_print_as_rfc3339() {
        assert_eq!(
            format_ns(1_764_064_800_250_000_000),
            "2025-11-25T10:00:00.25Z"
        );
        let t = 1_764_064_800_123_456_789;
        assert_eq!(parse(&format_ns(t)), Ok(Instant::Time(t)));
    }
}
