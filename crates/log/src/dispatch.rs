//! The dispatcher's clock-free core ([`Dispatch`]): what the writer decides, without reading a
//! clock or touching a disk.

use std::collections::{BTreeSet, VecDeque};

use mariner_placement::{Action, DeviceModel, Nanos, Policy, PolicyError};

use crate::holders::{Hold, HoldKind};

/// The dispatcher's clock-free core: the placement policy plus the log's segment bookkeeping.
///
/// Refactor note (issue 5): these calls used to sit inline in `Writer`, which read
/// `Instant::now()` itself. They moved here unchanged except that every call takes `now`; the
/// dispatcher thread passes its clock (nanoseconds since the writer started), a simulation
/// passes virtual time. What stays in `Writer` is I/O and acknowledgement: record headers,
/// buffers, device threads, waiters, stats. Use it as the thread does: [`Dispatch::submit`] per
/// appended record, [`Dispatch::completed`] per finished device write, [`Dispatch::poll`] at
/// [`Dispatch::next_deadline`], [`Dispatch::release`] when a holder releases; pass every
/// returned [`Action`] to [`Dispatch::account`] before executing it.
///
/// Segments are reused behind the holders' watermarks (crate::holders): below the lowest at
/// once; when requests wait for space, below the must-hold holders' by cutting the shrinkable
/// ones and then the bounded ones; and a bounded holder that keeps more than its limit is cut
/// to it.
#[derive(Debug)]
pub struct Dispatch<M> {
    policy: Policy<M>,
    /// Per device: segments holding records not yet released (segment, highest seq written
    /// into it), oldest first; the back is current.
    in_use: Vec<VecDeque<(u64, u64)>>,
    /// The holders' watermarks, in the order they were opened with.
    holds: Vec<Hold>,
    /// Segments let go of while a holder still counted on records in them (it was cut),
    /// as (device, segment), until the writer invalidates them ([`Self::take_cut_segments`]).
    cut_segments: BTreeSet<(usize, u64)>,
}

impl<M: DeviceModel> Dispatch<M> {
    /// `in_use` per device as recovery found it; `holds` the holders' watermarks.
    pub fn new(policy: Policy<M>, in_use: Vec<VecDeque<(u64, u64)>>, holds: Vec<Hold>) -> Self {
        Self {
            policy,
            in_use,
            holds,
            cut_segments: BTreeSet::new(),
        }
    }

    pub fn policy(&self) -> &Policy<M> {
        &self.policy
    }

    /// Segments per device still holding unreleased records, oldest first.
    pub fn in_use(&self) -> &[VecDeque<(u64, u64)>] {
        &self.in_use
    }

    /// When [`Dispatch::poll`] must next be called.
    pub fn next_deadline(&self) -> Option<Nanos> {
        self.policy.next_deadline()
    }

    /// The `T_wait` deadline passed (the thread's receive timed out).
    pub fn poll(&mut self, now: Nanos) -> Vec<Action> {
        self.policy.poll(now)
    }

    /// Record `seq`, `bytes` long with its header, was appended at `now`. If it has to wait
    /// for space, holders other than must-hold ones are cut to make it (returned: the
    /// segments freed).
    pub fn submit(
        &mut self,
        seq: u64,
        bytes: u64,
        now: Nanos,
    ) -> Result<(Vec<Action>, u64), PolicyError> {
        let mut actions = self.policy.submit(seq, bytes, now)?;
        let freed = self.room_for_waiters(now, &mut actions);
        Ok((actions, freed))
    }

    /// Records `(seq, bytes)` that arrived together at `now` ([`Policy::submit_burst`]); as
    /// [`Dispatch::submit`].
    pub fn submit_burst(
        &mut self,
        reqs: &[(u64, u64)],
        now: Nanos,
    ) -> Result<(Vec<Action>, u64), PolicyError> {
        let mut actions = self.policy.submit_burst(reqs, now)?;
        let freed = self.room_for_waiters(now, &mut actions);
        Ok((actions, freed))
    }

