//! drover-sim: a deterministic simulator of a Drover cluster. The real master core
//! (`drover_master::core::Core`) and the real agent cores (`drover_agent::host`,
//! `drover_agent::converge`) run against simulated executors, a simulated network
//! (delay, loss, partitions, reordering), clocks (drift and steps), a simulated
//! disk under the master's store (slow and full commits) and random operators,
//! all driven by one seeded random source in one thread: a seed replays exactly.
//! Invariants are checked after every step (`check`); a failure names its seed
//! and the tail of the trace. See docs/testing.md, "The simulator".

pub mod chaos;
pub mod check;
pub mod jobs;
pub mod memory;
pub mod rng;
pub mod store;
pub mod trace;
pub mod world;

use std::fmt;

pub use trace::Trace;
pub use world::{Faults, Stats, World};

/// A finished run.
#[derive(Debug)]
pub struct Outcome {
    pub seed: u64,
    pub trace_hash: u64,
    pub stats: Stats,
}

/// A run that broke an invariant.
#[derive(Debug)]
pub struct Failure {
    pub seed: u64,
    pub step: u64,
    pub sim_ms: u64,
    pub what: String,
    pub tail: Vec<String>,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "seed {} failed at step {} ({} ms simulated): {}",
            self.seed, self.step, self.sim_ms, self.what
        )?;
        writeln!(f, "replay: cargo run -p drover-sim -- --seed {}", self.seed)?;
        writeln!(f, "last trace lines:")?;
        for l in &self.tail {
            writeln!(f, "  {l}")?;
        }
        Ok(())
    }
}

/// Runs `seed` for `steps` events with `faults`.
pub fn run(seed: u64, steps: u64, faults: Faults) -> Result<Outcome, Failure> {
    run_traced(seed, steps, faults, false)
}

/// `run`, printing every trace line when `print`.
pub fn run_traced(seed: u64, steps: u64, faults: Faults, print: bool) -> Result<Outcome, Failure> {
    let hooks = world::Hooks {
        act: chaos::act,
        watch: check::watch,
    };
    let mut w = World::new(seed, faults, hooks);
    w.trace.print = print;
    while w.stats.steps < steps {
        match w.step() {
            Ok(true) => {}
            Ok(false) => break,
            Err(what) => {
                w.trace.line(w.t, format!("VIOLATION: {what}"));
                return Err(Failure {
                    seed,
                    step: w.stats.steps,
                    sim_ms: w.stats.sim_ms,
                    what,
                    tail: w.trace.tail(),
                });
            }
        }
    }
    Ok(Outcome {
        seed,
        trace_hash: w.trace.hash(),
        stats: w.stats,
    })
}

/// Events per seed in CI (and the binary's default).
pub const CI_STEPS: u64 = 4_000;
