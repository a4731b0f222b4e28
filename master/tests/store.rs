//! The SQLite store on a real file: what is committed is loaded back exactly, later
//! changes to a row win, deletes stick, and the group-commit writer acknowledges
//! only committed batches; a store out of space makes the writer read-only (the
//! batch dropped, and those made on top of it) until a write works again.

#![allow(clippy::unwrap_used)] // unwrap is how tests fail

use std::sync::Arc;

use drover_common::spec::JobSpec;
use drover_common::state::{EventSource, TaskState, TaskStatus};
use drover_common::wire::{AgentResources, AgentVersions, HostEvent, MaintenanceMode};
use drover_common::DesiredState;
use drover_master::core::Snapshot;
use drover_master::core::{AgentRecord, Change, HostFailure, HostMaintenance, Task};
use drover_master::store::{SqliteStore, Store, StoreError, Writer, DB_FILE};

fn spec(name: &str) -> JobSpec {
    serde_json::from_value(serde_json::json!({
        "role": "www", "environment": "prod", "name": name,
        "task": {"processes": [{"name": "m", "cmdline": "true"}],
                 "resources": {"cpu": 1, "ram": "1MiB", "disk": "1MiB"}}
    }))
    .unwrap()
}

fn task(id: &str, state: TaskState) -> Task {
    let mut status = TaskStatus::new(TaskState::Pending, 5, EventSource::Master, "created");
    if state != TaskState::Pending {
        status
            .transition(TaskState::Assigned, None, 6, EventSource::Master, "placed")
            .unwrap();
    }
    Task {
        id: id.to_string(),
        withdrawn_ms: None,
        job: "www/prod/a".to_string(),
        instance: 0,
        gen: 0,
        status,
        desired: DesiredState::Running,
        kill_reason: None,
        replace_at_end: None,
        agent: Some("agent-1".to_string()),
        ports: vec![("http".to_string(), 31001)],
        assigned_version: 3,
        last_seq: Some(2),
        processes: Vec::new(),
        processes_omitted: None,
        created_ms: 5,
        running_since: None,
        running_mono: None,
        failures: 1,
        flaps: 2,
        throttle_until: None,
        preempted_by: None,
        config: "abc".to_string(),
        last_report_ms: 0,
        missing_since: None,
        rev: 0,
    }
}

fn agent() -> AgentRecord {
    AgentRecord {
        ip: String::new(),
        id: "agent-1".to_string(),
        hostname: "h".to_string(),
        address: "http://h:1".to_string(),
        resources: AgentResources {
            cpu: 2.0,
            ram_bytes: 1 << 30,
            disk_bytes: 1 << 30,
            port_range: (31000, 31010),
        },
        attributes: [("rack".to_string(), "r1".to_string())].into(),
        version: 7,
        last_heartbeat_ms: 99,
        rev: 0,
        maintenance: HostMaintenance {
            mode: MaintenanceMode::Draining,
            reason: Some("maintenance".to_string()),
            since_ms: 50,
            deadline_ms: Some(60_050),
            drain_at_ms: Some(40),
            drain_deadline_ms: Some(60_000),
            events: [HostEvent {
                timestamp_ms: 50,
                message: "drain requested".to_string(),
            }]
            .into(),
            failures: [HostFailure {
                at_ms: 40,
                at_mono: 0,
                job: "www/prod/a".to_string(),
                reason: "executor lost".to_string(),
            }]
            .into(),
        },
        versions: Some(AgentVersions {
            agent: "0.1.0".to_string(),
            executor: "0.0.9".to_string(),
        }),
    }
}

