//! `/metrics`: Prometheus text exposition format 0.0.4.

use std::fmt::Write;
use std::sync::atomic::Ordering::Relaxed;

use mariner_log::Histogram;

use crate::Node;

/// Renders every metric of the node.
pub fn render(node: &Node) -> String {
    let mut out = String::new();
    log_metrics(&mut out, node);
    store_metrics(&mut out, node);
    volume_metrics(&mut out, node);
    limit_metrics(&mut out, node);
    history_metrics(&mut out, node);
    let r = &node.recovery;
    gauge(
        &mut out,
        "mariner_recovery_seconds",
        "Time the last start-up recovery took.",
        r.elapsed_ms / 1000.0,
    );
    gauge(
        &mut out,
        "mariner_recovery_records",
        "Records replayed by the last recovery.",
        r.records_replayed as f64,
    );
    out
}

fn log_metrics(out: &mut String, node: &Node) {
    let s = node.log().stats();
    counter(
        out,
        "mariner_log_records_total",
        "Records made durable.",
        s.records.load(Relaxed),
    );
    counter(
        out,
        "mariner_log_batches_total",
        "Physical log writes.",
        s.batches.load(Relaxed),
    );
    counter(
        out,
        "mariner_log_bytes_written_total",
        "Bytes written to log devices.",
        s.bytes_written.load(Relaxed),
    );
    histogram(
        out,
        "mariner_log_batch_records",
        "Records per physical write.",
        &s.batch_records,
        1.0,
    );
    histogram(
        out,
        "mariner_ack_latency_seconds",
        "Time from a write's arrival at the log to its acknowledgement.",
        &s.ack_latency_us,
        1e-6,
    );
    histogram(
        out,
        "mariner_log_device_write_seconds",
        "Time of one physical log write including its sync.",
        &s.device_write_us,
        1e-6,
    );
    let used = s.segments_used.load(Relaxed) as f64;
    let total = s.segments_total.load(Relaxed).max(1) as f64;
    gauge(
        out,
        "mariner_log_fill_ratio",
        "Share of log segments not yet reusable.",
        used / total,
    );
    gauge(
        out,
        "mariner_log_stalled_writes",
        "Writes waiting for log space.",
        s.stalled.load(Relaxed) as f64,
    );
    gauge(
        out,
        "mariner_log_durable_seq",
        "Highest durable sequence number.",
        s.durable_seq.load(Relaxed) as f64,
    );
    holder_metrics(out, node);
    let failed = if node.log().failure().is_some() {
        1.0
    } else {
        0.0
    };
    gauge(
        out,
        "mariner_log_failed",
        "1 when the log failed and volumes are read-only.",
        failed,
    );
}

/// Each holder of log space (the store; history and replicas later): its watermark, the
/// segments it keeps from reuse, and the segments let go of past it (history shrinking).
fn holder_metrics(out: &mut String, node: &Node) {
    let holders = node.log().holders();
    let families: [(&str, &str, &str); 3] = [
        (
            "mariner_log_holder_released_seq",
            "gauge",
            "Sequence number at or below which the holder no longer needs log records.",
        ),
        (
            "mariner_log_holder_segments",
            "gauge",
            "Log segments holding records the holder has not released.",
        ),
        (
            "mariner_log_holder_cuts_total",
            "counter",
            "Log segments let go of before the holder released them (history shrinking, a \
             replica falling back to a resync).",
        ),
    ];
    for (name, kind, help) in families {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for h in &holders {
            let value = match name {
                "mariner_log_holder_released_seq" => h.released(),
                "mariner_log_holder_segments" => h.segments_held(),
                _ => h.cuts(),
            };
            let _ = writeln!(out, "{name}{{holder=\"{}\"}} {value}", h.name());
        }
    }
}

fn store_metrics(out: &mut String, node: &Node) {
    let s = node.store().stats();
    let durable = node.log().stats().durable_seq.load(Relaxed);
    let applied = s.applied_seq.load(Relaxed);
    gauge(
        out,
        "mariner_apply_lag_records",
        "Durable records not yet applied to the images.",
        durable.saturating_sub(applied) as f64,
    );
    gauge(
        out,
        "mariner_store_applied_seq",
        "Highest sequence number applied.",
        applied as f64,
    );
    gauge(
        out,
        "mariner_store_synced_seq",
        "Highest sequence number synced in the images.",
        s.synced_seq.load(Relaxed) as f64,
    );
    counter(
        out,
        "mariner_store_applied_bytes_total",
        "Bytes applied to images.",
        s.applied_bytes.load(Relaxed),
    );
    counter(
        out,
        "mariner_store_syncs_total",
        "Image syncs.",
        s.syncs.load(Relaxed),
    );
    counter(
        out,
        "mariner_store_log_reads_total",
        "Records read back from the log.",
        s.log_reads.load(Relaxed),
    );
    gauge(
        out,
        "mariner_store_queued_records",
        "Records waiting to be applied.",
        s.queued_records.load(Relaxed) as f64,
    );
    let failed = if node.store().failure().is_some() {
        1.0
    } else {
        0.0
    };
    gauge(
        out,
        "mariner_store_failed",
        "1 when applying failed and volumes are read-only.",
        failed,
    );
}

