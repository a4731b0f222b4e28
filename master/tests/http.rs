//! The master's HTTP API end to end in one process: a real store in a temp dir, a
//! real listener on 127.0.0.1:0, a fake agent, and a restart on the same data dir.

#![allow(clippy::unwrap_used)] // unwrap is how tests fail

mod common;

use std::time::{Duration, Instant};

use common::{config, job, start, Client, FakeAgent};
use drover_common::wire::{JobView, RegisterResponse, TaskView};
use drover_common::DesiredState;
use drover_common::TaskState;
use serde_json::{json, Value};

#[tokio::test]
async fn a_job_runs_on_a_fake_agent_and_is_killed_through_the_api() {
    let dir = tempfile::tempdir().unwrap();
    let h = start(dir.path()).await;
    let c = Client::new(&h);
    let mut agent = FakeAgent::register(&c, "agent-1", 4.0).await;
    let first = agent.poll(&c, 100).await;
    assert!(first.assignments.is_empty());

    let (s, created) = c.post("/v1/jobs", &job("hello", 2, true)).await;
    assert_eq!(s, 201, "{created}");
    assert_eq!(created["job"], "www/prod/hello");
    let ids: Vec<String> = serde_json::from_value(created["tasks"].clone()).unwrap();
    assert_eq!(ids.len(), 2);

    // One agent, a service: one instance per host, the other waits with a reason.
    let set = agent.poll(&c, 5_000).await;
    assert_eq!(set.assignments.len(), 1);
    let placed = set.assignments[0].task.task_id.clone();
    assert!(set.assignments[0].task.ports.contains_key("http"));
    let other = ids.iter().find(|i| **i != placed).unwrap();
    let (_, t) = c.get(&format!("/v1/tasks/{other}")).await;
    let t: TaskView = serde_json::from_value(t).unwrap();
    assert_eq!(t.state, TaskState::Pending);
    assert_eq!(
        t.pending_reason.as_deref(),
        Some("host limit reached on 1 agent")
    );

    let ack = agent
        .report(
            &c,
            &[
                (&placed, TaskState::Starting),
                (&placed, TaskState::Running),
            ],
        )
        .await;
    assert_eq!(ack.acked, vec![(placed.clone(), 2)]);
    let (_, v) = c.get("/v1/jobs/www/prod/hello").await;
    let view: JobView = serde_json::from_value(v).unwrap();
    assert_eq!(view.state_counts.get(&TaskState::Running), Some(&1));

    let (s, killed) = c
        .post("/v1/jobs/www/prod/hello/kill", &json!({"instances": "0-1"}))
        .await;
    assert_eq!(s, 200, "{killed}");
    let set = agent.poll(&c, 5_000).await;
    assert_eq!(set.assignments[0].desired, DesiredState::Shutdown);
    agent.report(&c, &[(&placed, TaskState::Killed)]).await;
    let (_, t) = c.get(&format!("/v1/tasks/{placed}")).await;
    assert_eq!(t["state"], "KILLED");
    let (_, t) = c.get(&format!("/v1/tasks/{other}")).await;
    assert_eq!(t["state"], "KILLED");
    let (_, agents) = c.get("/v1/agents").await;
    assert_eq!(agents[0]["agent_id"], "agent-1");
    assert_eq!(agents[0]["free"]["cpu"], 4.0);

    // The job is fully terminal now: creating it again replaces it.
    let (s, _) = c.post("/v1/jobs", &job("hello", 1, true)).await;
    assert_eq!(s, 201);
    h.stop().await.unwrap();
}

