//! A log disk for the placement policy: a rotational [`DeviceModel`] that writes wherever the
//! head is (mariner-paper.md §4).
//!
//! Each simulated disk has a *true* angular position and an *estimate* of it by eq. (1):
//! `CurrentLBA = SPT·((T1 − T0) mod RoTime)/RoTime + LBA0`, anchored at the last completion
//! (or recalibration read) `T0`. A write is aimed at `CurrentLBA + Lookahead` and takes the first
//! free sectors of the track from there on; the true spindle runs at the nominal speed times
//! `1 + ε`, `ε` drawn uniformly from `±drift` at each anchor, so the estimate decays with the
//! time since the last anchor. If the true head has already passed the aimed sector, the write
//! waits almost a full rotation. An idle disk is recalibrated by a dummy read every `T_idle`.
//!
//! Segments of the policy are tracks of the outermost zone, in order: track `i` is cylinder
//! `i / heads`, head `i % heads`. Moving to the next track costs a command (`Tc`) plus a head
//! switch, or a track-to-track seek at a cylinder boundary.

use mariner_placement::{DeviceModel, Nanos};

use crate::disk::DiskParams;
use crate::rng::SplitMix64;

/// Tunables of the log-disk model.
#[derive(Debug, Clone, PartialEq)]
pub struct LogDiskConfig {
    pub disk: DiskParams,
    /// Recalibration interval `T_idle` (mariner-paper.md §4, §7.3; 50 ms by default).
    pub t_idle_ns: u64,
    /// Relative spindle-speed deviation bound (assumed; docs/simulation.md).
    pub drift: f64,
}

#[derive(Debug, Clone)]
struct Head {
    /// Anchor of eq. (1): time and exact sector position (fractional) at that time.
    t0: f64,
    lba0: f64,
    /// True rotation period since the anchor.
    rot_true: f64,
    segment: u64,
    occupied: Vec<bool>,
    /// The head is settled on the current track and the disk free of housekeeping.
    ready_at: f64,
    /// Actual completion of the write in flight.
    busy_until: f64,
    rng: SplitMix64,
}

/// Counters of what the disks did beyond the policy's writes.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LogDiskStats {
    pub recalibrations: u64,
    /// Writes that waited more than half a rotation (the estimate was behind the head).
    pub missed_rotations: u64,
    pub writes: u64,
}

/// The array of log disks, as the policy's device model.
#[derive(Debug, Clone)]
pub struct LogDisks {
    cfg: LogDiskConfig,
    rot_ns: f64,
    spt: u64,
    segment_bytes: u64,
    heads: Vec<Head>,
    pub stats: LogDiskStats,
}

impl LogDisks {
    pub fn new(cfg: LogDiskConfig, devices: usize, rng: &SplitMix64) -> Self {
        let rot_ns = cfg.disk.rotation_ms * 1e6;
        let spt = u64::from(cfg.disk.outer_spt());
        let heads = (0..devices)
            .map(|i| {
                let mut rng = rng.fork(100 + i as u64);
                Head {
                    t0: 0.0,
                    lba0: rng.unit() * spt as f64,
                    rot_true: rot_ns,
                    segment: u64::MAX,
                    occupied: vec![false; spt as usize],
                    ready_at: 0.0,
                    busy_until: 0.0,
                    rng,
                }
            })
            .collect();
        Self {
            segment_bytes: spt * u64::from(cfg.disk.sector_bytes),
            cfg,
            rot_ns,
            spt,
            heads,
            stats: LogDiskStats::default(),
        }
    }

    /// Bytes in a segment (one outer-zone track).
    pub fn segment_bytes(&self) -> u64 {
        self.segment_bytes
    }

    /// When the write last dispatched on `dev` really completes.
    pub fn busy_until(&self, dev: usize) -> Nanos {
        self.heads
            .get(dev)
            .map_or(0, |h| h.busy_until.ceil() as Nanos)
    }

    fn tc_ns(&self) -> f64 {
        self.cfg.disk.controller_ms * 1e6
    }

    fn sector_ns(&self) -> f64 {
        self.rot_ns / self.spt as f64
    }

