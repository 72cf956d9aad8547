//! The unindexed tail: records durable in the log but not yet in the index. Reads as of an
//! instant newer than the index look here first, so `--at -0s` sees every acknowledged write.
//!
//! Records arrive in completion order (devices finish out of order), so a lookup takes the
//! newest covering version among all of a volume's tail records, not the last one added.
//! The tail is short: the indexer takes records off it once they are indexed, a batch at a
//! time (by default every 200 ms or 16,384 records).

use std::collections::{BTreeMap, HashMap};

use mariner_log::RecordKind;

use crate::index::Version;
use crate::pieces::sectors_of;
use crate::DigestEntry;

#[derive(Debug, Default)]
pub struct Tail {
    /// Per volume, by volume sequence number.
    volumes: HashMap<u32, BTreeMap<u64, DigestEntry>>,
    records: usize,
}

impl Tail {
    pub fn push(&mut self, e: DigestEntry) {
        if e.kind.changes_data() {
            self.volumes
                .entry(e.volume)
                .or_default()
                .insert(e.volume_seq, e);
            self.records += 1;
        }
    }

    /// Takes `e` off the tail (it is indexed).
    pub fn remove(&mut self, e: &DigestEntry) {
        if let Some(v) = self.volumes.get_mut(&e.volume) {
            if v.remove(&e.volume_seq).is_some() {
                self.records -= 1;
            }
            if v.is_empty() {
                self.volumes.remove(&e.volume);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.records
    }

    /// The timestamp of the oldest record waiting (the index's lag starts there).
    pub fn oldest_ts(&self) -> Option<u64> {
        self.volumes
            .values()
            .filter_map(|v| v.values().map(|e| e.timestamp_ns).min())
            .min()
    }

    /// Overlays onto `out` (one slot per sector of `[start, end)`) the tail's versions at or
    /// before `at` that are newer than what the slot holds.
    pub fn overlay(
        &self,
        volume: u32,
        start: u64,
        end: u64,
        at: u64,
        out: &mut [Option<(u64, Version)>],
    ) {
        let Some(v) = self.volumes.get(&volume) else {
            return;
        };
        for (&vseq, e) in v.range(..=at) {
            let Some((s, t)) = sectors_of(e.offset, u64::from(e.length)) else {
                continue;
            };
            let (lo, hi) = (s.max(start), t.min(end));
            if lo >= hi {
                continue;
            }
            let version = match e.kind {
                RecordKind::Write => Version::Log(e.addr),
                _ => Version::Zero,
            };
            for slot in &mut out[(lo - start) as usize..(hi - start) as usize] {
                if slot.is_none_or(|(b, _)| vseq > b) {
                    *slot = Some((vseq, version));
                }
            }
        }
    }

    /// The newest of `volume`'s records with timestamp ≤ `ts`, as (volume seq, timestamp).
    pub fn newest_at_or_before(&self, volume: u32, ts: u64) -> Option<(u64, u64)> {
        self.volumes.get(&volume).and_then(|v| {
            v.values()
                .rev()
                .find(|e| e.timestamp_ns <= ts)
                .map(|e| (e.volume_seq, e.timestamp_ns))
        })
    }

    /// `volume`'s records numbered in `(after, through]`, by number (diff and activity).
    pub fn entries_of(&self, volume: u32, after: u64, through: u64) -> Vec<DigestEntry> {
        match self.volumes.get(&volume) {
            Some(v) if through > after => v
                .range(after.saturating_add(1)..=through)
                .map(|(_, e)| *e)
                .collect(),
            _ => Vec::new(),
        }
    }

    /// The timestamp of `volume`'s record `vseq`, if in the tail.
    pub fn timestamp_of(&self, volume: u32, vseq: u64) -> Option<u64> {
        self.volumes
            .get(&volume)
            .and_then(|v| v.get(&vseq))
            .map(|e| e.timestamp_ns)
    }
}
