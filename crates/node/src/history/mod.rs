//! History in the node: opened beside the store, fed by the same durable records, holding
//! log space as a shrinkable holder (or a must-hold one under `policy = "throttle"`), and
//! seeded at start-up for volumes it did not follow (history turned on later, or broken),
//! and again while serving for a volume whose history broke (reseed.rs).

pub mod instant;
mod marks;
mod queries;
pub(crate) mod reseed;
mod resolve;
mod rollback;

pub use queries::{ActivityInfo, DiffInfo, PointInfo};
pub use resolve::MarkInfo;
pub use rollback::RollbackInfo;
pub(crate) use rollback::Rollbacks;

use std::collections::BTreeMap;
use std::sync::Arc;

use mariner_disk::Disk;
use mariner_history::files::DirFiles;
use mariner_history::{DigestEntry, History, HistoryConfig, IndexConfig, SeedPoint};
use mariner_log::{Durable, DurableSink, HoldKind, Log, Recovery};

use crate::config::{Config, HistoryPolicy};
use crate::datadir::{DataDir, VolumeMeta};
use crate::NodeError;

/// Hands each durable record to every consumer, in order (the store first: reads of the
/// current image must see a write before history does).
pub(crate) struct Tee(pub Vec<Arc<dyn DurableSink>>);

impl DurableSink for Tee {
    fn durable(&self, records: &[Durable]) {
        for s in &self.0 {
            s.durable(records);
        }
    }
}

fn err(e: mariner_history::HistoryError) -> NodeError {
    NodeError::Io(format!("history: {e}"))
}

/// Runs `f` on a thread of its own: history's index (BOSC in own-log mode) waits for its log
/// by blocking, which a tokio runtime thread — where a node may be opened or shut down — does
/// not allow.
pub(crate) fn off_runtime<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| match s.spawn(f).join() {
        Ok(v) => v,
        Err(panic) => std::panic::resume_unwind(panic),
    })
}

/// The history configuration `[history]` asks for.
pub(crate) fn config(cfg: &Config) -> HistoryConfig {
    let h = &cfg.history;
    HistoryConfig {
        window: h.window,
        min_window: h.min_window,
        index: IndexConfig {
            block_count: h.index_size.as_u64() / 4096,
            block_bytes: 4096,
            memory_budget_bytes: usize::try_from(h.index_memory.as_u64()).unwrap_or(usize::MAX),
            log_bytes: 32 << 20,
            log_segment_bytes: 1 << 20,
            background: Some(std::time::Duration::from_millis(10)),
            // History sets them.
            cpu_class: None,
            write_gap: None,
        },
        kind: match h.policy {
            HistoryPolicy::Shrink => HoldKind::Shrinkable,
            HistoryPolicy::Throttle => HoldKind::MustHold,
        },
        rolls_stalled_until_cut: cfg.test.history_rolls_stalled_until_cut,
        ..HistoryConfig::default()
    }
}

/// Opens history in `<data>/history` when enabled; a new one starts at the store's
/// watermark (`store_seq`, `store_ts`).
pub(crate) fn open(
    dir: &DataDir,
    cfg: &Config,
    store_seq: u64,
    store_ts: u64,
) -> Result<Option<History>, NodeError> {
    if !cfg.history.enabled {
        return Ok(None);
    }
    let files = DirFiles::new(&dir.path("history"))
        .map_err(|e| NodeError::Io(format!("history directory: {e}")))?;
    let hcfg = config(cfg);
    let h = off_runtime(|| History::open(Arc::new(files), hcfg)).map_err(err)?;
    h.begin_at(store_seq, store_ts);
    Ok(Some(h))
}

