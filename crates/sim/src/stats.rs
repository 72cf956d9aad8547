//! Counters the experiments report.

/// Time a disk spent transferring against time it spent seeking, rotating or transferring
/// (trail-paper.md §3.1's bandwidth efficiency; idle time is excluded).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Busy {
    pub transfer_ms: f64,
    pub busy_ms: f64,
}

impl Busy {
    pub fn add(&mut self, transfer_ms: f64, overhead_ms: f64) {
        self.transfer_ms += transfer_ms;
        self.busy_ms += transfer_ms + overhead_ms;
    }

    pub fn merge(&mut self, o: Busy) {
        self.transfer_ms += o.transfer_ms;
        self.busy_ms += o.busy_ms;
    }

    /// Transfer over busy time, in [0, 1]; 0 for an unused disk.
    pub fn efficiency(&self) -> f64 {
        if self.busy_ms > 0.0 {
            self.transfer_ms / self.busy_ms
        } else {
            0.0
        }
    }
}

/// A running mean.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Mean {
    pub sum: f64,
    pub count: u64,
}

impl Mean {
    pub fn add(&mut self, x: f64) {
        self.sum += x;
        self.count += 1;
    }

    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum / self.count as f64
        }
    }
}
