//! Eager-writing disk arrays and their update-in-place baselines (ew-array-paper.txt §2–4, §6).
//!
//! A `Dm × Ds × Dd` EW-Array keeps `Dm` replicas of every 4 KB block; each replica is striped
//! over `S = Ds·Dd` disks, each using the outer `1/Ds` of its cylinders at utilization `1/Dd`.
//! Array-wide scheduling (§4.5): a read goes to the idle replica disk that can serve it first,
//! or, when all are busy, is queued as duplicates on every replica disk and the others are
//! cancelled when one completes; a write goes to the idle replica disk nearest a free block, or
//! to the shortest queue; the remaining replicas wait in per-disk delayed queues (at most
//! `delayed_limit` blocks array-wide, beyond which they join the foreground queue), served only
//! when the foreground queue is empty. RAID-10 and a plain stripe use the same machinery with
//! fixed locations and SATF; the Doubly Distorted Mirror writes two eager copies synchronously
//! and moves one to its fixed home in the background.

use crate::disk::DiskParams;
use crate::ewdisk::{Band, EwDisk, Op, Scheduler, Target};
use crate::rng::SplitMix64;
use crate::stats::Mean;

/// Where writes go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Eager writing to the nearest free block.
    Eager,
    /// Update in place.
    Fixed,
    /// Doubly Distorted Mirror: two eager writes, one later moved home.
    Ddm,
}

/// An array configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct ArrayConfig {
    pub name: String,
    pub dm: usize,
    /// Disks per replica (`Ds·Dd` for an EW-Array).
    pub per_replica: usize,
    pub dd: f64,
    pub layout: Layout,
    pub sched: Scheduler,
    /// Foreground copies per write (1, or 2 for the "Sync" runs of Fig. 12).
    pub sync_copies: usize,
    /// Blocks buffered for background propagation, array-wide (Fig. 11: 10,000).
    pub delayed_limit: usize,
}

impl ArrayConfig {
    /// A `dm × ds × dd` EW-Array under SATF-EW.
    pub fn ew(dm: usize, ds: f64, dd: f64) -> Self {
        Self {
            name: format!("EW {dm}x{ds}x{dd}"),
            dm,
            per_replica: (ds * dd).round().max(1.0) as usize,
            dd,
            layout: Layout::Eager,
            sched: Scheduler::SatfEw,
            sync_copies: 1,
            delayed_limit: 10_000,
        }
    }

    /// RAID-10 over `disks` disks (two fixed replicas, SATF).
    pub fn raid10(disks: usize) -> Self {
        Self {
            name: format!("RAID-10 ({disks})"),
            dm: 2,
            per_replica: disks / 2,
            dd: 1.0,
            layout: Layout::Fixed,
            sched: Scheduler::Satf,
            sync_copies: 1,
            delayed_limit: 10_000,
        }
    }

    /// A plain `disks`-way stripe (the SR-Array with `Dr = 1`).
    pub fn stripe(disks: usize) -> Self {
        Self {
            name: format!("{disks}-way stripe"),
            dm: 1,
            per_replica: disks,
            dd: 1.0,
            layout: Layout::Fixed,
            sched: Scheduler::Satf,
            sync_copies: 1,
            delayed_limit: 10_000,
        }
    }

    /// A Doubly Distorted Mirror over `disks` disks at dilution 2.
    pub fn ddm(disks: usize) -> Self {
        Self {
            name: format!("DDM ({disks})"),
            dm: 2,
            per_replica: disks / 2,
            dd: 2.0,
            layout: Layout::Ddm,
            sched: Scheduler::SatfEw,
            sync_copies: 2,
            delayed_limit: 10_000,
        }
    }

    pub fn disks(&self) -> usize {
        self.dm * self.per_replica
    }
}

/// How requests arrive. Blocks are uniform over the data set; every request is 4 KB.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Load {
    /// Iometer: `depth` requests outstanding at all times (a new one when one retires).
    Closed { depth: usize },
    /// Poisson arrivals at this rate.
    Open { per_sec: f64 },
}

/// One run.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub load: Load,
    pub read_fraction: f64,
    /// Logical data set as a fraction of one disk's capacity.
    pub data_fraction: f64,
    pub count: usize,
}

/// What a run measured.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ArrayResult {
    pub latency_ms: Mean,
    pub read_ms: Mean,
    pub write_ms: Mean,
    pub elapsed_ms: f64,
    pub physical_ops: u64,
    pub cancelled_duplicates: u64,
    pub delayed_overflow: u64,
}

impl ArrayResult {
    /// Completed requests per second.
    pub fn throughput(&self) -> f64 {
        self.latency_ms.count as f64 / (self.elapsed_ms.max(1e-9) / 1000.0)
    }
}

