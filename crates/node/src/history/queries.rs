//! `mariner diff` and `mariner history`: what changed between two instants, and writes over
//! time — from history's digests (and its unindexed tail), never from payloads
//! (lu-dissertation ch. 4: the TL index answers time-range queries).

use mariner_history::{Changes, Point};
use serde::Serialize;

use super::instant::format_ns;
use crate::{Node, NodeError};

/// An instant as the API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct PointInfo {
    pub volume_seq: u64,
    pub timestamp_ns: u64,
    pub time: String,
}

impl From<Point> for PointInfo {
    fn from(p: Point) -> Self {
        Self {
            volume_seq: p.volume_seq,
            timestamp_ns: p.timestamp_ns,
            time: format_ns(p.timestamp_ns),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ExtentInfo {
    pub offset: u64,
    pub length: u64,
}

/// `mariner diff`.
#[derive(Debug, Clone, Serialize)]
pub struct DiffInfo {
    pub from: PointInfo,
    pub to: PointInfo,
    pub extents: Vec<ExtentInfo>,
    /// Bytes the extents cover.
    pub changed_bytes: u64,
    pub writes: u64,
    pub write_bytes: u64,
    pub zeroings: u64,
    pub zeroed_bytes: u64,
    /// History's digest bytes read to answer (no payload is read).
    pub digest_bytes_read: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct BucketInfo {
    pub start_ns: u64,
    pub end_ns: u64,
    pub start: String,
    pub writes: u64,
    pub write_bytes: u64,
    pub zeroings: u64,
    pub zeroed_bytes: u64,
}

/// `mariner history VOL`.
#[derive(Debug, Clone, Serialize)]
pub struct ActivityInfo {
    pub from: PointInfo,
    pub to: PointInfo,
    pub writes: u64,
    pub write_bytes: u64,
    pub zeroings: u64,
    pub zeroed_bytes: u64,
    pub buckets: Vec<BucketInfo>,
}

impl Node {
    /// Two instants of `volume`, the first not after the second.
    fn span(&self, volume: &str, from: &str, to: &str) -> Result<(Point, Point), NodeError> {
        let a = self.resolve_instant(volume, from)?;
        let b = self.resolve_instant(volume, to)?;
        if a.volume_seq > b.volume_seq {
            return Err(NodeError::BadRequest(format!(
                "--from {from} (@{}) comes after --to {to} (@{})",
                a.volume_seq, b.volume_seq
            )));
        }
        Ok((a, b))
    }

    /// The extents of `volume` changed between two instants.
    pub fn diff(&self, volume: &str, from: &str, to: &str) -> Result<DiffInfo, NodeError> {
        let (h, id) = self.history_for(volume)?;
        let (a, b) = self.span(volume, from, to)?;
        let c: Changes = h
            .changes(id, a.volume_seq, b.volume_seq)
            .map_err(|e| self.history_error(volume, from, e))?;
        Ok(DiffInfo {
            from: a.into(),
            to: b.into(),
            changed_bytes: c.extents.iter().map(|e| e.length).sum(),
            extents: c
                .extents
                .iter()
                .map(|e| ExtentInfo {
                    offset: e.offset,
                    length: e.length,
                })
                .collect(),
            writes: c.writes,
            write_bytes: c.write_bytes,
            zeroings: c.zeroings,
            zeroed_bytes: c.zeroed_bytes,
            digest_bytes_read: c.digest_bytes_read,
        })
    }

    /// `volume`'s writes between two instants (the oldest kept and now by default) in
    /// `buckets` equal stretches of time.
    pub fn activity(
        &self,
        volume: &str,
        from: Option<&str>,
        to: Option<&str>,
        buckets: u32,
    ) -> Result<ActivityInfo, NodeError> {
        if !(1..=10_000).contains(&buckets) {
            return Err(NodeError::BadRequest("buckets: 1 to 10000".into()));
        }
        let (h, id) = self.history_for(volume)?;
        let oldest = h
            .window(id)
            .map_err(|e| self.history_error(volume, "the window", e))?
            .oldest;
        let from = from.map_or_else(|| format!("@{}", oldest.volume_seq), str::to_string);
        let (a, b) = self.span(volume, &from, to.unwrap_or("now"))?;
        let list = h
            .activity(id, a, b, buckets)
            .map_err(|e| self.history_error(volume, &from, e))?;
        let sum = |f: fn(&mariner_history::Bucket) -> u64| list.iter().map(f).sum::<u64>();
        Ok(ActivityInfo {
            from: a.into(),
            to: b.into(),
            writes: sum(|x| x.writes),
            write_bytes: sum(|x| x.write_bytes),
            zeroings: sum(|x| x.zeroings),
            zeroed_bytes: sum(|x| x.zeroed_bytes),
            buckets: list
                .iter()
                .map(|x| BucketInfo {
                    start_ns: x.start_ns,
                    end_ns: x.end_ns,
                    start: format_ns(x.start_ns),
                    writes: x.writes,
                    write_bytes: x.write_bytes,
                    zeroings: x.zeroings,
                    zeroed_bytes: x.zeroed_bytes,
                })
                .collect(),
        })
    }
}
