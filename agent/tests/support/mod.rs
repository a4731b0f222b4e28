//! Test doubles for the agent's in-process tests: a fake master (axum on
//! 127.0.0.1:0) that records what the agent sends and serves an assignment set the
//! test controls, and helpers to run an agent against it with the fake executor.

#![allow(dead_code, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use drover_agent::config::{ConfigFile, HostFacts};
use drover_agent::Config;
use drover_common::spec::TaskSpec;
use drover_common::state::{DesiredState, TaskState};
use drover_common::wire::{
    Assignment, AssignmentSet, ExecutorTask, HeartbeatRequest, HeartbeatResponse, RegisterRequest,
    RegisterResponse, StatusAck, StatusUpdate, StatusUpdateBatch,
};
use serde::Deserialize;
use tokio::sync::{oneshot, Notify};

/// What the fake master saw and what it serves.
pub struct MasterState {
    pub registrations: Vec<RegisterRequest>,
    pub heartbeats: Vec<HeartbeatRequest>,
    pub updates: Vec<StatusUpdate>,
    pub set: AssignmentSet,
    /// Answer 503 to heartbeats (a partition for the lease).
    pub fail_heartbeats: bool,
    /// Answer 503 to status updates (master down for the relay).
    pub fail_updates: bool,
    /// Answer 413 to every batch holding an update of this task (one update the
    /// master cannot take).
    pub refuse_task: Option<String>,
    /// Ask for the full task set on heartbeats without one.
    pub ask_full_set: bool,
    /// When the last heartbeat was answered with success.
    pub last_good_heartbeat: Option<std::time::Instant>,
    /// The master lost its state: 404 (field agent_id) until the agent registers.
    pub forgot_agent: bool,
    /// When each (task, seq) update arrived.
    pub arrivals: BTreeMap<(String, u64), std::time::Instant>,
    /// The `exclusive_lease_ms` registration answers carry (None: an older master).
    pub exclusive_lease_ms: Option<u64>,
    /// The interval and exclusive lease heartbeat answers carry (None: an older
    /// master's answers, without them).
    pub heartbeat_told: Option<(u64, u64)>,
    /// Answer 503 to registrations (a master the agent cannot reach).
    pub fail_registrations: bool,
    /// The key the agent's log server requires (header of its last registration).
    pub logs_key: Option<String>,
}

fn unknown_agent() -> Response {
    let body = serde_json::json!({"error": {"code": "not_found", "message": "register first", "field": "agent_id"}});
    (StatusCode::NOT_FOUND, Json(body)).into_response()
}

/// A fake master on loopback.
#[derive(Clone)]
pub struct FakeMaster {
    pub state: Arc<Mutex<MasterState>>,
    changed: Arc<Notify>,
    pub url: String,
}

#[derive(Deserialize)]
struct PollQuery {
    after_version: u64,
    wait_ms: u64,
}

