//! Holders of log space: who keeps records in the log, and how far each lets go.
//!
//! A record may be needed by several consumers at once: the store until it has applied it (the
//! only copy of an unapplied write is in the log), history until its index and base image
//! have it (dissertation ch. 4: the log is what history's window is read from), a replica
//! until it has it. Each is a named holder with its own watermark, the sequence number at or
//! below which it no longer needs a record, and a kind saying what happens when the log fills:
//!
//! | kind          | when writers wait for log space                                          |
//! |---------------|--------------------------------------------------------------------------|
//! | `MustHold`    | they keep waiting until it releases (the store)                          |
//! | `Shrinkable`  | its oldest records are let go at once and it is cut (history shrinks)    |
//! | `Bounded`     | cut once the shrinkable holders have nothing more to give (a replica)    |
//!
//! A bounded holder is also cut whenever it keeps more than its limit beyond the must-hold
//! holders, full log or not. Writers never wait for a holder that is not must-hold: history
//! shrinks first, because a replica that falls behind recovers by a resync from the current
//! image, and past that the replica is cut too rather than stop the primary.
//!
//! A segment is reused only when every record in it is at or below every holder's watermark.
//! "Cut" means the log let go of records the holder had not released: its watermark rises to
//! the highest sequence number of what was let go, and [`Holder::cut_to`] says so, so the holder
//! knows it lost a prefix (history: the window shrank) instead of finding out on a read.
//!
//! Durability: a holder persists its watermark itself, and calls [`Holder::release`] only with
//! what it has persisted; at [`crate::Log::open`] it passes that watermark back
//! ([`HolderSpec`]). A holder not passed at open holds nothing. Recovery keeps in use every
//! segment with a record above the lowest watermark, and hands the records above the lowest
//! must-hold watermark (the store's) to replay — not those only history still holds.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use crate::writer::Shared;
use crate::LogError;

/// What happens to a holder's records when writers wait for log space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldKind {
    /// Writers wait until it releases: its records exist nowhere else (the store).
    MustHold,
    /// Held while it keeps at most `max_bytes` of log segments beyond what the must-hold
    /// holders keep, and cut past that; when writers wait for space, cut once the shrinkable
    /// holders have nothing more to give (a replica, which then resyncs by changed extents
    /// instead of stopping the primary).
    Bounded { max_bytes: u64 },
    /// Writers never wait for it: when they would, its oldest segments are let go and it is cut
    /// (history, whose window shrinks from its old end).
    Shrinkable,
}

/// A holder as the log is opened: its name, kind, and the watermark it persisted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HolderSpec {
    pub name: String,
    pub kind: HoldKind,
    /// Every record at or below this sequence number it no longer needs.
    pub seq: u64,
    /// The timestamp of that record (timestamps stay strictly rising across a restart even
    /// when every record was released).
    pub ts: u64,
    /// Per volume, the highest volume sequence number at or below `seq`: the log no longer
    /// reads those records, so a volume quiet since then continues from here.
    pub volume_seqs: BTreeMap<u32, u64>,
}

impl HolderSpec {
    pub fn new(name: &str, kind: HoldKind, seq: u64, ts: u64) -> Self {
        Self {
            name: name.to_string(),
            kind,
            seq,
            ts,
            volume_seqs: BTreeMap::new(),
        }
    }

    /// With the volumes' sequence numbers at its watermark.
    pub fn with_volume_seqs(mut self, volume_seqs: BTreeMap<u32, u64>) -> Self {
        self.volume_seqs = volume_seqs;
        self
    }

    /// The store's kind of holder: a consumer whose records exist nowhere else.
    pub fn must_hold(name: &str, seq: u64, ts: u64) -> Self {
        Self::new(name, HoldKind::MustHold, seq, ts)
    }
}

/// The watermarks that matter at open, from the holders' specs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OpenMarks {
    /// Segments with a record above this stay in use (the lowest watermark).
    pub keep_after: u64,
    /// Records above this are replayed (the lowest must-hold watermark; with no must-hold
    /// holder, the lowest watermark).
    pub replay_after: u64,
    /// The highest watermark and timestamp any holder saw: the floors of the next record's.
    pub seq_floor: u64,
    pub ts_floor: u64,
}

/// Checks the specs (at least one, names distinct and non-empty) and derives the marks.
pub(crate) fn open_marks(specs: &[HolderSpec]) -> Result<OpenMarks, LogError> {
    if specs.is_empty() {
        return Err(LogError::Config("the log needs at least one holder".into()));
    }
    for (i, s) in specs.iter().enumerate() {
        if s.name.is_empty() {
            return Err(LogError::Config("a log holder needs a name".into()));
        }
        if specs[..i].iter().any(|o| o.name == s.name) {
            return Err(LogError::Config(format!(
                "log holder {:?} given twice",
                s.name
            )));
        }
    }
    let keep_after = specs.iter().map(|s| s.seq).min().unwrap_or(0);
    let replay_after = specs
        .iter()
        .filter(|s| s.kind == HoldKind::MustHold)
        .map(|s| s.seq)
        .min()
        .unwrap_or(keep_after);
    Ok(OpenMarks {
        keep_after,
        replay_after,
        seq_floor: specs.iter().map(|s| s.seq).max().unwrap_or(0),
        ts_floor: specs.iter().map(|s| s.ts).max().unwrap_or(0),
    })
}

