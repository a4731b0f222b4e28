//! Several masters on a real 3-member etcd cluster (scripts/setup.sh installs
//! etcd): the leader killed with SIGKILL during a stream of job submissions loses
//! no acknowledged job and no instance runs twice; a leader paused past its lease
//! writes nothing when it wakes up; losing one etcd member changes nothing;
//! restarting everything keeps the state; and a short randomized fault schedule
//! keeps every acknowledged job and never shows a read that misses one. Tokens
//! and audit records live in etcd (a token made on one leader works on the next,
//! its revocation holds everywhere); standbys answer the admin API by forwarding
//! it to the leader; and the CLI given every master rides a failover.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use drover_common::state::TaskState;
use drover_common::wire::JobView;
use drover_tests::ha::{HaCluster, HaOptions, Outcome, Submitter};
use drover_tests::{bin, command_job, running_as_root, TEST_MASTER_CONFIG, WAIT};
use nix::sys::signal::Signal;
use reqwest::Method;
use serde_json::{json, Value};

fn job_path(name: &str) -> String {
    format!("/v1/jobs/www-data/test/{name}")
}

/// Waits until every job in `names` has each instance FINISHED by exactly one
/// task (no second launch of an instance).
fn all_finished_once(cluster: &HaCluster, names: &BTreeSet<String>) -> anyhow::Result<()> {
    cluster.wait_for("every job FINISHED", WAIT * 3, |c| {
        names
            .iter()
            .all(|name| {
                c.get::<JobView>(&job_path(name)).is_ok_and(|v| {
                    v.instances.iter().all(|i| {
                        i.current
                            .as_ref()
                            .is_some_and(|t| t.state == TaskState::Finished)
                    })
                })
            })
            .then_some(())
    })?;
    for name in names {
        let view: JobView = cluster.get(&job_path(name))?;
        for i in &view.instances {
            assert!(
                i.history.is_empty(),
                "instance {} of {name} ran more than once: {:?}",
                i.instance,
                i.history
            );
        }
    }
    Ok(())
}

#[test]
fn killing_the_leader_during_200_submissions_loses_no_acknowledged_job() -> anyhow::Result<()> {
    if !running_as_root("HA test") {
        return Ok(());
    }
    let mut cluster = HaCluster::start(3)?;
    let mut submit = Submitter::new(&cluster)?;
    let mut acked = BTreeSet::new();
    let mut killed_at = None;
    for i in 0..200 {
        if i == 60 {
            let leader = cluster.wait_leader(WAIT)?;
            cluster.kill_master(leader);
            killed_at = Some(Instant::now());
        }
        let name = format!("j{i:03}");
        let spec = command_job(&name, 1, false, "true");
        if let Outcome::Ok(_) = submit.until_done(Method::POST, "/v1/jobs", Some(&spec), WAIT) {
            acked.insert(name);
        }
    }
    let killed_at = killed_at.expect("the leader was killed");
    assert!(
        acked.len() >= 195,
        "only {} of 200 submissions were acknowledged\n{}",
        acked.len(),
        cluster.diagnostics()
    );
    let leader = cluster.wait_leader(WAIT)?;
    eprintln!(
        "new leader: master {leader}, {} s after the kill",
        killed_at.elapsed().as_secs()
    );
    let jobs: Vec<Value> = cluster.get("/v1/jobs")?;
    let present: BTreeSet<String> = jobs
        .iter()
        .filter_map(|j| j["key"].as_str())
        .filter_map(|k| k.strip_prefix("www-data/test/"))
        .map(str::to_string)
        .collect();
    let lost: Vec<&String> = acked.difference(&present).collect();
    assert!(lost.is_empty(), "acknowledged jobs lost: {lost:?}");
    all_finished_once(&cluster, &acked)
}

