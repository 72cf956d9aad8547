//! The rotational disk: geometry with zones, a seek curve, rotation, head switch, controller
//! overhead and transfer. One [`DiskParams`] per disk model, shared by every experiment.
//!
//! Times are `f64` milliseconds here; the Mariner log-disk model converts to the policy's
//! nanoseconds at its boundary.

/// A band of cylinders with the same number of sectors per track (zoned bit recording).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Zone {
    pub cylinders: u32,
    pub sectors_per_track: u32,
}

/// How seek time grows with distance: `0` for distance 0, else
/// `track_to_track + (full_stroke - track_to_track) * ((d - 1) / (D - 1))^exponent`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SeekCurve {
    pub track_to_track_ms: f64,
    pub full_stroke_ms: f64,
    pub exponent: f64,
    max_distance: u32,
}

impl SeekCurve {
    /// A curve through the track-to-track and full-stroke times with the given shape.
    pub fn with_exponent(t2t_ms: f64, full_ms: f64, exponent: f64, cylinders: u32) -> Self {
        Self {
            track_to_track_ms: t2t_ms,
            full_stroke_ms: full_ms,
            exponent,
            max_distance: cylinders.saturating_sub(1).max(1),
        }
    }

    /// The curve through track-to-track and full stroke whose mean over uniformly random
    /// start and end cylinders (distance > 0, the datasheet's weighted average) is `avg_ms`.
    pub fn fitted(t2t_ms: f64, avg_ms: f64, full_ms: f64, cylinders: u32) -> Self {
        let (mut lo, mut hi) = (0.05_f64, 4.0_f64);
        for _ in 0..60 {
            let mid = 0.5 * (lo + hi);
            let mean = Self::with_exponent(t2t_ms, full_ms, mid, cylinders).mean_ms();
            // A larger exponent makes the curve more convex and the mean smaller.
            if mean > avg_ms {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Self::with_exponent(t2t_ms, full_ms, 0.5 * (lo + hi), cylinders)
    }

    pub fn time_ms(&self, distance: u32) -> f64 {
        if distance == 0 {
            return 0.0;
        }
        let span = f64::from(self.max_distance.saturating_sub(1).max(1));
        let x = (f64::from(distance.min(self.max_distance) - 1) / span).clamp(0.0, 1.0);
        self.track_to_track_ms
            + (self.full_stroke_ms - self.track_to_track_ms) * x.powf(self.exponent)
    }

    /// Mean seek over independent uniform start and end cylinders, distance > 0.
    pub fn mean_ms(&self) -> f64 {
        let n = f64::from(self.max_distance + 1);
        let (mut sum, mut weight) = (0.0, 0.0);
        for d in 1..=self.max_distance {
            let w = n - f64::from(d);
            sum += w * self.time_ms(d);
            weight += w;
        }
        sum / weight
    }
}

/// One disk model's parameters. `source` says where each number comes from.
#[derive(Debug, Clone, PartialEq)]
pub struct DiskParams {
    pub name: &'static str,
    pub source: &'static str,
    pub rotation_ms: f64,
    pub heads: u32,
    /// Outermost zone first.
    pub zones: Vec<Zone>,
    pub seek: SeekCurve,
    pub head_switch_ms: f64,
    /// Fixed command processing time per request.
    pub controller_ms: f64,
    /// Sectors added to the estimated head position (mariner-paper.md eq. 1).
    pub lookahead_sectors: u32,
    pub sector_bytes: u32,
}

/// A physical position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chs {
    pub cylinder: u32,
    pub head: u32,
    pub sector: u32,
    pub sectors_per_track: u32,
}

impl DiskParams {
    /// trail-paper.md Table I. The seed gives no average seek; a linear curve between
    /// track-to-track and maximum seek is assumed (it reproduces Table II's conventional
    /// efficiencies; see docs/simulation.md). No controller overhead is modelled in the paper.
    pub fn trail_table1() -> Self {
        let cylinders = 500;
        Self {
            name: "trail-table1",
            source: "trail-paper.md Table I; linear seek curve assumed",
            rotation_ms: 16.7,
            heads: 4,
            zones: vec![Zone {
                cylinders,
                sectors_per_track: 50, // 25 KB track of 512-byte sectors
            }],
            seek: SeekCurve::with_exponent(2.0, 29.4, 1.0, cylinders),
            head_switch_ms: 1.0,
            controller_ms: 0.0,
            lookahead_sectors: 0,
            sector_bytes: 512,
        }
    }

