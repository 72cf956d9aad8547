//! `mariner sim`: runs a simulator experiment and prints its table (ours beside the seed's).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use mariner_sim::experiments;

#[derive(Args)]
pub struct SimArgs {
    /// Experiment to run; `list` shows them all.
    experiment: String,
    /// Seed for every random choice; the same seed gives the same output.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Also write the experiment's plot as SVG to this file.
    #[arg(long)]
    svg: Option<PathBuf>,
}

pub fn run(a: &SimArgs) -> Result<ExitCode, String> {
    if a.experiment == "list" {
        for (name, what) in experiments::EXPERIMENTS {
            println!("{name:24} {what}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let Some(rep) = experiments::run(&a.experiment, a.seed) else {
        return Err(format!(
            "no experiment {:?}; try `mariner sim list`",
            a.experiment
        ));
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