/// Starts history on the opened log, then seeds every volume it does not follow from its
/// image — before the store's applier starts, so nothing writes the images meanwhile.
pub(crate) fn start(
    h: &History,
    cfg: &Config,
    log: &Log,
    rec: &Recovery,
    volumes: &[(VolumeMeta, Arc<dyn Disk>)],
) -> Result<(), NodeError> {
    for (m, _) in volumes {
        h.set_window(m.id, cfg.history.window_of(&m.name))
            .map_err(err)?;
    }
    off_runtime(|| h.start(log.clone(), rec)).map_err(err)?;
    say_what_the_log_holds(h, log);
    let after: Vec<DigestEntry> = rec
        .records
        .iter()
        .map(|f| DigestEntry::from_header(&f.header, f.addr))
        .collect();
    let seqs: &BTreeMap<u32, u64> = &rec.volume_seqs;
    for (m, image) in volumes {
        if h.follows(m.id) || cfg.history.window_of(&m.name).is_none() {
            continue;
        }
        tracing::info!(
            volume = %m.name,
            size_bytes = m.size_bytes,
            "history: seeding the base image from the current image (history was not following this volume)"
        );
        let at = SeedPoint {
            seq: rec.last_seq,
            timestamp_ns: rec.last_ts,
            volume_seq: seqs.get(&m.id).copied().unwrap_or(0),
        };
        h.seed(m.id, image.as_ref(), m.size_bytes, m.block_size, at, &after)
            .map_err(err)?;
    }
    Ok(())
}

/// Says, loudly when they disagree, whether the log can hold the configured window: history
/// keeps at most about 60 % of the log (beyond it, it shrinks), so the window holds only while
/// writes average below that share of the log per window.
fn say_what_the_log_holds(h: &History, log: &Log) {
    let sb = log.superblock();
    let log_bytes = sb.segment_bytes * sb.segment_count * u64::from(sb.device_count);
    let window = h.configured_window();
    let rate = 0.6 * log_bytes as f64 / window.as_secs_f64().max(1.0);
    let holds = |bytes_per_s: f64| {
        std::time::Duration::from_secs_f64(0.6 * log_bytes as f64 / bytes_per_s.max(1.0))
    };
    let human = |d: std::time::Duration| {
        humantime::format_duration(std::time::Duration::from_secs(d.as_secs())).to_string()
    };
    if rate < 10.0 * 1024.0 * 1024.0 {
        tracing::warn!(
            log_bytes,
            window_s = window.as_secs(),
            "history keeps {} of writes, but the log ({} MiB) holds that only while writes \
             average under {:.0} bytes/s; at 1 MiB/s it holds {}, at 100 MiB/s {} — beyond, \
             history shrinks from its oldest end (mariner_history_window_seconds, `mariner \
             status`). A larger log keeps more: `mariner log grow` while the server is stopped \
             (history kept).",
            human(window),
            log_bytes >> 20,
            rate,
            human(holds(1024.0 * 1024.0)),
            human(holds(100.0 * 1024.0 * 1024.0)),
        );
    } else {
        tracing::info!(
            log_bytes,
            window_s = window.as_secs(),
            "history keeps {} of writes while they average under {:.0} MiB/s",
            human(window),
            rate / (1024.0 * 1024.0)
        );
    }
}

/// A volume's history as `volume info` and `mariner status` show it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct HistoryInfo {
    /// The window asked for, in seconds.
    pub configured_window_s: f64,
    /// How far back reads can go now, in seconds: less than configured when the log filled
    /// before the window ended (history shrank) or history started less than a window ago.
    pub effective_window_s: f64,
    pub oldest_ns: u64,
    pub oldest_seq: u64,
    pub newest_ns: u64,
    pub newest_seq: u64,
    /// Why history cannot be read, if it cannot.
    pub unavailable: Option<String>,
}

impl crate::Node {
    pub(crate) fn history_info(&self, volume: u32, name: &str) -> Option<HistoryInfo> {
        let h = self.history.as_ref()?;
        self.cfg.history.window_of(name)?;
        let configured = h.window_of(volume).as_secs_f64();
        let now = crate::node::now_ns();
        Some(match h.window(volume) {
            Ok(w) => HistoryInfo {
                configured_window_s: configured,
                effective_window_s: now.saturating_sub(w.oldest.timestamp_ns) as f64 / 1e9,
                oldest_ns: w.oldest.timestamp_ns,
                oldest_seq: w.oldest.volume_seq,
                newest_ns: w.newest.timestamp_ns,
                newest_seq: w.newest.volume_seq,
                unavailable: None,
            },
            Err(e) => HistoryInfo {
                configured_window_s: configured,
                effective_window_s: 0.0,
                oldest_ns: 0,
                oldest_seq: 0,
                newest_ns: 0,
                newest_seq: 0,
                unavailable: Some(e.to_string()),
            },
        })
    }
}
