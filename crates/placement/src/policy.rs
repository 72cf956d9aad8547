//! The placement state machine.

use std::collections::VecDeque;

use crate::model::DeviceModel;

/// Nanoseconds on the caller's clock (monotonic; any origin).
pub type Nanos = u64;
/// The caller's name for a request.
pub type ReqId = u64;

/// Tunables. Defaults follow the measurements in docs/benchmarks.md.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyConfig {
    /// Longest time the oldest request of a gathering batch waits before the batch is
    /// dispatched (mariner-paper.md §4, Table 1).
    pub t_wait_ns: u64,
    /// Track-switch threshold on the fragmentation metric F (eq. 2). `f64::INFINITY` never
    /// switches early; segments are then left only when full.
    pub t_switch: f64,
    /// Also dispatch the gathering batch as soon as its device falls idle, without waiting
    /// for `T_wait` (a work-conserving variant; the paper waits).
    pub dispatch_on_idle: bool,
    /// When `T_wait` expires and every device is busy, seal the batch and queue it behind the
    /// active device's current write, as mariner-paper.md §4 does (the source of Table 1's
    /// left arm: many tiny batches queueing at `T_wait = 0`). `false`, the product's choice,
    /// keeps the batch gathering until a device frees (docs/ARCHITECTURE.md "Decisions").
    pub queue_when_busy: bool,
    /// Writes a device may have in flight at once. The paper's disk has one head: 1. Solid
    /// state and virtual disks serve several writes in parallel at about the latency of one;
    /// with more than 1 a device takes the next batch while earlier ones are still being
    /// written (the log then acknowledges each device's batches in the order they were
    /// placed, crates/log's writer). A device counts as idle while it has a free slot.
    pub device_depth: u32,
    /// Every batch starts on a multiple of this many bytes (the device sector or O_DIRECT unit).
    pub align_bytes: u64,
    /// Size of a segment (the paper's track).
    pub segment_bytes: u64,
    /// Segments per device.
    pub segment_count: u64,
    /// Byte offset of segment 0 on every device (room for the superblock).
    pub data_offset: u64,
}

impl PolicyConfig {
    fn align(&self, bytes: u64) -> u64 {
        let a = self.align_bytes.max(1);
        bytes.div_ceil(a) * a
    }
}

/// Where a device resumes. `segment` and `generation` name the last segment written (or, on a
/// fresh log, any segment with generation 0); it is treated as full, so the first write moves to
/// the next segment with the next generation. `free_segments` counts the segments the device may
/// still move into before the log releases more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceStart {
    pub segment: u64,
    pub generation: u64,
    pub free_segments: u64,
}

/// One physical write: a batch of requests, in order, starting at `offset` on device `dev`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    pub dev: usize,
    pub segment: u64,
    pub generation: u64,
    /// Absolute byte offset on the device.
    pub offset: u64,
    /// The requests and their sizes, in the order they are laid out.
    pub reqs: Vec<(ReqId, u64)>,
    /// Total length of the write: the sizes summed and aligned up.
    pub padded_bytes: u64,
}

/// What the caller must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Start this write now; the device has a free slot. Report its end with
    /// [`Policy::completed`].
    Write(Write),
    /// Device `dev` moved to `segment` with `generation` (for the log's bookkeeping and for a
    /// simulated disk, which charges a seek).
    SwitchSegment {
        dev: usize,
        segment: u64,
        generation: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicyError {
    /// The request does not fit in one segment.
    TooLarge { bytes: u64, segment_bytes: u64 },
    /// The device index is out of range.
    NoSuchDevice(usize),
}

impl std::error::Error for PolicyError {}

impl std::fmt::Display for PolicyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TooLarge {
                bytes,
                segment_bytes,
            } => {
                write!(
                    f,
                    "request of {bytes} bytes exceeds the segment size {segment_bytes}"
                )
            }
            Self::NoSuchDevice(d) => write!(f, "no log device {d}"),
        }
    }
}

