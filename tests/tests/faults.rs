//! Fault scenarios across real network boundaries (issue 5): agents in their own
//! network namespaces, cut off and healed with `ip link`, killed with SIGKILL, a master
//! killed mid-burst; the invariant checker of `drover_tests::netns` after each one.
//! Needs root, `ip` and `nsenter`; skips with a message otherwise. See docs/testing.md.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use drover_common::state::{now_ms, ExitReason, TaskState};
use drover_common::wire::TaskView;
use drover_tests::netns::{fault_job, key, netns_available, NetCluster, FAULT_MASTER_CONFIG};
use drover_tests::WAIT;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::json;

/// A service process that runs until killed.
const FOREVER: &str = "exec sleep 100000";

/// Settle time for the invariant checker.
const SETTLE: Duration = Duration::from_secs(40);

fn current(cluster: &NetCluster, job: &str) -> anyhow::Result<TaskView> {
    let view = cluster.job(job)?;
    view.instances
        .first()
        .and_then(|i| i.current.clone())
        .ok_or_else(|| anyhow::anyhow!("{job} has no current task"))
}

fn history_len(cluster: &NetCluster, job: &str) -> anyhow::Result<usize> {
    Ok(cluster
        .job(job)?
        .instances
        .first()
        .map(|i| i.history.len())
        .unwrap_or(0))
}

fn count_state(task: &TaskView, state: TaskState) -> usize {
    task.events.iter().filter(|e| e.state == state).count()
}

#[test]
fn agent_cut_off_past_the_timeout_is_replaced_and_its_errant_copies_die_on_heal() {
    if !netns_available("agent_cut_off_past_the_timeout") {
        return;
    }
    let mut c = NetCluster::start_some(2, 1, FAULT_MASTER_CONFIG).unwrap();
    let moved = key("moved");
    let stays = key("stays");
    c.create_job(&fault_job("moved", 1, true, FOREVER, json!({})))
        .unwrap();
    c.create_job(&fault_job(
        "stays",
        1,
        true,
        FOREVER,
        json!({"reschedule": false}),
    ))
    .unwrap();
    let old_moved = c.wait_for_state(&moved, 0, TaskState::Running).unwrap();
    let old_stays = c.wait_for_state(&stays, 0, TaskState::Running).unwrap();
    let agent0 = c.agent_id(0).unwrap();
    assert_eq!(old_moved.agent_id.as_deref(), Some(agent0.as_str()));
    assert_eq!(old_stays.agent_id.as_deref(), Some(agent0.as_str()));
    let stays_pids = c.task_pids(&old_stays.task_id);
    assert!(!stays_pids.is_empty());
    c.start_agent(1).unwrap();
    c.wait_reachable(1).unwrap();
    let agent1 = c.agent_id(1).unwrap();

    let cut_at = Instant::now();
    c.ns(0).cut().unwrap();
    let replacement = c
        .wait_for("moved/0 RUNNING on agent 1", WAIT, |c| {
            let t = current(c, &moved).ok()?;
            (t.task_id != old_moved.task_id
                && t.state == TaskState::Running
                && t.agent_id.as_deref() == Some(agent1.as_str()))
            .then_some(t)
        })
        .unwrap();
    let replaced_after = cut_at.elapsed();
    println!(
        "MEASURE agent loss -> replacement RUNNING elsewhere (agent_timeout 5s): {:.2}s",
        replaced_after.as_secs_f64()
    );
    let lost = c.task(&old_moved.task_id).unwrap();
    assert_eq!(lost.state, TaskState::Lost);
    assert_eq!(lost.exit_reason, Some(ExitReason::AgentLost));
    // The master keeps expecting the reschedule:false task.
    let s = c.task(&old_stays.task_id).unwrap();
    assert!(!s.state.is_terminal(), "stays became {}", s.state);
    // The errant copy still runs on the partitioned agent until it hears the master.
    assert!(!c.task_pids(&old_moved.task_id).is_empty());

    c.ns(0).heal().unwrap();
    c.wait_for("the errant copy on agent 0 to be killed", WAIT, |c| {
        c.task_pids(&old_moved.task_id).is_empty().then_some(())
    })
    .unwrap();
    c.wait_reachable(0).unwrap();
    let s = c.wait_for_state(&stays, 0, TaskState::Running).unwrap();
    assert_eq!(s.task_id, old_stays.task_id, "stays was replaced");
    assert_eq!(
        c.task_pids(&old_stays.task_id),
        stays_pids,
        "stays was restarted"
    );
    assert_eq!(history_len(&c, &stays).unwrap(), 0);
    assert_eq!(
        current(&c, &moved).unwrap().task_id,
        replacement.task_id,
        "moved was replaced twice"
    );
    c.check_invariants(&[moved, stays], SETTLE).unwrap();
}

