//! Runs one experiment without building the `mariner` binary:
//! `cargo run --release -p mariner-sim --example experiment -- <name> [seed]`.

fn main() {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_else(|| "list".into());
    let seed = args.next().and_then(|s| s.parse().ok()).unwrap_or(1);
    match mariner_sim::experiments::run(&name, seed) {
        Some(rep) => print!("{}", rep.to_text()),
        None => {
            for (n, what) in mariner_sim::experiments::EXPERIMENTS {
                println!("{n:24} {what}");
            }
        }
    }
}
