//! `mariner-index-bench --engine E --dir D ...`: one engine, one run, one JSON line on stdout
//! (see the library's docs and `bench/index-compare.sh`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use bytesize::ByteSize;
use clap::Parser;
use mariner_index_bench::{reopen, run, BenchError, Config, EngineKind};

#[derive(Parser)]
#[command(about = "Index benchmark of issue 4: one engine per process, one JSON line out")]
struct Args {
    /// bosc-btree | redb | fjall | bosc-hash | plain-hash
    #[arg(long)]
    engine: String,
    /// Scratch directory on the disk under test.
    #[arg(long)]
    dir: PathBuf,
    /// Memory for the engine's caches, memtables, queues and internal nodes.
    #[arg(long, default_value = "32MiB")]
    budget: ByteSize,
    /// Records bulk-loaded (untimed) before the timed phases.
    #[arg(long, default_value_t = 1_000_000)]
    preload_entries: u64,
    /// Most operations per timed phase (inserts, then updates).
    #[arg(long, default_value_t = 1_000_000)]
    ops: u64,
    /// Longest time per timed phase, seconds.
    #[arg(long, default_value_t = 60)]
    window_secs: u64,
    /// Durable every this many operations.
    #[arg(long, default_value_t = 1000)]
    sync_every: u64,
    /// Point queries, and as many range queries.
    #[arg(long, default_value_t = 2000)]
    queries: u64,
    /// LBAs a range query covers.
    #[arg(long, default_value_t = 100)]
    range_len: u64,
    /// Seed of the operations' random numbers.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Block (leaf, page) size of the BOSC engines and the plain hash table.
    #[arg(long, default_value_t = 4096)]
    block_bytes: u32,
    /// Longest BOSC commit run, in blocks (32 in the seed).
    #[arg(long, default_value_t = 32)]
    max_run: u32,
    /// How the BOSC engines guard their data disk against torn writes: `shadow` (shadow
    /// extents: each extent written whole to its other home, twice the disk) or
    /// `double-write` (a double-write area: every block written twice).
    #[arg(long, default_value = "shadow", value_parser = ["shadow", "double-write"])]
    torn_guard: String,
    /// bosc-btree: parts each batch is handed to the log in, so preparing one part overlaps
    /// the log write of the one before (each batch is still durable when its call returns).
    #[arg(long, default_value_t = 1)]
    log_parts: usize,
    /// End each timed write phase with a timed commit of the engine's queues (BOSC), reported
    /// as `commit_s` beside the phase's rate.
    #[arg(long)]
    commit_queued: bool,
    /// BOSC engines: `BoscConfig::sweep_full_above` (the share of the budget from which the
    /// background sweep no longer rests between batches); default BOSC's.
    #[arg(long)]
    sweep_full_above: Option<f64>,
    /// BOSC engines: `BoscConfig::sweep_above` (the share of the budget the queues hold
    /// before the background sweep starts); default BOSC's.
    #[arg(long)]
    sweep_above: Option<f64>,
    /// Check every answer against an in-memory model (small runs only).
    #[arg(long)]
    verify: bool,
    /// Print to stderr, every second of a timed write phase, the operations done and each
    /// engine counter that moved in that second.
    #[arg(long)]
    trace: bool,
    /// Instead of a run: open the files an earlier run with the same parameters left (BOSC:
    /// recovering its queues from its log) and look up a sample of its inserts.
    #[arg(long)]
    reopen_only: bool,
}

/// glibc gives each thread that allocates an arena of its own (up to 8 per core), and memory
/// freed in one arena serves only that arena's threads: an engine whose threads take turns
/// allocating (a caller and a background committer, compaction threads) held 2-3x its live
/// memory in idle arenas, in a benchmark whose point is a memory budget. Two arenas for every
/// engine alike (the same as `MALLOC_ARENA_MAX=2`).
fn limit_malloc_arenas() {
    // SAFETY: mallopt only sets an allocator parameter; called first thing in main, before
    // any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

fn main() -> ExitCode {
    limit_malloc_arenas();
    let args = Args::parse();
    let Some(engine) = EngineKind::parse(&args.engine) else {
        eprintln!("unknown engine {:?}", args.engine);
        return ExitCode::from(2);
    };
    let cfg = Config {
        budget_bytes: args.budget.as_u64(),
        preload_entries: args.preload_entries,
        ops: args.ops,
        window: Duration::from_secs(args.window_secs),
        sync_every: args.sync_every,
        queries: args.queries,
        range_len: args.range_len,
        seed: args.seed,
        block_bytes: args.block_bytes,
        max_run: args.max_run,
        shadow: args.torn_guard == "shadow",
        log_parts: args.log_parts,
        verify: args.verify,
        commit_queued: args.commit_queued,
        trace: args.trace,
        sweep_full_above: args.sweep_full_above,
        sweep_above: args.sweep_above,
        ..Config::new(engine, args.dir)
    };
    let line = if args.reopen_only {
        reopen(&cfg).and_then(|r| to_json(&r))
    } else {
        run(&cfg).and_then(|r| to_json(&r))
    };
    match line {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("mariner-index-bench {}: {e}", engine.name());
            ExitCode::FAILURE
        }
    }
}

fn to_json(r: &impl serde::Serialize) -> Result<String, BenchError> {
    serde_json::to_string(r).map_err(|e| BenchError::Check(e.to_string()))
}