#[test]
fn agent_cut_off_shorter_than_the_timeout_loses_nothing() {
    if !netns_available("agent_cut_off_shorter_than_the_timeout") {
        return;
    }
    let mut c = NetCluster::start(2, FAULT_MASTER_CONFIG).unwrap();
    let job = key("blip");
    c.create_job(&fault_job("blip", 2, true, FOREVER, json!({})))
        .unwrap();
    c.wait_for("both instances RUNNING", WAIT, |c| {
        let view = c.job(&job).ok()?;
        view.instances
            .iter()
            .all(|i| {
                i.current
                    .as_ref()
                    .is_some_and(|t| t.state == TaskState::Running)
            })
            .then_some(())
    })
    .unwrap();
    let before = c.job(&job).unwrap();
    let ids: Vec<String> = before
        .instances
        .iter()
        .map(|i| i.current.as_ref().unwrap().task_id.clone())
        .collect();
    let pids: Vec<Vec<u32>> = ids.iter().map(|id| c.task_pids(id)).collect();
    for k in 0..2 {
        c.ns(k).cut().unwrap();
    }
    std::thread::sleep(Duration::from_secs(2));
    for k in 0..2 {
        c.ns(k).heal().unwrap();
    }
    // Longer than the timeout would have been, counted from the cut.
    std::thread::sleep(Duration::from_secs(6));
    let after = c.job(&job).unwrap();
    for (n, instance) in after.instances.iter().enumerate() {
        let t = instance.current.as_ref().unwrap();
        assert_eq!(t.task_id, ids[n], "instance {n} was replaced");
        assert_eq!(t.state, TaskState::Running);
        assert!(instance.history.is_empty(), "instance {n} has history");
        assert_eq!(c.task_pids(&ids[n]), pids[n], "instance {n} restarted");
    }
    assert!(c.agents().unwrap().iter().all(|a| a.reachable));
    c.check_invariants(&[job], SETTLE).unwrap();
}

#[test]
fn reconciliation_kills_a_task_the_master_does_not_know() {
    if !netns_available("reconciliation_kills_a_task_the_master_does_not_know") {
        return;
    }
    let mut c = NetCluster::start(1, FAULT_MASTER_CONFIG).unwrap();
    let known = key("known");
    c.create_job(&fault_job("known", 1, true, FOREVER, json!({})))
        .unwrap();
    let known_task = c.wait_for_state(&known, 0, TaskState::Running).unwrap();
    // Back up the master's store, then create a job the backup does not have.
    c.stop_master(Duration::from_secs(10));
    let master_dir = c.dir().join("master");
    let backup = c.dir().join("backup");
    std::fs::create_dir_all(&backup).unwrap();
    let db_files = ["drover.db", "drover.db-wal", "drover.db-shm"];
    for f in db_files {
        if master_dir.join(f).exists() {
            std::fs::copy(master_dir.join(f), backup.join(f)).unwrap();
        }
    }
    c.start_master_again().unwrap();
    let ghost = key("ghost");
    c.create_job(&fault_job("ghost", 1, true, FOREVER, json!({})))
        .unwrap();
    let ghost_task = c.wait_for_state(&ghost, 0, TaskState::Running).unwrap();
    assert!(!c.task_pids(&ghost_task.task_id).is_empty());
    // The master comes back from the backup: it never heard of `ghost`.
    c.stop_master(Duration::from_secs(10));
    for f in db_files {
        let _ = std::fs::remove_file(master_dir.join(f));
        if backup.join(f).exists() {
            std::fs::copy(backup.join(f), master_dir.join(f)).unwrap();
        }
    }
    c.start_master_again().unwrap();
    assert!(c
        .get_opt::<TaskView>(&format!("/v1/tasks/{}", ghost_task.task_id))
        .unwrap()
        .is_none());
    c.wait_for("the unknown task to be killed on the agent", WAIT, |c| {
        c.task_pids(&ghost_task.task_id).is_empty().then_some(())
    })
    .unwrap();
    let k = c.wait_for_state(&known, 0, TaskState::Running).unwrap();
    assert_eq!(k.task_id, known_task.task_id, "the known task was replaced");
    c.check_invariants(&[known], SETTLE).unwrap();
}

#[test]
fn reconciliation_replaces_a_task_the_agent_no_longer_has() {
    if !netns_available("reconciliation_replaces_a_task_the_agent_no_longer_has") {
        return;
    }
    let mut c = NetCluster::start(1, FAULT_MASTER_CONFIG).unwrap();
    let job = key("vanish");
    c.create_job(&fault_job("vanish", 1, true, FOREVER, json!({})))
        .unwrap();
    let old = c.wait_for_state(&job, 0, TaskState::Running).unwrap();
    // Behind the agent's back: the agent is down, the executor, its task and its
    // sandbox disappear; the agent starts with no trace of the task.
    c.kill_agent(0);
    let executor = c.executor_pid(&old.task_id).expect("executor pid");
    let _ = kill(Pid::from_raw(executor as i32), Signal::SIGKILL);
    for pid in c.task_pids(&old.task_id) {
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
    }
    let sandbox = c.sandbox_of(&old.task_id).unwrap();
    std::fs::remove_dir_all(&sandbox).unwrap();
    c.start_agent(0).unwrap();
    let replacement = c
        .wait_for("a replacement RUNNING", WAIT, |c| {
            let t = current(c, &job).ok()?;
            (t.task_id != old.task_id && t.state == TaskState::Running).then_some(t)
        })
        .unwrap();
    let lost = c.task(&old.task_id).unwrap();
    assert_eq!(lost.state, TaskState::Lost, "{lost:?}");
    assert!(!replacement.task_id.is_empty());
    c.check_invariants(&[job], SETTLE).unwrap();
}

