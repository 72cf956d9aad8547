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
//! and moves one to its fixed home in the background. The SR-Array (`Ds × Dr`, Yu et al., the
//! paper's ref. 30) stripes over `Ds·Dr` disks, each using the outer `1/Ds` of its cylinders, and
//! keeps `Dr` copies of every block evenly spaced on one track: a read is served by the copy that
//! comes under the head first; a write updates the copy that comes first in the foreground and
//! the other `Dr − 1` copies through the disk's delayed queue, set aside as soon as the first
//! copy is scheduled (§6.3: "the second and subsequent replicas, if any, are propagated in the
//! background").
//!
//! Requests come from [`crate::driver::drive`]: a closed loop ([`Arrivals::Closed`], Iometer)
//! or Poisson arrivals ([`Arrivals::Exponential`]), 4 KB blocks uniform over the data set.

use crate::disk::DiskParams;
use crate::driver::{drive, Model};
use crate::ewdisk::{Band, EwDisk, Op, Scheduler, Target, WRITE_SETTLE_MS};
use crate::rng::SplitMix64;
use crate::stats::Mean;
use crate::workload::{Arrivals, Request, UniformBlocks, BLOCK_SECTORS};

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
    /// Disks per replica (`Ds·Dd` for an EW-Array, `Ds·Dr` for an SR-Array).
    pub per_replica: usize,
    /// Rotational copies of each block on its track (`Dr` of an SR-Array; 1 otherwise).
    pub dr: usize,
    pub dd: f64,
    pub layout: Layout,
    pub sched: Scheduler,
    /// Foreground copies per write (1, or 2 for the "Sync" runs of Fig. 12).
    pub sync_copies: usize,
    /// Blocks buffered for background propagation, array-wide (Fig. 11: 10,000).
    pub delayed_limit: usize,
    /// Extra positioning every write pays ([`Band::write_settle_ms`]).
    pub write_settle_ms: f64,
}

impl ArrayConfig {
    /// A `dm × ds × dd` EW-Array under SATF-EW.
    pub fn ew(dm: usize, ds: f64, dd: f64) -> Self {
        Self {
            name: format!("EW {dm}x{}x{}", short(ds), short(dd)),
            dm,
            per_replica: (ds * dd).round().max(1.0) as usize,
            dr: 1,
            dd,
            layout: Layout::Eager,
            sched: Scheduler::SatfEw,
            sync_copies: 1,
            delayed_limit: 10_000,
            write_settle_ms: WRITE_SETTLE_MS,
        }
    }

    /// RAID-10 over `disks` disks (two fixed replicas, SATF).
    pub fn raid10(disks: usize) -> Self {
        Self {
            name: format!("RAID-10 ({disks})"),
            dm: 2,
            per_replica: disks / 2,
            dr: 1,
            dd: 1.0,
            layout: Layout::Fixed,
            sched: Scheduler::Satf,
            sync_copies: 1,
            delayed_limit: 10_000,
            write_settle_ms: WRITE_SETTLE_MS,
        }
    }

    /// A plain `disks`-way stripe (the SR-Array with `Dr = 1`).
    pub fn stripe(disks: usize) -> Self {
        Self {
            name: format!("{disks}-way stripe"),
            dm: 1,
            per_replica: disks,
            dr: 1,
            dd: 1.0,
            layout: Layout::Fixed,
            sched: Scheduler::Satf,
            sync_copies: 1,
            delayed_limit: 10_000,
            write_settle_ms: WRITE_SETTLE_MS,
        }
    }

    /// A `ds × dr` SR-Array: striped over `ds·dr` disks, each using `1/ds` of its cylinders,
    /// `dr` copies of each block per track (`dr` ≤ 8), update in place under SATF.
    pub fn sr(ds: usize, dr: usize) -> Self {
        Self {
            name: format!("SR-Array {ds}x{dr}"),
            dm: 1,
            per_replica: ds * dr,
            dr: dr.clamp(1, 8),
            dd: 1.0,
            layout: Layout::Fixed,
            sched: Scheduler::Satf,
            sync_copies: 1,
            delayed_limit: 10_000,
            write_settle_ms: WRITE_SETTLE_MS,
        }
    }

    /// A Doubly Distorted Mirror over `disks` disks at dilution 2.
    pub fn ddm(disks: usize) -> Self {
        Self {
            name: format!("DDM ({disks})"),
            dm: 2,
            per_replica: disks / 2,
            dr: 1,
            dd: 2.0,
            layout: Layout::Ddm,
            sched: Scheduler::SatfEw,
            sync_copies: 2,
            delayed_limit: 10_000,
            write_settle_ms: WRITE_SETTLE_MS,
        }
    }

    pub fn disks(&self) -> usize {
        self.dm * self.per_replica
    }
}

