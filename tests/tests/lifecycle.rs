//! Black-box lifecycle scenarios on a small real cluster: a batch job runs to
//! FINISHED, a crash-looping service is THROTTLED between attempts, a job whose
//! constraints no agent meets stays PENDING with the reason in words, and a master
//! restart keeps every job and task.

use std::collections::BTreeMap;
use std::time::Duration;

use drover_common::state::TaskState;
use drover_tests::{command_job, describe, running_as_root, Cluster, ClusterConfig, WAIT};
use serde_json::json;

#[test]
fn a_cluster_over_mtls_runs_a_job_and_refuses_plain_http() {
    if !running_as_root("mTLS test") {
        return;
    }
    let mut config = ClusterConfig::agents(1);
    config.tls = true;
    let mut cluster = Cluster::start(config).unwrap();
    assert!(cluster.url.starts_with("https://"), "{}", cluster.url);
    let spec = command_job("tls", 2, false, "echo over mtls");
    cluster.create_job(&spec).unwrap();
    cluster
        .wait_for_all("www-data/test/tls", TaskState::Finished)
        .unwrap();
    let agents = cluster.agents().unwrap();
    assert_eq!(agents[0].agent_id, "bb-agent-0");
    // The agent API over plain HTTP gets no answer from the TLS listener.
    let plain = cluster.url.replacen("https://", "http://", 1);
    let answer = reqwest::blocking::Client::new()
        .post(format!("{plain}/v1/agents/register"))
        .body("{}")
        .send();
    assert!(
        answer.is_err() || !answer.unwrap().status().is_success(),
        "plain HTTP was served"
    );

    // The logs stream through the master, which reads the agent's log server over
    // mTLS with its certificate.
    let task = cluster.job("www-data/test/tls").unwrap().instances[0]
        .current
        .clone()
        .unwrap()
        .task_id;
    let path = format!("/v1/tasks/{task}/logs/main/stdout");
    assert_eq!(
        cluster.get_status(&path).unwrap(),
        (200, "over mtls\n".to_string())
    );
    // Direct to the agent's log server: it serves TLS with the agent's certificate
    // (verified here for its identity bb-agent-0.agent.drover) and reads a log only
    // for a master's client certificate.
    let address = agents[0].address.clone();
    assert!(address.starts_with("https://"), "{address}");
    let port = address.rsplit(':').next().unwrap().parse::<u16>().unwrap();
    let tls = cluster.dir().join("tls");
    let client = |identity: Option<&str>| {
        let ca = std::fs::read(tls.join("ca.pem")).unwrap();
        let mut builder = reqwest::blocking::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
            .resolve(
                "bb-agent-0.agent.drover",
                std::net::SocketAddr::from(([127, 0, 0, 1], port)),
            );
        if let Some(name) = identity {
            let mut pem = std::fs::read(tls.join(format!("{name}.pem"))).unwrap();
            pem.extend(std::fs::read(tls.join(format!("{name}.key"))).unwrap());
            builder = builder.identity(reqwest::Identity::from_pem(&pem).unwrap());
        }
        let answer = builder
            .build()
            .unwrap()
            .get(format!("https://bb-agent-0.agent.drover:{port}{path}"))
            .send()
            .unwrap();
        (answer.status().as_u16(), answer.text().unwrap())
    };
    assert_eq!(client(None).0, 401, "no client certificate");
    assert_eq!(
        client(Some("agent-bb-agent-0")).0,
        403,
        "an agent's certificate"
    );
    assert_eq!(
        client(Some("master-127.0.0.1")),
        (200, "over mtls\n".to_string())
    );
    // No plain HTTP, and no shared key: the log server takes none over TLS.
    let plain = reqwest::blocking::Client::new()
        .get(format!("http://127.0.0.1:{port}{path}"))
        .send();
    assert!(
        plain.is_err() || !plain.unwrap().status().is_success(),
        "the log server answered plain HTTP"
    );
}