#[test]
fn agent_killed_ten_times_keeps_its_tasks_and_reports_a_finish_once() {
    if !netns_available("agent_killed_ten_times") {
        return;
    }
    let mut c = NetCluster::start(1, FAULT_MASTER_CONFIG).unwrap();
    let steady = key("steady");
    let short = key("short");
    c.create_job(&fault_job("steady", 1, true, FOREVER, json!({})))
        .unwrap();
    c.create_job(&fault_job(
        "short",
        1,
        false,
        "echo ran >> runs.txt; sleep 4",
        json!({}),
    ))
    .unwrap();
    let steady_task = c.wait_for_state(&steady, 0, TaskState::Running).unwrap();
    let short_task = c.wait_for_state(&short, 0, TaskState::Running).unwrap();
    let executor = c.executor_pid(&steady_task.task_id).unwrap();
    let pids = c.task_pids(&steady_task.task_id);
    assert!(!pids.is_empty());
    let short_sandbox = c.sandbox_of(&short_task.task_id).unwrap();
    for round in 0..10 {
        c.kill_agent(0);
        if round == 0 {
            // The batch task finishes while the agent is down.
            c.wait_for("short to finish behind the agent's back", WAIT, |c| {
                let status = std::fs::read_to_string(short_sandbox.join("status.json")).ok()?;
                (status.contains("FINISHED") && c.task_pids(&short_task.task_id).is_empty())
                    .then_some(())
            })
            .unwrap();
        } else {
            std::thread::sleep(Duration::from_millis(300));
        }
        c.start_agent(0).unwrap();
        std::thread::sleep(Duration::from_millis(700));
    }
    c.wait_reachable(0).unwrap();
    let s = c.wait_for_state(&short, 0, TaskState::Finished).unwrap();
    assert_eq!(s.task_id, short_task.task_id);
    assert_eq!(count_state(&s, TaskState::Finished), 1);
    assert_eq!(history_len(&c, &short).unwrap(), 0, "short ran again");
    let runs = std::fs::read_to_string(short_sandbox.join("sandbox/runs.txt")).unwrap();
    assert_eq!(runs.lines().count(), 1, "short ran {runs:?}");
    let t = c.wait_for_state(&steady, 0, TaskState::Running).unwrap();
    assert_eq!(t.task_id, steady_task.task_id);
    assert_eq!(
        c.executor_pid(&t.task_id),
        Some(executor),
        "executor replaced"
    );
    assert_eq!(c.task_pids(&t.task_id), pids, "task restarted");
    assert_eq!(count_state(&t, TaskState::Running), 1);

    // The agent's state dir is lost: it adopts the executors from its sandbox root.
    c.kill_agent(0);
    std::fs::remove_dir_all(&c.agent(0).data_dir).unwrap();
    c.start_agent(0).unwrap();
    c.wait_reachable(0).unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let t = c.wait_for_state(&steady, 0, TaskState::Running).unwrap();
    assert_eq!(t.task_id, steady_task.task_id);
    assert_eq!(
        c.executor_pid(&t.task_id),
        Some(executor),
        "executor replaced"
    );
    assert_eq!(c.task_pids(&t.task_id), pids, "task restarted");
    assert_eq!(history_len(&c, &steady).unwrap(), 0);
    let s = c.task(&short_task.task_id).unwrap();
    assert_eq!(count_state(&s, TaskState::Finished), 1);
    c.check_invariants(&[steady, short], SETTLE).unwrap();
}

/// One agent running a one-instance service `name` whose task forks a grandchild in
/// its own session (only the cgroup finds it); returns once both processes are in
/// the task's cgroup, with the job key and the running task.
fn service_with_a_grandchild(name: &str) -> anyhow::Result<(NetCluster, String, TaskView)> {
    let mut c = NetCluster::start(1, FAULT_MASTER_CONFIG)?;
    let job = key(name);
    c.create_job(&fault_job(
        name,
        1,
        true,
        "setsid sleep 100000 & exec sleep 100000",
        json!({}),
    ))?;
    let old = c.wait_for_state(&job, 0, TaskState::Running)?;
    c.wait_for("two processes in the task cgroup", WAIT, |c| {
        (c.task_pids(&old.task_id).len() >= 2).then_some(())
    })?;
    Ok((c, job, old))
}

/// Waits for `old` (whose executor died) to end LOST (`executor_lost`) with nothing
/// left in its cgroup and a replacement RUNNING, then checks the invariants.
fn lost_cleaned_and_replaced(
    c: &mut NetCluster,
    job: String,
    old: &TaskView,
) -> anyhow::Result<()> {
    let lost = c.wait_for("the task to be LOST", WAIT, |c| {
        let t = c.task(&old.task_id).ok()?;
        t.state.is_terminal().then_some(t)
    })?;
    assert_eq!(lost.state, TaskState::Lost);
    assert_eq!(lost.exit_reason, Some(ExitReason::ExecutorLost));
    assert!(c.task_pids(&old.task_id).is_empty(), "processes left");
    c.wait_for("a replacement RUNNING", WAIT, |c| {
        let t = current(c, &job).ok()?;
        (t.task_id != old.task_id && t.state == TaskState::Running).then_some(())
    })?;
    c.check_invariants(&[job], SETTLE)
}

