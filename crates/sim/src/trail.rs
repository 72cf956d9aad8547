//! The original Trail disk (trail-paper.md §2): a main disk, a log disk and a controller buffer.
//!
//! - A write goes to the log disk, FCFS, one write per track: it starts wherever the head is,
//!   so it pays only its transfer (plus a head switch per extra track it spans). After each
//!   write the head moves on to the next track in anticipation (head switch, or track-to-track
//!   seek at a cylinder boundary, or a full-stroke seek when the circular log wraps, the paper's
//!   "first approach"). A write that arrives during that move waits for its rest.
//! - The controller keeps every write in its buffer and writes it back to the main disk in the
//!   background, FCFS. A log track is free again once its data is on the main disk.
//! - Reads go to the main disk only (caching disabled, as the paper) and preempt an ongoing
//!   write-back, which is restarted later from scratch.
//!
//! [`Trail`] is one event-driven [`Model`] of all three, so any arrival process of
//! [`crate::driver`] can drive it (a closed loop too).

use std::collections::VecDeque;

use crate::conventional;
use crate::disk::DiskParams;
use crate::driver::{drive_trace, Model};
use crate::rng::SplitMix64;
use crate::stats::{Busy, Mean};
use crate::workload::Request;

/// What a Trail disk did with a request stream.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TrailResult {
    /// Main disk, reads and write-backs (the paper's Trail "read" efficiency).
    pub main_bw: Busy,
    /// Log disk (the paper's Trail "write" efficiency).
    pub log_bw: Busy,
    pub read_latency_ms: Mean,
    pub write_latency_ms: Mean,
    /// Mean buffered bytes seen by arriving requests, in KB (trail-paper.md Fig. 4).
    pub buffer_kb: Mean,
    /// Writes that had to wait for a free log track.
    pub space_waits: u64,
}

/// Runs `reqs` (sorted by arrival) through a Trail disk whose main and log disks are `disk`.
/// With `limit_log_space`, a write waits for a free log track (§2.1); without, the log never
/// fills, which is what the paper's results imply (see docs/simulation.md).
pub fn run(
    disk: &DiskParams,
    reqs: &[Request],
    limit_log_space: bool,
    rng: &mut SplitMix64,
) -> TrailResult {
    let mut t = Trail::new(disk, limit_log_space, rng.clone());
    drive_trace(&mut t, reqs);
    *rng = t.rng;
    t.result
}

#[derive(Debug, Clone, Copy)]
struct MainOp {
    idx: usize,
    start: f64,
    end: f64,
    transfer: f64,
    overhead: f64,
    from_cyl: u32,
    to_cyl: u32,
    /// When the seek ends (for where a preempted head is).
    seek_end: f64,
}

/// A log track range in use until its write is on the log and its data on the main disk.
#[derive(Debug, Clone, Copy)]
struct Held {
    idx: usize,
    tracks: u64,
    log_end: f64,
}

/// A Trail disk as a [`Model`]: the main disk (reads first, preempting write-backs), the
/// controller buffer, and the log disk (FCFS, one write per track).
#[derive(Debug, Clone)]
pub struct Trail<'a> {
    disk: &'a DiskParams,
    rng: SplitMix64,
    reqs: Vec<Request>,
    /// Write-back completion of each write, once it happened.
    written_back: Vec<Option<f64>>,
    reads: VecDeque<usize>,
    backs: VecDeque<usize>,
    cur: Option<MainOp>,
    head: u32,
    buffered_bytes: u64,
    log: LogState,
    pub result: TrailResult,
}

#[derive(Debug, Clone)]
struct LogState {
    queue: VecDeque<usize>,
    /// The write on the log disk: (end, request).
    busy: Option<(f64, usize)>,
    track: u64,
    tracks: u64,
    /// The head has reached the next track.
    ready_at: f64,
    /// End of the last log write.
    free_at: f64,
    held: VecDeque<Held>,
    in_use: u64,
    capacity: u64,
}

impl<'a> Trail<'a> {
    pub fn new(disk: &'a DiskParams, limit_log_space: bool, rng: SplitMix64) -> Self {
        let tracks = u64::from(disk.cylinders()) * u64::from(disk.heads);
        Self {
            disk,
            rng,
            reqs: Vec::new(),
            written_back: Vec::new(),
            reads: VecDeque::new(),
            backs: VecDeque::new(),
            cur: None,
            head: 0,
            buffered_bytes: 0,
            log: LogState {
                queue: VecDeque::new(),
                busy: None,
                track: 0,
                tracks,
                ready_at: 0.0,
                free_at: 0.0,
                held: VecDeque::new(),
                in_use: 0,
                capacity: if limit_log_space { tracks } else { u64::MAX },
            },
            result: TrailResult::default(),
        }
    }

