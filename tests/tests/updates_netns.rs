//! Black-box: rolling updates across agent partitions, with agents in their own
//! network namespaces (`drover_tests::netns`). An agent cut off mid-update for less
//! than the agent timeout loses nothing: the update waits for it, replaces nothing
//! twice and rolls forward. Cut off for longer, its tasks are LOST and replaced by
//! the partition policy, which is no update failure: the update still rolls forward
//! without ever having more instances down than its batch (beyond those the loss
//! took). Needs root, `ip` and `nsenter`.

#![allow(clippy::unwrap_used)] // unwrap is how tests fail

use std::time::{Duration, Instant};

use drover_common::state::{ExitReason, TaskState};
use drover_common::wire::{JobView, UpdateState, UpdateView};
use drover_tests::netns::{fault_job, key, netns_available, NetCluster, FAULT_MASTER_CONFIG};
use drover_tests::WAIT;
use serde_json::{json, Value};

/// Instances, batch size, watch time of every update here.
const INSTANCES: u32 = 6;
const BATCH: usize = 2;

/// Settle time for the invariant checker.
const SETTLE: Duration = Duration::from_secs(40);

/// The job: `INSTANCES` sleeping instances (`prefix` run first), at most
/// `per_host` on a host, updated `BATCH` at a time, watched for 2 s.
fn spec(name: &str, prefix: &str, per_host: u32) -> Value {
    let mut s = fault_job(
        name,
        INSTANCES,
        true,
        &format!("{prefix}exec sleep 100000"),
        json!({}),
    );
    s["constraints"] = json!({"host": format!("limit:{per_host}")});
    s["update"] = json!({"batch_size": BATCH, "watch": "2s"});
    s
}

fn update_of(c: &NetCluster, job: &str) -> UpdateView {
    c.get(&format!("/v1/jobs/{job}/update")).unwrap()
}

/// Instances whose current task is not RUNNING.
fn down(view: &JobView) -> usize {
    view.instances
        .iter()
        .filter(|i| {
            !i.current
                .as_ref()
                .is_some_and(|t| t.state == TaskState::Running)
        })
        .count()
}

/// Instances down because the partition policy replaced their task (LOST with its
/// agent) and the replacement is not RUNNING yet.
fn down_by_the_loss(view: &JobView) -> usize {
    view.instances
        .iter()
        .filter(|i| {
            let up = i
                .current
                .as_ref()
                .is_some_and(|t| t.state == TaskState::Running);
            let lost = i
                .history
                .last()
                .is_some_and(|t| t.exit_reason == Some(ExitReason::AgentLost));
            lost && !up
        })
        .count()
}

/// A running cluster of three agents with the job on its old config, and the job
/// key. None where netns tests cannot run.
fn cluster(name: &str, per_host: u32) -> Option<(NetCluster, String)> {
    if !netns_available(name) {
        return None;
    }
    let mut c = NetCluster::start(3, FAULT_MASTER_CONFIG).unwrap();
    let job = key(name);
    c.create_job(&spec(name, "", per_host)).unwrap();
    c.wait_for("every instance RUNNING", WAIT, |c| {
        let view = c.job(&job).ok()?;
        (down(&view) == 0).then_some(())
    })
    .unwrap();
    Some((c, job))
}

/// Starts the update, waits until its first batch runs a new task, and returns
/// the index of the agent that task runs on.
fn update_until_a_new_task_runs(c: &mut NetCluster, name: &str, per_host: u32) -> usize {
    let job = key(name);
    let body = json!({"spec": spec(name, "true; ", per_host), "user": "test"});
    let (status, answer) = c.post(&format!("/v1/jobs/{job}/update"), &body).unwrap();
    assert_eq!(status, 201, "{answer}");
    let to = answer["to_config"].as_str().unwrap().to_string();
    let agent = c
        .wait_for("a task of the first batch RUNNING", WAIT, |c| {
            let view = c.job(&job).ok()?;
            view.instances.iter().find_map(|i| {
                let t = i.current.as_ref()?;
                (i.config.as_deref() == Some(to.as_str()) && t.state == TaskState::Running)
                    .then(|| t.agent_id.clone())
                    .flatten()
            })
        })
        .unwrap();
    (0..3).find(|&k| c.agent_id(k).unwrap() == agent).unwrap()
}