#[test]
fn executor_killed_makes_its_task_lost_cleaned_and_replaced() {
    if !netns_available("executor_killed") {
        return;
    }
    let (mut c, job, old) = service_with_a_grandchild("crashy").unwrap();
    let executor = c.executor_pid(&old.task_id).unwrap();
    kill(Pid::from_raw(executor as i32), Signal::SIGKILL).unwrap();
    lost_cleaned_and_replaced(&mut c, job, &old).unwrap();
}

#[test]
fn master_killed_during_a_burst_of_200_submissions_keeps_every_acknowledged_job() {
    if !netns_available("master_killed_during_a_burst") {
        return;
    }
    let mut c = NetCluster::start(2, FAULT_MASTER_CONFIG).unwrap();
    let acked = Arc::new(Mutex::new(Vec::<String>::new()));
    let next = Arc::new(AtomicUsize::new(0));
    let url = c.url.clone();
    let token = c.token.clone().unwrap_or_default();
    let http = c.http();
    let mut threads = Vec::new();
    for _ in 0..4 {
        let (acked, next, url, token, http) = (
            acked.clone(),
            next.clone(),
            url.clone(),
            token.clone(),
            http.clone(),
        );
        threads.push(std::thread::spawn(move || {
            let http = http.clone();
            loop {
                let n = next.fetch_add(1, Ordering::SeqCst);
                if n >= 200 {
                    return;
                }
                let name = format!("burst{n}");
                let spec = fault_job(&name, 1, false, FOREVER, json!({}));
                let ok = http
                    .post(format!("{url}/v1/jobs"))
                    .bearer_auth(&token)
                    .json(&spec)
                    .send()
                    .is_ok_and(|r| r.status().is_success());
                if ok {
                    acked.lock().unwrap().push(key(&name));
                }
            }
        }));
    }
    while acked.lock().unwrap().len() < 60 {
        std::thread::sleep(Duration::from_millis(5));
    }
    c.kill_master();
    let killed_at_ms = now_ms();
    for t in threads {
        t.join().unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    println!(
        "{} of 200 submissions acknowledged before/around the kill",
        acked.len()
    );
    let restart = Instant::now();
    c.start_master_again().unwrap();
    println!(
        "MEASURE master restart (kill -9, {} jobs) -> serving: {:.2}s",
        acked.len(),
        restart.elapsed().as_secs_f64()
    );
    let keys: BTreeSet<String> = c.job_keys().unwrap().into_iter().collect();
    for k in &acked {
        assert!(keys.contains(k), "acknowledged {k} is missing");
    }
    // During the restart grace nothing is killed or replaced.
    let mut bad = Vec::new();
    while restart.elapsed() < Duration::from_secs(9) {
        for k in &keys {
            let view = c.job(k).unwrap();
            for i in &view.instances {
                let live = i
                    .current
                    .iter()
                    .chain(i.history.iter())
                    .filter(|t| !t.state.is_terminal())
                    .count();
                if live > 1 {
                    bad.push(format!("{k}/{} has {live} live tasks", i.instance));
                }
                for t in i.current.iter().chain(i.history.iter()) {
                    for e in &t.events {
                        if e.timestamp_ms > killed_at_ms
                            && matches!(
                                e.state,
                                TaskState::Lost | TaskState::Killed | TaskState::Killing
                            )
                        {
                            bad.push(format!(
                                "{} became {} after the restart",
                                t.task_id, e.state
                            ));
                        }
                    }
                }
            }
        }
        if !bad.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(bad.is_empty(), "{bad:?}\n{}", c.diagnostics());
    c.check_invariants(&acked, SETTLE).unwrap();
}

/// Two agents: an exclusive service `name` runs on agent 0 (the only one up when it
/// is placed), agent 1 joins, then agent 0 is cut off. Returns the cluster, the job
/// key, the task on agent 0 and when the cut began.
fn exclusive_on_agent_0_then_cut(
    name: &str,
) -> anyhow::Result<(NetCluster, String, TaskView, Instant)> {
    let mut c = NetCluster::start_some(2, 1, FAULT_MASTER_CONFIG)?;
    let job = key(name);
    c.create_job(&fault_job(
        name,
        1,
        true,
        FOREVER,
        json!({"exclusive": true}),
    ))?;
    let old = c.wait_for_state(&job, 0, TaskState::Running)?;
    c.start_agent(1)?;
    c.wait_reachable(1)?;
    let cut_at = Instant::now();
    c.ns(0).cut()?;
    Ok((c, job, old, cut_at))
}

#[test]
fn exclusive_task_never_runs_twice_across_a_partition() {
    if !netns_available("exclusive_task_never_runs_twice") {
        return;
    }
    let (mut c, job, old, cut_at) = exclusive_on_agent_0_then_cut("solo").unwrap();
    let (old_gone, replaced) = watch_exclusive(&mut c, &job, &old.task_id, cut_at).unwrap();
    println!(
        "MEASURE exclusive: partitioned copy killed {:.2}s after the cut, replacement RUNNING {:.2}s after",
        old_gone.as_secs_f64(),
        replaced.as_secs_f64()
    );
    assert!(old_gone < replaced);
    // lease 4s + kill time (finalization 1s + 5s) after the last heartbeat.
    assert!(
        replaced >= Duration::from_secs(9),
        "replaced after {replaced:?}"
    );
    c.ns(0).heal().unwrap();
    c.wait_reachable(0).unwrap();
    c.check_invariants(&[job], SETTLE).unwrap();
}

/// One agent; a batch job `name` (`reschedule: false`) that writes `runs.txt` and
/// ends after 2 s; once it runs the agent is cut off, and this returns when the
/// task has FINISHED there (its update still waiting in the outbox), with the job
/// key, the task as it ran, its sandbox and when the cut began.
fn finish_while_cut_off(
    name: &str,
) -> anyhow::Result<(NetCluster, String, TaskView, PathBuf, Instant)> {
    let mut c = NetCluster::start(1, FAULT_MASTER_CONFIG)?;
    let job = key(name);
    c.create_job(&fault_job(
        name,
        1,
        false,
        "echo ran >> runs.txt; sleep 2",
        json!({"reschedule": false}),
    ))?;
    let task = c.wait_for_state(&job, 0, TaskState::Running)?;
    let cut_at = Instant::now();
    c.ns(0).cut()?;
    let sandbox = c
        .sandbox_of(&task.task_id)
        .ok_or_else(|| anyhow::anyhow!("no sandbox for {}", task.task_id))?;
    c.wait_for("the task to finish on the cut-off agent", WAIT, |_| {
        let status = std::fs::read_to_string(sandbox.join("status.json")).ok()?;
        status.contains("FINISHED").then_some(())
    })?;
    Ok((c, job, task, sandbox, cut_at))
}

#[test]
fn finished_update_sent_during_a_partition_arrives_exactly_once() {
    if !netns_available("finished_update_sent_during_a_partition") {
        return;
    }
    let (mut c, job, task, sandbox, cut_at) = finish_while_cut_off("ends").unwrap();
    // Stay cut past the agent timeout: the update waits in the outbox.
    while cut_at.elapsed() < Duration::from_secs(8) {
        std::thread::sleep(Duration::from_millis(200));
    }
    let during = c.task(&task.task_id).unwrap();
    assert_eq!(during.state, TaskState::Running, "{during:?}");
    assert!(!c.agents().unwrap()[0].reachable);
    c.ns(0).heal().unwrap();
    let t = c.wait_for_state(&job, 0, TaskState::Finished).unwrap();
    assert_eq!(t.task_id, task.task_id);
    // Give a duplicate time to arrive.
    std::thread::sleep(Duration::from_secs(3));
    let t = c.task(&task.task_id).unwrap();
    assert_eq!(count_state(&t, TaskState::Finished), 1, "{t:?}");
    assert_eq!(history_len(&c, &job).unwrap(), 0, "the task ran again");
    let runs = std::fs::read_to_string(sandbox.join("sandbox/runs.txt")).unwrap();
    assert_eq!(runs.lines().count(), 1);
    let outbox = c.agent(0).data_dir.join("outbox");
    c.wait_for("the outbox to drain", WAIT, |_| {
        let pending = std::fs::read_dir(&outbox)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_name() != "acked.json")
                    .count()
            })
            .unwrap_or(0);
        (pending == 0).then_some(())
    })
    .unwrap();
    c.check_invariants(&[job], SETTLE).unwrap();
}

