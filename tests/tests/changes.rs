//! Black-box: the change stream (`GET /v1/changes`). A client that read up to an
//! index and comes back after a master restart gets every task changed since, and
//! the index goes on (no number is reused); a long poll answers when a change
//! commits; a role-scoped token sees only its roles' changes; `drover job create
//! --wait` says why instances are pending.

use std::time::{Duration, Instant};

use drover_common::state::TaskState;
use drover_common::wire::ChangesView;
use drover_tests::{command_job, describe, running_as_root, Cluster, ClusterConfig};
use serde_json::json;

fn changes(cluster: &Cluster, query: &str) -> ChangesView {
    cluster
        .get(&format!("/v1/changes?{query}"))
        .expect("GET /v1/changes answers")
}

fn task_ids_of(view: &ChangesView, job: &str) -> Vec<String> {
    view.tasks
        .iter()
        .filter(|t| t.job == job)
        .map(|t| t.task_id.clone())
        .collect()
}

#[test]
fn a_client_resumes_from_its_index_across_a_master_restart_without_losing_a_change() {
    if !running_as_root("change stream restart test") {
        return;
    }
    let mut cluster = Cluster::start(ClusterConfig::agents(1)).unwrap();
    cluster
        .create_job(&command_job("first", 1, true, "sleep 600"))
        .unwrap();
    cluster
        .wait_for_all("www-data/test/first", TaskState::Running)
        .unwrap();
    let seen = changes(&cluster, "index=0&wait_ms=0");
    assert!(!seen.reset);
    assert_eq!(
        task_ids_of(&seen, "www-data/test/first").len(),
        1,
        "{seen:?}"
    );
    // The client goes away; meanwhile a job is killed and another created.
    cluster.kill_job("www-data/test/first").unwrap();
    cluster
        .create_job(&command_job("second", 2, false, "true"))
        .unwrap();
    cluster
        .wait_for_all("www-data/test/first", TaskState::Killed)
        .unwrap();
    cluster
        .wait_for_all("www-data/test/second", TaskState::Finished)
        .unwrap();
    cluster.restart_master().unwrap();

    // Back from index `seen.index`: both jobs' changes, as their latest state.
    let resumed = changes(&cluster, &format!("index={}&wait_ms=0", seen.index));
    assert!(!resumed.reset, "{resumed:?}");
    assert!(resumed.index > seen.index, "{resumed:?}");
    let first: Vec<_> = resumed
        .tasks
        .iter()
        .filter(|t| t.job == "www-data/test/first")
        .collect();
    assert_eq!(first.len(), 1, "{resumed:?}");
    assert_eq!(first[0].state, TaskState::Killed);
    let second: Vec<_> = resumed
        .tasks
        .iter()
        .filter(|t| t.job == "www-data/test/second")
        .collect();
    assert_eq!(second.len(), 2, "{resumed:?}");
    assert!(second.iter().all(|t| t.state == TaskState::Finished));
    assert!(resumed.jobs.iter().any(|j| j.key == "www-data/test/second"));

    // A change after the restart has a higher index than any before it: a client
    // that read everything before the restart still gets it.
    cluster
        .create_job(&command_job("third", 1, false, "true"))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut index = resumed.index;
    let mut third = Vec::new();
    while third.is_empty() && Instant::now() < deadline {
        let next = changes(&cluster, &format!("index={index}&wait_ms=5000"));
        assert!(!next.reset, "{next:?}");
        index = next.index;
        third = task_ids_of(&next, "www-data/test/third");
    }
    assert_eq!(
        third.len(),
        1,
        "the job created after the restart is reported"
    );

    // An index the master never reached (its store was replaced) resets the client.
    let future = changes(&cluster, "index=999999999&wait_ms=0");
    assert!(future.reset, "{future:?}");
    assert!(future.index < 999_999_999);
    assert!(!future.tasks.is_empty());
}

#[test]
fn a_long_poll_answers_when_a_change_commits_and_a_role_token_sees_only_its_roles() {
    if !running_as_root("change stream long poll test") {
        return;
    }
    let cluster = Cluster::start(ClusterConfig::agents(1)).unwrap();
    let start = changes(&cluster, "index=0&wait_ms=0");
    let url = format!(
        "{}/v1/changes?index={}&wait_ms=60000&job=www-data/test/woken",
        cluster.url, start.index
    );
    let http = cluster.http();
    let token = cluster.token.clone().unwrap();
    let poll = std::thread::spawn(move || {
        let asked = Instant::now();
        let answer: ChangesView = http
            .get(url)
            .bearer_auth(token)
            .timeout(Duration::from_secs(90))
            .send()
            .unwrap()
            .json()
            .unwrap();
        (answer, asked.elapsed())
    });
    // Not answered before the change: still waiting after a moment.
    std::thread::sleep(Duration::from_millis(300));
    assert!(!poll.is_finished(), "the long poll waits for a change");
    cluster
        .create_job(&command_job("woken", 1, false, "true"))
        .unwrap();
    let (answer, took) = poll.join().unwrap();
    assert_eq!(
        task_ids_of(&answer, "www-data/test/woken").len(),
        1,
        "{answer:?}"
    );
    assert!(
        took < Duration::from_secs(50),
        "answered at the change, not the deadline"
    );
    assert!(answer.index > start.index);

    // A token of another role sees none of www-data's changes, no agents, and may
    // not ask for a www-data job.
    let other = cluster
        .create_token(&json!({"kind": "roles", "roles": ["other"]}))
        .unwrap();
    let answer: ChangesView = cluster
        .http()
        .get(format!("{}/v1/changes?index=0&wait_ms=0", cluster.url))
        .bearer_auth(&other)
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert!(answer.tasks.is_empty(), "{answer:?}");
    assert!(answer.agents.is_empty(), "{answer:?}");
    let status = cluster
        .http()
        .get(format!(
            "{}/v1/changes?index=0&wait_ms=0&job=www-data/test/woken",
            cluster.url
        ))
        .bearer_auth(&other)
        .send()
        .unwrap()
        .status();
    assert_eq!(status.as_u16(), 403);
    // An admin sees the agents' registration.
    let all = changes(&cluster, "index=0&wait_ms=0");
    assert_eq!(all.agents.len(), 1, "{all:?}");
}

#[test]
fn job_create_wait_says_why_instances_are_pending() {
    if !running_as_root("job create --wait pending test") {
        return;
    }
    let cluster = Cluster::start(ClusterConfig::agents(1)).unwrap();
    let mut spec = command_job("crowded", 2, true, "sleep 600");
    spec["constraints"] = json!({"host": "limit:1"});
    let path = cluster.dir().join("crowded.json");
    std::fs::write(&path, spec.to_string()).unwrap();
    let output = cluster
        .drover(&[
            "job",
            "create",
            path.to_str().unwrap(),
            "--wait",
            "--timeout",
            "5s",
        ])
        .unwrap();
    let text = describe(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("pending: host limit reached on 1 agent (1)"),
        "{text}"
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("after 5s"), "{text}");
}
