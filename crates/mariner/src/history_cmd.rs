//! `mariner snapshot`, `mariner history`, `mariner diff` and `mariner rollback`: the past of a
//! volume, through the admin API of a running server.

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use serde_json::{json, Value};

use crate::client::{self, encode};
use crate::{checked, Target};

/// How TIME is written, for every `--at`, `--from` and `--to`.
const TIME_HELP: &str = "TIME: an RFC 3339 time (2026-11-25T10:00:00.25Z), a time before now \
                         (-10m, -2h, -3d), a write number (@123456), a bookmark (mark:NAME) \
                         or now";

#[derive(Subcommand)]
pub enum SnapshotCmd {
    /// Make a volume as of an instant an export of its own (NBD and iSCSI), read-only unless
    /// --scratch. Copies nothing: it is ready at once, and holds its instant while it exists.
    #[command(after_help = TIME_HELP)]
    Export {
        volume: String,
        /// The instant to export.
        #[arg(long, allow_hyphen_values = true)]
        at: String,
        /// Writable: writes go to a throwaway overlay ([history] scratch_max), discarded on
        /// remove; the volume and its history never see them.
        #[arg(long)]
        scratch: bool,
        /// The snapshot's name: the export is VOLUME@NAME [default: the instant's write
        /// number].
        #[arg(long)]
        name: Option<String>,
        #[command(flatten)]
        target: Target,
    },
    /// List snapshot exports.
    List {
        #[command(flatten)]
        target: Target,
    },
    /// Remove a snapshot export (VOLUME@NAME) and its scratch writes; refused while clients
    /// are connected to it.
    Remove {
        export: String,
        #[command(flatten)]
        target: Target,
    },
}

/// `mariner history VOL`: writes and bytes over time; or a bookmark subcommand.
#[derive(Args)]
#[command(args_conflicts_with_subcommands = true, after_help = TIME_HELP)]
pub struct HistoryArgs {
    #[command(subcommand)]
    cmd: Option<HistoryCmd>,
    /// The volume whose writes to show.
    volume: Option<String>,
    /// From this instant [default: the oldest kept].
    #[arg(long, allow_hyphen_values = true)]
    from: Option<String>,
    /// To this instant [default: now].
    #[arg(long, allow_hyphen_values = true)]
    to: Option<String>,
    /// Bars in the histogram.
    #[arg(long, default_value_t = 20)]
    buckets: u32,
    #[command(flatten)]
    target: Target,
}

#[derive(Subcommand)]
enum HistoryCmd {
    /// Bookmark an instant of a volume (use it as mark:NAME wherever a TIME is asked for).
    #[command(after_help = TIME_HELP)]
    Mark {
        volume: String,
        name: String,
        /// The instant to bookmark [default: now, the newest write].
        #[arg(long, allow_hyphen_values = true)]
        at: Option<String>,
        #[command(flatten)]
        target: Target,
    },
    /// List a volume's bookmarks.
    Marks {
        volume: String,
        #[command(flatten)]
        target: Target,
    },
    /// Remove a bookmark.
    Unmark {
        volume: String,
        name: String,
        #[command(flatten)]
        target: Target,
    },
}

/// `mariner diff`.
#[derive(Args)]
#[command(after_help = TIME_HELP)]
pub struct DiffArgs {
    volume: String,
    /// From this instant.
    #[arg(long, allow_hyphen_values = true)]
    from: String,
    /// To this instant [default: now].
    #[arg(long, allow_hyphen_values = true, default_value = "now")]
    to: String,
    #[command(flatten)]
    target: Target,
}

/// `mariner rollback`.
#[derive(Args)]
#[command(after_help = TIME_HELP)]
pub struct RollbackArgs {
    volume: String,
    /// The instant to roll back to.
    #[arg(long, allow_hyphen_values = true)]
    to: String,
    /// Go ahead although clients are connected (they see the volume change under them).
    /// Without it, a rollback waits up to 2 s for clients that are disconnecting, then
    /// refuses while any is still connected.
    #[arg(long)]
    force: bool,
    #[command(flatten)]
    target: Target,
}

fn pretty(v: &Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

fn s<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or("?")
}

fn n(v: &Value, k: &str) -> u64 {
    v.get(k).and_then(Value::as_u64).unwrap_or(0)
}

fn iec(b: u64) -> String {
    bytesize::ByteSize(b).display().iec().to_string()
}

