//! Seeding: a volume history did not follow from its creation (history was turned on later,
//! or its history broke when the log filled faster than the base could roll forward) gets a
//! base image copied from the current image, and its history starts there.
//!
//! The copy is made while nothing applies to the image (at start-up, before the store's
//! applier starts), from an image that holds every record up to the store's watermark and
//! possibly some after it; the records after it (which recovery found in the log) are then
//! applied to the copy in order, so the base is exactly the volume as of the newest of them.

use std::sync::atomic::Ordering::Relaxed;

use mariner_disk::Disk;
use mariner_log::RecordKind;

use crate::engine::{base_name, io_err, lock, History, View};
use crate::files::FileUse;
use crate::state::VolumeState;
use crate::{DigestEntry, HistoryError};

/// The instant a seeded base is as of.
#[derive(Debug, Clone, Copy)]
pub struct SeedPoint {
    /// The log's newest sequence number at the seed (records above it are history).
    pub seq: u64,
    pub timestamp_ns: u64,
    /// The volume's newest volume sequence number at or below `seq`.
    pub volume_seq: u64,
}

impl History {
    /// Whether `volume` has a history that can be read (false: never followed, or broken).
    /// A volume whose creation record is still waiting to be indexed is followed.
    pub fn follows(&self, volume: u32) -> bool {
        self.inner
            .views
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&volume)
            .is_some_and(|v| !v.broken())
    }

    /// Volumes whose history broke while history ran — the log let go of records their
    /// base lacked — and that are not deleted: each waits for [`History::seed`].
    pub fn broken_volumes(&self) -> Vec<u32> {
        use crate::state::FLAG_DELETED;
        self.inner
            .views
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .filter(|(_, v)| v.broken() && v.state.flags & FLAG_DELETED == 0)
            .map(|(&id, _)| id)
            .collect()
    }

    /// Starts `volume`'s history at `at` from a copy of `image` (`size` bytes, `block_size`
    /// blocks) plus `after`: the records of the volume the image may lack, in sequence order
    /// (their payloads are read from the log). Nothing may write the image meanwhile: at
    /// start-up before the store applies, while serving from the store's applier with the
    /// images at rest (`mariner_store::Store::at_rest`). Does nothing if history follows the
    /// volume already.
    ///
    /// While serving, history goes on indexing and rolling the other volumes forward during
    /// the copy; it holds the log and its digests from `at.seq` until the base is in place,
    /// so the records after it stay for the base to roll forward over. `at.seq` below what
    /// history already let the log have is refused ([`HistoryError::Retry`]): the records
    /// between would be missing from the base.
    pub fn seed(
        &self,
        volume: u32,
        image: &dyn Disk,
        size: u64,
        block_size: u32,
        at: SeedPoint,
        after: &[DigestEntry],
    ) -> Result<(), HistoryError> {
        let inner = &self.inner;
        if self.follows(volume) {
            return Ok(());
        }
        {
            // Under the state's lock, as `Inner::save` releases: no release passes the floor
            // after this, and any made before shows in `released`.
            let _st = lock(&inner.state);
            let released = inner.holder.get().map_or(0, mariner_log::Holder::released);
            if at.seq < released {
                return Err(HistoryError::Retry(format!(
                    "seeding volume {volume} as of record {}: history let the log have records \
                     up to {released} already",
                    at.seq
                )));
            }
            lock(&inner.seeding).insert(volume, at.seq);
        }
        let copied = self.copy_base(volume, image, size, block_size, at, after);
        lock(&inner.seeding).remove(&volume);
        copied
    }

    /// [`History::seed`]'s copy, once history holds the log from `at`.
    fn copy_base(
        &self,
        volume: u32,
        image: &dyn Disk,
        size: u64,
        block_size: u32,
        at: SeedPoint,
        after: &[DigestEntry],
    ) -> Result<(), HistoryError> {
        let inner = &self.inner;
        let files = inner.files.as_ref();
        let name = base_name(volume);
        let io = io_err(files, &name);
        let log = inner
            .log
            .get()
            .ok_or_else(|| HistoryError::Config("history is not started".into()))?;
        files.remove(&name).map_err(&io)?;
        let base = files.open(&name, FileUse::Random).map_err(&io)?;
        base.set_len(size).map_err(&io)?;
        let started = std::time::Instant::now();
        let mut copied = 0u64;
        let mut buf = vec![0u8; 1 << 20];
        let image_io = |e: std::io::Error| HistoryError::Io {
            path: format!("image of volume {volume}").into(),
            source: e,
        };
        for ext in image.allocation(0, size).map_err(image_io)? {
            if !ext.allocated {
                continue;
            }
            let mut at_byte = ext.offset;
            let end = ext.offset + ext.len;
            while at_byte < end {
                let n = (end - at_byte).min(buf.len() as u64) as usize;
                image.read_at(&mut buf[..n], at_byte).map_err(image_io)?;
                if buf[..n].iter().any(|&b| b != 0) {
                    base.write_at(&buf[..n], at_byte).map_err(&io)?;
                }
                at_byte += n as u64;
                copied += n as u64;
            }
        }
        for e in after.iter().filter(|e| e.volume == volume) {
            match e.kind {
                RecordKind::Write => {
                    let (_, payload) = log.read(e.addr, e.seq)?;
                    base.write_at(&payload, e.offset).map_err(&io)?;
                }
                RecordKind::Trim | RecordKind::WriteZeroes => {
                    base.punch_hole(e.offset, u64::from(e.length))
                        .map_err(&io)?;
                }
                _ => {}
            }
        }
        base.sync().map_err(&io)?;
        files.sync_dir().map_err(io_err(files, "."))?;
        let v = VolumeState {
            block_size,
            size,
            base_seq: at.seq,
            base_vseq: at.volume_seq,
            base_ts: at.timestamp_ns,
            ..VolumeState::default()
        };
        lock(&inner.state).volumes.insert(volume, v);
        lock(&inner.bases).insert(volume, base);
        {
            let mut views = inner
                .views
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let w = views.entry(volume).or_default();
            let (last_vseq, last_ts) = if w.last_vseq > at.volume_seq {
                (w.last_vseq, w.last_ts)
            } else {
                (at.volume_seq, at.timestamp_ns)
            };
            *w = View {
                state: v,
                last_vseq,
                last_ts,
                gap_seq: w.gap_seq,
            };
        }
        inner.save(true)?;
        inner.stats.seeds.fetch_add(1, Relaxed);
        tracing::info!(
            volume,
            copied_bytes = copied,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "history: base image seeded from the current image"
        );
        Ok(())
    }

    /// Sets `volume`'s protection window: `Some` its own instead of the configured one,
    /// `None` no history for it. Turning history off drops what it kept of the volume at once
    /// (base image, state, views); a volume created later with history off is never followed.
    /// Call it before the volume's creation record is appended, and at start-up before
    /// [`History::start`].
    pub fn set_window(
        &self,
        volume: u32,
        window: Option<std::time::Duration>,
    ) -> Result<(), HistoryError> {
        let inner = &self.inner;
        lock(&inner.windows).insert(volume, window);
        if window.is_some() {
            return Ok(());
        }
        let had = lock(&inner.state).volumes.remove(&volume).is_some();
        inner
            .views
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&volume);
        lock(&inner.bases).remove(&volume);
        if had {
            inner.save(true)?;
            let name = base_name(volume);
            inner
                .files
                .remove(&name)
                .map_err(io_err(inner.files.as_ref(), &name))?;
            tracing::info!(
                volume,
                "history turned off for a volume: what it kept is dropped"
            );
        }
        Ok(())
    }

    /// For a new history: start at the log's sequence number `seq` (the store's watermark):
    /// records at or below it are in the images, and volumes are seeded from those.
    pub fn begin_at(&self, seq: u64, timestamp_ns: u64) {
        let mut st = lock(&self.inner.state);
        if st.indexed_seq == 0 && st.volumes.is_empty() {
            st.indexed_seq = seq;
            st.indexed_ts = timestamp_ns;
            drop(st);
            self.inner.set_next_seq(seq + 1);
        }
    }
}
