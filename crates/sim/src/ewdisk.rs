//! One disk of an eager-writing array (ew-array-paper.txt §3–4): the used band of cylinders,
//! 4 KB blocks, a free-block map, and the single-disk schedulers of §4.
//!
//! Simplifications (docs/simulation.md): every track of the band has the disk's mean number of
//! sectors per track; a disk only uses the band of `cylinders / Ds` cylinders at its outer
//! edge (striping shortens seeks); times are `f64` milliseconds.

use crate::disk::{DiskParams, SeekCurve};

/// Sectors per 4 KB block.
pub const BLOCK_SECTORS: u32 = 8;

/// The ST39133LWV's write settle: Table 1's write average seek minus its read average seek.
pub const WRITE_SETTLE_MS: f64 = 6.0 - 5.2;

/// The geometry and timing of the band a disk uses.
#[derive(Debug, Clone, PartialEq)]
pub struct Band {
    pub cylinders: u32,
    pub heads: u32,
    pub blocks_per_track: u32,
    pub rotation_ms: f64,
    pub seek: SeekCurve,
    pub head_switch_ms: f64,
    pub controller_ms: f64,
    /// Writes settle longer than reads (ew-array-paper.txt §3.2: "it takes longer for the disk
    /// head to settle when servicing a write request"): every write pays this on top of a
    /// read's positioning, moved or not, as Fig. 1 counts it in the write's overhead. Table 1's
    /// average seeks (5.2 ms read, 6.0 ms write) give 0.8 ms.
    pub write_settle_ms: f64,
}

impl Band {
    /// The outer `fraction` of `disk`'s cylinders.
    pub fn of(disk: &DiskParams, fraction: f64) -> Self {
        let cylinders = ((f64::from(disk.cylinders()) * fraction).round() as u32).max(1);
        Self::with_cylinders(disk, cylinders)
    }

    /// The fewest outer cylinders of `disk` holding `blocks` blocks.
    pub fn holding(disk: &DiskParams, blocks: u64) -> Self {
        let per_cyl = u64::from(Self::with_cylinders(disk, 1).blocks());
        Self::with_cylinders(disk, blocks.div_ceil(per_cyl).max(1) as u32)
    }

    /// Blocks on the whole disk.
    pub fn disk_blocks(disk: &DiskParams) -> u64 {
        u64::from(Self::with_cylinders(disk, disk.cylinders()).blocks())
    }

    fn with_cylinders(disk: &DiskParams, cylinders: u32) -> Self {
        let spt_mean =
            disk.total_sectors() as f64 / (f64::from(disk.cylinders()) * f64::from(disk.heads));
        Self {
            cylinders,
            heads: disk.heads,
            blocks_per_track: (spt_mean as u32 / BLOCK_SECTORS).max(1),
            rotation_ms: disk.rotation_ms,
            seek: disk.seek,
            head_switch_ms: disk.head_switch_ms,
            controller_ms: disk.controller_ms,
            write_settle_ms: WRITE_SETTLE_MS,
        }
    }

    pub fn tracks(&self) -> u32 {
        self.cylinders * self.heads
    }

    pub fn blocks(&self) -> u32 {
        self.tracks() * self.blocks_per_track
    }

    pub fn block_ms(&self) -> f64 {
        self.rotation_ms / f64::from(self.blocks_per_track)
    }

    /// (track, index in track) of a block.
    fn locate(&self, block: u32) -> (u32, u32) {
        (block / self.blocks_per_track, block % self.blocks_per_track)
    }

    /// Positioning time from `track` to `to` (seek or head switch, and a write's settle),
    /// without rotation.
    fn position_ms(&self, from: u32, to: u32, write: bool) -> f64 {
        let (fc, tc) = (from / self.heads, to / self.heads);
        let settle = if write { self.write_settle_ms } else { 0.0 };
        settle
            + if fc != tc {
                self.seek.time_ms(fc.abs_diff(tc))
            } else if from != to {
                self.head_switch_ms
            } else {
                0.0
            }
    }
}

/// Which queued operation a disk serves next (ew-array-paper §4.1–4.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheduler {
    WriteFirst,
    ReadFirst,
    SatfEw,
    FreeBwScan,
    FreeBwSatf,
    FreeBwHybrid,
    /// Shortest access time first over fixed locations (update-in-place baselines).
    Satf,
}

impl Scheduler {
    pub const EAGER: [Scheduler; 6] = [
        Self::WriteFirst,
        Self::ReadFirst,
        Self::SatfEw,
        Self::FreeBwScan,
        Self::FreeBwSatf,
        Self::FreeBwHybrid,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::WriteFirst => "write-first",
            Self::ReadFirst => "read-first",
            Self::SatfEw => "SATF-EW",
            Self::FreeBwScan => "FreeBW-SCAN",
            Self::FreeBwSatf => "FreeBW-SATF",
            Self::FreeBwHybrid => "FreeBW-Hybrid",
            Self::Satf => "SATF",
        }
    }
}

