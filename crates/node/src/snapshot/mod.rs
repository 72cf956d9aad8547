//! Snapshot exports: a volume as of an instant of its history, served as an export of its
//! own — NBD export `<volume>@<snapshot>` and iSCSI target
//! `iqn.2026-11.dev.mariner:<volume>:<snapshot>`, inheriting the volume's CHAP, initiator ACL
//! and listen addresses (mariner-paper.md §3: users read historical snapshots; writes to a
//! snapshot go to a temporary buffer, here the scratch overlay).
//!
//! Creating one copies nothing: it resolves the instant, pins it in history (expiry does not
//! pass it while the export exists; shrinking may, and its reads then fail with EIO — never
//! with other data) and records it in `volumes/<volume>/snapshots.json` (docs/FORMATS.md), so
//! exports survive a restart.

mod scratch;
mod view;

pub use view::{View, ViewRef};

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use mariner_history::PinId;
use serde::{Deserialize, Serialize};

use crate::datadir::{load_versioned, write_atomic};
use crate::history::instant::format_ns;
use crate::node::now_ns;
use crate::{Node, NodeError};

const FILE_NAME: &str = "snapshots.json";
const FORMAT_VERSION: u32 = 1;

/// A snapshot export as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotMeta {
    /// The part after `@` in the export's name.
    pub name: String,
    /// The volume after this write.
    pub volume_seq: u64,
    pub timestamp_ns: u64,
    /// Writable, its writes kept in a scratch file.
    pub scratch: bool,
    pub created_ns: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct SnapshotsFile {
    format_version: u32,
    snapshots: Vec<SnapshotMeta>,
}

/// A snapshot export being served.
pub struct Snapshot {
    pub volume: String,
    pub meta: SnapshotMeta,
    pub view: Arc<View>,
    pin: Option<PinId>,
}

/// A snapshot export as `mariner snapshot list` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct SnapshotInfo {
    /// `<volume>@<snapshot>`: the NBD export name, and what `snapshot remove` takes.
    pub export: String,
    pub volume: String,
    pub snapshot: String,
    pub volume_seq: u64,
    pub timestamp_ns: u64,
    pub time: String,
    pub scratch: bool,
    /// Bytes of writes the scratch overlay holds.
    pub scratch_bytes: u64,
    pub connections: usize,
    pub nbd: Vec<String>,
    pub iscsi: Vec<String>,
    pub iqn: String,
    /// Why reads fail, if they do: history shrank past the instant, or broke.
    pub expired: Option<String>,
    pub created_ns: u64,
}

/// The NBD export name of a snapshot.
pub fn export_name(volume: &str, snapshot: &str) -> String {
    format!("{volume}@{snapshot}")
}

/// The iSCSI target name of a snapshot (volume names hold no `:`, so it is unambiguous).
pub fn target_iqn(volume: &str, snapshot: &str) -> String {
    format!("{}{volume}:{snapshot}", crate::iscsi::IQN_PREFIX)
}

/// The volume's recorded snapshot exports.
pub(crate) fn load(volume_dir: &Path) -> Result<Vec<SnapshotMeta>, NodeError> {
    let path = volume_dir.join(FILE_NAME);
    let f = load_versioned(&path, FORMAT_VERSION, |f: &SnapshotsFile| f.format_version)?;
    Ok(f.map_or_else(Vec::new, |f| f.snapshots))
}

fn save(volume_dir: &Path, snapshots: &[SnapshotMeta]) -> Result<(), NodeError> {
    let path = volume_dir.join(FILE_NAME);
    if snapshots.is_empty() {
        return crate::datadir::remove_durably(&path);
    }
    let f = SnapshotsFile {
        format_version: FORMAT_VERSION,
        snapshots: snapshots.to_vec(),
    };
    let bytes = serde_json::to_vec_pretty(&f).map_err(|e| NodeError::Io(e.to_string()))?;
    write_atomic(&path, &bytes)
}

fn scratch_path(volume_dir: &Path, snapshot: &str) -> PathBuf {
    volume_dir.join("scratch").join(format!("{snapshot}.img"))
}

impl Node {
    /// The snapshot export called `export` (`<volume>@<snapshot>`).
    pub fn snapshot(&self, export: &str) -> Option<Arc<Snapshot>> {
        self.snapshots.read().ok()?.get(export).cloned()
    }

