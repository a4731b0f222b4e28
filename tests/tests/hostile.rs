//! One task cannot hurt its agent or its neighbours (issue 27), black-box: a real
//! master, one agent and executors (as root). A hostile task declares the most
//! processes a spec may (99 of them restarting every second, one forking a thousand
//! `sleep`s) while a second job on the same agent starts, reports and finishes; the
//! agent's RSS and outbox stay small; after the kill nothing of the hostile task is
//! left (no process, no cgroup). The numbers seen are printed for the record.

#![allow(clippy::unwrap_used)] // unwrap is how tests fail

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use drover_common::state::TaskState;
use drover_common::validate::MAX_PROCESSES;
use drover_tests::{command_job, processes_under, running_as_root, Cluster, ClusterConfig};
use serde_json::{json, Value};

/// How many `sleep`s the hostile task's spawner forks.
const SLEEPS: usize = 1000;

/// The hostile job: `MAX_PROCESSES - 1` daemons that exit at once and restart every
/// second (a status-worthy change each time), and one process forking [`SLEEPS`]
/// sleeps that would outlive it.
fn hostile_job() -> Value {
    let mut processes: Vec<Value> = (0..MAX_PROCESSES - 1)
        .map(|i| {
            json!({
                "name": format!("churn-{i}"),
                "cmdline": "sleep 0.1",
                "daemon": true,
                "max_failures": 0,
                "min_duration": "1s"
            })
        })
        .collect();
    processes.push(json!({
        "name": "spawner",
        "cmdline": format!("for i in $(seq {SLEEPS}); do sleep 600 & done; wait"),
    }));
    json!({
        "role": "www-data",
        "environment": "test",
        "name": "hostile",
        "service": true,
        "task": {
            "processes": processes,
            "resources": {"cpu": 1, "ram": "512MiB", "disk": "64MiB", "pids": 2048},
            "finalization_wait": "2s"
        }
    })
}

