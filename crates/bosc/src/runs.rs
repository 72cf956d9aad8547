//! Choosing commit runs (lu-dissertation §3.2.2). Pure.
//!
//! A run is a range of contiguous blocks, at most `max_run` long, whose first and last blocks
//! have pending updates and in which the share of blocks with pending updates is strictly above
//! `min_pending_ratio` (0.5 in the seed). Runs are built greedily in block order from the sweep
//! cursor, so they are disjoint and the sweep moves sequentially over the disk.

/// A run: `start..start+len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub start: u64,
    pub len: u64,
}

/// Splits the sorted, deduplicated `pending` block numbers into runs.
pub fn plan_runs(pending: &[u64], max_run: u64, min_pending_ratio: f64) -> Vec<Run> {
    let mut runs = Vec::new();
    let mut i = 0;
    while i < pending.len() {
        let start = pending[i];
        let mut end = i; // index of the last pending block in the run
        while end + 1 < pending.len() {
            let next = pending[end + 1];
            let len = next - start + 1;
            let count = (end + 2 - i) as f64;
            if len > max_run || count / len as f64 <= min_pending_ratio {
                break;
            }
            end += 1;
        }
        runs.push(Run {
            start,
            len: pending[end] - start + 1,
        });
        i = end + 1;
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(pending: &[u64], runs: &[Run], max_run: u64) {
        let mut covered = 0;
        let mut last_end = 0;
        for r in runs {
            assert!(r.len >= 1 && r.len <= max_run);
            assert!(r.start >= last_end, "disjoint and ordered");
            last_end = r.start + r.len;
            let inside: Vec<_> = pending
                .iter()
                .filter(|&&b| b >= r.start && b < r.start + r.len)
                .collect();
            assert_eq!(*inside[0], r.start, "first block pending");
            assert_eq!(
                **inside.last().unwrap(),
                r.start + r.len - 1,
                "last pending"
            );
            assert!(inside.len() as f64 / r.len as f64 > 0.5);
            covered += inside.len();
        }
        assert_eq!(covered, pending.len(), "every pending block in one run");
    }

    #[test]
    fn dense_sparse_and_capped() {
        let p = [0, 1, 3, 4, 10, 20, 21, 22];
        let runs = plan_runs(&p, 32, 0.5);
        check(&p, &runs, 32);
        assert_eq!(runs[0], Run { start: 0, len: 5 });
        assert_eq!(runs[1], Run { start: 10, len: 1 });
        let all: Vec<u64> = (0..100).collect();
        let runs = plan_runs(&all, 32, 0.5);
        check(&all, &runs, 32);
        assert_eq!(runs.len(), 4);
        // Exactly half pending is not enough.
        assert_eq!(plan_runs(&[0, 3], 32, 0.5).len(), 2);
    }

    #[test]
    fn random_plans_hold_the_invariants() {
        let mut x = 12345u64;
        for _ in 0..200 {
            let mut p = Vec::new();
            let mut b = 0;
            for _ in 0..50 {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                b += 1 + (x >> 60);
                p.push(b);
            }
            let max = 1 + (x >> 59) % 32;
            check(&p, &plan_runs(&p, max, 0.5), max);
        }
    }
}
