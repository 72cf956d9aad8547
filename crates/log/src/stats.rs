//! Counters and histograms the log keeps for `/metrics`.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A histogram with power-of-two bucket bounds (1, 2, 4, … 2^(N-1)), lock-free.
#[derive(Debug)]
pub struct Histogram {
    buckets: [AtomicU64; Self::BUCKETS],
    sum: AtomicU64,
    count: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }
}

impl Histogram {
    pub const BUCKETS: usize = 32;

    pub fn record(&self, value: u64) {
        let idx = (64 - value.saturating_sub(1).leading_zeros()) as usize;
        self.buckets[idx.min(Self::BUCKETS - 1)].fetch_add(1, Relaxed);
        self.sum.fetch_add(value, Relaxed);
        self.count.fetch_add(1, Relaxed);
    }

    /// `(upper bound, cumulative count)` per bucket, then the sum and the count.
    pub fn snapshot(&self) -> (Vec<(u64, u64)>, u64, u64) {
        let mut cumulative = 0;
        let buckets = self
            .buckets
            .iter()
            .enumerate()
            .map(|(i, b)| {
                cumulative += b.load(Relaxed);
                (1u64 << i, cumulative)
            })
            .collect();
        (buckets, self.sum.load(Relaxed), self.count.load(Relaxed))
    }

    /// The smallest bucket bound at or above quantile `q` (0..=1), or 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        let (buckets, _, count) = self.snapshot();
        let want = (q * count as f64).ceil() as u64;
        buckets
            .iter()
            .find(|(_, c)| *c >= want.max(1))
            .map_or(0, |(bound, _)| *bound)
    }
}

/// What the log reports.
#[derive(Debug, Default)]
pub struct LogStats {
    /// Records made durable.
    pub records: AtomicU64,
    /// Physical writes (batches).
    pub batches: AtomicU64,
    /// Bytes written to log devices, padding included.
    pub bytes_written: AtomicU64,
    /// Records per batch.
    pub batch_records: Histogram,
    /// Microseconds from `append` to acknowledgement.
    pub ack_latency_us: Histogram,
    /// Microseconds a physical write (plus its sync) took.
    pub device_write_us: Histogram,
    /// Segments in use (not reusable) over all devices, and the total.
    pub segments_used: AtomicU64,
    pub segments_total: AtomicU64,
    /// Requests waiting for log space.
    pub stalled: AtomicU64,
    /// Highest sequence number made durable, and the release watermark.
    pub durable_seq: AtomicU64,
    pub released_seq: AtomicU64,
    /// Device writes in flight, for background writers that wait for a gap between them.
    pub busy: std::sync::Arc<crate::DeviceBusy>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_powers_of_two() {
        let h = Histogram::default();
        for v in [1, 2, 3, 4, 5, 1000] {
            h.record(v);
        }
        let (b, sum, count) = h.snapshot();
        assert_eq!((sum, count), (1015, 6));
        assert_eq!(b[0], (1, 1));
        assert_eq!(b[1], (2, 2));
        assert_eq!(b[2], (4, 4));
        assert_eq!(b[3], (8, 5));
        assert_eq!(b[10], (1024, 6));
        assert_eq!(h.quantile(0.5), 4);
    }
}