    /// After a submission: nothing to do unless it has to wait for space (the watermarks did
    /// not move, and a bounded holder's limit is checked at the next release), so an append
    /// that fits costs one comparison here.
    fn room_for_waiters(&mut self, now: Nanos, actions: &mut Vec<Action>) -> u64 {
        if self.policy.stalled() == 0 {
            return 0;
        }
        self.make_room(now, actions)
    }

    /// Device `dev` reported its write durable at `now`.
    pub fn completed(&mut self, dev: usize, now: Nanos) -> Vec<Action> {
        self.policy.completed(dev, now).unwrap_or_default()
    }

    /// Holder `holder` no longer needs the records at or below `seq`: frees every segment (but
    /// a device's current one) whose records are all at or below every holder's watermark,
    /// then cuts holders as their kinds allow (see the type's docs). Returns the policy's
    /// actions and the number of segments freed.
    pub fn release(&mut self, holder: usize, seq: u64, now: Nanos) -> (Vec<Action>, u64) {
        if let Some(h) = self.holds.get_mut(holder) {
            h.released = h.released.max(seq);
        }
        let mut actions = Vec::new();
        let freed = self.make_room(now, &mut actions);
        (actions, freed)
    }

    /// The holders' watermarks and cuts, in the order they were opened with.
    pub fn holds(&self) -> &[Hold] {
        &self.holds
    }

    /// The lowest watermark: segments at or below it are free.
    pub fn released(&self) -> u64 {
        self.floor(|_| true)
    }

    /// In-use segments holding a record above `seq`, and each device's current one, over all
    /// devices: what a holder at `seq` keeps from reuse.
    pub fn segments_above(&self, seq: u64) -> u64 {
        let above = |d: &VecDeque<(u64, u64)>| {
            let current = d.len().saturating_sub(1);
            let held = d
                .iter()
                .enumerate()
                .filter(|&(i, s)| s.1 > seq || i == current);
            held.count() as u64
        };
        self.in_use.iter().map(above).sum()
    }

    /// The lowest watermark of the holders `which` selects; `u64::MAX` when it selects none.
    fn floor(&self, which: impl Fn(&Hold) -> bool) -> u64 {
        self.holds
            .iter()
            .filter(|h| which(h))
            .map(|h| h.released)
            .min()
            .unwrap_or(u64::MAX)
    }

    /// Frees what the watermarks allow, cuts bounded holders over their limit and, while
    /// requests wait for space, shrinkable holders; returns the number of segments freed.
    fn make_room(&mut self, now: Nanos, actions: &mut Vec<Action>) -> u64 {
        let mut freed = self.free_below(self.floor(|_| true), now, actions);
        freed += self.cut_bounded(now, actions);
        // Writers wait: let go of the oldest segment the others allow, cutting every holder
        // of the tier that still needed it, until they stop waiting — shrinkable holders
        // first (history shrinks), then bounded ones (a replica falls back to a resync);
        // writers wait only for must-hold holders.
        let tiers: [fn(&Hold) -> bool; 2] = [
            |h| h.kind == HoldKind::Shrinkable,
            |h| h.kind != HoldKind::MustHold,
        ];
        for cuttable in tiers {
            let hard = self.floor(|h| !cuttable(h));
            while self.policy.stalled() > 0 {
                let Some((dev, max_seq)) = self.oldest_freeable(hard) else {
                    break;
                };
                for h in self.holds.iter_mut().filter(|h| cuttable(h)) {
                    h.cut(max_seq);
                }
                self.free_front(dev, now, actions);
                freed += 1 + self.free_below(self.floor(|_| true), now, actions);
            }
        }
        freed
    }

    /// Cuts each bounded holder that keeps more segments beyond the must-hold holders'
    /// watermark than its limit allows, oldest first, down to its limit.
    fn cut_bounded(&mut self, now: Nanos, actions: &mut Vec<Action>) -> u64 {
        let segment_bytes = self.policy.config().segment_bytes.max(1);
        let must = self.floor(|h| h.kind == HoldKind::MustHold);
        let mut freed = 0;
        for i in 0..self.holds.len() {
            let HoldKind::Bounded { max_bytes } = self.holds[i].kind else {
                continue;
            };
            let limit = max_bytes / segment_bytes;
            loop {
                let released = self.holds[i].released;
                let beyond =
                    self.segments_above(released) - self.segments_above(must.max(released));
                if beyond <= limit {
                    break;
                }
                // Its oldest segments beyond the must-hold watermark go first.
                let Some(next) = self.oldest_above(released) else {
                    break;
                };
                self.holds[i].cut(next);
                freed += self.free_below(self.floor(|_| true), now, actions);
            }
        }
        freed
    }

