//! What history gives the user, through the real server and real clients (issue 17 M3):
//! snapshot exports as of any instant over NBD and iSCSI, bookmarks, writable scratch
//! exports, diff and activity, rollback and its undo — and the refusals a user meets.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::cli::*;
use common::*;
use serde_json::Value;
use std::time::{Duration, Instant};

/// Waits until `f` holds.
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(60), "never: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn export(s: &Server, args: &[&str]) -> Value {
    let mut a = vec!["snapshot", "export"];
    a.extend_from_slice(args);
    json(s, &a)
}

#[test]
fn an_instant_is_an_export_of_its_own_over_nbd_and_iscsi() {
    require("qemu-io");
    let (_dir, s) = small_server("snap-export");
    let url = s.url("vol0");
    qemu_io(&url, &["write -P 1 0 64k", "write -P 2 1M 4k"]);
    ok(&s, &["history", "mark", "vol0", "stage-a"]);
    qemu_io(
        &url,
        &["write -P 3 0 32k", "write -z 1M 4k", "write -P 4 2M 8k"],
    );
    let newest = json(&s, &["volume", "info", "vol0"])["history"]["newest_seq"]
        .as_u64()
        .unwrap();

    // As of the bookmark: stage A, exactly.
    let a = export(&s, &["vol0", "--at", "mark:stage-a"]);
    assert_eq!(a["export"], "vol0@3", "{a}");
    assert_eq!(a["volume_seq"], 3);
    let nbd = a["nbd"][0].as_str().unwrap().to_string();
    assert_eq!(nbd, s.url("vol0@3"));
    holds(&nbd, 1, "0", "64k");
    holds(&nbd, 2, "1M", "4k");
    holds(&nbd, 0, "2M", "8k");
    // Its allocation is the past's, from the index and the base, not "all data": what stage
    // A wrote is data (type 0), what nothing wrote yet is a hole (3).
    let map = nbd_map(&nbd);
    assert_eq!(types_in(&map, 0, 64 << 10), [0], "{map:?}");
    assert_eq!(types_in(&map, 64 << 10, 4 << 10), [3], "{map:?}");
    assert_eq!(types_in(&map, 1 << 20, 4 << 10), [0], "{map:?}");
    assert_eq!(types_in(&map, 2 << 20, 8 << 10), [3], "{map:?}");
    // The same over iSCSI, with the URL the command printed.
    let iscsi = a["iscsi"][0].as_str().unwrap().to_string();
    assert!(
        iscsi.ends_with("/iqn.2026-11.dev.mariner:vol0:3/0"),
        "{iscsi}"
    );
    holds(&iscsi, 1, "0", "64k");
    holds(&iscsi, 2, "1M", "4k");
    // Read-only: a write fails, the volume is untouched.
    let o = qemu_io_output(&[], &nbd, &["write -P 9 0 4k"]);
    assert!(!qemu_io_succeeded(&o), "{}", output_text(&o));
    holds(&url, 3, "0", "32k");
    holds(&url, 1, "32k", "32k");

    // Every other form of TIME: the write number, the instant before a write, now, relative.
    let b = export(&s, &["vol0", "--at", "@4", "--name", "after-4"]);
    holds(b["nbd"][0].as_str().unwrap(), 3, "0", "32k");
    holds(b["nbd"][0].as_str().unwrap(), 2, "1M", "4k");
    let now = export(&s, &["vol0", "--at", "-0s", "--name", "now"]);
    assert_eq!(now["volume_seq"].as_u64(), Some(newest), "{now}");
    holds(now["nbd"][0].as_str().unwrap(), 4, "2M", "8k");
    holds(now["nbd"][0].as_str().unwrap(), 0, "1M", "4k");
    // Now the write-zeroes reads as zeros (type 2) and the later write as data.
    let map = nbd_map(now["nbd"][0].as_str().unwrap());
    assert_eq!(types_in(&map, 1 << 20, 4 << 10), [2], "{map:?}");
    assert_eq!(types_in(&map, 2 << 20, 8 << 10), [0], "{map:?}");
    assert_eq!(types_in(&map, 4 << 20, 4 << 10), [3], "{map:?}");
    let last = export(
        &s,
        &["vol0", "--at", &format!("@{newest}"), "--name", "last"],
    );
    assert_eq!(last["volume_seq"].as_u64(), Some(newest));
    let t = a["time"].as_str().unwrap().to_string();
    let by_time = export(&s, &["vol0", "--at", &t, "--name", "by-time"]);
    assert_eq!(by_time["volume_seq"], 3, "{by_time}");

    // The list shows them all; removing one ends its export.
    let list = json(&s, &["snapshot", "list"]);
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["export"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "vol0@3",
            "vol0@after-4",
            "vol0@by-time",
            "vol0@last",
            "vol0@now"
        ]
    );
    ok(&s, &["snapshot", "remove", "vol0@after-4"]);
    let o = qemu_io_output(&[], &s.url("vol0@after-4"), &["read 0 4k"]);
    assert!(!qemu_io_succeeded(&o));

    // What a user gets wrong is refused with a message that says why.
    refused(
        &s,
        &["snapshot", "export", "vol0", "--at", "yesterday"],
        "RFC 3339",
    );
    refused(
        &s,
        &["snapshot", "export", "vol0", "--at", "@999999"],
        "outside volume vol0's history",
    );
    refused(
        &s,
        &["snapshot", "export", "vol0", "--at", "-30d"],
        "outside volume vol0's history",
    );
    refused(
        &s,
        &["snapshot", "export", "vol0", "--at", "2999-01-01T00:00:00Z"],
        "in the future",
    );
    refused(
        &s,
        &["snapshot", "export", "vol0", "--at", "mark:nope"],
        "bookmark",
    );
    refused(
        &s,
        &["snapshot", "export", "vol0", "--at", "@3"],
        "already exists",
    );
    refused(
        &s,
        &["snapshot", "export", "nope", "--at", "now"],
        "no volume",
    );
    refused(&s, &["volume", "delete", "vol0"], "snapshot exports");
    refused(
        &s,
        &["history", "mark", "vol0", "stage-a"],
        "already exists",
    );
}

