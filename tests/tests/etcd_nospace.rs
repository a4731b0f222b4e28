//! Black-box: a master on etcd whose etcd runs out of space (a one-member etcd
//! started with a 4 MiB `--quota-backend-bytes`, filled by the test with keys of
//! its own until etcd answers "database space exceeded" and raises its NOSPACE
//! alarm) goes read-only like a master on a full disk: writes answer 507
//! `read_only` naming etcd and what to do, nothing refused is stored, reads are
//! served and the agent stays reachable with its task running. Once the operator
//! frees space (the filler deleted, etcd compacted and defragmented, the alarm
//! disarmed), writes resume by themselves and a new job runs. A master restarted
//! while the alarm is raised cannot be elected (etcd refuses lease grants): it
//! stands by and logs why, and leads once space is back.

use std::time::{Duration, Instant};

use drover_common::wire::JobView;
use drover_tests::etcd::{etcd_installed, EtcdSettings};
use drover_tests::ha::{HaCluster, HaOptions};
use drover_tests::{command_job, WAIT};
use etcd_client::{AlarmAction, AlarmOptions, AlarmType, CompactionOptions, DeleteOptions};
use serde_json::Value;

const FILLER: &str = "filler/";

fn running(c: &HaCluster, key: &str) -> Option<()> {
    let view: JobView = c.get(&format!("/v1/jobs/{key}")).ok()?;
    (drover_tests::running_instances(&view) == view.spec.instances as usize).then_some(())
}

#[test]
fn a_master_on_a_full_etcd_goes_read_only_and_resumes_once_etcd_has_room() -> anyhow::Result<()> {
    if !etcd_installed() {
        eprintln!("skipped: etcd is not installed (scripts/setup.sh installs it)");
        return Ok(());
    }
    let mut options = HaOptions::new(1);
    options.etcd = EtcdSettings {
        members: 1,
        quota_backend_bytes: Some(4 << 20),
        ..EtcdSettings::default()
    };
    let c = HaCluster::start_with(options)?;
    let leader = c.wait_leader(WAIT)?;
    let api = c.api(leader)?;
    api.create_job(&command_job("sleeper", 1, true, "exec sleep 100000"))?;
    c.wait_for("the sleeper running", WAIT, |c| {
        running(c, "www-data/test/sleeper")
    })?;

    // Fill etcd with keys of our own until it refuses for want of space.
    let mut etcd = c.etcd.client()?;
    let value = "x".repeat(256 << 10);
    let mut refused = None;
    for k in 0..200 {
        let key = format!("{FILLER}{k:04}");
        let v = value.clone();
        match etcd.run(async move |e| e.put(key, v, None).await) {
            Ok(_) => {}
            Err(e) => {
                refused = Some(e.to_string());
                break;
            }
        }
    }
    let refused = refused.expect("etcd never ran out of space");
    assert!(refused.contains("space exceeded"), "{refused}");

    // Writes are refused with 507, naming etcd and what frees it; nothing stored.
    let spec = command_job("refused", 1, true, "exec sleep 100000");
    let (status, body) = api
        .post("/v1/jobs", &spec)
        .map_err(|e| e.context(c.diagnostics()))?;
    assert_eq!(status, 507, "{body}");
    assert_eq!(body["error"]["code"], "read_only", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("etcd is out of space") && message.contains("alarm disarm"),
        "{message}"
    );
    let (status, _) = api.get_status("/v1/jobs/www-data/test/refused")?;
    assert_eq!(status, 404, "the refused job is not stored");
    // Reads are served; the agent's heartbeats are answered, its task runs on.
    std::thread::sleep(Duration::from_secs(6));
    let agents: Vec<Value> = c.get("/v1/agents")?;
    assert!(agents.iter().any(|a| a["reachable"] == true), "{agents:?}");
    assert!(running(&c, "www-data/test/sleeper").is_some());
    let (status, body) = api.post("/v1/jobs", &spec)?;
    assert_eq!(status, 507, "still read-only: {body}");

    // A master (re)started while the alarm is raised cannot be elected (etcd
    // refuses lease grants): it stands by, saying why, instead of failing.
    let mut c = c;
    c.kill_master(leader);
    c.start_master(leader)?;
    c.wait_for("the restarted master to answer /health", WAIT, |c| {
        c.health(leader)
    })?;
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        c.health(leader).map(|h| h["leader"].clone()),
        Some(Value::Bool(false))
    );
    assert!(
        c.master_log(leader).contains("etcd is out of space"),
        "{}",
        c.master_log(leader)
    );

    // The operator frees space: delete, compact, defragment, disarm.
    etcd.run(async |e| {
        e.delete(FILLER, Some(DeleteOptions::new().with_prefix()))
            .await
    })?;
    let revision = etcd.revision()?;
    etcd.run(async move |e| {
        e.compact(revision, Some(CompactionOptions::new().with_physical()))
            .await
    })?;
    etcd.run(async |e| e.defragment().await)?;
    // `etcdctl alarm disarm`: each raised alarm, by member.
    let members: Vec<u64> = etcd
        .run(async |e| e.alarm(AlarmAction::Get, AlarmType::None, None).await)?
        .alarms()
        .iter()
        .filter(|a| a.alarm() == AlarmType::Nospace)
        .map(|a| a.member_id())
        .collect();
    assert!(!members.is_empty(), "etcd raised its NOSPACE alarm");
    for member in members {
        let mut options = AlarmOptions::new();
        options.with_member(member);
        etcd.run(async move |e| {
            e.alarm(AlarmAction::Deactivate, AlarmType::Nospace, Some(options))
                .await
        })?;
    }

    // Writes resume by themselves (the restarted master is elected once etcd
    // grants leases again): the same create is accepted and runs.
    c.wait_leader(WAIT)?;
    let deadline = Instant::now() + WAIT;
    loop {
        let (status, body) = api.post("/v1/jobs", &spec)?;
        if status == 201 {
            break;
        }
        assert_eq!(status, 507, "{body}");
        assert!(Instant::now() < deadline, "writes did not resume: {body}");
        std::thread::sleep(Duration::from_millis(250));
    }
    c.wait_for("the new job running", WAIT, |c| {
        running(c, "www-data/test/refused")
    })?;
    assert!(running(&c, "www-data/test/sleeper").is_some());
    Ok(())
}