/// Polls until the update ends, checking on every poll that the update itself
/// never has more than a batch down (instances down less those a loss took);
/// heals agent `cut` once `heal_after` passed. The update and the most seen down.
fn follow(
    c: &mut NetCluster,
    job: &str,
    cut: usize,
    heal_after: Duration,
    keep_cut_while_running: bool,
) -> (UpdateView, usize) {
    let cut_at = Instant::now();
    let mut healed = false;
    let mut most = 0;
    loop {
        let u = update_of(c, job);
        if let Ok(view) = c.job(job) {
            let by_update = down(&view) - down_by_the_loss(&view);
            most = most.max(down(&view));
            assert!(
                by_update <= BATCH,
                "{by_update} instances down by the update: {view:#?}\n{u:#?}"
            );
        }
        let cut_long_enough =
            cut_at.elapsed() >= heal_after && !(keep_cut_while_running && !u.state.is_terminal());
        if !healed && (cut_long_enough || cut_at.elapsed() > Duration::from_secs(60)) {
            c.ns(cut).heal().unwrap();
            healed = true;
        }
        if healed && u.state.is_terminal() {
            return (u, most);
        }
        assert!(
            cut_at.elapsed() < Duration::from_secs(150),
            "update not done: {u:#?}\n{}",
            c.diagnostics()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The update rolled forward with no failure, every instance RUNNING on its
/// config.
fn rolled_forward(c: &NetCluster, job: &str, u: &UpdateView) -> JobView {
    assert_eq!(u.state, UpdateState::RolledForward, "{u:#?}");
    assert!(u.instances.iter().all(|p| p.failures == 0), "{u:#?}");
    assert!(
        !u.events.iter().any(|e| e.message.contains("failure")),
        "{u:#?}"
    );
    let view = c.job(job).unwrap();
    for i in &view.instances {
        assert_eq!(i.config.as_deref(), Some(u.to_config.as_str()), "{i:#?}");
    }
    view
}

#[test]
fn an_update_waits_out_an_agent_cut_shorter_than_the_timeout_and_replaces_nothing_twice() {
    let Some((mut c, job)) = cluster("upblip", 2) else {
        return;
    };
    let k = update_until_a_new_task_runs(&mut c, "upblip", 2);
    c.ns(k).cut().unwrap();
    let (u, _) = follow(&mut c, &job, k, Duration::from_secs(2), false);
    let view = rolled_forward(&c, &job, &u);
    // Each instance was replaced exactly once, by the update; nothing was LOST.
    for i in &view.instances {
        assert_eq!(i.history.len(), 1, "{i:#?}");
        let old = &i.history[0];
        assert_eq!(old.state, TaskState::Killed, "{old:#?}");
        assert_eq!(old.exit_reason, Some(ExitReason::Updated), "{old:#?}");
    }
    assert!(c.agents().unwrap().iter().all(|a| a.reachable));
    c.check_invariants(&[job], SETTLE).unwrap();
}

#[test]
fn an_update_rolls_forward_across_an_agent_cut_longer_than_the_timeout() {
    // Three a host: the two hosts left can hold all six, so the update can finish
    // while the third is away; it stays cut off until then.
    let Some((mut c, job)) = cluster("uplost", 3) else {
        return;
    };
    let k = update_until_a_new_task_runs(&mut c, "uplost", 3);
    let cut_id = c.agent_id(k).unwrap();
    let on_cut: Vec<String> = c
        .job(&job)
        .unwrap()
        .instances
        .iter()
        .filter_map(|i| i.current.clone())
        .filter(|t| t.agent_id.as_deref() == Some(cut_id.as_str()))
        .map(|t| t.task_id)
        .collect();
    assert!(!on_cut.is_empty());
    c.ns(k).cut().unwrap();
    let (u, most) = follow(&mut c, &job, k, Duration::from_secs(8), true);
    println!(
        "MEASURE update across a lost agent: at most {most} of {INSTANCES} down, waits: {:?}",
        u.events
            .iter()
            .filter(|e| e.message.contains("lost"))
            .map(|e| e.message.clone())
            .collect::<Vec<_>>()
    );
    let view = rolled_forward(&c, &job, &u);
    // The tasks the cut-off agent ran ended by the partition policy (LOST) or, if
    // the update had already asked them to stop, as the update's (KILLED).
    for id in &on_cut {
        let t = c.task(id).unwrap();
        let by_policy = t.state == TaskState::Lost && t.exit_reason == Some(ExitReason::AgentLost);
        let by_update = t.state == TaskState::Killed && t.exit_reason == Some(ExitReason::Updated);
        assert!(by_policy || by_update, "{t:#?}");
    }
    let lost = view
        .instances
        .iter()
        .flat_map(|i| i.history.iter())
        .filter(|t| t.exit_reason == Some(ExitReason::AgentLost))
        .count();
    assert!(lost > 0, "nothing was LOST: {view:#?}");
    for i in &view.instances {
        let t = i.current.as_ref().unwrap();
        assert_eq!(t.state, TaskState::Running, "{i:#?}");
        assert_ne!(t.agent_id.as_deref(), Some(cut_id.as_str()), "{i:#?}");
    }
    c.wait_reachable(k).unwrap();
    c.wait_for("the lost copies to be killed on the agent", WAIT, |c| {
        on_cut
            .iter()
            .all(|id| c.task_pids(id).is_empty())
            .then_some(())
    })
    .unwrap();
    c.check_invariants(&[job], SETTLE).unwrap();
}