#[derive(Debug, Clone, Copy)]
struct Req {
    arrival: f64,
    write: bool,
    block: u32,
    pending: u8,
    done: bool,
}

#[derive(Debug, Clone, Copy)]
struct InService {
    end: f64,
    op: Op,
    block: u32,
    delayed: bool,
}

struct Member {
    disk: EwDisk,
    fg: Vec<Op>,
    delayed: Vec<Op>,
    busy: Option<InService>,
}

/// The array state during a run.
struct Array {
    cfg: ArrayConfig,
    members: Vec<Member>,
    /// Physical block of replica `k` of logical block `l` at `l * dm + k`.
    loc: Vec<u32>,
    valid: Vec<bool>,
    /// DDM: the fixed home of each replica (update-in-place copy).
    reqs: Vec<Req>,
    delayed_total: usize,
    out: ArrayResult,
}

/// Tag bit marking a DDM background move (served as a fixed-location write).
const MOVE: usize = 1 << 62;

impl Array {
    fn new(cfg: &ArrayConfig, logical: u64, rng: &mut SplitMix64) -> Self {
        let disk = DiskParams::st39133lwv();
        let per_disk = logical.div_ceil(cfg.per_replica as u64);
        let band = match cfg.layout {
            Layout::Fixed => Band::holding(&disk, per_disk),
            Layout::Eager | Layout::Ddm => {
                Band::holding(&disk, (per_disk as f64 * cfg.dd).ceil() as u64)
            }
        };
        let members: Vec<Member> = (0..cfg.disks())
            .map(|_| Member {
                disk: EwDisk::new(band.clone(), rng.unit()),
                fg: Vec::new(),
                delayed: Vec::new(),
                busy: None,
            })
            .collect();
        let mut a = Self {
            cfg: cfg.clone(),
            members,
            loc: vec![0; logical as usize * cfg.dm],
            valid: vec![true; logical as usize * cfg.dm],
            reqs: Vec::new(),
            delayed_total: 0,
            out: ArrayResult::default(),
        };
        a.lay_out(logical, rng);
        a
    }

    /// Initial placement: fixed layouts in order; eager layouts at random free blocks, which
    /// is where a steady random-write workload leaves them (§2.1).
    fn lay_out(&mut self, logical: u64, rng: &mut SplitMix64) {
        let (dm, s) = (self.cfg.dm, self.cfg.per_replica);
        for l in 0..logical as usize {
            for k in 0..dm {
                let dev = k * s + l % s;
                let home = (l / s) as u32;
                let m = &mut self.members[dev].disk;
                let block = if self.cfg.layout == Layout::Fixed {
                    home
                } else {
                    let n = m.band.blocks();
                    let mut b = rng.range(0, u64::from(n) - 1) as u32;
                    while !m.is_free(b) {
                        b = (b + 1) % n;
                    }
                    b
                };
                m.occupy(block);
                self.loc[l * dm + k] = block;
            }
        }
    }

    fn dev_of(&self, block: u32, k: usize) -> usize {
        k * self.cfg.per_replica + block as usize % self.cfg.per_replica
    }

    fn idle(&self, dev: usize) -> bool {
        let m = &self.members[dev];
        m.busy.is_none() && m.fg.is_empty()
    }

    fn submit(&mut self, now: f64, write: bool, block: u32) {
        let id = self.reqs.len();
        self.reqs.push(Req {
            arrival: now,
            write,
            block,
            pending: 0,
            done: false,
        });
        if write {
            self.submit_write(now, id);
        } else {
            self.submit_read(now, id);
        }
    }

    fn submit_read(&mut self, now: f64, id: usize) {
        let l = self.reqs[id].block as usize;
        let dm = self.cfg.dm;
        let cands: Vec<usize> = (0..dm).filter(|&k| self.valid[l * dm + k]).collect();
        if cands.is_empty() {
            // Every replica is being rewritten: the data is still in the write buffer.
            return self.finish(id, now);
        }
        let op = |k: usize, a: &Self| Op {
            tag: id,
            write: false,
            target: Target::Fixed(a.loc[l * dm + k]),
        };
        let idle = cands
            .iter()
            .map(|&k| (k, self.dev_of(l as u32, k)))
            .filter(|&(_, d)| self.idle(d))
            .map(|(k, d)| {
                let end = self.members[d]
                    .disk
                    .access_end(now, self.loc[l * dm + k], false);
                (end, k, d)
            })
            .min_by(|a, b| a.0.total_cmp(&b.0));
        if let Some((_, k, d)) = idle {
            let o = op(k, self);
            self.members[d].fg.push(o);
            return self.start(d, now);
        }
        for k in cands {
            let d = self.dev_of(l as u32, k);
            let o = op(k, self);
            self.members[d].fg.push(o);
        }
    }