#[test]
fn a_paused_leader_writes_nothing_after_its_lease_expired() -> anyhow::Result<()> {
    if !running_as_root("HA test") {
        return Ok(());
    }
    let cluster = HaCluster::start(3)?;
    let old = cluster.wait_leader(WAIT)?;
    let api = cluster.api(old)?;
    api.create_job(&command_job("svc", 1, true, "sleep 600"))?;
    let running = cluster.wait_for("the service RUNNING", WAIT, |c| {
        let v: JobView = c.get(&job_path("svc")).ok()?;
        let t = v.instances.first()?.current.clone()?;
        (t.state == TaskState::Running).then_some(t.task_id)
    })?;
    cluster.signal_master(old, Signal::SIGSTOP);
    let new = cluster.wait_for("another master to lead", WAIT, |c| {
        c.leader().filter(|&k| k != old)
    })?;
    // Nobody else may write while the old leader wakes up: pause the others too,
    // note etcd's revision, and wake the old leader alone.
    let others: Vec<usize> = (0..3).filter(|&k| k != old).collect();
    for &k in &others {
        cluster.signal_master(k, Signal::SIGSTOP);
    }
    let mut etcd = cluster.etcd.client()?;
    let before = etcd.revision()?;
    cluster.signal_master(old, Signal::SIGCONT);
    // It refuses at once (its lease may have expired), or is already between its
    // leader's and its standby's listener (connection refused).
    let answer = api.post(
        "/v1/jobs",
        &serde_json::to_value(command_job("stale", 1, false, "true"))?,
    );
    if let Ok(answer) = answer {
        assert_ne!(
            answer.0, 201,
            "the paused leader accepted a job: {answer:?}"
        );
    }
    // (It may be between its leader's and its standby's listener for a moment.)
    let health = cluster.wait_for("the old leader to answer /health", WAIT, |c| c.health(old))?;
    assert_eq!(health["leader"], Value::Bool(false), "{health}");
    std::thread::sleep(Duration::from_secs(1));
    // Whatever the old leader tried, no key of the store changed, unless it was
    // elected again since (the others are paused) and wrote under its new key.
    let elections = etcd.list("/drover-election/")?;
    let reelected = elections
        .iter()
        .filter(|(_, url, _)| *url == cluster.urls[old])
        .map(|(_, _, rev)| *rev)
        .min()
        .unwrap_or(i64::MAX);
    let stale: Vec<(String, i64)> = etcd
        .list("/drover/")?
        .into_iter()
        .filter(|(_, _, rev)| *rev > before && *rev < reelected)
        .map(|(k, _, rev)| (k, rev))
        .collect();
    assert!(
        stale.is_empty(),
        "the deposed leader wrote {stale:?} (revision before: {before})\n{}",
        cluster.diagnostics()
    );
    for &k in &others {
        cluster.signal_master(k, Signal::SIGCONT);
    }
    let leader = cluster.wait_leader(WAIT)?;
    eprintln!("paused {old}, then {new} led; now {leader} leads");
    let jobs: Vec<Value> = cluster.get("/v1/jobs")?;
    assert!(
        !jobs.iter().any(|j| j["key"] == "www-data/test/stale"),
        "a job refused by the deposed leader exists: {jobs:?}"
    );
    // The service's task was neither killed nor launched again.
    let view: JobView = cluster.get(&job_path("svc"))?;
    let current = view.instances[0].current.clone().expect("a task");
    assert_eq!(current.task_id, running, "{view:?}");
    assert!(view.instances[0].history.is_empty(), "{view:?}");
    let launches = cluster.agent_log().matches("executor started").count();
    assert!(launches <= 1, "the agent launched {launches} tasks");
    Ok(())
}

