//! The agent with the real `drover-executor` (from target/debug, built by
//! `cargo build --workspace --bins`; skipped with a message when absent) against the
//! fake master: assignment to RUNNING latency, kill, re-adoption with the task's
//! pids unchanged, executor loss.

#![allow(clippy::unwrap_used)]

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use drover_agent::config::ConfigFile;
use drover_common::state::{ExitReason, TaskState};
use support::*;

fn real_executor() -> Option<PathBuf> {
    // target/debug/deps/real_executor-<hash> -> target/debug/drover-executor
    let exe = std::env::current_exe().ok()?;
    let path = exe.parent()?.parent()?.join("drover-executor");
    path.is_file().then_some(path)
}

fn real_config(master: &FakeMaster, dirs: &AgentDirs, executor: &Path) -> drover_agent::Config {
    let extra = ConfigFile {
        executor: Some(executor.to_path_buf()),
        no_isolation: Some(true),
        executor_fork_server: Some(true),
        ..ConfigFile::default()
    };
    config(master, dirs, extra)
}

fn task_pids(master: &FakeMaster, task_id: &str) -> Vec<u32> {
    master
        .updates_for(task_id)
        .iter()
        .rev()
        .find(|u| u.state == TaskState::Running)
        .map(|u| u.processes.iter().filter_map(|p| p.pid).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_executor_runs_is_readopted_and_killed() {
    let Some(executor) = real_executor() else {
        eprintln!(
            "skipping: target/debug/drover-executor is not built (cargo build -p drover-executor)"
        );
        return;
    };
    let master = FakeMaster::start().await;
    let dirs = AgentDirs::new();
    let _guard = KillExecutorsOnDrop(
        &dirs,
        vec![
            "real0", "real1", "real2", "real3", "real4", "real5", "real6",
        ],
    );
    let agent = RunningAgent::start(real_config(&master, &dirs, &executor));
    let mut latencies = Vec::new();
    let mut assigned = Vec::new();
    for i in 0..7 {
        let id = format!("real{i}");
        let mut a = assignment(&id, "sleep 600");
        // An account every Debian host has; with --no-isolation the executor
        // runs the task as the current user anyway.
        a.task.task.user = Some("nobody".into());
        assigned.push(a);
        let t0 = Instant::now();
        tracing::info!(task = %id, "assigning");
        master.assign(assigned.clone());
        let running = master.wait_for_state(&id, TaskState::Running).await;
        let arrived = master.with(|s| s.arrivals[&(id.clone(), running.seq)]);
        latencies.push(arrived - t0);
    }
    latencies.sort();
    eprintln!(
        "assignment -> RUNNING at the master via the real executor: median {:?}, max {:?}",
        latencies[latencies.len() / 2],
        latencies[latencies.len() - 1]
    );
    let pids = task_pids(&master, "real0");
    assert!(!pids.is_empty(), "RUNNING carries the process pids");

    // kill -9 of the agent (here: stop without any cleanup) several times: the
    // task's processes stay the same.
    agent.stop().await;
    for _ in 0..3 {
        let agent = RunningAgent::start(real_config(&master, &dirs, &executor));
        tokio::time::sleep(Duration::from_millis(300)).await;
        agent.stop().await;
    }
    for pid in &pids {
        assert!(
            std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "task process {pid} survived agent restarts"
        );
    }
    let agent = RunningAgent::start(real_config(&master, &dirs, &executor));

    // Executor crash: LOST with ExecutorLost, what remained is killed.
    let pid = dirs.recorded_executor("real1").unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let lost = master.wait_for_state("real1", TaskState::Lost).await;
    assert_eq!(lost.exit_reason, Some(ExitReason::ExecutorLost));
    // Without isolation there is no cgroup for `cleanup` to empty: the test kills
    // what the crashed executor left behind itself.
    for pid in task_pids(&master, "real1") {
        // Each process leads its own session: kill the group (the shell and sleep).
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }

    // Everything else leaves the set: killed through the socket.
    master.assign(vec![]);
    for i in [0, 2, 3, 4, 5, 6] {
        master
            .wait_for_state(&format!("real{i}"), TaskState::Killed)
            .await;
    }
    for pid in &pids {
        let gone = wait_until(Duration::from_secs(20), || {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            (stat.is_empty() || stat.contains(") Z")).then_some(())
        })
        .await;
        assert!(gone.is_some(), "task process {pid} killed");
    }
    agent.stop().await;
}
