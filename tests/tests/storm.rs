//! The eviction-storm guard across real network boundaries (issue 15): five agents
//! in their own network namespaces; three cut off at once hold every task (the guard
//! shows in `GET /v1/cluster`) and healing brings the same processes back; one cut
//! off is replaced as usual. Needs root, `ip` and `nsenter`; skips with a message
//! otherwise. See docs/testing.md.

use std::time::Duration;

use drover_common::state::TaskState;
use drover_common::wire::{ClusterView, JobView};
use drover_tests::netns::{fault_job, key, netns_available, NetCluster, FAULT_MASTER_CONFIG};
use drover_tests::{describe, drover_as, WAIT};
use serde_json::json;

/// A service process that runs until killed.
const FOREVER: &str = "exec sleep 100000";

/// Settle time for the invariant checker.
const SETTLE: Duration = Duration::from_secs(40);

/// Runs the `drover` CLI against the cluster (its token, its CA).
fn cli(c: &NetCluster, args: &[&str]) -> anyhow::Result<std::process::Output> {
    let mut all: Vec<&str> = Vec::new();
    let ca = c.api.ca.as_ref().map(|p| p.display().to_string());
    if let Some(ca) = &ca {
        all.extend(["--ca", ca.as_str()]);
    }
    all.extend(args);
    drover_as(Some(&c.api.url), c.api.token.as_deref(), &all)
}

fn cluster_view(c: &NetCluster) -> anyhow::Result<ClusterView> {
    c.get("/v1/cluster")
}

fn all_running(view: &JobView) -> bool {
    view.instances.iter().all(|i| {
        i.current
            .as_ref()
            .is_some_and(|t| t.state == TaskState::Running)
    })
}

/// Five agents and a RUNNING service of `instances` (one per agent); returns the
/// cluster and each instance's task id.
fn five_agents_with(name: &str, instances: u32) -> anyhow::Result<(NetCluster, Vec<String>)> {
    let mut c = NetCluster::start(5, FAULT_MASTER_CONFIG)?;
    c.create_job(&fault_job(name, instances, true, FOREVER, json!({})))?;
    let job = key(name);
    let view = c.wait_for("every instance RUNNING", WAIT, |c| {
        let v = c.job(&job).ok()?;
        all_running(&v).then_some(v)
    })?;
    let ids = view
        .instances
        .iter()
        .filter_map(|i| i.current.as_ref().map(|t| t.task_id.clone()))
        .collect();
    Ok((c, ids))
}

/// Index of the agent running `task`.
fn agent_of(c: &NetCluster, task: &str) -> anyhow::Result<usize> {
    let agent = c
        .task(task)?
        .agent_id
        .ok_or_else(|| anyhow::anyhow!("{task} has no agent"))?;
    for k in 0..5 {
        if c.agent_id(k)? == agent {
            return Ok(k);
        }
    }
    anyhow::bail!("{agent} is none of the five agents")
}