    /// IBM Deskstar 75GXP DTLA-307030 (mariner-paper.md §7.1). Full stroke 14.7 ms and head
    /// switch 1.2 ms: IBM Deskstar 40GV & 75GXP specification §4.4.2 (manualowl.com, DTLA-307075
    /// manual p. 25). 7200 rpm and 8.5 ms average seek: same specification family. Controller
    /// delay 0.104 ms: lu-dissertation.txt §4.6.2. Lookahead 22: mariner-paper.md §4.
    /// Assumed: track-to-track 1.2 ms, 4 heads, ten zones of 3,200 cylinders from 600 to
    /// 330 sectors per track (about 30.5 GB).
    pub fn dtla_307030() -> Self {
        let zones = linear_zones(10, 3_200, 600, 330);
        let cylinders = zones.iter().map(|z| z.cylinders).sum();
        Self {
            name: "dtla-307030",
            source: "IBM 75GXP spec (full stroke, head switch, rpm, avg seek); lu §4.6.2 (Tc); \
                     zones, heads and track-to-track assumed",
            rotation_ms: 60_000.0 / 7200.0,
            heads: 4,
            zones,
            seek: SeekCurve::fitted(1.2, 8.5, 14.7, cylinders),
            head_switch_ms: 1.2,
            controller_ms: 0.104,
            lookahead_sectors: 22,
            sector_bytes: 512,
        }
    }

    /// Seagate ST39133LWV (ew-array-paper.txt Table 1: 10,000 rpm, 5.2 ms average read seek).
    /// Assumed: track-to-track 0.6 ms, full stroke 12 ms, head switch 0.6 ms, controller 0.1 ms,
    /// 6 heads, ten zones of 980 cylinders from 360 to 245 sectors per track (about 9.1 GB).
    pub fn st39133lwv() -> Self {
        let zones = linear_zones(10, 980, 360, 245);
        let cylinders = zones.iter().map(|z| z.cylinders).sum();
        Self {
            name: "st39133lwv",
            source: "ew-array-paper.txt Table 1 (rpm, avg seek); geometry and other times assumed",
            rotation_ms: 6.0,
            heads: 6,
            zones,
            seek: SeekCurve::fitted(0.6, 5.2, 12.0, cylinders),
            head_switch_ms: 0.6,
            controller_ms: 0.1,
            lookahead_sectors: 20,
            sector_bytes: 512,
        }
    }

    pub fn all() -> Vec<Self> {
        vec![
            Self::trail_table1(),
            Self::dtla_307030(),
            Self::st39133lwv(),
        ]
    }

    pub fn by_name(name: &str) -> Option<Self> {
        Self::all().into_iter().find(|d| d.name == name)
    }

    pub fn cylinders(&self) -> u32 {
        self.zones.iter().map(|z| z.cylinders).sum()
    }

    pub fn total_sectors(&self) -> u64 {
        self.zones
            .iter()
            .map(|z| {
                u64::from(z.cylinders) * u64::from(self.heads) * u64::from(z.sectors_per_track)
            })
            .sum()
    }

    pub fn capacity_bytes(&self) -> u64 {
        self.total_sectors() * u64::from(self.sector_bytes)
    }

    /// Sectors per track of the outermost zone (where logs live).
    pub fn outer_spt(&self) -> u32 {
        self.zones.first().map_or(1, |z| z.sectors_per_track)
    }

    /// Cylinder, head and sector of `lba` (clamped to the last sector).
    pub fn chs(&self, lba: u64) -> Chs {
        let mut lba = lba.min(self.total_sectors().saturating_sub(1));
        let mut first_cyl = 0;
        for z in &self.zones {
            let per_cyl = u64::from(self.heads) * u64::from(z.sectors_per_track);
            let zone_sectors = per_cyl * u64::from(z.cylinders);
            if lba < zone_sectors {
                let spt = u64::from(z.sectors_per_track);
                return Chs {
                    cylinder: first_cyl + (lba / per_cyl) as u32,
                    head: ((lba % per_cyl) / spt) as u32,
                    sector: (lba % spt) as u32,
                    sectors_per_track: z.sectors_per_track,
                };
            }
            lba -= zone_sectors;
            first_cyl += z.cylinders;
        }
        Chs {
            cylinder: 0,
            head: 0,
            sector: 0,
            sectors_per_track: self.outer_spt(),
        }
    }

