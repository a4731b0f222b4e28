//! Black-box: service discovery with a real master, agent and executor. An
//! instance appears in `GET /v1/services/...` when its task is RUNNING, a long poll
//! wakes on the change, a kill withdraws the instance at once and reaches the task
//! only `drain_delay` later (its process still runs meanwhile), and a discovery
//! token reads services but not jobs. Prints the latency from the task's RUNNING
//! or KILLING decision (its event's timestamp, before the commit) to the long
//! poll's answer. `drover service list|show` read it through the CLI, and a role
//! token reads its own role's services only.

#![allow(clippy::unwrap_used)] // unwrap is how tests fail

use std::time::{Duration, Instant};

use drover_common::state::{now_ms, TaskState};
use drover_common::wire::ServiceView;
use drover_tests::{drover_as, processes_under, running_as_root, Cluster, ClusterConfig};
use serde_json::json;

const KEY: &str = "www-data/test/web";
const SERVICE: &str = "/v1/services/www-data/test/web";

fn announced_job() -> serde_json::Value {
    json!({
        "role": "www-data",
        "environment": "test",
        "name": "web",
        "instances": 1,
        "service": true,
        "task": {
            "processes": [{"name": "main", "cmdline": "exec sleep 600"}],
            "resources": {"cpu": 0.1, "ram": "32MiB", "disk": "32MiB", "ports": ["http", "admin"]},
            "finalization_wait": "1s"
        },
        "announce": {"primary_port": "http", "ports": ["admin"], "drain_delay": "2s"}
    })
}

/// A long poll of the service from `index`, on its own thread: the view and the
/// wall clock when it answered.
fn poll_from(cluster: &Cluster, index: u64) -> std::thread::JoinHandle<(ServiceView, u64)> {
    let http = cluster.http();
    let url = format!("{}{SERVICE}?index={index}&wait_ms=20000", cluster.url);
    let token = cluster.token.clone().unwrap_or_default();
    std::thread::spawn(move || {
        let view: ServiceView = http
            .get(url)
            .bearer_auth(token)
            .send()
            .expect("the long poll answers")
            .json()
            .expect("a ServiceView");
        (view, now_ms())
    })
}

/// The timestamp of the task's latest event into `state`.
fn entered(cluster: &Cluster, task: &str, state: TaskState) -> u64 {
    let t = cluster.task(task).unwrap();
    t.events
        .iter()
        .rev()
        .find(|e| e.state == state)
        .map(|e| e.timestamp_ms)
        .unwrap_or_else(|| panic!("{task} never entered {state}: {:?}", t.events))
}

