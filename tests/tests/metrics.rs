//! Black-box: the master's `GET /metrics` (Prometheus text exposition) on a real
//! cluster: tasks by state, placements, scheduling latency, store commits and agents
//! read back after real jobs ran; who may read it.

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
    let mut cluster = Cluster::start(ClusterConfig::agents(1)).unwrap();
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
             \x20   static_configs:\n      - targets: ['{target}']\n",
            token_file.display()
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
    server.stop(std::time::Duration::from_secs(10));
}