#[test]
fn the_store_and_its_wal_are_readable_by_the_master_alone() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(DB_FILE);
    let mode = |suffix: &str| {
        let file = format!("{}{suffix}", path.display());
        std::fs::metadata(file).unwrap().permissions().mode() & 0o777
    };
    {
        let mut store = SqliteStore::open(&path).unwrap();
        store
            .commit(&[Change::PutJob(
                Arc::new(spec("a")),
                "www/prod/a".to_string(),
                5,
            )])
            .unwrap();
        for suffix in ["", "-wal", "-shm"] {
            assert_eq!(mode(suffix), 0o600, "drover.db{suffix}");
        }
    }
    // A store made readable by an older master is made private again on open.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    drop(SqliteStore::open(&path).unwrap());
    assert_eq!(mode(""), 0o600);
}

#[test]
fn committed_changes_load_back_exactly_after_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(DB_FILE);
    {
        let mut store = SqliteStore::open(&path).unwrap();
        store
            .commit(&[
                Change::PutJob(Arc::new(spec("a")), "www/prod/a".to_string(), 5),
                Change::PutJob(Arc::new(spec("b")), "www/prod/b".to_string(), 6),
                Change::PutTask(Box::new(task("t1", TaskState::Pending))),
                Change::PutTask(Box::new(task("t2", TaskState::Pending))),
                Change::PutAgent(Box::new(agent())),
            ])
            .unwrap();
        store
            .commit(&[
                Change::PutTask(Box::new(task("t1", TaskState::Assigned))),
                Change::DeleteTask("t2".to_string()),
                Change::DeleteJob("www/prod/b".to_string()),
            ])
            .unwrap();
    }
    let mut store = SqliteStore::open(&path).unwrap();
    let snap = store.load().unwrap();
    assert_eq!(snap.jobs.len(), 1);
    assert_eq!(snap.jobs[0].spec, spec("a"));
    assert_eq!(snap.tasks, vec![task("t1", TaskState::Assigned)]);
    assert_eq!(snap.agents, vec![agent()]);
}

#[test]
fn user_grants_load_back_and_an_emptied_role_is_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(DB_FILE);
    let users = |names: &[&str]| names.iter().map(|n| n.to_string()).collect();
    {
        let mut store = SqliteStore::open(&path).unwrap();
        store
            .commit(&[
                Change::PutUserGrants("www".into(), users(&["backup", "daemon"])),
                Change::PutUserGrants("db".into(), users(&["postgres"])),
            ])
            .unwrap();
        store
            .commit(&[
                Change::PutUserGrants("www".into(), users(&["backup"])),
                Change::PutUserGrants("db".into(), users(&[])),
            ])
            .unwrap();
    }
    let snap = SqliteStore::open(&path).unwrap().load().unwrap();
    assert_eq!(snap.user_grants, vec![("www".into(), users(&["backup"]))]);
    // The read-only load (a master on a full disk) reads them too.
    let snap = SqliteStore::load_read_only(&path).unwrap();
    assert_eq!(snap.user_grants, vec![("www".into(), users(&["backup"]))]);
}

#[test]
fn within_one_batch_the_last_change_to_a_row_wins() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(DB_FILE);
    let mut store = SqliteStore::open(&path).unwrap();
    store
        .commit(&[
            Change::PutTask(Box::new(task("t1", TaskState::Pending))),
            Change::DeleteTask("t1".to_string()),
            Change::PutTask(Box::new(task("t3", TaskState::Pending))),
            Change::PutTask(Box::new(task("t3", TaskState::Assigned))),
        ])
        .unwrap();
    let snap = store.load().unwrap();
    assert_eq!(snap.tasks, vec![task("t3", TaskState::Assigned)]);
}

#[tokio::test]
async fn the_writer_commits_queued_batches_and_reports_progress() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(DB_FILE);
    let store = SqliteStore::open(&path).unwrap();
    let mut writer = Writer::start(Box::new(store), 0);
    let mut rx = writer.notifier.subscribe("agent-1");
    for i in 1..=50u64 {
        writer.submit(
            i,
            vec![Change::PutTask(Box::new(task(
                &format!("t{i}"),
                TaskState::Pending,
            )))],
            vec!["agent-1".to_string()],
        );
    }
    let mut progress = writer.state.subscribe();
    while writer.state.committed() < 50 {
        progress.changed().await.unwrap();
    }
    rx.changed().await.unwrap();
    assert!(*rx.borrow() >= 1);
    writer.close();
    let snap = SqliteStore::open(&path).unwrap().load().unwrap();
    assert_eq!(snap.tasks.len(), 50);
}