#[test]
fn losing_one_etcd_member_changes_nothing() -> anyhow::Result<()> {
    if !running_as_root("HA test") {
        return Ok(());
    }
    let mut cluster = HaCluster::start(2)?;
    cluster.etcd.kill(0);
    let mut submit = Submitter::new(&cluster)?;
    let mut acked = BTreeSet::new();
    for i in 0..10 {
        let name = format!("e{i}");
        let spec = command_job(&name, 1, false, "true");
        match submit.until_done(Method::POST, "/v1/jobs", Some(&spec), WAIT) {
            // Unknown: an attempt timed out on a busy machine and a retry found
            // the job there; it must then be there in the end as well.
            Outcome::Ok(_) | Outcome::Unknown => {
                acked.insert(name);
            }
            other => panic!("{name}: {other:?}\n{}", cluster.diagnostics()),
        }
    }
    all_finished_once(&cluster, &acked)?;
    cluster.etcd.restart(0)?;
    cluster.etcd.wait_ready()?;
    Ok(())
}

#[test]
fn restarting_everything_keeps_the_state_and_the_running_task() -> anyhow::Result<()> {
    if !running_as_root("HA test") {
        return Ok(());
    }
    let mut cluster = HaCluster::start(2)?;
    let leader = cluster.wait_leader(WAIT)?;
    let api = cluster.api(leader)?;
    api.create_job(&command_job("keep", 1, true, "sleep 600"))?;
    api.create_job(&command_job("done", 2, false, "true"))?;
    let running = cluster.wait_for("the service RUNNING", WAIT, |c| {
        let v: JobView = c.get(&job_path("keep")).ok()?;
        let t = v.instances.first()?.current.clone()?;
        (t.state == TaskState::Running).then_some(t.task_id)
    })?;
    all_finished_once(&cluster, &BTreeSet::from(["done".to_string()]))?;
    cluster.kill_everything();
    cluster.start_everything()?;
    let view: JobView = cluster.wait_for("the service RUNNING again", WAIT, |c| {
        let v: JobView = c.get(&job_path("keep")).ok()?;
        let t = v.instances.first()?.current.clone()?;
        (t.state == TaskState::Running).then_some(v)
    })?;
    assert_eq!(
        view.instances[0]
            .current
            .as_ref()
            .map(|t| t.task_id.clone()),
        Some(running),
        "the running task was replaced: {view:?}"
    );
    all_finished_once(&cluster, &BTreeSet::from(["done".to_string()]))
}

