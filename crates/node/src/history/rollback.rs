//! `mariner rollback VOL --to TIME`: the volume made equal to itself as of TIME by writing, as
//! ordinary new writes, only the extents changed since — so the rollback is itself history,
//! and rolling back to the instant before it undoes it.
//!
//! History drives it (`History::begin_rollback` / `run_rollback`: which extents, read as of
//! TIME, progress kept durably so a crash or restart resumes it); the node supplies the
//! writes, through the volume like any client's, and refuses new connections to the volume
//! until it is done. It starts only with no client connected (unless forced) and when the
//! log has room for what it writes before history would have to shrink past TIME.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use mariner_history::{History, HistoryError, RollbackStatus, RollbackWrite};
use serde::Serialize;

use super::queries::PointInfo;
use crate::node::now_ns;
use crate::volume::{Volume, WritePath, Zeroing};
use crate::{Node, NodeError};

/// Share of the log history may hold before it shrinks (mariner-history's retention).
const HISTORY_SHARE: f64 = 0.6;
/// Largest rollback write: one log record each.
const MAX_CHUNK: u64 = 1 << 20;

/// A rollback as `mariner rollback` follows it.
#[derive(Debug, Clone, Serialize)]
pub struct RollbackInfo {
    pub volume: String,
    pub to: PointInfo,
    /// The newest instant when it began: `mariner rollback VOL --to @<from>` undoes it.
    pub from: PointInfo,
    pub done_bytes: u64,
    pub total_bytes: u64,
    pub finished: bool,
    /// Why it stopped, if it failed (it resumes at the next start).
    pub error: Option<String>,
    /// Resumed after a restart.
    pub resumed: bool,
    pub started_ns: u64,
}

/// Rollbacks by volume name: running ones, and each volume's last.
pub(crate) type Rollbacks = Arc<Mutex<BTreeMap<String, RollbackInfo>>>;

fn info(volume: &str, s: &RollbackStatus, resumed: bool) -> RollbackInfo {
    RollbackInfo {
        volume: volume.to_string(),
        to: s.to.into(),
        from: s.from.into(),
        done_bytes: s.done_bytes,
        total_bytes: s.total_bytes,
        finished: s.finished,
        error: None,
        resumed,
        started_ns: now_ns(),
    }
}

impl Node {
    /// Whether `volume` is rolling back (new connections to it are refused meanwhile).
    pub fn rolling_back(&self, volume: &str) -> bool {
        self.rollbacks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(volume)
            .is_some_and(|r| !r.finished && r.error.is_none())
    }

    /// The volume's running or last rollback.
    pub fn rollback_info(&self, volume: &str) -> Option<RollbackInfo> {
        self.rollbacks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(volume)
            .cloned()
    }

    /// Begins rolling `volume` back to TIME, in the background; see the module comment.
    pub fn start_rollback(
        &self,
        volume: &str,
        to: &str,
        force: bool,
    ) -> Result<RollbackInfo, NodeError> {
        let _g = self.admin_lock()?;
        let vol = self
            .volume(volume)
            .ok_or_else(|| NodeError::NotFound(volume.to_string()))?;
        let (h, id) = self.history_for(volume)?;
        if self.rolling_back(volume) {
            return Err(NodeError::Busy(format!(
                "volume {volume} is already rolling back (mariner rollback shows its progress)"
            )));
        }
        let n = if force {
            0
        } else {
            self.connections_settled(volume)
        };
        if n > 0 {
            return Err(NodeError::Busy(format!(
                "volume {volume} has {n} connected client(s): disconnect them, or pass --force \
                 to roll back under them"
            )));
        }
        let point = self.resolve_instant(volume, to)?;
        let newest = h
            .window(id)
            .map_err(|e| self.history_error(volume, to, e))?
            .newest;
        let changes = h
            .changes(id, point.volume_seq, newest.volume_seq)
            .map_err(|e| self.history_error(volume, to, e))?;
        let total: u64 = changes.extents.iter().map(|e| e.length).sum();
        self.check_log_room(volume, total)?;
        let status = h
            .begin_rollback(id, point)
            .map_err(|e| self.history_error(volume, to, e))?;
        let mut i = info(volume, &status, false);
        i.total_bytes = i.total_bytes.max(status.total_bytes);
        tracing::info!(
            target: "audit",
            volume,
            to_seq = point.volume_seq,
            to = %i.to.time,
            from_seq = i.from.volume_seq,
            bytes = i.total_bytes,
            force,
            "rollback started"
        );
        self.launch_rollback(volume, vol, h.clone(), id, i.clone())?;
        Ok(i)
    }