/// Where a queued operation goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A read or an update in place of this block.
    Fixed(u32),
    /// An eager write: any free block.
    Anywhere,
    /// Any of the rotational replicas of one block on one track (the SR-Array, ew-array-paper
    /// §6.2): replica `j` is block `first + j·stride`, eligible when bit `j` of `mask` is set.
    /// The disk serves whichever comes under the head first.
    Replicas { first: u32, stride: u32, mask: u8 },
}

impl Target {
    /// The blocks this target may be served at.
    pub fn blocks(self) -> impl Iterator<Item = u32> {
        let (first, stride, mask) = match self {
            Target::Fixed(b) => (b, 0, 1u8),
            Target::Anywhere => (0, 0, 0),
            Target::Replicas {
                first,
                stride,
                mask,
            } => (first, stride, mask),
        };
        (0..8u32)
            .filter(move |j| mask & (1 << j) != 0)
            .map(move |j| first + j * stride)
    }
}

/// A queued operation; `tag` is the caller's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Op {
    pub tag: usize,
    pub write: bool,
    pub target: Target,
}

/// The disk's choice: which queued op, at which block, finishing when.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Choice {
    pub index: usize,
    pub block: u32,
    pub end_ms: f64,
}

/// One disk: head position, spindle phase and free-block map.
#[derive(Debug, Clone)]
pub struct EwDisk {
    pub band: Band,
    free: Vec<bool>,
    free_in_track: Vec<u32>,
    track: u32,
    phase_ms: f64,
    /// SCAN / one-direction sweep: true while cylinders increase.
    up: bool,
}

impl EwDisk {
    /// A disk whose band is all free; `phase` in [0, 1) offsets its spindle.
    pub fn new(band: Band, phase: f64) -> Self {
        let n = band.blocks() as usize;
        let bpt = band.blocks_per_track;
        Self {
            free: vec![true; n],
            free_in_track: vec![bpt; band.tracks() as usize],
            track: 0,
            phase_ms: phase * band.rotation_ms,
            up: true,
            band,
        }
    }

    /// The track under the head.
    pub fn head_track(&self) -> u32 {
        self.track
    }

    pub fn is_free(&self, block: u32) -> bool {
        self.free[block as usize]
    }

    pub fn occupy(&mut self, block: u32) {
        if std::mem::replace(&mut self.free[block as usize], false) {
            self.free_in_track[(block / self.band.blocks_per_track) as usize] -= 1;
        }
    }

    pub fn release(&mut self, block: u32) {
        if !std::mem::replace(&mut self.free[block as usize], true) {
            self.free_in_track[(block / self.band.blocks_per_track) as usize] += 1;
        }
    }

    /// Completion time of an access to `block` started at `now`.
    pub fn access_end(&self, now: f64, block: u32, write: bool) -> f64 {
        self.access_from(self.track, now, block, write)
    }

