//! The EW-Array's logical-to-physical map (ew-array-paper.txt §5.2): updates buffered in
//! NVRAM, appended to a map log region on disk when the NVRAM fills, and the map checkpointed
//! incrementally, one of `M` portions per flush, so the log region stays bounded and recovery
//! reads one region and replays the NVRAM.

/// Map-maintenance parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MapConfig {
    /// Logical blocks (4 KB).
    pub logical_blocks: u64,
    /// Replicas per block (each has a map entry).
    pub replicas: u64,
    /// Bytes per map entry (§5.2.1: four bytes per logical address per replica).
    pub entry_bytes: u64,
    /// Bytes per logged update (logical address and new physical address).
    pub update_bytes: u64,
    pub nvram_bytes: u64,
    /// Portions the map is divided into for incremental checkpoints.
    pub portions: u64,
    /// Sequential read bandwidth of the disk holding the map log region.
    pub read_mb_per_s: f64,
    /// Disks the map log region is spread over (read in parallel on recovery).
    pub disks: u64,
}

/// What a run of `updates` map changes cost.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MapResult {
    pub flushes: u64,
    pub checkpoint_bytes: u64,
    pub log_bytes: u64,
    /// Largest size the on-disk map log region reached.
    pub region_bytes_max: u64,
    pub recovery_s: f64,
}

impl MapConfig {
    pub fn map_bytes(&self) -> u64 {
        self.logical_blocks * self.replicas * self.entry_bytes
    }

    /// Replays `updates` map changes through NVRAM, flushes and incremental checkpoints.
    pub fn simulate(&self, updates: u64) -> MapResult {
        let per_flush = (self.nvram_bytes / self.update_bytes).max(1);
        let portion = self.map_bytes().div_ceil(self.portions.max(1));
        let mut out = MapResult::default();
        // Each log segment: one NVRAM flush followed by one portion checkpoint. Entries older
        // than the M-th newest checkpoint are free, so the live region is the last M segments.
        let mut live: std::collections::VecDeque<u64> = Default::default();
        for _ in 0..updates / per_flush {
            out.flushes += 1;
            out.log_bytes += self.nvram_bytes;
            out.checkpoint_bytes += portion;
            live.push_back(self.nvram_bytes + portion);
            if live.len() as u64 > self.portions {
                live.pop_front();
            }
            out.region_bytes_max = out.region_bytes_max.max(live.iter().sum());
        }
        let region = out.region_bytes_max.max(self.map_bytes());
        out.recovery_s = region as f64 / (self.read_mb_per_s * 1e6 * self.disks.max(1) as f64);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(portions: u64) -> MapConfig {
        MapConfig {
            logical_blocks: 1 << 20,
            replicas: 2,
            entry_bytes: 4,
            update_bytes: 8,
            nvram_bytes: 100 << 10,
            portions,
            read_mb_per_s: 20.0,
            disks: 1,
        }
    }

    #[test]
    fn the_log_region_is_bounded_by_the_checkpoints() {
        for m in [2, 4, 16] {
            let c = cfg(m);
            let short = c.simulate(1 << 20);
            let long = c.simulate(1 << 24);
            assert_eq!(short.region_bytes_max, long.region_bytes_max, "M = {m}");
            assert!(long.recovery_s > 0.0);
        }
    }

    #[test]
    fn spreading_the_region_speeds_recovery() {
        let one = cfg(4).simulate(1 << 22);
        let four = MapConfig { disks: 4, ..cfg(4) }.simulate(1 << 22);
        assert!((one.recovery_s / four.recovery_s - 4.0).abs() < 1e-9);
    }
}
