//! Failover of masters on a real 3-member etcd cluster under faults other than a
//! killed process: a leader cut off the network by a network namespace loses
//! leadership, another master leads, the agent follows it, nothing acknowledged
//! is lost and no running task is touched; the cut-off master writes nothing
//! when the link comes back and rejoins as a standby. Timers (a rolling update, a
//! drain's deadline, cron, a THROTTLED penalty) carry on from the stored state
//! after the leader is killed with SIGKILL.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use drover_common::state::{TaskState, UnixMillis};
use drover_common::wire::{
    CronView, HostView, InstanceUpdateState, JobView, TaskView, UpdateState, UpdateView,
};
use drover_tests::ha::{job_path, HaCluster, HaOptions, Outcome, Submitter};
use drover_tests::netns::netns_available;
use drover_tests::{command_job, cron_firings, running_as_root, WAIT};
use nix::sys::signal::Signal;
use reqwest::Method;
use serde_json::{json, Value};

/// The failover bound asserted (the issue's target is 5 s; 2 busy cores shared
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

/// The masters' config for the timer tests: `TEST_MASTER_CONFIG`'s values, cron
/// schedules with seconds, and a THROTTLED penalty long enough to kill the
/// leader in the middle of it.
const TIMERS_CONFIG: &str = r#"
heartbeat_interval = "300ms"
agent_timeout = "5s"
flapping_threshold = "3s"
throttle_initial = "15s"
throttle_max = "15s"
transient_state_timeout = "60s"
restart_grace = "10s"
cron_seconds = true
"#;

/// A cluster of 3 masters with `TIMERS_CONFIG`.
fn timers_cluster() -> anyhow::Result<HaCluster> {
    HaCluster::start_with(HaOptions {
        master_config: TIMERS_CONFIG.to_string(),
        ..HaOptions::new(3)
    })
}

/// The wall clock now, in Unix ms.
fn wall_ms() -> UnixMillis {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as UnixMillis)
        .unwrap_or(0)
}

/// SIGKILLs the leader, starts it again (a standby now), and waits until
/// another master leads; returns the new leader.
fn kill_the_leader(cluster: &mut HaCluster) -> anyhow::Result<usize> {
    let old = cluster.wait_leader(WAIT)?;
    cluster.kill_master(old);
    let killed = Instant::now();
    cluster.start_master(old)?;
    let new = cluster.wait_for("another master to lead", WAIT, |c| {
        c.leader().filter(|&k| k != old)
    })?;
    eprintln!(
        "killed master {old}; master {new} leads after {:?}",
        killed.elapsed()
    );
    Ok(new)
}

/// The event of `task` whose message contains `text`.
fn event_with<'a>(task: &'a TaskView, text: &str) -> Option<&'a drover_common::state::TaskEvent> {
    task.events.iter().find(|e| e.message.contains(text))
}

#[test]
fn a_rolling_update_goes_on_after_the_leader_is_killed() -> anyhow::Result<()> {
    if !running_as_root("HA timer test") {
        return Ok(());
    }
    let mut cluster = timers_cluster()?;
    let leader = cluster.wait_leader(WAIT)?;
    let api = cluster.api(leader)?;
    let mut spec = command_job("upd", 3, true, "sleep 600");
    // One agent: all instances on it.
    spec["constraints"] = json!({"host": "limit:6"});
    api.create_job(&spec)?;
    cluster.wait_for("3 instances RUNNING", WAIT, |c| {
        let v = c.job("upd").ok()?;
        v.instances
            .iter()
            .all(|i| {
                i.current
                    .as_ref()
                    .is_some_and(|t| t.state == TaskState::Running)
            })
            .then_some(())
    })?;
    spec["task"]["processes"][0]["cmdline"] = json!("sleep 601");
    spec["update"] = json!({"batch_size": 1, "watch": "4s"});
    let (status, body) = api.post(
        &format!("{}/update", job_path("upd")),
        &json!({"spec": spec}),
    )?;
    anyhow::ensure!(status == 201, "update refused: {status} {body}");
    let update_path = format!("{}/update", job_path("upd"));
    // Mid-way: the first instance updated, the second batch started.
    cluster.wait_for("the second batch of the update", WAIT, |c| {
        let u: UpdateView = c.get(&update_path).ok()?;
        (u.batch >= 2 && u.state == UpdateState::RollingForward).then_some(())
    })?;
    kill_the_leader(&mut cluster)?;
    let update: UpdateView = cluster.wait_for("the update to end", WAIT, |c| {
        let u: UpdateView = c.get(&update_path).ok()?;
        u.state.is_terminal().then_some(u)
    })?;
    assert_eq!(
        update.state,
        UpdateState::RolledForward,
        "{update:?}\n{}",
        cluster.diagnostics()
    );
    assert!(
        update
            .instances
            .iter()
            .all(|i| i.state == InstanceUpdateState::Updated && i.failures == 0),
        "{update:?}"
    );
    let batches = update
        .events
        .iter()
        .filter(|e| e.message.starts_with("batch:"))
        .count();
    assert_eq!(batches, 3, "batches started: {:?}", update.events);
    // Each instance replaced once, by the update, its new task untouched since.
    let view = cluster.job("upd")?;
    for i in &view.instances {
        let current = i.current.as_ref().expect("a task");
        assert_eq!(current.state, TaskState::Running, "{view:?}");
        assert_eq!(
            i.config.as_deref(),
            Some(update.to_config.as_str()),
            "{view:?}"
        );
        assert_eq!(
            i.history.len(),
            1,
            "instance {} replaced {} times: {view:?}",
            i.instance,
            i.history.len()
        );
    }
    Ok(())
}

