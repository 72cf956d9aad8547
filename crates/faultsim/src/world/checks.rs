//! The checks against the model that need the whole node: what recovery found after a crash,
//! and the images on disk after a drain.

use std::collections::BTreeMap;

use mariner_log::{RecordKind, Recovery};
use mariner_store::Progress;

use super::{vol_id, vol_index, World};
use crate::model::{first_difference, SECTOR};
use crate::Failure;

impl World {
    /// Recovery's answer against the records appended: every durable record above the
    /// watermark is found, unchanged; nothing is found that was not appended; every sequence
    /// number up to the last is found or voided. Unacknowledged records recovery found are
    /// durable from now on; those it did not are forgotten (their numbers were voided).
    pub(super) fn check_recovery(
        &mut self,
        progress: &Progress,
        rec: &Recovery,
    ) -> Result<(), Failure> {
        let w = progress.applied_seq;
        let mut found = BTreeMap::new();
        for f in &rec.records {
            if f.header.seq <= w {
                return Err(self.fail(format!(
                    "recovery returned record {} at or below the watermark {w}",
                    f.header.seq
                )));
            }
            if found.insert(f.header.seq, f.header).is_some() {
                return Err(self.fail(format!("recovery returned record {} twice", f.header.seq)));
            }
        }
        if let Some(prev) = rec
            .records
            .windows(2)
            .find(|p| p[0].header.seq >= p[1].header.seq)
        {
            return Err(self.fail(format!(
                "recovered records out of sequence order: {} before {}",
                prev[0].header.seq, prev[1].header.seq
            )));
        }
        for s in w + 1..=rec.last_seq {
            if !found.contains_key(&s) && !rec.voided.contains(&s) {
                return Err(self.fail(format!(
                    "sequence number {s} neither recovered nor voided (last {})",
                    rec.last_seq
                )));
            }
        }
        for (&seq, h) in &found {
            if h.kind == RecordKind::Void {
                continue;
            }
            let Some(k) = self.known.get(&seq) else {
                return Err(self.fail(format!(
                    "recovered record {seq} ({:?} of volume {} at {}) was never appended",
                    h.kind, h.volume, h.offset
                )));
            };
            let r = &k.rec;
            let same = h.kind == r.kind
                && h.volume == r.volume
                && h.offset == r.offset
                && h.length == r.length
                && (r.kind != RecordKind::Write || h.payload_crc == crc32c::crc32c(&r.payload));
            if !same {
                return Err(self.fail(format!(
                    "recovered record {seq} differs from the one appended: {h:?} vs {:?}",
                    (r.kind, r.volume, r.offset, r.length)
                )));
            }
        }
        let mut forget = Vec::new();
        let mut recovered = Vec::new();
        for (&seq, k) in &self.known {
            if seq <= w {
                if !k.durable {
                    return Err(self.fail(format!(
                        "the store's watermark {w} covers record {seq}, never acknowledged"
                    )));
                }
                forget.push(seq);
            } else if found.contains_key(&seq) {
                if !k.durable {
                    recovered.push(seq);
                }
            } else if k.durable {
                return Err(self.fail(format!(
                    "acknowledged record {seq} ({:?} of volume {} at {}+{}) lost: watermark {w}, \
                     recovered {} records up to {}",
                    k.rec.kind,
                    k.rec.volume,
                    k.rec.offset,
                    k.rec.length,
                    rec.records.len(),
                    rec.last_seq
                )));
            } else {
                forget.push(seq);
            }
        }
        for seq in forget {
            let gone = self.known.remove(&seq);
            if gone.is_some_and(|k| !k.durable) {
                self.summary.lost_unacked += 1;
            }
        }
        for seq in recovered {
            self.summary.recovered_unacked += 1;
            let ts = found.get(&seq).map(|h| h.timestamp_ns);
            if let Some(k) = self.known.get_mut(&seq) {
                k.durable = true;
                k.ts = ts;
                let r = k.rec.clone();
                self.model[vol_index(r.volume)].apply(&r);
            }
        }
        self.summary.torn_tails += rec.torn_tails;
        Ok(())
    }

    /// Compares a read through the store with the model.
    pub(crate) fn check_read(
        &mut self,
        v: usize,
        offset: u64,
        len: u64,
        when: &str,
    ) -> Result<(), Failure> {
        let got = self
            .node()?
            .store
            .read(vol_id(v), offset, len)
            .map_err(|e| self.fail(format!("read of volume {} failed {when}: {e}", vol_id(v))))?;
        self.summary.reads += 1;
        let want = &self.model[v].data[offset as usize..(offset + len) as usize];
        if let Some(i) = first_difference(&got, want) {
            let at = offset + i as u64;
            let sector = self.model[v].seq[(at / SECTOR) as usize];
            return Err(self.fail(format!(
                "volume {} reads wrong {when}: byte {at} is {} where the model has {} (sector \
                 last written by record {sector})",
                vol_id(v),
                got[i],
                want[i]
            )));
        }
        Ok(())
    }

    /// Every image's synced bytes equal the model: write-back put everything where it belongs.
    pub(super) fn check_images_on_disk(&mut self) -> Result<(), Failure> {
        for v in 0..self.images.len() {
            let durable = self.images[v].faults.durable_image();
            if let Some(i) = first_difference(&durable, &self.model[v].data) {
                return Err(self.fail(format!(
                    "volume {}'s synced image differs from the model at byte {i} after draining",
                    vol_id(v)
                )));
            }
            self.check_read(v, 0, self.images[v].size, "after draining")?;
        }
        Ok(())
    }
}