/// A small xorshift generator: the schedule is random but printed and
/// reproducible from its seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[test]
fn a_randomized_fault_schedule_keeps_every_acknowledged_job_and_reads_see_them(
) -> anyhow::Result<()> {
    if !running_as_root("HA test") {
        return Ok(());
    }
    let mut cluster = HaCluster::start(3)?;
    let seed = std::env::var("DROVER_HA_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64 | 1)
                .unwrap_or(1)
        });
    eprintln!("fault schedule seed: {seed} (DROVER_HA_SEED={seed} repeats it)");
    let mut rng = Rng(seed);
    let mut submit = Submitter::new(&cluster)?;
    // The history: each create with its outcome, and each read with the jobs
    // acknowledged before it began.
    let mut acked: BTreeSet<String> = BTreeSet::new();
    let mut attempted: BTreeSet<String> = BTreeSet::new();
    let mut stale_reads = Vec::new();
    let began = Instant::now();
    let mut next_fault = Instant::now() + Duration::from_secs(2);
    let mut paused: Option<(usize, Instant)> = None;
    let mut n = 0;
    while began.elapsed() < Duration::from_secs(25) {
        if Instant::now() >= next_fault {
            next_fault = Instant::now() + Duration::from_millis(2_000 + rng.below(3_000));
            if let Some(leader) = cluster.leader() {
                match rng.below(3) {
                    0 => {
                        eprintln!("fault: SIGKILL master {leader}");
                        cluster.kill_master(leader);
                        cluster.start_master(leader)?;
                    }
                    1 if paused.is_none() => {
                        eprintln!("fault: SIGSTOP master {leader}");
                        cluster.signal_master(leader, Signal::SIGSTOP);
                        paused = Some((leader, Instant::now()));
                    }
                    _ => {
                        let member = rng.below(3) as usize;
                        eprintln!("fault: restart etcd member {member}");
                        cluster.etcd.kill(member);
                        std::thread::sleep(Duration::from_millis(500));
                        cluster.etcd.restart(member)?;
                    }
                }
            }
        }
        if let Some((k, at)) = paused {
            if at.elapsed() > Duration::from_secs(3) {
                eprintln!("fault: SIGCONT master {k}");
                cluster.signal_master(k, Signal::SIGCONT);
                paused = None;
            }
        }
        n += 1;
        if n % 5 == 0 {
            let known = acked.clone();
            if let Outcome::Ok(Value::Array(jobs)) = submit.once(Method::GET, "/v1/jobs", None) {
                let seen: BTreeSet<String> = jobs
                    .iter()
                    .filter_map(|j| j["key"].as_str()?.strip_prefix("www-data/test/"))
                    .map(str::to_string)
                    .collect();
                let missing: Vec<String> = known.difference(&seen).cloned().collect();
                if !missing.is_empty() {
                    stale_reads.push(missing);
                }
            }
            continue;
        }
        let name = format!("r{n:04}");
        attempted.insert(name.clone());
        let spec = command_job(&name, 1, false, "true");
        if let Outcome::Ok(_) = submit.once(Method::POST, "/v1/jobs", Some(&spec)) {
            acked.insert(name);
        }
    }
    if let Some((k, _)) = paused {
        cluster.signal_master(k, Signal::SIGCONT);
    }
    eprintln!(
        "{} creates attempted, {} acknowledged",
        attempted.len(),
        acked.len()
    );
    assert!(
        stale_reads.is_empty(),
        "reads missed acknowledged jobs: {stale_reads:?}"
    );
    cluster.wait_leader(WAIT)?;
    let jobs: Vec<Value> = cluster.get("/v1/jobs")?;
    let present: BTreeSet<String> = jobs
        .iter()
        .filter_map(|j| j["key"].as_str()?.strip_prefix("www-data/test/"))
        .map(str::to_string)
        .collect();
    let lost: Vec<&String> = acked.difference(&present).collect();
    assert!(lost.is_empty(), "acknowledged jobs lost: {lost:?}");
    let invented: Vec<&String> = present.difference(&attempted).collect();
    assert!(invented.is_empty(), "jobs nobody created: {invented:?}");
    assert!(!acked.is_empty(), "nothing was acknowledged");
    all_finished_once(&cluster, &present)
}

/// GET `path` on master `k` with `token`: the status, the body and the header
/// naming the leader that served it (a standby forwards).
fn get_on(
    cluster: &HaCluster,
    k: usize,
    token: &str,
    path: &str,
) -> anyhow::Result<(u16, String, Option<String>)> {
    let (status, body, headers) = get_with(cluster, k, token, path, false)?;
    let served_by = headers
        .get("x-drover-served-by")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    Ok((status, body, served_by))
}

/// GET `path` on master `k` with `token`, accepting a stale answer from a
/// standby's copy with `stale`: the status, the body and the answer's headers.
fn get_with(
    cluster: &HaCluster,
    k: usize,
    token: &str,
    path: &str,
    stale: bool,
) -> anyhow::Result<(u16, String, reqwest::header::HeaderMap)> {
    let mut request = reqwest::blocking::Client::new()
        .get(format!("{}{path}", cluster.urls[k]))
        .bearer_auth(token)
        .timeout(Duration::from_secs(30));
    if stale {
        request = request.header("x-drover-allow-stale", "true");
    }
    let answer = request.send()?;
    let (status, headers) = (answer.status().as_u16(), answer.headers().clone());
    Ok((status, answer.text()?, headers))
}