#[derive(Debug)]
struct Device {
    segment: u64,
    generation: u64,
    used: u64,
    /// ServiceReqNum of eq. 2: physical writes into the current segment.
    writes: u32,
    free_segments: u64,
    /// Writes handed out and not completed.
    inflight: u32,
    /// [`PolicyConfig::device_depth`], at least 1.
    depth: u32,
    queue: VecDeque<Write>,
    /// Predicted time the device has finished everything handed to it.
    avail_at: Nanos,
}

impl Device {
    /// Every slot taken: a batch sealed for it now waits in its queue.
    fn busy(&self) -> bool {
        self.inflight >= self.depth
    }
    /// A batch sealed for it now starts at once.
    fn idle(&self) -> bool {
        !self.busy() && self.queue.is_empty()
    }
    fn room(&self, cfg: &PolicyConfig) -> u64 {
        cfg.segment_bytes - self.used
    }
    /// Whether `bytes` (aligned) can be placed, possibly after moving to the next segment.
    fn can_take(&self, cfg: &PolicyConfig, bytes: u64) -> bool {
        cfg.align(bytes) <= self.room(cfg) || self.free_segments > 0
    }
    /// Fragmentation metric F of mariner-paper.md eq. (2).
    fn fragmentation(&self, cfg: &PolicyConfig) -> f64 {
        let utilization = self.used as f64 / cfg.segment_bytes as f64;
        if utilization >= 1.0 {
            return f64::INFINITY;
        }
        f64::from(self.writes) / (10.0 * (1.0 - utilization))
    }
}

impl Gather {
    fn new(dev: usize, oldest: Nanos) -> Self {
        Self {
            dev,
            reqs: Vec::new(),
            bytes: 0,
            oldest,
            waiting_for_device: false,
        }
    }
}

#[derive(Debug)]
struct Gather {
    /// The active device: where the batch goes unless another device is free first.
    dev: usize,
    reqs: Vec<(ReqId, u64)>,
    bytes: u64,
    oldest: Nanos,
    /// `T_wait` passed while every device was busy: the batch leaves when one frees.
    waiting_for_device: bool,
}

/// The policy. See the crate documentation for the rules.
#[derive(Debug)]
pub struct Policy<M> {
    cfg: PolicyConfig,
    model: M,
    devices: Vec<Device>,
    gather: Option<Gather>,
    /// Requests waiting for log space, in arrival order.
    stalled: VecDeque<(ReqId, u64, Nanos)>,
    /// Inside [`Policy::submit_burst`]: a batch started on an idle device keeps gathering the
    /// rest of the burst instead of leaving with its first request.
    holding: bool,
    /// A batch started on an idle device during the burst, to dispatch when it ends.
    deferred: bool,
}

impl<M: DeviceModel> Policy<M> {
    /// A policy over `starts.len()` devices.
    pub fn new(cfg: PolicyConfig, model: M, starts: &[DeviceStart]) -> Self {
        let devices = starts
            .iter()
            .map(|s| Device {
                segment: s.segment,
                generation: s.generation,
                used: cfg.segment_bytes,
                writes: 0,
                free_segments: s.free_segments,
                inflight: 0,
                depth: cfg.device_depth.max(1),
                queue: VecDeque::new(),
                avail_at: 0,
            })
            .collect();
        Self {
            cfg,
            model,
            devices,
            gather: None,
            stalled: VecDeque::new(),
            holding: false,
            deferred: false,
        }
    }

    pub fn config(&self) -> &PolicyConfig {
        &self.cfg
    }

    pub fn model(&self) -> &M {
        &self.model
    }

    /// Requests waiting because no device has log space.
    pub fn stalled(&self) -> usize {
        self.stalled.len()
    }

    /// Requests gathering in the active batch.
    pub fn gathering(&self) -> usize {
        self.gather.as_ref().map_or(0, |g| g.reqs.len())
    }

    /// Whether a sealed batch is queued on device `dev` to be written into `segment`. Such a
    /// segment must not be released even if every record already in it is: the batch will
    /// land there when the device frees.
    pub fn has_queued_write(&self, dev: usize, segment: u64) -> bool {
        self.devices
            .get(dev)
            .is_some_and(|d| d.queue.iter().any(|w| w.segment == segment))
    }

