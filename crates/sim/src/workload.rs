//! Synthetic workloads (trail-paper.md §3.1) and trace files.
//!
//! Trace text format (one request per line, `#` starts a comment, fields separated by
//! whitespace):
//!
//! ```text
//! # arrival_ms  op  lba        bytes
//! 0.000         W   1234567    4096
//! 0.125         R   88         8192
//! ```
//!
//! `arrival_ms` is a decimal number of milliseconds from the start, non-decreasing; `op` is `R`
//! or `W`; `lba` counts 512-byte sectors; `bytes` is the request length. The SPC block-trace
//! format (`ASU,LBA,Size,Opcode,Timestamp`, timestamp in seconds, opcode `r`/`w`) is also read.

use crate::disk::DiskParams;
use crate::driver::{Driven, Model, Source};
use crate::rng::SplitMix64;

/// One block request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Request {
    pub arrival_ms: f64,
    pub write: bool,
    pub lba: u64,
    pub bytes: u64,
}

/// How requests are spaced in time; [`crate::driver::drive`] runs any of them against any model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arrivals {
    /// Exponential inter-arrival times with this mean (trail-paper.md §3.1).
    Exponential { mean_ms: f64 },
    /// A fixed interval (mariner-paper.md §7.2–7.3).
    Fixed { interval_ms: f64 },
    /// Iometer-style closed loop (ew-array-paper.txt §3.4): `depth` requests outstanding at all
    /// times, a new one as soon as one completes. Arrival times follow from completions, so
    /// only the driver can assign them.
    Closed { depth: usize },
}

impl Arrivals {
    /// The gap before the next request of an open loop (0 for a closed loop).
    pub fn gap_ms(&self, rng: &mut SplitMix64) -> f64 {
        match *self {
            Arrivals::Exponential { mean_ms } => rng.exponential(mean_ms),
            Arrivals::Fixed { interval_ms } => interval_ms,
            Arrivals::Closed { .. } => 0.0,
        }
    }
}

/// The trail-paper.md §3.1 generator's parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Synthetic {
    /// Reads per write (the paper's read/write ratio, 4 by default). 0 gives writes only.
    pub reads_per_write: f64,
    pub min_bytes: u64,
    pub max_bytes: u64,
    pub arrivals: Arrivals,
    /// Locality characteristic `l >= 1`: a request's start cylinder is uniform within
    /// `cylinders / l` cylinders centred on the previous one (wrapping); 1 is no locality.
    /// The seed does not define the parameter beyond "1 = no locality"; this is our reading.
    pub locality: f64,
    pub count: usize,
}

impl Synthetic {
    /// Generates the requests for `disk`. Sizes are uniform in whole sectors. A closed loop's
    /// requests all carry arrival time 0: drive them with [`Synthetic::drive`] instead.
    pub fn generate(&self, disk: &DiskParams, rng: &mut SplitMix64) -> Vec<Request> {
        let mut src = SyntheticSource::new(self, disk, rng);
        let mut t = 0.0;
        (0..self.count)
            .map(|i| {
                t = match self.arrivals {
                    Arrivals::Fixed { interval_ms } => i as f64 * interval_ms,
                    a if i > 0 => t + a.gap_ms(rng),
                    _ => 0.0,
                };
                Request {
                    arrival_ms: t,
                    ..src.draw(rng)
                }
            })
            .collect()
    }

    /// Drives `model` with this workload (open or closed loop, as `arrivals` says).
    pub fn drive<M: Model>(
        &self,
        model: &mut M,
        disk: &DiskParams,
        rng: &mut SplitMix64,
    ) -> Driven {
        let mut src = SyntheticSource::new(self, disk, rng);
        crate::driver::drive(model, &mut src, self.arrivals, self.count, rng)
    }
}

/// The content of [`Synthetic`]'s requests (operation, size, locality), one at a time.
#[derive(Debug, Clone)]
pub struct SyntheticSource<'a> {
    disk: &'a DiskParams,
    read_p: f64,
    sectors: (u64, u64),
    window: u64,
    cyl: u64,
}

impl<'a> SyntheticSource<'a> {
    /// Draws the first cylinder.
    pub fn new(spec: &Synthetic, disk: &'a DiskParams, rng: &mut SplitMix64) -> Self {
        let sector = u64::from(disk.sector_bytes);
        let (lo, hi) = (
            spec.min_bytes.div_ceil(sector),
            spec.max_bytes.div_ceil(sector),
        );
        let cylinders = disk.cylinders();
        Self {
            disk,
            read_p: spec.reads_per_write / (1.0 + spec.reads_per_write),
            sectors: (lo.max(1), hi.max(lo).max(1)),
            window: (f64::from(cylinders) / spec.locality.max(1.0)).max(1.0) as u64,
            cyl: rng.range(0, u64::from(cylinders) - 1),
        }
    }
}

