//! BOSC measurements (issue 4): recovery time against pending updates (dissertation Fig. 3.11,
//! Table 3.2) and the cost of a forced commit to the caller. In-memory disks, so these measure
//! the engine's CPU cost. Run: `cargo run --release -p mariner-bosc --example measure`.
//!
//! The memory of a reopen whose own log lies entirely below the checkpoint, on files so the
//! log's bytes are not in the process (measure the second command's peak RSS):
//! `measure fill-log DIR LOG_MIB` then `/usr/bin/time -v measure reopen DIR`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/support/measure.rs"]
mod support;

use std::path::Path;
use std::sync::Arc;

use mariner_disk::{Disk, FileDisk, OpenOptions};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["fill-log", dir, mib] => fill_log(Path::new(dir), mib.parse().unwrap()),
        ["reopen", dir] => reopen(Path::new(dir)),
        [] => cpu(),
        _ => panic!("usage: measure [fill-log DIR LOG_MIB | reopen DIR]"),
    }
}

fn fill_log(dir: &Path, log_mib: u64) {
    let data: Arc<dyn Disk> = Arc::new(FileDisk::create_sized(dir.join("data"), 0).unwrap());
    let log: Arc<dyn Disk> =
        Arc::new(FileDisk::create_sized(dir.join("log"), log_mib << 20).unwrap());
    let checkpoint = support::fill_committed_log(data, &log, 1.2);
    println!("log {log_mib} MiB written about 1.2 times, checkpoint {checkpoint}");
}

fn reopen(dir: &Path) {
    let open = |name| -> Arc<dyn Disk> {
        Arc::new(FileDisk::open(dir.join(name), &OpenOptions::new()).unwrap())
    };
    let r = support::reopen_committed(open("data"), &open("log"));
    println!(
        "reopen: checkpoint {}  records above it {}  in {:.3} s",
        r.checkpoint,
        r.records_scanned,
        r.elapsed.as_secs_f64()
    );
}

fn cpu() {
    for pending in [125_000, 250_000, 500_000, 1_000_000] {
        support::print_recovery(pending);
    }
    for budget in [usize::MAX, 4 << 20, 1 << 20, 256 << 10] {
        support::print_forced(100_000, budget);
    }
}