    fn submit_write(&mut self, now: f64, id: usize) {
        let l = self.reqs[id].block as usize;
        let dm = self.cfg.dm;
        for k in 0..dm {
            self.valid[l * dm + k] = false;
        }
        let mut order: Vec<(bool, f64, usize, usize)> = (0..dm)
            .map(|k| {
                let d = self.dev_of(l as u32, k);
                let key = if self.idle(d) {
                    self.write_cost(d, k, l, now)
                } else {
                    self.members[d].fg.len() as f64
                };
                (!self.idle(d), key, k, d)
            })
            .collect();
        order.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
        let fg = self.cfg.sync_copies.min(dm);
        self.reqs[id].pending = fg as u8;
        for (i, &(_, _, k, d)) in order.iter().enumerate() {
            let target = self.write_target(k, l);
            let op = Op {
                tag: id,
                write: true,
                target,
            };
            if i < fg {
                self.members[d].fg.push(op);
            } else {
                self.background(d, op);
            }
            self.start(d, now);
        }
    }

    fn write_target(&self, k: usize, l: usize) -> Target {
        match self.cfg.layout {
            Layout::Fixed => Target::Fixed(self.loc[l * self.cfg.dm + k]),
            Layout::Eager | Layout::Ddm => Target::Anywhere,
        }
    }

    fn write_cost(&self, d: usize, k: usize, l: usize, now: f64) -> f64 {
        let disk = &self.members[d].disk;
        match self.cfg.layout {
            Layout::Fixed => disk.access_end(now, self.loc[l * self.cfg.dm + k], true),
            _ => disk.nearest_free_now(now).map_or(f64::INFINITY, |(_, t)| t),
        }
    }

    /// Queues a replica write for background propagation, or in the foreground when the
    /// delayed-write buffer is full.
    fn background(&mut self, d: usize, op: Op) {
        if self.delayed_total < self.cfg.delayed_limit {
            self.delayed_total += 1;
            self.members[d].delayed.push(op);
        } else {
            self.out.delayed_overflow += 1;
            self.members[d].fg.push(Op {
                tag: op.tag | (MOVE >> 1),
                ..op
            });
        }
    }

    /// Starts the next op on `dev` if it is idle.
    fn start(&mut self, dev: usize, now: f64) {
        let sched = self.cfg.sched;
        let m = &mut self.members[dev];
        if m.busy.is_some() {
            return;
        }
        let (queue, delayed) = if m.fg.is_empty() {
            (&mut m.delayed, true)
        } else {
            (&mut m.fg, false)
        };
        let Some(c) = m.disk.choose(queue, now, sched) else {
            return;
        };
        let op = queue.swap_remove(c.index);
        if op.target == Target::Anywhere {
            m.disk.occupy(c.block);
        }
        m.busy = Some(InService {
            end: c.end_ms,
            op,
            block: c.block,
            delayed,
        });
    }

    fn next_completion(&self) -> Option<(f64, usize)> {
        self.members
            .iter()
            .enumerate()
            .filter_map(|(i, m)| m.busy.map(|b| (b.end, i)))
            .min_by(|a, b| a.0.total_cmp(&b.0))
    }

    fn complete(&mut self, dev: usize) -> f64 {
        let Some(s) = self.members[dev].busy.take() else {
            return 0.0;
        };
        let now = s.end;
        self.out.physical_ops += 1;
        self.members[dev].disk.served(s.block);
        if s.delayed {
            self.delayed_total = self.delayed_total.saturating_sub(1);
        }
        let (background, tag) = (s.op.tag & (MOVE >> 1) != 0, s.op.tag & !(MOVE | MOVE >> 1));
        if s.op.tag & MOVE != 0 {
            // DDM: the copy reached its fixed home; nothing else changes.
        } else if s.op.write {
            self.written(dev, tag, s, now, background);
        } else if !self.reqs[tag].done {
            self.cancel_duplicates(tag, dev);
            self.finish(tag, now);
        } else {
            self.out.cancelled_duplicates += 1;
        }
        self.start(dev, now);
        now
    }