    fn true_pos(&self, h: &Head, t: f64) -> f64 {
        (h.lba0 + (t - h.t0) / h.rot_true * self.spt as f64).rem_euclid(self.spt as f64)
    }

    fn est_pos(&self, h: &Head, t: f64) -> f64 {
        (h.lba0 + (t - h.t0) / self.rot_ns * self.spt as f64).rem_euclid(self.spt as f64)
    }

    /// Re-anchors eq. (1) at `t` (a completion or a recalibration read).
    fn anchor(&mut self, dev: usize, t: f64) {
        let pos = self.true_pos(&self.heads[dev], t);
        let drift = self.cfg.drift;
        let h = &mut self.heads[dev];
        h.lba0 = pos;
        h.t0 = t;
        let eps = (2.0 * h.rng.unit() - 1.0) * drift;
        h.rot_true = self.rot_ns * (1.0 + eps);
    }

    /// Dummy reads an idle disk issued since its last anchor, every `T_idle`.
    fn recalibrate(&mut self, dev: usize, now: f64) {
        let t_idle = self.cfg.t_idle_ns as f64;
        if t_idle <= 0.0 {
            return;
        }
        let h = &self.heads[dev];
        let since = h.t0.max(h.busy_until).max(h.ready_at);
        if now - since < t_idle {
            return;
        }
        let k = ((now - since) / t_idle).floor();
        let read_at = since + k * t_idle;
        // A one-sector read aimed at the lookahead: the controller delay plus the lookahead.
        let dur = self.tc_ns() + f64::from(self.cfg.disk.lookahead_sectors) * self.sector_ns();
        self.stats.recalibrations += k as u64;
        self.heads[dev].ready_at = read_at + dur;
        self.anchor(dev, read_at + dur);
    }

    fn segment_of(&self, offset: u64) -> u64 {
        offset / self.segment_bytes
    }

    /// Cost of moving to the next track from `segment`: a command plus head switch or seek.
    fn switch_ns(&self, segment: u64) -> f64 {
        let heads = u64::from(self.cfg.disk.heads);
        let mv = if segment.wrapping_add(1).is_multiple_of(heads) {
            self.cfg.disk.seek.time_ms(1)
        } else {
            self.cfg.disk.head_switch_ms
        };
        self.tc_ns() + mv * 1e6
    }

    /// Sectors from `from` (inclusive) until `n` free sectors have passed under the head.
    fn span(occupied: &[bool], from: usize, n: u64) -> u64 {
        let spt = occupied.len();
        let (mut taken, mut span) = (0, 0);
        while taken < n && span < 2 * spt as u64 {
            if !occupied[(from + span as usize) % spt] {
                taken += 1;
            }
            span += 1;
        }
        span
    }
}

impl DeviceModel for LogDisks {
    fn completion_time(&self, dev: usize, offset: u64, bytes: u64, start: Nanos) -> Nanos {
        let Some(h) = self.heads.get(dev) else {
            return start;
        };
        let sectors = bytes.div_ceil(u64::from(self.cfg.disk.sector_bytes));
        let mut s = (start as f64).max(h.ready_at).max(h.busy_until);
        let seg = self.segment_of(offset);
        let empty;
        let occupied = if seg == h.segment {
            &h.occupied
        } else {
            s += self.switch_ns(h.segment);
            empty = vec![false; self.spt as usize];
            &empty
        };
        let target = (self.est_pos(h, s) + f64::from(self.cfg.disk.lookahead_sectors)).floor();
        let head_at_media = self.est_pos(h, s + self.tc_ns());
        let wait = (target - head_at_media).rem_euclid(self.spt as f64);
        let span = Self::span(occupied, target as usize % self.spt as usize, sectors);
        (s + self.tc_ns() + (wait + span as f64) * self.sector_ns()) as Nanos
    }