/// `get_on` until the answer is not a refusal of a master that found no
/// leader (503/502 while an election settles, or no connection), for up to
/// `WAIT`: the status and body of the first real answer.
fn settled_get(
    cluster: &HaCluster,
    k: usize,
    token: &str,
    path: &str,
) -> anyhow::Result<(u16, String)> {
    cluster.wait_for(
        &format!("master {k} to answer {path}"),
        WAIT,
        |c| match get_on(c, k, token, path) {
            Ok((502 | 503, _, _)) | Err(_) => None,
            Ok((status, body, _)) => Some((status, body)),
        },
    )
}

#[test]
fn a_token_made_on_one_leader_works_on_the_next_and_its_revocation_everywhere() -> anyhow::Result<()>
{
    if !running_as_root("HA test") {
        return Ok(());
    }
    let mut cluster = HaCluster::start(3)?;
    let first = cluster.wait_leader(WAIT)?;
    let (status, made) = cluster.api(first)?.post(
        "/v1/tokens",
        &json!({"kind": "operator", "description": "made on the first leader"}),
    )?;
    assert_eq!(status, 201, "{made}");
    let id = made["id"].as_str().context("no id")?.to_string();
    let token = made["token"].as_str().context("no token")?.to_string();
    // Its audit record is in etcd (written by the leader, in the background).
    let mut etcd = cluster.etcd.client()?;
    let audited = |etcd: &mut drover_tests::etcd::EtcdClient, path: &str| {
        etcd.list("/drover-audit/").ok().is_some_and(|records| {
            records.iter().any(|(_, line, _)| {
                serde_json::from_str::<Value>(line).is_ok_and(|v| {
                    v["method"] == "POST" && v["path"] == path && v["status"].is_u64()
                })
            })
        })
    };
    cluster.wait_for("the token's audit record in etcd", WAIT, |_| {
        audited(&mut etcd, "/v1/tokens").then_some(())
    })?;
    cluster.kill_master(first);
    let second = cluster.wait_for("another master to lead", WAIT, |c| {
        c.leader().filter(|&k| k != first)
    })?;
    let (status, body) = settled_get(&cluster, second, &token, "/v1/jobs")?;
    assert_eq!(status, 200, "the new leader refused the token: {body}");
    // (Revoking twice is harmless: sent again while an election settles.)
    let revoke = format!("/v1/tokens/{id}/revoke");
    let (status, body) = cluster.wait_for("the revocation to be answered", WAIT, |c| {
        match c.api(second).ok()?.post(&revoke, &json!({})) {
            Ok((502 | 503, _)) | Err(_) => None,
            Ok(answer) => Some(answer),
        }
    })?;
    assert_eq!(status, 200, "{body}");
    cluster.start_master(first)?;
    cluster.wait_for("the restarted master to answer", WAIT, |c| c.health(first))?;
    // Refused by every master: the leader, and the standbys that forward to it.
    for k in 0..3 {
        let (status, body) = settled_get(&cluster, k, &token, "/v1/jobs")?;
        assert_eq!(
            status,
            401,
            "master {k} took the revoked token: {body}\n{}",
            cluster.diagnostics()
        );
    }
    // And by the next leader, which loads the registry from etcd.
    cluster.kill_master(second);
    let third = cluster.wait_for("a third term", WAIT, |c| {
        c.leader().filter(|&k| k != second)
    })?;
    let (status, body) = settled_get(&cluster, third, &token, "/v1/jobs")?;
    assert_eq!(
        status, 401,
        "the next leader took the revoked token: {body}"
    );
    cluster.wait_for("the revocation's audit record in etcd", WAIT, |_| {
        audited(&mut etcd, &revoke).then_some(())
    })?;
    Ok(())
}

