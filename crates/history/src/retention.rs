//! Retention: the base images roll forward as records leave the protection window, and
//! earlier when the log is filling (history shrinks from its old end, counted and logged).
//!
//! A version may be dropped only when a newer version of the same block is itself older than
//! the window (../shared/DESIGN.md "History"). Rolling the base to the newest record older
//! than the window keeps exactly that: the base holds each block's newest version as of that
//! record, and every version it drops has a newer one at or before it.
//!
//! Order, so a crash at any point loses nothing and never shows a mix:
//! 1. the readers' floor rises to the target (reads as of earlier instants now fail; reads in
//!    flight finish first, since they hold the views' lock), and the state saves the target
//!    as `rolling` — from here the base may hold any mix of the records up to it;
//! 2. the records are applied to the bases (`roll.rs`: each byte from the newest record
//!    covering it, which gives the image applying them in order gives) and the bases synced;
//! 3. the state saves the base at the target, then the log is released behind it.
//!
//! An open that finds `rolling` set applies the records up to it again before anything is
//! read (applying them in order over any mix of them gives the same image).
//!
//! Pins (`pins.rs`) stop expiry, not shrinking: a volume's expiry target ends before its first
//! record numbered above its oldest pin, and a volume whose base stands at its pin sits out
//! expiry rounds (so it does not hold back the others'); shrinking ignores pins.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::MutexGuard;

use mariner_log::{HoldKind, Holder};

use crate::engine::{lock, Inner};
use crate::pins::Pins;
use crate::round::{Plan, Scan, Shrink, VolumeScan};
use crate::state::FLAG_BROKEN;
use crate::{DigestEntry, HistoryError};

/// Most records read from the digests at once (a round's scan, a prune's round: their
/// entries, 56 bytes each, are in memory meanwhile: 14 MiB); the default of
/// `HistoryConfig::round_records`. A round passes at most `ROUND_CHUNKS` of them.
pub(crate) const ROUND_RECORDS: u64 = 262_144;
/// Most chunks of `round_records` one round passes (4 M records by default: at ~30 k
/// writes/s, 140 s of them): a round's scan costs CPU per record, and holds the rounds' lock.
const ROUND_CHUNKS: u64 = 16;
/// Most distinct ranges one round writes (the default of `HistoryConfig::round_pieces`):
/// 512 MiB of 4 KiB writes; in memory while it runs, ~100 bytes each.
pub(crate) const ROUND_PIECES: usize = 131_072;
/// Share of the log history may hold before it rolls forward early (shrinks).
const PRESSURE: f64 = 0.6;
/// Share of the log a shrink brings what history holds back to.
const SHRINK_TO: f64 = 0.4;
/// Expiry rolls forward at most this often (shrinking, whenever the log is pressed)...
pub(crate) const ROLL_INTERVAL: std::time::Duration = std::time::Duration::from_secs(15);
/// ...and waits for records past their window to fill `EXPIRED_SHARE` of the log, at most
/// this long. A round writes each block once, its newest version, so the base's writes per
/// record fall with the records per round wherever blocks are overwritten: 4 KiB random
/// writes over 256 MiB at ~30 k/s wrote 3.9 KiB of base per record in rounds a second apart,
/// 2.56 KiB in rounds 5 s apart, and in rounds 15 s apart each round rewrote the whole
/// 256 MiB (docs/benchmarks.md, 31st and 34th sessions). Expired records are only kept
/// longer: the log holds them, nothing else.
pub(crate) const ROLL_INTERVAL_MAX: std::time::Duration = std::time::Duration::from_secs(120);
/// Share of the log the records past their window may fill before expiry rolls them (well
/// under `PRESSURE` with the window's own share and a round's time of writes on top).
const EXPIRED_SHARE: f64 = 0.3;

/// When the next roll-forward for expiry can be due.
#[derive(Debug, Default)]
pub(crate) struct RollDue {
    /// The wall-clock time at which the oldest record kept leaves its volume's window, when
    /// known (0: unknown).
    pub next_wall: u64,
    /// That record's timestamp (0: unknown).
    pub oldest_kept: u64,
    pub last: Option<std::time::Instant>,
}