#[test]
fn an_instance_is_announced_while_running_and_withdrawn_drain_delay_before_its_kill() {
    if !running_as_root("service discovery test") {
        return;
    }
    let mut cluster = Cluster::start(ClusterConfig::agents(1)).unwrap();
    let created = cluster.create_job(&announced_job()).unwrap();
    let task = created["tasks"][0].as_str().unwrap().to_string();
    // The job exists: its service answers, maybe with no endpoint yet.
    let first: ServiceView = cluster.get(SERVICE).unwrap();
    assert_eq!(first.job, KEY);
    let mut index = first.index;
    let mut view = first;
    let mut answered = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while view.endpoints.is_empty() {
        assert!(Instant::now() < deadline, "never announced: {view:?}");
        let (v, at) = poll_from(&cluster, index).join().unwrap();
        assert!(v.index > index || v.endpoints.is_empty(), "{v:?}");
        index = v.index;
        view = v;
        answered = at;
    }
    let e = &view.endpoints[0];
    assert_eq!(e.task_id, task);
    assert_eq!(e.ip, "127.0.0.1", "{e:?}");
    assert_eq!(e.ports.len(), 2, "{e:?}");
    assert!(e.ports.contains_key("http") && e.ports.contains_key("admin"));
    assert_eq!(cluster.task(&task).unwrap().state, TaskState::Running);
    let running_at = entered(&cluster, &task, TaskState::Running);
    let announce_ms = answered.saturating_sub(running_at);
    eprintln!("announced: the long poll answered {announce_ms} ms after the RUNNING decision");

    // The CLI lists and shows it.
    let out = cluster.drover(&["service", "list"]).unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = text
        .lines()
        .find(|l| l.starts_with("www-data/test/web"))
        .unwrap_or_else(|| panic!("no line for the service: {text}"));
    let cols: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(cols, ["www-data/test/web", KEY, "http", "1"], "{text}");
    let out = cluster
        .drover(&["service", "show", "www-data/test/web"])
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains(&task), "{text}");
    assert!(text.contains("Primary: http"), "{text}");
    let row = text
        .lines()
        .find(|l| l.contains(&task))
        .unwrap_or_else(|| panic!("no row for {task}: {text}"));
    assert!(row.starts_with('0') && row.contains("127.0.0.1"), "{row}");
    assert!(row.contains("http") && row.contains("admin"), "{row}");
    // An unknown service is an error naming it.
    let out = cluster
        .drover(&["service", "show", "www-data/test/nope"])
        .unwrap();
    assert!(!out.status.success(), "an unknown service succeeded");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("nope"), "{err}");

    // A discovery token reads services, not jobs.
    let discovery = cluster.create_token(&json!({"kind": "discovery"})).unwrap();
    let get = |path: &str| {
        cluster
            .http()
            .get(format!("{}{path}", cluster.url))
            .bearer_auth(&discovery)
            .send()
            .unwrap()
            .status()
            .as_u16()
    };
    assert_eq!(get(SERVICE), 200);
    assert_eq!(get("/v1/services"), 200);
    assert_eq!(get("/v1/jobs"), 403);
    assert_eq!(get(&format!("/v1/jobs/{KEY}")), 403);
    // The CLI with a discovery token lists it too.
    let out = drover_as(Some(&cluster.url), Some(&discovery), &["service", "list"]).unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains(KEY), "{text}");

    // A role token reads its role's service, not another role's.
    let status_as = |token: &str, path: &str| {
        cluster
            .http()
            .get(format!("{}{path}", cluster.url))
            .bearer_auth(token)
            .send()
            .unwrap()
            .status()
            .as_u16()
    };
    let other = cluster
        .create_token(&json!({"kind": "roles", "roles": ["other"]}))
        .unwrap();
    let own = cluster
        .create_token(&json!({"kind": "roles", "roles": ["www-data"]}))
        .unwrap();
    assert_eq!(status_as(&other, SERVICE), 403);
    assert_eq!(status_as(&own, SERVICE), 200);
    let out = drover_as(
        Some(&cluster.url),
        Some(&other),
        &["service", "show", "www-data/test/web"],
    )
    .unwrap();
    assert!(
        !out.status.success(),
        "another role's token read the service"
    );

    // The kill: withdrawn at once, the task's process runs on for the drain delay.
    let poll = poll_from(&cluster, index);
    std::thread::sleep(Duration::from_millis(200));
    let sandbox = cluster.sandbox_of(&task).expect("the task's sandbox");
    cluster.kill_job(KEY).unwrap();
    let (withdrawn, answered) = poll.join().unwrap();
    assert!(withdrawn.endpoints.is_empty(), "{withdrawn:?}");
    let killing_at = entered(&cluster, &task, TaskState::Killing);
    let withdraw_ms = answered.saturating_sub(killing_at);
    eprintln!("withdrawn: the long poll answered {withdraw_ms} ms after the kill decision");
    // During the delay: KILLING, not announced, its process alive.
    let during = cluster.task(&task).unwrap();
    assert_eq!(during.state, TaskState::Killing);
    assert!(
        !processes_under(&sandbox).is_empty(),
        "the task's process runs during the drain delay"
    );
    let view = cluster.wait_for_all(KEY, TaskState::Killed).unwrap();
    let ended = view.instances[0].current.as_ref().unwrap();
    let killed_at = ended
        .events
        .iter()
        .find(|e| e.state == TaskState::Killed)
        .map(|e| e.timestamp_ms)
        .unwrap();
    assert!(
        killed_at - killing_at >= 2_000,
        "the kill reached the task {} ms after the withdrawal, before the 2s drain delay",
        killed_at - killing_at
    );
    // The debug build's figures, generous bounds (docs: under 50 ms as measured).
    assert!(announce_ms < 1_000, "{announce_ms} ms");
    assert!(withdraw_ms < 1_000, "{withdraw_ms} ms");
}