/// The agent's resident set, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// The bytes in the agent's outbox directory.
fn outbox_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// `drover_agent_outbox_bytes` from the agent's `/metrics` (0 when absent).
fn pending_bytes(cluster: &Cluster, address: &str) -> u64 {
    let text = cluster
        .http()
        .get(format!("{}/metrics", address.trim_end_matches('/')))
        .bearer_auth(METRICS_TOKEN)
        .send()
        .and_then(|r| r.text())
        .unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("drover_agent_outbox_bytes "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// How many status reports the master received (the sum of
/// `drover_master_agent_update_batch_reports`).
fn reports_received(cluster: &Cluster) -> u64 {
    let (_, text) = cluster.get_status("/metrics").unwrap();
    text.lines()
        .find(|l| l.contains("agent_update_batch_reports_sum"))
        .and_then(|l| l.split_whitespace().last()?.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// The agent's metrics token.
const METRICS_TOKEN: &str = "metrics-token-0123456789abcdef";

/// Cgroup directories named `task_id` anywhere under /sys/fs/cgroup (v1 or v2, any
/// parent), three levels down at most.
fn cgroups_of(task_id: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut level = vec![PathBuf::from("/sys/fs/cgroup")];
    for _ in 0..4 {
        let mut next = Vec::new();
        for dir in level {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    if entry.file_name() == task_id {
                        found.push(entry.path());
                    } else {
                        next.push(entry.path());
                    }
                }
            }
        }
        level = next;
    }
    found
}

/// The current task id of instance 0 of `key`, once it is in `state`.
fn task_in(cluster: &mut Cluster, key: &str, state: TaskState) -> String {
    let key = key.to_string();
    cluster
        .wait_for(&format!("{key}/0 to be {state}"), drover_tests::WAIT, |c| {
            let view = c.job(&key).ok()?;
            let t = view.instances.first()?.current.as_ref()?;
            (t.state == state).then(|| t.task_id.clone())
        })
        .unwrap()
}

#[test]
fn a_hostile_task_neither_bloats_its_agent_nor_blocks_its_neighbours_and_leaves_nothing() {
    if !running_as_root("a_hostile_task_neither_bloats_its_agent_nor_blocks_its_neighbours") {
        return;
    }
    let token_dir = tempfile::tempdir().unwrap();
    let token_file = token_dir.path().join("agent-metrics.token");
    std::fs::write(&token_file, format!("{METRICS_TOKEN}\n")).unwrap();
    let mut config = ClusterConfig::agents(1);
    config.agent_config = format!(
        "metrics_token_file = {:?}\n",
        token_file.display().to_string()
    );
    let mut cluster = Cluster::start(config).unwrap();
    let agent = cluster.agent_pids()[0];
    let address = cluster.agents().unwrap()[0].address.clone();
    let outbox = cluster.dir().join("agent-0/outbox");

    // The spec of the report (10,000 declared processes) is refused outright.
    let mut many = hostile_job();
    let one = many["task"]["processes"][0].clone();
    let all: Vec<Value> = (0..10_000)
        .map(|i| {
            let mut p = one.clone();
            p["name"] = json!(format!("p{i}"));
            p
        })
        .collect();
    many["task"]["processes"] = json!(all);
    let (status, body) = cluster.post("/v1/jobs", &many).unwrap();
    assert_eq!(status, 400, "{body}");
    assert!(
        body.to_string().contains("task.processes")
            && body
                .to_string()
                .contains(&format!("maximum of {MAX_PROCESSES}")),
        "{body}"
    );

    let rss_at_start = rss(agent);
    let mut max_rss = rss_at_start;
    let mut max_outbox = 0;
    let mut max_pending = 0;
    macro_rules! sample {
        () => {
            max_rss = max_rss.max(rss(agent));
            max_outbox = max_outbox.max(outbox_bytes(&outbox));
            max_pending = max_pending.max(pending_bytes(&cluster, &address));
        };
    }

    let reports_before = reports_received(&cluster);
    cluster.create_job(&hostile_job()).unwrap();
    let hostile = task_in(&mut cluster, "www-data/test/hostile", TaskState::Running);
    let sandbox = cluster.sandbox_of(&hostile).unwrap();
    // Let it churn: its daemons restart every second, its sleeps pile up.
    let churn_until = Instant::now() + Duration::from_secs(8);
    while Instant::now() < churn_until {
        sample!();
        std::thread::sleep(Duration::from_millis(200));
    }
    let hostile_processes = processes_under(&sandbox.join("sandbox")).len();

    // A neighbour starts, reports and finishes on the same agent meanwhile.
    let began = Instant::now();
    let mut calm = command_job("calm", 2, false, "sleep 1");
    calm["task"]["resources"]["cpu"] = json!(0.1);
    cluster.create_job(&calm).unwrap();
    cluster
        .wait_for(
            "the neighbour job to finish",
            Duration::from_secs(30),
            |c| {
                let view = c.job("www-data/test/calm").ok()?;
                let done = view.instances.len() == 2
                    && view.instances.iter().all(|i| {
                        i.current
                            .as_ref()
                            .is_some_and(|t| t.state == TaskState::Finished)
                    });
                done.then_some(())
            },
        )
        .unwrap();
    let neighbour_took = began.elapsed();
    sample!();

    // The master still hears from the hostile task too, with its process list.
    let view = cluster.task(&hostile).unwrap();
    assert_eq!(view.state, TaskState::Running);
    assert_eq!(
        view.processes.len(),
        MAX_PROCESSES,
        "{:?}",
        view.processes.len()
    );

    cluster.kill_job("www-data/test/hostile").unwrap();
    let began = Instant::now();
    cluster
        .wait_for(
            "the hostile task to be KILLED",
            Duration::from_secs(40),
            |c| {
                let t = c.task(&hostile).ok()?;
                (t.state == TaskState::Killed).then_some(())
            },
        )
        .unwrap();
    let kill_took = began.elapsed();
    sample!();
    let reports = reports_received(&cluster) - reports_before;
    eprintln!(
        "hostile task: {hostile_processes} processes in its sandbox; agent RSS {} KiB at start, at most {} KiB; outbox at most {max_outbox} bytes on disk, {max_pending} bytes pending; neighbour finished in {neighbour_took:?}; kill took {kill_took:?}; {reports} status reports reached the master",
        rss_at_start / 1024,
        max_rss / 1024
    );
    assert!(
        hostile_processes > MAX_PROCESSES,
        "the hostile task forked its sleeps: {hostile_processes}"
    );

    // Nothing of it is left: no process, no cgroup.
    let left = cluster
        .wait_for(
            "nothing of the hostile task to be left",
            Duration::from_secs(15),
            |_| {
                let procs = processes_under(&sandbox.join("sandbox"));
                let groups = cgroups_of(&hostile);
                (procs.is_empty() && groups.is_empty()).then_some(())
            },
        )
        .map_err(|e| {
            format!(
                "{e}: processes {:?}, cgroups {:?}",
                processes_under(&sandbox.join("sandbox")).len(),
                cgroups_of(&hostile)
            )
        });
    left.unwrap();

    // Generous bounds: the agent's own (a debug build) plus a few MB; the outbox a
    // few statuses of 100 processes.
    assert!(
        max_rss < rss_at_start + (64 << 20),
        "agent RSS grew from {rss_at_start} to {max_rss} bytes"
    );
    assert!(max_outbox < 4 << 20, "outbox reached {max_outbox} bytes");
    assert!(
        max_pending < 256 << 10,
        "pending statuses reached {max_pending} bytes"
    );
    // About one status a second for the hostile task (its processes change all the
    // time), a few for the neighbour: not one per process change.
    assert!(reports < 150, "{reports} status reports");
}
