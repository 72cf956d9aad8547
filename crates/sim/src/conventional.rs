//! The conventional disk of trail-paper.md §3.1: requests served in arrival order, no buffering,
//! no scheduling; seek from the tracked head position, a uniformly distributed rotational
//! latency, then transfer (with head switches when a request crosses tracks).

use crate::disk::DiskParams;
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
    let mut out = ConventionalResult::default();
    let (mut head, mut free_at) = (0u32, 0.0_f64);
    for r in reqs {
        let start = free_at.max(r.arrival_ms);
        let (xfer, overhead, end_cyl) = access(disk, head, r, rng);
        free_at = start + xfer + overhead;
        head = end_cyl;
        let latency = free_at - r.arrival_ms;
        if r.write {
            out.write_bw.add(xfer, overhead);
            out.write_latency_ms.add(latency);
        } else {
            out.read_bw.add(xfer, overhead);
            out.read_latency_ms.add(latency);
        }
    }
    out
}