    /// Free segments on `dev` (beyond the current one).
    pub fn free_segments(&self, dev: usize) -> u64 {
        self.devices.get(dev).map_or(0, |d| d.free_segments)
    }

    /// A request of `bytes` arrives at `now`: a burst of one.
    pub fn submit(
        &mut self,
        req: ReqId,
        bytes: u64,
        now: Nanos,
    ) -> Result<Vec<Action>, PolicyError> {
        self.submit_burst(&[(req, bytes)], now)
    }

    /// Several requests that arrived together (`(req, bytes)` in order), placed as if each
    /// were submitted alone at `now`, except that a batch started on an idle device takes the
    /// rest of the burst before it leaves, instead of leaving with the burst's first request
    /// while the others wait for it (mariner-paper.md §7.4 dispatches at once when no other
    /// request is there: in a burst the others are there). A batch fills its segment as usual;
    /// then the next one gathers.
    pub fn submit_burst(
        &mut self,
        reqs: &[(ReqId, u64)],
        now: Nanos,
    ) -> Result<Vec<Action>, PolicyError> {
        if let Some(&(_, bytes)) = reqs
            .iter()
            .find(|(_, b)| self.cfg.align(*b) > self.cfg.segment_bytes)
        {
            return Err(PolicyError::TooLarge {
                bytes,
                segment_bytes: self.cfg.segment_bytes,
            });
        }
        let mut out = Vec::new();
        self.holding = true;
        for &(req, bytes) in reqs {
            // Behind earlier stalled requests, or stalled for lack of log space.
            if !self.stalled.is_empty() || !self.place(req, bytes, now, now, &mut out) {
                self.stalled.push_back((req, bytes, now));
            }
        }
        self.holding = false;
        if std::mem::take(&mut self.deferred) {
            self.dispatch_gather(now, &mut out);
        }
        self.expire(now, &mut out);
        Ok(out)
    }

    /// The write in flight on `dev` finished at `now` (durably).
    pub fn completed(&mut self, dev: usize, now: Nanos) -> Result<Vec<Action>, PolicyError> {
        let mut out = Vec::new();
        let d = self
            .devices
            .get_mut(dev)
            .ok_or(PolicyError::NoSuchDevice(dev))?;
        d.inflight = d.inflight.saturating_sub(1);
        self.model.on_complete(dev, now);
        if let Some(w) = self.devices[dev].queue.pop_front() {
            self.start(w, now, &mut out);
            return Ok(out);
        }
        self.maybe_switch_track(dev, now, &mut out);
        let ready = self.gather.as_ref().is_some_and(|g| g.waiting_for_device);
        if ready || (self.cfg.dispatch_on_idle && self.gather.is_some()) {
            self.dispatch_gather(now, &mut out);
        }
        self.drain_stalled(now, &mut out);
        self.expire(now, &mut out);
        Ok(out)
    }

    /// The oldest used segment of `dev` may be written again.
    pub fn segment_released(&mut self, dev: usize, now: Nanos) -> Result<Vec<Action>, PolicyError> {
        let cap = self.cfg.segment_count;
        let d = self
            .devices
            .get_mut(dev)
            .ok_or(PolicyError::NoSuchDevice(dev))?;
        d.free_segments = (d.free_segments + 1).min(cap);
        let mut out = Vec::new();
        if self.gather.as_ref().is_some_and(|g| g.waiting_for_device) {
            self.dispatch_gather(now, &mut out);
        }
        self.drain_stalled(now, &mut out);
        self.expire(now, &mut out);
        Ok(out)
    }

    /// Time passed: dispatch a batch whose oldest request has waited `T_wait`.
    pub fn poll(&mut self, now: Nanos) -> Vec<Action> {
        let mut out = Vec::new();
        self.expire(now, &mut out);
        out
    }