#[test]
fn a_newer_schema_is_refused_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(DB_FILE);
    drop(SqliteStore::open(&path).unwrap());
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute(
        "UPDATE meta SET value = '9' WHERE key = 'schema_version'",
        [],
    )
    .unwrap();
    drop(conn);
    let err = SqliteStore::open(&path).err().unwrap().to_string();
    assert!(err.contains("schema version is 9"), "{err}");
}

#[test]
fn configs_load_back_and_a_job_replaced_in_one_batch_loses_its_old_ones() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(DB_FILE);
    let key = "www/prod/a".to_string();
    let config = |hash: &str| Change::PutConfig {
        job: key.clone(),
        hash: hash.to_string(),
        spec: Arc::new(spec("a")),
        used_ms: 5,
    };
    {
        let mut store = SqliteStore::open(&path).unwrap();
        store
            .commit(&[
                Change::PutJob(Arc::new(spec("a")), key.clone(), 5),
                config("old1"),
                config("old2"),
            ])
            .unwrap();
        assert_eq!(store.load().unwrap().configs.len(), 2);
        // The job is dropped and created again in one batch (POST /v1/jobs over a
        // finished job): only the new config remains.
        store
            .commit(&[
                Change::DeleteJob(key.clone()),
                Change::PutJob(Arc::new(spec("a")), key.clone(), 9),
                config("new"),
            ])
            .unwrap();
    }
    let snap = SqliteStore::open(&path).unwrap().load().unwrap();
    assert_eq!(snap.jobs.len(), 1);
    assert_eq!(snap.jobs[0].created_ms, 9);
    let hashes: Vec<&str> = snap.configs.iter().map(|c| c.hash.as_str()).collect();
    assert_eq!(hashes, ["new"]);
}

#[test]
fn pruned_configs_are_deleted_durably_and_the_others_keep_their_use_time() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(DB_FILE);
    let key = "www/prod/a".to_string();
    let config = |hash: &str, used_ms: u64| Change::PutConfig {
        job: key.clone(),
        hash: hash.to_string(),
        spec: Arc::new(spec("a")),
        used_ms,
    };
    let delete = |hash: &str| Change::DeleteConfig {
        job: key.clone(),
        hash: hash.to_string(),
    };
    {
        let mut store = SqliteStore::open(&path).unwrap();
        store
            .commit(&[
                Change::PutJob(Arc::new(spec("a")), key.clone(), 5),
                config("c1", 10),
                config("c2", 20),
                config("c3", 30),
            ])
            .unwrap();
        // One batch: c1 dropped, c3 written again (it became the newest again),
        // c4 written then dropped at once.
        store
            .commit(&[
                delete("c1"),
                config("c3", 40),
                config("c4", 35),
                delete("c4"),
            ])
            .unwrap();
    }
    let snap = SqliteStore::open(&path).unwrap().load().unwrap();
    let mut kept: Vec<(&str, u64)> = snap
        .configs
        .iter()
        .map(|c| (c.hash.as_str(), c.used_ms))
        .collect();
    kept.sort();
    assert_eq!(kept, [("c2", 20), ("c3", 40)]);
}