    /// Media time of `sectors` on a track of `spt` sectors.
    pub fn transfer_ms(&self, sectors: u64, spt: u32) -> f64 {
        self.rotation_ms * sectors as f64 / f64::from(spt.max(1))
    }

    /// Transfer of a request starting at `at` of `sectors`, including the head switches
    /// (or track-to-track seeks at a cylinder boundary) of crossing tracks.
    pub fn transfer_with_switches_ms(&self, at: Chs, sectors: u64) -> (f64, f64) {
        let spt = u64::from(at.sectors_per_track.max(1));
        let first = sectors.min(spt - u64::from(at.sector));
        let mut switches = 0.0;
        let mut left = sectors - first;
        let (mut head, mut crossings) = (at.head, 0);
        while left > 0 {
            head += 1;
            crossings += 1;
            if head == self.heads {
                head = 0;
                switches += self.seek.time_ms(1).max(self.head_switch_ms);
            } else {
                switches += self.head_switch_ms;
            }
            left -= left.min(spt);
            if crossings > 1_000_000 {
                break;
            }
        }
        (self.transfer_ms(sectors, at.sectors_per_track), switches)
    }
}

/// `count` zones of `cylinders` each, sectors per track falling linearly from `outer` to `inner`.
fn linear_zones(count: u32, cylinders: u32, outer: u32, inner: u32) -> Vec<Zone> {
    (0..count)
        .map(|i| {
            let step = f64::from(outer - inner) * f64::from(i) / f64::from((count - 1).max(1));
            Zone {
                cylinders,
                sectors_per_track: outer - step.round() as u32,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fitted_curves_hit_their_three_points() {
        for d in [DiskParams::dtla_307030(), DiskParams::st39133lwv()] {
            let c = d.cylinders();
            assert!((d.seek.time_ms(1) - d.seek.track_to_track_ms).abs() < 1e-9);
            assert!((d.seek.time_ms(c - 1) - d.seek.full_stroke_ms).abs() < 1e-9);
        }
        assert!((DiskParams::dtla_307030().seek.mean_ms() - 8.5).abs() < 0.01);
        assert!((DiskParams::st39133lwv().seek.mean_ms() - 5.2).abs() < 0.01);
    }

    #[test]
    fn seek_is_monotone() {
        let d = DiskParams::dtla_307030();
        let mut last = 0.0;
        for dist in (0..d.cylinders()).step_by(97) {
            let t = d.seek.time_ms(dist);
            assert!(t >= last);
            last = t;
        }
    }

    #[test]
    fn capacities_match_the_models() {
        let gb = |d: &DiskParams| d.capacity_bytes() as f64 / 1e9;
        assert!((gb(&DiskParams::dtla_307030()) - 30.7).abs() < 1.5);
        assert!((gb(&DiskParams::st39133lwv()) - 9.1).abs() < 0.5);
        // Table I: 500 cylinders x 4 tracks x 25 KB = 50 MB (the paper's "40-MB drive" class).
        assert_eq!(
            DiskParams::trail_table1().capacity_bytes(),
            500 * 4 * 25 * 1024
        );
    }

    #[test]
    fn chs_walks_zones() {
        let d = DiskParams::dtla_307030();
        let first = d.chs(0);
        assert_eq!((first.cylinder, first.head, first.sector), (0, 0, 0));
        let per_zone = 3_200 * 4 * 600;
        let z1 = d.chs(per_zone);
        assert_eq!(
            (z1.cylinder, z1.sectors_per_track),
            (3_200, d.zones[1].sectors_per_track)
        );
        let t = d.chs(600 * 5 + 7);
        assert_eq!((t.cylinder, t.head, t.sector), (1, 1, 7));
    }

    #[test]
    fn crossing_a_track_costs_a_head_switch() {
        let d = DiskParams::trail_table1();
        let (xfer, sw) = d.transfer_with_switches_ms(d.chs(45), 10);
        assert!((xfer - 16.7 * 10.0 / 50.0).abs() < 1e-9);
        assert!((sw - 1.0).abs() < 1e-9);
    }
}