impl FakeMaster {
    pub async fn start() -> FakeMaster {
        let state = MasterState {
            registrations: vec![],
            heartbeats: vec![],
            updates: vec![],
            set: AssignmentSet {
                version: 0,
                assignments: vec![],
            },
            fail_heartbeats: false,
            fail_updates: false,
            refuse_task: None,
            ask_full_set: false,
            last_good_heartbeat: None,
            forgot_agent: false,
            arrivals: BTreeMap::new(),
            exclusive_lease_ms: None,
            heartbeat_told: None,
            fail_registrations: false,
            logs_key: None,
        };
        let master = FakeMaster {
            state: Arc::new(Mutex::new(state)),
            changed: Arc::new(Notify::new()),
            url: String::new(),
        };
        let app = Router::new()
            .route("/v1/agents/register", post(register))
            .route("/v1/agents/:id/heartbeat", post(heartbeat))
            .route("/v1/agents/:id/assignments", get(assignments))
            .route("/v1/agents/:id/updates", post(updates))
            .with_state(master.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        FakeMaster {
            url: format!("http://{addr}"),
            ..master
        }
    }

    /// Replaces the assignment set (bumping its version) and wakes long polls.
    pub fn assign(&self, assignments: Vec<Assignment>) {
        {
            let mut s = self.state.lock().unwrap();
            s.set.version += 1;
            s.set.assignments = assignments;
        }
        self.changed.notify_waiters();
    }

    pub fn with<T>(&self, f: impl FnOnce(&mut MasterState) -> T) -> T {
        f(&mut self.state.lock().unwrap())
    }

    /// Updates received for one task.
    pub fn updates_for(&self, task_id: &str) -> Vec<StatusUpdate> {
        self.with(|s| {
            s.updates
                .iter()
                .filter(|u| u.task_id == task_id)
                .cloned()
                .collect()
        })
    }

    /// Waits until an update for the task reaches `state`.
    pub async fn wait_for_state(&self, task_id: &str, state: TaskState) -> StatusUpdate {
        let found = wait_until(Duration::from_secs(30), || {
            self.updates_for(task_id)
                .into_iter()
                .find(|u| u.state == state)
        })
        .await;
        found.unwrap_or_else(|| {
            panic!(
                "task {task_id} never reported {state}; got {:?}",
                self.updates_for(task_id)
            )
        })
    }
}

async fn register(
    State(m): State<FakeMaster>,
    headers: axum::http::HeaderMap,
    Json(req): Json<RegisterRequest>,
) -> Response {
    let id = req.agent_id.clone();
    m.with(|s| {
        if s.fail_registrations {
            return (StatusCode::SERVICE_UNAVAILABLE, "down").into_response();
        }
        s.logs_key = headers
            .get(drover_common::wire::LOGS_KEY_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        s.registrations.push(req);
        s.forgot_agent = false;
        Json(RegisterResponse {
            agent_id: id,
            heartbeat_interval_ms: 100,
            exclusive_lease_ms: s.exclusive_lease_ms,
        })
        .into_response()
    })
}

async fn heartbeat(
    State(m): State<FakeMaster>,
    UrlPath(_id): UrlPath<String>,
    Json(req): Json<HeartbeatRequest>,
) -> Response {
    m.with(|s| {
        if s.fail_heartbeats {
            return (StatusCode::SERVICE_UNAVAILABLE, "down").into_response();
        }
        if s.forgot_agent {
            return unknown_agent();
        }
        let send_full_task_set = s.ask_full_set && req.tasks.is_none();
        s.heartbeats.push(req);
        s.last_good_heartbeat = Some(std::time::Instant::now());
        Json(HeartbeatResponse {
            send_full_task_set,
            reregister: false,
            heartbeat_interval_ms: s.heartbeat_told.map(|t| t.0),
            exclusive_lease_ms: s.heartbeat_told.map(|t| t.1),
        })
        .into_response()
    })
}

async fn assignments(
    State(m): State<FakeMaster>,
    UrlPath(_id): UrlPath<String>,
    Query(q): Query<PollQuery>,
) -> Response {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(q.wait_ms.min(2000));
    loop {
        let notified = m.changed.notified();
        let (set, forgot) = m.with(|s| (s.set.clone(), s.forgot_agent));
        if forgot {
            return unknown_agent();
        }
        if set.version > q.after_version || tokio::time::Instant::now() >= deadline {
            return Json(set).into_response();
        }
        let _ = tokio::time::timeout_at(deadline, notified).await;
    }
}

async fn updates(
    State(m): State<FakeMaster>,
    UrlPath(_id): UrlPath<String>,
    Json(batch): Json<StatusUpdateBatch>,
) -> Response {
    m.with(|s| {
        if s.fail_updates {
            return (StatusCode::SERVICE_UNAVAILABLE, "down").into_response();
        }
        if let Some(refused) = &s.refuse_task {
            if batch.updates.iter().any(|u| &u.task_id == refused) {
                return (StatusCode::PAYLOAD_TOO_LARGE, "too large").into_response();
            }
        }
        let mut acked: BTreeMap<String, u64> = BTreeMap::new();
        for u in batch.updates {
            let e = acked.entry(u.task_id.clone()).or_default();
            *e = (*e).max(u.seq);
            if !s
                .updates
                .iter()
                .any(|x| x.task_id == u.task_id && x.seq == u.seq)
            {
                s.arrivals
                    .insert((u.task_id.clone(), u.seq), std::time::Instant::now());
                s.updates.push(u);
            }
        }
        Json(StatusAck {
            acked: acked.into_iter().collect(),
        })
        .into_response()
    })
}

/// Polls `f` every 20 ms until it returns Some or `limit` passes.
pub async fn wait_until<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A task whose (single) process cmdline selects the fake executor's behaviour.
pub fn assignment(task_id: &str, mode: &str) -> Assignment {
    let task: TaskSpec = serde_json::from_value(serde_json::json!({
        "processes": [{"name": "main", "cmdline": mode}],
        "resources": {"cpu": 0.1, "ram": "16MiB", "disk": "16MiB"}
    }))
    .unwrap();
    Assignment {
        desired: DesiredState::Running,
        kill_reason: None,
        exclusive: false,
        task: ExecutorTask {
            task_id: task_id.into(),
            role: "test".into(),
            environment: "dev".into(),
            name: "job".into(),
            instance: 0,
            task,
            health_check: None,
            lifecycle: None,
            ports: Default::default(),
            drain_delay_ms: None,
            status_seq_base: 0,
        },
        started: false,
    }
}

/// Directories of one agent; kept across restarts of that agent.
pub struct AgentDirs {
    pub tmp: tempfile::TempDir,
}

impl AgentDirs {
    pub fn new() -> AgentDirs {
        AgentDirs {
            tmp: tempfile::tempdir().unwrap(),
        }
    }
    pub fn data(&self) -> PathBuf {
        self.tmp.path().join("data")
    }
    pub fn sandboxes(&self) -> PathBuf {
        self.tmp.path().join("sandboxes")
    }
    pub fn drover(&self, task_id: &str) -> PathBuf {
        self.sandboxes().join(task_id)
    }
    /// Pids of every executor the fake executor recorded for the task.
    pub fn spawns(&self, task_id: &str) -> Vec<i32> {
        std::fs::read_to_string(self.drover(task_id).join("spawns"))
            .unwrap_or_default()
            .lines()
            .map(|l| l.parse().unwrap())
            .collect()
    }

    /// The state in the task's status.json, as the executor last wrote it.
    pub fn executor_state(&self, task_id: &str) -> Option<String> {
        let bytes = std::fs::read(self.drover(task_id).join("status.json")).ok()?;
        let status = drover_common::wire::checkpointed_status(&bytes)?;
        Some(status.state.to_string())
    }

    /// The executor pid recorded in the task's sandbox: the agent's `agent.json`
    /// (exclusive tasks only), else the executor's `status.json`.
    pub fn recorded_executor(&self, task_id: &str) -> Option<i32> {
        let drover = self.drover(task_id);
        let from_meta = || {
            let bytes = std::fs::read(drover.join("agent.json")).ok()?;
            let meta: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
            meta["executor_pid"].as_i64().map(|p| p as i32)
        };
        from_meta().or_else(|| {
            let bytes = std::fs::read(drover.join("status.json")).ok()?;
            let status = drover_common::wire::checkpointed_status(&bytes)?;
            Some(status.executor_pid as i32)
        })
    }
    /// Outbox segments (and old-style batch files) that still hold updates: an
    /// empty segment is one whose updates were all acknowledged.
    pub fn outbox_files(&self) -> usize {
        std::fs::read_dir(self.data().join("outbox"))
            .map(|d| {
                d.filter(|e| {
                    let e = e.as_ref().unwrap();
                    let name = e.file_name().to_string_lossy().into_owned();
                    (name.ends_with(".log") || (name.ends_with(".json") && name != "acked.json"))
                        && e.metadata().map(|m| m.len() > 0).unwrap_or(false)
                })
                .count()
            })
            .unwrap_or(0)
    }
}

pub fn fake_executor() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/fake_executor.py")
}

pub fn config(master: &FakeMaster, dirs: &AgentDirs, extra: ConfigFile) -> Config {
    // RUST_LOG=drover_agent=debug shows the agent's steps with timestamps.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let base = ConfigFile {
        master: Some(master.url.clone()),
        listen: Some("127.0.0.1:0".into()),
        data_dir: Some(dirs.data()),
        sandbox_root: Some(dirs.sandboxes()),
        executor: Some(fake_executor()),
        // The fake executor has no `zygote` command.
        executor_fork_server: Some(false),
        max_backoff: Some("200ms".into()),
        // The tasks of these tests run as their role, `test` (no such user).
        task_users: Some(vec!["test".into()]),
        ..ConfigFile::default()
    };
    base.overlay(extra).resolve(&HostFacts::detect()).unwrap()
}

/// A running in-process agent; `stop` ends it (executors keep running).
pub struct RunningAgent {
    stop: Option<oneshot::Sender<()>>,
    handle: tokio::task::JoinHandle<()>,
}

impl RunningAgent {
    pub fn start(cfg: Config) -> RunningAgent {
        let (tx, rx) = oneshot::channel();
        let handle = tokio::spawn(async move {
            drover_agent::run(cfg, async {
                let _ = rx.await;
            })
            .await
            .unwrap();
        });
        RunningAgent {
            stop: Some(tx),
            handle,
        }
    }

    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        tokio::time::timeout(Duration::from_secs(20), &mut self.handle)
            .await
            .expect("agent stops within 20s")
            .unwrap();
    }
}

/// Kills every executor the test started (they outlive agents by design).
pub struct KillExecutorsOnDrop<'a>(pub &'a AgentDirs, pub Vec<&'static str>);

impl Drop for KillExecutorsOnDrop<'_> {
    fn drop(&mut self) {
        for task in &self.1 {
            let recorded = self.0.recorded_executor(task);
            for pid in self.0.spawns(task).into_iter().chain(recorded) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
}