    /// The block of a fixed-location `target` that an access started at `now` finishes
    /// first at, and when.
    pub fn target_end(&self, now: f64, target: Target, write: bool) -> Option<(u32, f64)> {
        target
            .blocks()
            .map(|b| (b, self.access_end(now, b, write)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
    }

    fn access_from(&self, from: u32, now: f64, block: u32, write: bool) -> f64 {
        let b = &self.band;
        let (track, idx) = b.locate(block);
        let arrive = now + b.controller_ms + b.position_ms(from, track, write);
        let angle = self.angle_blocks(arrive);
        let wait = (f64::from(idx) - angle).rem_euclid(f64::from(b.blocks_per_track));
        arrive + (wait + 1.0) * b.block_ms()
    }

    /// Spindle angle at `t`, in blocks.
    fn angle_blocks(&self, t: f64) -> f64 {
        let b = &self.band;
        ((t + self.phase_ms) / b.rotation_ms).fract() * f64::from(b.blocks_per_track)
    }

    /// The free block reachable first from `from` at `now` (in the sweep direction if
    /// `one_way`), with its completion time.
    pub fn nearest_free(&self, from: u32, now: f64, one_way: bool) -> Option<(u32, f64)> {
        let b = &self.band;
        let cyl = i64::from(from / b.heads);
        let mut best: Option<(u32, f64)> = None;
        for d in 0..i64::from(b.cylinders) {
            let floor = now
                + b.controller_ms
                + b.position_ms(from, from + b.heads * d as u32, true) * f64::from(u8::from(d > 0));
            if best.is_some_and(|(_, t)| floor >= t) {
                break;
            }
            let sides: &[i64] = match (d, one_way, self.up) {
                (0, _, _) => &[0],
                (_, true, true) => &[1],
                (_, true, false) => &[-1],
                _ => &[1, -1],
            };
            for &s in sides {
                let c = cyl + s * d;
                if c < 0 || c >= i64::from(b.cylinders) {
                    continue;
                }
                for h in 0..b.heads {
                    let t = c as u32 * b.heads + h;
                    if let Some(found) = self.first_free_on(from, t, now) {
                        if best.is_none_or(|(_, bt)| found.1 < bt) {
                            best = Some(found);
                        }
                    }
                }
            }
        }
        best
    }

    /// The first free block on `track` reachable from `from` at `now`.
    fn first_free_on(&self, from: u32, track: u32, now: f64) -> Option<(u32, f64)> {
        if self.free_in_track[track as usize] == 0 {
            return None;
        }
        let b = &self.band;
        let arrive = now + b.controller_ms + b.position_ms(from, track, true);
        let angle = self.angle_blocks(arrive);
        let bpt = b.blocks_per_track;
        let first = angle.ceil() as u32;
        for k in 0..bpt {
            let idx = (first + k) % bpt;
            let block = track * bpt + idx;
            if self.free[block as usize] {
                let wait = (f64::from(idx) - angle).rem_euclid(f64::from(bpt));
                return Some((block, arrive + (wait + 1.0) * b.block_ms()));
            }
        }
        None
    }

    /// An eager write at `now`: the nearest free block (in the sweep direction when the
    /// scheduler sweeps), turning around at the band's edge.
    fn eager(&mut self, now: f64, one_way: bool) -> Option<(u32, f64)> {
        if let Some(f) = self.nearest_free(self.track, now, one_way) {
            return Some(f);
        }
        self.up = !self.up;
        self.nearest_free(self.track, now, one_way)
    }

    /// Moves the head to the block just served.
    pub fn served(&mut self, block: u32) {
        let t = block / self.band.blocks_per_track;
        let (old, new) = (self.track / self.band.heads, t / self.band.heads);
        if new != old {
            self.up = new > old;
        }
        self.track = t;
    }

    /// Chooses the next op of `queue` at `now` under `sched`. `None` when the queue is empty
    /// (or an eager write finds no free block).
    pub fn choose(&mut self, queue: &[Op], now: f64, sched: Scheduler) -> Option<Choice> {
        if queue.is_empty() {
            return None;
        }
        let has_write = queue.iter().any(|o| o.target == Target::Anywhere);
        let has_fixed = queue.iter().any(|o| o.target != Target::Anywhere);
        let one_way = sched != Scheduler::WriteFirst && sched != Scheduler::ReadFirst;
        let write = || queue.iter().position(|o| o.target == Target::Anywhere);
        let pick_write = |me: &mut Self| {
            let i = write()?;
            let (block, end_ms) = me.eager(now, one_way)?;
            Some(Choice {
                index: i,
                block,
                end_ms,
            })
        };
        match sched {
            Scheduler::WriteFirst if has_write => pick_write(self),
            Scheduler::ReadFirst | Scheduler::WriteFirst | Scheduler::Satf if has_fixed => {
                self.satf(queue, now)
            }
            Scheduler::SatfEw => {
                let r = if has_fixed {
                    self.satf(queue, now)
                } else {
                    None
                };
                let w = if has_write { pick_write(self) } else { None };
                match (r, w) {
                    (Some(r), Some(w)) => Some(if r.end_ms <= w.end_ms { r } else { w }),
                    (r, w) => r.or(w),
                }
            }
            Scheduler::FreeBwScan | Scheduler::FreeBwSatf | Scheduler::FreeBwHybrid
                if has_fixed =>
            {
                let scan = sched == Scheduler::FreeBwScan
                    || (sched == Scheduler::FreeBwHybrid && has_write);
                let read = if scan {
                    self.scan(queue, now)
                } else {
                    self.satf(queue, now)
                }?;
                if has_write {
                    if let Some(w) = self.fits_before(queue, now, read) {
                        return Some(w);
                    }
                }
                Some(read)
            }
            _ => pick_write(self),
        }
    }

    /// Every (queue index, block) a fixed-location op may be served at.
    fn fixed(queue: &[Op]) -> impl Iterator<Item = (usize, u32)> + '_ {
        queue
            .iter()
            .enumerate()
            .flat_map(|(i, o)| o.target.blocks().map(move |b| (i, b)))
    }

    /// Shortest access time first among fixed-location ops.
    fn satf(&self, queue: &[Op], now: f64) -> Option<Choice> {
        Self::fixed(queue)
            .map(|(i, b)| Choice {
                index: i,
                block: b,
                end_ms: self.access_end(now, b, queue[i].write),
            })
            .min_by(|a, b| a.end_ms.total_cmp(&b.end_ms))
    }

    /// SCAN: the nearest fixed-location op by cylinder in the sweep direction.
    fn scan(&mut self, queue: &[Op], now: f64) -> Option<Choice> {
        let heads = self.band.heads;
        let bpt = self.band.blocks_per_track;
        let cyl = self.track / heads;
        let key = |up: bool, b: u32| {
            let c = b / bpt / heads;
            match (up, c >= cyl, c <= cyl) {
                (true, true, _) => Some(c - cyl),
                (false, _, true) => Some(cyl - c),
                _ => None,
            }
        };
        let pick = |up: bool| {
            Self::fixed(queue)
                .filter_map(|(i, b)| key(up, b).map(|k| (k, i, b)))
                .min()
        };
        let (_, i, b) = pick(self.up).or_else(|| {
            self.up = !self.up;
            pick(self.up)
        })?;
        Some(Choice {
            index: i,
            block: b,
            end_ms: self.access_end(now, b, queue[i].write),
        })
    }

    /// An eager write that fits before `read` without making it finish later (§4.3): the
    /// nearest free block, or a free block on the read's own track that passes under the head
    /// before the read's sector.
    fn fits_before(&mut self, queue: &[Op], now: f64, read: Choice) -> Option<Choice> {
        let i = queue.iter().position(|o| o.target == Target::Anywhere)?;
        let read_track = read.block / self.band.blocks_per_track;
        let fits = |me: &Self, (block, end): (u32, f64)| {
            let t = block / me.band.blocks_per_track;
            (me.access_from(t, end, read.block, false) <= read.end_ms + 1e-9).then_some(Choice {
                index: i,
                block,
                end_ms: end,
            })
        };
        if let Some(c) = self
            .nearest_free(self.track, now, true)
            .and_then(|f| fits(self, f))
        {
            return Some(c);
        }
        self.first_free_on(self.track, read_track, now)
            .and_then(|f| fits(self, f))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk() -> EwDisk {
        EwDisk::new(Band::of(&DiskParams::st39133lwv(), 0.1), 0.0)
    }

    #[test]
    fn an_empty_disk_writes_in_the_current_track_within_a_block() {
        let d = disk();
        let (block, end) = d.nearest_free(0, 0.0, false).unwrap();
        assert_eq!(block / d.band.blocks_per_track, 0);
        let b = &d.band;
        assert!(end <= b.controller_ms + b.write_settle_ms + 2.0 * b.block_ms() + 1e-9);
    }

    #[test]
    fn a_full_track_sends_the_write_elsewhere() {
        let mut d = disk();
        for b in 0..d.band.blocks_per_track {
            d.occupy(b);
        }
        let (block, _) = d.nearest_free(0, 0.0, false).unwrap();
        assert_ne!(block / d.band.blocks_per_track, 0);
    }

    #[test]
    fn a_write_settles_longer_than_a_read_even_in_place() {
        let d = disk();
        let b = &d.band;
        // The same block from the same head position: the write settles before it can start,
        // so it ends at least the settle time later (a rotation later if it then misses).
        let (r, w) = (d.access_end(0.0, 5, false), d.access_end(0.0, 5, true));
        assert!(
            b.write_settle_ms > 0.0 && w >= r + b.write_settle_ms - 1e-9,
            "{r} {w}"
        );
    }

    #[test]
    fn satf_serves_the_rotational_copy_that_comes_first() {
        let mut d = disk();
        let bpt = d.band.blocks_per_track;
        let stride = bpt / 2;
        let target = Target::Replicas {
            first: 2 * bpt,
            stride,
            mask: 0b11,
        };
        let q = [Op {
            tag: 0,
            write: false,
            target,
        }];
        let c = d.choose(&q, 0.0, Scheduler::Satf).unwrap();
        let copies = [2 * bpt, 2 * bpt + stride];
        assert!(copies.contains(&c.block));
        let first = copies
            .iter()
            .map(|&b| d.access_end(0.0, b, false))
            .fold(f64::MAX, f64::min);
        assert!((c.end_ms - first).abs() < 1e-12);
        // Only the eligible copy is served when the other is stale.
        let q = [Op {
            tag: 0,
            write: false,
            target: Target::Replicas {
                first: 2 * bpt,
                stride,
                mask: 0b10,
            },
        }];
        assert_eq!(d.choose(&q, 0.0, Scheduler::Satf).unwrap().block, copies[1]);
    }

    #[test]
    fn satf_prefers_the_closer_read() {
        let mut d = disk();
        let bpt = d.band.blocks_per_track;
        let far = 5_000 * bpt;
        let q = [
            Op {
                tag: 0,
                write: false,
                target: Target::Fixed(far),
            },
            Op {
                tag: 1,
                write: false,
                target: Target::Fixed(3),
            },
        ];
        let c = d.choose(&q, 0.0, Scheduler::Satf).unwrap();
        assert_eq!(c.index, 1);
    }
}