    fn on_dispatch(&mut self, dev: usize, offset: u64, bytes: u64, now: Nanos) {
        if dev >= self.heads.len() {
            return;
        }
        let now = now as f64;
        self.recalibrate(dev, now);
        let seg = self.segment_of(offset);
        if seg != self.heads[dev].segment {
            self.on_segment_switch(dev, seg * self.segment_bytes, now as Nanos);
        }
        let sectors = bytes.div_ceil(u64::from(self.cfg.disk.sector_bytes));
        let h = &self.heads[dev];
        let start = now.max(h.ready_at).max(h.busy_until);
        let target = (self.est_pos(h, start) + f64::from(self.cfg.disk.lookahead_sectors)).floor();
        let media = start + self.tc_ns();
        let spt = self.spt as f64;
        let wait = (target - self.true_pos(h, media)).rem_euclid(spt);
        let from = target as usize % self.spt as usize;
        let span = Self::span(&h.occupied, from, sectors);
        let sector_true = h.rot_true / spt;
        let end = media + (wait + span as f64) * sector_true;
        if wait > spt / 2.0 {
            self.stats.missed_rotations += 1;
        }
        self.stats.writes += 1;
        let h = &mut self.heads[dev];
        let mut left = sectors;
        for i in 0..span as usize {
            let slot = &mut h.occupied[(from + i) % self.spt as usize];
            if !*slot && left > 0 {
                *slot = true;
                left -= 1;
            }
        }
        h.busy_until = end;
    }

    fn on_complete(&mut self, dev: usize, now: Nanos) {
        if dev < self.heads.len() {
            self.anchor(dev, now as f64);
        }
    }

    fn on_segment_switch(&mut self, dev: usize, offset: u64, now: Nanos) {
        let seg = self.segment_of(offset);
        let Some(h) = self.heads.get(dev) else { return };
        if h.segment == seg {
            return;
        }
        let start = (now as f64).max(h.ready_at).max(h.busy_until);
        let cost = if h.segment == u64::MAX {
            0.0
        } else {
            self.switch_ns(h.segment)
        };
        let h = &mut self.heads[dev];
        h.segment = seg;
        h.occupied.iter_mut().for_each(|s| *s = false);
        h.ready_at = start + cost;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disks(drift: f64) -> LogDisks {
        let cfg = LogDiskConfig {
            disk: DiskParams::dtla_307030(),
            t_idle_ns: 50_000_000,
            drift,
        };
        LogDisks::new(cfg, 1, &SplitMix64::new(5))
    }

    #[test]
    fn a_write_at_the_head_costs_controller_lookahead_and_transfer() {
        let mut m = disks(0.0);
        m.on_segment_switch(0, 0, 0);
        m.on_dispatch(0, 0, 4096, 1_000_000);
        let d = DiskParams::dtla_307030();
        let sector_ms = d.rotation_ms / 600.0;
        // Aimed 22 sectors ahead; the head moves Tc meanwhile; then 8 sectors.
        let want = 1.0 + 22.0 * sector_ms + 8.0 * sector_ms;
        let got = m.busy_until(0) as f64 / 1e6;
        assert!((got - want).abs() <= sector_ms, "{got} vs {want}");
        assert_eq!(m.stats.missed_rotations, 0);
    }

    #[test]
    fn the_prediction_matches_the_truth_without_drift() {
        let mut m = disks(0.0);
        m.on_segment_switch(0, 0, 0);
        let mut now = 0;
        for i in 0..50u64 {
            now += 700_000 + i * 13_000;
            let predicted = m.completion_time(0, 0, 8192, now);
            m.on_dispatch(0, 0, 8192, now);
            assert!(predicted.abs_diff(m.busy_until(0)) <= 1, "write {i}");
            now = m.busy_until(0);
            m.on_complete(0, now);
        }
    }

    #[test]
    fn drift_without_recalibration_costs_rotations() {
        let run = |t_idle_ns: u64| {
            let mut m = disks(0.003);
            m.cfg.t_idle_ns = t_idle_ns;
            m.on_segment_switch(0, 0, 0);
            let mut now = 0;
            for _ in 0..200 {
                now += 400_000_000; // 400 ms apart
                m.on_dispatch(0, 0, 512, now);
                now = m.busy_until(0);
                m.on_complete(0, now);
                m.on_segment_switch(0, (m.heads[0].segment + 1) * m.segment_bytes, now);
            }
            m.stats.missed_rotations
        };
        assert!(run(20_000_000) < run(0), "recalibration must help");
    }
}
