//! Black-box: production before batch, with the real binaries. A cluster full of
//! preemptible batch tasks gets a production service that does not fit: victims go
//! PREEMPTING then KILLED naming the preemptor, the production instances RUNNING,
//! the victims' replacements PENDING saying who preempted them. A production job
//! over its role's quota, and an update that would take a job over it, are refused
//! with the numbers, then accepted once the quota is raised (through the CLI). Cron jobs fire every few seconds (the master's
//! `cron_seconds` test switch), KILL_EXISTING and CANCEL_NEW behave, and a master
//! restart runs no firing twice. Each scenario is its own test (nextest runs them in
//! parallel).

use drover_common::state::{ExitReason, TaskState};
use drover_common::wire::{CronView, JobView};
use drover_tests::{
    command_job, cron_firings, describe, running_as_root, Cluster, ClusterConfig, WAIT,
};
use serde_json::{json, Value};

/// A job of `instances` tasks of one cpu each running `sleep`.
fn sleeper(name: &str, instances: u32, service: bool, tier: &str) -> Value {
    let mut spec = command_job(name, instances, service, "sleep 1000");
    spec["tier"] = json!(tier);
    spec["task"]["resources"]["cpu"] = json!(1);
    spec
}

#[test]
fn a_production_service_preempts_batch_tasks_of_a_full_cluster() {
    if !running_as_root("preemption test") {
        return;
    }
    // Two agents of 4 cpus each, filled by 8 one-cpu preemptible tasks.
    let mut cluster = Cluster::start(ClusterConfig::agents(2)).unwrap();
    cluster
        .create_job(&sleeper("batch", 8, false, "preemptible"))
        .unwrap();
    cluster
        .wait_for_all("www-data/test/batch", TaskState::Running)
        .unwrap();
    let free: f64 = cluster.agents().unwrap().iter().map(|a| a.free.cpu).sum();
    assert!(free < 0.5, "the cluster is full: {free} cpus free");

    // A production service of 2 one-cpu instances does not fit anywhere.
    cluster
        .create_job(&sleeper("prod", 2, true, "preferred"))
        .unwrap();
    let prod = cluster
        .wait_for_all("www-data/test/prod", TaskState::Running)
        .unwrap();
    let prod_ids: Vec<String> = prod
        .instances
        .iter()
        .map(|i| i.current.as_ref().unwrap().task_id.clone())
        .collect();

    // Exactly two victims, KILLED, through PREEMPTING, naming their preemptor.
    let batch: JobView = cluster.job("www-data/test/batch").unwrap();
    let victims: Vec<_> = batch
        .instances
        .iter()
        .flat_map(|i| i.history.iter())
        .collect();
    assert_eq!(
        victims.len(),
        2,
        "one victim per production instance: {batch:?}"
    );
    for v in &victims {
        assert_eq!(v.state, TaskState::Killed, "{v:?}");
        assert!(
            v.events.iter().any(|e| e.state == TaskState::Preempting),
            "went through PREEMPTING: {v:?}"
        );
        match &v.exit_reason {
            Some(ExitReason::Preempted { by }) => assert!(prod_ids.contains(by), "{v:?}"),
            other => panic!("victim {} ended with {other:?}", v.task_id),
        }
    }
    // Their replacements wait, saying who preempted them.
    let waiting: Vec<_> = batch
        .instances
        .iter()
        .filter(|i| !i.history.is_empty())
        .map(|i| i.current.as_ref().unwrap())
        .collect();
    for t in &waiting {
        assert_eq!(t.state, TaskState::Pending, "{t:?}");
        let by = t.preempted_by.as_ref().unwrap();
        assert!(prod_ids.contains(by), "{t:?}");
        assert!(
            t.pending_reason
                .as_deref()
                .unwrap_or("")
                .contains(&format!("preempted by {by}")),
            "{t:?}"
        );
    }
    // Status shows tier and priority.
    let output = cluster
        .drover(&["job", "status", "www-data/test/prod"])
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.contains("tier preferred, priority 0"),
        "{}",
        describe(&output)
    );
    let output = cluster.drover(&["job", "list"]).unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("preemptible"), "{}", describe(&output));
}