#[tokio::test]
async fn api_errors_are_json_with_codes_and_fields() {
    let dir = tempfile::tempdir().unwrap();
    let h = start(dir.path()).await;
    let c = Client::new(&h);

    let mut bad = job("bad", 1, false);
    bad["task"]["resources"]["cpu"] = json!(-1);
    let (s, e) = c.post("/v1/jobs", &bad).await;
    assert_eq!(s, 400, "{e}");
    assert_eq!(e["error"]["code"], "invalid_spec");
    assert!(e["error"]["field"].as_str().unwrap().contains("cpu"), "{e}");

    let mut typo = job("typo", 1, false);
    typo["instancs"] = json!(2);
    let (s, e) = c.post("/v1/jobs", &typo).await;
    assert_eq!(s, 400);
    assert_eq!(e["error"]["code"], "invalid_spec");

    let (s, _) = c.post("/v1/jobs", &job("dup", 1, false)).await;
    assert_eq!(s, 201);
    let (s, e) = c.post("/v1/jobs", &job("dup", 1, false)).await;
    assert_eq!(s, 409);
    assert_eq!(e["error"]["code"], "job_exists");

    let deep = format!("{}{}", "[".repeat(100), "]".repeat(100));
    let (s, e) = c.post_raw("/v1/jobs", deep).await;
    assert_eq!(s, 400);
    assert_eq!(e["error"]["code"], "too_deep");

    let huge = format!("\"{}\"", "x".repeat(2 * 1024 * 1024));
    let (s, e) = c.post_raw("/v1/jobs", huge).await;
    assert_eq!(s, 413);
    assert_eq!(e["error"]["code"], "body_too_large");

    let (s, e) = c.get("/v1/jobs/www/prod/nope").await;
    assert_eq!(s, 404);
    assert_eq!(e["error"]["code"], "not_found");
    let (s, e) = c.get("/v1/tasks/nope-0-000000000000").await;
    assert_eq!(s, 404);
    assert_eq!(e["error"]["field"], "task_id");

    let (s, e) = c
        .post("/v1/jobs/www/prod/dup/kill", &json!({"instances": "5"}))
        .await;
    assert_eq!(s, 400);
    assert_eq!(e["error"]["code"], "invalid_instances");
    let (s, e) = c
        .post("/v1/jobs/www/prod/dup/kill", &json!({"instances": "x-y"}))
        .await;
    assert_eq!(s, 400);
    assert_eq!(e["error"]["field"], "instances");

    let (s, v) = c
        .post(
            "/v1/agents/ghost/heartbeat",
            &json!({"task_digest": 0, "assignments_version": 0}),
        )
        .await;
    // An agent token that never registered is bound to no agent yet.
    assert_eq!(s, 403, "{v}");
    assert_eq!(v["error"]["code"], "forbidden");
    let (s, e) = c
        .get("/v1/agents/ghost/assignments?after_version=0&wait_ms=10")
        .await;
    assert_eq!(s, 403);
    assert_eq!(e["error"]["field"], "permission");
    let (s, e) = c
        .post(
            "/v1/agents/register",
            &json!({"protocol_version": 99, "agent_id": "a", "hostname": "h", "address": "x",
                    "resources": {"cpu": 1.0, "ram_bytes": 1, "disk_bytes": 1, "port_range": [1, 2]},
                    "attributes": {}}),
        )
        .await;
    assert_eq!(s, 400);
    assert_eq!(e["error"]["code"], "unsupported_protocol");

    let r = reqwest::get(format!("http://{}/health", h.addr))
        .await
        .unwrap();
    assert_eq!(r.text().await.unwrap(), "ok");
    // The web UI's files need no token (they hold no data); any /ui/... path is the
    // page, whose script is served beside it; an unknown asset is a 404.
    for path in ["/", "/ui", "/ui/", "/ui/jobs/www/prod/dup"] {
        let r = reqwest::get(format!("http://{}{path}", h.addr))
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let csp = r.headers()["content-security-policy"]
            .to_str()
            .unwrap()
            .to_string();
        assert!(csp.contains("default-src 'none'"), "{path}: {csp}");
        assert!(
            r.text().await.unwrap().contains("/ui/assets/app.js"),
            "{path}"
        );
    }
    let r = reqwest::get(format!("http://{}/ui/assets/app.js", h.addr))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/javascript"));
    let r = reqwest::get(format!("http://{}/ui/assets/nope.js", h.addr))
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    h.stop().await.unwrap();
}

