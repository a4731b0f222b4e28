//! The end-to-end benchmark of issue 4's speed targets, on real binaries (the master,
//! agents and executors; not run in CI; needs root for task users and cgroups):
//!
//! 1. latency: one task, job create to RUNNING on a local agent, no health check
//!    (a `sleep` service), and job create to FINISHED for a one-shot `true`.
//!    Measured by the client (polling the task every 1 ms) and from the master's own
//!    event timestamps, with the median of each phase (PENDING -> ASSIGNED ->
//!    STARTING -> RUNNING). Run twice: back to back, and with a pause before each job
//!    (`BENCH_LATENCY_GAP_MS`, default 200), because the first cgroup migration after
//!    a quiet period costs a kernel RCU grace period (see docs/agent.md, "Measured").
//! 2. throughput: N one-shot `true` tasks (default 5000, `BENCH_TASKS`) on 4 local
//!    agents, from the first submit to all FINISHED, submitted as batch jobs of
//!    `BENCH_JOB_SIZE` instances (default: all in one job), with the CPU time the
//!    master and the agents (including their reaped executors and tasks) used.
//!
//! 3. `drover job create FILE --wait` of a one-shot `true`, end to end as the user
//!    sees it: from spawning the CLI to its exit (process start, TLS when on, the
//!    create, following the change stream to FINISHED), `BENCH_CLI_RUNS` times
//!    (default 12), with `true` itself timed the same way for scale.
//!
//! This replaces `master/benches/real_cluster.sh`, which measured the same things
//! with a shell script (see docs/master.md for why its numbers differed).
//!
//! Run: `scripts/release.sh` (release binaries, the executor linked on its own) then
//! `DROVER_BIN_DIR=$PWD/target/release cargo bench -p drover-tests --bench e2e`.
//! `BENCH_LATENCY_RUNS` sets the latency samples (default 30); `BENCH_ONLY=latency`,
//! `BENCH_ONLY=throughput` or `BENCH_ONLY=cli_wait` runs one part; `BENCH_TLS=1` runs the cluster over
//! mTLS (docs/auth.md).

use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use drover_common::state::TaskState;
use drover_common::wire::TaskView;
use drover_tests::{command_job, env_number, Cluster, ClusterConfig};
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
    println!("mTLS: {}", std::env::var_os("BENCH_TLS").is_some());
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    if only.is_empty() || only == "latency" {
        let runs = env_number("BENCH_LATENCY_RUNS", 30);
        let gap = env_number("BENCH_LATENCY_GAP_MS", 200) as u64;
        latency(runs, 0)?;
        if gap > 0 {
            latency(runs, gap)?;
        }
    }
    if only.is_empty() || only == "throughput" {
        let tasks = env_number("BENCH_TASKS", 5000);
        let job_size = env_number("BENCH_JOB_SIZE", tasks);
        throughput(tasks, job_size)?;
    }
    if only.is_empty() || only == "cli_wait" {
        cli_wait(env_number("BENCH_CLI_RUNS", 12))?;
    }
    Ok(())
}

/// `drover job create FILE --wait` of a one-shot `true`, timed from spawning the
/// CLI to its exit, `runs` times on one agent; `/bin/true` spawned the same way for
/// scale.
fn cli_wait(runs: usize) -> anyhow::Result<()> {
    let cluster = Cluster::start(config(1))?;
    println!("-- drover job create --wait (one-shot true), {runs} runs");
    let mut cli_ms = Vec::new();
    let mut true_ms = Vec::new();
    for i in 0..runs {
        let name = format!("wait-{i}");
        let path = cluster.dir().join(format!("{name}.json"));
        std::fs::write(&path, command_job(&name, 1, false, "true").to_string())?;
        let path = path.to_str().context("the data dir is not UTF-8")?;
        let started = Instant::now();
        let output = cluster.drover(&["job", "create", path, "--wait", "--timeout", "30s"])?;
        cli_ms.push(started.elapsed().as_secs_f64() * 1000.0);
        if !output.status.success() {
            bail!("{}", drover_tests::describe(&output));
        }
        let started = Instant::now();
        std::process::Command::new("/bin/true").status()?;
        true_ms.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    println!(
        "drover job create --wait: median {:.1} ms (p90 {:.1}, min {:.1}); /bin/true spawned: median {:.2} ms",
        percentile(&mut cli_ms, 0.5),
        percentile(&mut cli_ms, 0.9),
        percentile(&mut cli_ms, 0.0),
        percentile(&mut true_ms, 0.5),
    );
    Ok(())
}

/// `n` agents; with `BENCH_TLS` set, agents and master speak mTLS (the admin API
/// TLS with a token); else plain HTTP with tokens.
fn config(n: usize) -> ClusterConfig {
    let mut config = ClusterConfig::agents(n);
    config.tls = std::env::var_os("BENCH_TLS").is_some();
    config
}

/// create -> RUNNING (sleep service) and create -> FINISHED (true), `runs` times
/// each, waiting `gap_ms` before each job.
fn latency(runs: usize, gap_ms: u64) -> anyhow::Result<()> {
    let cluster = Cluster::start(config(1))?;
    println!("-- latency, {runs} runs, {gap_ms} ms pause before each job");
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
        // PENDING -> ASSIGNED, ASSIGNED -> STARTING, STARTING -> goal.
        let mut phases: [Vec<f64>; 3] = Default::default();
        for i in 0..runs {
            std::thread::sleep(Duration::from_millis(gap_ms));
            let name = format!("lat-{}-{gap_ms}-{i}", if service { "svc" } else { "batch" });
            let spec = command_job(&name, 1, service, cmdline);
            let started = Instant::now();
            let created = cluster.create_job(&spec)?;
            let task_id = created["tasks"][0]
                .as_str()
                .context("job create answered no task id")?
                .to_string();
            let task = poll_task(&cluster, &task_id, goal, Duration::from_secs(30))?;
            client_ms.push(started.elapsed().as_secs_f64() * 1000.0);
            let at = |state: TaskState| {
                task.events
                    .iter()
                    .find(|e| e.state == state)
                    .map(|e| e.timestamp_ms as f64)
            };
            let marks = [
                at(TaskState::Pending),
                at(TaskState::Assigned),
                at(TaskState::Starting),
                at(goal),
            ];
            if let (Some(created), Some(reached)) = (marks[0], marks[3]) {
                master_ms.push(reached - created);
            }
            for (k, phase) in phases.iter_mut().enumerate() {
                if let (Some(a), Some(b)) = (marks[k], marks[k + 1]) {
                    phase.push(b - a);
                }
            }
            if service {
                cluster.post(&format!("/v1/jobs/www-data/test/{name}/kill"), &json!({}))?;
            }
        }
        println!(
            "{kind}: client median {:.1} ms (p90 {:.1}, min {:.1}); master events median {:.1} ms \
             (phases: ASSIGNED {:.1}, STARTING {:.1}, {goal} {:.1})",
            percentile(&mut client_ms, 0.5),
            percentile(&mut client_ms, 0.9),
            percentile(&mut client_ms, 0.0),
            percentile(&mut master_ms, 0.5),
            percentile(&mut phases[0], 0.5),
            percentile(&mut phases[1], 0.5),
            percentile(&mut phases[2], 0.5),
        );
    }
    Ok(())
}