    /// Refuses a rollback whose writes would fill the log past what history may hold: history
    /// would shrink from its oldest end, possibly past the instant being rolled back to.
    fn check_log_room(&self, volume: &str, bytes: u64) -> Result<(), NodeError> {
        let sb = self.log.superblock();
        let total = self.log.stats().segments_total.load(Relaxed) * sb.segment_bytes;
        let held = self
            .log
            .holder(mariner_history::HOLDER)
            .map(|h| h.segments_held() * sb.segment_bytes)
            .unwrap_or(0);
        let room = (HISTORY_SHARE * total as f64) as u64;
        let room = room.saturating_sub(held);
        if bytes > room {
            return Err(NodeError::BadRequest(format!(
                "rolling volume {volume} back writes {}, but the log has room for {} before \
                 history must shrink (it holds {} of a {} log): a larger log can take it \
                 (`mariner log grow` while the server is stopped)",
                crate::human_bytes(bytes),
                crate::human_bytes(room),
                crate::human_bytes(held),
                crate::human_bytes(total)
            )));
        }
        Ok(())
    }

    /// At start-up: resumes every rollback history found unfinished.
    pub(crate) fn resume_rollbacks(&self) {
        let Some(h) = self.history.clone() else {
            return;
        };
        for status in h.pending_rollbacks() {
            let found = self
                .volume_names()
                .into_iter()
                .filter_map(|n| self.volume(&n).map(|v| (n, v)))
                .find(|(_, v)| v.with_meta(|m| m.id) == status.volume);
            let Some((name, vol)) = found else {
                tracing::warn!(
                    volume_id = status.volume,
                    "a rollback of a volume that is gone was left unfinished"
                );
                continue;
            };
            let i = info(&name, &status, true);
            tracing::info!(
                target: "audit",
                volume = %name,
                to_seq = i.to.volume_seq,
                done_bytes = i.done_bytes,
                total_bytes = i.total_bytes,
                "rollback resumed after a restart"
            );
            if let Err(e) = self.launch_rollback(&name, vol, h.clone(), status.volume, i) {
                tracing::error!(volume = %name, error = %e, "could not resume a rollback");
            }
        }
    }

    fn launch_rollback(
        &self,
        volume: &str,
        vol: Arc<Volume>,
        h: History,
        id: u32,
        i: RollbackInfo,
    ) -> Result<(), NodeError> {
        let runs = Arc::clone(&self.rollbacks);
        runs.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(volume.to_string(), i);
        let name = volume.to_string();
        std::thread::Builder::new()
            .name(format!("rollback-{volume}"))
            .spawn(move || run(&name, &vol, &h, id, &runs))
            .map(|_| ())
            .map_err(|e| NodeError::Io(format!("starting the rollback: {e}")))
    }
}

/// The rollback thread: history reads the past and calls back with each write, which goes
/// through the volume (a log record, durable before the next) on a runtime of its own.
fn run(name: &str, vol: &Arc<Volume>, h: &History, id: u32, runs: &Rollbacks) {
    let update = |f: &dyn Fn(&mut RollbackInfo)| {
        if let Some(r) = runs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_mut(name)
        {
            f(r);
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            update(&|r| r.error = Some(format!("no runtime: {e}")));
            return;
        }
    };
    let chunk = vol.max_io_bytes().min(MAX_CHUNK);
    let mut write = |w: RollbackWrite<'_>| -> Result<(), String> {
        let done = match w {
            RollbackWrite::Data { offset, data } => {
                rt.block_on(vol.write(offset, Bytes::copy_from_slice(data)))
            }
            RollbackWrite::Zero { offset, length } => {
                rt.block_on(vol.zero(offset, length, Zeroing::Trim))
            }
        };
        done.map_err(|e| e.to_string())
    };
    let mut progress = |s: &RollbackStatus| {
        update(&|r| {
            r.done_bytes = s.done_bytes;
            r.total_bytes = s.total_bytes;
        });
    };
    match h.run_rollback(id, chunk, &mut write, &mut progress) {
        Ok(s) => {
            update(&|r| {
                r.done_bytes = s.done_bytes;
                r.total_bytes = s.total_bytes;
                r.finished = true;
            });
            tracing::info!(
                target: "audit",
                volume = name,
                to_seq = s.to.volume_seq,
                bytes = s.total_bytes,
                undo = %format!("mariner rollback {name} --to @{}", s.from.volume_seq),
                "rollback finished"
            );
        }
        Err(e @ HistoryError::Expired { .. }) => {
            // Only a shrink takes the instant away; the rollback can never finish, so it is
            // cancelled rather than retried at every start.
            let cancelled = h.cancel_rollback(id);
            let why = format!(
                "history shrank past the instant being rolled back to ({e}); the rollback is \
                 cancelled{} with part of the volume rolled back: roll back again to an instant \
                 history still holds",
                if matches!(cancelled, Ok(true)) {
                    ""
                } else {
                    " (cancelling it failed too)"
                }
            );
            tracing::error!(target: "audit", volume = name, error = %why, "rollback cancelled");
            update(&|r| r.error = Some(why.clone()));
        }
        Err(e) => {
            let why = e.to_string();
            tracing::error!(volume = name, error = %why, "rollback failed; it resumes at the next start");
            update(&|r| r.error = Some(why.clone()));
        }
    }
}
