//! End-to-end measurements on real binaries (not run in CI; needs root):
//!
//! 1. latency: one task, job create to RUNNING on a local agent, no health check
//!    (a `sleep` service), and job create to FINISHED for a one-shot `true`;
//!    measured by the client (polling the task every 1 ms) and from the master's own
//!    event timestamps.
//! 2. throughput: N one-shot `true` tasks (default 5000, `BENCH_TASKS`) on 4 local
//!    agents, from the first submit to all FINISHED.
//!
//! Run: `cargo build --workspace --bins && cargo bench -p drover-tests --bench e2e`
//! (for release binaries: `cargo build --release --workspace --bins` and
//! `DROVER_BIN_DIR=target/release`). `BENCH_LATENCY_RUNS` sets the latency samples
//! (default 30).

use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use drover_common::state::TaskState;
use drover_common::wire::TaskView;
use drover_tests::{command_job, Cluster, ClusterConfig};
use serde_json::json;

fn main() -> anyhow::Result<()> {
    if std::env::args().any(|a| a == "--list") {
        // `cargo test --benches` and nextest ask benches for their tests: none here.
        return Ok(());
    }
    if !nix::unistd::geteuid().is_root() {
        bail!("the e2e bench needs root (task users, cgroups)");
    }
    println!("binaries: {}", drover_tests::bin_dir().display());
    let runs = env_number("BENCH_LATENCY_RUNS", 30);
    latency(runs)?;
    let tasks = env_number("BENCH_TASKS", 5000);
    throughput(tasks)?;
    Ok(())
}

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// create -> RUNNING (sleep service) and create -> FINISHED (true), `runs` times each.
fn latency(runs: usize) -> anyhow::Result<()> {
    let cluster = Cluster::start(ClusterConfig::agents(1))?;
    for (kind, service, cmdline, goal) in [
        (
            "create -> RUNNING (sleep service)",
            true,
            "exec sleep 600",
            TaskState::Running,
        ),
        (
            "create -> FINISHED (true)",
            false,
            "true",
            TaskState::Finished,
        ),
    ] {
        let mut client_ms = Vec::new();
        let mut master_ms = Vec::new();
        for i in 0..runs {
            let name = format!("lat-{}-{i}", if service { "svc" } else { "batch" });
            let spec = command_job(&name, 1, service, cmdline);
            let started = Instant::now();
            let created = cluster.create_job(&spec)?;
            let task_id = created["tasks"][0]
                .as_str()
                .context("job create answered no task id")?
                .to_string();
            let task = poll_task(&cluster, &task_id, goal, Duration::from_secs(30))?;
            client_ms.push(started.elapsed().as_secs_f64() * 1000.0);
            if let (Some(first), Some(reached)) = (
                task.events.first(),
                task.events.iter().find(|e| e.state == goal),
            ) {
                master_ms.push(reached.timestamp_ms.saturating_sub(first.timestamp_ms) as f64);
            }
            if service {
                cluster.post(&format!("/v1/jobs/www-data/test/{name}/kill"), &json!({}))?;
            }
        }
        println!(
            "{kind}: client median {:.1} ms (p90 {:.1}, min {:.1}); master events median {:.1} ms; {runs} runs",
            percentile(&mut client_ms, 0.5),
            percentile(&mut client_ms, 0.9),
            percentile(&mut client_ms, 0.0),
            percentile(&mut master_ms, 0.5),
        );
    }
    Ok(())
}

/// `tasks` one-shot `true` tasks in batch jobs of 100 instances on 4 agents.
fn throughput(tasks: usize) -> anyhow::Result<()> {
    let cluster = Cluster::start(ClusterConfig::agents(4))?;
    let per_job = 100.min(tasks.max(1));
    let jobs = tasks.div_ceil(per_job);
    let started = Instant::now();
    for j in 0..jobs {
        let instances = per_job.min(tasks - j * per_job);
        let mut spec = command_job(&format!("tp-{j}"), instances as u32, false, "true");
        spec["task"]["resources"] = json!({"cpu": 0.01, "ram": "16MiB", "disk": "16MiB"});
        cluster.create_job(&spec)?;
    }
    let submitted = started.elapsed();
    let deadline = Instant::now() + Duration::from_secs(1800);
    loop {
        let summaries: Vec<drover_common::wire::JobSummary> = cluster.get("/v1/jobs")?;
        let count = |state: TaskState| -> u32 {
            summaries
                .iter()
                .filter_map(|s| s.state_counts.get(&state))
                .sum()
        };
        let finished = count(TaskState::Finished);
        let failed = count(TaskState::Failed) + count(TaskState::Lost);
        if finished as usize + failed as usize >= tasks {
            let elapsed = started.elapsed().as_secs_f64();
            println!(
                "{tasks} one-shot tasks on 4 agents: submitted in {:.2}s, all done in {elapsed:.2}s \
                 = {:.0} tasks/s ({finished} FINISHED, {failed} FAILED/LOST)",
                submitted.as_secs_f64(),
                tasks as f64 / elapsed
            );
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("only {finished} of {tasks} finished after 30 minutes");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Polls a task every millisecond until it is in `goal`.
fn poll_task(
    cluster: &Cluster,
    task_id: &str,
    goal: TaskState,
    timeout: Duration,
) -> anyhow::Result<TaskView> {
    let deadline = Instant::now() + timeout;
    loop {
        let task = cluster.task(task_id)?;
        if task.state == goal {
            return Ok(task);
        }
        if task.state.is_terminal() {
            bail!("task {task_id} ended {} instead of {goal}", task.state);
        }
        if Instant::now() > deadline {
            bail!(
                "task {task_id} not {goal} after {}s: {task:?}",
                timeout.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn percentile(values: &mut [f64], p: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let index = ((values.len() - 1) as f64 * p).round() as usize;
    values[index]
}
