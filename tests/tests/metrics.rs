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
    let mut spec = command_job("stuck", 2, true, "sleep 600");
    spec["constraints"] = json!({"host": "limit:1"});
    cluster.create_job(&spec).unwrap();
    cluster
        .wait_for_all("www-data/test/counted", TaskState::Finished)
        .unwrap();

    let (status, text) = cluster.get_status("/metrics").unwrap();
    assert_eq!(status, 200, "{text}");
    let s = samples(&text);
    let get = |key: &str| {
        *s.get(key)
            .unwrap_or_else(|| panic!("no sample {key} in:\n{text}"))
    };
    assert_eq!(get("drover_master_tasks{state=\"FINISHED\"}"), 3.0);
    assert_eq!(get("drover_master_pending_tasks"), 1.0);
    assert_eq!(
        get("drover_master_pending_reasons{reason=\"host limit reached\"}"),
        1.0
    );
    assert_eq!(
        get("drover_master_agents{reachable=\"true\",maintenance=\"NONE\"}"),
        1.0
    );
    // Four tasks were placed (three one-shots and one of the service).
    assert!(get("drover_master_placements_total") >= 4.0, "{text}");
    assert!(get("drover_master_scheduling_latency_seconds_count") >= 4.0);
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