    fn written(&mut self, dev: usize, id: usize, s: InService, now: f64, background: bool) {
        let dm = self.cfg.dm;
        let k = dev / self.cfg.per_replica;
        let l = self.reqs[id].block as usize;
        let slot = l * dm + k;
        if s.op.target == Target::Anywhere {
            let old = std::mem::replace(&mut self.loc[slot], s.block);
            if old != s.block {
                self.members[dev].disk.release(old);
            }
        }
        self.valid[slot] = true;
        let foreground = !s.delayed && !background;
        if foreground && !self.reqs[id].done {
            self.reqs[id].pending = self.reqs[id].pending.saturating_sub(1);
            if self.reqs[id].pending == 0 {
                self.finish(id, now);
            }
        }
        if self.cfg.layout == Layout::Ddm && k == 0 && foreground {
            // Move the first copy to its fixed home (the block's own index) in the background.
            let home = (l / self.cfg.per_replica) as u32 % self.members[dev].disk.band.blocks();
            self.background(
                dev,
                Op {
                    tag: id | MOVE,
                    write: true,
                    target: Target::Fixed(home),
                },
            );
        }
    }

    fn cancel_duplicates(&mut self, id: usize, served_by: usize) {
        let l = self.reqs[id].block;
        for k in 0..self.cfg.dm {
            let d = self.dev_of(l, k);
            if d == served_by {
                continue;
            }
            let before = self.members[d].fg.len();
            self.members[d].fg.retain(|o| o.write || o.tag != id);
            self.out.cancelled_duplicates += (before - self.members[d].fg.len()) as u64;
        }
    }

    fn finish(&mut self, id: usize, now: f64) {
        let r = &mut self.reqs[id];
        if r.done {
            return;
        }
        r.done = true;
        let lat = now - r.arrival;
        self.out.latency_ms.add(lat);
        if r.write {
            self.out.write_ms.add(lat);
        } else {
            self.out.read_ms.add(lat);
        }
        self.out.elapsed_ms = self.out.elapsed_ms.max(now);
    }
}

impl EwDisk {
    /// Completion of an eager write started now from the current head position.
    pub fn nearest_free_now(&self, now: f64) -> Option<(u32, f64)> {
        self.nearest_free(self.head_track(), now, false)
    }
}

/// Simulates `run` on `cfg`, deterministically for `seed`.
pub fn simulate(cfg: &ArrayConfig, run: &Run, seed: u64) -> ArrayResult {
    let root = SplitMix64::new(seed);
    let disk_blocks = Band::disk_blocks(&DiskParams::st39133lwv());
    let logical = ((disk_blocks as f64 * run.data_fraction) as u64).max(1);
    let mut a = Array::new(cfg, logical, &mut root.fork(1));
    let mut rng = root.fork(2);
    let draw = |rng: &mut SplitMix64| {
        let write = rng.unit() >= run.read_fraction;
        (write, rng.range(0, logical - 1) as u32)
    };
    let mut issued = 0;
    let mut next_arrival = 0.0;
    if let Load::Closed { depth } = run.load {
        for _ in 0..depth.min(run.count) {
            let (w, b) = draw(&mut rng);
            a.submit(0.0, w, b);
            issued += 1;
        }
    }
    loop {
        let done = a.next_completion();
        if let Load::Open { per_sec } = run.load {
            if issued < run.count && done.is_none_or(|(t, _)| next_arrival < t) {
                let (w, b) = draw(&mut rng);
                a.submit(next_arrival, w, b);
                issued += 1;
                next_arrival += rng.exponential(1000.0 / per_sec);
                continue;
            }
        }
        let Some((_, dev)) = done else { break };
        let before = a.out.latency_ms.count;
        let now = a.complete(dev);
        if let Load::Closed { .. } = run.load {
            for _ in before..a.out.latency_ms.count {
                if issued < run.count {
                    let (w, b) = draw(&mut rng);
                    a.submit(now, w, b);
                    issued += 1;
                }
            }
        }
        if a.out.latency_ms.count as usize >= run.count {
            break;
        }
    }
    a.out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_request_completes_once() {
        let run = Run {
            load: Load::Closed { depth: 8 },
            read_fraction: 0.5,
            data_fraction: 0.05,
            count: 2_000,
        };
        for cfg in [
            ArrayConfig::ew(2, 1.0, 2.0),
            ArrayConfig::raid10(4),
            ArrayConfig::stripe(2),
            ArrayConfig::ddm(4),
        ] {
            let r = simulate(&cfg, &run, 1);
            assert_eq!(r.latency_ms.count, 2_000, "{}", cfg.name);
            assert!(r.physical_ops >= 2_000, "{}", cfg.name);
        }
    }

    #[test]
    fn eager_writes_are_much_faster_than_updates_in_place() {
        let run = Run {
            load: Load::Closed { depth: 1 },
            read_fraction: 0.0,
            data_fraction: 0.2,
            count: 2_000,
        };
        let ew = simulate(&ArrayConfig::ew(1, 1.0, 2.0), &run, 3);
        let fixed = simulate(&ArrayConfig::stripe(1), &run, 3);
        assert!(ew.write_ms.mean() * 3.0 < fixed.write_ms.mean());
    }
}
