//! The executor fork server (`executor_fork_server`, on by default) in the in-process
//! agent: a SIGKILL'd fork server is replaced and the next task still runs, forked
//! by the new one; an executor binary without the `zygote` command (the fake one)
//! means every executor is exec'd instead. One agent per test binary, so that the
//! fork server is found as the one child of this process that is a zygote.

#![allow(clippy::unwrap_used)]

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use drover_agent::config::ConfigFile;
use drover_common::state::TaskState;
use support::*;

fn real_executor() -> Option<PathBuf> {
    // target/debug/deps/fork_server-<hash> -> target/debug/drover-executor
    let exe = std::env::current_exe().ok()?;
    let path = exe.parent()?.parent()?.join("drover-executor");
    path.is_file().then_some(path)
}

fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// Live (not zombie) children of this process running `drover-executor zygote`.
fn zygotes() -> Vec<u32> {
    let me = std::process::id().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let Some((_, rest)) = stat.rsplit_once(')') else {
                return false;
            };
            let fields: Vec<&str> = rest.split_whitespace().collect();
            fields.first() != Some(&"Z")
                && fields.get(1) == Some(&me.as_str())
                && cmdline(*pid).contains("drover-executor zygote")
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_fork_server_is_replaced_and_the_next_task_still_runs() {
    let Some(executor) = real_executor() else {
        eprintln!(
            "skipping: target/debug/drover-executor is not built (cargo build -p drover-executor)"
        );
        return;
    };
    let master = FakeMaster::start().await;
    let dirs = AgentDirs::new();
    let _guard = KillExecutorsOnDrop(&dirs, vec!["fs1", "fs2"]);
    let extra = ConfigFile {
        executor: Some(executor.clone()),
        no_isolation: Some(true),
        // The default; the shared test config turns it off for the fake executor.
        executor_fork_server: Some(true),
        ..ConfigFile::default()
    };
    let agent = RunningAgent::start(config(&master, &dirs, extra));
    let mut tasks = vec![assignment("fs1", "sleep 600")];
    tasks[0].task.task.user = Some("nobody".into());
    master.assign(tasks.clone());
    master.wait_for_state("fs1", TaskState::Running).await;
    let first = zygotes();
    assert_eq!(first.len(), 1, "one fork server: {first:?}");
    let executor_pid = dirs.recorded_executor("fs1").unwrap() as u32;
    assert!(
        cmdline(executor_pid).contains("zygote"),
        "fs1's executor was forked by the fork server: {}",
        cmdline(executor_pid)
    );

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first[0] as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let mut second = assignment("fs2", "sleep 600");
    second.task.task.user = Some("nobody".into());
    tasks.push(second);
    master.assign(tasks);
    master.wait_for_state("fs2", TaskState::Running).await;
    let now = zygotes();
    assert_eq!(now.len(), 1, "a new fork server: {now:?}");
    assert_ne!(now[0], first[0]);
    let executor_pid = dirs.recorded_executor("fs2").unwrap() as u32;
    assert!(
        cmdline(executor_pid).contains("zygote"),
        "fs2's executor was forked by the new fork server: {}",
        cmdline(executor_pid)
    );
    assert!(
        Path::new(&format!("/proc/{}", dirs.recorded_executor("fs1").unwrap())).exists(),
        "fs1's executor outlived its fork server"
    );

    master.assign(vec![]);
    for id in ["fs1", "fs2"] {
        master.wait_for_state(id, TaskState::Killed).await;
    }
    agent.stop().await;
    let gone = wait_until(Duration::from_secs(10), || {
        zygotes().is_empty().then_some(())
    })
    .await;
    assert!(gone.is_some(), "the fork server exits with the agent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_usable_fork_server_executors_are_execd() {
    let master = FakeMaster::start().await;
    let dirs = AgentDirs::new();
    let _guard = KillExecutorsOnDrop(&dirs, vec!["ex1"]);
    // The fake executor has no `zygote` command: the fork server never says ready.
    let extra = ConfigFile {
        executor_fork_server: Some(true),
        ..ConfigFile::default()
    };
    let agent = RunningAgent::start(config(&master, &dirs, extra));
    master.assign(vec![assignment("ex1", "finish")]);
    master.wait_for_state("ex1", TaskState::Finished).await;
    assert_eq!(dirs.spawns("ex1").len(), 1, "exec'd once");
    agent.stop().await;
}
