//! `mariner-faultsim`: runs the deterministic fault simulation over many seeds (a soak), or
//! replays one seed with every event printed.

use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;

/// Deterministic simulation of Mariner's log, store and disks under crashes, torn and lost
/// writes, reordered completions, I/O errors, full disks and a full log, in virtual time.
/// Every seed is a different run; the same seed replays the same run.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Run only this seed (with --verbose, print every event).
    #[arg(long, conflicts_with_all = ["first", "seeds"])]
    seed: Option<u64>,
    /// First seed of the soak.
    #[arg(long, default_value_t = 0)]
    first: u64,
    /// Seeds to run.
    #[arg(long, default_value_t = 10_000)]
    seeds: u64,
    /// Worker threads (each runs its own seeds; runs stay deterministic per seed).
    #[arg(long, default_value_t = 1)]
    jobs: u64,
    /// Print every event of the run (with --seed).
    #[arg(long)]
    verbose: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(seed) = args.seed {
        return match mariner_faultsim::run_seed(seed, args.verbose) {
            Ok(s) => {
                println!("ok: {s}");
                ExitCode::SUCCESS
            }
            Err(f) => {
                eprintln!("FAILED {f}");
                ExitCode::FAILURE
            }
        };
    }
    let start = Instant::now();
    let jobs = args.jobs.max(1);
    let chunk = 1_000u64;
    let next = std::sync::atomic::AtomicU64::new(0);
    let total = std::sync::Mutex::new(mariner_faultsim::Summary::default());
    let failure = std::sync::Mutex::new(None::<mariner_faultsim::Failure>);
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(|| loop {
                let i = next.fetch_add(chunk, std::sync::atomic::Ordering::Relaxed);
                if i >= args.seeds || failure.lock().map(|f| f.is_some()).unwrap_or(true) {
                    return;
                }
                let n = chunk.min(args.seeds - i);
                match mariner_faultsim::run_seeds(args.first + i, n) {
                    Ok(sum) => {
                        if let Ok(mut t) = total.lock() {
                            t.add(&sum);
                            if t.seeds % 10_000 == 0 || t.seeds == args.seeds {
                                eprintln!(
                                    "{} of {} seeds, {:.0} s",
                                    t.seeds,
                                    args.seeds,
                                    start.elapsed().as_secs_f64()
                                );
                            }
                        }
                    }
                    Err(f) => {
                        if let Ok(mut g) = failure.lock() {
                            g.get_or_insert(f);
                        }
                        return;
                    }
                }
            });
        }
    });
    if let Ok(Some(f)) = failure.into_inner() {
        eprintln!("FAILED {f}");
        return ExitCode::FAILURE;
    }
    let total = total.into_inner().unwrap_or_default();
    println!(
        "ok: {total} in {:.1} s (seeds {}..{})",
        start.elapsed().as_secs_f64(),
        args.first,
        args.first + args.seeds
    );
    ExitCode::SUCCESS
}
