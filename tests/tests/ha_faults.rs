//! Failover of masters on a real 3-member etcd cluster under faults other than a
//! killed process: a leader cut off the network by a network namespace loses
//! leadership, another master leads, the agent follows it, nothing acknowledged
//! is lost and no running task is touched; the cut-off master writes nothing
//! when the link comes back and rejoins as a standby. Timers (a rolling update, a
//! drain's deadline, cron, a THROTTLED penalty) carry on from the stored state
//! after the leader is killed with SIGKILL.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use drover_common::state::TaskState;
use drover_tests::ha::{HaCluster, HaOptions, Outcome, Submitter};
use drover_tests::netns::netns_available;
use drover_tests::{command_job, WAIT};
use nix::sys::signal::Signal;
use reqwest::Method;
use serde_json::Value;

/// The failover bound asserted (the target is 5 s; 2 busy cores shared
/// by several test processes get three times that).
const FAILOVER_BOUND: Duration = Duration::from_secs(15);

/// The service `name`'s RUNNING task id, once it runs.
fn running_task(cluster: &HaCluster, name: &str) -> anyhow::Result<String> {
    cluster.wait_for(&format!("{name} RUNNING"), WAIT, |c| {
        let t = c.job(name).ok()?.instances.first()?.current.clone()?;
        (t.state == TaskState::Running).then_some(t.task_id)
    })
}

/// Asserts the service `name` still runs task `task_id`, never replaced.
fn still_running(cluster: &HaCluster, name: &str, task_id: &str) -> anyhow::Result<()> {
    let view = cluster.job(name)?;
    let instance = &view.instances[0];
    let current = instance.current.as_ref();
    anyhow::ensure!(
        current.is_some_and(|t| t.task_id == task_id && t.state == TaskState::Running)
            && instance.history.is_empty(),
        "{name}'s task {task_id} was touched: {view:?}\n{}",
        cluster.diagnostics()
    );
    Ok(())
}

#[test]
fn a_leader_cut_off_the_network_loses_leadership_and_rejoins_as_a_standby() -> anyhow::Result<()> {
    if !netns_available("HA network-cut test") {
        return Ok(());
    }
    let cluster = HaCluster::start_with(HaOptions {
        netns: true,
        ..HaOptions::new(3)
    })?;
    let old = cluster.wait_leader(WAIT)?;
    let api = cluster.api(old)?;
    api.create_job(&command_job("svc", 1, true, "sleep 600"))?;
    let svc = running_task(&cluster, "svc")?;
    let mut acked = BTreeSet::new();
    for i in 0..5 {
        let name = format!("before{i}");
        api.create_job(&command_job(&name, 1, false, "true"))?;
        acked.insert(name);
    }
    cluster.wait_finished_once(&acked)?;

    cluster.cut_master(old)?;
    let cut_at = Instant::now();
    let new = cluster.wait_for("another master to lead", WAIT, |c| {
        c.leader().filter(|&k| k != old)
    })?;
    let failover = cut_at.elapsed();
    eprintln!("master {old} cut off; master {new} leads after {failover:?}");
    assert!(
        failover < FAILOVER_BOUND,
        "failover took {failover:?}\n{}",
        cluster.diagnostics()
    );
    // The cut-off master's election key is gone with its lease: every write it
    // could still send is fenced on that key and fails.
    let mut etcd = cluster.etcd.client()?;
    let elections = etcd.list(drover_master::leader::ELECTION)?;
    assert!(
        !elections
            .iter()
            .any(|(_, url, _)| *url == cluster.urls[old]),
        "the cut-off master still holds an election key: {elections:?}"
    );

    // Writes go on at the new leader and the agent follows it: the new jobs run.
    let mut submit = Submitter::new(&cluster)?;
    let mut during = BTreeSet::new();
    for i in 0..10 {
        let name = format!("after{i}");
        let spec = command_job(&name, 1, false, "true");
        match submit.until_done(Method::POST, "/v1/jobs", Some(&spec), WAIT) {
            Outcome::Ok(_) => {
                during.insert(name);
            }
            other => panic!("{name}: {other:?}\n{}", cluster.diagnostics()),
        }
    }
    cluster.wait_finished_once(&during)?;
    acked.extend(during);
    still_running(&cluster, "svc", &svc)?;

    // Heal with every other master paused: whatever the old leader still had in
    // flight reaches etcd now, and nobody else writes.
    let others: Vec<usize> = (0..3).filter(|&k| k != old).collect();
    for &k in &others {
        cluster.signal_master(k, Signal::SIGSTOP);
    }
    let before = etcd.revision()?;
    cluster.heal_master(old)?;
    let health = cluster.wait_for("the cut-off master to answer /health", WAIT, |c| {
        c.health(old)
    })?;
    let answered = cluster.api(old)?.post(
        "/v1/jobs",
        &serde_json::to_value(command_job("stale", 1, false, "true"))?,
    );
    std::thread::sleep(Duration::from_secs(1));
    // Unless it was elected again since (the others are paused) and wrote under
    // its new key, no key of the store changed.
    let reelected = etcd
        .list(drover_master::leader::ELECTION)?
        .into_iter()
        .filter(|(_, url, _)| *url == cluster.urls[old])
        .map(|(_, _, rev)| rev)
        .min()
        .unwrap_or(i64::MAX);
    let stale: Vec<(String, i64)> = etcd
        .list("/drover/")?
        .into_iter()
        .filter(|(_, _, rev)| *rev > before && *rev < reelected)
        .map(|(k, _, rev)| (k, rev))
        .collect();
    for &k in &others {
        cluster.signal_master(k, Signal::SIGCONT);
    }
    assert_eq!(
        health["leader"],
        Value::Bool(false),
        "the healed master claims to lead: {health}"
    );
    if reelected == i64::MAX {
        let answer = answered?;
        assert_eq!(answer.0, 503, "the healed standby answered {answer:?}");
    }
    assert!(
        stale.is_empty(),
        "the cut-off master wrote {stale:?} (revision before the heal: {before})\n{}",
        cluster.diagnostics()
    );

    // It rejoins as a standby that knows the leader (or leads again, elected
    // while the others were paused).
    let leader = cluster.wait_for("the healed master to follow the leader", WAIT, |c| {
        let leader = c.leader()?;
        let health = c.health(old)?;
        (leader == old || health["leader_url"] == Value::String(c.urls[leader].clone()))
            .then_some(leader)
    })?;
    eprintln!("after the heal master {leader} leads");
    let present: BTreeSet<String> = cluster
        .get::<Vec<Value>>("/v1/jobs")?
        .iter()
        .filter_map(|j| j["key"].as_str()?.strip_prefix("www-data/test/"))
        .map(str::to_string)
        .collect();
    let lost: Vec<&String> = acked.difference(&present).collect();
    assert!(lost.is_empty(), "acknowledged jobs lost: {lost:?}");
    assert!(
        !present.contains("stale"),
        "a job sent to the healed standby exists"
    );
    still_running(&cluster, "svc", &svc)?;
    // One launch per task: the service's and each finished job's, none more.
    let launches = cluster.launches();
    assert_eq!(
        launches,
        1 + acked.len(),
        "the agent launched {launches} tasks for {} jobs\n{}",
        1 + acked.len(),
        cluster.diagnostics()
    );
    Ok(())
}
