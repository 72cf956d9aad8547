//! The fault simulation over a bounded number of seeds in CI (`FAULTSIM_SEEDS` to change it;
//! `mariner-faultsim --seeds N` soaks). A failure prints the seed, the last events and the
//! command that replays it.

#[test]
fn seeds_hold_every_invariant() {
    let seeds = std::env::var("FAULTSIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3_000u64);
    match mariner_faultsim::run_seeds(0, seeds) {
        Ok(s) => {
            eprintln!("{s}");
            assert_eq!(s.seeds, seeds);
            // The runs exercise what they claim to.
            assert!(s.crashes >= seeds, "{s}");
            assert!(s.acked > seeds * 20, "{s}");
            assert!(s.recovered_unacked > 0 && s.lost_unacked > 0, "{s}");
            assert!(s.faults > 0 && s.torn_tails > 0, "{s}");
            assert!(s.log_full > 0 && s.no_space > 0, "{s}");
        }
        Err(f) => panic!("{f}"),
    }
}