    /// The lowest highest-sequence-number among in-use segments above `seq`: cutting a holder
    /// at `seq` to it frees its oldest held segment.
    fn oldest_above(&self, seq: u64) -> Option<u64> {
        self.in_use
            .iter()
            .flatten()
            .map(|s| s.1)
            .filter(|&m| m > seq)
            .min()
    }

    /// The device whose oldest segment may go (not its current one, no batch queued into it,
    /// every record at or below `hard`) with the lowest highest sequence number, and that
    /// number.
    fn oldest_freeable(&self, hard: u64) -> Option<(usize, u64)> {
        (0..self.in_use.len())
            .filter_map(|dev| {
                let d = &self.in_use[dev];
                let &(segment, max_seq) = d.front()?;
                let free =
                    d.len() > 1 && max_seq <= hard && !self.policy.has_queued_write(dev, segment);
                free.then_some((dev, max_seq))
            })
            .min_by_key(|&(_, max_seq)| max_seq)
    }

    /// Frees, on every device, the oldest segments (but the current one) whose records are
    /// all at or below `seq` — and into which no sealed batch is still queued (its records
    /// are not accounted yet).
    fn free_below(&mut self, seq: u64, now: Nanos, actions: &mut Vec<Action>) -> u64 {
        let mut freed = 0;
        for dev in 0..self.in_use.len() {
            while self.in_use[dev].len() > 1
                && self.in_use[dev]
                    .front()
                    .is_some_and(|s| s.1 <= seq && !self.policy.has_queued_write(dev, s.0))
            {
                self.free_front(dev, now, actions);
                freed += 1;
            }
        }
        freed
    }

    fn free_front(&mut self, dev: usize, now: Nanos, actions: &mut Vec<Action>) {
        if let Some((segment, max_seq)) = self.in_use[dev].pop_front() {
            if max_seq > 0 && self.holds.iter().any(|h| h.cut_to >= max_seq) {
                self.cut_segments.insert((dev, segment));
            }
        }
        actions.extend(self.policy.segment_released(dev, now).unwrap_or_default());
    }

    /// Takes the segments let go of while a holder still counted on records in them (it
    /// was cut past them, and has not saved that): the writer invalidates each one's first
    /// block (writes it over and syncs) before it executes the actions that came with them,
    /// so before any batch goes into one. A crash then finds them free, as the log left
    /// them. Otherwise recovery would take one for kept when its old first record stayed:
    /// under a batch the crash tore (crates/faultsim, seed 9228), or while a newer segment
    /// let go of with it was written again first (seed 88315) — and a holder that needs
    /// records lost with them could not tell from `Recovery::first_kept`.
    pub fn take_cut_segments(&mut self) -> Vec<(usize, u64)> {
        std::mem::take(&mut self.cut_segments).into_iter().collect()
    }

    /// Segment bookkeeping for an action about to be executed: a segment switch opens a new
    /// in-use segment; a write raises its segment's highest sequence number.
    ///
    /// A write is not always into the current segment: a batch sealed because the next
    /// request did not fit is queued behind the busy device and starts only after the policy
    /// has switched the device on. Its sequence numbers therefore go to the entry of its own
    /// segment (the back is only the fallback), or that segment could be freed too early.
    pub fn account(&mut self, action: &Action) {
        match action {
            Action::Write(w) => {
                let segments = &mut self.in_use[w.dev];
                let own = segments.iter().rposition(|s| s.0 == w.segment);
                let entry = match own {
                    Some(i) => segments.get_mut(i),
                    None => segments.back_mut(),
                };
                if let Some(entry) = entry {
                    let max = w.reqs.iter().map(|r| r.0).max().unwrap_or(0);
                    entry.1 = entry.1.max(max);
                }
            }
            Action::SwitchSegment { dev, segment, .. } => {
                self.in_use[*dev].push_back((*segment, 0));
            }
        }
    }
}
