//! What a batch's lifecycle records do to history's state and bases: a volume created gets an
//! empty base, resized and deleted change its state, a declared gap breaks its history. The
//! indexer applies them under the round's lock (`Inner::rounds`, `workers.rs`).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::PoisonError;

use mariner_log::RecordKind;

use crate::engine::{base_name, io_err, lock, Inner, View};
use crate::files::FileUse;
use crate::state::{State, VolumeState, FLAG_BROKEN, FLAG_DELETED};
use crate::{DigestEntry, HistoryError};

impl Inner {
    /// A volume created starts its history with an empty base; resized and deleted change
    /// its state. Replayed records (already applied) change nothing.
    pub(crate) fn apply_lifecycle(
        &self,
        st: &mut State,
        e: &DigestEntry,
    ) -> Result<(), HistoryError> {
        match e.kind {
            RecordKind::VolumeCreated => {
                if lock(&self.windows).get(&e.volume) == Some(&None)
                    || st
                        .volumes
                        .get(&e.volume)
                        .is_some_and(|v| v.base_seq >= e.seq)
                {
                    return Ok(());
                }
                let name = base_name(e.volume);
                let files = self.files.as_ref();
                files.remove(&name).map_err(io_err(files, &name))?;
                let disk = files
                    .open(&name, FileUse::Random)
                    .map_err(io_err(files, &name))?;
                disk.set_len(e.offset).map_err(io_err(files, &name))?;
                disk.sync().map_err(io_err(files, &name))?;
                files.sync_dir().map_err(io_err(files, "."))?;
                let v = VolumeState::created(e);
                st.volumes.insert(e.volume, v);
                lock(&self.bases).insert(e.volume, disk);
                let mut views = self.views.write().unwrap_or_else(PoisonError::into_inner);
                let last = views.get(&e.volume).map(|w| (w.last_vseq, w.last_ts));
                let (last_vseq, last_ts) = last
                    .filter(|&(s, _)| s > e.volume_seq)
                    .unwrap_or((e.volume_seq, e.timestamp_ns));
                views.insert(
                    e.volume,
                    View {
                        state: v,
                        last_vseq,
                        last_ts,
                        gap_seq: 0,
                    },
                );
            }
            RecordKind::VolumeResized => {
                if let Some(v) = st.volumes.get_mut(&e.volume) {
                    v.size = v.size.max(e.offset);
                    let name = base_name(e.volume);
                    if let Some(disk) = lock(&self.bases).get(&e.volume) {
                        if disk.len().map_err(io_err(self.files.as_ref(), &name))? < v.size {
                            disk.set_len(v.size)
                                .map_err(io_err(self.files.as_ref(), &name))?;
                        }
                    }
                }
            }
            RecordKind::VolumeDeleted => {
                if let Some(v) = st.volumes.get_mut(&e.volume) {
                    v.flags |= FLAG_DELETED;
                }
            }
            RecordKind::HistoryGap => {
                // Writes the base and the index never saw: nothing after the gap can be
                // rebuilt from them. The history breaks and is seeded again from the current
                // image, as after a cut; its window starts there, so instants before and
                // inside the gap are refused as outside it.
                if let Some(v) = st.volumes.get_mut(&e.volume) {
                    if v.flags & FLAG_BROKEN == 0 && v.base_seq < e.seq {
                        v.flags |= FLAG_BROKEN;
                        self.stats.gaps.fetch_add(1, Relaxed);
                        tracing::warn!(
                            volume = e.volume,
                            from_ns = e.offset,
                            to_ns = e.timestamp_ns,
                            "history: a gap was declared in the volume's history (writes it never \
                             saw): what came before is no longer readable; history starts again \
                             from the current image"
                        );
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }
}