    /// When [`Policy::poll`] must next be called: the `T_wait` deadline of the gathering
    /// batch, unless it already passed and the batch waits for a device to complete — or,
    /// with `dispatch_on_idle`, while every device is busy: the batch then leaves when one
    /// completes whatever the time, so a deadline could only note that it passed (and would
    /// wake the log's timer thread once per batch for nothing).
    pub fn next_deadline(&self) -> Option<Nanos> {
        let g = self.gather.as_ref().filter(|g| !g.waiting_for_device)?;
        if self.cfg.dispatch_on_idle && self.devices.iter().all(|d| !d.idle()) {
            return None;
        }
        Some(g.oldest.saturating_add(self.cfg.t_wait_ns))
    }

    /// Places one request; false when no device has room.
    fn place(
        &mut self,
        req: ReqId,
        bytes: u64,
        arrival: Nanos,
        now: Nanos,
        out: &mut Vec<Action>,
    ) -> bool {
        if self.gather.is_none() {
            if let Some(dev) = self.best_device(bytes, now, None, true, out) {
                self.gather = Some(Gather::new(dev, arrival));
                self.join(req, bytes);
                if self.holding {
                    self.deferred = true;
                } else {
                    self.seal(now, out);
                }
                return true;
            }
        }
        if self.joinable(bytes) {
            self.join(req, bytes);
            return true;
        }
        let previous = self.gather.as_ref().map(|g| g.dev);
        if self.gather.is_some() {
            self.seal(now, out);
        }
        let Some(dev) = self.best_device(bytes, now, previous, false, out) else {
            return false;
        };
        self.gather = Some(Gather::new(dev, arrival));
        self.join(req, bytes);
        true
    }

    /// A request joins the gathering batch while the active device's segment has room for it.
    fn joinable(&self, bytes: u64) -> bool {
        let Some(g) = &self.gather else { return false };
        self.cfg.align(g.bytes + bytes) <= self.devices[g.dev].room(&self.cfg)
    }

    fn join(&mut self, req: ReqId, bytes: u64) {
        if let Some(g) = &mut self.gather {
            g.reqs.push((req, bytes));
            g.bytes += bytes;
        }
    }

    /// The device that could write `bytes` earliest, among those with room. `idle_only` limits
    /// the choice to idle devices (immediate dispatch); `avoid` is the previous active device,
    /// passed over when another can take the request.
    fn best_device(
        &mut self,
        bytes: u64,
        now: Nanos,
        avoid: Option<usize>,
        idle_only: bool,
        out: &mut Vec<Action>,
    ) -> Option<usize> {
        let padded = self.cfg.align(bytes);
        let mut best: Option<(Nanos, usize)> = None;
        let mut fallback = None;
        for (i, d) in self.devices.iter().enumerate() {
            if (idle_only && !d.idle()) || !d.can_take(&self.cfg, bytes) {
                continue;
            }
            if Some(i) == avoid {
                fallback = Some(i);
                continue;
            }
            let offset = self.next_offset(i, padded);
            let start = if d.idle() { now } else { d.avail_at.max(now) };
            let t = self.model.completion_time(i, offset, padded, start);
            if best.is_none_or(|(bt, _)| t < bt) {
                best = Some((t, i));
            }
        }
        let dev = best.map(|(_, i)| i).or(fallback)?;
        if padded > self.devices[dev].room(&self.cfg) {
            self.switch_segment(dev, now, out);
        }
        Some(dev)
    }

    /// Where the next write of `padded` bytes would land on `dev`.
    fn next_offset(&self, dev: usize, padded: u64) -> u64 {
        let d = &self.devices[dev];
        let seg_count = self.cfg.segment_count.max(1);
        let (segment, used) = if padded <= d.room(&self.cfg) {
            (d.segment, d.used)
        } else {
            ((d.segment + 1) % seg_count, 0)
        };
        self.cfg.data_offset + segment * self.cfg.segment_bytes + used
    }