pub fn snapshot(c: SnapshotCmd) -> Result<ExitCode, String> {
    match c {
        SnapshotCmd::Export {
            volume,
            at,
            scratch,
            name,
            target,
        } => {
            let mut body = json!({ "at": at, "scratch": scratch });
            if let Some(name) = name {
                body["name"] = json!(name);
            }
            let path = format!("/v1/volumes/{}/snapshots", checked(&volume)?);
            let v = client::request(&target.data, "POST", &path, Some(&body))?;
            if target.json {
                pretty(&v);
            } else {
                print!("{}", export_text(&v));
            }
        }
        SnapshotCmd::List { target } => {
            let v = client::request(&target.data, "GET", "/v1/snapshots", None)?;
            if target.json {
                pretty(&v);
            } else {
                print!("{}", snapshot_table(&v));
            }
        }
        SnapshotCmd::Remove { export, target } => {
            let path = format!("/v1/snapshots/{}", encode(&export));
            client::request(&target.data, "DELETE", &path, None)?;
            println!("removed {export}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn export_text(v: &Value) -> String {
    let mut out = String::new();
    let mode = if v.get("scratch").and_then(Value::as_bool) == Some(true) {
        "writable (scratch overlay)"
    } else {
        "read-only"
    };
    let _ = writeln!(
        out,
        "exported {} as of {} (write @{}), {mode}",
        s(v, "volume"),
        s(v, "time"),
        n(v, "volume_seq")
    );
    for (label, key) in [("NBD:  ", "nbd"), ("iSCSI:", "iscsi")] {
        for url in v.get(key).and_then(Value::as_array).into_iter().flatten() {
            let _ = writeln!(out, "  {label} {}", url.as_str().unwrap_or("?"));
        }
    }
    let _ = writeln!(
        out,
        "remove it with: mariner snapshot remove {}",
        s(v, "export")
    );
    out
}

fn snapshot_table(v: &Value) -> String {
    let rows = v.as_array().cloned().unwrap_or_default();
    let w = rows
        .iter()
        .map(|r| s(r, "export").len())
        .max()
        .unwrap_or(0)
        .max(6);
    let mut out = format!(
        "{:<w$} {:<24} {:>10} {:>5}  STATE\n",
        "EXPORT", "AS OF", "SCRATCH", "CONNS"
    );
    for r in &rows {
        let scratch = if r.get("scratch").and_then(Value::as_bool) == Some(true) {
            iec(n(r, "scratch_bytes"))
        } else {
            "-".into()
        };
        let state = r.get("expired").and_then(Value::as_str).unwrap_or("ok");
        let _ = writeln!(
            out,
            "{:<w$} {:<24} {:>10} {:>5}  {state}",
            s(r, "export"),
            s(r, "time"),
            scratch,
            n(r, "connections"),
        );
    }
    out
}

pub fn history(a: HistoryArgs) -> Result<ExitCode, String> {
    if let Some(cmd) = a.cmd {
        return bookmarks(cmd);
    }
    let volume = a
        .volume
        .ok_or("give a volume: mariner history VOLUME (see --help)")?;
    let target = a.target;
    let mut path = format!(
        "/v1/volumes/{}/activity?buckets={}",
        checked(&volume)?,
        a.buckets
    );
    for (k, t) in [("from", &a.from), ("to", &a.to)] {
        if let Some(t) = t {
            let _ = write!(path, "&{k}={}", encode(t));
        }
    }
    let v = client::request(&target.data, "GET", &path, None)?;
    if target.json {
        pretty(&v);
    } else {
        print!("{}", activity_text(&volume, &v));
    }
    Ok(ExitCode::SUCCESS)
}

fn activity_text(volume: &str, v: &Value) -> String {
    let mut out = String::new();
    let from = v.get("from").cloned().unwrap_or_default();
    let to = v.get("to").cloned().unwrap_or_default();
    let _ = writeln!(
        out,
        "{volume}: {} writes ({}), {} trims/zeroings ({}) from {} (@{}) to {} (@{})",
        n(v, "writes"),
        iec(n(v, "write_bytes")),
        n(v, "zeroings"),
        iec(n(v, "zeroed_bytes")),
        s(&from, "time"),
        n(&from, "volume_seq"),
        s(&to, "time"),
        n(&to, "volume_seq"),
    );
    let buckets = v
        .get("buckets")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let most = buckets
        .iter()
        .map(|b| n(b, "write_bytes") + n(b, "zeroed_bytes"))
        .max()
        .unwrap_or(0);
    const WIDTH: u64 = 40;
    for b in &buckets {
        let bytes = n(b, "write_bytes") + n(b, "zeroed_bytes");
        let bar = if most == 0 {
            0
        } else {
            (bytes * WIDTH).div_ceil(most)
        };
        let _ = writeln!(
            out,
            "{:<24} {:>8} writes {:>11}  {}",
            s(b, "start"),
            n(b, "writes"),
            iec(bytes),
            "#".repeat(bar as usize)
        );
    }
    out
}

fn bookmarks(cmd: HistoryCmd) -> Result<ExitCode, String> {
    match cmd {
        HistoryCmd::Mark {
            volume,
            name,
            at,
            target,
        } => {
            let mut body = json!({ "name": name });
            if let Some(at) = at {
                body["at"] = json!(at);
            }
            let path = format!("/v1/volumes/{}/marks", checked(&volume)?);
            let v = client::request(&target.data, "POST", &path, Some(&body))?;
            if target.json {
                pretty(&v);
            } else {
                println!(
                    "bookmarked {volume} as of {} (write @{}) as mark:{name}",
                    s(&v, "time"),
                    n(&v, "volume_seq")
                );
            }
        }
        HistoryCmd::Marks { volume, target } => {
            let path = format!("/v1/volumes/{}/marks", checked(&volume)?);
            let v = client::request(&target.data, "GET", &path, None)?;
            if target.json {
                pretty(&v);
            } else {
                println!("{:<24} {:<24} {:>10}  STATE", "MARK", "AS OF", "WRITE");
                for m in v.as_array().into_iter().flatten() {
                    let state = if m.get("readable").and_then(Value::as_bool) == Some(true) {
                        "ok"
                    } else {
                        "outside the window"
                    };
                    println!(
                        "{:<24} {:<24} {:>10}  {state}",
                        s(m, "name"),
                        s(m, "time"),
                        format!("@{}", n(m, "volume_seq"))
                    );
                }
            }
        }
        HistoryCmd::Unmark {
            volume,
            name,
            target,
        } => {
            let path = format!("/v1/volumes/{}/marks/{}", checked(&volume)?, encode(&name));
            client::request(&target.data, "DELETE", &path, None)?;
            println!("removed mark:{name} of {volume}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn diff(a: DiffArgs) -> Result<ExitCode, String> {
    let path = format!(
        "/v1/volumes/{}/diff?from={}&to={}",
        checked(&a.volume)?,
        encode(&a.from),
        encode(&a.to)
    );
    let v = client::request(&a.target.data, "GET", &path, None)?;
    if a.target.json {
        pretty(&v);
        return Ok(ExitCode::SUCCESS);
    }
    let from = v.get("from").cloned().unwrap_or_default();
    let to = v.get("to").cloned().unwrap_or_default();
    let extents = v
        .get("extents")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    println!(
        "{}: {} changed in {} extent(s) from {} (@{}) to {} (@{}) by {} writes and {} trims/zeroings",
        a.volume,
        iec(n(&v, "changed_bytes")),
        extents.len(),
        s(&from, "time"),
        n(&from, "volume_seq"),
        s(&to, "time"),
        n(&to, "volume_seq"),
        n(&v, "writes"),
        n(&v, "zeroings"),
    );
    println!("{:>16} {:>16}", "OFFSET", "LENGTH");
    for e in &extents {
        println!("{:>16} {:>16}", n(e, "offset"), n(e, "length"));
    }
    Ok(ExitCode::SUCCESS)
}

pub fn rollback(a: RollbackArgs) -> Result<ExitCode, String> {
    let path = format!("/v1/volumes/{}/rollback", checked(&a.volume)?);
    let body = json!({ "to": a.to, "force": a.force });
    let mut v = client::request(&a.target.data, "POST", &path, Some(&body))?;
    let json_lines = a.target.json;
    let bar = (!json_lines && std::io::IsTerminal::is_terminal(&std::io::stderr())).then(|| {
        let b = indicatif::ProgressBar::new(n(&v, "total_bytes"));
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "rolling back {msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b.set_message(a.volume.clone());
        b
    });
    loop {
        if json_lines {
            println!("{v}");
        }
        if let Some(b) = &bar {
            b.set_length(n(&v, "total_bytes"));
            b.set_position(n(&v, "done_bytes"));
        }
        if let Some(e) = v.get("error").and_then(Value::as_str) {
            if let Some(b) = &bar {
                b.abandon();
            }
            return Err(format!("rollback of {} failed: {e}", a.volume));
        }
        if v.get("finished").and_then(Value::as_bool) == Some(true) {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
        v = client::request(&a.target.data, "GET", &path, None)?;
    }
    if let Some(b) = &bar {
        b.finish();
    }
    if !json_lines {
        let to = v.get("to").cloned().unwrap_or_default();
        let from = v.get("from").cloned().unwrap_or_default();
        println!(
            "rolled {} back to {} (write @{}): rewrote {}",
            a.volume,
            s(&to, "time"),
            n(&to, "volume_seq"),
            iec(n(&v, "total_bytes")),
        );
        println!(
            "undo with: mariner rollback {} --to @{}",
            a.volume,
            n(&from, "volume_seq")
        );
    }
    Ok(ExitCode::SUCCESS)
}
