//! Authentication and authorization end to end in one process: every route of the
//! router's table without a token (401), with a token of another role or agent
//! (403) and with the right one (allowed); revocation; agent identity binding;
//! secrets hidden from other roles; cheap instance-range errors.

#![allow(clippy::unwrap_used)] // unwrap is how tests fail

mod common;

use std::time::{Duration, Instant};

use common::{job, register_body, start, token, Client, FakeAgent};
use drover_common::TaskState;
use drover_master::auth::Grant;
use drover_master::http::{route_table, Access};
use serde_json::{json, Value};

async fn send(
    c: &Client,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &Value,
) -> (u16, Value) {
    let url = format!("{}{path}", c.base);
    let mut request = match method {
        "GET" => c.http.get(url),
        "POST" => c.http.post(url).json(body),
        other => panic!("no test for method {other}"),
    };
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// A token of one role.
fn role_token(h: &drover_master::Handle, role: &str) -> String {
    token(
        h,
        Grant::Roles {
            roles: vec![role.into()],
        },
    )
}

/// Every route in the router's table: no token -> 401, a token of another role or
/// agent -> 403, the right token -> neither. A new route must be given an `Access`
/// to exist at all, and a new `Access` does not compile until this test covers it.
#[tokio::test]
async fn every_route_needs_the_right_token() {
    let dir = tempfile::tempdir().unwrap();
    let h = start(dir.path()).await;
    let c = Client::new(&h);
    let mut agent = FakeAgent::register(&c, "agent-1", 4.0).await;
    let (s, created) = c.post("/v1/jobs", &job("hello", 1, false)).await;
    assert_eq!(s, 201, "{created}");
    let task_id = created["tasks"][0].as_str().unwrap().to_string();
    agent.poll(&c, 1_000).await;
    // The cron routes act on a cron job (www/prod/tick).
    let mut cron = job("tick", 1, false);
    cron["cron_schedule"] = json!("0 0 1 1 *");
    let (s, created) = c.post("/v1/jobs", &cron).await;
    assert_eq!(s, 201, "{created}");

    let www = role_token(&h, "www");
    let db = role_token(&h, "db");
    let operator = token(&h, Grant::Operator);
    let agent1 = c.token_for("/v1/agents/agent-1/heartbeat", None);
    let agent2 = token(&h, Grant::Agent { agent_id: None });
    let (s, v) = send(
        &c,
        "POST",
        "/v1/agents/register",
        Some(&agent2),
        &register_body("agent-2"),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let throwaway = h
        .tokens
        .create(Grant::Operator, String::new(), "test", 0)
        .unwrap()
        .0
        .id;

    let table = route_table();
    assert!(table.len() >= 15, "{table:?}");
    for def in table {
        let path = def
            .path
            .replace(":process", "main")
            .replace(":stream", "stdout")
            .replace(":role", "www")
            .replace(":env", "prod")
            .replace(
                ":name",
                if def.path.starts_with("/v1/cron/") {
                    "tick"
                } else {
                    "hello"
                },
            )
            .replace(":host", "agent-1")
            .replace(":instance", "0");
        let path = match def.access {
            Access::TaskRead => path.replace(":id", &task_id),
            Access::Agent => path.replace(":id", "agent-1"),
            Access::ManageTokens => path.replace(":id", &throwaway),
            _ => path.replace(":id", "agent-9"),
        };
        let body = match (def.method, def.path) {
            ("POST", "/v1/jobs") => job("other", 1, false),
            ("POST", "/v1/agents/register") => register_body("agent-1"),
            ("POST", "/v1/agents/:id/heartbeat") => {
                json!({"task_digest": 0, "assignments_version": 0})
            }
            ("POST", "/v1/agents/:id/updates") => json!({"updates": []}),
            ("POST", "/v1/tokens") => json!({"kind": "roles", "roles": ["x"]}),
            ("POST", "/v1/roles/:role/grant-user" | "/v1/roles/:role/revoke-user") => {
                json!({"user": "backup"})
            }
            ("POST", "/v1/quotas/:role") => {
                json!({"cpu": 100, "ram_bytes": 1u64 << 40, "disk_bytes": 1u64 << 40})
            }
            ("POST", "/v1/jobs/:role/:env/:name/update") => {
                let mut spec = job("hello", 1, false);
                spec["task"]["processes"][0]["cmdline"] = json!("sleep 200");
                json!({ "spec": spec })
            }
            // All at once: a rolling restart would be an update, and the update
            // route's own request would meet it.
            ("POST", "/v1/jobs/:role/:env/:name/restart") => json!({"all_at_once": true}),
            ("POST", p) if p.starts_with("/v1/hosts/") => json!({"hosts": ["agent-1"]}),
            _ => json!({}),
        };
        let path = if def.path.ends_with("/assignments") {
            format!("{path}?after_version=0&wait_ms=0")
        } else {
            path
        };
        let what = format!("{} {}", def.method, def.path);
        let (wrong, right): (Option<&str>, &str) = match def.access {
            Access::Public => (None, &www),
            Access::JobList | Access::ServiceList => (Some(&agent1), &www),
            Access::ServiceRead => (Some(&db), &www),
            Access::JobCreate | Access::JobRead | Access::JobWrite | Access::TaskRead => {
                (Some(&db), &www)
            }
            Access::ReadAll | Access::Maintenance => (Some(&db), &operator),
            Access::ManageTokens
            | Access::Override
            | Access::ManageQuotas
            | Access::ManageRoles => (Some(&operator), &c.admin),
            Access::AgentRegister => (Some(&www), &agent1),
            Access::Agent => (Some(&agent2), &agent1),
        };
        let (s, v) = send(&c, def.method, &path, None, &body).await;
        if def.access == Access::Public {
            assert_eq!(s, 200, "{what} without a token: {v}");
            continue;
        }
        assert_eq!(s, 401, "{what} without a token: {v}");
        assert_eq!(v["error"]["code"], "unauthorized", "{what}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("drover token create"),
            "{what}: {v}"
        );
        let (s, v) = send(
            &c,
            def.method,
            &path,
            Some("drv_0000000000000000_00"),
            &body,
        )
        .await;
        assert_eq!(s, 401, "{what} with a malformed token: {v}");
        if let Some(wrong) = wrong {
            let (s, v) = send(&c, def.method, &path, Some(wrong), &body).await;
            assert_eq!(s, 403, "{what} with another role's token: {v}");
            assert_eq!(v["error"]["field"], "permission", "{what}: {v}");
            assert!(
                v["error"]["message"].as_str().unwrap().contains("lacks"),
                "{what}: {v}"
            );
        }
        let (s, v) = send(&c, def.method, &path, Some(right), &body).await;
        if def.path.ends_with("/exec") {
            // Allowed; without a command (and an upgrade) it is refused as such.
            assert_eq!(s, 400, "{what} with the right token: {v}");
            assert_eq!(v["error"]["field"], "command", "{what}: {v}");
            continue;
        }
        if def.path.contains("/logs/") {
            // Allowed, and proxied to the fake agent, which serves no logs.
            assert_eq!(s, 502, "{what} with the right token: {v}");
            assert_eq!(v["error"]["code"], "agent_unreachable", "{what}: {v}");
            continue;
        }
        if def.path.starts_with("/v1/services/") {
            // Allowed; www/prod/hello announces nothing.
            assert_eq!(s, 404, "{what} with the right token: {v}");
            assert_eq!(v["error"]["code"], "not_found", "{what}: {v}");
            continue;
        }
        assert!(
            (200..300).contains(&s),
            "{what} with the right token answered {s}: {v}"
        );
    }
    h.stop().await.unwrap();
}

#[tokio::test]
async fn a_revoked_token_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let h = start(dir.path()).await;
    let c = Client::new(&h);
    let (s, v) = c
        .post("/v1/tokens", &json!({"kind": "roles", "roles": ["www"]}))
        .await;
    assert_eq!(s, 201, "{v}");
    let text = v["token"].as_str().unwrap().to_string();
    let id = v["id"].as_str().unwrap().to_string();
    let (s, _) = send(&c, "GET", "/v1/jobs", Some(&text), &Value::Null).await;
    assert_eq!(s, 200);
    let (_, listed) = c.get("/v1/tokens").await;
    assert!(
        !listed.to_string().contains(&text[20..]),
        "a listing shows no secret"
    );
    let (s, v) = c.post(&format!("/v1/tokens/{id}/revoke"), &json!({})).await;
    assert_eq!(s, 200, "{v}");
    let revoked_at = Instant::now();
    let (s, v) = send(&c, "GET", "/v1/jobs", Some(&text), &Value::Null).await;
    assert_eq!(s, 401, "{v}");
    assert!(revoked_at.elapsed() < Duration::from_secs(1));
    // The audit log has both mutations, with who did them.
    let audit = std::fs::read_to_string(dir.path().join("audit.log")).unwrap();
    let lines: Vec<Value> = audit
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(lines
        .iter()
        .any(|l| l["path"] == "/v1/tokens" && l["status"] == 201 && l["grant"] == "admin"));
    assert!(lines
        .iter()
        .any(|l| l["path"] == format!("/v1/tokens/{id}/revoke")));
    // A refused mutation is audited too, with the token that tried it.
    let db = role_token(&h, "db");
    let (s, _) = send(
        &c,
        "POST",
        "/v1/jobs/www/prod/x/kill",
        Some(&db),
        &json!({}),
    )
    .await;
    assert_eq!(s, 403);
    let audit = std::fs::read_to_string(dir.path().join("audit.log")).unwrap();
    assert!(
        audit.lines().any(|l| l.contains("/v1/jobs/www/prod/x/kill")
            && l.contains("403")
            && l.contains("roles:db")),
        "{audit}"
    );
    h.stop().await.unwrap();
}

#[tokio::test]
async fn an_agent_cannot_act_for_another_agent_or_its_tasks() {
    let dir = tempfile::tempdir().unwrap();
    let h = start(dir.path()).await;
    let c = Client::new(&h);
    let mut victim = FakeAgent::register(&c, "victim", 4.0).await;
    let (s, _) = c.post("/v1/jobs", &job("db", 1, false)).await;
    assert_eq!(s, 201);
    let set = victim.poll(&c, 2_000).await;
    let task = set.assignments[0].task.task_id.clone();
    victim
        .report(
            &c,
            &[(&task, TaskState::Starting), (&task, TaskState::Running)],
        )
        .await;

    let rogue = token(&h, Grant::Agent { agent_id: None });
    // Registering under the victim's id (a hijack) is refused, and changes nothing.
    let mut hijack = register_body("victim");
    hijack["address"] = json!("http://10.6.6.6:1");
    let (s, v) = send(&c, "POST", "/v1/agents/register", Some(&rogue), &hijack).await;
    assert_eq!(s, 403, "{v}");
    let (_, agents) = c.get("/v1/agents").await;
    assert_eq!(agents[0]["address"], "http://127.0.0.1:9");
    // The rogue registers as itself; then it is bound and cannot speak for the victim.
    let (s, _) = send(
        &c,
        "POST",
        "/v1/agents/register",
        Some(&rogue),
        &register_body("rogue"),
    )
    .await;
    assert_eq!(s, 200);
    let forged = json!({"updates": [{"task_id": task, "seq": 99, "state": "FINISHED",
        "exit_reason": null, "message": "", "timestamp_ms": 0}]});
    for (method, path, body) in [
        ("POST", "/v1/agents/victim/updates", forged.clone()),
        (
            "POST",
            "/v1/agents/victim/heartbeat",
            json!({"task_digest": 0, "assignments_version": 0}),
        ),
        (
            "GET",
            "/v1/agents/victim/assignments?after_version=0&wait_ms=0",
            Value::Null,
        ),
        ("POST", "/v1/agents/victim/drain", json!({})),
    ] {
        let (s, v) = send(&c, method, path, Some(&rogue), &body).await;
        assert_eq!(s, 403, "{path}: {v}");
    }
    // The refused drain left the victim's host in service.
    let (_, host) = c.get("/v1/hosts/victim").await;
    assert_eq!(host["mode"], "NONE", "{host}");
    // An agent drains its own host (its host is shutting down).
    let (s, v) = send(
        &c,
        "POST",
        "/v1/agents/rogue/drain",
        Some(&rogue),
        &json!({}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v[0]["agent_id"], "rogue", "{v}");
    assert_eq!(v[0]["mode"], "DRAINED", "nothing ran there: {v}");
    // Posting the victim's task under its own id changes nothing either (the core
    // only takes updates about an agent's own tasks).
    let (s, _) = send(
        &c,
        "POST",
        "/v1/agents/rogue/updates",
        Some(&rogue),
        &forged,
    )
    .await;
    assert_eq!(s, 200);
    let (_, t) = c.get(&format!("/v1/tasks/{task}")).await;
    assert_eq!(t["state"], "RUNNING");
    // Forbidding the rogue revokes its token.
    let (s, v) = c.post("/v1/agents/rogue/forbid", &json!({})).await;
    assert_eq!(s, 200, "{v}");
    let (s, _) = send(
        &c,
        "POST",
        "/v1/agents/rogue/heartbeat",
        Some(&rogue),
        &json!({"task_digest": 0, "assignments_version": 0}),
    )
    .await;
    assert_eq!(s, 401);
    let again = token(&h, Grant::Agent { agent_id: None });
    let (s, v) = send(
        &c,
        "POST",
        "/v1/agents/register",
        Some(&again),
        &register_body("rogue"),
    )
    .await;
    assert_eq!(s, 403, "a forbidden agent id cannot register again: {v}");
    h.stop().await.unwrap();
}

#[tokio::test]
async fn secrets_are_shown_only_to_the_jobs_role() {
    let dir = tempfile::tempdir().unwrap();
    let h = start(dir.path()).await;
    let c = Client::new(&h);
    let mut spec = job("secret", 1, false);
    spec["task"]["env"] = json!({"DB_PASSWORD": "hunter2"});
    let www = role_token(&h, "www");
    let (s, v) = send(&c, "POST", "/v1/jobs", Some(&www), &spec).await;
    assert_eq!(s, 201, "{v}");
    let (_, mine) = send(
        &c,
        "GET",
        "/v1/jobs/www/prod/secret",
        Some(&www),
        &Value::Null,
    )
    .await;
    assert_eq!(mine["spec"]["task"]["env"]["DB_PASSWORD"], "hunter2");
    for other in [c.admin.clone(), token(&h, Grant::Operator)] {
        let (s, v) = send(
            &c,
            "GET",
            "/v1/jobs/www/prod/secret",
            Some(&other),
            &Value::Null,
        )
        .await;
        assert_eq!(s, 200);
        assert_eq!(v["spec"]["task"]["env"]["DB_PASSWORD"], "(hidden)");
        assert!(!v.to_string().contains("hunter2"));
    }
    // A role token lists only its own role's jobs.
    let (s, _) = c
        .post(
            "/v1/jobs",
            &json!({"role": "db", "environment": "prod", "name": "x",
        "instances": 1, "task": {"processes": [{"name": "m", "cmdline": "true"}],
        "resources": {"cpu": 0.1, "ram": "1MiB", "disk": "1MiB"}}}),
        )
        .await;
    assert_eq!(s, 201);
    let (_, list) = send(&c, "GET", "/v1/jobs", Some(&www), &Value::Null).await;
    let keys: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, vec!["www/prod/secret"]);
    let (s, _) = send(&c, "GET", "/v1/jobs?role=db", Some(&www), &Value::Null).await;
    assert_eq!(s, 403);
    h.stop().await.unwrap();
}

/// Starting and steering an update needs jobs:write for the job's role, reading it
/// jobs:read: a token of another role (or an operator, for writes) gets 403 and the
/// update is as it was. Secrets in every config of the job stay hidden from others.
#[tokio::test]
async fn updates_need_the_jobs_role_and_a_refused_call_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let h = start(dir.path()).await;
    let c = Client::new(&h);
    let www = role_token(&h, "www");
    let db = role_token(&h, "db");
    let operator = token(&h, Grant::Operator);
    let mut spec = job("svc", 2, true);
    spec["task"]["env"] = json!({"DB_PASSWORD": "hunter2"});
    let (s, v) = send(&c, "POST", "/v1/jobs", Some(&www), &spec).await;
    assert_eq!(s, 201, "{v}");
    let base = "/v1/jobs/www/prod/svc";
    let update = format!("{base}/update");
    let mut new_spec = spec.clone();
    new_spec["task"]["env"] = json!({"DB_PASSWORD": "hunter3"});
    let body = json!({ "spec": new_spec });

    for wrong in [&db, &operator] {
        let (s, v) = send(&c, "POST", &update, Some(wrong), &body).await;
        assert_eq!(s, 403, "{v}");
        assert_eq!(v["error"]["field"], "permission", "{v}");
    }
    let (s, v) = send(&c, "GET", &update, Some(&www), &Value::Null).await;
    assert_eq!(s, 404, "no update was started: {v}");
    let (_, view) = send(&c, "GET", base, Some(&www), &Value::Null).await;
    assert_eq!(view["configs"].as_object().unwrap().len(), 1, "{view}");

    let (s, started) = send(&c, "POST", &update, Some(&www), &body).await;
    assert_eq!(s, 201, "{started}");
    assert!(
        started["user"].as_str().unwrap().contains("token "),
        "the record names the token: {started}"
    );
    let (s, v) = send(&c, "GET", &update, Some(&db), &Value::Null).await;
    assert_eq!(s, 403, "{v}");
    let (_, before) = send(&c, "GET", &update, Some(&www), &Value::Null).await;
    for action in ["pause", "resume", "abort", "rollback"] {
        for wrong in [&db, &operator] {
            let (s, v) = send(
                &c,
                "POST",
                &format!("{update}/{action}"),
                Some(wrong),
                &json!({}),
            )
            .await;
            assert_eq!(s, 403, "{action}: {v}");
        }
    }
    let (s, after) = send(&c, "GET", &update, Some(&operator), &Value::Null).await;
    assert_eq!(s, 200, "an operator reads updates: {after}");
    assert_eq!(after["state"], "ROLLING_FORWARD", "{after}");
    assert_eq!(after["events"], before["events"], "nothing happened to it");
    let (s, v) = send(
        &c,
        "POST",
        &format!("{update}/pause"),
        Some(&www),
        &json!({}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["state"], "PAUSED");

    // Both configs' secrets: the role sees them, nobody else does.
    let (_, mine) = send(&c, "GET", base, Some(&www), &Value::Null).await;
    assert!(mine.to_string().contains("hunter2"), "{mine}");
    for other in [&c.admin, &operator] {
        let (_, v) = send(&c, "GET", base, Some(other), &Value::Null).await;
        assert_eq!(v["configs"].as_object().unwrap().len(), 2, "{v}");
        let text = v.to_string();
        assert!(
            !text.contains("hunter2") && !text.contains("hunter3"),
            "{text}"
        );
    }
    h.stop().await.unwrap();
}

#[tokio::test]
async fn huge_instance_sets_are_cheap_and_errors_name_the_first_bad_instance() {
    let dir = tempfile::tempdir().unwrap();
    let h = start(dir.path()).await;
    let c = Client::new(&h);
    let (s, _) = c.post("/v1/jobs", &job("ten", 10, false)).await;
    assert_eq!(s, 201);
    let started = Instant::now();
    let many = vec!["1-100000"; 8_000].join(",");
    let (s, v) = c
        .post("/v1/jobs/www/prod/ten/kill", &json!({ "instances": many }))
        .await;
    assert_eq!(s, 400, "{v}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("no instance 10"), "{message}");
    assert!(v.to_string().len() < 500, "a short error: {v}");
    let (s, v) = c
        .post(
            "/v1/jobs/www/prod/ten/kill",
            &json!({ "instances": "1-100000" }),
        )
        .await;
    assert_eq!(s, 400);
    assert!(v.to_string().len() < 500, "{v}");
    let (s, v) = c
        .post(
            "/v1/jobs/www/prod/ten/kill",
            &json!({ "instances": "0-3,2-5,9" }),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["tasks"].as_array().unwrap().len(), 7);
    let mut dash = job("-rf", 1, false);
    dash["name"] = json!("-rf");
    let (s, v) = c.post("/v1/jobs", &dash).await;
    assert_eq!(s, 400, "{v}");
    assert_eq!(v["error"]["field"], "name");
    h.stop().await.unwrap();
}

/// A discovery token reads every role's services and nothing else.
#[tokio::test]
async fn a_discovery_token_reads_services_only() {
    let dir = tempfile::tempdir().unwrap();
    let h = start(dir.path()).await;
    let c = Client::new(&h);
    let (s, v) = c.post("/v1/tokens", &json!({"kind": "discovery"})).await;
    assert_eq!(s, 201, "{v}");
    assert_eq!(v["kind"], "discovery", "{v}");
    let discovery = v["token"].as_str().unwrap().to_string();
    let (s, v) = send(&c, "GET", "/v1/services", Some(&discovery), &Value::Null).await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = send(
        &c,
        "GET",
        "/v1/services/db/prod/x",
        Some(&discovery),
        &Value::Null,
    )
    .await;
    assert_eq!(s, 404, "allowed, and there is no such service: {v}");
    for path in [
        "/v1/jobs",
        "/v1/jobs/www/prod/hello",
        "/v1/changes?wait_ms=0",
        "/v1/agents",
        "/v1/tasks/x-0-000000000000",
        "/v1/cluster",
    ] {
        let (s, v) = send(&c, "GET", path, Some(&discovery), &Value::Null).await;
        assert_eq!(s, 403, "GET {path} with a discovery token: {v}");
    }
    let (s, v) = send(
        &c,
        "POST",
        "/v1/jobs",
        Some(&discovery),
        &job("x", 1, false),
    )
    .await;
    assert_eq!(s, 403, "{v}");
    h.stop().await.unwrap();
}
