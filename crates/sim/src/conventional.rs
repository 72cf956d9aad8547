//! The conventional disk of trail-paper.md §3.1: requests served in arrival order, no buffering,
//! no scheduling; seek from the tracked head position, a uniformly distributed rotational
//! latency, then transfer (with head switches when a request crosses tracks). With
//! [`Discipline::Satf`] the same disk serves its queue shortest access time first from a
//! tracked spindle angle, which is what a deep queue (a closed loop) can exploit.

use std::collections::VecDeque;

use crate::disk::DiskParams;
use crate::driver::{drive_trace, Model};
use crate::rng::SplitMix64;
use crate::stats::{Busy, Mean};
use crate::workload::Request;

/// What a conventional disk did with a request stream.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ConventionalResult {
    pub read_bw: Busy,
    pub write_bw: Busy,
    pub read_latency_ms: Mean,
    pub write_latency_ms: Mean,
}

/// One access from `head_cyl`: (transfer, overhead, cylinder where the head ends).
pub fn access(
    disk: &DiskParams,
    head_cyl: u32,
    r: &Request,
    rng: &mut SplitMix64,
) -> (f64, f64, u32) {
    let at = disk.chs(r.lba);
    let sectors = r.bytes.div_ceil(u64::from(disk.sector_bytes));
    let seek = disk.seek.time_ms(head_cyl.abs_diff(at.cylinder));
    let rotation = rng.unit() * disk.rotation_ms;
    let (xfer, switches) = disk.transfer_with_switches_ms(at, sectors);
    let end_cyl = disk.chs(r.lba + sectors.saturating_sub(1)).cylinder;
    (
        xfer,
        disk.controller_ms + seek + rotation + switches,
        end_cyl,
    )
}

/// Serves `reqs` (sorted by arrival) first come, first served.
pub fn run(disk: &DiskParams, reqs: &[Request], rng: &mut SplitMix64) -> ConventionalResult {
    let mut m = Conventional::new(disk, Discipline::Fcfs, rng.clone());
    drive_trace(&mut m, reqs);
    *rng = m.rng;
    m.result
}

/// How a conventional disk orders its queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Discipline {
    /// First come, first served, with a rotational latency drawn uniformly over a rotation
    /// (trail-paper.md §3.1).
    Fcfs,
    /// Shortest access time first: the queued request whose seek and rotational wait end first,
    /// from the tracked head cylinder and spindle angle.
    Satf,
}

/// A conventional disk as a [`Model`]: one request at a time, no buffering.
#[derive(Debug, Clone)]
pub struct Conventional<'a> {
    disk: &'a DiskParams,
    discipline: Discipline,
    rng: SplitMix64,
    queue: VecDeque<(usize, Request)>,
    /// The request in service: (end, id, request).
    busy: Option<(f64, usize, Request)>,
    head: u32,
    now: f64,
    /// Spindle angle at time 0, as a fraction of a rotation (SATF only).
    phase: f64,
    pub result: ConventionalResult,
}

impl<'a> Conventional<'a> {
    pub fn new(disk: &'a DiskParams, discipline: Discipline, mut rng: SplitMix64) -> Self {
        let phase = match discipline {
            Discipline::Satf => rng.unit(),
            Discipline::Fcfs => 0.0,
        };
        Self {
            disk,
            discipline,
            rng,
            queue: VecDeque::new(),
            busy: None,
            head: 0,
            now: 0.0,
            phase,
            result: ConventionalResult::default(),
        }
    }

    /// Positioning of `r` started at `now` from the head: (seek and rotation ms, transfer,
    /// head switches, end cylinder), with the rotation from the spindle angle.
    fn positioned(&self, r: &Request, now: f64) -> (f64, f64, f64, u32) {
        let d = self.disk;
        let at = d.chs(r.lba);
        let sectors = r.bytes.div_ceil(u64::from(d.sector_bytes));
        let seek = d.seek.time_ms(self.head.abs_diff(at.cylinder));
        let arrive = now + d.controller_ms + seek;
        let angle = ((arrive / d.rotation_ms) + self.phase).fract();
        let target = f64::from(at.sector) / f64::from(at.sectors_per_track.max(1));
        let rotation = (target - angle).rem_euclid(1.0) * d.rotation_ms;
        let (xfer, switches) = d.transfer_with_switches_ms(at, sectors);
        let end_cyl = d.chs(r.lba + sectors.saturating_sub(1)).cylinder;
        (seek + rotation, xfer, switches, end_cyl)
    }

    fn start(&mut self) {
        if self.busy.is_some() {
            return;
        }
        let next = match self.discipline {
            Discipline::Fcfs => self.queue.pop_front(),
            Discipline::Satf => {
                let now = self.now;
                let best = (0..self.queue.len()).min_by(|&a, &b| {
                    let t = |i: usize| self.positioned(&self.queue[i].1, now).0;
                    t(a).total_cmp(&t(b))
                });
                best.and_then(|i| self.queue.remove(i))
            }
        };
        let Some((id, r)) = next else { return };
        let (xfer, overhead, end_cyl) = match self.discipline {
            Discipline::Fcfs => access(self.disk, self.head, &r, &mut self.rng),
            Discipline::Satf => {
                let (pos, xfer, switches, end_cyl) = self.positioned(&r, self.now);
                (xfer, self.disk.controller_ms + pos + switches, end_cyl)
            }
        };
        let bw = if r.write {
            &mut self.result.write_bw
        } else {
            &mut self.result.read_bw
        };
        bw.add(xfer, overhead);
        self.head = end_cyl;
        self.busy = Some((self.now + xfer + overhead, id, r));
    }
}

impl Model for Conventional<'_> {
    fn submit(&mut self, id: usize, req: &Request, _: &mut Vec<usize>) {
        self.now = req.arrival_ms;
        self.queue.push_back((id, *req));
        self.start();
    }

    fn next_event_ms(&self) -> Option<f64> {
        self.busy.map(|b| b.0)
    }

    fn step(&mut self, done: &mut Vec<usize>) {
        let Some((end, id, r)) = self.busy.take() else {
            return;
        };
        self.now = end;
        let latency = end - r.arrival_ms;
        if r.write {
            self.result.write_latency_ms.add(latency);
        } else {
            self.result.read_latency_ms.add(latency);
        }
        done.push(id);
        self.start();
    }
}
