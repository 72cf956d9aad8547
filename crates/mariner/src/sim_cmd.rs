//! `mariner sim`: runs a simulator experiment and prints its table (ours beside the seed's).
//! `mariner sim replay FILE [--format text|spc] [--disk NAME] [--log-disks N]` replays a trace.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use mariner_sim::disk::DiskParams;
use mariner_sim::experiments;
use mariner_sim::replay::{self, Replay};
use mariner_sim::report::Report;
use mariner_sim::workload::{self, TraceFormat};

#[derive(Args)]
pub struct SimArgs {
    /// Experiment to run; `list` shows them all; `replay FILE` replays a trace.
    experiment: String,
    /// The trace file of `replay` (docs/simulation.md "Workloads and traces").
    file: Option<PathBuf>,
    /// Seed for every random choice; the same seed gives the same output.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Also write the experiment's plot as SVG to this file.
    #[arg(long)]
    svg: Option<PathBuf>,
    /// `replay`: trace format, `text` or `spc`; detected per line when absent.
    #[arg(long)]
    format: Option<TraceFormat>,
    /// `replay`: disk model for the conventional and Trail disks (`mariner sim disks`).
    #[arg(long, default_value = "trail-table1")]
    disk: String,
    /// `replay`: log disks of the Mariner array.
    #[arg(long, default_value_t = 1)]
    log_disks: usize,
}

pub fn run(a: &SimArgs) -> Result<ExitCode, String> {
    if a.experiment == "list" {
        for (name, what) in experiments::EXPERIMENTS {
            println!("{name:24} {what}");
        }
        println!(
            "{:24} replay a trace file (--format text|spc, --disk, --log-disks)",
            "replay FILE"
        );
        return Ok(ExitCode::SUCCESS);
    }
    let rep = if a.experiment == "replay" {
        replay_report(a)?
    } else {
        experiments::run(&a.experiment, a.seed)
            .ok_or_else(|| format!("no experiment {:?}; try `mariner sim list`", a.experiment))?
    };
    print!("{}", rep.to_text());
    if let Some(path) = &a.svg {
        let plot = rep
            .plot
            .as_ref()
            .ok_or_else(|| format!("experiment {} has no plot", a.experiment))?;
        std::fs::write(path, plot.to_svg(&rep.title))
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}

fn replay_report(a: &SimArgs) -> Result<Report, String> {
    let path = a
        .file
        .as_ref()
        .ok_or("usage: mariner sim replay FILE [--format text|spc] [--disk NAME]")?;
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let reqs = workload::parse_trace_as(&text, a.format)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let disk = DiskParams::by_name(&a.disk)
        .ok_or_else(|| format!("no disk {:?}; see `mariner sim disks`", a.disk))?;
    let cfg = Replay {
        disk,
        log_disks: a.log_disks,
        seed: a.seed,
    };
    Ok(replay::replay(&reqs, &cfg))
}
