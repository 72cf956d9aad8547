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

use std::collections::{BinaryHeap, VecDeque};

use crate::conventional;
use crate::disk::DiskParams;
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
    let mut out = TrailResult::default();
    let written_back = main_disk(disk, reqs, rng, &mut out);
    buffer_occupancy(reqs, &written_back, &mut out);
    let tracks = u64::from(disk.cylinders()) * u64::from(disk.heads);
    let capacity = if limit_log_space { tracks } else { u64::MAX };
    log_disk(disk, reqs, &written_back, capacity, &mut out);
    out
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

/// The main disk: reads first, preempting write-backs. Returns each request's write-back
/// completion time (reads: their arrival, unused).
fn main_disk(
    disk: &DiskParams,
    reqs: &[Request],
    rng: &mut SplitMix64,
    out: &mut TrailResult,
) -> Vec<f64> {
    let mut done = vec![0.0; reqs.len()];
    let (mut reads, mut backs) = (VecDeque::new(), VecDeque::new());
    let mut cur: Option<MainOp> = None;
    let mut head = 0u32;
    let mut next = 0;
    loop {
        let arrival = reqs.get(next).map(|r| r.arrival_ms);
        match (cur, arrival) {
            (Some(op), a) if a.is_none_or(|a| op.end <= a) => {
                finish(reqs, op, &mut done, out);
                head = op.to_cyl;
                cur = start_next(disk, reqs, &mut reads, &mut backs, head, op.end, rng);
            }
            (_, Some(t)) => {
                let r = &reqs[next];
                if r.write {
                    backs.push_back(next);
                } else {
                    reads.push_back(next);
                    if let Some(op) = cur.filter(|op| reqs[op.idx].write) {
                        // Preempt: the time spent is lost; the write-back starts over later.
                        out.main_bw.add(0.0, t - op.start);
                        head = if t >= op.seek_end {
                            op.to_cyl
                        } else {
                            op.from_cyl
                        };
                        backs.push_front(op.idx);
                        cur = None;
                    }
                }
                next += 1;
                if cur.is_none() {
                    cur = start_next(disk, reqs, &mut reads, &mut backs, head, t, rng);
                }
            }
            (None, None) => break,
            (Some(_), None) => unreachable!("covered by the first arm"),
        }
    }
    done
}

fn start_next(
    disk: &DiskParams,
    reqs: &[Request],
    reads: &mut VecDeque<usize>,
    backs: &mut VecDeque<usize>,
    head: u32,
    now: f64,
    rng: &mut SplitMix64,
) -> Option<MainOp> {
    let idx = reads.pop_front().or_else(|| backs.pop_front())?;
    let r = &reqs[idx];
    let (transfer, overhead, to_cyl) = conventional::access(disk, head, r, rng);
    let seek = disk.seek.time_ms(head.abs_diff(disk.chs(r.lba).cylinder));
    Some(MainOp {
        idx,
        start: now,
        end: now + transfer + overhead,
        transfer,
        overhead,
        from_cyl: head,
        to_cyl,
        seek_end: now + disk.controller_ms + seek,
    })
}

fn finish(reqs: &[Request], op: MainOp, done: &mut [f64], out: &mut TrailResult) {
    out.main_bw.add(op.transfer, op.overhead);
    let r = &reqs[op.idx];
    done[op.idx] = op.end;
    if !r.write {
        out.read_latency_ms.add(op.end - r.arrival_ms);
    }
}

/// Mean bytes in the controller buffer when a request arrives: writes that arrived and are not
/// yet on the main disk.
fn buffer_occupancy(reqs: &[Request], done: &[f64], out: &mut TrailResult) {
    // Min-heap of (write-back time, bytes) as ordered bits of a non-negative f64.
    let mut held: BinaryHeap<std::cmp::Reverse<(u64, u64)>> = BinaryHeap::new();
    let mut bytes = 0u64;
    for (i, r) in reqs.iter().enumerate() {
        while let Some(std::cmp::Reverse((t, b))) = held.peek().copied() {
            if f64::from_bits(t) > r.arrival_ms {
                break;
            }
            held.pop();
            bytes -= b;
        }
        out.buffer_kb.add(bytes as f64 / 1024.0);
        if r.write {
            held.push(std::cmp::Reverse((done[i].to_bits(), r.bytes)));
            bytes += r.bytes;
        }
    }
}

/// The log disk: one write per track, FCFS.
fn log_disk(
    disk: &DiskParams,
    reqs: &[Request],
    done: &[f64],
    capacity: u64,
    out: &mut TrailResult,
) {
    let spt = u64::from(disk.outer_spt());
    let tracks = u64::from(disk.cylinders()) * u64::from(disk.heads);
    let mut used: VecDeque<(f64, u64)> = VecDeque::new();
    let mut in_use = 0u64;
    let (mut track, mut ready_at, mut free_at) = (0u64, 0.0_f64, 0.0_f64);
    for (i, r) in reqs.iter().enumerate().filter(|(_, r)| r.write) {
        let sectors = r.bytes.div_ceil(u64::from(disk.sector_bytes));
        let k = sectors.div_ceil(spt).min(tracks);
        let mut start = free_at.max(r.arrival_ms);
        while in_use + k > capacity {
            let Some((t, n)) = used.pop_front() else {
                break;
            };
            if t > start {
                start = t;
                out.space_waits += 1;
            }
            in_use -= n;
        }
        while used.front().is_some_and(|&(t, _)| t <= start) {
            in_use -= used.pop_front().map_or(0, |(_, n)| n);
        }
        let wait = (ready_at - start).max(0.0);
        let mut extra = 0.0;
        for _ in 1..k {
            extra += track_move(disk, track, tracks);
            track = (track + 1) % tracks;
        }
        let transfer = disk.transfer_ms(sectors, disk.outer_spt());
        let end = start + wait + extra + transfer;
        out.log_bw.add(transfer, wait + extra);
        out.write_latency_ms.add(end - r.arrival_ms);
        ready_at = end + track_move(disk, track, tracks);
        track = (track + 1) % tracks;
        free_at = end;
        in_use += k;
        used.push_back((end.max(done[i]), k));
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