/// Where a roll-forward takes one volume's base: every record of the volume up to log
/// sequence number `seq`; the base is then as of `ts`, after the volume's write `vseq`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Target {
    pub seq: u64,
    pub vseq: u64,
    pub ts: u64,
}

impl Inner {
    /// Rolls the bases forward over what left each volume's window, or over the oldest
    /// records when the log is filling.
    pub(crate) fn roll_forward_if_due(&self) -> Result<(), HistoryError> {
        if self.cfg.rolls_stalled_until_cut && self.stats.cuts.load(Relaxed) == 0 {
            return Ok(());
        }
        let now = self.clock.wall_ns();
        let pressed = self.log_pressed();
        if !pressed && !self.expiry_due(now) {
            return Ok(());
        }
        let (bases, indexed) = {
            let st = lock(&self.state);
            let bases: BTreeMap<u32, crate::state::VolumeState> = st
                .volumes
                .iter()
                .filter(|(_, v)| v.flags & FLAG_BROKEN == 0)
                .map(|(&id, v)| (id, *v))
                .collect();
            (bases, st.indexed_seq)
        };
        // The pins as the scan starts; checked again before the floors rise (`pin` checks
        // the window under the pins' lock, so a pin is either refused as expired or seen).
        let pinned: BTreeMap<u32, u64> = {
            let pins = lock(&self.pins);
            bases
                .keys()
                .filter_map(|&id| pins.oldest(id).map(|p| (id, p)))
                .collect()
        };
        // A volume whose base has reached its oldest pin cannot move by expiry: it does not
        // hold the others' rounds back (it still bounds what the log keeps). Shrinking passes
        // pins, so then every volume counts.
        let stuck = |id: &u32, v: &crate::state::VolumeState| {
            pinned.get(id).is_some_and(|&p| p <= v.base_vseq)
        };
        let Some(from) = bases
            .iter()
            .filter(|(id, v)| pressed || !stuck(id, v))
            .map(|(_, v)| v.base_seq)
            .min()
        else {
            return Ok(());
        };
        if from >= indexed {
            return Ok(());
        }
        let chunk = self.cfg.round_records.max(1);
        let limit = indexed.min(from.saturating_add(chunk.saturating_mul(ROUND_CHUNKS)));
        let volumes = bases
            .iter()
            .map(|(&id, v)| {
                let window_ns = nanos(self.window_of(id));
                let scan = VolumeScan {
                    vseq: v.base_vseq,
                    ts: v.base_ts,
                    base_seq: v.base_seq,
                    cutoff: now.saturating_sub(window_ns),
                    pin: pinned.get(&id).copied().unwrap_or(u64::MAX),
                    window_ns,
                    expiring: !stuck(&id, v),
                    ended: v.base_seq,
                };
                (id, scan)
            })
            .collect();
        // Shrink: at least an eighth of a round's records, oldest first, whatever their
        // volume — under the throttle policy never past `min_window` (writers wait instead:
        // history is then a must-hold holder).
        let shrink = pressed.then(|| Shrink {
            end: self
                .shrink_through(from)
                .max(from + (indexed.min(from.saturating_add(chunk)) - from).div_ceil(8)),
            floor: (self.cfg.kind == HoldKind::MustHold)
                .then(|| now.saturating_sub(nanos(self.cfg.min_window))),
        });
        let mut scan = Scan::new(volumes, shrink);
        let pieces = self.cfg.round_pieces.max(1);
        let (mut full, mut done) = (false, false);
        let through = self.scan_digests(from, limit, |e| {
            if scan.pass(e).is_break() {
                done = true;
                return ControlFlow::Break(());
            }
            full = scan.plan.pieces() >= pieces;
            if full {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })?;
        // Cut short by its size: more records may have left the window.
        let cut_short = full || (!done && through < indexed);
        {
            let mut due = lock(&self.roll_due);
            let known = scan.next_wall != u64::MAX;
            due.next_wall = if known { scan.next_wall } else { 0 };
            due.oldest_kept = if known { scan.oldest_kept } else { 0 };
        }
        let targets = scan.targets(through);
        if targets.is_empty() {
            return Ok(());
        }
        // Held until the readers' floors are raised (`roll_forward`). A pin taken since the
        // scan began on an instant the round would roll past: the round waits for the next
        // look, which sees the pin.
        let pins = lock(&self.pins);
        let moved = targets.iter().any(|(&id, t)| {
            pins.oldest(id)
                .is_some_and(|p| p < pinned.get(&id).copied().unwrap_or(u64::MAX) && p < t.vseq)
        });
        if moved {
            return Ok(());
        }
        if scan.shrank > 0 {
            self.stats.shrinks.fetch_add(1, Relaxed);
            let oldest = targets.values().map(|t| t.ts).min().unwrap_or(0);
            self.warn_shrink(now, oldest, scan.shrank);
        }
        // A round cut short by its size leaves the next free to start at once.
        lock(&self.roll_due).last = (!cut_short).then(|| self.clock.now());
        self.roll_forward(scan.plan, &targets, pins)
    }

    /// Whether a round of expiry is due (the log not pressed): the oldest record kept has
    /// left its window, at least `ROLL_INTERVAL` since the last round, and either the
    /// records past their window fill `EXPIRED_SHARE` of the log (their share of what
    /// history holds taken from their share of its time) or `ROLL_INTERVAL_MAX` has passed.
    fn expiry_due(&self, now: u64) -> bool {
        let due = lock(&self.roll_due);
        if due.next_wall > now {
            return false;
        }
        let Some(since) = due
            .last
            .map(|t| self.clock.now().saturating_duration_since(t))
        else {
            return true;
        };
        if since < ROLL_INTERVAL {
            return false;
        }
        if since >= ROLL_INTERVAL_MAX || due.next_wall == 0 || due.oldest_kept >= now {
            return true;
        }
        let expired = now.saturating_sub(due.next_wall) as f64;
        let held = now.saturating_sub(due.oldest_kept) as f64;
        self.held_share() * (expired / held) >= EXPIRED_SHARE
    }

    /// Passes the digests' entries in `(from, limit]` to `f` in order, read `round_records`
    /// at a time (the digests' lock is not held while `f` runs). Returns the sequence number
    /// through which every entry was passed: `limit`, or the entry `f` stopped at.
    fn scan_digests(
        &self,
        from: u64,
        limit: u64,
        mut f: impl FnMut(&DigestEntry) -> ControlFlow<()>,
    ) -> Result<u64, HistoryError> {
        let chunk = usize::try_from(self.cfg.round_records.max(1)).unwrap_or(usize::MAX);
        let mut buf = Vec::new();
        let mut pos = from;
        loop {
            buf.clear();
            lock(&self.digests).for_each_until(pos, limit, None, |e| {
                buf.push(*e);
                Ok(if buf.len() >= chunk {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                })
            })?;
            for e in &buf {
                if f(e).is_break() {
                    return Ok(e.seq);
                }
            }
            match buf.last() {
                Some(e) if buf.len() >= chunk && e.seq < limit => pos = e.seq,
                _ => return Ok(limit),
            }
        }
    }

    /// The window of `volume` (its own, or the configured one).
    pub(crate) fn window_of(&self, volume: u32) -> std::time::Duration {
        lock(&self.windows)
            .get(&volume)
            .copied()
            .flatten()
            .unwrap_or(self.cfg.window)
    }

    /// Says that history shrank — at most once a minute, with what it shrank to — and raises
    /// an alert when the window fell below half the configured one or below `min_window`:
    /// a burst of overwrites (ransomware) must not flush history away unnoticed.
    fn warn_shrink(&self, now: u64, oldest_ts: u64, records: usize) {
        let effective = std::time::Duration::from_nanos(now.saturating_sub(oldest_ts));
        let mut last = lock(&self.last_warning);
        if last.is_some_and(|t| t.elapsed() < std::time::Duration::from_secs(60)) {
            return;
        }
        *last = Some(std::time::Instant::now());
        let (window, floor) = (self.cfg.window, self.cfg.min_window);
        if effective < floor || effective < window / 2 {
            tracing::error!(
                effective_window_s = effective.as_secs(),
                configured_window_s = window.as_secs(),
                min_window_s = floor.as_secs(),
                records,
                "ALERT: history's window fell to {}s (configured {}s, floor {}s): the log fills \
                 faster than the window can be kept — a burst of overwrites is flushing history \
                 away; grow the log, or set [history] policy = \"throttle\"",
                effective.as_secs(),
                window.as_secs(),
                floor.as_secs()
            );
        } else {
            tracing::warn!(
                effective_window_s = effective.as_secs(),
                configured_window_s = window.as_secs(),
                records,
                "the log is filling before history's window ends: history shrinks from its \
                 oldest end"
            );
        }
    }

    /// How far (a log sequence number) to roll forward now, from `from`, to bring what
    /// history holds of the log back to 40 % — less when it holds more than 60 %, down to
    /// 20 % at 80 % and beyond —, assuming records fill segments alike.
    ///
    /// The log keeps filling while a round runs: holding more than the pressure mark means
    /// writes outran the last round, and a round that only went back to 40 % would end with
    /// the log fuller still, until it cut history.
    ///
    /// Counted over every record history holds — up to the newest durable one, indexed or
    /// not — since all of them fill its segments: counted over the indexed ones only, a round
    /// taken while indexing lags (the log filling fastest) released too little, and the log
    /// kept filling until it cut history.
    fn shrink_through(&self, from: u64) -> u64 {
        let (Some(log), Some(h)) = (self.log.get(), self.holder.get()) else {
            return from;
        };
        let total = log.stats().segments_total.load(Relaxed) as f64;
        let excess = excess_share(h.segments_held() as f64, total);
        let records = log.stats().durable_seq.load(Relaxed).saturating_sub(from) as f64;
        from.saturating_add((records * excess).ceil() as u64)
    }

    /// How long the indexer collects a batch: the batch interval, or a few milliseconds
    /// while the log is pressed (history then indexes and rolls forward that often). Asked
    /// again at every wake-up — the sink wakes the indexer once the log is pressed — since
    /// a burst can fill the log within one batch interval: the round then starts at once,
    /// over every record that came, indexed first.
    ///
    /// Not sooner (at 40 %, say): history may hold half the log for good when its window
    /// fits, and indexing every few milliseconds costs syncs that writers then wait behind.
    pub(crate) fn batch_wait(&self) -> std::time::Duration {
        if self.log_pressed() {
            self.cfg
                .batch_interval
                .min(std::time::Duration::from_millis(10))
        } else {
            self.cfg.batch_interval
        }
    }

    /// The share of the log's segments history holds (0 before it starts).
    fn held_share(&self) -> f64 {
        let (Some(log), Some(h)) = (self.log.get(), self.holder.get()) else {
            return 0.0;
        };
        let total = log.stats().segments_total.load(Relaxed);
        if total == 0 {
            return 0.0;
        }
        h.segments_held() as f64 / total as f64
    }

    /// Whether history holds so much of the log that it must shrink rather than wait for
    /// records to age out.
    pub(crate) fn log_pressed(&self) -> bool {
        self.held_share() >= PRESSURE
    }

    /// Puts history's threads in the idle CPU class while it keeps pace — the log not pressed,
    /// less than a batch waiting to be indexed — and in the normal class otherwise. The sink
    /// moves them to the normal class as soon as either happens; the indexer moves them
    /// back after a round. (Leaving a shrink in the idle class until history held 75 % of
    /// (b)'s log did not help its depth-1 p99: docs/benchmarks.md, sixteenth session.)
    pub(crate) fn keep_pace(&self) {
        let queued = lock(&self.incoming).len();
        self.cpu.set_background(!self.behind(queued));
    }

    /// Whether history must catch up now, with `queued` records waiting to be indexed: a
    /// full batch waits, or the log is pressed.
    pub(crate) fn behind(&self, queued: usize) -> bool {
        queued >= self.cfg.batch_records || self.log_pressed()
    }

    /// The log let go of records the base did not have yet (it filled faster than the base
    /// rolled forward): the history of those volumes is broken until it is seeded again.
    pub(crate) fn check_cut(&self) {
        if let Some(cut) = self.holder.get().and_then(Holder::cut_to) {
            self.note_cut(cut);
        }
    }

    /// The log let go of records through `cut`: every volume whose base lacks any of them
    /// (and is not rolling past them: that roll-forward finds out itself) is broken.
    pub(crate) fn note_cut(&self, cut: u64) {
        let mut st = lock(&self.state);
        let mut broke = Vec::new();
        for (&id, v) in st.volumes.iter_mut() {
            if v.flags & FLAG_BROKEN == 0 && v.base_seq < cut && v.rolling_seq < cut {
                v.flags |= FLAG_BROKEN;
                broke.push(id);
            }
        }
        if !broke.is_empty() {
            self.stats.cuts.fetch_add(1, Relaxed);
            tracing::warn!(
                cut,
                volumes = ?broke,
                "the log filled faster than history's base images rolled forward: their \
                 history is lost up to the cut until it is seeded again"
            );
            drop(st);
            self.note_views();
        }
    }

    /// Whether the log cut history before the crash or stop this start follows: the log does
    /// not save a cut ([`Holder::cut_to`] starts empty), and history may not have noted it
    /// ([`Self::check_cut`]) before going down. Returns the highest sequence number that may
    /// be gone, of the records history indexed (those above are checked by their replay).
    ///
    /// On each device, the first record history still needs (above what it holds, through
    /// what it indexed: the digests say where each lies) must be at or after the first record
    /// the log kept there ([`mariner_log::Recovery::first_kept`]): records of a device are
    /// let go in its order, so one below it may be gone, with every record of that device
    /// before the first kept — the cut is taken to reach that record's predecessor. Exact
    /// with one log device whose oldest segment kept starts with a record appended, not a void
    /// an open wrote; otherwise it may count in records that are still there (on other
    /// devices, or in that segment), and break their volumes too. Reads the digests from what history
    /// holds until every device has shown its first record, or past the highest first kept.
    pub(crate) fn cut_before_start(
        &self,
        first_kept: &[Option<u64>],
        indexed: u64,
    ) -> Result<Option<u64>, HistoryError> {
        let holds = self.holds(&lock(&self.state));
        if indexed <= holds || first_kept.is_empty() {
            return Ok(None);
        }
        // Entries from here on are on their devices at or after the first kept.
        let all_kept_from = first_kept
            .iter()
            .map(|f| f.unwrap_or(u64::MAX))
            .max()
            .unwrap_or(0);
        let mut seen = vec![false; first_kept.len()];
        let mut cut: Option<u64> = None;
        lock(&self.digests).for_each_until(holds, indexed, None, |e| {
            if e.seq >= all_kept_from {
                return Ok(ControlFlow::Break(()));
            }
            let dev = e.addr.dev();
            // Only each device's first record counts; a device the log no longer has keeps
            // nothing.
            match seen.get_mut(dev) {
                Some(true) => return Ok(ControlFlow::Continue(())),
                Some(s) => *s = true,
                None => {}
            }
            let kept = first_kept.get(dev).copied().flatten();
            if kept.is_none_or(|f| e.seq < f) {
                let through = kept.map_or(indexed, |f| f - 1).min(indexed);
                cut = Some(cut.map_or(through, |c| c.max(through)));
            }
            Ok(if seen.iter().all(|&s| s) {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            })
        })?;
        Ok(cut)
    }

    /// Rolls the bases forward to `targets`, applying `plan`.
    fn roll_forward(
        &self,
        plan: Plan,
        targets: &BTreeMap<u32, Target>,
        pins: MutexGuard<'_, Pins>,
    ) -> Result<(), HistoryError> {
        // 1. Floors up, intent saved.
        {
            let mut st = lock(&self.state);
            for (id, t) in targets {
                let Some(v) = st.volumes.get_mut(id) else {
                    continue;
                };
                if v.flags & FLAG_BROKEN != 0 || v.base_seq >= t.seq {
                    continue;
                }
                v.rolling_seq = t.seq;
                v.rolling_vseq = t.vseq;
                v.rolling_ts = t.ts;
            }
        }
        self.note_views();
        drop(pins);
        // Each phase timed: when the log outruns the rounds, this says which phase to blame.
        let started = std::time::Instant::now();
        self.save(true)?;
        let saved = started.elapsed();
        // 2. and 3.
        let records = plan.records;
        self.apply_rolling(plan)?;
        let applied = started.elapsed();
        self.stats.roll_forwards.fetch_add(1, Relaxed);
        self.prune()?;
        tracing::debug!(
            records,
            intent_ms = saved.as_millis(),
            apply_ms = (applied - saved).as_millis(),
            prune_ms = (started.elapsed() - applied).as_millis(),
            "history rolled forward"
        );
        Ok(())
    }

    /// Removes the index entries of the records the bases now hold, then the digests no
    /// longer needed. In rounds of at most `round_records` sequence numbers, each saved:
    /// after a seed the bases jump over every record since the old base (days of them, after
    /// a long cut), which would not fit in memory at once. Crash-safe: the state's
    /// `pruned_seq` says where to resume.
    pub(crate) fn prune(&self) -> Result<(), HistoryError> {
        let (mut pruned, upto) = {
            let st = lock(&self.state);
            let upto = st
                .volumes
                .values()
                .map(|v| v.base_seq)
                .min()
                .unwrap_or(st.indexed_seq)
                .min(st.indexed_seq);
            (st.pruned_seq, upto)
        };
        while upto > pruned {
            let through = upto.min(pruned.saturating_add(self.cfg.round_records));
            let mut entries = Vec::new();
            lock(&self.digests).for_each(pruned, through, None, |e| {
                entries.push(*e);
                Ok(())
            })?;
            let removed = {
                let _turn = self.turn_after();
                self.index.remove(&entries)?
            };
            self.stats.keys_removed.fetch_add(removed as u64, Relaxed);
            lock(&self.state).pruned_seq = through;
            self.save(true)?;
            pruned = through;
        }
        let holds = {
            let st = lock(&self.state);
            self.holds(&st).min(st.pruned_seq)
        };
        lock(&self.digests).drop_through(holds)?;
        Ok(())
    }

    /// At start: a roll-forward a crash interrupted is applied again, whole.
    pub(crate) fn finish_roll_forward(&self) -> Result<(), HistoryError> {
        let rolling = self.rolling();
        let from = rolling.values().map(|r| r.0).min();
        let Some((from, to)) = from.zip(rolling.values().map(|r| r.1).max()) else {
            return Ok(());
        };
        let mut plan = Plan::default();
        self.scan_digests(from, to, |e| {
            if rolling
                .get(&e.volume)
                .is_some_and(|&(after, through)| e.seq > after && e.seq <= through)
            {
                plan.take(e);
            }
            ControlFlow::Continue(())
        })?;
        tracing::info!(
            records = plan.records,
            "history: finishing a roll-forward of the base images a crash interrupted"
        );
        self.stats.resumed_rolls.fetch_add(1, Relaxed);
        self.apply_rolling(plan)
    }
}

/// Of what history holds (`held` of the log's `total` segments), the share at its old end to
/// roll forward: what brings it back to 40 %, or lower the more it holds past 60 % (see
/// `shrink_through`).
fn excess_share(held: f64, total: f64) -> f64 {
    if held <= 0.0 || total <= 0.0 {
        return 0.0;
    }
    let over = (held / total - PRESSURE).max(0.0);
    let to = (SHRINK_TO - over).max(SHRINK_TO / 2.0);
    ((held - to * total) / held).clamp(0.0, 1.0)
}

fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::excess_share;

    /// What a shrink leaves history of the log: 40 % when pressed at 60 %, less the further
    /// past it, never under 20 %; nothing when it holds nothing.
    #[test]
    fn a_shrink_goes_lower_the_fuller_the_log() {
        let left = |held: f64| held * (1.0 - excess_share(held, 100.0));
        assert!((left(60.0) - 40.0).abs() < 1e-9);
        assert!((left(70.0) - 30.0).abs() < 1e-9);
        assert!((left(80.0) - 20.0).abs() < 1e-9);
        assert!((left(100.0) - 20.0).abs() < 1e-9);
        assert_eq!(excess_share(30.0, 100.0), 0.0);
        assert_eq!(excess_share(0.0, 100.0), 0.0);
        assert_eq!(excess_share(10.0, 0.0), 0.0);
    }
}
