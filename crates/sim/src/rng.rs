//! A small deterministic PRNG (SplitMix64). Every random choice in the simulator comes from one
//! of these, seeded from the experiment's seed, so a seed reproduces a run bit for bit.

/// SplitMix64 (Steele, Lea, Flood 2014): one `u64` of state, passes BigCrush, trivially seedable.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// A generator for a sub-stream (a device, a workload), independent of the parent's draws.
    pub fn fork(&self, stream: u64) -> Self {
        let mut g = Self::new(self.state ^ stream.wrapping_mul(0xA076_1D64_78BD_642F));
        g.next_u64();
        g
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform integer in [lo, hi] (inclusive).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        let span = hi - lo + 1;
        lo + ((u128::from(self.next_u64()) * u128::from(span)) >> 64) as u64
    }

    /// Exponentially distributed with the given mean.
    pub fn exponential(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream() {
        let mut a = SplitMix64::new(7);
        let mut b = SplitMix64::new(7);
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
    }

    #[test]
    fn range_and_unit_stay_in_bounds() {
        let mut g = SplitMix64::new(1);
        for _ in 0..10_000 {
            let u = g.unit();
            assert!((0.0..1.0).contains(&u));
            assert!((3..=9).contains(&g.range(3, 9)));
        }
    }

    #[test]
    fn exponential_has_its_mean() {
        let mut g = SplitMix64::new(3);
        let n = 200_000;
        let mean = (0..n).map(|_| g.exponential(5.0)).sum::<f64>() / f64::from(n);
        assert!((mean - 5.0).abs() < 0.1, "{mean}");
    }
}