#[test]
fn standbys_answer_reads_with_the_leaders_state_and_forward_writes() -> anyhow::Result<()> {
    if !running_as_root("HA test") {
        return Ok(());
    }
    let cluster = HaCluster::start(2)?;
    let leader = cluster.wait_leader(WAIT)?;
    let standby = 1 - leader;
    let api = cluster.api(leader)?;
    for i in 0..5 {
        api.create_job(&command_job(&format!("s{i}"), 1, false, "true"))?;
    }
    // Reads on the standby: every job the leader acknowledged, served by it.
    let (status, body, served_by) = get_on(&cluster, standby, &cluster.token, "/v1/jobs")?;
    assert_eq!(status, 200, "{body}");
    assert_eq!(served_by.as_deref(), Some(cluster.urls[leader].as_str()));
    let jobs: Vec<Value> = serde_json::from_str(&body)?;
    for i in 0..5 {
        let key = format!("www-data/test/s{i}");
        assert!(
            jobs.iter().any(|j| j["key"] == key),
            "{key} missing: {body}"
        );
    }
    let (status, on_standby, _) = get_on(&cluster, standby, &cluster.token, &job_path("s3"))?;
    assert_eq!(status, 200, "{on_standby}");
    let on_standby: JobView = serde_json::from_str(&on_standby)?;
    let on_leader: JobView = api.get(&job_path("s3"))?;
    assert_eq!(on_standby.spec, on_leader.spec);
    // A write sent to the standby is done by the leader.
    let (status, body) = cluster
        .api(standby)?
        .post("/v1/jobs", &command_job("via-standby", 1, false, "true"))?;
    assert_eq!(status, 201, "{body}");
    let view: JobView = api.get(&job_path("via-standby"))?;
    assert_eq!(view.key, "www-data/test/via-standby");
    // Tokens are checked by the leader: a bad one is refused through the standby.
    let (status, _, _) = get_on(&cluster, standby, "0123.bad", "/v1/jobs")?;
    assert_eq!(status, 401);
    // Agent traffic is not forwarded: the standby names the leader.
    let refused = reqwest::blocking::Client::new()
        .post(format!(
            "{}/v1/agents/ha-agent-0/heartbeat",
            cluster.urls[standby]
        ))
        .json(&json!({}))
        .send()?;
    assert_eq!(refused.status().as_u16(), 503);
    assert_eq!(
        refused
            .headers()
            .get(drover_common::wire::LEADER_HEADER)
            .and_then(|v| v.to_str().ok()),
        Some(cluster.urls[leader].as_str())
    );
    // /health stays the standby's own.
    let health = cluster.health(standby).context("no /health")?;
    assert_eq!(health["leader"], Value::Bool(false), "{health}");
    all_finished_once(
        &cluster,
        &(0..5)
            .map(|i| format!("s{i}"))
            .chain(["via-standby".to_string()])
            .collect(),
    )
}

/// A GET of master `k` that accepts a stale answer (`X-Drover-Allow-Stale`), with
/// the copy header of the answer: (status, body, copy index).
fn get_stale_on(
    cluster: &HaCluster,
    k: usize,
    path: &str,
) -> anyhow::Result<(u16, String, Option<u64>)> {
    let (status, body, headers) = get_with(cluster, k, &cluster.token, path, true)?;
    let index = headers
        .get("x-drover-copy-index")
        .and_then(|v| v.to_str().ok()?.parse().ok());
    Ok((status, body, index))
}

/// Whether an instance of the job runs a RUNNING task.
fn a_task_running(view: &JobView) -> bool {
    view.instances.iter().any(|i| {
        i.current
            .as_ref()
            .is_some_and(|t| t.state == TaskState::Running)
    })
}

/// The store batch a standby's copy holds, from its `/health`.
fn copy_index(cluster: &HaCluster, k: usize) -> Option<u64> {
    cluster.health(k)?["copy"]["index"].as_u64()
}

