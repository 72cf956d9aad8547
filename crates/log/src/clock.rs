//! Where the log and its consumers read the time: the system's clock in production, a virtual
//! one in the deterministic simulation (crates/faultsim), which moves it only when it decides
//! time passes. Nothing that makes a decision — the placement policy's `T_wait`, the record
//! timestamps, the store's write-back and sync timers — reads the time any other way.
//!
//! A virtual [`Instant`] is a fixed base plus the simulated offset, so every difference of two
//! instants is exactly the simulated interval between them.

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A source of monotonic time and of wall time (record timestamps).
pub trait Clock: Send + Sync + 'static {
    /// Monotonic time, for intervals and deadlines.
    fn now(&self) -> Instant;
    /// Nanoseconds since the Unix epoch, for record timestamps.
    fn wall_ns(&self) -> u64;
}

/// The system's clocks.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn wall_ns(&self) -> u64 {
        let ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        u64::try_from(ns).unwrap_or(u64::MAX)
    }
}

/// Simulated time: stands still until [`VirtualClock::advance`] moves it.
#[derive(Debug)]
pub struct VirtualClock {
    base: Instant,
    wall_base_ns: u64,
    offset_ns: AtomicU64,
}

impl VirtualClock {
    /// A clock at offset 0 whose wall time starts at `wall_base_ns`.
    pub fn new(wall_base_ns: u64) -> Self {
        Self {
            base: Instant::now(),
            wall_base_ns,
            offset_ns: AtomicU64::new(0),
        }
    }

    /// Nanoseconds simulated so far.
    pub fn elapsed_ns(&self) -> u64 {
        self.offset_ns.load(SeqCst)
    }

    /// Moves time forward by `ns`.
    pub fn advance(&self, ns: u64) {
        self.offset_ns.fetch_add(ns, SeqCst);
    }

    /// Moves time forward to `t` (never back).
    pub fn advance_to(&self, t: Instant) {
        let ns = u64::try_from(t.saturating_duration_since(self.base).as_nanos()).unwrap_or(0);
        self.offset_ns.fetch_max(ns, SeqCst);
    }
}

impl Clock for VirtualClock {
    fn now(&self) -> Instant {
        self.base + Duration::from_nanos(self.offset_ns.load(SeqCst))
    }

    fn wall_ns(&self) -> u64 {
        self.wall_base_ns
            .saturating_add(self.offset_ns.load(SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virtual_time_moves_only_when_told() {
        let c = VirtualClock::new(1_000);
        let t0 = c.now();
        assert_eq!(c.now(), t0);
        c.advance(250);
        assert_eq!(c.now() - t0, Duration::from_nanos(250));
        assert_eq!(c.wall_ns(), 1_250);
        c.advance_to(t0); // never back
        assert_eq!(c.elapsed_ns(), 250);
        c.advance_to(t0 + Duration::from_micros(1));
        assert_eq!(c.elapsed_ns(), 1_000);
    }
}
