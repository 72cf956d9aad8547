//! The in-memory sparse index over the digest files: per volume, a few frames where it
//! appears, with the volume's smallest number and timestamp there.
//!
//! A lookup binary-searches a volume's samples and reads frames forward from the one it
//! lands on, up to the next sample (or the end of that sample's file); frames without the
//! volume cost a header read. So the samples must come often enough to bound that read, and
//! seldom enough to bound memory: a volume gets a new sample at a frame where it appears
//! when at least [`SAMPLE_ENTRIES`] of its entries or [`SAMPLE_NS`] of time passed since its
//! last sample, and at its first frame in each file (so that dropping whole files never
//! leaves a volume's remaining frames without a sample before them).
//!
//! Memory bound: a volume's samples number at most
//! `entries/256 + seconds spanned + files it appears in + 1`, each [`Sample`] 40 bytes
//! (plus the `Vec`'s slack); over all volumes at most `entries/256 + Σ per volume (seconds
//! spanned + files + 1)`. For example 10⁸ entries of 10 volumes, each written all day, in
//! 64 MiB files (84 of them): 0.39 M + 0.86 M + 840 ≈ 1.26 M samples, about 50 MB; the
//! same volumes idle half the day need about half the time-driven samples.

use std::collections::BTreeMap;

use super::format::Summary;

/// A volume gets a new sample after this many of its entries…
pub const SAMPLE_ENTRIES: u64 = 256;
/// …or after this much time (ns of its timestamps).
pub const SAMPLE_NS: u64 = 1_000_000_000;

/// One frame where a volume appears.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// The frame's first sequence number.
    pub seq: u64,
    /// The volume's smallest volume sequence number in the frame.
    pub vseq: u64,
    /// The volume's smallest timestamp in the frame.
    pub ts: u64,
    /// The file (its first sequence number) and byte offset of the frame.
    pub file: u64,
    pub offset: u64,
}
const _: () = assert!(std::mem::size_of::<Sample>() == 40);

#[derive(Debug, Default)]
pub struct VolumeSamples {
    pub list: Vec<Sample>,
    /// Whether every frame's smallest volume sequence number of this volume is above the
    /// largest of all its earlier frames: then samples ascend by number and a lookup by number
    /// may stop at the next sample. The log numbers a volume's records 1, 2, 3… in sequence
    /// order, so this holds except for unnumbered (version 1) records.
    pub ordered: bool,
    max_vseq: u64,
    /// The volume's entries since its last sample (that frame's included).
    since: u64,
}

#[derive(Debug, Default)]
pub struct Samples {
    volumes: BTreeMap<u32, VolumeSamples>,
    total: usize,
}

impl Samples {
    /// Takes note of a frame at `offset` of the file `file` (its first sequence number), in
    /// sequence order.
    pub fn add_frame(&mut self, file: u64, offset: u64, first_seq: u64, summaries: &[Summary]) {
        for s in summaries {
            let v = self
                .volumes
                .entry(s.volume)
                .or_insert_with(|| VolumeSamples {
                    ordered: true,
                    ..Default::default()
                });
            if v.list.is_empty() {
                v.ordered = true;
            } else if s.min_vseq <= v.max_vseq {
                v.ordered = false;
            }
            v.max_vseq = v.max_vseq.max(s.max_vseq);
            let due = match v.list.last() {
                None => true,
                Some(last) => {
                    last.file != file
                        || v.since >= SAMPLE_ENTRIES
                        || s.min_ts >= last.ts.saturating_add(SAMPLE_NS)
                }
            };
            if due {
                v.list.push(Sample {
                    seq: first_seq,
                    vseq: s.min_vseq,
                    ts: s.min_ts,
                    file,
                    offset,
                });
                v.since = u64::from(s.count);
                self.total += 1;
            } else {
                v.since += u64::from(s.count);
            }
        }
    }

    /// Forgets the samples in files whose first sequence number is at most `file`.
    pub fn drop_files_through(&mut self, file: u64) {
        let mut total = 0;
        self.volumes.retain(|_, v| {
            let keep = v.list.partition_point(|s| s.file <= file);
            v.list.drain(..keep);
            total += v.list.len();
            !v.list.is_empty()
        });
        self.total = total;
    }

    pub fn get(&self, volume: u32) -> Option<&VolumeSamples> {
        self.volumes.get(&volume)
    }

    /// Samples over all volumes.
    pub fn len(&self) -> usize {
        self.total
    }
}
