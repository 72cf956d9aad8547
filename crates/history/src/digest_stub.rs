//! Stand-in for the TL digests while they are written (same API, in memory): replaced by
//! [`crate::digest`] before this lands.
#![allow(dead_code)]

use crate::{DigestEntry, HistoryError};

#[derive(Debug, Default)]
pub struct Digests {
    entries: Vec<DigestEntry>,
}

impl Digests {
    pub fn append(&mut self, entries: &[DigestEntry]) -> Result<(), HistoryError> {
        self.entries.extend_from_slice(entries);
        Ok(())
    }
    pub fn sync(&mut self) -> Result<(), HistoryError> {
        Ok(())
    }
    pub fn last_seq(&self) -> u64 {
        self.entries.last().map_or(0, |e| e.seq)
    }
    pub fn drop_through(&mut self, _seq: u64) -> Result<u64, HistoryError> {
        Ok(0)
    }
    pub fn newest_at_or_before(
        &self,
        volume: u32,
        ts: u64,
    ) -> Result<Option<DigestEntry>, HistoryError> {
        Ok(self
            .entries
            .iter()
            .rev()
            .find(|e| e.volume == volume && e.timestamp_ns <= ts)
            .copied())
    }
    pub fn by_volume_seq(
        &self,
        volume: u32,
        volume_seq: u64,
    ) -> Result<Option<DigestEntry>, HistoryError> {
        Ok(self
            .entries
            .iter()
            .find(|e| e.volume == volume && e.volume_seq == volume_seq)
            .copied())
    }
    pub fn for_each(
        &self,
        after: u64,
        through: u64,
        volume: Option<u32>,
        mut f: impl FnMut(&DigestEntry) -> Result<(), HistoryError>,
    ) -> Result<(), HistoryError> {
        for e in &self.entries {
            if e.seq > after && e.seq <= through && volume.is_none_or(|v| v == e.volume) {
                f(e)?;
            }
        }
        Ok(())
    }
}