/// The member keys under `/drover-announce/www-data/test/web/`, their JSON and lease.
fn members(etcd: &mut drover_tests::etcd::EtcdClient) -> Vec<(String, serde_json::Value, i64)> {
    let resp = etcd
        .run(async |e| {
            e.get(
                "/drover-announce/www-data/test/web/",
                Some(etcd_client::GetOptions::new().with_prefix()),
            )
            .await
        })
        .unwrap();
    resp.kvs()
        .iter()
        .map(|kv| {
            (
                kv.key_str().unwrap().to_string(),
                serde_json::from_slice(kv.value()).unwrap(),
                kv.lease(),
            )
        })
        .collect()
}

#[test]
fn a_master_on_etcd_announces_serverset_members_and_its_successor_takes_them_over() {
    use drover_tests::etcd::{etcd_installed, EtcdSettings};
    use drover_tests::ha::{HaCluster, HaOptions};
    if !etcd_installed() || !running_as_root("etcd announce test") {
        eprintln!("skipped: needs etcd (scripts/setup.sh) and root");
        return;
    }
    let mut options = HaOptions::new(2);
    options.etcd = EtcdSettings {
        members: 1,
        ..EtcdSettings::default()
    };
    let mut c = HaCluster::start_with(options).unwrap();
    let leader = c.wait_leader(drover_tests::WAIT).unwrap();
    let api = c.api(leader).unwrap();
    let created = api.create_job(&announced_job()).unwrap();
    let task = created["tasks"][0].as_str().unwrap().to_string();
    let mut etcd = c.etcd.client().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let found = loop {
        let m = members(&mut etcd);
        if !m.is_empty() {
            break m;
        }
        assert!(Instant::now() < deadline, "no member key appeared");
        std::thread::sleep(Duration::from_millis(50));
    };
    let view: ServiceView = api.get(SERVICE).unwrap();
    assert_eq!(view.endpoints[0].task_id, task);
    let http = view.endpoints[0].ports["http"];
    let admin = view.endpoints[0].ports["admin"];
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(
        found[0].0,
        "/drover-announce/www-data/test/web/member_0000000000"
    );
    assert_eq!(
        found[0].1,
        json!({
            "serviceEndpoint": {"host": "127.0.0.1", "port": http},
            "additionalEndpoints": {
                "admin": {"host": "127.0.0.1", "port": admin},
                "http": {"host": "127.0.0.1", "port": http}
            },
            "status": "ALIVE",
            "shard": 0
        })
    );
    // The leader dies: the next one writes the member again under its own lease.
    let old_lease = found[0].2;
    c.kill_master(leader);
    let next = c.wait_leader(drover_tests::WAIT).unwrap();
    assert_ne!(next, leader);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let m = members(&mut etcd);
        if m.len() == 1 && m[0].2 != old_lease {
            assert_eq!(m[0].1, found[0].1);
            break;
        }
        assert!(Instant::now() < deadline, "not taken over: {m:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let api = c.api(next).unwrap();
    // The kill withdraws it from etcd too, before the task is killed.
    api.kill_job(KEY).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !members(&mut etcd).is_empty() {
        assert!(Instant::now() < deadline, "the member key stayed");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(api.task(&task).unwrap().state, TaskState::Killing);
}

#[test]
fn a_failed_health_check_withdraws_the_instance_drain_delay_before_the_kill() {
    if !running_as_root("service discovery health test") {
        return;
    }
    let cluster = Cluster::start(ClusterConfig::agents(1)).unwrap();
    let mut job = announced_job();
    job["name"] = json!("sick");
    job["health_check"] = json!({
        "type": "shell",
        "command": "test ! -e \"{{sandbox}}/fail\"",
        "initial_interval": "1s",
        "interval": "200ms",
        "timeout": "1s",
        "max_consecutive_failures": 0
    });
    let created = cluster.create_job(&job).unwrap();
    let task = created["tasks"][0].as_str().unwrap().to_string();
    let path = "/v1/services/www-data/test/sick";
    let deadline = Instant::now() + Duration::from_secs(30);
    while cluster
        .get::<ServiceView>(path)
        .unwrap()
        .endpoints
        .is_empty()
    {
        assert!(Instant::now() < deadline, "never announced");
        std::thread::sleep(Duration::from_millis(50));
    }
    let sandbox = cluster.sandbox_of(&task).unwrap().join("sandbox");
    std::fs::write(sandbox.join("fail"), "").unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cluster
        .get::<ServiceView>(path)
        .unwrap()
        .endpoints
        .is_empty()
    {
        assert!(Instant::now() < deadline, "never withdrawn");
        std::thread::sleep(Duration::from_millis(20));
    }
    let withdrawn = Instant::now();
    // Withdrawn while still RUNNING, its process alive: the stop waits 2 s.
    assert_eq!(cluster.task(&task).unwrap().state, TaskState::Running);
    assert!(!processes_under(&cluster.sandbox_of(&task).unwrap()).is_empty());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let t = cluster.task(&task).unwrap();
        if t.state.is_terminal() {
            assert_eq!(t.state, TaskState::Failed, "{t:?}");
            break;
        }
        assert!(Instant::now() < deadline, "never ended: {t:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        withdrawn.elapsed() >= Duration::from_millis(1_900),
        "ended {:?} after the withdrawal, before the 2s drain delay",
        withdrawn.elapsed()
    );
    cluster.kill_job("www-data/test/sick").unwrap();
}

/// The long poll's answer from `index` and its `X-Drover-Index` header.
fn poll_with_header(
    cluster: &Cluster,
    path: &str,
    index: u64,
) -> std::thread::JoinHandle<(serde_json::Value, u64)> {
    let http = cluster.http();
    let url = format!("{}{path}?index={index}&wait_ms=20000", cluster.url);
    let token = cluster.token.clone().unwrap_or_default();
    std::thread::spawn(move || {
        let answer = http.get(url).bearer_auth(token).send().unwrap();
        let header: u64 = answer.headers()["x-drover-index"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        (answer.json().unwrap(), header)
    })
}

#[test]
fn a_long_poll_wakes_when_an_update_removes_an_instance() {
    if !running_as_root("service discovery test") {
        return;
    }
    let mut cluster = Cluster::start(ClusterConfig::agents(2)).unwrap();
    let mut spec = announced_job();
    spec["instances"] = json!(2);
    cluster.create_job(&spec).unwrap();
    let view = cluster
        .wait_for("both instances announced", drover_tests::WAIT, |c| {
            let v: ServiceView = c.get(SERVICE).ok()?;
            (v.endpoints.len() == 2).then_some(v)
        })
        .unwrap();
    // Waiting from the answer's index, on the service and on the list.
    let one = poll_with_header(&cluster, SERVICE, view.index);
    let all = poll_with_header(&cluster, "/v1/services", view.index);
    std::thread::sleep(Duration::from_millis(300));
    spec["instances"] = json!(1);
    let file = cluster.dir().join("web-1.json");
    std::fs::write(&file, spec.to_string()).unwrap();
    let out = cluster
        .drover(&["job", "update", file.to_str().unwrap()])
        .unwrap();
    assert!(out.status.success(), "{}", drover_tests::describe(&out));
    let (shown, header) = one.join().unwrap();
    assert!(header > view.index, "{header} after {}", view.index);
    assert_eq!(shown["index"].as_u64(), Some(header));
    assert_eq!(shown["endpoints"].as_array().unwrap().len(), 1, "{shown}");
    let (listed, header) = all.join().unwrap();
    assert!(header > view.index, "{header} after {}", view.index);
    assert_eq!(
        listed[0]["endpoints"].as_array().unwrap().len(),
        1,
        "{listed}"
    );
    cluster.kill_job(KEY).unwrap();
}