#[test]
fn a_production_job_over_quota_is_refused_with_numbers_until_the_quota_is_raised() {
    if !running_as_root("quota test") {
        return;
    }
    let cluster = Cluster::start(ClusterConfig::agents(1)).unwrap();
    let output = cluster
        .drover(&[
            "quota", "set", "www-data", "--cpu", "0.2", "--ram", "1GiB", "--disk", "1GiB",
        ])
        .unwrap();
    assert!(output.status.success(), "{}", describe(&output));

    // 3 x 0.1 cpu asks more than 0.2.
    let job = command_job("over", 3, true, "sleep 1000");
    let (status, body) = cluster.post("/v1/jobs", &job).unwrap();
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "quota_exceeded", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("quota cpu 0.2"), "{message}");
    assert!(message.contains("in use cpu 0"), "{message}");
    assert!(message.contains("asked cpu 0.3"), "{message}");
    // Preemptible work is not bounded.
    let mut batch = command_job("batch", 3, false, "sleep 1000");
    batch["tier"] = json!("preemptible");
    cluster.create_job(&batch).unwrap();

    // Raised: accepted; `quota show` states use and quota.
    let output = cluster
        .drover(&[
            "quota", "set", "www-data", "--cpu", "1", "--ram", "1GiB", "--disk", "1GiB",
        ])
        .unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    cluster.create_job(&job).unwrap();
    let output = cluster.drover(&["quota", "show", "www-data"]).unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("0.3 of 1"), "{}", describe(&output));
    // The quota survives a master restart.
    let mut cluster = cluster;
    cluster.restart_master().unwrap();
    let q: Value = cluster
        .wait_for("the master back", WAIT, |c| {
            c.get::<Value>("/v1/quotas/www-data").ok()
        })
        .unwrap();
    assert_eq!(q["quota"]["cpu"], json!(1.0), "{q}");
}

#[test]
fn an_update_over_quota_is_refused_with_numbers_and_changes_nothing_until_the_quota_is_raised() {
    if !running_as_root("quota update test") {
        return;
    }
    let mut cluster = Cluster::start(ClusterConfig::agents(2)).unwrap();
    let quota = |cluster: &Cluster, cpu: &str| {
        let output = cluster
            .drover(&[
                "quota", "set", "www-data", "--cpu", cpu, "--ram", "1GiB", "--disk", "1GiB",
            ])
            .unwrap();
        assert!(output.status.success(), "{}", describe(&output));
    };
    quota(&cluster, "0.5");
    // 2 x 0.1 cpu fits in 0.5.
    let job = command_job("grow", 2, true, "sleep 1000");
    cluster.create_job(&job).unwrap();
    let before = cluster
        .wait_for_all("www-data/test/grow", TaskState::Running)
        .unwrap();
    let tasks = |v: &JobView| -> Vec<String> {
        v.instances
            .iter()
            .map(|i| i.current.as_ref().unwrap().task_id.clone())
            .collect()
    };

    // The update asks 2 x 0.4 cpu: more than 0.5.
    let mut bigger = command_job("grow", 2, true, "sleep 2000");
    bigger["task"]["resources"]["cpu"] = json!(0.4);
    bigger["update"] = json!({"batch_size": 2, "watch": "1s"});
    let body = json!({"spec": bigger, "user": "test"});
    let (status, answer) = cluster
        .post("/v1/jobs/www-data/test/grow/update", &body)
        .unwrap();
    assert_eq!(status, 403, "{answer}");
    assert_eq!(answer["error"]["code"], "quota_exceeded", "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains("quota cpu 0.5"), "{message}");
    assert!(message.contains("in use cpu 0"), "{message}");
    assert!(message.contains("asked cpu 0.8"), "{message}");
    // Nothing changed: no update, the same tasks on the old config.
    let (status, _) = cluster
        .get_status("/v1/jobs/www-data/test/grow/update")
        .unwrap();
    assert_eq!(status, 404);
    let job_now = cluster.job("www-data/test/grow").unwrap();
    assert_eq!(tasks(&job_now), tasks(&before));

    // Raised through the CLI: the same update is accepted and rolls on.
    quota(&cluster, "1");
    let (status, answer) = cluster
        .post("/v1/jobs/www-data/test/grow/update", &body)
        .unwrap();
    assert_eq!(status, 201, "{answer}");
    cluster
        .wait_for("the update to roll forward", WAIT, |c| {
            let u: Value = c.get("/v1/jobs/www-data/test/grow/update").ok()?;
            (u["state"] == "ROLLED_FORWARD").then_some(())
        })
        .unwrap();
    let after = cluster.job("www-data/test/grow").unwrap();
    assert!(tasks(&after).iter().all(|t| !tasks(&before).contains(t)));
}

/// A cron job of 2 one-shot instances firing every `every` seconds.
fn cron_job(name: &str, every: u32, policy: &str, cmdline: &str) -> Value {
    let mut spec = command_job(name, 2, false, cmdline);
    spec["cron_schedule"] = json!(format!("*/{every} * * * * *"));
    spec["cron_collision_policy"] = json!(policy);
    spec
}

/// Runs of instance 0 so far: its current task and its history.
fn runs(view: &JobView) -> usize {
    let i = &view.instances[0];
    usize::from(i.current.is_some()) + i.history.len()
}

fn cron_of(c: &Cluster, key: &str) -> Option<CronView> {
    let jobs: Vec<CronView> = c.get("/v1/cron").ok()?;
    jobs.into_iter().find(|j| j.job == key)
}

fn cron_cluster() -> anyhow::Result<Cluster> {
    let mut config = ClusterConfig::agents(1);
    config
        .master_config
        .push_str("cron_seconds = true\ntask_history_limit = 200\n");
    Cluster::start(config)
}

#[test]
fn cron_kill_existing_kills_the_running_run_and_cancel_new_skips() {
    if !running_as_root("cron test") {
        return;
    }
    let mut cluster = cron_cluster().unwrap();
    cluster
        .create_job(&cron_job("kill", 4, "KILL_EXISTING", "sleep 1000"))
        .unwrap();
    cluster
        .create_job(&cron_job("cancel", 4, "CANCEL_NEW", "sleep 1000"))
        .unwrap();
    let output = cluster.drover(&["cron", "list"]).unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.contains("www-data/test/kill") && text.contains("KILL_EXISTING"),
        "{}",
        describe(&output)
    );
    // KILL_EXISTING: a second run replaces a first that was RUNNING.
    let first = cluster
        .wait_for_all("www-data/test/kill", TaskState::Running)
        .unwrap();
    let first_id = first.instances[0].current.as_ref().unwrap().task_id.clone();
    let view = cluster
        .wait_for("a second run of kill", WAIT, |c| {
            let v = c.job("www-data/test/kill").ok()?;
            (runs(&v) >= 2).then_some(v)
        })
        .unwrap();
    let old = view.instances[0]
        .history
        .iter()
        .find(|t| t.task_id == first_id)
        .unwrap();
    assert!(
        matches!(old.state, TaskState::Killing | TaskState::Killed),
        "{old:?}"
    );
    // CANCEL_NEW: while its first run keeps running, firings are skipped.
    let cancel = cluster
        .wait_for_all("www-data/test/cancel", TaskState::Running)
        .unwrap();
    let fired = cron_of(&cluster, "www-data/test/cancel")
        .unwrap()
        .last_fired_ms
        .unwrap();
    cluster
        .wait_for("two more firings of cancel", WAIT, |c| {
            let last = cron_of(c, "www-data/test/cancel")?.last_fired_ms?;
            (last >= fired + 8_000).then_some(())
        })
        .unwrap();
    let after = cluster.job("www-data/test/cancel").unwrap();
    assert_eq!(runs(&after), 1, "{after:?}");
    assert_eq!(
        after.instances[0].current.as_ref().unwrap().task_id,
        cancel.instances[0].current.as_ref().unwrap().task_id
    );
    // Deschedule through the CLI: no more firings.
    let output = cluster
        .drover(&["cron", "deschedule", "www-data/test/cancel"])
        .unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    assert!(cron_of(&cluster, "www-data/test/cancel").is_none());
}

