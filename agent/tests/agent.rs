//! The agent in-process against a fake master and a fake executor: registration,
//! heartbeats with the task digest, long-poll, status relay and acks, errant-task
//! kills, re-adoption across restarts, executor loss, the exclusive lease.

mod support;

use std::time::Duration;

use drover_agent::config::ConfigFile;
use drover_common::state::{DesiredState, ExitReason, TaskState};
use drover_common::wire::task_set_digest;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_assigned_tasks_relays_statuses_and_kills_errant_ones() {
    let master = FakeMaster::start().await;
    let dirs = AgentDirs::new();
    let _guard = KillExecutorsOnDrop(&dirs, vec!["t1"]);
    master.with(|s| s.ask_full_set = true);
    master.assign(vec![assignment("t1", "run")]);
    let agent = RunningAgent::start(config(&master, &dirs, ConfigFile::default()));

    let running = master.wait_for_state("t1", TaskState::Running).await;
    assert_eq!(running.seq, 2, "executor seqs are relayed as they are");
    let seqs: Vec<u64> = master.updates_for("t1").iter().map(|u| u.seq).collect();
    assert_eq!(seqs, vec![1, 2]);

    let reg = master.with(|s| s.registrations[0].clone());
    assert!(reg.address.starts_with("http://127.0.0.1:"));
    assert_eq!(reg.attributes.get("host"), Some(&reg.hostname));
    let addr = std::fs::read_to_string(dirs.data().join("agent.addr")).unwrap();
    assert_eq!(format!("http://{addr}"), reg.address);

    // Heartbeats carry the digest of the held tasks, and the full set when asked.
    let want = task_set_digest(["t1"]);
    let hb = wait_until(Duration::from_secs(10), || {
        master.with(|s| {
            s.heartbeats
                .iter()
                .find(|h| h.task_digest == want && h.tasks.is_some())
                .cloned()
        })
    })
    .await
    .expect("a heartbeat with t1's digest and the full set");
    assert_eq!(hb.tasks.unwrap()[0].task_id, "t1");

    // Logs of the task are served to the master only: with the key the agent sent
    // at registration.
    let url = format!("{}/v1/tasks/t1/logs/main/stdout", reg.address);
    let key = master
        .with(|s| s.logs_key.clone())
        .expect("a logs key at registration");
    let client = reqwest::Client::new();
    let log = client
        .get(&url)
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(log, "hello from t1\n");
    let refused = client.get(&url).send().await.unwrap().status().as_u16();
    assert_eq!(refused, 401);
    let wrong = client
        .get(&url)
        .bearer_auth("0".repeat(key.len()))
        .send()
        .await;
    assert_eq!(wrong.unwrap().status().as_u16(), 401);

    // A task the master wants stopped that never ran here is reported KILLED.
    let mut never = assignment("t9", "run");
    never.desired = DesiredState::Shutdown;
    // t1 left the set: an errant task.
    master.assign(vec![never]);
    let killed = master.wait_for_state("t1", TaskState::Killed).await;
    assert_eq!(killed.exit_reason, Some(ExitReason::KilledByRequest));
    let t9 = master.wait_for_state("t9", TaskState::Killed).await;
    assert_eq!(t9.seq, 1);
    assert!(
        dirs.spawns("t9").is_empty(),
        "a SHUTDOWN task is never started"
    );

    // Everything acknowledged leaves the outbox.
    assert!(
        wait_until(Duration::from_secs(10), || (dirs.outbox_files() == 0)
            .then_some(()))
        .await
        .is_some(),
        "outbox drained"
    );
    let seen = master.with(|s| s.heartbeats.len());
    let hb_after = wait_until(Duration::from_secs(10), || {
        master.with(|s| {
            s.heartbeats[seen..]
                .iter()
                .find(|h| h.task_digest == task_set_digest(std::iter::empty::<&str>()))
                .cloned()
        })
    })
    .await;
    assert!(hb_after.is_some(), "digest drops terminal tasks");
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_readopt_live_executors_and_never_start_a_second_copy() {
    let master = FakeMaster::start().await;
    let dirs = AgentDirs::new();
    let _guard = KillExecutorsOnDrop(&dirs, vec!["t1"]);
    master.assign(vec![assignment("t1", "run")]);
    let agent = RunningAgent::start(config(&master, &dirs, ConfigFile::default()));
    master.wait_for_state("t1", TaskState::Running).await;
    agent.stop().await;
    let pids = dirs.spawns("t1");
    assert_eq!(pids.len(), 1);

    for _ in 0..3 {
        let before = master.with(|s| s.registrations.len());
        let agent = RunningAgent::start(config(&master, &dirs, ConfigFile::default()));
        wait_until(Duration::from_secs(10), || {
            master.with(|s| (s.registrations.len() > before).then_some(()))
        })
        .await
        .expect("re-registered");
        // Give the restarted agent time to poll and converge.
        tokio::time::sleep(Duration::from_millis(300)).await;
        agent.stop().await;
    }
    assert_eq!(
        dirs.spawns("t1"),
        pids,
        "the same executor, never a second one"
    );
    let ids: Vec<String> =
        master.with(|s| s.registrations.iter().map(|r| r.agent_id.clone()).collect());
    assert!(
        ids.windows(2).all(|w| w[0] == w[1]),
        "stable agent id: {ids:?}"
    );

    // The re-adopted executor still takes orders.
    let agent = RunningAgent::start(config(&master, &dirs, ConfigFile::default()));
    master.assign(vec![]);
    master.wait_for_state("t1", TaskState::Killed).await;
    agent.stop().await;
    let states: Vec<TaskState> = master.updates_for("t1").iter().map(|u| u.state).collect();
    assert_eq!(
        states,
        vec![
            TaskState::Starting,
            TaskState::Running,
            TaskState::Killing,
            TaskState::Killed
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_ended_while_the_agent_was_down_is_reported_once_not_rerun() {
    let master = FakeMaster::start().await;
    let dirs = AgentDirs::new();
    let _guard = KillExecutorsOnDrop(&dirs, vec!["t1"]);
    master.assign(vec![assignment("t1", "exit-when-done")]);
    let agent = RunningAgent::start(config(&master, &dirs, ConfigFile::default()));
    master.wait_for_state("t1", TaskState::Running).await;
    agent.stop().await;

    // While the agent is away the task is stopped and its executor exits.
    let sock = dirs.drover("t1").join("executor.sock");
    let mut lines = drover_agent::executor::subscribe(&sock, 0).await.unwrap();
    drover_agent::executor::send_kill_on(&mut lines, ExitReason::KilledByRequest)
        .await
        .unwrap();
    let pid = dirs.spawns("t1")[0];
    wait_until(Duration::from_secs(10), || {
        (!std::path::Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map(|s| s.contains(") Z"))
                .unwrap_or(true))
        .then_some(())
    })
    .await
    .expect("executor exited");

    // Still assigned as RUNNING at the master: the agent must report, not rerun.
    let agent = RunningAgent::start(config(&master, &dirs, ConfigFile::default()));
    let killed = master.wait_for_state("t1", TaskState::Killed).await;
    assert_eq!(killed.seq, 4);
    tokio::time::sleep(Duration::from_millis(300)).await;
    agent.stop().await;
    assert_eq!(dirs.spawns("t1").len(), 1, "never rerun");
    let killed_reports = master
        .updates_for("t1")
        .iter()
        .filter(|u| u.state == TaskState::Killed)
        .count();
    assert_eq!(killed_reports, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_of_the_older_layout_is_not_believed_but_cleaned_up_and_lost() {
    let master = FakeMaster::start().await;
    let dirs = AgentDirs::new();
    // The task owned this directory: its FINISHED checkpoint may be forged.
    let old = dirs.sandboxes().join("old1");
    std::fs::create_dir_all(old.join(".drover")).unwrap();
    let forged = serde_json::json!({
        "seq": 9, "task_id": "old1", "state": "FINISHED", "exit_reason": null,
        "message": "forged", "timestamp_ms": 1, "executor_pid": 1, "processes": []
    });
    std::fs::write(old.join(".drover/status.json"), forged.to_string()).unwrap();
    let agent = RunningAgent::start(config(&master, &dirs, ConfigFile::default()));
    let lost = master.wait_for_state("old1", TaskState::Lost).await;
    assert_eq!(lost.exit_reason, Some(ExitReason::ExecutorLost));
    assert!(lost.message.contains("older"), "{}", lost.message);
    for _ in 0..100 {
        if !old.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!old.exists(), "the old sandbox is removed");
    agent.stop().await;
    assert!(master
        .updates_for("old1")
        .iter()
        .all(|u| u.state != TaskState::Finished));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_executor_is_cleaned_up_and_reported_lost() {
    let master = FakeMaster::start().await;
    let dirs = AgentDirs::new();
    let _guard = KillExecutorsOnDrop(&dirs, vec!["t1"]);
    master.assign(vec![assignment("t1", "run")]);
    let agent = RunningAgent::start(config(&master, &dirs, ConfigFile::default()));
    master.wait_for_state("t1", TaskState::Running).await;
    let pid = dirs.spawns("t1")[0];
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let lost = master.wait_for_state("t1", TaskState::Lost).await;
    assert_eq!(lost.exit_reason, Some(ExitReason::ExecutorLost));
    assert_eq!(lost.seq, 3, "last executor seq + 1");
    assert!(dirs.drover("t1").join("cleanups").exists(), "cleanup ran");
    agent.stop().await;

    // A restart does not decide again.
    let agent = RunningAgent::start(config(&master, &dirs, ConfigFile::default()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    agent.stop().await;
    let lost_reports = master
        .updates_for("t1")
        .iter()
        .filter(|u| u.state == TaskState::Lost)
        .count();
    assert_eq!(lost_reports, 1);
    assert_eq!(dirs.spawns("t1").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn updates_wait_in_the_outbox_until_the_master_acknowledges_them() {
    let master = FakeMaster::start().await;
    let dirs = AgentDirs::new();
    let _guard = KillExecutorsOnDrop(&dirs, vec!["t1"]);
    master.with(|s| s.fail_updates = true);
    master.assign(vec![assignment("t1", "run")]);
    let agent = RunningAgent::start(config(&master, &dirs, ConfigFile::default()));
    wait_until(Duration::from_secs(10), || {
        (dirs.outbox_files() > 0).then_some(())
    })
    .await
    .expect("updates written to the outbox");
    // The agent dies with its updates unacknowledged; they survive on disk.
    agent.stop().await;
    assert!(dirs.outbox_files() > 0);
    assert!(master.updates_for("t1").is_empty());

    master.with(|s| s.fail_updates = false);
    let agent = RunningAgent::start(config(&master, &dirs, ConfigFile::default()));
    master.wait_for_state("t1", TaskState::Running).await;
    assert!(
        wait_until(Duration::from_secs(10), || (dirs.outbox_files() == 0)
            .then_some(()))
        .await
        .is_some()
    );
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_the_master_refuses_is_dropped_and_the_others_still_go() {
    let master = FakeMaster::start().await;
    let dirs = AgentDirs::new();
    let _guard = KillExecutorsOnDrop(&dirs, vec!["bad", "good"]);
    // Both tasks' statuses wait in the outbox, to go in one batch.
    master.with(|s| s.fail_updates = true);
    master.assign(vec![assignment("bad", "run"), assignment("good", "run")]);
    let agent = RunningAgent::start(config(&master, &dirs, ConfigFile::default()));
    wait_until(Duration::from_secs(10), || {
        (dirs.outbox_files() > 0).then_some(())
    })
    .await
    .expect("updates written to the outbox");
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The master takes every update but those of `bad` (413 for any batch with one).
    master.with(|s| {
        s.refuse_task = Some("bad".into());
        s.fail_updates = false;
    });
    master.wait_for_state("good", TaskState::Running).await;
    assert!(master.updates_for("bad").is_empty());
    // Nothing stays behind: `bad`'s updates were dropped, not retried forever.
    assert!(
        wait_until(Duration::from_secs(10), || (dirs.outbox_files() == 0)
            .then_some(()))
        .await
        .is_some(),
        "the outbox drains"
    );
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_the_executor_cannot_complete_ends_the_task_with_why() {
    let master = FakeMaster::start().await;
    let dirs = AgentDirs::new();
    let _guard = KillExecutorsOnDrop(&dirs, vec!["stuck"]);
    let mut stuck = assignment("stuck", "stuck-kill");
    stuck.task.task.finalization_wait = serde_json::from_value(serde_json::json!("1s")).unwrap();
    master.assign(vec![stuck.clone()]);
    let mut cfg = config(&master, &dirs, ConfigFile::default());
    cfg.kill_slack = Duration::from_secs(1);
    let agent = RunningAgent::start(cfg);
    master.wait_for_state("stuck", TaskState::Running).await;
    // The master kills it; the executor goes KILLING and no further.
    stuck.desired = DesiredState::Shutdown;
    master.assign(vec![stuck]);
    master.wait_for_state("stuck", TaskState::Killing).await;
    let killed = master.wait_for_state("stuck", TaskState::Killed).await;
    assert_eq!(killed.exit_reason, Some(ExitReason::KilledByRequest));
    assert!(
        killed
            .message
            .contains("the executor did not end the task within 2s of the kill"),
        "{}",
        killed.message
    );
    assert!(
        dirs.drover("stuck").join("cleanups").exists(),
        "the agent ran the cleanup (the task's cgroup killed)"
    );
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusive_tasks_die_when_the_master_is_unreachable_past_the_lease() {
    let master = FakeMaster::start().await;
    let dirs = AgentDirs::new();
    let _guard = KillExecutorsOnDrop(&dirs, vec!["ex", "plain"]);
    let mut ex = assignment("ex", "run");
    ex.exclusive = true;
    master.assign(vec![ex, assignment("plain", "run")]);
    let extra = ConfigFile {
        lease: Some("1s".into()),
        ..ConfigFile::default()
    };
    let agent = RunningAgent::start(config(&master, &dirs, extra));
    master.wait_for_state("ex", TaskState::Running).await;
    master.wait_for_state("plain", TaskState::Running).await;
    master.with(|s| s.fail_heartbeats = true);
    let last_good = master.with(|s| s.last_good_heartbeat).unwrap();
    let killed = master.wait_for_state("ex", TaskState::Killed).await;
    assert!(
        last_good.elapsed() >= Duration::from_secs(1),
        "not before the lease"
    );
    assert_eq!(killed.exit_reason, Some(ExitReason::AgentLost));
    assert!(
        !master
            .updates_for("plain")
            .iter()
            .any(|u| u.state.is_terminal()),
        "non-exclusive tasks keep running"
    );
    agent.stop().await;
}

/// An agent config whose own `lease` is 10m: longer than `wait_for_state` waits, so
/// only a lease the master sends can kill a task in time.
fn agent_config_with_a_10m_lease(master: &FakeMaster, dirs: &AgentDirs) -> drover_agent::Config {
    let extra = ConfigFile {
        lease: Some("10m".into()),
        ..ConfigFile::default()
    };
    config(master, dirs, extra)
}

/// Starts such an agent with one exclusive task "ex" and waits until it runs.
async fn exclusive_task_under_a_1s_master_lease(
    master: &FakeMaster,
    dirs: &AgentDirs,
) -> RunningAgent {
    master.with(|s| s.exclusive_lease_ms = Some(1_000));
    let mut ex = assignment("ex", "run");
    ex.exclusive = true;
    master.assign(vec![ex]);
    let agent = RunningAgent::start(agent_config_with_a_10m_lease(master, dirs));
    master.wait_for_state("ex", TaskState::Running).await;
    agent
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_masters_exclusive_lease_wins_over_the_agents_own() {
    let master = FakeMaster::start().await;
    let dirs = AgentDirs::new();
    let _guard = KillExecutorsOnDrop(&dirs, vec!["ex"]);
    let agent = exclusive_task_under_a_1s_master_lease(&master, &dirs).await;
    assert_eq!(
        std::fs::read_to_string(dirs.data().join("master-lease")).unwrap(),
        "1000"
    );
    master.with(|s| s.fail_heartbeats = true);
    let last_good = master.with(|s| s.last_good_heartbeat).unwrap();
    let killed = master.wait_for_state("ex", TaskState::Killed).await;
    assert!(
        last_good.elapsed() >= Duration::from_secs(1),
        "not before the lease"
    );
    assert_eq!(killed.exit_reason, Some(ExitReason::AgentLost));
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_follows_the_interval_and_lease_of_each_heartbeat_answer() {
    let master = FakeMaster::start().await;
    let dirs = AgentDirs::new();
    let agent = RunningAgent::start(config(&master, &dirs, ConfigFile::default()));
    // Registered at 100 ms: heartbeats come fast.
    wait_until(Duration::from_secs(20), || {
        (master.with(|s| s.heartbeats.len()) >= 3).then_some(())
    })
    .await
    .expect("heartbeats at the registration's interval");
    master.with(|s| s.heartbeat_told = Some((800, 4_321)));
    let lease_file = dirs.data().join("master-lease");
    wait_until(Duration::from_secs(20), || {
        std::fs::read_to_string(&lease_file)
            .ok()
            .filter(|l| l == "4321")
    })
    .await
    .expect("the lease of the heartbeat answer recorded");
    let before = master.with(|s| s.heartbeats.len());
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    let during = master.with(|s| s.heartbeats.len()) - before;
    assert!(
        (1..=4).contains(&during),
        "{during} heartbeats in 2 s at an 800 ms interval (20 at the registration's 100 ms)"
    );
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_cut_off_from_the_master_keeps_the_masters_lease() {
    let master = FakeMaster::start().await;
    let dirs = AgentDirs::new();
    let _guard = KillExecutorsOnDrop(&dirs, vec!["ex"]);
    let agent = exclusive_task_under_a_1s_master_lease(&master, &dirs).await;
    agent.stop().await;

    // Back up while the master is unreachable: nothing to learn the lease from but
    // what the last run recorded.
    master.with(|s| {
        s.fail_registrations = true;
        s.fail_heartbeats = true;
    });
    let agent = RunningAgent::start(agent_config_with_a_10m_lease(&master, &dirs));
    let state = wait_until(Duration::from_secs(20), || {
        dirs.executor_state("ex").filter(|s| s == "KILLED")
    })
    .await;
    assert_eq!(
        state.as_deref(),
        Some("KILLED"),
        "killed past the master's lease"
    );
    assert_eq!(
        master.with(|s| s.registrations.len()),
        1,
        "cut off throughout"
    );
    master.with(|s| {
        s.fail_registrations = false;
        s.fail_heartbeats = false;
    });
    let killed = master.wait_for_state("ex", TaskState::Killed).await;
    assert_eq!(killed.exit_reason, Some(ExitReason::AgentLost));
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxes_of_finished_unassigned_tasks_are_removed_after_retention() {
    let master = FakeMaster::start().await;
    let dirs = AgentDirs::new();
    let _guard = KillExecutorsOnDrop(&dirs, vec!["done", "kept"]);
    master.assign(vec![
        assignment("done", "finish"),
        assignment("kept", "finish"),
    ]);
    let extra = ConfigFile {
        sandbox_retention: Some("1s".into()),
        ..ConfigFile::default()
    };
    let agent = RunningAgent::start(config(&master, &dirs, extra));
    master.wait_for_state("done", TaskState::Finished).await;
    master.wait_for_state("kept", TaskState::Finished).await;
    // "kept" stays in the set (the master still shows it); "done" leaves it.
    master.assign(vec![assignment("kept", "finish")]);
    let removed = wait_until(Duration::from_secs(20), || {
        (!dirs.sandboxes().join("done").exists()).then_some(())
    })
    .await;
    assert!(
        removed.is_some(),
        "sandbox of an unassigned terminal task removed"
    );
    assert!(
        dirs.sandboxes().join("kept").exists(),
        "an assigned task's sandbox stays"
    );
    assert_eq!(
        dirs.spawns("kept").len(),
        1,
        "a finished task is never rerun"
    );
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_that_forgot_the_agent_gets_it_registered_again() {
    let master = FakeMaster::start().await;
    let dirs = AgentDirs::new();
    let _guard = KillExecutorsOnDrop(&dirs, vec!["t1", "t2"]);
    master.assign(vec![assignment("t1", "run")]);
    let agent = RunningAgent::start(config(&master, &dirs, ConfigFile::default()));
    master.wait_for_state("t1", TaskState::Running).await;
    let seen = master.with(|s| {
        s.forgot_agent = true;
        s.heartbeats.len()
    });
    wait_until(Duration::from_secs(20), || {
        master.with(|s| (s.registrations.len() >= 2 && !s.forgot_agent).then_some(()))
    })
    .await
    .expect("registered again");
    // The first heartbeat after registering carries the full task set.
    let full = wait_until(Duration::from_secs(10), || {
        master.with(|s| s.heartbeats[seen..].iter().find_map(|h| h.tasks.clone()))
    })
    .await
    .unwrap();
    assert!(full
        .iter()
        .any(|t| t.task_id == "t1" && t.state == TaskState::Running));
    // Polling resumed: a new task starts, the old one keeps running.
    master.assign(vec![assignment("t1", "run"), assignment("t2", "run")]);
    master.wait_for_state("t2", TaskState::Running).await;
    assert_eq!(dirs.spawns("t1").len(), 1);
    assert!(!master
        .updates_for("t1")
        .iter()
        .any(|u| u.state.is_terminal()));
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_data_dir_keeps_the_id_and_readopts_from_the_sandbox_root() {
    let master = FakeMaster::start().await;
    let dirs = AgentDirs::new();
    let _guard = KillExecutorsOnDrop(&dirs, vec!["t1"]);
    master.assign(vec![assignment("t1", "run")]);
    let agent = RunningAgent::start(config(&master, &dirs, ConfigFile::default()));
    master.wait_for_state("t1", TaskState::Running).await;
    agent.stop().await;
    std::fs::remove_dir_all(dirs.data()).unwrap();

    let agent = RunningAgent::start(config(&master, &dirs, ConfigFile::default()));
    wait_until(Duration::from_secs(10), || {
        master.with(|s| (s.registrations.len() >= 2).then_some(()))
    })
    .await
    .expect("registered again");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let ids: Vec<String> =
        master.with(|s| s.registrations.iter().map(|r| r.agent_id.clone()).collect());
    assert_eq!(ids[0], ids[1], "the id survives in the sandbox root");
    assert_eq!(dirs.spawns("t1").len(), 1, "re-adopted, not restarted");
    assert!(!master
        .updates_for("t1")
        .iter()
        .any(|u| u.state.is_terminal()));
    // Still under control: a kill reaches it.
    master.assign(vec![]);
    master.wait_for_state("t1", TaskState::Killed).await;
    agent.stop().await;
}
