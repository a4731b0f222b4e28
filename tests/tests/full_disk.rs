//! Black-box: an agent whose data dir fills up (a 1 MiB tmpfs, filled with a file)
//! keeps its tasks running and loses no status: the outbox write of a task that
//! finishes meanwhile fails loudly and is retried, and the master learns FINISHED once
//! space is back. A master whose data dir fills up goes read-only (writes 507, reads
//! and heartbeats served, nothing acknowledged lost, nothing refused stored), resumes
//! by itself once space is back, and starts read-only on a full disk.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use drover_common::state::TaskState;
use drover_tests::{running_as_root, service_job, Cluster, ClusterConfig, WAIT};
use serde_json::json;

/// A tmpfs mounted over a directory (its files copied in); unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn over(dir: &Path, size: &str) -> anyhow::Result<Tmpfs> {
        let saved = dir.with_extension("saved");
        std::fs::rename(dir, &saved)?;
        std::fs::create_dir(dir)?;
        let ok = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0755"),
                "tmpfs",
            ])
            .arg(dir)
            .status()?
            .success();
        anyhow::ensure!(ok, "cannot mount a tmpfs on {}", dir.display());
        let t = Tmpfs(dir.to_path_buf());
        let copied = Command::new("cp")
            .arg("-a")
            .arg(format!("{}/.", saved.display()))
            .arg(dir)
            .status()?
            .success();
        anyhow::ensure!(copied, "cannot copy the data dir");
        Ok(t)
    }

    /// Writes a file until the tmpfs is full.
    fn fill(&self) -> PathBuf {
        let filler = self.0.join("filler");
        let _ = Command::new("dd")
            .args(["if=/dev/zero", "bs=4k"])
            .arg(format!("of={}", filler.display()))
            .stderr(std::process::Stdio::null())
            .status();
        filler
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// A one-agent cluster running the service `web`, and its task id.
fn cluster_with_a_service() -> (Cluster, String) {
    let mut cluster = Cluster::start(ClusterConfig::agents(1)).expect("a cluster");
    cluster
        .api
        .create_job(&service_job("web", 1))
        .expect("the service created");
    let web = cluster
        .wait_for_all("www-data/test/web", TaskState::Running)
        .expect("the service running");
    let task = web.instances[0].current.as_ref().map(|t| t.task_id.clone());
    (cluster, task.unwrap_or_default())
}

#[test]
fn an_agent_with_a_full_data_dir_keeps_its_tasks_and_delivers_every_status_later() {
    if !running_as_root("full disk test") {
        return;
    }
    let (mut cluster, web_task) = cluster_with_a_service();

    // The agent's data dir on a small tmpfs (the agent stopped meanwhile: a crash
    // and a restart, which it survives anyway), then the tmpfs filled up.
    cluster.kill_agent(0);
    let data = cluster.dir().join("agent-0");
    let tmpfs = Tmpfs::over(&data, "1m").unwrap();
    cluster.start_agent_again(0).unwrap();
    cluster
        .wait_for("the agent to be reachable again", WAIT, |c| {
            let agents = c.api.agents().ok()?;
            agents.iter().all(|a| a.reachable).then_some(())
        })
        .unwrap();
    let filler = tmpfs.fill();

    // A batch task finishes while the disk is full.
    cluster
        .api
        .create_job(&json!({
            "role": "www-data", "environment": "test", "name": "brief",
            "instances": 1, "service": false,
            "task": {
                "processes": [{"name": "p", "cmdline": "sleep 1"}],
                "resources": {"cpu": 0.1, "ram": "32MiB", "disk": "32MiB"}
            }
        }))
        .unwrap();
    let log = cluster.dir().join("logs/agent-0.log");
    let deadline = Instant::now() + WAIT;
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("outbox write failed; retrying")
    {
        assert!(
            Instant::now() < deadline,
            "no failed outbox write reported:\n{}",
            cluster.diagnostics()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Meanwhile the agent heartbeats and the service runs on, the same task.
    std::thread::sleep(Duration::from_secs(6));
    let agents = cluster.api.agents().unwrap();
    assert!(agents[0].reachable, "{agents:?}");
    let web = cluster.api.job("www-data/test/web").unwrap();
    let current = web.instances[0].current.as_ref().unwrap();
    assert_eq!(current.task_id, web_task);
    assert_eq!(current.state, TaskState::Running);

    // An agent restarted on the full disk starts, re-adopts the service and
    // heartbeats.
    cluster.kill_agent(0);
    cluster.start_agent_again(0).unwrap();
    std::thread::sleep(Duration::from_secs(3));
    cluster
        .wait_for("the restarted agent to be reachable", WAIT, |c| {
            let agents = c.api.agents().ok()?;
            agents.iter().all(|a| a.reachable).then_some(())
        })
        .unwrap();
    let pid = cluster.agent_pids()[0];
    assert!(
        drover_tests::process_alive(pid),
        "the agent exited on the full disk:\n{}",
        drover_tests::log_tail(&log)
    );

    // Space is back: the retried write lands and the master learns FINISHED.
    std::fs::remove_file(filler).unwrap();
    cluster
        .wait_for_all("www-data/test/brief", TaskState::Finished)
        .unwrap();
    let web = cluster.api.job("www-data/test/web").unwrap();
    assert_eq!(web.instances[0].current.as_ref().unwrap().task_id, web_task);
    // The tmpfs first (a lazy unmount), so the cluster's directory, mount point
    // included, can be removed when the cluster goes.
    drop(tmpfs);
    drop(cluster);
}

/// A batch job that no agent can place (it never starts a process): a write.
fn unplaceable(name: &str) -> serde_json::Value {
    json!({
        "role": "www-data", "environment": "test", "name": name,
        "instances": 1, "service": false,
        "task": {
            "processes": [{"name": "p", "cmdline": "sleep 1"}],
            "resources": {"cpu": 64, "ram": "32MiB", "disk": "32MiB"}
        }
    })
}

/// `/health`'s status and text.
fn health(cluster: &Cluster) -> (u16, String) {
    cluster.api.get_status("/health").expect("GET /health")
}

/// Waits until `/health` says `ok` (true) or read-only (false).
fn wait_health(cluster: &mut Cluster, ok: bool) {
    let what = if ok {
        "writes to resume"
    } else {
        "read-only mode"
    };
    cluster
        .wait_for(what, WAIT, |c| {
            let (status, text) = c.api.get_status("/health").ok()?;
            (status == 200 && (text == "ok") == ok).then_some(())
        })
        .expect("the master's /health");
}

#[test]
fn a_master_on_a_full_disk_goes_read_only_loses_nothing_and_resumes_by_itself() {
    if !running_as_root("full disk test") {
        return;
    }
    let (mut cluster, web_task) = cluster_with_a_service();

    // The master's data dir on a small tmpfs (the master restarted onto it).
    cluster.stop_master(Duration::from_secs(5));
    let tmpfs = Tmpfs::over(&cluster.dir().join("master"), "4m").unwrap();
    cluster.start_master_again().unwrap();
    let filler = tmpfs.fill();

    // Writes go on while SQLite finds room in its files, then one is refused:
    // 507, saying what to do, and nothing of it stored.
    let mut acked = Vec::new();
    let refused = loop {
        assert!(acked.len() < 5_000, "no write was refused on the full disk");
        let name = format!("j{}", acked.len());
        let (status, body) = cluster.api.post("/v1/jobs", &unplaceable(&name)).unwrap();
        match status {
            201 => acked.push(name),
            507 => break (name, body),
            _ => panic!("HTTP {status}: {body}"),
        }
    };
    let (refused, body) = refused;
    assert_eq!(body["error"]["code"], "read_only", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("disk is full") && message.contains("free space"),
        "{message}"
    );
    let (status, text) = health(&cluster);
    assert_eq!(status, 200);
    assert!(text.starts_with("read-only: "), "{text}");
    let keys = cluster.api.job_keys().unwrap();
    assert!(
        !keys.contains(&format!("www-data/test/{refused}")),
        "{keys:?}"
    );
    for name in &acked {
        assert!(
            keys.contains(&format!("www-data/test/{name}")),
            "{name} lost"
        );
    }
    // Every write is refused, the same way.
    let (status, body) = cluster
        .api
        .post("/v1/jobs/www-data/test/web/kill", &json!({}))
        .unwrap();
    assert_eq!(status, 507, "{body}");
    // Reads and heartbeats go on: the agent stays reachable, the service runs on.
    std::thread::sleep(Duration::from_secs(6));
    let agents = cluster.api.agents().unwrap();
    assert!(agents[0].reachable, "{agents:?}");
    let web = cluster.api.job("www-data/test/web").unwrap();
    let current = web.instances[0].current.as_ref().unwrap();
    assert_eq!(
        (current.task_id.as_str(), current.state),
        (web_task.as_str(), TaskState::Running)
    );
    assert!(cluster.master().unwrap().is_running());

    // Space is back: writes resume by themselves.
    std::fs::remove_file(&filler).unwrap();
    wait_health(&mut cluster, true);
    cluster.api.create_job(&service_job("after", 1)).unwrap();
    cluster
        .wait_for_all("www-data/test/after", TaskState::Running)
        .unwrap();

    // A master started on a full disk starts read-only, with everything it had
    // acknowledged, and resumes once space is back.
    cluster.stop_master(Duration::from_secs(5));
    let filler = tmpfs.fill();
    cluster.start_master_again().unwrap();
    let (status, text) = health(&cluster);
    assert_eq!(status, 200);
    assert!(text.starts_with("read-only: "), "{text}");
    let keys = cluster.api.job_keys().unwrap();
    for name in acked.iter().chain([&"after".to_string()]) {
        assert!(
            keys.contains(&format!("www-data/test/{name}")),
            "{name} lost"
        );
    }
    let (status, body) = cluster.api.post("/v1/jobs", &unplaceable("late")).unwrap();
    assert_eq!(status, 507, "{body}");
    std::thread::sleep(Duration::from_secs(3));
    let agents = cluster.api.agents().unwrap();
    assert!(agents[0].reachable, "{agents:?}");
    std::fs::remove_file(&filler).unwrap();
    wait_health(&mut cluster, true);
    cluster.api.create_job(&unplaceable("late")).unwrap();
    let web = cluster.api.job("www-data/test/web").unwrap();
    assert_eq!(web.instances[0].current.as_ref().unwrap().task_id, web_task);
    // The tmpfs first (a lazy unmount), so the cluster's directory, mount point
    // included, can be removed when the cluster goes.
    drop(tmpfs);
    drop(cluster);
}