    fn volume_snapshots(&self, volume: &str) -> Vec<SnapshotMeta> {
        self.snapshots
            .read()
            .map(|s| {
                s.values()
                    .filter(|x| x.volume == volume)
                    .map(|x| x.meta.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Whether `volume` has snapshot exports (it cannot be deleted while it has).
    pub(crate) fn has_snapshots(&self, volume: &str) -> bool {
        !self.volume_snapshots(volume).is_empty()
    }

    /// Makes `volume` as of TIME an export of its own; read-only unless `scratch`.
    pub fn export_snapshot(
        &self,
        volume: &str,
        time: &str,
        scratch: bool,
        name: Option<&str>,
    ) -> Result<SnapshotInfo, NodeError> {
        let _g = self.admin_lock()?;
        let vol = self
            .volume(volume)
            .ok_or_else(|| NodeError::NotFound(volume.to_string()))?;
        let (h, id) = self.history_for(volume)?;
        let point = self.resolve_instant(volume, time)?;
        let snap = name.map_or_else(|| point.volume_seq.to_string(), str::to_string);
        if !crate::valid_volume_name(&snap) {
            return Err(NodeError::BadRequest(format!(
                "invalid snapshot name {snap:?}: 1-64 of A-Z a-z 0-9 . _ -, not starting with . or -"
            )));
        }
        let export = export_name(volume, &snap);
        if self.snapshot(&export).is_some() {
            return Err(NodeError::Exists(format!(
                "snapshot export {export} (name another with --name)"
            )));
        }
        let pin = h
            .pin(id, point.volume_seq)
            .map_err(|e| self.history_error(volume, time, e))?;
        let meta = SnapshotMeta {
            name: snap.clone(),
            volume_seq: point.volume_seq,
            timestamp_ns: point.timestamp_ns,
            scratch,
            created_ns: now_ns(),
        };
        let vdir = self.dir.volume_dir(volume);
        let made = self.open_view(&vol, volume, &meta).and_then(|view| {
            let mut all = self.volume_snapshots(volume);
            all.push(meta.clone());
            save(&vdir, &all).map(|()| view)
        });
        let view = match made {
            Ok(v) => v,
            Err(e) => {
                h.unpin(pin);
                return Err(e);
            }
        };
        let s = Arc::new(Snapshot {
            volume: volume.to_string(),
            meta: meta.clone(),
            view,
            pin: Some(pin),
        });
        if let Ok(mut m) = self.snapshots.write() {
            m.insert(export.clone(), s);
        }
        tracing::info!(
            target: "audit",
            volume,
            export = %export,
            volume_seq = meta.volume_seq,
            time = %format_ns(meta.timestamp_ns),
            scratch,
            "snapshot exported"
        );
        let info = self.snapshot_info(&export);
        info.ok_or(NodeError::NotFound(export))
    }

    fn open_view(
        &self,
        vol: &Arc<crate::volume::Volume>,
        volume: &str,
        meta: &SnapshotMeta,
    ) -> Result<Arc<View>, NodeError> {
        let h = self
            .history
            .clone()
            .ok_or_else(|| NodeError::BadRequest("history is off on this server".into()))?;
        let scratch = if meta.scratch {
            let path = scratch_path(&self.dir.volume_dir(volume), &meta.name);
            let max = self.cfg.history.scratch_max.as_u64();
            Some(scratch::Scratch::open(&path, max).map_err(|e| NodeError::Io(e.to_string()))?)
        } else {
            None
        };
        Ok(Arc::new(View::new(
            export_name(volume, &meta.name),
            vol.clone(),
            h,
            meta.volume_seq,
            meta.created_ns,
            scratch,
        )))
    }

    /// Removes a snapshot export (and its scratch writes); refused while clients are connected.
    pub fn remove_snapshot(&self, export: &str) -> Result<(), NodeError> {
        let _g = self.admin_lock()?;
        let s = self
            .snapshot(export)
            .ok_or_else(|| NodeError::NotFound(format!("snapshot export {export}")))?;
        let n = self.connections(export);
        if n > 0 {
            return Err(NodeError::Busy(format!(
                "snapshot export {export} has {n} connected client(s)"
            )));
        }
        let rest: Vec<SnapshotMeta> = self
            .volume_snapshots(&s.volume)
            .into_iter()
            .filter(|m| m.name != s.meta.name)
            .collect();
        save(&self.dir.volume_dir(&s.volume), &rest)?;
        if let Ok(mut m) = self.snapshots.write() {
            m.remove(export);
        }
        s.view.removed.store(true, Relaxed);
        if let (Some(h), Some(pin)) = (&self.history, s.pin) {
            h.unpin(pin);
        }
        if let Some(sc) = &s.view.scratch {
            sc.discard();
        }
        tracing::info!(target: "audit", export, "snapshot export removed");
        Ok(())
    }

    /// Every snapshot export, by name.
    pub fn snapshot_infos(&self) -> Vec<SnapshotInfo> {
        let names: Vec<String> = self
            .snapshots
            .read()
            .map(|s| s.keys().cloned().collect())
            .unwrap_or_default();
        names.iter().filter_map(|n| self.snapshot_info(n)).collect()
    }

    pub fn snapshot_info(&self, export: &str) -> Option<SnapshotInfo> {
        let s = self.snapshot(export)?;
        let iqn = target_iqn(&s.volume, &s.meta.name);
        let (nbd, iscsi) = self.endpoints();
        let expired = self.history.as_ref().and_then(|h| {
            match h.window(s.view.volume_id) {
                Ok(w) if w.oldest.volume_seq > s.meta.volume_seq => Some(format!(
                    "expired: history shrank past this instant (it now holds from {} on); reads fail with EIO",
                    format_ns(w.oldest.timestamp_ns)
                )),
                Ok(_) => None,
                Err(e) => Some(e.to_string()),
            }
        });
        Some(SnapshotInfo {
            export: export.to_string(),
            volume: s.volume.clone(),
            snapshot: s.meta.name.clone(),
            volume_seq: s.meta.volume_seq,
            timestamp_ns: s.meta.timestamp_ns,
            time: format_ns(s.meta.timestamp_ns),
            scratch: s.meta.scratch,
            scratch_bytes: s.view.scratch.as_ref().map_or(0, |x| x.bytes()),
            connections: self.connections(export),
            nbd: nbd.iter().map(|a| format!("nbd://{a}/{export}")).collect(),
            iscsi: iscsi
                .iter()
                .map(|a| format!("iscsi://{a}/{iqn}/0"))
                .collect(),
            iqn,
            expired,
            created_ns: s.meta.created_ns,
        })
    }

    /// At start-up, after the volumes: serves the recorded snapshot exports again, each with
    /// the pin `pins` took for it before history started.
    pub(crate) fn restore_snapshots(
        &self,
        pins: Vec<(String, SnapshotMeta, Option<PinId>)>,
    ) -> Result<(), NodeError> {
        for (volume, meta, pin) in pins {
            let Some(vol) = self.volume(&volume) else {
                continue;
            };
            let view = match self.open_view(&vol, &volume, &meta) {
                Ok(v) => v,
                Err(e) => {
                    tracing::warn!(volume = %volume, snapshot = %meta.name, error = %e, "a recorded snapshot export cannot be served");
                    continue;
                }
            };
            let export = export_name(&volume, &meta.name);
            let s = Arc::new(Snapshot {
                volume,
                meta,
                view,
                pin,
            });
            if let Ok(mut m) = self.snapshots.write() {
                m.insert(export, s);
            }
        }
        Ok(())
    }
}

/// Before history starts: pins every recorded snapshot export's instant, so the first
/// roll-forward does not pass it.
pub(crate) fn pin_recorded(
    dir: &crate::datadir::DataDir,
    history: Option<&mariner_history::History>,
    metas: &[crate::datadir::VolumeMeta],
) -> Result<Vec<(String, SnapshotMeta, Option<PinId>)>, NodeError> {
    let mut out = Vec::new();
    for m in metas {
        for s in load(&dir.volume_dir(&m.name))? {
            let pin = match history.map(|h| h.pin(m.id, s.volume_seq)) {
                Some(Ok(p)) => Some(p),
                Some(Err(e)) => {
                    tracing::warn!(volume = %m.name, snapshot = %s.name, error = %e, "a snapshot export's instant is no longer in history; its reads fail");
                    None
                }
                None => None,
            };
            out.push((m.name.clone(), s, pin));
        }
    }
    Ok(out)
}