#[test]
fn exports_and_their_scratch_writes_survive_a_restart_and_go_with_remove() {
    require("qemu-io");
    let (_dir, mut s) = small_server("snap-scratch");
    let url = s.url("vol0");
    qemu_io(&url, &["write -P 5 0 1M"]);
    let x = export(&s, &["vol0", "--at", "now", "--scratch", "--name", "try"]);
    let sx = x["nbd"][0].as_str().unwrap().to_string();
    // Writes land in the overlay, partial pages merged with the past; the volume never sees them.
    qemu_io(
        &sx,
        &[
            "write -P 6 4k 8k",
            "write -P 7 100000 1000",
            "write -z 512k 64k",
        ],
    );
    qemu_io(&sx, &["flush"]);
    holds(&sx, 5, "0", "4k");
    holds(&sx, 6, "4k", "8k");
    holds(&sx, 7, "100000", "1000");
    holds(&sx, 0, "512k", "64k");
    holds(&url, 5, "0", "1M");
    // The scratch's pages are data over the past's map.
    let map = nbd_map(&sx);
    assert_eq!(types_in(&map, 0, 1 << 20), [0], "{map:?}");
    assert_eq!(types_in(&map, 1 << 20, 4 << 10), [3], "{map:?}");
    let ro = export(&s, &["vol0", "--at", "now", "--name", "ro"]);
    assert_eq!(ro["export"], "vol0@ro");
    s.restart_after_kill9(SMALL);
    // Both exports are back (on the new port); the scratch writes flushed before the kill are
    // there.
    let sx = s.url("vol0@try");
    holds(&sx, 6, "4k", "8k");
    holds(&sx, 7, "100000", "1000");
    holds(&s.url("vol0@ro"), 5, "0", "1M");
    let list = json(&s, &["snapshot", "list"]);
    assert_eq!(list.as_array().unwrap().len(), 2, "{list}");
    assert!(
        list[1]["scratch_bytes"].as_u64().unwrap() >= 64 << 10,
        "{list}"
    );
    // Removing the export throws its writes away.
    ok(&s, &["snapshot", "remove", "vol0@try"]);
    let scratch_dir = s.data.join("volumes/vol0/scratch");
    assert!(
        std::fs::read_dir(&scratch_dir).map_or(true, |mut d| d.next().is_none()),
        "scratch file left behind"
    );
    ok(&s, &["snapshot", "remove", "vol0@ro"]);
    ok(&s, &["volume", "delete", "vol0"]);
}