/// A configuration parameter for a name: at most three decimals, no trailing zeros.
fn short(x: f64) -> String {
    let s = format!("{x:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// One run.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// A closed loop (Iometer) or Poisson arrivals; blocks are uniform over the data set and
    /// every request is 4 KB.
    pub load: Arrivals,
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
    /// Physical block of replica `k` of logical block `l` at `l * dm + k` (for rotational
    /// copies, the first; copy `j` is `slots·j` blocks further on the track).
    loc: Vec<u32>,
    /// Which rotational copies of replica `k` of block `l` hold its latest data (bit `j` for
    /// copy `j`; without rotational copies, bit 0 is "valid").
    fresh: Vec<u8>,
    /// The latest write request of each logical block.
    latest: Vec<usize>,
    /// Distinct blocks per track (`blocks_per_track / Dr`), the stride between copies.
    slots: u32,
    reqs: Vec<Req>,
    delayed_total: usize,
    /// Requests completed since the driver last asked.
    completed: Vec<usize>,
    out: ArrayResult,
}

/// Tag bit marking a DDM background move (served as a fixed-location write).
const MOVE: usize = 1 << 62;
/// Tag bit marking a background replica write that overflowed into the foreground queue.
const OVERFLOW: usize = MOVE >> 1;
/// No write yet.
const NONE: usize = usize::MAX;

impl Array {
    fn new(cfg: &ArrayConfig, logical: u64, rng: &mut SplitMix64) -> Self {
        let disk = DiskParams::st39133lwv();
        let per_disk = logical.div_ceil(cfg.per_replica as u64);
        let bpt = Band::holding(&disk, 1).blocks_per_track;
        let slots = (bpt / cfg.dr.max(1) as u32).max(1);
        let mut band = match cfg.layout {
            Layout::Fixed => {
                Band::holding(&disk, per_disk.div_ceil(u64::from(slots)) * u64::from(bpt))
            }
            Layout::Eager | Layout::Ddm => {
                Band::holding(&disk, (per_disk as f64 * cfg.dd).ceil() as u64)
            }
        };
        band.write_settle_ms = cfg.write_settle_ms;
        let members: Vec<Member> = (0..cfg.disks())
            .map(|_| Member {
                disk: EwDisk::new(band.clone(), rng.unit()),
                fg: Vec::new(),
                delayed: Vec::new(),
                busy: None,
            })
            .collect();
        let all = ((1u16 << cfg.dr.clamp(1, 8)) - 1) as u8;
        let mut a = Self {
            cfg: cfg.clone(),
            members,
            loc: vec![0; logical as usize * cfg.dm],
            fresh: vec![all; logical as usize * cfg.dm],
            latest: vec![NONE; logical as usize],
            slots,
            reqs: Vec::new(),
            delayed_total: 0,
            completed: Vec::new(),
            out: ArrayResult::default(),
        };
        a.lay_out(logical, rng);
        a
    }

    /// Initial placement: fixed layouts in order (rotational copies `slots` apart on the
    /// track); eager layouts at random free blocks, which is where a steady random-write
    /// workload leaves them (§2.1).
    fn lay_out(&mut self, logical: u64, rng: &mut SplitMix64) {
        let (dm, s) = (self.cfg.dm, self.cfg.per_replica);
        for l in 0..logical as usize {
            for k in 0..dm {
                let dev = k * s + l % s;
                let home = (l / s) as u32;
                let m = &mut self.members[dev].disk;
                let block = if self.cfg.layout == Layout::Fixed {
                    let bpt = m.band.blocks_per_track;
                    let b = home / self.slots * bpt + home % self.slots;
                    for j in 1..self.cfg.dr as u32 {
                        m.occupy(b + j * self.slots);
                    }
                    b
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

    /// Where replica `k` of block `l` can be read or updated in place: the copies in `mask`.
    fn fixed_target(&self, l: usize, k: usize, mask: u8) -> Option<Target> {
        let first = self.loc[l * self.cfg.dm + k];
        match (mask, self.cfg.dr) {
            (0, _) => None,
            (_, 1) => Some(Target::Fixed(first)),
            _ => Some(Target::Replicas {
                first,
                stride: self.slots,
                mask,
            }),
        }
    }

    fn arrive(&mut self, now: f64, write: bool, block: u32) {
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
        let cands: Vec<(usize, Target)> = (0..dm)
            .filter_map(|k| Some((k, self.fixed_target(l, k, self.fresh[l * dm + k])?)))
            .collect();
        if cands.is_empty() {
            // Every replica is being rewritten: the data is still in the write buffer.
            return self.finish(id, now);
        }
        let op = |target| Op {
            tag: id,
            write: false,
            target,
        };
        let idle = cands
            .iter()
            .map(|&(k, t)| (t, self.dev_of(l as u32, k)))
            .filter(|&(_, d)| self.idle(d))
            .filter_map(|(t, d)| Some((self.members[d].disk.target_end(now, t, false)?.1, t, d)))
            .min_by(|a, b| a.0.total_cmp(&b.0));
        if let Some((_, t, d)) = idle {
            self.members[d].fg.push(op(t));
            return self.start(d, now);
        }
        for (k, t) in cands {
            let d = self.dev_of(l as u32, k);
            self.members[d].fg.push(op(t));
        }
    }

    fn submit_write(&mut self, now: f64, id: usize) {
        let l = self.reqs[id].block as usize;
        let dm = self.cfg.dm;
        for k in 0..dm {
            self.fresh[l * dm + k] = 0;
        }
        self.latest[l] = id;
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
        let all = ((1u16 << self.cfg.dr.clamp(1, 8)) - 1) as u8;
        match self.cfg.layout {
            Layout::Fixed => self
                .fixed_target(l, k, all)
                .unwrap_or(Target::Fixed(self.loc[l * self.cfg.dm + k])),
            Layout::Eager | Layout::Ddm => Target::Anywhere,
        }
    }

    fn write_cost(&self, d: usize, k: usize, l: usize, now: f64) -> f64 {
        let disk = &self.members[d].disk;
        let t = match self.cfg.layout {
            Layout::Fixed => disk.target_end(now, self.write_target(k, l), true),
            _ => disk.nearest_free_now(now),
        };
        t.map_or(f64::INFINITY, |(_, t)| t)
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
                tag: op.tag | OVERFLOW,
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
        if let (true, Target::Replicas { .. }) = (op.write, op.target) {
            // The other rotational copies go to the delayed queue once one is scheduled.
            let tag = op.tag | if delayed { OVERFLOW } else { 0 };
            for b in op.target.blocks().filter(|&b| b != c.block) {
                self.background(
                    dev,
                    Op {
                        tag,
                        write: true,
                        target: Target::Fixed(b),
                    },
                );
            }
        }
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
        let (background, tag) = (s.op.tag & OVERFLOW != 0, s.op.tag & !(MOVE | OVERFLOW));
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
        let current = self.latest[l] == id;
        if s.op.target == Target::Anywhere {
            if current {
                let old = std::mem::replace(&mut self.loc[slot], s.block);
                if old != s.block {
                    self.members[dev].disk.release(old);
                }
            } else {
                // A newer write superseded this copy before it landed.
                self.members[dev].disk.release(s.block);
            }
        }
        if current {
            let copy = (s.block % self.members[dev].disk.band.blocks_per_track) / self.slots;
            self.fresh[slot] |= 1 << copy.min(7);
        }
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
        self.completed.push(id);
    }
}

impl Model for Array {
    fn submit(&mut self, id: usize, req: &Request, done: &mut Vec<usize>) {
        debug_assert_eq!(id, self.reqs.len());
        self.arrive(req.arrival_ms, req.write, (req.lba / BLOCK_SECTORS) as u32);
        done.append(&mut self.completed);
    }

    fn next_event_ms(&self) -> Option<f64> {
        self.next_completion().map(|(t, _)| t)
    }

    fn step(&mut self, done: &mut Vec<usize>) {
        if let Some((_, dev)) = self.next_completion() {
            self.complete(dev);
        }
        done.append(&mut self.completed);
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
    let mut src = UniformBlocks {
        blocks: logical,
        read_fraction: run.read_fraction,
    };
    drive(&mut a, &mut src, run.load, run.count, &mut root.fork(2));
    a.out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_request_completes_once() {
        let run = Run {
            load: Arrivals::Closed { depth: 8 },
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
    fn an_sr_array_writes_every_rotational_copy() {
        // A light load leaves idle time for the delayed copies.
        let run = Run {
            load: Arrivals::Exponential { mean_ms: 50.0 },
            read_fraction: 0.0,
            data_fraction: 0.05,
            count: 500,
        };
        let r = simulate(&ArrayConfig::sr(1, 3), &run, 4);
        assert_eq!(r.latency_ms.count, 500);
        assert!(r.physical_ops >= 3 * 500 - 3, "{}", r.physical_ops);
        assert!(r.physical_ops <= 3 * 500);
        // The foreground copy is the nearest of three: well under half a rotation of waiting
        // on average, where one fixed copy waits half a rotation.
        let one = simulate(&ArrayConfig::stripe(3), &run, 4);
        assert!(r.write_ms.mean() + 1.0 < one.write_ms.mean());
    }

    #[test]
    fn eager_writes_are_much_faster_than_updates_in_place() {
        let run = Run {
            load: Arrivals::Closed { depth: 1 },
            read_fraction: 0.0,
            data_fraction: 0.2,
            count: 2_000,
        };
        let ew = simulate(&ArrayConfig::ew(1, 1.0, 2.0), &run, 3);
        let fixed = simulate(&ArrayConfig::stripe(1), &run, 3);
        assert!(ew.write_ms.mean() * 3.0 < fixed.write_ms.mean());
    }
}
