//! Black-box: the master's and the agent's `GET /metrics` (Prometheus text
//! exposition) on a real cluster: tasks by state, placements, scheduling latency,
//! store commits and agents on the master; executor starts, exits by reason, kill
//! escalations, process starts and the outbox on the agent; read back after real
//! jobs ran, over HTTP and through a real Prometheus; who may read them.

use std::collections::BTreeMap;

use drover_common::state::TaskState;
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
        Some(2.0),
        "Prometheus did not get the agent's executor starts; its log:\n{}",
        server.log_tail()
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
    server.stop(std::time::Duration::from_secs(10));
}
