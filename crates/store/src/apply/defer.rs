//! When write-back runs: the applier leaves records in the log while writers are busy, and
//! applies them once the writers pause, a record has waited long enough, the log is short of
//! space, or the store holds more of it than a restart should replay.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use crate::Store;

/// The fraction of the log in use beyond which write-back starts whether or not the writers
/// pause (see [`Store::log_pressure`]).
const PRESSURE_FILL: (u64, u64) = (3, 4);

/// [`Store::log_pressure`] on the log's counters.
pub(super) fn under_pressure(segments_used: u64, segments_total: u64, stalled: u64) -> bool {
    let (num, den) = PRESSURE_FILL;
    stalled > 0 || segments_used * den > segments_total * num
}

impl Store {
    /// How much longer to leave the queued records in the log, or `None` to apply now: at
    /// shutdown, under log pressure, once the records not yet synced hold
    /// `apply_max_held_bytes` of the log, once the writers have paused for `apply_idle_ms`, or
    /// once the oldest record has waited `apply_max_delay_ms`.
    pub(super) fn defer(&self, q: &crate::Queue) -> Option<Duration> {
        let idle = Duration::from_millis(self.cfg.apply_idle_ms);
        if idle.is_zero() || q.shutdown || self.log_pressure() || self.holds_too_much() {
            return None;
        }
        let quiet = q.last_accept.map_or(idle, |t| self.since(t));
        let max_delay = Duration::from_millis(self.cfg.apply_max_delay_ms);
        let waited = q
            .items
            .first_key_value()
            .map_or(max_delay, |(_, item)| self.since(item.accepted));
        let nap = idle
            .saturating_sub(quiet)
            .min(max_delay.saturating_sub(waited));
        (!nap.is_zero()).then_some(nap)
    }

    /// Whether the log needs its space back now: a writer waits for space, or more than
    /// [`PRESSURE_FILL`] of the log holds records this store has not released (what other
    /// holders keep, history say, does not count: the log lets go of it when full, or it is
    /// theirs to release). The quarter left is headroom for the writers
    /// while the applier catches up (under pressure it syncs and releases after every round);
    /// the three quarters before it absorb a burst without write-back competing with the
    /// writers for CPU (40,000 4 KiB writes at depth 32 into the default 256 MiB log: 44–47k
    /// IOPS when write-back started at half full, docs/benchmarks.md).
    pub(super) fn log_pressure(&self) -> bool {
        let (Some(log), Some(holder)) = (self.log.get(), self.holder.get()) else {
            return false;
        };
        let s = log.stats();
        under_pressure(
            holder.segments_held(),
            s.segments_total.load(Relaxed),
            s.stalled.load(Relaxed),
        )
    }

    /// Whether the store's hold on the log spans more than `apply_max_held_bytes`: a restart
    /// would replay that much before serving (16 GiB deferred under a 30 s stream of writes
    /// took 8.6 s to replay, bench/history-scale.sh).
    fn holds_too_much(&self) -> bool {
        let (Some(log), Some(holder)) = (self.log.get(), self.holder.get()) else {
            return false;
        };
        let held = holder
            .segments_held()
            .saturating_mul(log.superblock().segment_bytes);
        held > self.cfg.apply_max_held_bytes
    }
}