    /// Closes the gathering batch: reserves its space and starts or queues it.
    fn seal(&mut self, now: Nanos, out: &mut Vec<Action>) {
        let Some(g) = self.gather.take() else { return };
        if self.cfg.queue_when_busy && self.devices[g.dev].busy() {
            // The paper's eq. (2) check runs per dispatch; with batches queueing behind busy
            // disks the after-completion check would almost never see an empty queue.
            self.maybe_switch_track(g.dev, now, out);
        }
        let padded = self.cfg.align(g.bytes);
        let d = &mut self.devices[g.dev];
        let offset = self.cfg.data_offset + d.segment * self.cfg.segment_bytes + d.used;
        d.used += padded;
        d.writes += 1;
        let w = Write {
            dev: g.dev,
            segment: d.segment,
            generation: d.generation,
            offset,
            reqs: g.reqs,
            padded_bytes: padded,
        };
        let start = if d.idle() { now } else { d.avail_at.max(now) };
        d.avail_at = self.model.completion_time(g.dev, offset, padded, start);
        if self.devices[g.dev].busy() {
            self.devices[g.dev].queue.push_back(w);
        } else {
            self.start(w, now, out);
        }
    }

    fn start(&mut self, w: Write, now: Nanos, out: &mut Vec<Action>) {
        self.devices[w.dev].inflight += 1;
        self.model.on_dispatch(w.dev, w.offset, w.padded_bytes, now);
        out.push(Action::Write(w));
    }

    fn expire(&mut self, now: Nanos, out: &mut Vec<Action>) {
        if self.next_deadline().is_some_and(|t| now >= t) {
            self.dispatch_gather(now, out);
        }
    }

    /// Sends the gathering batch to the active device if it is idle, else to another idle
    /// device. When every device is busy the batch keeps gathering and leaves as soon as one
    /// frees: a sealed batch queued behind a busy device would gain nothing — unless
    /// `queue_when_busy` asks for the paper's behaviour, which queues it on the active device.
    fn dispatch_gather(&mut self, now: Nanos, out: &mut Vec<Action>) {
        let Some(g) = &self.gather else { return };
        let (target, bytes) = (g.dev, g.bytes);
        if self.devices[target].idle() {
            return self.seal(now, out);
        }
        match self.best_device(bytes, now, None, true, out) {
            Some(dev) => {
                if let Some(g) = &mut self.gather {
                    g.dev = dev;
                }
                self.seal(now, out);
            }
            None if self.cfg.queue_when_busy => self.seal(now, out),
            None => {
                if let Some(g) = &mut self.gather {
                    g.waiting_for_device = true;
                }
            }
        }
    }

    fn maybe_switch_track(&mut self, dev: usize, now: Nanos, out: &mut Vec<Action>) {
        let d = &self.devices[dev];
        let gathering_here = self.gather.as_ref().is_some_and(|g| g.dev == dev);
        if d.writes == 0 || d.free_segments == 0 || !d.queue.is_empty() || gathering_here {
            return;
        }
        if d.fragmentation(&self.cfg) > self.cfg.t_switch {
            self.switch_segment(dev, now, out);
        }
    }

    fn switch_segment(&mut self, dev: usize, now: Nanos, out: &mut Vec<Action>) {
        let seg_count = self.cfg.segment_count.max(1);
        let d = &mut self.devices[dev];
        d.segment = (d.segment + 1) % seg_count;
        d.generation += 1;
        d.used = 0;
        d.writes = 0;
        d.free_segments = d.free_segments.saturating_sub(1);
        let (segment, generation) = (d.segment, d.generation);
        let offset = self.cfg.data_offset + segment * self.cfg.segment_bytes;
        self.model.on_segment_switch(dev, offset, now);
        out.push(Action::SwitchSegment {
            dev,
            segment,
            generation,
        });
    }

    fn drain_stalled(&mut self, now: Nanos, out: &mut Vec<Action>) {
        while let Some(&(req, bytes, arrival)) = self.stalled.front() {
            if !self.place(req, bytes, arrival, now, out) {
                break;
            }
            self.stalled.pop_front();
        }
    }
}

#[cfg(test)]
mod tests;
