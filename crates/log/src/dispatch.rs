//! The dispatcher's clock-free core ([`Dispatch`]): what the writer decides, without reading a
//! clock or touching a disk.

use std::collections::VecDeque;

use mariner_placement::{Action, DeviceModel, Nanos, Policy, PolicyError};

/// The dispatcher's clock-free core: the placement policy plus the log's segment bookkeeping.
///
/// Refactor note (issue 5): these calls used to sit inline in `Writer`, which read
/// `Instant::now()` itself. They moved here unchanged except that every call takes `now`; the
/// dispatcher thread passes its clock (nanoseconds since the writer started), a simulation
/// passes virtual time. What stays in `Writer` is I/O and acknowledgement: record headers,
/// buffers, device threads, waiters, stats. Use it as the thread does: [`Dispatch::submit`] per
/// appended record, [`Dispatch::completed`] per finished device write, [`Dispatch::poll`] at
/// [`Dispatch::next_deadline`], [`Dispatch::release`] when consumers release; pass every
/// returned [`Action`] to [`Dispatch::account`] before executing it.
#[derive(Debug)]
pub struct Dispatch<M> {
    policy: Policy<M>,
    /// Per device: segments holding records not yet released (segment, highest seq written
    /// into it), oldest first; the back is current.
    in_use: Vec<VecDeque<(u64, u64)>>,
    released: u64,
}

impl<M: DeviceModel> Dispatch<M> {
    /// `in_use` per device as recovery found it; `released` the consumers' watermark.
    pub fn new(policy: Policy<M>, in_use: Vec<VecDeque<(u64, u64)>>, released: u64) -> Self {
        Self {
            policy,
            in_use,
            released,
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

    /// Record `seq`, `bytes` long with its header, was appended at `now`.
    pub fn submit(&mut self, seq: u64, bytes: u64, now: Nanos) -> Result<Vec<Action>, PolicyError> {
        self.policy.submit(seq, bytes, now)
    }

    /// Records `(seq, bytes)` that arrived together at `now` ([`Policy::submit_burst`]).
    pub fn submit_burst(
        &mut self,
        reqs: &[(u64, u64)],
        now: Nanos,
    ) -> Result<Vec<Action>, PolicyError> {
        self.policy.submit_burst(reqs, now)
    }

    /// Device `dev` reported its write durable at `now`.
    pub fn completed(&mut self, dev: usize, now: Nanos) -> Vec<Action> {
        self.policy.completed(dev, now).unwrap_or_default()
    }

    /// Consumers are durable up to `seq`: frees every segment (but a device's current one)
    /// whose records are all at or below it. Returns the policy's actions and the number of
    /// segments freed.
    pub fn release(&mut self, seq: u64, now: Nanos) -> (Vec<Action>, u64) {
        self.released = self.released.max(seq);
        let mut actions = Vec::new();
        let mut freed = 0;
        for dev in 0..self.in_use.len() {
            // A segment is freed once every record in it is released — and no sealed batch is
            // still queued to be written into it (its records are not accounted yet).
            while self.in_use[dev].len() > 1
                && self.in_use[dev].front().is_some_and(|s| {
                    s.1 <= self.released && !self.policy.has_queued_write(dev, s.0)
                })
            {
                self.in_use[dev].pop_front();
                freed += 1;
                actions.extend(self.policy.segment_released(dev, now).unwrap_or_default());
            }
        }
        (actions, freed)
    }

    /// The consumers' watermark.
    pub fn released(&self) -> u64 {
        self.released
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
