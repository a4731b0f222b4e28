//! `drover-sim`: runs seeds of the deterministic simulator (docs/testing.md, "The
//! simulator"). `--seeds N` runs seeds `--first` .. `--first + N`; `--seed S` runs
//! one; a failure prints its seed and trace tail, and the exit status is 1.

use clap::Parser;

/// Runs the cluster simulator over seeds.
#[derive(Parser, Debug)]
#[command(name = "drover-sim", version)]
struct Args {
    /// How many seeds to run (from --first).
    #[arg(long, default_value_t = 100)]
    seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 1)]
    first: u64,
    /// Run this one seed only (replay a failure).
    #[arg(long)]
    seed: Option<u64>,
    /// Events per seed.
    #[arg(long, default_value_t = drover_sim::CI_STEPS)]
    steps: u64,
    /// Never wipe a host's disk (the fault the Assignment.started fix is about).
    #[arg(long)]
    no_host_wipe: bool,
    /// Print the whole trace of each seed as it runs.
    #[arg(long)]
    trace: bool,
    /// Keep going after a failure and list every failing seed at the end.
    #[arg(long)]
    keep_going: bool,
}

fn main() {
    let args = Args::parse();
    let seeds: Vec<u64> = match args.seed {
        Some(s) => vec![s],
        None => (args.first..args.first.saturating_add(args.seeds)).collect(),
    };
    let faults = drover_sim::Faults {
        host_wipe: !args.no_host_wipe,
    };
    let started = std::time::Instant::now();
    let mut failed = Vec::new();
    let mut steps = 0u64;
    for seed in &seeds {
        match drover_sim::run_traced(*seed, args.steps, faults.clone(), args.trace) {
            Ok(o) => {
                steps += o.stats.steps;
                if args.seed.is_some() {
                    println!(
                        "seed {seed}: ok, trace {:016x}, {:?}",
                        o.trace_hash, o.stats
                    );
                }
            }
            Err(f) => {
                eprintln!("{f}");
                failed.push(*seed);
                if !args.keep_going {
                    break;
                }
            }
        }
    }
    println!(
        "{} seeds, {} failed {:?}, {steps} steps in {:.1} s",
        seeds.len(),
        failed.len(),
        failed,
        started.elapsed().as_secs_f64()
    );
    if !failed.is_empty() {
        std::process::exit(1);
    }
}