#[tokio::test]
async fn the_long_poll_answers_as_soon_as_a_task_is_placed_and_times_out_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let h = start(dir.path()).await;
    let c = Client::new(&h);
    let mut agent = FakeAgent::register(&c, "agent-1", 4.0).await;
    agent.poll(&c, 10).await;
    let version = agent.version;

    let started = Instant::now();
    let unchanged = agent.poll(&c, 300).await;
    assert!(started.elapsed() >= Duration::from_millis(290));
    assert_eq!(unchanged.version, version);

    let poller = {
        let c = c.clone();
        let mut a = FakeAgent {
            id: agent.id.clone(),
            version,
            seqs: Default::default(),
        };
        tokio::spawn(async move {
            let set = a.poll(&c, 20_000).await;
            (set, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let created_at = Instant::now();
    let (s, _) = c.post("/v1/jobs", &job("fast", 1, false)).await;
    assert_eq!(s, 201);
    let (set, woke_at) = poller.await.unwrap();
    assert_eq!(set.assignments.len(), 1);
    assert!(set.version > version);
    assert!(
        woke_at.duration_since(created_at) < Duration::from_secs(5),
        "the long poll waited for its timeout instead of waking"
    );
    h.stop().await.unwrap();
}

#[tokio::test]
async fn a_restarted_master_has_every_acknowledged_job_and_task() {
    let dir = tempfile::tempdir().unwrap();
    let h = start(dir.path()).await;
    let c = Client::new(&h);
    let mut agent = FakeAgent::register(&c, "agent-1", 16.0).await;
    let mut ids = Vec::new();
    for i in 0..5 {
        let (s, v) = c.post("/v1/jobs", &job(&format!("j{i}"), 3, false)).await;
        assert_eq!(s, 201);
        let t: Vec<String> = serde_json::from_value(v["tasks"].clone()).unwrap();
        ids.extend(t);
    }
    let set = agent.poll(&c, 1_000).await;
    let running = set.assignments[0].task.task_id.clone();
    agent
        .report(
            &c,
            &[
                (&running, TaskState::Starting),
                (&running, TaskState::Running),
            ],
        )
        .await;
    let before: Value = c.get("/v1/jobs").await.1;
    let version = agent.version;
    h.stop().await.unwrap();

    let h = start(dir.path()).await;
    let c = c.reconnect(&h);
    let addr = std::fs::read_to_string(dir.path().join("master.addr")).unwrap();
    assert_eq!(addr.trim(), h.addr.to_string());
    assert_eq!(c.get("/v1/jobs").await.1, before);
    for id in &ids {
        let (s, _) = c.get(&format!("/v1/tasks/{id}")).await;
        assert_eq!(s, 200, "task {id} lost across the restart");
    }
    let (_, t) = c.get(&format!("/v1/tasks/{running}")).await;
    assert_eq!(t["state"], "RUNNING");
    // The agent carries on: same version, asked for its full task set.
    let mut agent = FakeAgent {
        id: "agent-1".to_string(),
        version,
        seqs: agent.seqs,
    };
    let hb = agent.heartbeat(&c, &[&running]).await;
    assert!(hb.send_full_task_set);
    assert!(!hb.reregister);
    let set = agent.poll(&c, 10).await;
    assert_eq!(set.version, version);
    assert_eq!(set.assignments.len(), 15);
    // Re-applying an update already applied is acknowledged and changes nothing.
    agent.seqs.insert(running.clone(), 1);
    let ack = agent.report(&c, &[(&running, TaskState::Starting)]).await;
    assert_eq!(ack.acked, vec![(running.clone(), 2)]);
    let (_, t) = c.get(&format!("/v1/tasks/{running}")).await;
    assert_eq!(t["state"], "RUNNING");
    h.stop().await.unwrap();
}

#[tokio::test]
async fn stopping_ends_long_polls_at_once_instead_of_waiting_them_out() {
    let dir = tempfile::tempdir().unwrap();
    let h = start(dir.path()).await;
    let c = Client::new(&h);
    let mut agent = FakeAgent::register(&c, "agent-1", 4.0).await;
    agent.poll(&c, 10).await;
    let path = format!(
        "/v1/agents/agent-1/assignments?after_version={}&wait_ms=60000",
        agent.version
    );
    let request = c
        .http
        .get(format!("{}{path}", c.base))
        .bearer_auth(c.token_for(&path, None));
    let poll = tokio::spawn(async move { request.send().await.unwrap().status().as_u16() });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    h.stop().await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "stop waited for the long poll"
    );
    assert_eq!(poll.await.unwrap(), 503);
}

#[tokio::test]
async fn long_poll_answers_say_how_long_the_master_held_them() {
    let dir = tempfile::tempdir().unwrap();
    let h = start(dir.path()).await;
    let c = Client::new(&h);
    let mut agent = FakeAgent::register(&c, "agent-1", 4.0).await;
    agent.poll(&c, 10).await;
    let held = |after: u64, wait_ms: u64| {
        let path =
            format!("/v1/agents/agent-1/assignments?after_version={after}&wait_ms={wait_ms}");
        let request = c
            .http
            .get(format!("{}{path}", c.base))
            .bearer_auth(c.token_for(&path, None));
        async move {
            let response = request.send().await.unwrap();
            assert_eq!(response.status().as_u16(), 200);
            response.headers()["x-drover-held-ms"]
                .to_str()
                .unwrap()
                .parse::<u64>()
                .unwrap()
        }
    };
    // A changed version is answered at once; an unchanged one is held for the wait.
    assert!(held(agent.version + 1, 5_000).await < 1_000);
    assert!(held(agent.version, 400).await >= 400);
    h.stop().await.unwrap();
}

#[tokio::test]
async fn registration_tells_the_agent_the_masters_exclusive_lease() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.core.exclusive_lease_ms = 7_500;
    let h = drover_master::start(cfg).await.unwrap();
    let c = Client::new(&h);
    let (s, v) = c
        .post(
            "/v1/agents/register",
            &json!({"protocol_version": drover_common::wire::PROTOCOL_VERSION,
                    "agent_id": "a1", "hostname": "h", "address": "http://127.0.0.1:9",
                    "resources": {"cpu": 1.0, "ram_bytes": 1, "disk_bytes": 1, "port_range": [1, 2]},
                    "attributes": {}}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let resp: RegisterResponse = serde_json::from_value(v).unwrap();
    assert_eq!(resp.exclusive_lease_ms, Some(7_500));
    assert_eq!(resp.heartbeat_interval_ms, 500);
    h.stop().await.unwrap();
}
