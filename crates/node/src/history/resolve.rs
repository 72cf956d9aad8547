//! Naming instants of a volume: TIME resolved against its history, and bookmarks.

use std::collections::BTreeMap;
use std::time::Duration;

use mariner_history::{At, History, HistoryError, Point};

use super::instant::{self, format_ns, Instant};
use super::marks::{self, Mark};
use crate::node::now_ns;
use crate::{Node, NodeError};

/// A bookmark as `mariner history marks` lists it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MarkInfo {
    pub name: String,
    pub volume_seq: u64,
    pub timestamp_ns: u64,
    pub time: String,
    pub created_ns: u64,
    /// Whether the instant is still inside the volume's history.
    pub readable: bool,
}

impl Node {
    /// History and the volume's id, or why the volume has none.
    pub(crate) fn history_for(&self, volume: &str) -> Result<(&History, u32), NodeError> {
        let v = self
            .volume(volume)
            .ok_or_else(|| NodeError::NotFound(volume.to_string()))?;
        let Some(h) = self.history.as_ref() else {
            return Err(NodeError::BadRequest(
                "history is off on this server ([history] enabled = false, or --no-history)".into(),
            ));
        };
        if self.cfg.history.window_of(volume).is_none() {
            return Err(NodeError::BadRequest(format!(
                "history is off for volume {volume} ([history.volumes.{volume}] enabled = false)"
            )));
        }
        Ok((h, v.with_meta(|m| m.id)))
    }

    /// A history error about `volume`, for the person who asked for `asked`.
    pub(crate) fn history_error(&self, volume: &str, asked: &str, e: HistoryError) -> NodeError {
        let window = self
            .history_for(volume)
            .ok()
            .and_then(|(h, id)| h.window(id).ok());
        match e {
            HistoryError::Expired { .. } => NodeError::BadRequest(match window {
                Some(w) => format!(
                    "{asked} is outside volume {volume}'s history, which holds {} (@{}) to {} (@{})",
                    format_ns(w.oldest.timestamp_ns),
                    w.oldest.volume_seq,
                    format_ns(w.newest.timestamp_ns),
                    w.newest.volume_seq
                ),
                None => format!("{asked} is outside volume {volume}'s history"),
            }),
            HistoryError::Broken(_) => NodeError::Busy(format!(
                "volume {volume}'s history is broken: the log reused records before its base \
                 image held them (mariner_history_cuts_total); a new base is being copied from \
                 the current image, and its history starts again there"
            )),
            HistoryError::UnknownVolume(_) => NodeError::BadRequest(format!(
                "volume {volume} has no history yet (it is seeded at the next start)"
            )),
            other => NodeError::Io(format!("history: {other}")),
        }
    }

    /// Resolves TIME (docs: [`instant::FORMS`]) to an instant of `volume`'s history.
    pub fn resolve_instant(&self, volume: &str, time: &str) -> Result<Point, NodeError> {
        let (h, id) = self.history_for(volume)?;
        let at = match instant::parse(time).map_err(NodeError::BadRequest)? {
            Instant::Now => At::Latest,
            Instant::Seq(n) => At::Seq(n),
            Instant::Ago(d) => At::Time(now_ns().saturating_sub(nanos(d))),
            Instant::Time(t) => {
                if t > now_ns() {
                    return Err(NodeError::BadRequest(format!(
                        "{time} is in the future (now is {})",
                        format_ns(now_ns())
                    )));
                }
                At::Time(t)
            }
            Instant::Mark(name) => {
                let m = self.marks_of(volume)?;
                let mark = m.get(&name).ok_or_else(|| {
                    NodeError::NotFound(format!("bookmark {name:?} of volume {volume}"))
                })?;
                At::Seq(mark.volume_seq)
            }
        };
        h.resolve(id, at)
            .map_err(|e| self.history_error(volume, time, e))
    }

    fn marks_of(&self, volume: &str) -> Result<BTreeMap<String, Mark>, NodeError> {
        marks::load(&self.dir.volume_dir(volume))
    }

    /// Bookmarks `volume` as of TIME (`now` when `None`) under `name`.
    pub fn mark(
        &self,
        volume: &str,
        name: &str,
        time: Option<&str>,
    ) -> Result<MarkInfo, NodeError> {
        if !crate::valid_volume_name(name) {
            return Err(NodeError::BadRequest(format!(
                "invalid bookmark name {name:?}: 1-64 of A-Z a-z 0-9 . _ -, not starting with . or -"
            )));
        }
        let _g = self.admin_lock()?;
        let p = self.resolve_instant(volume, time.unwrap_or("now"))?;
        let mut all = self.marks_of(volume)?;
        if all.contains_key(name) {
            return Err(NodeError::Exists(format!(
                "bookmark {name} of volume {volume}"
            )));
        }
        let mark = Mark {
            volume_seq: p.volume_seq,
            timestamp_ns: p.timestamp_ns,
            created_ns: now_ns(),
        };
        all.insert(name.to_string(), mark);
        marks::save(&self.dir.volume_dir(volume), &all)?;
        tracing::info!(
            target: "audit",
            volume,
            mark = name,
            volume_seq = p.volume_seq,
            time = %format_ns(p.timestamp_ns),
            "bookmark set"
        );
        Ok(self.mark_info(volume, name, mark))
    }

    /// Removes a bookmark.
    pub fn unmark(&self, volume: &str, name: &str) -> Result<(), NodeError> {
        let _g = self.admin_lock()?;
        self.history_for(volume)?;
        let mut all = self.marks_of(volume)?;
        if all.remove(name).is_none() {
            return Err(NodeError::NotFound(format!(
                "bookmark {name} of volume {volume}"
            )));
        }
        marks::save(&self.dir.volume_dir(volume), &all)?;
        tracing::info!(target: "audit", volume, mark = name, "bookmark removed");
        Ok(())
    }

    /// The volume's bookmarks, oldest instant first.
    pub fn marks(&self, volume: &str) -> Result<Vec<MarkInfo>, NodeError> {
        self.history_for(volume)?;
        let mut out: Vec<MarkInfo> = self
            .marks_of(volume)?
            .into_iter()
            .map(|(n, m)| self.mark_info(volume, &n, m))
            .collect();
        out.sort_by_key(|m| (m.volume_seq, m.created_ns));
        Ok(out)
    }

    fn mark_info(&self, volume: &str, name: &str, m: Mark) -> MarkInfo {
        let readable = self
            .history_for(volume)
            .ok()
            .and_then(|(h, id)| h.window(id).ok())
            .is_some_and(|w| (w.oldest.volume_seq..=w.newest.volume_seq).contains(&m.volume_seq));
        MarkInfo {
            name: name.to_string(),
            volume_seq: m.volume_seq,
            timestamp_ns: m.timestamp_ns,
            time: format_ns(m.timestamp_ns),
            created_ns: m.created_ns,
            readable,
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