#[test]
fn a_store_from_before_config_use_times_loads_and_gains_the_column() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(DB_FILE);
    {
        let mut store = SqliteStore::open(&path).unwrap();
        store
            .commit(&[Change::PutJob(Arc::new(spec("a")), "www/prod/a".into(), 5)])
            .unwrap();
    }
    // The table as an older master wrote it: no used_ms.
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "DROP TABLE job_configs;
             CREATE TABLE job_configs (
                job TEXT NOT NULL, hash TEXT NOT NULL, spec TEXT NOT NULL,
                PRIMARY KEY (job, hash));",
        )
        .unwrap();
        let json = serde_json::to_string(&spec("a")).unwrap();
        conn.execute(
            "INSERT INTO job_configs (job, hash, spec) VALUES ('www/prod/a', 'old', ?1)",
            [json],
        )
        .unwrap();
    }
    let mut store = SqliteStore::open(&path).unwrap();
    let snap = store.load().unwrap();
    assert_eq!(snap.configs.len(), 1);
    assert_eq!(
        (snap.configs[0].hash.as_str(), snap.configs[0].used_ms),
        ("old", 0)
    );
    store
        .commit(&[Change::PutConfig {
            job: "www/prod/a".into(),
            hash: "new".into(),
            spec: Arc::new(spec("a")),
            used_ms: 7,
        }])
        .unwrap();
    let mut kept: Vec<(String, u64)> = store
        .load()
        .unwrap()
        .configs
        .into_iter()
        .map(|c| (c.hash, c.used_ms))
        .collect();
    kept.sort();
    assert_eq!(kept, [("new".to_string(), 7), ("old".to_string(), 0)]);
}

/// A store whose writes fail for want of space while `full` is set; it records
/// the tasks it stored.
struct FullDisk {
    full: Arc<std::sync::atomic::AtomicBool>,
    stored: Arc<std::sync::Mutex<Vec<String>>>,
}

impl Store for FullDisk {
    fn load(&mut self) -> Result<Snapshot, StoreError> {
        Ok(Snapshot::default())
    }

    fn commit(&mut self, changes: &[Change]) -> Result<(), StoreError> {
        if self.full.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(StoreError::NoSpace {
                op: "commit",
                detail: "database or disk is full".to_string(),
            });
        }
        let mut stored = self.stored.lock().unwrap();
        for c in changes {
            if let Change::PutTask(t) = c {
                stored.push(t.id.clone());
            }
        }
        Ok(())
    }
}

#[tokio::test]
async fn a_full_store_turns_the_writer_read_only_until_a_write_works_again() {
    let full = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stored = Arc::new(std::sync::Mutex::new(Vec::new()));
    let store = FullDisk {
        full: full.clone(),
        stored: stored.clone(),
    };
    let writer = Writer::start(Box::new(store), 0);
    let put = |i: u64| {
        vec![Change::PutTask(Box::new(task(
            &format!("t{i}"),
            TaskState::Pending,
        )))]
    };
    let state = writer.state.clone();
    let mut progress = state.subscribe();
    writer.submit(1, put(1), Vec::new());
    while state.committed() < 1 {
        progress.changed().await.unwrap();
    }
    assert_eq!(state.read_only(), None);
    let epoch = state.epoch();
    // The disk fills: batch 2 is not stored, and batch 3, made on top of it by a
    // core of the same epoch, is dropped too, even once space is back.
    full.store(true, std::sync::atomic::Ordering::SeqCst);
    writer.submit_from(2, epoch, put(2), Vec::new());
    while state.epoch() == epoch {
        progress.changed().await.unwrap();
    }
    let why = state.read_only().expect("read-only");
    assert!(
        why.contains("disk is full") && why.contains("free"),
        "{why}"
    );
    assert!(!state.failed());
    full.store(false, std::sync::atomic::Ordering::SeqCst);
    writer.submit_from(3, epoch, put(3), Vec::new());
    // Space is back: the writer's own retry ends read-only mode.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while state.read_only().is_some() {
        assert!(std::time::Instant::now() < until, "still read-only");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(state.committed(), 1);
    // A core reloaded at the new epoch writes again.
    writer.submit_from(2, state.epoch(), put(4), Vec::new());
    while state.committed() < 2 {
        progress.changed().await.unwrap();
    }
    assert_eq!(
        *stored.lock().unwrap(),
        vec!["t1".to_string(), "t4".to_string()]
    );
    assert!(writer.load().is_ok());
}