impl Source for SyntheticSource<'_> {
    fn draw(&mut self, rng: &mut SplitMix64) -> Request {
        let write = rng.unit() >= self.read_p;
        let cylinders = u64::from(self.disk.cylinders());
        self.cyl = next_cylinder(self.cyl, self.window, cylinders, rng);
        let sectors = rng.range(self.sectors.0, self.sectors.1);
        Request {
            arrival_ms: 0.0,
            write,
            lba: random_lba_in_cylinder(self.disk, self.cyl as u32, rng),
            bytes: sectors * u64::from(self.disk.sector_bytes),
        }
    }
}

/// Iometer's random 4 KB workload over a range of blocks (ew-array-paper.txt §3.4, §6.1): each
/// request reads with probability `read_fraction`, at a block uniform in `0..blocks`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UniformBlocks {
    pub blocks: u64,
    pub read_fraction: f64,
}

/// Sectors per block of [`UniformBlocks`].
pub const BLOCK_SECTORS: u64 = 8;

impl Source for UniformBlocks {
    fn draw(&mut self, rng: &mut SplitMix64) -> Request {
        let write = rng.unit() >= self.read_fraction;
        Request {
            arrival_ms: 0.0,
            write,
            lba: rng.range(0, self.blocks.max(1) - 1) * BLOCK_SECTORS,
            bytes: BLOCK_SECTORS * 512,
        }
    }
}

/// Writes of a fixed size and no address (mariner-paper.md §7.2–7.3: a log appends wherever
/// its head is). Draws no randomness.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FixedWrites {
    pub bytes: u64,
}

impl Source for FixedWrites {
    fn draw(&mut self, _: &mut SplitMix64) -> Request {
        Request {
            arrival_ms: 0.0,
            write: true,
            lba: 0,
            bytes: self.bytes,
        }
    }
}

fn next_cylinder(prev: u64, window: u64, cylinders: u64, rng: &mut SplitMix64) -> u64 {
    if window >= cylinders {
        return rng.range(0, cylinders - 1);
    }
    let offset = rng.range(0, window - 1);
    (prev + cylinders + offset - window / 2) % cylinders
}

fn random_lba_in_cylinder(disk: &DiskParams, cyl: u32, rng: &mut SplitMix64) -> u64 {
    let mut base = 0u64;
    let mut first = 0u32;
    for z in &disk.zones {
        let per_cyl = u64::from(disk.heads) * u64::from(z.sectors_per_track);
        if cyl < first + z.cylinders {
            return base + u64::from(cyl - first) * per_cyl + rng.range(0, per_cyl - 1);
        }
        base += per_cyl * u64::from(z.cylinders);
        first += z.cylinders;
    }
    0
}

/// A trace line that could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceError {
    pub line: usize,
    pub reason: String,
}

impl std::fmt::Display for TraceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "trace line {}: {}", self.line, self.reason)
    }
}

impl std::error::Error for TraceError {}

/// Writes requests in the text trace format.
pub fn write_trace(reqs: &[Request]) -> String {
    let mut s = String::from("# arrival_ms op lba bytes\n");
    for r in reqs {
        let op = if r.write { 'W' } else { 'R' };
        s.push_str(&format!("{:.6} {op} {} {}\n", r.arrival_ms, r.lba, r.bytes));
    }
    s
}

/// Which trace format a file is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceFormat {
    /// `arrival_ms R|W lba bytes` (the module documentation).
    Text,
    /// SPC `ASU,LBA,Size,Opcode,Timestamp`.
    Spc,
}

impl std::str::FromStr for TraceFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "text" => Ok(Self::Text),
            "spc" => Ok(Self::Spc),
            _ => Err(format!("unknown trace format {s:?} (text or spc)")),
        }
    }
}

/// Reads a trace in `format`; `None` detects it line by line (commas mean SPC).
pub fn parse_trace_as(text: &str, format: Option<TraceFormat>) -> Result<Vec<Request>, TraceError> {
    let Some(format) = format else {
        return parse_trace(text);
    };
    let reqs = parse_trace(text)?;
    // parse_trace accepts both; a forced format rejects the first line of the other one.
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if !line.is_empty() && line.contains(',') != (format == TraceFormat::Spc) {
            return Err(TraceError {
                line: i + 1,
                reason: format!("not a {format:?} trace line"),
            });
        }
    }
    Ok(reqs)
}

/// Reads the text trace format or, if the first data line has commas, SPC.
pub fn parse_trace(text: &str) -> Result<Vec<Request>, TraceError> {
    let mut out = Vec::new();
    let mut last = 0.0_f64;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let err = |reason: &str| TraceError {
            line: i + 1,
            reason: reason.to_string(),
        };
        let req = if line.contains(',') {
            parse_spc(line).ok_or_else(|| err("expected ASU,LBA,Size,Opcode,Timestamp"))?
        } else {
            parse_text(line).ok_or_else(|| err("expected arrival_ms R|W lba bytes"))?
        };
        if req.arrival_ms < last || !req.arrival_ms.is_finite() {
            return Err(err("arrival times must be finite and non-decreasing"));
        }
        if req.bytes == 0 {
            return Err(err("zero-length request"));
        }
        last = req.arrival_ms;
        out.push(req);
    }
    Ok(out)
}