#[test]
fn batch_job_runs_every_instance_to_finished() {
    if !running_as_root("batch test") {
        return;
    }
    let mut cluster = Cluster::start(ClusterConfig::agents(2)).unwrap();
    let spec = command_job("batch", 3, false, "echo instance {{instance}} done");
    let output = cluster.create_with_cli("batch.json", &spec).unwrap();
    assert!(
        output.status.success(),
        "{}\n{}",
        describe(&output),
        cluster.diagnostics()
    );
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("all 3 instance(s) FINISHED"),
        "{}",
        describe(&output)
    );
    // The job's web page (docs/ui.md), as `drover open` gives it.
    let page = format!(
        "  page: {}/ui/jobs/www-data/test/batch\n",
        cluster.api.url.trim_end_matches('/')
    );
    assert!(
        String::from_utf8_lossy(&output.stdout).contains(&page),
        "{page}: {}",
        describe(&output)
    );
    let view = cluster
        .wait_for_all("www-data/test/batch", TaskState::Finished)
        .unwrap();
    for instance in &view.instances {
        assert!(instance.history.is_empty(), "nothing retried: {instance:?}");
    }
    let output = cluster
        .drover(&["task", "logs", "www-data/test/batch/2"])
        .unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(String::from_utf8_lossy(&output.stdout), "instance 2 done\n");

    // `task logs -f` follows a growing log until the task ends.
    cluster
        .create_job(&command_job(
            "counter",
            1,
            false,
            "for i in 1 2 3; do echo line $i; sleep 1; done",
        ))
        .unwrap();
    cluster
        .wait_for("the counter task to be placed", WAIT, |c| {
            let view = c.job("www-data/test/counter").ok()?;
            view.instances[0].current.as_ref()?.agent_id.clone()
        })
        .unwrap();
    let output = cluster
        .drover_with_timeout(
            &["task", "logs", "www-data/test/counter/0", "-f"],
            Duration::from_secs(60),
        )
        .unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "line 1\nline 2\nline 3\n",
        "{}",
        describe(&output)
    );
}

#[test]
fn crash_looping_service_is_throttled_before_each_replacement() {
    if !running_as_root("crash loop test") {
        return;
    }
    let mut cluster = Cluster::start(ClusterConfig::agents(1)).unwrap();
    // `job create --wait` gives up on a failing service and says why.
    let spec = command_job("crasher", 1, true, "echo crashing; exit 3");
    let output = cluster.create_with_cli("crasher.json", &spec).unwrap();
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("did not reach RUNNING"),
        "{}",
        describe(&output)
    );
    assert!(stderr.contains("exit code 3"), "{}", describe(&output));
    // The master's flapping threshold is 3s: each failed run is replaced by a task
    // that waits THROTTLED first. Look for it in the current task or its events.
    let view = cluster
        .wait_for(
            "a THROTTLED replacement with failed tasks in history",
            WAIT,
            |c| {
                let view = c.job("www-data/test/crasher").ok()?;
                let slot = view.instances.first()?;
                let throttled = slot
                    .current
                    .as_ref()?
                    .events
                    .iter()
                    .any(|e| e.state == TaskState::Throttled);
                let failed = slot
                    .history
                    .iter()
                    .filter(|t| t.state == TaskState::Failed)
                    .count();
                (throttled && failed >= 2).then_some(view)
            },
        )
        .unwrap();
    let slot = &view.instances[0];
    for task in &slot.history {
        assert_eq!(task.instance, 0);
        assert_eq!(
            task.exit_reason,
            Some(drover_common::ExitReason::ExitCode { code: 3 }),
            "{task:?}"
        );
    }
    let output = cluster
        .drover(&["job", "kill", "www-data/test/crasher"])
        .unwrap();
    assert!(output.status.success(), "{}", describe(&output));
}