#[test]
fn diff_history_and_a_rollback_that_can_be_undone() {
    require("qemu-io");
    let (_dir, s) = small_server("snap-rollback");
    let url = s.url("vol0");
    qemu_io(&url, &["write -P 1 0 256k", "write -P 1 4M 64k"]);
    ok(&s, &["history", "mark", "vol0", "a"]);
    qemu_io(
        &url,
        &[
            "write -P 2 64k 64k",
            "write -z 4M 64k",
            "write -P 3 8M 128k",
        ],
    );
    ok(&s, &["history", "mark", "vol0", "b"]);

    // diff: exactly the extents written since A, from the digests.
    let d = json(&s, &["diff", "vol0", "--from", "mark:a", "--to", "mark:b"]);
    let extents: Vec<(u64, u64)> = d["extents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["offset"].as_u64().unwrap(), e["length"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        extents,
        [
            (64 << 10, 64 << 10),
            (4 << 20, 64 << 10),
            (8 << 20, 128 << 10)
        ],
        "{d}"
    );
    assert_eq!(d["writes"], 2, "{d}");
    assert_eq!(d["zeroings"], 1, "{d}");
    let text = ok(&s, &["diff", "vol0", "--from", "mark:a"]);
    assert!(text.contains("3 extent(s)"), "{text}");
    // history: every write of the window, in buckets that add up.
    let h = json(&s, &["history", "vol0"]);
    assert_eq!(
        (h["writes"].as_u64(), h["zeroings"].as_u64()),
        (Some(4), Some(1)),
        "{h}"
    );
    let sum = |k: &str| -> u64 {
        h["buckets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b[k].as_u64().unwrap())
            .sum()
    };
    assert_eq!(
        (sum("writes"), sum("write_bytes")),
        (4, (256 + 64 + 64 + 128) << 10),
        "{h}"
    );
    assert!(ok(&s, &["history", "vol0", "--from", "mark:a"]).contains('#'));

    // Rollback to A: the volume equals A again.
    let lines = ok(&s, &["rollback", "vol0", "--to", "mark:a", "--json"]);
    let last: Value = serde_json::from_str(lines.lines().last().unwrap()).unwrap();
    assert_eq!(last["finished"], true, "{lines}");
    holds(&url, 1, "0", "256k");
    holds(&url, 1, "4M", "64k");
    holds(&url, 0, "8M", "128k");
    // It is itself history: rolling back to the instant before it undoes it.
    let from = last["from"]["volume_seq"].as_u64().unwrap();
    let text = ok(&s, &["rollback", "vol0", "--to", &format!("@{from}")]);
    assert!(
        text.contains("undo with: mariner rollback vol0 --to @"),
        "{text}"
    );
    holds(&url, 1, "0", "64k");
    holds(&url, 2, "64k", "64k");
    holds(&url, 0, "4M", "64k");
    holds(&url, 3, "8M", "128k");

    // Refused while a client is connected, unless forced.
    let mut held = std::process::Command::new("qemu-io")
        .args(["-f", "raw", &url])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    eventually("the client is connected", || {
        json(&s, &["volume", "info", "vol0"])["connections"].as_u64() == Some(1)
    });
    refused(
        &s,
        &["rollback", "vol0", "--to", "mark:a"],
        "connected client",
    );
    let _ = held.kill();
    let _ = held.wait();
}

#[test]
fn an_export_the_log_shrinks_past_is_marked_expired_and_fails_with_eio() {
    require("qemu-io");
    let (_dir, s) = small_server("snap-expired");
    let url = s.url("vol0");
    qemu_io(&url, &["write -P 1 0 1M"]);
    let x = export(&s, &["vol0", "--at", "now", "--name", "old"]);
    holds(x["nbd"][0].as_str().unwrap(), 1, "0", "1M");
    // Three times what the 64 MiB log holds, at a rate the disk takes three times over (as
    // `a_log_full_before_the_window_ends_shrinks_history_loudly_not_the_writes`): history
    // must shrink past the pinned instant — shrinking never waits for a forgotten export —
    // and keep pace with the log (never cut).
    require("fio");
    fio_fill(&url, "32M", "192M", &["--rate=32m"]);
    eventually("the export is marked expired", || {
        json(&s, &["snapshot", "list"])[0]["expired"].is_string()
    });
    assert!(s.metric("mariner_history_shrinks_total") > 0.0);
    assert_eq!(s.metric("mariner_history_cuts_total"), 0.0, "{}", s.log());
    let list = ok(&s, &["snapshot", "list"]);
    assert!(list.contains("expired"), "{list}");
    assert!(s.metric("mariner_snapshot_exports_expired") >= 1.0);
    // Its reads fail with EIO, never with other data.
    let o = qemu_io_output(&["-r"], &s.url("vol0@old"), &["read -P 1 0 4k"]);
    let text = output_text(&o);
    assert!(
        !qemu_io_succeeded(&o) && text.contains("Input/output error"),
        "{text}"
    );
    ok(&s, &["snapshot", "remove", "vol0@old"]);
}
