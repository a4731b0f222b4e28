//! Black-box: the master's and the agent's `GET /metrics` (Prometheus text
//! exposition) on a real cluster: tasks by state, placements, scheduling latency,
//! store commits, agents and rolling-update batches on the master; executor starts,
//! exits by reason, kill escalations and their steps, process starts and the outbox
//! on the agent; read back after real jobs, updates and kills ran, over HTTP and
//! through a real Prometheus; who may read them.

// The helpers below serve #[test] functions only: a failure is the test's panic.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use drover_common::state::TaskState;
use drover_common::wire::{UpdateState, UpdateView};
use drover_tests::{command_job, running_as_root, Cluster, ClusterConfig};
use serde_json::json;

/// `name{labels} value` lines of the exposition, keyed by `name{labels}`.
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            Some((key.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// A metrics token for the agents in a file of its own, and the cluster config
/// that gives it to them (`metrics_token_file`).
fn agents_with_metrics_token(dir: &std::path::Path) -> (std::path::PathBuf, ClusterConfig) {
    let token_file = dir.join("agent-metrics.token");
    std::fs::write(&token_file, "metrics-token-0123456789abcdef\n").expect("write the token");
    let mut config = ClusterConfig::agents(1);
    config.agent_config = format!(
        "metrics_token_file = {:?}\n",
        token_file.display().to_string()
    );
    (token_file, config)
}

/// GET of the agent's `/metrics` with `token`: status and body.
fn agent_metrics(cluster: &Cluster, token: Option<&str>) -> (u16, String) {
    let agents = cluster.agents().expect("list the agents");
    let mut request = cluster.http().get(format!(
        "{}/metrics",
        agents[0].address.trim_end_matches('/')
    ));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let answer = request.send().expect("GET the agent's /metrics");
    (
        answer.status().as_u16(),
        answer.text().expect("read the answer"),
    )
}

#[test]
fn agent_metrics_count_starts_exits_and_kills_and_need_the_metrics_token() {
    if !running_as_root("agent metrics test") {
        return;
    }
    let tokens = tempfile::tempdir().unwrap();
    let (_, config) = agents_with_metrics_token(tokens.path());
    let mut cluster = Cluster::start(config).unwrap();
    cluster
        .create_job(&command_job("ends", 2, false, "exit 3"))
        .unwrap();
    cluster
        .create_job(&command_job("killed", 1, true, "sleep 600"))
        .unwrap();
    cluster
        .wait_for_all("www-data/test/ends", TaskState::Failed)
        .unwrap();
    cluster
        .wait_for_all("www-data/test/killed", TaskState::Running)
        .unwrap();
    cluster.kill_job("www-data/test/killed").unwrap();
    cluster
        .wait_for_all("www-data/test/killed", TaskState::Killed)
        .unwrap();

    let (status, text) = agent_metrics(&cluster, Some("metrics-token-0123456789abcdef"));
    assert_eq!(status, 200, "{text}");
    let s = samples(&text);
    let get = |key: &str| {
        *s.get(key)
            .unwrap_or_else(|| panic!("no sample {key} in:\n{text}"))
    };
    assert_eq!(get("drover_agent_executor_starts_total"), 3.0, "{text}");
    assert_eq!(
        get("drover_agent_task_exits_total{reason=\"exit_code\"}"),
        2.0
    );
    assert_eq!(
        get("drover_agent_task_exits_total{reason=\"killed_by_request\"}"),
        1.0
    );
    assert_eq!(get("drover_agent_kill_escalation_seconds_count"), 1.0);
    // `sleep 600` without an HTTP lifecycle: SIGTERM ended it, the only step.
    assert_eq!(
        get("drover_agent_kill_escalation_step_seconds_count{step=\"term\"}"),
        1.0,
        "{text}"
    );
    for step in ["graceful", "shutdown", "kill"] {
        assert_eq!(
            get(&format!(
                "drover_agent_kill_escalation_step_seconds_count{{step=\"{step}\"}}"
            )),
            0.0
        );
    }
    assert_eq!(get("drover_agent_process_start_seconds_count"), 3.0);
    assert_eq!(get("drover_agent_health_check_failures_total"), 0.0);
    assert_eq!(get("drover_agent_tasks"), 0.0);
    // Every update was acknowledged by now or soon: the outbox gauges exist.
    assert!(get("drover_agent_outbox_updates") >= 0.0);
    assert!(get("drover_agent_outbox_oldest_age_seconds") >= 0.0);
    assert!(!text.contains("ends-0-"), "a task id in a label:\n{text}");

    // The metrics token reads /metrics only; no token or another is 401.
    assert_eq!(agent_metrics(&cluster, None).0, 401);
    assert_eq!(
        agent_metrics(&cluster, Some("metrics-token-0123456789abcdeX")).0,
        401
    );
    let agents = cluster.agents().unwrap();
    let task = cluster.job("www-data/test/ends").unwrap().instances[0]
        .current
        .clone()
        .unwrap()
        .task_id;
    let logs = cluster
        .http()
        .get(format!(
            "{}/v1/tasks/{task}/logs/main/stdout",
            agents[0].address.trim_end_matches('/')
        ))
        .bearer_auth("metrics-token-0123456789abcdef")
        .send()
        .unwrap();
    assert_eq!(logs.status().as_u16(), 401);
}

#[test]
fn metrics_count_what_the_cluster_did_and_need_a_reader_token() {
    if !running_as_root("metrics test") {
        return;
    }
    let mut cluster = Cluster::start(ClusterConfig::agents(1)).unwrap();
    cluster
        .create_job(&command_job("counted", 3, false, "true"))
        .unwrap();
    let mut spare = command_job("spare", 1, false, "true");
    spare["tier"] = json!("preemptible");
    cluster.create_job(&spare).unwrap();
    let mut spec = command_job("stuck", 2, true, "sleep 600");
    spec["constraints"] = json!({"host": "limit:1"});
    cluster.create_job(&spec).unwrap();
    cluster
        .wait_for_all("www-data/test/counted", TaskState::Finished)
        .unwrap();
    cluster
        .wait_for_all("www-data/test/spare", TaskState::Finished)
        .unwrap();

    let (status, text) = cluster.get_status("/metrics").unwrap();
    assert_eq!(status, 200, "{text}");
    let s = samples(&text);
    let get = |key: &str| {
        *s.get(key)
            .unwrap_or_else(|| panic!("no sample {key} in:\n{text}"))
    };
    assert_eq!(
        get("drover_master_tasks{state=\"FINISHED\",tier=\"preferred\"}"),
        3.0
    );
    assert_eq!(
        get("drover_master_tasks{state=\"FINISHED\",tier=\"preemptible\"}"),
        1.0
    );
    assert_eq!(get("drover_master_pending_tasks"), 1.0);
    assert_eq!(
        get("drover_master_pending_reasons{reason=\"host limit reached\"}"),
        1.0
    );
    assert_eq!(
        get("drover_master_agents{reachable=\"true\",maintenance=\"NONE\"}"),
        1.0
    );
    // Five tasks were placed (four one-shots and one of the service).
    assert!(get("drover_master_placements_total") >= 5.0, "{text}");
    assert!(get("drover_master_scheduling_latency_seconds_count") >= 5.0);
    assert!(get("drover_master_store_commit_duration_seconds_count") >= 1.0);
    assert!(get("drover_master_store_group_commit_batches_count") >= 1.0);
    assert!(text.contains("# TYPE drover_master_store_commit_duration_seconds histogram"));
    // No task id appears in any label.
    assert!(!text.contains("counted-0-"), "{text}");

    // Readers of everything only: a role token is refused, no token is 401.
    let role = cluster
        .create_token(&json!({"kind": "roles", "roles": ["www-data"]}))
        .unwrap();
    let refused = cluster
        .http()
        .get(format!("{}/metrics", cluster.url))
        .bearer_auth(role)
        .send()
        .unwrap()
        .status();
    assert_eq!(refused.as_u16(), 403);
    let anonymous = cluster
        .http()
        .get(format!("{}/metrics", cluster.url))
        .send()
        .unwrap()
        .status();
    assert_eq!(anonymous.as_u16(), 401);
}

/// Starts an update of `key` to `spec` and waits for it to end: its record.
fn update(cluster: &mut Cluster, key: &str, spec: &serde_json::Value) -> UpdateView {
    let path = format!("/v1/jobs/{key}/update");
    let (status, body) = cluster
        .post(&path, &json!({"spec": spec, "user": "test"}))
        .unwrap();
    assert_eq!(status, 201, "{body}");
    cluster
        .wait_for(
            "the update to end",
            std::time::Duration::from_secs(120),
            |c| {
                c.get::<UpdateView>(&path)
                    .ok()
                    .filter(|u| u.state.is_terminal())
            },
        )
        .unwrap()
}

/// The sizes of the batches an update's events list after `prefix`
/// (`batch: instances 0,1`).
fn batch_sizes(u: &UpdateView, prefix: &str) -> Vec<f64> {
    u.events
        .iter()
        .filter_map(|e| e.message.strip_prefix(prefix))
        .map(|list| list.split(',').count() as f64)
        .collect()
}

/// Kill escalations, their steps checked on the agent's `/metrics`: a task that
/// ignores SIGTERM behind an HTTP lifecycle nobody answers (graceful, shutdown, term
/// and kill) and one that exits on SIGTERM (term). Then rolling updates of a
/// 3-instance service in batches of 2, one that succeeds and one whose config cannot
/// start and rolls back. Returns the forward and the rollback batch sizes the
/// updates' events list.
fn update_and_kill(cluster: &mut Cluster) -> (Vec<f64>, Vec<f64>) {
    let mut rolled = command_job("rolled", 3, true, "sleep 600");
    rolled["update"] = json!({"batch_size": 2, "watch": "1s"});
    // A service has one instance per host unless told otherwise; this cluster has one.
    rolled["constraints"] = json!({"host": "limit:10"});
    cluster.create_job(&rolled).unwrap();
    let mut stubborn = command_job("stubborn", 1, true, "trap '' TERM; sleep 600");
    stubborn["task"]["resources"]["ports"] = json!(["http"]);
    stubborn["task"]["finalization_wait"] = json!("1s");
    stubborn["lifecycle"] = json!({"http": {
        "port": "http", "graceful_shutdown_wait": "1s", "shutdown_wait": "1s"
    }});
    cluster.create_job(&stubborn).unwrap();
    cluster
        .create_job(&command_job("polite", 1, true, "sleep 600"))
        .unwrap();
    for name in ["rolled", "stubborn", "polite"] {
        cluster
            .wait_for_all(&format!("www-data/test/{name}"), TaskState::Running)
            .unwrap();
    }
    cluster.kill_job("www-data/test/stubborn").unwrap();
    cluster.kill_job("www-data/test/polite").unwrap();
    for name in ["stubborn", "polite"] {
        cluster
            .wait_for_all(&format!("www-data/test/{name}"), TaskState::Killed)
            .unwrap();
    }
    // The two escalations, before the updates add their own (a replaced task is
    // killed too): each step of the stubborn one, SIGTERM's of both.
    let (_, text) = agent_metrics(cluster, Some("metrics-token-0123456789abcdef"));
    let s = samples(&text);
    let step = |name: &str, part: &str| {
        s.get(&format!(
            "drover_agent_kill_escalation_step_seconds_{part}{{step=\"{name}\"}}"
        ))
        .copied()
    };
    for (name, count) in [
        ("graceful", 1.0),
        ("shutdown", 1.0),
        ("term", 2.0),
        ("kill", 1.0),
    ] {
        assert_eq!(step(name, "count"), Some(count), "step {name}:\n{text}");
    }
    // Each wait was 1 s. Deadlines add up from the previous deadline, so a late
    // wakeup shortens the next step: the bound is generous.
    for name in ["graceful", "shutdown", "term"] {
        let sum = step(name, "sum").unwrap_or(0.0);
        assert!(sum >= 0.5, "step {name} took {sum} s in all");
    }
    let kill = step("kill", "sum").unwrap_or(f64::MAX);
    assert!(kill < 10.0, "SIGKILL took {kill} s");

    rolled["task"]["processes"][0]["cmdline"] = json!("true; sleep 600");
    let forward = update(cluster, "www-data/test/rolled", &rolled);
    assert_eq!(forward.state, UpdateState::RolledForward, "{forward:#?}");
    rolled["task"]["processes"][0]["cmdline"] = json!("/nonexistent/drover-metrics-test");
    let back = update(cluster, "www-data/test/rolled", &rolled);
    assert_eq!(back.state, UpdateState::RolledBack, "{back:#?}");
    let mut forward_sizes = batch_sizes(&forward, "batch: instances ");
    assert_eq!(forward_sizes, [2.0, 1.0], "{forward:#?}");
    forward_sizes.extend(batch_sizes(&back, "batch: instances "));
    let rollback_sizes = batch_sizes(&back, "rollback batch: instances ");
    assert!(!rollback_sizes.is_empty(), "{back:#?}");
    (forward_sizes, rollback_sizes)
}

/// The first sample's value of a Prometheus instant query, if any.
fn query(http: &reqwest::blocking::Client, prometheus: &str, promql: &str) -> Option<f64> {
    let answer: serde_json::Value = http
        .get(format!("{prometheus}/api/v1/query"))
        .query(&[("query", promql)])
        .send()
        .ok()?
        .json()
        .ok()?;
    answer["data"]["result"][0]["value"][1]
        .as_str()?
        .parse()
        .ok()
}

#[test]
fn a_real_prometheus_scrapes_the_master_and_answers_queries_about_it() {
    if !running_as_root("Prometheus scrape test") {
        return;
    }
    let Some(binary) = ["/usr/bin/prometheus", "/usr/local/bin/prometheus"]
        .into_iter()
        .map(std::path::PathBuf::from)
        .find(|p| p.is_file())
    else {
        eprintln!("skipping the Prometheus scrape test: no prometheus binary (scripts/setup.sh installs it)");
        return;
    };
    let tokens = tempfile::tempdir().unwrap();
    let (agent_token_file, config) = agents_with_metrics_token(tokens.path());
    let mut cluster = Cluster::start(config).unwrap();
    cluster
        .create_job(&command_job("scraped", 2, false, "true"))
        .unwrap();
    cluster
        .wait_for_all("www-data/test/scraped", TaskState::Finished)
        .unwrap();
    let (forward, rollback) = update_and_kill(&mut cluster);
    // Settled: what the agent's endpoint says now is what Prometheus must read.
    let (_, agent_text) = agent_metrics(&cluster, Some("metrics-token-0123456789abcdef"));
    let agent_now = samples(&agent_text);

    // Prometheus reads /metrics with an operator token, as docs/api.md says to.
    let dir = cluster.dir().join("prometheus");
    std::fs::create_dir_all(&dir).unwrap();
    let token = cluster.create_token(&json!({"kind": "operator"})).unwrap();
    let token_file = dir.join("operator.token");
    std::fs::write(&token_file, token).unwrap();
    let target = cluster
        .url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let agent_target = cluster.agents().unwrap()[0]
        .address
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\
             scrape_configs:\n  - job_name: drover-master\n    metrics_path: /metrics\n\
             \x20   authorization:\n      type: Bearer\n      credentials_file: {}\n\
             \x20   static_configs:\n      - targets: ['{target}']\n\
             \x20 - job_name: drover-agent\n    metrics_path: /metrics\n\
             \x20   authorization:\n      type: Bearer\n      credentials_file: {}\n\
             \x20   static_configs:\n      - targets: ['{agent_target}']\n",
            token_file.display(),
            agent_token_file.display()
        ),
    )
    .unwrap();
    let mut command = std::process::Command::new(binary);
    command
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"));
    let mut server =
        drover_tests::Proc::spawn("prometheus", command, &dir.join("prometheus.log")).unwrap();
    let api = format!("http://127.0.0.1:{port}");
    let http = reqwest::blocking::Client::builder()
        .timeout(std::time::Duration::from_secs(5))
        .build()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    let mut finished = None;
    while std::time::Instant::now() < deadline {
        finished = query(&http, &api, "drover_master_tasks{state=\"FINISHED\"}");
        if finished.is_some() {
            break;
        }
        assert!(
            server.is_running(),
            "prometheus exited:\n{}",
            server.log_tail()
        );
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    assert_eq!(
        finished,
        Some(2.0),
        "Prometheus did not get the tasks gauge; its log:\n{}",
        server.log_tail()
    );
    assert_eq!(query(&http, &api, "up{job=\"drover-master\"}"), Some(1.0));
    let placements = query(&http, &api, "drover_master_placements_total").unwrap_or(0.0);
    assert!(placements >= 2.0, "placements {placements}");
    let commits = query(
        &http,
        &api,
        "drover_master_store_commit_duration_seconds_count",
    );
    assert!(commits.is_some_and(|n| n >= 1.0), "{commits:?}");
    // The agent's metrics, scraped with its metrics token.
    let mut starts = None;
    while std::time::Instant::now() < deadline {
        starts = query(&http, &api, "drover_agent_executor_starts_total");
        if starts.is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    assert_eq!(
        starts,
        agent_now.get("drover_agent_executor_starts_total").copied(),
        "Prometheus did not get the agent's executor starts; its log:\n{}",
        server.log_tail()
    );
    assert!(
        starts.is_some_and(|n| n >= 2.0 + 3.0 + 3.0 + 2.0),
        "{starts:?}"
    );
    assert_eq!(query(&http, &api, "up{job=\"drover-agent\"}"), Some(1.0));
    assert_eq!(
        query(
            &http,
            &api,
            "drover_agent_task_exits_total{reason=\"exit_code\"}"
        ),
        Some(2.0)
    );
    let outbox = query(&http, &api, "drover_agent_outbox_updates");
    assert!(outbox.is_some_and(|n| n >= 0.0), "{outbox:?}");

    // Rolling-update batches by direction: as many and as large as the updates'
    // events say.
    for (direction, sizes) in [("forward", &forward), ("rollback", &rollback)] {
        let series = |part: &str| {
            query(
                &http,
                &api,
                &format!(
                    "drover_master_rolling_update_batch_instances_{part}{{direction=\"{direction}\"}}"
                ),
            )
        };
        assert_eq!(series("count"), Some(sizes.len() as f64), "{direction}");
        assert_eq!(series("sum"), Some(sizes.iter().sum()), "{direction}");
    }
    // Kill escalation steps: graceful, shutdown and kill once (the task that ignored
    // SIGTERM); SIGTERM ended the other and the tasks the updates replaced.
    for step in ["graceful", "shutdown", "term", "kill"] {
        let series = format!("drover_agent_kill_escalation_step_seconds_count{{step=\"{step}\"}}");
        let seen = query(&http, &api, &series);
        assert_eq!(seen, agent_now.get(&series).copied(), "{series}");
        let least = if step == "term" { 2.0 + 3.0 } else { 1.0 };
        assert!(seen.is_some_and(|n| n >= least), "{series}: {seen:?}");
        if step != "term" {
            assert_eq!(seen, Some(1.0), "{series}");
        }
    }
    server.stop(std::time::Duration::from_secs(10));
}
