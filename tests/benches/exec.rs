//! `drover task exec KEY/0 -- true` (issue 29 asks for < 100 ms p50): the wall time
//! of the CLI from spawn to exit against a one-agent cluster with one RUNNING
//! `sleep` task, alternating with `drover job status` (one plain API round trip of
//! the same CLI, the floor of any command). Prints the median, p90, minimum and
//! maximum of `BENCH_RUNS` runs of each (default 40), after 3 warm-up execs.
//!
//! Not run in CI: `DROVER_BIN_DIR=$PWD/target/release cargo bench -p drover-tests
//! --bench exec` (as root; without `DROVER_BIN_DIR`, the debug binaries).

use std::time::{Duration, Instant};

use drover_common::state::TaskState;
use drover_tests::{command_job, Cluster, ClusterConfig};

const KEY: &str = "www-data/bench/shell";

/// Median, p90, minimum and maximum of `ms`, as one line.
fn summary(mut ms: Vec<f64>) -> String {
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| ms[((ms.len() - 1) as f64 * q).round() as usize];
    format!(
        "median {:.1} ms, p90 {:.1}, min {:.1}, max {:.1} ({} runs)",
        at(0.5),
        at(0.9),
        ms[0],
        ms[ms.len() - 1],
        ms.len()
    )
}

fn main() -> anyhow::Result<()> {
    if std::env::args().any(|a| a == "--list") {
        return Ok(());
    }
    let runs = drover_tests::env_number("BENCH_RUNS", 40);
    let mut c = Cluster::start(ClusterConfig::agents(1))?;
    let mut spec = command_job("shell", 1, true, "exec sleep 600");
    spec["environment"] = "bench".into();
    c.create_job(&spec)?;
    c.wait_for_all(KEY, TaskState::Running)?;
    let target = format!("{KEY}/0");
    let exec = ["task", "exec", target.as_str(), "--", "true"];
    let status = ["job", "status", KEY];
    let timed = |args: &[&str]| -> anyhow::Result<f64> {
        let start = Instant::now();
        let out = c.drover_with_timeout(args, Duration::from_secs(30))?;
        anyhow::ensure!(out.status.success(), "drover {args:?} failed: {out:?}");
        Ok(start.elapsed().as_secs_f64() * 1000.0)
    };
    for _ in 0..3 {
        timed(&exec)?;
    }
    let (mut execs, mut statuses) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        execs.push(timed(&exec)?);
        statuses.push(timed(&status)?);
    }
    println!("drover task exec KEY/0 -- true: {}", summary(execs));
    println!("drover job status KEY:          {}", summary(statuses));
    c.kill_job(KEY)?;
    Ok(())
}