#[test]
fn a_drain_deadline_forces_at_its_time_after_the_leader_is_killed() -> anyhow::Result<()> {
    if !running_as_root("HA timer test") {
        return Ok(());
    }
    let mut cluster = timers_cluster()?;
    let leader = cluster.wait_leader(WAIT)?;
    let api = cluster.api(leader)?;
    // 1 of 1 must stay healthy: only the deadline can take it.
    let mut spec = command_job("pinned", 1, true, "sleep 600");
    spec["sla_policy"] = json!({"min_healthy": 1});
    api.create_job(&spec)?;
    let task = running_task(&cluster, "pinned")?;
    let (status, body) = api.post(
        "/v1/hosts/drain",
        &json!({"hosts": ["agent-0"], "deadline_ms": 12_000}),
    )?;
    anyhow::ensure!(status == 200, "drain refused: {status} {body}");
    let host: HostView = cluster.get("/v1/hosts/agent-0")?;
    let deadline = host.deadline_ms.expect("a drain deadline");
    std::thread::sleep(Duration::from_secs(2));
    // Still held back by the job's policy when the leader dies.
    assert!(cluster.job("pinned")?.instances[0]
        .current
        .as_ref()
        .is_some_and(|t| t.task_id == task && t.state == TaskState::Running));
    kill_the_leader(&mut cluster)?;
    let forced = cluster.wait_for("the deadline to force the task off", WAIT, |c| {
        let t: TaskView = c.get(&format!("/v1/tasks/{task}")).ok()?;
        event_with(&t, "passed: forced off").map(|e| e.timestamp_ms)
    })?;
    eprintln!(
        "deadline {deadline}, forced at {forced} ({:+} ms)",
        forced as i64 - deadline as i64
    );
    // A timer fires a little late on busy cores, never early.
    assert!(
        forced + 200 >= deadline && forced <= deadline + 4_000,
        "forced at {forced}, the deadline was {deadline}\n{}",
        cluster.diagnostics()
    );
    cluster.wait_for("the host DRAINED", WAIT, |c| {
        let h: HostView = c.get("/v1/hosts/agent-0").ok()?;
        (h.mode == drover_common::wire::MaintenanceMode::Drained).then_some(())
    })?;
    Ok(())
}

#[test]
fn cron_fires_each_time_once_across_leader_kills() -> anyhow::Result<()> {
    if !running_as_root("HA timer test") {
        return Ok(());
    }
    let mut cluster = timers_cluster()?;
    let leader = cluster.wait_leader(WAIT)?;
    let mut spec = command_job("tick", 1, false, "true");
    spec["cron_schedule"] = json!("*/10 * * * * *");
    cluster.api(leader)?.create_job(&spec)?;
    let cron = |c: &HaCluster| -> Option<CronView> { c.job("tick").ok()?.cron };
    let first = cluster.wait_for("the first firing", WAIT, |c| cron(c)?.last_fired_ms)?;
    // Killed right after a firing: the new leader must not run it again.
    kill_the_leader(&mut cluster)?;
    let next = first + 10_000;
    // Killed a second before the next firing, which falls while no master leads
    // (failover takes longer): the next leader runs it as missed, once.
    let now = wall_ms();
    if next > now + 1_000 {
        std::thread::sleep(Duration::from_millis(next - now - 1_000));
    }
    kill_the_leader(&mut cluster)?;
    let third = first + 20_000;
    let view: JobView = cluster.wait_for("the third firing's run to finish", WAIT, |c| {
        let v = c.job("tick").ok()?;
        let done = v.instances[0]
            .current
            .as_ref()
            .is_some_and(|t| t.state == TaskState::Finished && cron_firings(&v).contains(&third));
        done.then_some(v)
    })?;
    let mut fired = cron_firings(&view);
    fired.sort_unstable();
    let want: Vec<UnixMillis> = vec![first, next, third];
    assert_eq!(
        &fired[..fired.len().min(3)],
        &want[..],
        "firings (ms after the first): {:?}",
        fired.iter().map(|f| f - first).collect::<Vec<_>>()
    );
    assert!(fired.len() == 3 || fired[3] == first + 30_000, "{fired:?}");
    Ok(())
}

#[test]
fn a_throttled_task_waits_out_its_penalty_across_a_leader_kill() -> anyhow::Result<()> {
    if !running_as_root("HA timer test") {
        return Ok(());
    }
    let mut cluster = timers_cluster()?;
    let leader = cluster.wait_leader(WAIT)?;
    cluster
        .api(leader)?
        .create_job(&command_job("flap", 1, true, "exit 1"))?;
    let throttled = cluster.wait_for("a THROTTLED task", WAIT, |c| {
        let t = c.job("flap").ok()?.instances.first()?.current.clone()?;
        (t.state == TaskState::Throttled).then_some(t)
    })?;
    let since = throttled
        .events
        .first()
        .map(|e| e.timestamp_ms)
        .unwrap_or(0);
    let until = since + 15_000;
    // Killed a third into the penalty: a new leader that started it again would
    // end it 5 s late or more; one that forgot it, at once.
    let now = wall_ms();
    if since + 5_000 > now {
        std::thread::sleep(Duration::from_millis(since + 5_000 - now));
    }
    kill_the_leader(&mut cluster)?;
    let over = cluster.wait_for("the penalty to end", WAIT, |c| {
        let t: TaskView = c.get(&format!("/v1/tasks/{}", throttled.task_id)).ok()?;
        event_with(&t, "penalty over").map(|e| e.timestamp_ms)
    })?;
    eprintln!(
        "penalty until {until}, over at {over} ({:+} ms)",
        over as i64 - until as i64
    );
    assert!(
        over + 200 >= until && over <= until + 4_000,
        "the penalty to {until} ended at {over}\n{}",
        cluster.diagnostics()
    );
    Ok(())
}