/// Samples both sides every 100 ms from `cut_at` until the exclusive job's instance 0
/// has a replacement RUNNING: the master never shows two RUNNING copies and the task
/// cgroups never hold processes of two copies. Returns when the partitioned copy's
/// processes were gone and when the replacement was RUNNING, both since `cut_at`.
fn watch_exclusive(
    c: &mut NetCluster,
    job: &str,
    old: &str,
    cut_at: Instant,
) -> anyhow::Result<(Duration, Duration)> {
    let mut old_gone: Option<Duration> = None;
    let mut replaced: Option<Duration> = None;
    let mut ids: BTreeSet<String> = BTreeSet::from([old.to_string()]);
    while cut_at.elapsed() < Duration::from_secs(60) && replaced.is_none() {
        let view = c.job(job)?;
        let mut running = 0;
        for i in &view.instances {
            for t in i.current.iter().chain(i.history.iter()) {
                ids.insert(t.task_id.clone());
                if t.state == TaskState::Running {
                    running += 1;
                    if t.task_id != old && replaced.is_none() {
                        replaced = Some(cut_at.elapsed());
                    }
                }
            }
        }
        let cgroups = c.task_cgroups();
        let live: Vec<&String> = ids
            .iter()
            .filter(|id| cgroups.get(*id).is_some_and(|p| !p.is_empty()))
            .collect();
        anyhow::ensure!(running <= 1, "the master shows {running} RUNNING copies");
        anyhow::ensure!(live.len() <= 1, "two copies run at once: {live:?}");
        if old_gone.is_none() && !live.iter().any(|id| id.as_str() == old) {
            old_gone = Some(cut_at.elapsed());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let Some(old_gone) = old_gone else {
        anyhow::bail!("the partitioned agent never killed its exclusive task");
    };
    let Some(replaced) = replaced else {
        anyhow::bail!("the exclusive task was never replaced\n{}", c.diagnostics());
    };
    Ok((old_gone, replaced))
}

#[test]
fn exclusive_lease_keeps_counting_across_an_agent_restart_during_a_partition() {
    if !netns_available("exclusive_lease_keeps_counting_across_an_agent_restart") {
        return;
    }
    let (mut c, job, old, cut_at) = exclusive_on_agent_0_then_cut("solo2").unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    // Restarted while still cut off: the lease counts from the last contact it
    // recorded, not from its own start.
    c.kill_agent(0);
    c.start_agent(0).unwrap();
    let (old_gone, replaced) = watch_exclusive(&mut c, &job, &old.task_id, cut_at).unwrap();
    println!(
        "MEASURE exclusive across an agent restart: killed {:.2}s, replaced {:.2}s after the cut",
        old_gone.as_secs_f64(),
        replaced.as_secs_f64()
    );
    assert!(
        old_gone < Duration::from_secs(8),
        "killed only after {old_gone:?}"
    );
    assert!(old_gone < replaced);
    c.ns(0).heal().unwrap();
    c.wait_reachable(0).unwrap();
    c.check_invariants(&[job], SETTLE).unwrap();
}

#[test]
fn finished_update_survives_an_agent_restart_during_a_partition() {
    if !netns_available("finished_update_survives_an_agent_restart") {
        return;
    }
    let (mut c, job, task, sandbox, cut_at) = finish_while_cut_off("ends2").unwrap();
    std::thread::sleep(Duration::from_millis(500));
    // The update sits in the outbox; the agent dies and comes back, still cut off.
    for _ in 0..3 {
        c.kill_agent(0);
        c.start_agent(0).unwrap();
        std::thread::sleep(Duration::from_millis(500));
    }
    while cut_at.elapsed() < Duration::from_secs(8) {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(c.task(&task.task_id).unwrap().state, TaskState::Running);
    c.ns(0).heal().unwrap();
    let t = c.wait_for_state(&job, 0, TaskState::Finished).unwrap();
    assert_eq!(t.task_id, task.task_id);
    std::thread::sleep(Duration::from_secs(3));
    let t = c.task(&task.task_id).unwrap();
    assert_eq!(count_state(&t, TaskState::Finished), 1, "{t:?}");
    assert_eq!(
        t.exit_reason,
        Some(ExitReason::ExitCode { code: 0 }),
        "{t:?}"
    );
    assert_eq!(history_len(&c, &job).unwrap(), 0, "the task ran again");
    let runs = std::fs::read_to_string(sandbox.join("sandbox/runs.txt")).unwrap();
    assert_eq!(runs.lines().count(), 1);
    c.check_invariants(&[job], SETTLE).unwrap();
}

#[test]
fn master_restarted_while_an_agent_is_cut_off_replaces_nothing_before_the_grace() {
    if !netns_available("master_restarted_while_an_agent_is_cut_off") {
        return;
    }
    let mut c = NetCluster::start_some(2, 1, FAULT_MASTER_CONFIG).unwrap();
    let job = key("waits");
    c.create_job(&fault_job("waits", 1, true, FOREVER, json!({})))
        .unwrap();
    let old = c.wait_for_state(&job, 0, TaskState::Running).unwrap();
    c.start_agent(1).unwrap();
    c.wait_reachable(1).unwrap();
    c.ns(0).cut().unwrap();
    c.kill_master();
    // Counted from before the start, so a slow start never shortens the grace seen.
    let restarted = Instant::now();
    c.start_master_again().unwrap();
    let replacement = c
        .wait_for("a replacement RUNNING after the grace", WAIT, |c| {
            let t = current(c, &job).ok()?;
            (t.task_id != old.task_id && t.state == TaskState::Running).then_some(t)
        })
        .unwrap();
    let after = restarted.elapsed();
    println!(
        "MEASURE master restart with a cut-off agent: replaced {:.2}s after the restart (restart_grace 10s)",
        after.as_secs_f64()
    );
    assert!(
        after >= Duration::from_millis(9500),
        "replaced during the grace: {after:?}"
    );
    assert_ne!(replacement.agent_id, old.agent_id);
    c.ns(0).heal().unwrap();
    c.wait_for("the errant copy to be killed", WAIT, |c| {
        c.task_pids(&old.task_id).is_empty().then_some(())
    })
    .unwrap();
    c.check_invariants(&[job], SETTLE).unwrap();
}

#[test]
fn exclusive_task_placed_on_an_agent_just_cut_off_never_runs_twice_after_the_heal() {
    if !netns_available("exclusive_task_placed_on_an_agent_just_cut_off") {
        return;
    }
    let mut c = NetCluster::start_some(2, 1, FAULT_MASTER_CONFIG).unwrap();
    // The master still thinks agent 0 is fine: it places the task there, and the
    // assignment set it answers agent 0's long poll with is stuck in the network.
    let cut_at = Instant::now();
    c.ns(0).cut().unwrap();
    let job = key("late");
    c.create_job(&fault_job(
        "late",
        1,
        true,
        FOREVER,
        json!({"exclusive": true}),
    ))
    .unwrap();
    let first = current(&c, &job).unwrap();
    assert_eq!(first.agent_id, Some(c.agent_id(0).unwrap()));
    c.start_agent(1).unwrap();
    c.wait_reachable(1).unwrap();
    let (_, replaced) = watch_exclusive(&mut c, &job, &first.task_id, cut_at).unwrap();
    println!(
        "MEASURE exclusive placed during a cut: replaced {:.2}s after",
        replaced.as_secs_f64()
    );
    c.ns(0).heal().unwrap();
    // After the heal, stale answers may reach agent 0: it must never run a copy.
    let healed = Instant::now();
    let mut ids: BTreeSet<String> = BTreeSet::new();
    while healed.elapsed() < Duration::from_secs(15) {
        if let Ok(view) = c.job(&job) {
            for i in &view.instances {
                for t in i.current.iter().chain(i.history.iter()) {
                    ids.insert(t.task_id.clone());
                }
            }
        }
        let cgroups = c.task_cgroups();
        let live: Vec<&String> = ids
            .iter()
            .filter(|id| cgroups.get(*id).is_some_and(|p| !p.is_empty()))
            .collect();
        assert!(
            live.len() <= 1,
            "two copies run at once after the heal: {live:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(c.task_pids(&first.task_id).is_empty());
    // The copy was replaced before agent 0 could hear of it: it never started it
    // (a start creates the sandbox), not even for a moment.
    let late_sandbox = c.agent(0).sandbox_root.join(&first.task_id);
    assert!(
        !late_sandbox.exists(),
        "agent 0 started the replaced exclusive task after the heal\n{}",
        c.diagnostics()
    );
    c.check_invariants(&[job], SETTLE).unwrap();
}

#[test]
fn partition_delay_keeps_a_task_through_a_cut_that_heals_before_it_ends() {
    if !netns_available("partition_delay_keeps_a_task") {
        return;
    }
    let mut c = NetCluster::start_some(2, 1, FAULT_MASTER_CONFIG).unwrap();
    let patient = key("patient");
    let eager = key("eager");
    c.create_job(&fault_job(
        "patient",
        1,
        true,
        FOREVER,
        json!({"delay": "10s"}),
    ))
    .unwrap();
    c.create_job(&fault_job("eager", 1, true, FOREVER, json!({})))
        .unwrap();
    let patient_task = c.wait_for_state(&patient, 0, TaskState::Running).unwrap();
    let eager_task = c.wait_for_state(&eager, 0, TaskState::Running).unwrap();
    let patient_pids = c.task_pids(&patient_task.task_id);
    c.start_agent(1).unwrap();
    c.wait_reachable(1).unwrap();
    let cut_at = Instant::now();
    c.ns(0).cut().unwrap();
    // Past the agent timeout: the eager task is LOST, the patient one waits out its
    // delay (agent_timeout 5 s + delay 10 s).
    c.wait_for("eager to be LOST", WAIT, |c| {
        let t = c.task(&eager_task.task_id).ok()?;
        (t.state == TaskState::Lost).then_some(())
    })
    .unwrap();
    while cut_at.elapsed() < Duration::from_secs(7) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        cut_at.elapsed() < Duration::from_secs(14),
        "too slow to test the delay window"
    );
    let p = c.task(&patient_task.task_id).unwrap();
    assert!(!p.state.is_terminal(), "patient became {}", p.state);
    c.ns(0).heal().unwrap();
    c.wait_reachable(0).unwrap();
    c.wait_for("eager to be replaced", WAIT, |c| {
        let t = current(c, &eager).ok()?;
        (t.task_id != eager_task.task_id && t.state == TaskState::Running).then_some(())
    })
    .unwrap();
    while cut_at.elapsed() < Duration::from_secs(17) {
        std::thread::sleep(Duration::from_millis(200));
    }
    let p = c.wait_for_state(&patient, 0, TaskState::Running).unwrap();
    assert_eq!(p.task_id, patient_task.task_id, "patient was replaced");
    assert_eq!(history_len(&c, &patient).unwrap(), 0);
    assert_eq!(c.task_pids(&p.task_id), patient_pids, "patient restarted");
    c.check_invariants(&[patient, eager], SETTLE).unwrap();
}

#[test]
fn job_killed_while_its_agent_is_cut_off_is_killed_there_after_the_heal() {
    if !netns_available("job_killed_while_its_agent_is_cut_off") {
        return;
    }
    let mut c = NetCluster::start(1, FAULT_MASTER_CONFIG).unwrap();
    let job = key("doomed");
    c.create_job(&fault_job(
        "doomed",
        1,
        true,
        FOREVER,
        json!({"reschedule": false}),
    ))
    .unwrap();
    c.wait_for_state(&job, 0, TaskState::Running).unwrap();
    c.ns(0).cut().unwrap();
    c.kill_job(&job).unwrap();
    std::thread::sleep(Duration::from_secs(8));
    // The processes run on: the agent has not heard of the kill.
    assert!(c.task_cgroups().values().any(|p| !p.is_empty()));
    c.ns(0).heal().unwrap();
    c.wait_for("every task of the killed job to end", WAIT, |c| {
        let view = c.job(&job).ok()?;
        let all_ended = view
            .instances
            .iter()
            .flat_map(|i| i.current.iter().chain(i.history.iter()))
            .all(|t| t.state.is_terminal());
        (all_ended && c.task_cgroups().values().all(|p| p.is_empty())).then_some(())
    })
    .unwrap();
    let view = c.job(&job).unwrap();
    for i in &view.instances {
        assert!(i.history.is_empty(), "a killed instance was replaced");
    }
    c.check_invariants(&[job], SETTLE).unwrap();
}

#[test]
fn task_finishing_while_the_master_is_down_is_reported_once_and_never_rerun() {
    if !netns_available("task_finishing_while_the_master_is_down") {
        return;
    }
    let mut c = NetCluster::start(1, FAULT_MASTER_CONFIG).unwrap();
    let job = key("alone");
    c.create_job(&fault_job(
        "alone",
        1,
        false,
        "echo ran >> runs.txt; sleep 2",
        json!({}),
    ))
    .unwrap();
    let task = c.wait_for_state(&job, 0, TaskState::Running).unwrap();
    c.kill_master();
    let sandbox = c.sandbox_of(&task.task_id).unwrap();
    c.wait_for("the task to finish while the master is down", WAIT, |_| {
        let status = std::fs::read_to_string(sandbox.join("status.json")).ok()?;
        status.contains("FINISHED").then_some(())
    })
    .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    c.start_master_again().unwrap();
    let t = c.wait_for_state(&job, 0, TaskState::Finished).unwrap();
    assert_eq!(t.task_id, task.task_id);
    std::thread::sleep(Duration::from_secs(3));
    let t = c.task(&task.task_id).unwrap();
    assert_eq!(count_state(&t, TaskState::Finished), 1, "{t:?}");
    assert_eq!(history_len(&c, &job).unwrap(), 0, "the task ran again");
    let runs = std::fs::read_to_string(sandbox.join("sandbox/runs.txt")).unwrap();
    assert_eq!(runs.lines().count(), 1);
    c.check_invariants(&[job], SETTLE).unwrap();
}

#[test]
fn flapping_network_never_runs_an_exclusive_task_twice_and_converges() {
    if !netns_available("flapping_network") {
        return;
    }
    let mut c = NetCluster::start(2, FAULT_MASTER_CONFIG).unwrap();
    let solo = key("flapsolo");
    let svc = key("flapsvc");
    c.create_job(&fault_job(
        "flapsolo",
        1,
        true,
        FOREVER,
        json!({"exclusive": true}),
    ))
    .unwrap();
    c.create_job(&fault_job("flapsvc", 2, true, FOREVER, json!({})))
        .unwrap();
    c.wait_for_state(&solo, 0, TaskState::Running).unwrap();
    c.wait_for_state(&svc, 1, TaskState::Running).unwrap();
    let mut ids: BTreeSet<String> = BTreeSet::new();
    let mut sample = |c: &NetCluster| -> anyhow::Result<()> {
        let view = c.job(&solo)?;
        let mut running = 0;
        for i in &view.instances {
            for t in i.current.iter().chain(i.history.iter()) {
                ids.insert(t.task_id.clone());
                running += usize::from(t.state == TaskState::Running);
            }
        }
        let cgroups = c.task_cgroups();
        let live: Vec<&String> = ids
            .iter()
            .filter(|id| cgroups.get(*id).is_some_and(|p| !p.is_empty()))
            .collect();
        anyhow::ensure!(running <= 1, "the master shows {running} RUNNING copies");
        anyhow::ensure!(
            live.len() <= 1,
            "two exclusive copies run at once: {live:?}"
        );
        Ok(())
    };
    // Cuts of both agents, shorter and longer than the timeout and the lease, with
    // short heals in between (agent 0 and 1 out of step).
    let cuts_ms: [(u64, u64); 4] = [(2000, 6500), (6500, 1000), (1200, 7000), (7000, 3000)];
    for (n, (cut0, cut1)) in cuts_ms.iter().enumerate() {
        let start = Instant::now();
        c.ns(0).cut().unwrap();
        c.ns(1).cut().unwrap();
        let (mut up0, mut up1) = (false, false);
        while start.elapsed() < Duration::from_millis((*cut0).max(*cut1) + 1500) {
            if !up0 && start.elapsed() >= Duration::from_millis(*cut0) {
                c.ns(0).heal().unwrap();
                up0 = true;
            }
            if !up1 && start.elapsed() >= Duration::from_millis(*cut1) {
                c.ns(1).heal().unwrap();
                up1 = true;
            }
            if let Err(e) = sample(&c) {
                panic!("round {n}: {e:#}\n{}", c.diagnostics());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let settle = Instant::now();
    while settle.elapsed() < Duration::from_secs(10) {
        if let Err(e) = sample(&c) {
            panic!("after the flapping: {e:#}\n{}", c.diagnostics());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    c.check_invariants(&[solo, svc], SETTLE).unwrap();
}

#[test]
fn executor_killed_while_its_agent_is_down_is_cleaned_up_and_replaced_on_restart() {
    if !netns_available("executor_killed_while_its_agent_is_down") {
        return;
    }
    let (mut c, job, old) = service_with_a_grandchild("orphan").unwrap();
    c.kill_agent(0);
    let executor = c.executor_pid(&old.task_id).unwrap();
    kill(Pid::from_raw(executor as i32), Signal::SIGKILL).unwrap();
    // The task's processes end with their executor (its pid namespace's init dies
    // with it); the agent, back, still reports the task LOST, cleans up and replaces it.
    let gone = Instant::now();
    while !c.task_pids(&old.task_id).is_empty() {
        assert!(
            gone.elapsed() < Duration::from_secs(10),
            "the task's processes outlived their executor"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    c.start_agent(0).unwrap();
    lost_cleaned_and_replaced(&mut c, job, &old).unwrap();
}