fn parse_text(line: &str) -> Option<Request> {
    let mut f = line.split_whitespace();
    let arrival_ms = f.next()?.parse().ok()?;
    let write = match f.next()? {
        "W" | "w" => true,
        "R" | "r" => false,
        _ => return None,
    };
    let lba = f.next()?.parse().ok()?;
    let bytes = f.next()?.parse().ok()?;
    f.next().is_none().then_some(Request {
        arrival_ms,
        write,
        lba,
        bytes,
    })
}

fn parse_spc(line: &str) -> Option<Request> {
    let f: Vec<&str> = line.split(',').map(str::trim).collect();
    if f.len() < 5 {
        return None;
    }
    let _asu: u64 = f[0].parse().ok()?;
    let write = match f[3] {
        "w" | "W" => true,
        "r" | "R" => false,
        _ => return None,
    };
    let secs: f64 = f[4].parse().ok()?;
    Some(Request {
        arrival_ms: secs * 1000.0,
        write,
        lba: f[1].parse().ok()?,
        bytes: f[2].parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> Synthetic {
        Synthetic {
            reads_per_write: 4.0,
            min_bytes: 1024,
            max_bytes: 10 * 1024,
            arrivals: Arrivals::Exponential { mean_ms: 10.0 },
            locality: 1.0,
            count: 20_000,
        }
    }

    #[test]
    fn generator_honours_its_parameters() {
        let d = DiskParams::trail_table1();
        let reqs = spec().generate(&d, &mut SplitMix64::new(1));
        let writes = reqs.iter().filter(|r| r.write).count() as f64 / reqs.len() as f64;
        assert!((writes - 0.2).abs() < 0.02, "{writes}");
        assert!(reqs.iter().all(|r| (1024..=10 * 1024).contains(&r.bytes)));
        assert!(reqs.iter().all(|r| r.lba < d.total_sectors()));
        let mean_gap = reqs.last().map_or(0.0, |r| r.arrival_ms) / (reqs.len() - 1) as f64;
        assert!((mean_gap - 10.0).abs() < 0.5, "{mean_gap}");
    }

    #[test]
    fn locality_clusters_start_cylinders() {
        let d = DiskParams::trail_table1();
        let spread = |l: f64| {
            let reqs = Synthetic {
                locality: l,
                ..spec()
            }
            .generate(&d, &mut SplitMix64::new(2));
            let cyl: Vec<i64> = reqs
                .iter()
                .map(|r| i64::from(d.chs(r.lba).cylinder))
                .collect();
            cyl.windows(2).map(|w| (w[1] - w[0]).abs()).sum::<i64>() / cyl.len() as i64
        };
        assert!(spread(10.0) * 3 < spread(1.0));
    }

    #[test]
    fn text_trace_round_trips() {
        let d = DiskParams::trail_table1();
        let reqs = Synthetic {
            count: 50,
            ..spec()
        }
        .generate(&d, &mut SplitMix64::new(3));
        let back = parse_trace(&write_trace(&reqs)).unwrap_or_default();
        assert_eq!(back.len(), reqs.len());
        for (a, b) in reqs.iter().zip(&back) {
            assert_eq!((a.write, a.lba, a.bytes), (b.write, b.lba, b.bytes));
            assert!((a.arrival_ms - b.arrival_ms).abs() < 1e-5);
        }
    }

    #[test]
    fn spc_lines_are_read_and_bad_lines_rejected() {
        let t = parse_trace("0,20941264,8192,W,0.551706\n1,20939840,4096,r,0.554041\n");
        let t = t.unwrap_or_default();
        assert_eq!(t.len(), 2);
        assert!(t[0].write && !t[1].write);
        assert!((t[0].arrival_ms - 551.706).abs() < 1e-6);
        assert_eq!(parse_trace("1.0 X 5 512").map_err(|e| e.line), Err(1));
        assert!(parse_trace("2.0 W 5 512\n1.0 W 5 512").is_err());
    }

    #[test]
    fn a_forced_format_rejects_the_other_one() {
        let spc = "0,20941264,8192,W,0.551706\n";
        assert_eq!(
            parse_trace_as(spc, Some(TraceFormat::Spc)).map(|t| t.len()),
            Ok(1)
        );
        assert_eq!(
            parse_trace_as(spc, Some(TraceFormat::Text)).map_err(|e| e.line),
            Err(1)
        );
        assert!(parse_trace_as("1.0 W 5 512", Some(TraceFormat::Spc)).is_err());
        assert_eq!("spc".parse(), Ok(TraceFormat::Spc));
    }
}