fn limit_metrics(out: &mut String, node: &Node) {
    let l = node.limits();
    let caps = l.config();
    gauge(
        out,
        "mariner_connections_open",
        "Client connections open (NBD and iSCSI).",
        l.connections_open() as f64,
    );
    gauge(
        out,
        "mariner_connections_max",
        "Connections allowed at once (limits.max_connections).",
        f64::from(caps.max_connections),
    );
    counter(
        out,
        "mariner_connections_refused_total",
        "Connections closed at once because limits.max_connections was reached.",
        l.refused_total(),
    );
    gauge(
        out,
        "mariner_payload_in_flight_bytes",
        "Request payload bytes buffered now (all connections).",
        l.in_flight_bytes() as f64,
    );
    gauge(
        out,
        "mariner_payload_budget_bytes",
        "Request payload bytes allowed in flight (limits.max_in_flight_bytes).",
        f64::from(caps.max_in_flight_bytes),
    );
}

fn volume_metrics(out: &mut String, node: &Node) {
    let names = node.volume_names();
    let families: [(&str, &str, &str); 7] = [
        ("mariner_volume_reads_total", "counter", "Read requests."),
        ("mariner_volume_read_bytes_total", "counter", "Bytes read."),
        ("mariner_volume_writes_total", "counter", "Write requests."),
        (
            "mariner_volume_write_bytes_total",
            "counter",
            "Bytes written.",
        ),
        (
            "mariner_volume_zeroings_elided_total",
            "counter",
            "Trims and write-zeroes of whole blocks that already read as zeros: acknowledged \
             without a log record.",
        ),
        (
            "mariner_volume_read_only",
            "gauge",
            "1 when the volume refuses writes after an I/O error or for want of space.",
        ),
        (
            "mariner_volume_out_of_space",
            "gauge",
            "1 while the volume's writes get ENOSPC: its image's file system is full.",
        ),
    ];
    for (name, kind, help) in families {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for v in names.iter().filter_map(|n| node.volume(n)) {
            let st = &v.stats;
            let value = match name {
                "mariner_volume_reads_total" => st.reads.load(Relaxed),
                "mariner_volume_read_bytes_total" => st.read_bytes.load(Relaxed),
                "mariner_volume_writes_total" => st.writes.load(Relaxed),
                "mariner_volume_write_bytes_total" => st.write_bytes.load(Relaxed),
                "mariner_volume_zeroings_elided_total" => st.zeroings_elided.load(Relaxed),
                "mariner_volume_out_of_space" => u64::from(v.out_of_space().is_some()),
                _ => u64::from(v.failure().or_else(|| v.out_of_space()).is_some()),
            };
            let _ = writeln!(out, "{name}{{volume=\"{}\"}} {value}", v.meta().name);
        }
    }
}

fn counter(out: &mut String, name: &str, help: &str, v: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
    );
}

fn gauge(out: &mut String, name: &str, help: &str, v: f64) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
}

/// A histogram whose bucket bounds are multiplied by `scale` (e.g. µs → s).
fn histogram(out: &mut String, name: &str, help: &str, h: &Histogram, scale: f64) {
    let (buckets, sum, count) = h.snapshot();
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
    for (bound, cumulative) in buckets {
        let _ = writeln!(
            out,
            "{name}_bucket{{le=\"{}\"}} {cumulative}",
            bound as f64 * scale
        );
    }
    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
    let _ = writeln!(out, "{name}_sum {}", sum as f64 * scale);
    let _ = writeln!(out, "{name}_count {count}");
}