#[test]
fn unsatisfiable_constraints_stay_pending_with_a_reason() {
    if !running_as_root("constraints test") {
        return;
    }
    let cluster = Cluster::start(ClusterConfig::agents(2)).unwrap();
    let mut spec = command_job("picky", 1, true, "sleep 600");
    spec["constraints"] = json!({"rack": "r7"});
    cluster.create_job(&spec).unwrap();
    let mut big = command_job("huge", 1, true, "sleep 600");
    big["task"]["resources"]["ram"] = json!("512GiB");
    cluster.create_job(&big).unwrap();
    // Give the scheduler time to try, then check nothing was placed.
    std::thread::sleep(std::time::Duration::from_secs(2));
    for key in ["www-data/test/picky", "www-data/test/huge"] {
        let view = cluster.job(key).unwrap();
        let task = view.instances[0].current.clone().unwrap();
        assert_eq!(task.state, TaskState::Pending, "{task:?}");
        assert_eq!(task.agent_id, None);
        let reason = task.pending_reason.clone().unwrap_or_default();
        assert!(!reason.is_empty(), "a PENDING task says why: {task:?}");
        // The value constraint's reason names the attribute; the resource's reason
        // names the resource.
        let wanted: &[&str] = if key.ends_with("picky") {
            &["rack constraint not met"]
        } else {
            &["ram"]
        };
        assert!(
            wanted.iter().any(|w| reason.contains(w)),
            "reason names one of {wanted:?}: {reason}"
        );
        assert!(reason.contains('2'), "reason counts the agents: {reason}");
        let output = cluster.drover(&["job", "status", key]).unwrap();
        assert!(
            String::from_utf8_lossy(&output.stdout).contains(&reason),
            "job status shows the reason: {}",
            describe(&output)
        );
    }
}

#[test]
fn master_restart_keeps_every_job_and_task() {
    if !running_as_root("master restart test") {
        return;
    }
    let mut cluster = Cluster::start(ClusterConfig::agents(2)).unwrap();
    cluster
        .create_job(&command_job("sleeper", 2, true, "sleep 600"))
        .unwrap();
    cluster
        .create_job(&command_job("oneshot", 1, false, "true"))
        .unwrap();
    let mut picky = command_job("nowhere", 1, true, "sleep 600");
    picky["constraints"] = json!({"rack": "r9"});
    cluster.create_job(&picky).unwrap();
    let running = cluster
        .wait_for_all("www-data/test/sleeper", TaskState::Running)
        .unwrap();
    cluster
        .wait_for_all("www-data/test/oneshot", TaskState::Finished)
        .unwrap();

    let before: BTreeMap<String, (TaskState, usize)> = all_tasks(&cluster).unwrap();
    cluster.restart_master().unwrap();
    let after = all_tasks(&cluster).unwrap();
    assert_eq!(
        before, after,
        "every job and task survives a master restart"
    );

    // The running tasks are the same ones (not replaced), and still RUNNING once the
    // agents reconcile with the new master.
    let view = cluster
        .wait_for_all("www-data/test/sleeper", TaskState::Running)
        .unwrap();
    let ids = |v: &drover_common::wire::JobView| -> Vec<String> {
        v.instances
            .iter()
            .filter_map(|i| Some(i.current.as_ref()?.task_id.clone()))
            .collect()
    };
    assert_eq!(ids(&running), ids(&view));
    // And the restarted master still takes work.
    cluster
        .create_job(&command_job("after", 1, false, "true"))
        .unwrap();
    cluster
        .wait_for_all("www-data/test/after", TaskState::Finished)
        .unwrap();
}

/// task id -> (state, number of events) for every task of every job.
fn all_tasks(cluster: &Cluster) -> anyhow::Result<BTreeMap<String, (TaskState, usize)>> {
    let jobs: Vec<drover_common::wire::JobSummary> = cluster.get("/v1/jobs")?;
    let mut tasks = BTreeMap::new();
    for job in jobs {
        let view = cluster.job(&job.key)?;
        for instance in view.instances {
            for task in instance.current.into_iter().chain(instance.history) {
                tasks.insert(task.task_id.clone(), (task.state, task.events.len()));
            }
        }
    }
    Ok(tasks)
}

#[test]
fn master_exits_promptly_on_sigterm_with_agents_connected() {
    if !running_as_root("master shutdown test") {
        return;
    }
    let mut cluster = Cluster::start(ClusterConfig::agents(2)).unwrap();
    cluster
        .create_job(&command_job("sleeper", 1, true, "sleep 600"))
        .unwrap();
    cluster
        .wait_for_all("www-data/test/sleeper", TaskState::Running)
        .unwrap();
    let status = cluster.stop_master(Duration::from_secs(5));
    assert!(
        status.is_some_and(|s| s.success()),
        "the master exits 0 within 5s of SIGTERM, got {status:?}\n{}",
        cluster.diagnostics()
    );
    cluster.start_master_again().unwrap();
    cluster
        .wait_for_all("www-data/test/sleeper", TaskState::Running)
        .unwrap();
}