#[test]
fn three_of_five_agents_cut_off_keep_every_task_until_they_heal() {
    if !netns_available("three_of_five_agents_cut_off") {
        return;
    }
    let (mut c, ids) = five_agents_with("storm", 5).unwrap();
    let job = key("storm");
    let pids: Vec<Vec<u32>> = ids.iter().map(|id| c.task_pids(id)).collect();
    assert!(pids.iter().all(|p| !p.is_empty()));
    for k in 0..3 {
        c.ns(k).cut().unwrap();
    }
    let engaged = c
        .wait_for("the eviction guard to engage", WAIT, |c| {
            let v = cluster_view(c).ok()?;
            v.eviction_guard.engaged.then_some(v)
        })
        .unwrap();
    assert_eq!(engaged.eviction_guard.unreachable_agents, 3, "{engaged:?}");
    assert_eq!(engaged.eviction_guard.fleet_agents, 5);
    assert_eq!(engaged.reachable_agents, 2);
    // Well past agent timeout (5 s) plus any partition wait: nothing is LOST.
    std::thread::sleep(Duration::from_secs(8));
    let view = c.job(&job).unwrap();
    for (n, i) in view.instances.iter().enumerate() {
        let t = i.current.as_ref().unwrap();
        assert_eq!(t.task_id, ids[n], "instance {n} replaced under the guard");
        assert!(i.history.is_empty(), "instance {n} has history");
        assert_ne!(t.state, TaskState::Lost);
    }
    let v = cluster_view(&c).unwrap();
    assert!(v.eviction_guard.engaged);
    assert_eq!(v.eviction_guard.held_tasks, 3, "{v:?}");
    // And the CLI, which exits 1 while the guard is engaged.
    let out = cli(&c, &["cluster", "status"]).unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("EVICTION GUARD ENGAGED"), "{text}");

    for k in 0..3 {
        c.ns(k).heal().unwrap();
    }
    c.wait_for("every agent back and the guard released", WAIT, |c| {
        let v = cluster_view(c).ok()?;
        (v.reachable_agents == 5 && !v.eviction_guard.engaged).then_some(())
    })
    .unwrap();
    let out = cli(&c, &["cluster", "status"]).unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    std::thread::sleep(Duration::from_secs(6));
    let view = c.job(&job).unwrap();
    for (n, i) in view.instances.iter().enumerate() {
        let t = i.current.as_ref().unwrap();
        assert_eq!(t.task_id, ids[n], "instance {n} replaced after the heal");
        assert_eq!(t.state, TaskState::Running);
        assert!(i.history.is_empty(), "instance {n} has history");
        assert_eq!(c.task_pids(&ids[n]), pids[n], "instance {n} restarted");
    }
    c.check_invariants(&[job], SETTLE).unwrap();
}

#[test]
fn one_of_five_agents_cut_off_is_replaced_as_usual() {
    if !netns_available("one_of_five_agents_cut_off") {
        return;
    }
    let (mut c, ids) = five_agents_with("single", 4).unwrap();
    let job = key("single");
    let k = agent_of(&c, &ids[0]).unwrap();
    c.ns(k).cut().unwrap();
    let replacement = c
        .wait_for("instance 0 replaced and RUNNING elsewhere", WAIT, |c| {
            let v = c.job(&job).ok()?;
            let t = v.instances[0].current.clone()?;
            (t.task_id != ids[0] && t.state == TaskState::Running).then_some(t)
        })
        .unwrap();
    assert_ne!(replacement.agent_id, Some(c.agent_id(k).unwrap()));
    assert_eq!(c.task(&ids[0]).unwrap().state, TaskState::Lost);
    let v = cluster_view(&c).unwrap();
    assert!(!v.eviction_guard.engaged, "{v:?}");
    assert_eq!(v.reachable_agents, 4);
    c.ns(k).heal().unwrap();
    c.wait_reachable(k).unwrap();
    c.check_invariants(&[job], SETTLE).unwrap();
}

#[test]
fn an_operator_release_lets_the_held_tasks_go() {
    if !netns_available("an_operator_release_lets_the_held_tasks_go") {
        return;
    }
    let (mut c, ids) = five_agents_with("released", 5).unwrap();
    let job = key("released");
    let mut cut = Vec::new();
    for k in 0..3 {
        c.ns(k).cut().unwrap();
        cut.push(c.agent_id(k).unwrap());
    }
    c.wait_for("the eviction guard to hold three tasks", WAIT, |c| {
        let v = cluster_view(c).ok()?;
        (v.eviction_guard.engaged && v.eviction_guard.held_tasks == 3).then_some(())
    })
    .unwrap();
    let out = cli(&c, &["cluster", "release-guard"]).unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    let on_cut: Vec<&String> = ids
        .iter()
        .filter(|id| {
            c.task(id)
                .ok()
                .and_then(|t| t.agent_id)
                .is_some_and(|a| cut.contains(&a))
        })
        .collect();
    assert_eq!(on_cut.len(), 3);
    c.wait_for("the tasks of the cut agents LOST", WAIT, |c| {
        on_cut
            .iter()
            .all(|id| c.task(id).is_ok_and(|t| t.state == TaskState::Lost))
            .then_some(())
    })
    .unwrap();
    let v = cluster_view(&c).unwrap();
    assert!(!v.eviction_guard.engaged, "{v:?}");
    for k in 0..3 {
        c.ns(k).heal().unwrap();
    }
    for k in 0..3 {
        c.wait_reachable(k).unwrap();
    }
    c.check_invariants(&[job], SETTLE).unwrap();
}