/// History (docs/ARCHITECTURE.md "History"): the window each volume can be read back over,
/// against the one configured; how far indexing and the base images are behind; shrinking.
fn history_metrics(out: &mut String, node: &Node) {
    let Some(h) = node.history() else {
        return;
    };
    let s = h.stats();
    let now = crate::node::now_ns();
    let configured = h.configured_window().as_secs_f64();
    gauge(
        out,
        "mariner_history_configured_window_seconds",
        "The protection window asked for ([history] window).",
        configured,
    );
    let _ = writeln!(
        out,
        "# HELP mariner_history_window_seconds How far back each volume can be read now: below \
         the configured window when the log filled first (history shrank) or history is younger.\n\
         # TYPE mariner_history_window_seconds gauge"
    );
    let mut base_lag: f64 = 0.0;
    for name in node.volume_names() {
        let Some(info) = node.volume_info(&name).and_then(|i| i.history) else {
            continue;
        };
        let _ = writeln!(
            out,
            "mariner_history_window_seconds{{volume=\"{name}\"}} {}",
            info.effective_window_s
        );
        base_lag = base_lag.max(info.effective_window_s - info.configured_window_s);
    }
    gauge(
        out,
        "mariner_history_base_lag_seconds",
        "How far the oldest base image is behind the window's start (roll-forward lag).",
        base_lag.max(0.0),
    );
    let (records, age_ns) = h.lag(now);
    gauge(
        out,
        "mariner_history_index_lag_records",
        "Durable records not yet indexed.",
        records as f64,
    );
    gauge(
        out,
        "mariner_history_index_lag_seconds",
        "Age of the oldest durable record not yet indexed.",
        age_ns as f64 / 1e9,
    );
    gauge(
        out,
        "mariner_history_index_bytes",
        "Bytes of index leaves in use.",
        h.index_bytes() as f64,
    );
    for (name, help, v) in [
        (
            "mariner_history_records_indexed_total",
            "Records indexed.",
            &s.records_indexed,
        ),
        (
            "mariner_history_index_keys_total",
            "Index keys inserted (aligned pieces of records).",
            &s.keys_inserted,
        ),
        (
            "mariner_history_rolled_bytes_total",
            "Bytes applied to base images as records left the window.",
            &s.rolled_bytes,
        ),
        (
            "mariner_history_roll_forwards_total",
            "Roll-forwards of the base images.",
            &s.roll_forwards,
        ),
        (
            "mariner_history_shrinks_total",
            "Roll-forwards made before records left the window because the log was filling.",
            &s.shrinks,
        ),
        (
            "mariner_history_cuts_total",
            "Times the log let go of records the base images did not have (history broken \
             until seeded again).",
            &s.cuts,
        ),
        (
            "mariner_history_seeds_total",
            "Base images copied from a volume's current image (history started, or started \
             again after a cut or a declared gap).",
            &s.seeds,
        ),
        (
            "mariner_history_gaps_total",
            "Gaps declared in a volume's history (writes history never saw) that started its \
             history again.",
            &s.gaps,
        ),
        (
            "mariner_history_index_rebuilds_total",
            "Starts that found the history index damaged by a crash (a torn leaf) and rebuilt \
             it from the digests.",
            &s.index_rebuilds,
        ),
    ] {
        counter(out, name, help, v.load(Relaxed));
    }
    let b = h.index_engine_stats();
    for (name, help, v) in [
        (
            "mariner_history_index_modifications_total",
            "Modifications queued in the index engine (inserts and deletes of keys).",
            &b.modifications,
        ),
        (
            "mariner_history_index_blocks_written_total",
            "Index leaves written by its commits (also double-written on an index formatted \
             with a double-write area): with the modifications, how many a leaf write carries.",
            &b.blocks_written,
        ),
        (
            "mariner_history_index_forced_commits_total",
            "Index commits forced by a full memory budget (indexing waited for them).",
            &b.forced_commits,
        ),
    ] {
        counter(out, name, help, v.load(Relaxed));
    }
    let cpu = h.cpu_class();
    gauge(
        out,
        "mariner_history_background_cpu",
        "1 while history's threads are in the idle CPU class (it keeps pace with the log), 0 \
         while they compete with the write path to catch up.",
        if cpu.is_background() { 1.0 } else { 0.0 },
    );
    counter(
        out,
        "mariner_history_cpu_class_changes_total",
        "Moves of history's threads between the idle and the normal CPU class.",
        cpu.changes(),
    );
    user_metrics(out, node);
}

/// Snapshot exports and rollbacks.
fn user_metrics(out: &mut String, node: &Node) {
    let snaps = node.snapshot_infos();
    gauge(
        out,
        "mariner_snapshot_exports",
        "Snapshot exports (mariner snapshot list).",
        snaps.len() as f64,
    );
    gauge(
        out,
        "mariner_snapshot_exports_expired",
        "Snapshot exports whose instant history no longer holds (their reads fail with EIO).",
        snaps.iter().filter(|s| s.expired.is_some()).count() as f64,
    );
    let runs: Vec<_> = node
        .volume_names()
        .into_iter()
        .filter_map(|n| node.rollback_info(&n))
        .collect();
    if runs.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "# HELP mariner_rollback_bytes Bytes a volume's running or last rollback wrote, and has \
         to write in all.\n# TYPE mariner_rollback_bytes gauge"
    );
    for r in &runs {
        let v = &r.volume;
        let _ = writeln!(
            out,
            "mariner_rollback_bytes{{volume=\"{v}\",of=\"done\"}} {}",
            r.done_bytes
        );
        let _ = writeln!(
            out,
            "mariner_rollback_bytes{{volume=\"{v}\",of=\"total\"}} {}",
            r.total_bytes
        );
    }
}
