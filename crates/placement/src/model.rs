//! Device models: how long a write takes where.

use crate::policy::Nanos;

/// Predicts write completion times. The policy asks it when choosing the next active device and
/// tells it about dispatches and completions so a stateful model (a rotational disk's head
/// position, mariner-paper.md eq. 1) can follow along.
pub trait DeviceModel {
    /// Predicted completion time of a write of `bytes` at byte `offset` on device `dev`,
    /// if the device starts it at `start`.
    fn completion_time(&self, dev: usize, offset: u64, bytes: u64, start: Nanos) -> Nanos;

    /// A write was handed to device `dev` at `now`.
    fn on_dispatch(&mut self, _dev: usize, _offset: u64, _bytes: u64, _now: Nanos) {}

    /// Device `dev` finished its write at `now`.
    fn on_complete(&mut self, _dev: usize, _now: Nanos) {}

    /// Device `dev` moved to a fresh segment starting at `offset` (a track switch).
    fn on_segment_switch(&mut self, _dev: usize, _offset: u64, _now: Nanos) {}
}

/// A fixed cost per write plus a transfer rate: what a flash device or a file with
/// `fdatasync` looks like from the outside. Fitted to the machine at start-up or configured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinearModel {
    pub per_write_ns: u64,
    pub bytes_per_sec: u64,
}

impl Default for LinearModel {
    fn default() -> Self {
        Self {
            per_write_ns: 500_000,
            bytes_per_sec: 500 << 20,
        }
    }
}

impl DeviceModel for LinearModel {
    fn completion_time(&self, _dev: usize, _offset: u64, bytes: u64, start: Nanos) -> Nanos {
        let rate = self.bytes_per_sec.max(1);
        let transfer = u128::from(bytes) * 1_000_000_000 / u128::from(rate);
        let transfer = u64::try_from(transfer).unwrap_or(u64::MAX);
        start
            .saturating_add(self.per_write_ns)
            .saturating_add(transfer)
    }
}