#[test]
fn a_standby_answers_stale_reads_from_its_copy_while_a_dead_leaders_lease_runs_out(
) -> anyhow::Result<()> {
    if !running_as_root("HA test") {
        return Ok(());
    }
    // A long lease: the dead leader is not replaced for a while.
    let mut cluster = HaCluster::start_with(HaOptions {
        master_config: format!("{TEST_MASTER_CONFIG}lease_ttl = \"20s\"\n"),
        ..HaOptions::new(2)
    })?;
    let leader = cluster.wait_leader(WAIT)?;
    let standby = 1 - leader;
    let api = cluster.api(leader)?;
    api.create_job(&command_job("before", 1, true, "sleep 600"))?;
    cluster.wait_for("the standby's copy", WAIT, |c| copy_index(c, standby))?;
    // The copy follows the store: a job created after its first read shows up.
    let (status, body) = api.post("/v1/jobs", &command_job("after", 1, true, "sleep 600"))?;
    assert_eq!(status, 201, "{body}");
    cluster.wait_for("the job RUNNING", WAIT, |c| {
        a_task_running(&c.job("after").ok()?).then_some(())
    })?;
    let leaders: Value = api.get("/v1/changes?index=0")?;
    let wanted = leaders["index"]
        .as_u64()
        .context("no index in /v1/changes")?;
    let held = cluster.wait_for("the copy to catch up with the leader", WAIT, |c| {
        copy_index(c, standby).filter(|&i| i >= wanted)
    })?;
    // The leader dies; its lease runs for 20 s more, so nobody leads meanwhile.
    cluster.kill_master(leader);
    // Reads are consistent unless they accept a stale answer: a plain one is
    // refused while no leader answers.
    let (status, body, _) = get_on(&cluster, standby, &cluster.token, &job_path("after"))?;
    assert_eq!(status, 503, "a consistent read during the failover: {body}");
    let (status, body, index) = get_stale_on(&cluster, standby, &job_path("after"))?;
    assert_eq!(status, 200, "{body}");
    let index = index.context("a read during the failover is not marked as from the copy")?;
    assert!(index >= held, "copy index {index} went back from {held}");
    let view: JobView = serde_json::from_str(&body)?;
    assert_eq!(view.key, "www-data/test/after");
    assert!(
        a_task_running(&view),
        "the copy does not hold the RUNNING task: {view:?}"
    );
    let (status, body, _) = get_stale_on(&cluster, standby, "/v1/jobs")?;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("www-data/test/before") && body.contains("www-data/test/after"));
    // The CLI given every master reads it with --stale.
    let out = std::process::Command::new(bin("drover")?)
        .args(["--stale", "job", "status", "www-data/test/after"])
        .env("DROVER_MASTER", cluster.urls.join(","))
        .env("DROVER_TOKEN", &cluster.token)
        .env("DROVER_CONFIG", "/nonexistent/drover-test-config.toml")
        .env_remove("DROVER_TOKEN_FILE")
        .env_remove("DROVER_CA")
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("RUNNING"),
        "drover --stale job status: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Writes are never answered from the copy; neither is a bad token.
    let (status, body) = cluster
        .api(standby)?
        .post("/v1/jobs", &command_job("refused", 1, false, "true"))?;
    assert_eq!(status, 503, "a write during the failover: {body}");
    let (status, _, _) = get_with(&cluster, standby, "0123.bad", "/v1/jobs", true)?;
    assert_eq!(status, 401, "the copy took a bad token");
    assert_eq!(
        cluster.leader(),
        None,
        "a leader was elected within the lease"
    );
    // Once the lease ran out the standby leads, with everything acknowledged.
    cluster.wait_for("the standby to lead", Duration::from_secs(90), |c| {
        (c.leader() == Some(standby)).then_some(())
    })?;
    let view: JobView = cluster.api(standby)?.get(&job_path("after"))?;
    assert_eq!(view.key, "www-data/test/after");
    Ok(())
}