    fn start_main(&mut self, now: f64) {
        if self.cur.is_some() {
            return;
        }
        let Some(idx) = self.reads.pop_front().or_else(|| self.backs.pop_front()) else {
            return;
        };
        let r = &self.reqs[idx];
        let (transfer, overhead, to_cyl) =
            conventional::access(self.disk, self.head, r, &mut self.rng);
        let seek = self
            .disk
            .seek
            .time_ms(self.head.abs_diff(self.disk.chs(r.lba).cylinder));
        self.cur = Some(MainOp {
            idx,
            start: now,
            end: now + transfer + overhead,
            transfer,
            overhead,
            from_cyl: self.head,
            to_cyl,
            seek_end: now + self.disk.controller_ms + seek,
        });
    }

    /// A read preempts a write-back in progress: the time spent is lost and the write-back
    /// starts over later.
    fn preempt(&mut self, now: f64) {
        let Some(op) = self.cur.filter(|op| self.reqs[op.idx].write) else {
            return;
        };
        self.result.main_bw.add(0.0, now - op.start);
        self.head = if now >= op.seek_end {
            op.to_cyl
        } else {
            op.from_cyl
        };
        self.backs.push_front(op.idx);
        self.cur = None;
    }

    fn finish_main(&mut self, done: &mut Vec<usize>) {
        let Some(op) = self.cur.take() else { return };
        self.result.main_bw.add(op.transfer, op.overhead);
        self.head = op.to_cyl;
        let r = self.reqs[op.idx];
        if r.write {
            self.written_back[op.idx] = Some(op.end);
            self.buffered_bytes -= r.bytes;
            self.start_log(op.end);
        } else {
            self.result.read_latency_ms.add(op.end - r.arrival_ms);
            done.push(op.idx);
        }
        self.start_main(op.end);
    }

    /// Starts the next log write at `now` if the log disk is free and has room for it; a
    /// write short of room waits for the oldest held tracks' write-back (§2.1).
    fn start_log(&mut self, now: f64) {
        let l = &mut self.log;
        if l.busy.is_some() {
            return;
        }
        let Some(&idx) = l.queue.front() else { return };
        let r = self.reqs[idx];
        let sectors = r.bytes.div_ceil(u64::from(self.disk.sector_bytes));
        let spt = u64::from(self.disk.outer_spt());
        let k = sectors.div_ceil(spt).min(l.tracks);
        // Since when the write could have started but for space.
        let mut since = l.free_at.max(r.arrival_ms);
        while l.in_use + k > l.capacity {
            let Some(h) = l.held.front().copied() else {
                break;
            };
            let Some(back) = self.written_back[h.idx] else {
                return; // retried when that write-back completes
            };
            let t = h.log_end.max(back);
            if t > since {
                since = t;
                self.result.space_waits += 1;
            }
            l.in_use -= h.tracks;
            l.held.pop_front();
        }
        while let Some(h) = l.held.front().copied() {
            if self.written_back[h.idx].is_none_or(|b| h.log_end.max(b) > now) {
                break;
            }
            l.in_use -= h.tracks;
            l.held.pop_front();
        }
        l.queue.pop_front();
        let wait = (l.ready_at - now).max(0.0);
        let mut extra = 0.0;
        for _ in 1..k {
            extra += track_move(self.disk, l.track, l.tracks);
            l.track = (l.track + 1) % l.tracks;
        }
        let transfer = self.disk.transfer_ms(sectors, self.disk.outer_spt());
        let end = now + wait + extra + transfer;
        self.result.log_bw.add(transfer, wait + extra);
        l.ready_at = end + track_move(self.disk, l.track, l.tracks);
        l.track = (l.track + 1) % l.tracks;
        l.free_at = end;
        l.in_use += k;
        l.held.push_back(Held {
            idx,
            tracks: k,
            log_end: end,
        });
        l.busy = Some((end, idx));
    }
}