/// `tasks` one-shot `true` tasks in batch jobs of `job_size` instances on 4 agents.
fn throughput(tasks: usize, job_size: usize) -> anyhow::Result<()> {
    let mut cluster = Cluster::start(config(4))?;
    let per_job = job_size.clamp(1, tasks.max(1));
    let jobs = tasks.div_ceil(per_job);
    let cpu_before = cluster_cpu(&mut cluster);
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
                .filter(|s| s.key.contains("/tp-"))
                .filter_map(|s| s.state_counts.get(&state))
                .sum()
        };
        let finished = count(TaskState::Finished);
        let failed = count(TaskState::Failed) + count(TaskState::Lost);
        if finished as usize + failed as usize >= tasks {
            let elapsed = started.elapsed().as_secs_f64();
            // Executors are reaped by their agent after they exit, so wait for the
            // last ones before reading the agents' children's CPU time.
            std::thread::sleep(Duration::from_millis(500));
            let cpu_after = cluster_cpu(&mut cluster);
            println!(
                "{tasks} one-shot tasks on 4 agents ({jobs} job(s) of up to {per_job}): submitted in \
                 {:.2}s, all done in {elapsed:.2}s = {:.0} tasks/s ({finished} FINISHED, {failed} \
                 FAILED/LOST)",
                submitted.as_secs_f64(),
                tasks as f64 / elapsed
            );
            println!(
                "CPU: master {:.2}s, agents {:.2}s, executors and tasks {:.2}s = {:.2} ms per task",
                cpu_after.master - cpu_before.master,
                cpu_after.agents - cpu_before.agents,
                cpu_after.children - cpu_before.children,
                (cpu_after.total() - cpu_before.total()) * 1000.0 / tasks as f64
            );
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("only {finished} of {tasks} finished after 30 minutes");
        }
        // Each poll makes the master count every task's state: not too often.
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// CPU seconds used so far (user + system).
#[derive(Clone, Copy, Debug, Default)]
struct Cpu {
    master: f64,
    agents: f64,
    /// The agents' children: executors (reaped by the agent, or forked by its fork
    /// server, which reaps them), and through them the tasks.
    children: f64,
}

impl Cpu {
    fn total(&self) -> f64 {
        self.master + self.agents + self.children
    }
}

fn cluster_cpu(cluster: &mut Cluster) -> Cpu {
    let mut cpu = Cpu::default();
    if let Some(master) = cluster.master() {
        let (own, _) = proc_cpu(master.pid());
        cpu.master = own;
    }
    for pid in cluster.agent_pids() {
        let (own, children) = proc_cpu(pid);
        cpu.agents += own;
        cpu.children += children;
        // Live children: the fork server, whose reaped children are the executors it
        // forked, and any executor still running.
        for child in live_children(pid) {
            let (own, children) = proc_cpu(child);
            cpu.children += own + children;
        }
    }
    cpu
}

/// The pids of a process's children that have not exited, from
/// /proc/PID/task/*/children.
fn live_children(pid: u32) -> Vec<u32> {
    let Ok(threads) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    threads
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|list| {
            list.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// (own, reaped children's) CPU seconds of a process, from /proc/PID/stat.
fn proc_cpu(pid: u32) -> (f64, f64) {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return (0.0, 0.0);
    };
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return (0.0, 0.0);
    };
    // After the command name: state is field 3; utime 14, stime 15, cutime 16, cstime 17.
    let fields: Vec<f64> = rest
        .split_whitespace()
        .skip(11)
        .take(4)
        .map(|f| f.parse().unwrap_or(0.0))
        .collect();
    let tick = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    match fields.as_slice() {
        [u, s, cu, cs] => ((u + s) / tick, (cu + cs) / tick),
        _ => (0.0, 0.0),
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