#[test]
fn the_cli_given_every_master_rides_a_failover_and_creates_each_job_once() -> anyhow::Result<()> {
    if !running_as_root("HA test") {
        return Ok(());
    }
    let mut cluster = HaCluster::start(3)?;
    let leader = cluster.wait_leader(WAIT)?;
    let pid = cluster.master_pid(leader).context("the leader's pid")?;
    let masters = cluster.urls.join(",");
    let specs = cluster.dir().join("specs");
    std::fs::create_dir_all(&specs)?;
    // Two CLI loops create jobs while the leader is SIGKILLed a moment in; each goes
    // on for AFTER_KILL creates once the kill happened, however fast the CLI is.
    const AFTER_KILL: usize = 10;
    let killed = Arc::new(AtomicBool::new(false));
    let killer = {
        let killed = killed.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(1000));
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), Signal::SIGKILL);
            let at = Instant::now();
            killed.store(true, Ordering::SeqCst);
            at
        })
    };
    let loops: Vec<_> = (0..2)
        .map(|l| {
            let (masters, token, specs) = (masters.clone(), cluster.token.clone(), specs.clone());
            let killed = killed.clone();
            std::thread::spawn(
                move || -> anyhow::Result<Vec<(String, Instant, Duration)>> {
                    let mut done = Vec::new();
                    let mut after_kill = 0;
                    for i in 0..1_000 {
                        if killed.load(Ordering::SeqCst) {
                            after_kill += 1;
                            if after_kill > AFTER_KILL {
                                break;
                            }
                        }
                        let name = format!("c{l}-{i:03}");
                        let file = specs.join(format!("{name}.json"));
                        std::fs::write(&file, command_job(&name, 1, false, "true").to_string())?;
                        let began = Instant::now();
                        let out = std::process::Command::new(bin("drover")?)
                            .args(["job", "create"])
                            .arg(&file)
                            .env("DROVER_MASTER", &masters)
                            .env("DROVER_TOKEN", &token)
                            .env("DROVER_CONFIG", "/nonexistent/drover-test-config.toml")
                            .env_remove("DROVER_TOKEN_FILE")
                            .env_remove("DROVER_CA")
                            .output()?;
                        anyhow::ensure!(
                            out.status.success(),
                            "drover job create {name} failed: {}\n{}",
                            String::from_utf8_lossy(&out.stdout),
                            String::from_utf8_lossy(&out.stderr)
                        );
                        let stderr = String::from_utf8_lossy(&out.stderr);
                        if !stderr.trim().is_empty() {
                            eprintln!("{name}: {}", stderr.trim());
                        }
                        done.push((name, began, began.elapsed()));
                    }
                    Ok(done)
                },
            )
        })
        .collect();
    let mut done = Vec::new();
    for l in loops {
        done.extend(
            l.join()
                .map_err(|_| anyhow::anyhow!("a CLI loop panicked"))?
                .map_err(|e| anyhow::anyhow!("{e}\n{}", cluster.diagnostics()))?,
        );
    }
    let killed_at = killer
        .join()
        .map_err(|_| anyhow::anyhow!("the killer panicked"))?;
    cluster.kill_master(leader);
    let slowest = done.iter().map(|d| d.2).max().unwrap_or_default();
    let after_kill = done.iter().filter(|d| d.1 + d.2 > killed_at).count();
    let count = done.len();
    eprintln!("{count} creates, the slowest took {slowest:?}; {after_kill} ended after the kill");
    assert!(
        after_kill > 0,
        "every create ended before the leader was killed: nothing was tested"
    );
    let created: BTreeSet<String> = done.into_iter().map(|d| d.0).collect();
    assert_eq!(created.len(), count, "a job name was created twice");
    let new = cluster.wait_leader(WAIT)?;
    assert_ne!(new, leader, "the killed master leads");
    let jobs: Vec<Value> = cluster.get("/v1/jobs")?;
    let present: BTreeSet<String> = jobs
        .iter()
        .filter_map(|j| j["key"].as_str()?.strip_prefix("www-data/test/"))
        .map(str::to_string)
        .collect();
    assert_eq!(present, created, "the jobs differ from the creates");
    all_finished_once(&cluster, &created)
}