impl Model for Trail<'_> {
    fn submit(&mut self, id: usize, req: &Request, _: &mut Vec<usize>) {
        let now = req.arrival_ms;
        debug_assert_eq!(id, self.reqs.len());
        self.reqs.push(*req);
        self.written_back.push(None);
        self.result
            .buffer_kb
            .add(self.buffered_bytes as f64 / 1024.0);
        if req.write {
            self.buffered_bytes += req.bytes;
            self.backs.push_back(id);
            self.log.queue.push_back(id);
            self.start_log(now);
        } else {
            self.reads.push_back(id);
            self.preempt(now);
        }
        self.start_main(now);
    }

    fn next_event_ms(&self) -> Option<f64> {
        let main = self.cur.map(|op| op.end);
        let log = self.log.busy.map(|b| b.0);
        match (main, log) {
            (Some(m), Some(l)) => Some(m.min(l)),
            (m, l) => m.or(l),
        }
    }

    fn step(&mut self, done: &mut Vec<usize>) {
        let main = self.cur.map(|op| op.end);
        match (main, self.log.busy) {
            (Some(m), Some((l, _))) if l < m => self.finish_log(done),
            (Some(_), _) => self.finish_main(done),
            (None, Some(_)) => self.finish_log(done),
            (None, None) => {}
        }
    }
}

impl Trail<'_> {
    fn finish_log(&mut self, done: &mut Vec<usize>) {
        let Some((end, idx)) = self.log.busy.take() else {
            return;
        };
        self.result
            .write_latency_ms
            .add(end - self.reqs[idx].arrival_ms);
        done.push(idx);
        self.start_log(end);
    }
}

/// Time to move the head from `track` to the next track of the circular log.
fn track_move(disk: &DiskParams, track: u64, tracks: u64) -> f64 {
    let heads = u64::from(disk.heads);
    if track + 1 == tracks {
        disk.seek.full_stroke_ms
    } else if (track + 1).is_multiple_of(heads) {
        disk.seek.time_ms(1)
    } else {
        disk.head_switch_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{Arrivals, Synthetic};

    fn reqs(max_kb: u64, mean_ms: f64, seed: u64) -> Vec<Request> {
        Synthetic {
            reads_per_write: 4.0,
            min_bytes: 1024,
            max_bytes: max_kb * 1024,
            arrivals: Arrivals::Exponential { mean_ms },
            locality: 1.0,
            count: 4_000,
        }
        .generate(&DiskParams::trail_table1(), &mut SplitMix64::new(seed))
    }

    #[test]
    fn every_request_is_served_once() {
        let d = DiskParams::trail_table1();
        let rs = reqs(10, 8.0, 1);
        let t = run(&d, &rs, true, &mut SplitMix64::new(9));
        let writes = rs.iter().filter(|r| r.write).count() as u64;
        assert_eq!(t.write_latency_ms.count, writes);
        assert_eq!(t.read_latency_ms.count, rs.len() as u64 - writes);
        assert!(t.write_latency_ms.mean() > 0.0);
    }

    #[test]
    fn a_full_log_makes_writes_wait_only_when_space_is_limited() {
        let d = DiskParams::trail_table1();
        // 5 ms inter-arrival overloads the main disk with reads: nothing is written back.
        let rs = reqs(1, 5.0, 2);
        let limited = run(&d, &rs, true, &mut SplitMix64::new(1));
        let unlimited = run(&d, &rs, false, &mut SplitMix64::new(1));
        assert_eq!(unlimited.space_waits, 0);
        assert!(unlimited.write_latency_ms.mean() <= limited.write_latency_ms.mean());
    }

    #[test]
    fn an_isolated_write_pays_only_its_transfer() {
        let d = DiskParams::trail_table1();
        let r = [Request {
            arrival_ms: 100.0,
            write: true,
            lba: 12_345,
            bytes: 5 * 1024,
        }];
        let t = run(&d, &r, true, &mut SplitMix64::new(1));
        let xfer = 16.7 * 10.0 / 50.0;
        assert!((t.write_latency_ms.mean() - xfer).abs() < 1e-9);
        assert!((t.log_bw.efficiency() - 1.0).abs() < 1e-12);
    }

    #[test]
    fn a_read_preempts_a_write_back() {
        let d = DiskParams::trail_table1();
        let w = Request {
            arrival_ms: 0.0,
            write: true,
            lba: 99_000,
            bytes: 1024,
        };
        let r = Request {
            arrival_ms: 1.0,
            write: false,
            lba: 0,
            bytes: 1024,
        };
        let t = run(&d, &[w, r], true, &mut SplitMix64::new(1));
        // Without preemption the read would wait for a ~30 ms seek plus rotation first.
        assert!(t.read_latency_ms.mean() < 40.0 && t.main_bw.busy_ms > t.main_bw.transfer_ms);
    }
}
