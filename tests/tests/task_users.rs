//! Who a task runs as, black-box: a role's token cannot create, update, restart or
//! cron-start a job as a user its role is not granted (403 on every path); after
//! `drover role grant-user` it runs; after `revoke-user` the running job is flagged
//! (job status, `/metrics`, role show) and not killed, and its next update is
//! refused. The agent's own `task_users` list refuses an assignment outside it even
//! when an admin token placed it: FAILED with the reason.

#![allow(clippy::unwrap_used)] // unwrap is how tests fail

use std::time::Duration;

use drover_common::state::TaskState;
use drover_tests::{command_job, describe, running_as_root, AdminApi, Cluster, ClusterConfig};
use serde_json::{json, Value};

const ROLE: &str = "www-data";

/// A job of role www-data running as `user` (None: the role's own user).
fn job(name: &str, user: Option<&str>, service: bool) -> Value {
    let mut spec = command_job(name, 1, service, "exec sleep 600");
    if let Some(user) = user {
        spec["task"]["user"] = json!(user);
    }
    spec
}

fn cron(name: &str, user: &str) -> Value {
    let mut spec = job(name, Some(user), false);
    spec["cron_schedule"] = json!("0 0 1 1 *");
    spec
}

/// Asserts a 403 `user_not_granted` naming task.user, the role and the grant.
fn refused(what: &str, (status, body): (u16, Value)) {
    assert_eq!(status, 403, "{what}: {body}");
    assert_eq!(body["error"]["code"], "user_not_granted", "{what}: {body}");
    assert_eq!(body["error"]["field"], "task.user", "{what}: {body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    for part in [
        "task.user `nobody`",
        "role www-data",
        "drover role grant-user www-data nobody",
    ] {
        assert!(message.contains(part), "{what}: {message}");
    }
}

fn cli(c: &Cluster, args: &[&str]) -> String {
    let output = c.drover(args).unwrap();
    assert!(output.status.success(), "{args:?}: {}", describe(&output));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn a_roles_tasks_run_as_granted_users_only_on_the_master_and_on_the_agent() {
    if !running_as_root("a_roles_tasks_run_as_granted_users_only_on_the_master_and_on_the_agent") {
        return;
    }
    // The agent runs tasks as nobody only: www-data, the role's own user, is refused
    // there whatever the master allows.
    let mut config = ClusterConfig::agents(1);
    config.agent_config = "task_users = [\"nobody\"]\n".to_string();
    let mut c = Cluster::start(config).unwrap();
    let mut role = AdminApi::new().unwrap();
    role.url = c.url.clone();
    role.token = Some(
        c.create_token(&json!({"kind": "roles", "roles": [ROLE]}))
            .unwrap(),
    );

    // Not granted: every path that would start a task as nobody is refused.
    refused(
        "create",
        role.post("/v1/jobs", &job("app", Some("nobody"), true))
            .unwrap(),
    );
    refused(
        "cron create",
        role.post("/v1/jobs", &cron("tick", "nobody")).unwrap(),
    );
    role.create_job(&job("own", None, false)).unwrap();
    let update = json!({"spec": job("own", Some("nobody"), false)});
    refused(
        "update",
        role.post("/v1/jobs/www-data/test/own/update", &update)
            .unwrap(),
    );
    // Only an admin grants.
    let (status, body) = role
        .post("/v1/roles/www-data/grant-user", &json!({"user": "nobody"}))
        .unwrap();
    assert_eq!(
        (status, &body["error"]["code"]),
        (403, &json!("forbidden")),
        "{body}"
    );

    // The agent refuses www-data, which the master allowed (an admin's job too).
    c.create_job(&job("admin", None, false)).unwrap();
    for key in ["www-data/test/own", "www-data/test/admin"] {
        let view = c.wait_for_all(key, TaskState::Failed).unwrap();
        let task = view.instances[0].current.as_ref().unwrap();
        let reason = task
            .exit_reason
            .as_ref()
            .map(|r| r.to_string())
            .unwrap_or_default();
        assert!(
            reason.contains(
                "task user `www-data` (uid 33) is not in this agent's task_users (nobody)"
            ),
            "{key}: {reason}"
        );
    }

    // Granted: it runs.
    let shown = cli(&c, &["role", "grant-user", ROLE, "nobody"]);
    assert!(shown.contains("Granted: nobody"), "{shown}");
    role.create_job(&job("app", Some("nobody"), true)).unwrap();
    role.create_job(&cron("tick", "nobody")).unwrap();
    let view = c
        .wait_for_all("www-data/test/app", TaskState::Running)
        .unwrap();
    let task = view.instances[0].current.clone().unwrap();
    assert!(view.ungranted_user.is_none());

    // Revoked: flagged, not killed; its next update, restart and cron start refused.
    let shown = cli(&c, &["role", "revoke-user", ROLE, "nobody"]);
    assert!(shown.contains("FLAGGED: job www-data/test/app"), "{shown}");
    let audit = std::fs::read_to_string(c.dir().join("master/audit.log")).unwrap();
    for what in ["grant-user", "revoke-user"] {
        let path = format!("/v1/roles/www-data/{what}");
        assert!(
            audit
                .lines()
                .any(|l| l.contains(&path) && l.contains("admin")),
            "{what} is audited: {audit}"
        );
    }
    let status = cli(&c, &["job", "status", "www-data/test/app"]);
    assert!(status.contains("FLAGGED: runs as user nobody"), "{status}");
    let (code, metrics) = c.get_status("/metrics").unwrap();
    assert_eq!(code, 200);
    assert!(
        metrics.contains("drover_master_jobs_ungranted_user 2"),
        "app and the cron template: {metrics}"
    );
    let update = json!({"spec": job("app", None, true)});
    refused(
        "update after revoke",
        role.post("/v1/jobs/www-data/test/app/update", &update)
            .unwrap(),
    );
    refused(
        "restart",
        role.post("/v1/jobs/www-data/test/app/restart", &json!({}))
            .unwrap(),
    );
    refused(
        "cron start",
        role.post("/v1/cron/www-data/test/tick/start", &json!({}))
            .unwrap(),
    );
    std::thread::sleep(Duration::from_secs(1));
    let view = c.job("www-data/test/app").unwrap();
    let now = view.instances[0].current.as_ref().unwrap();
    assert_eq!(
        (&now.task_id, now.state),
        (&task.task_id, TaskState::Running)
    );
    assert_eq!(view.ungranted_user.as_deref(), Some("nobody"));
    c.kill_job("www-data/test/app").unwrap();
}