#[test]
fn a_master_restart_runs_no_cron_firing_twice() {
    if !running_as_root("cron restart test") {
        return;
    }
    let mut cluster = cron_cluster().unwrap();
    const KEY: &str = "www-data/test/tick";
    cluster
        .create_job(&cron_job("tick", 2, "KILL_EXISTING", "true"))
        .unwrap();
    cluster
        .wait_for("two runs", WAIT, |c| {
            let v = c.job(KEY).ok()?;
            (cron_firings(&v).len() >= 2).then_some(())
        })
        .unwrap();
    let mut seen = 0;
    for round in 0..3 {
        // Restart right after a firing: the one just handled must not run again.
        let before = cluster.job(KEY).unwrap();
        cluster
            .wait_for("the next firing", WAIT, |c| {
                let v = c.job(KEY).ok()?;
                (runs(&v) > runs(&before)).then_some(())
            })
            .unwrap();
        cluster.restart_master().unwrap();
        let view = cluster
            .wait_for("the master back and a firing after it", WAIT, |c| {
                let v = c.job(KEY).ok()?;
                (runs(&v) > runs(&before) + 1).then_some(v)
            })
            .unwrap();
        let fired = cron_firings(&view);
        assert_eq!(
            fired.len(),
            runs(&view),
            "round {round}: every run names its firing"
        );
        let mut unique = fired.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(
            unique.len(),
            fired.len(),
            "round {round}: a firing ran twice: {fired:?}"
        );
        assert!(fired.iter().all(|f| f % 2_000 == 0), "{fired:?}");
        assert!(fired.len() > seen);
        seen = fired.len();
    }
}
