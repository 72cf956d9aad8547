//! Pins: instants held against expiry (a snapshot exported by the node, a rollback's ends).
//!
//! A pin on a volume's instant `@N` stops the expiry roll-forward of that volume's base
//! before its first record numbered above N (`retention.rs`), so a read as of `@N` keeps
//! finding every version it needs. Shrinking — the log pressed, history giving way from its
//! old end — passes pins like any other instant: the log's space is not held hostage by a
//! forgotten snapshot, and a read as of a passed pin fails with `Expired`, as reads of
//! instants older than the window already do.
//!
//! Pins live in memory: the node pins its exports again after every open (before `start`, so
//! the first roll-forward respects them), and history re-takes the pins of a pending rollback
//! itself (`rollback.rs`).

use std::collections::BTreeMap;

use crate::engine::{lock, History};
use crate::HistoryError;

/// One pin, as [`History::pin`] returns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PinId(pub u64);

/// Every pin held, by id. Retention takes the lock while it chooses targets and until the
/// readers' floors are raised, and `pin` checks the window under it: a pin either fails as
/// expired or is seen by the roll-forward, never slips in between.
#[derive(Debug, Default)]
pub(crate) struct Pins {
    next: u64,
    held: BTreeMap<PinId, (u32, u64)>,
}

impl Pins {
    /// The oldest instant pinned on `volume`, if any.
    pub fn oldest(&self, volume: u32) -> Option<u64> {
        self.held
            .values()
            .filter(|(v, _)| *v == volume)
            .map(|&(_, s)| s)
            .min()
    }

    fn add(&mut self, volume: u32, volume_seq: u64) -> PinId {
        self.next += 1;
        let id = PinId(self.next);
        self.held.insert(id, (volume, volume_seq));
        id
    }
}

impl History {
    /// Holds `volume`'s instant `volume_seq` (the volume after that write) against expiry:
    /// roll-forward for expiry never takes the volume's base past it. Shrinking (the log
    /// pressed, retention.rs) may still pass it — reads as of it then fail with Expired, as
    /// they already do for instants older than the window. Errors with Expired if the
    /// instant is already outside the window. Pins live in memory; callers re-pin after open
    /// (before `start`, so the first roll-forward respects them).
    ///
    /// Before `start` the window is not known yet (the newest instants are still in the log):
    /// the pin is taken unchecked, and a read as of an instant no longer kept fails as usual.
    pub fn pin(&self, volume: u32, volume_seq: u64) -> Result<PinId, HistoryError> {
        let inner = &self.inner;
        let mut pins = lock(&inner.pins);
        if inner.log.get().is_some() {
            let w = self.window(volume)?;
            if volume_seq < w.oldest.volume_seq || volume_seq > w.newest.volume_seq {
                return Err(HistoryError::Expired {
                    volume,
                    asked: format!("@{volume_seq}"),
                    window: w.to_string(),
                });
            }
        }
        Ok(pins.add(volume, volume_seq))
    }

    /// Lets go of a pin (unknown ids are ignored): the volume's base may roll past the
    /// instant at the next roll-forward.
    pub fn unpin(&self, id: PinId) {
        let inner = &self.inner;
        if lock(&inner.pins).held.remove(&id).is_some() {
            // The next round looks again instead of waiting for a due time computed while
            // the pin held the base back.
            lock(&inner.roll_due).next_wall = 0;
        }
    }

    /// Pins held, as (volume, volume sequence number), oldest id first.
    pub fn pins(&self) -> Vec<(PinId, u32, u64)> {
        lock(&self.inner.pins)
            .held
            .iter()
            .map(|(&id, &(v, s))| (id, v, s))
            .collect()
    }
}