/// One holder's state in the dispatcher's bookkeeping ([`crate::Dispatch::holds`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hold {
    pub kind: HoldKind,
    /// Its watermark: what it released, or what it was cut to if that is higher.
    pub released: u64,
    /// The highest sequence number let go of without its release; 0 if never cut.
    pub cut_to: u64,
    /// Segments let go of past it.
    pub cuts: u64,
}

impl Hold {
    pub fn new(kind: HoldKind, released: u64) -> Self {
        Self {
            kind,
            released,
            cut_to: 0,
            cuts: 0,
        }
    }

    /// Lets go of records up to `seq` without its release.
    pub(crate) fn cut(&mut self, seq: u64) {
        if seq > self.released {
            self.released = seq;
            self.cut_to = self.cut_to.max(seq);
            self.cuts += 1;
        }
    }
}

/// What a holder's handle reads; the dispatcher stores it after every change.
#[derive(Debug, Default)]
pub(crate) struct HolderStats {
    pub released: AtomicU64,
    pub cut_to: AtomicU64,
    pub cuts: AtomicU64,
    /// Segments holding a record above its watermark.
    pub segments_held: AtomicU64,
}

impl HolderStats {
    pub(crate) fn store(&self, hold: &Hold, segments_held: u64) {
        self.released.store(hold.released, Relaxed);
        self.cut_to.store(hold.cut_to, Relaxed);
        self.cuts.store(hold.cuts, Relaxed);
        self.segments_held.store(segments_held, Relaxed);
    }
}

/// A holder's handle on the log ([`crate::Log::holder`]). Cheap to clone.
#[derive(Clone)]
pub struct Holder {
    pub(crate) shared: Arc<Shared>,
    pub(crate) index: usize,
    pub(crate) name: Arc<str>,
    pub(crate) kind: HoldKind,
    pub(crate) stats: Arc<HolderStats>,
}

impl std::fmt::Debug for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Holder")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("released", &self.released())
            .finish()
    }
}

impl Holder {
    /// This holder no longer needs the records at or below `seq` (it has persisted that).
    pub fn release(&self, seq: u64) {
        self.shared.release(self.index, seq);
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn kind(&self) -> HoldKind {
        self.kind
    }

    /// Its watermark: what it released, or what it was cut to if that is higher.
    pub fn released(&self) -> u64 {
        self.stats.released.load(Relaxed)
    }

    /// The highest sequence number the log let go of without this holder's release, if it
    /// ever did: records at or below it may be gone.
    pub fn cut_to(&self) -> Option<u64> {
        Some(self.stats.cut_to.load(Relaxed)).filter(|&s| s > 0)
    }

    /// Segments let go of past this holder.
    pub fn cuts(&self) -> u64 {
        self.stats.cuts.load(Relaxed)
    }

    /// Segments holding a record above its watermark: what it keeps from reuse.
    pub fn segments_held(&self) -> u64 {
        self.stats.segments_held.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_marks_keep_the_lowest_and_replay_the_must_hold() {
        let specs = [
            HolderSpec::must_hold("store", 100, 1_000),
            HolderSpec::new("history", HoldKind::Shrinkable, 40, 400),
            HolderSpec::new("replica", HoldKind::Bounded { max_bytes: 1 }, 70, 1_200),
        ];
        let m = open_marks(&specs).unwrap();
        assert_eq!((m.keep_after, m.replay_after, m.ts_floor), (40, 100, 1_200));
        let only_history = [HolderSpec::new("history", HoldKind::Shrinkable, 40, 400)];
        let m = open_marks(&only_history).unwrap();
        assert_eq!((m.keep_after, m.replay_after), (40, 40));
        assert!(open_marks(&[]).is_err());
        let twice = [
            HolderSpec::must_hold("store", 1, 1),
            HolderSpec::must_hold("store", 2, 2),
        ];
        assert!(open_marks(&twice).is_err());
        assert!(open_marks(&[HolderSpec::must_hold("", 1, 1)]).is_err());
    }

    #[test]
    fn a_cut_raises_the_watermark_and_says_so() {
        let mut h = Hold::new(HoldKind::Shrinkable, 10);
        h.cut(5);
        assert_eq!((h.released, h.cut_to, h.cuts), (10, 0, 0));
        h.cut(20);
        assert_eq!((h.released, h.cut_to, h.cuts), (20, 20, 1));
    }
}
