//! The agent's runtime: the thin I/O layer around `converge`. It re-adopts what the
//! sandbox root holds, registers, heartbeats, long-polls the assignment set, starts
//! and watches executors, writes every status to the durable outbox and relays it,
//! kills exclusive tasks when the master is gone for the lease, collects old
//! sandboxes and serves logs.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use drover_common::spec::is_valid_name;
use drover_common::state::{mono_ms, ExitReason, TaskState};
use drover_common::wire::{
    task_set_digest, AgentResources, AgentTaskReport, Assignment, AssignmentSet, ExecutorStatus,
    HeartbeatRequest, RegisterRequest, StatusUpdate, StatusUpdateBatch, PROTOCOL_VERSION,
};
use tokio::sync::{mpsc, watch, Notify};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::config::Config;
use crate::converge::{
    converge, discard_stale, held_task_ids, lease_kills, max_answer_flight, Action, LocalTask,
    LocalTasks,
};
use crate::executor::{self, ExecutorProcess, ExecutorSettings, ForkServer};
use crate::master::{MasterClient, MasterError};
use crate::outbox::{write_atomic, Outbox, OutboxError};
use crate::sandbox::{classify, Found, SandboxIo};
use drover_common::layout::Layout;

/// The agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("{what} {path}: {source}; check the directory exists and is writable")]
    Dir {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Outbox(#[from] OutboxError),
    #[error("TLS: {0}")]
    Tls(String),
    #[error("binding the log server to {addr}: {source}; pick a free `listen` address")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// Most updates sent in one POST.
const RELAY_BATCH: usize = 1000;
/// How long a stopping agent waits for its outbox to drain.
const DRAIN: Duration = Duration::from_secs(2);
/// How long a new executor's readiness pipe is waited for before polling its socket.
const READY_WAIT: Duration = Duration::from_secs(2);
/// Most executors started but not yet listening on their socket, at once.
const MAX_STARTING: usize = 8;
/// After an assignment set arrived, the next long poll waits this much per task in
/// the set (at most [`MAX_POLL_GAP`]); see [`poll_gap`].
const POLL_GAP_PER_TASK: Duration = Duration::from_micros(400);
/// The longest wait between an assignment set and the next long poll.
const MAX_POLL_GAP: Duration = Duration::from_millis(100);

/// How long after an assignment set of `tasks` tasks the next long poll is sent. Each
/// answer is the agent's whole set (every task placed here and not ended: 256 per
/// agent in the throughput bench, where the master answered ~27 times a second per
/// agent, each answer ~2 ms of CPU to build, serialize, parse and converge, ~11% of
/// both cores). Waiting in proportion to the set's size lets the master collect the
/// changes of that time into one answer, bounding that cost, while a small set (a
/// job of a few tasks, the latency path) is polled again at once. A large set means a
/// backlog of placed tasks here, which a late-learned placement does not starve.
fn poll_gap(tasks: usize) -> Duration {
    POLL_GAP_PER_TASK
        .saturating_mul(tasks.min(u32::MAX as usize) as u32)
        .min(MAX_POLL_GAP)
}
/// File in the data dir with the master's exclusive lease in ms, as last learned.
const MASTER_LEASE: &str = "master-lease";
/// How often lease and garbage collection are checked.
const TICK: Duration = Duration::from_millis(250);
/// How often the outbox's ack record is written when it changed. Each write is a
/// temp file + rename (an inode created, one freed); losing the latest changes only
/// resends updates the master ignores.
const ACK_FLUSH: Duration = Duration::from_secs(2);

/// The tasks this host holds, with what the runtime needs beside the pure view.
#[derive(Default)]
struct Tasks {
    local: LocalTasks,
    /// Monotonic ms when a task was seen terminal (for sandbox retention).
    terminal_at: HashMap<String, u64>,
    /// Kill requests to each watched executor.
    killers: HashMap<String, mpsc::UnboundedSender<ExitReason>>,
    /// Task ids of the latest assignment set, once one arrived.
    desired: Option<HashSet<String>>,
}

struct Shared {
    cfg: Config,
    layout: Layout,
    exec: ExecutorSettings,
    /// The executor fork server (`executor_fork_server`), when on.
    fork: Option<ForkServer>,
    exe_name: String,
    client: MasterClient,
    agent_id: String,
    address: String,
    tasks: Mutex<Tasks>,
    outbox: Arc<Mutex<Outbox>>,
    updates_tx: mpsc::UnboundedSender<StatusUpdate>,
    relay: Notify,
    applied_version: AtomicU64,
    heartbeat_ms: AtomicU64,
    last_contact: Mutex<Instant>,
    /// Wall-clock ms last written to `<data_dir>/last-contact` (0: not yet).
    contact_recorded_ms: Mutex<u64>,
    /// The exclusive lease in ms: the master's `exclusive_lease` once learned (kept in
    /// `<data_dir>/master-lease` across restarts), else the configured `lease`.
    lease_ms: AtomicU64,
    /// Registration epoch: 0 until the first registration, then +1 per registration.
    epoch: watch::Sender<u64>,
    reregister: Notify,
    /// Executor starts and watchers, aborted when the agent stops.
    spawned: Mutex<JoinSet<()>>,
    /// Permits for executors between spawn and socket (`MAX_STARTING`).
    starting: Arc<tokio::sync::Semaphore>,
}

/// Locks a mutex, carrying on after a panic elsewhere (the data stays consistent:
/// every critical section is a few plain assignments).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Wall-clock milliseconds since the epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Truncated exponential backoff.
struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(50);

    fn new(max: Duration) -> Backoff {
        Backoff {
            next: Self::FIRST,
            max,
        }
    }

    fn step(&mut self) -> Duration {
        let now = self.next;
        self.next = (self.next * 2).min(self.max);
        now
    }

    fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

fn update_from_status(s: &ExecutorStatus) -> StatusUpdate {
    StatusUpdate {
        task_id: s.task_id.clone(),
        seq: s.seq,
        state: s.state,
        exit_reason: s.exit_reason.clone(),
        message: s.message.clone(),
        timestamp_ms: s.timestamp_ms,
        processes: s.processes.clone(),
    }
}

fn read_id(path: &Path) -> std::io::Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(id) if !id.trim().is_empty() => Ok(Some(id.trim().to_string())),
        Ok(_) => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// The stable agent id: `<data_dir>/agent-id`, else the copy kept in
/// `<sandbox_root>/.agent-id` (so a lost data dir keeps the id and the master keeps
/// the tasks), else a new `<hostname>-<12 hex>`. Both files are (re)written.
pub fn load_or_create_agent_id(
    data_dir: &Path,
    sandbox_root: &Path,
    hostname: &str,
) -> std::io::Result<String> {
    let path = data_dir.join("agent-id");
    let copy = sandbox_root.join(".agent-id");
    let saved = read_id(&path)?;
    let id = match saved.clone() {
        Some(id) => id,
        None => match read_id(&copy)? {
            Some(id) => {
                tracing::warn!(agent_id = %id, "agent id missing from data_dir; recovered it from the sandbox root");
                id
            }
            None => new_agent_id(hostname),
        },
    };
    if saved.as_deref() != Some(id.as_str()) {
        write_atomic(&path, id.as_bytes(), true)?;
    }
    if read_id(&copy)?.as_deref() != Some(id.as_str()) {
        write_atomic(&copy, id.as_bytes(), true)?;
    }
    Ok(id)
}

fn new_agent_id(hostname: &str) -> String {
    // FNV over the kernel's random uuid (plus pid and time as a fallback).
    let uuid = std::fs::read_to_string("/proc/sys/kernel/random/uuid").unwrap_or_default();
    let seed = format!("{uuid}{}{:?}", std::process::id(), SystemTime::now());
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in seed.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let host: String = hostname
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .take(40)
        .collect();
    format!("{host}-{:012x}", h & 0xffff_ffff_ffff)
}

/// The agent's token for the master from `path` (None, with a warning, when the
/// file is missing or empty: the master then refuses the agent with 401).
fn read_token(path: &std::path::Path) -> Option<String> {
    match std::fs::read_to_string(path) {
        Ok(text) if !text.trim().is_empty() => Some(text.trim().to_string()),
        Ok(_) | Err(_) => {
            tracing::warn!(token_file = %path.display(), "no agent token: the master will refuse this agent; an admin creates one with `drover token create --role agent` and writes it to this file (mode 0600)");
            None
        }
    }
}

/// A new secret for the log server: 256 random bits, hex.
fn new_logs_key() -> std::io::Result<String> {
    use std::io::Read as _;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The log server's gate: `Authorization: Bearer <logs key>` (compared in constant
/// time by `subtle`), else 401; `/health` is open.
async fn require_logs_key(
    axum::extract::State(key): axum::extract::State<Arc<String>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    use subtle::ConstantTimeEq as _;
    if request.uri().path() == "/health" {
        return next.run(request).await;
    }
    let given = request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if given.len() == key.len() && bool::from(given.as_bytes().ct_eq(key.as_bytes())) {
        return next.run(request).await;
    }
    (
        axum::http::StatusCode::UNAUTHORIZED,
        axum::Json(serde_json::json!({"error": {"code": "unauthorized",
            "message": "the agent's logs are read through the master: drover task logs, or GET /v1/tasks/{id}/logs/{process}/{stream} on the master"}})),
    )
        .into_response()
}

/// Runs the agent until `shutdown` completes. Executors are left running: they
/// outlive the agent, which re-adopts them when it starts again.
pub async fn run(cfg: Config, shutdown: impl Future<Output = ()>) -> Result<(), AgentError> {
    let dir_err = |what: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| AgentError::Dir { what, path, source }
    };
    std::fs::create_dir_all(&cfg.data_dir).map_err(dir_err("data_dir", &cfg.data_dir))?;
    crate::sandbox::prepare_root(&cfg.sandbox_root)
        .map_err(dir_err("sandbox_root", &cfg.sandbox_root))?;
    let agent_id = load_or_create_agent_id(&cfg.data_dir, &cfg.sandbox_root, &cfg.hostname)
        .map_err(dir_err("agent id in", &cfg.data_dir))?;
    let outbox = Arc::new(Mutex::new(Outbox::open(&cfg.data_dir)?));

    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .map_err(|source| AgentError::Bind {
            addr: cfg.listen,
            source,
        })?;
    let bound = listener.local_addr().map_err(|source| AgentError::Bind {
        addr: cfg.listen,
        source,
    })?;
    let addr_file = cfg.data_dir.join("agent.addr");
    write_atomic(&addr_file, bound.to_string().as_bytes(), false)
        .map_err(dir_err("writing", &addr_file))?;
    let address = cfg.advertise.clone().unwrap_or_else(|| {
        if bound.ip().is_unspecified() {
            format!("http://{}:{}", cfg.hostname, bound.port())
        } else {
            format!("http://{bound}")
        }
    });

    let exec = ExecutorSettings {
        binary: cfg.executor.clone(),
        no_isolation: cfg.no_isolation,
        allow_root: cfg.allow_root,
        recovery_timeout: cfg.executor_recovery_timeout,
        cgroup_parent: cfg.cgroup_parent.clone(),
        max_task_pids: Some(cfg.max_task_pids),
        log_max_bytes: cfg.executor_log_max_bytes,
        log_max_files: cfg.executor_log_max_files,
    };
    let exe_name = cfg
        .executor
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "drover-executor".into());
    // Before any executor starts; blocks for the few milliseconds the fork server
    // takes to say it is ready.
    let fork = cfg
        .executor_fork_server
        .then(|| ForkServer::start(&cfg.executor));
    let last_contact = restore_last_contact(&cfg.data_dir);
    let lease = restore_lease(&cfg.data_dir).unwrap_or(cfg.lease);
    let tls = match &cfg.tls_ca {
        Some(ca) => {
            let identity = cfg
                .tls_identity
                .as_ref()
                .map(|(c, k)| (c.as_path(), k.as_path()));
            Some(crate::master::MasterTls::load(ca, identity).map_err(AgentError::Tls)?)
        }
        None => None,
    };
    // With a certificate for an https master, the certificate is the identity.
    let token = if cfg.tls_identity.is_some() {
        None
    } else {
        read_token(&cfg.token_file)
    };
    let logs_key = new_logs_key().map_err(|source| AgentError::Dir {
        what: "reading /dev/urandom for the log server's key",
        path: PathBuf::from("/dev/urandom"),
        source,
    })?;
    let (updates_tx, updates_rx) = mpsc::unbounded_channel();
    let (epoch, _) = watch::channel(0u64);
    let shared = Arc::new(Shared {
        layout: Layout::new(&cfg.sandbox_root),
        client: MasterClient::with_tls(&cfg.master, token.as_deref(), tls.as_ref())
            .with_logs_key(logs_key.clone()),
        cfg,
        exec,
        fork,
        exe_name,
        agent_id,
        address,
        tasks: Mutex::new(Tasks::default()),
        outbox,
        updates_tx,
        relay: Notify::new(),
        applied_version: AtomicU64::new(0),
        heartbeat_ms: AtomicU64::new(5000),
        last_contact: Mutex::new(last_contact),
        contact_recorded_ms: Mutex::new(0),
        lease_ms: AtomicU64::new(lease.as_millis() as u64),
        epoch,
        reregister: Notify::new(),
        spawned: Mutex::new(JoinSet::new()),
        starting: Arc::new(tokio::sync::Semaphore::new(MAX_STARTING)),
    });
    tracing::info!(agent_id = %shared.agent_id, listen = %bound, master = %shared.cfg.master, lease_ms = lease.as_millis() as u64, "agent starting");

    let mut tasks = JoinSet::new();
    // Before anything else: what runs here already.
    readopt(&shared, &mut tasks);
    tasks.spawn(write_outbox(shared.clone(), updates_rx));
    tasks.spawn(relay(shared.clone()));
    tasks.spawn(registrar(shared.clone()));
    tasks.spawn(heartbeats(shared.clone()));
    tasks.spawn(poll_assignments(shared.clone()));
    tasks.spawn(ticker(shared.clone()));
    // The log server answers the master only: it proxies reads for authorized
    // callers (docs/auth.md), with the key this agent gave it at registration.
    let app = crate::logs::router(shared.layout.clone()).layer(
        axum::middleware::from_fn_with_state(Arc::new(logs_key), require_logs_key),
    );
    let (stop_tx, mut stop_rx) = watch::channel(false);
    let server = tokio::spawn(async move {
        let stopped = async move {
            let _ = stop_rx.wait_for(|s| *s).await;
        };
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(stopped)
            .await
        {
            tracing::error!(error = %e, "log server failed");
        }
    });

    shutdown.await;
    if !shared.cfg.shutdown_drain_timeout.is_zero()
        && *shared.epoch.borrow() > 0
        && crate::selfdrain::host_is_shutting_down(shared.cfg.shutdown_marker.as_deref())
    {
        self_drain(&shared).await;
    }
    tracing::info!("agent stopping; executors keep running");
    // Drain: give the relay a moment to deliver what is pending (e.g. the KILLED of
    // a job killed just before); whatever remains is sent after the next start.
    if *shared.epoch.borrow() > 0 {
        let deadline = Instant::now() + DRAIN;
        while !lock(&shared.outbox).is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let _ = stop_tx.send(true);
    tasks.shutdown().await;
    flush_outbox(&shared);
    let mut spawned = std::mem::take(&mut *lock(&shared.spawned));
    spawned.shutdown().await;
    if let Some(fork) = &shared.fork {
        // Executors it forked keep running, like those exec'd.
        fork.stop();
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
    Ok(())
}

/// The host is shutting down: asks the master to drain it (forcing what is left
/// after three quarters of `shutdown_drain_timeout`, so forced kills still finish
/// in time) and waits until no task is left running here and every status was
/// delivered, or the timeout passed.
async fn self_drain(shared: &Shared) {
    let bound = shared.cfg.shutdown_drain_timeout;
    let until = Instant::now() + bound;
    tracing::info!(
        timeout_ms = bound.as_millis() as u64,
        "host shutting down: asking the master to drain this host"
    );
    if let Err(e) = shared
        .client
        .drain_self(&shared.agent_id, bound * 3 / 4)
        .await
    {
        tracing::warn!(error = %e, "cannot ask the master to drain this host; stopping without");
        return;
    }
    loop {
        let left = lock(&shared.tasks)
            .local
            .values()
            .filter(|t| !t.state.is_terminal())
            .count();
        if left == 0 && lock(&shared.outbox).is_empty() {
            tracing::info!("host drained: no task left here");
            return;
        }
        if Instant::now() >= until {
            tracing::warn!(tasks_left = left, "shutdown_drain_timeout passed; stopping");
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn restore_last_contact(data_dir: &Path) -> Instant {
    let now = Instant::now();
    let saved: Option<u64> = std::fs::read_to_string(data_dir.join("last-contact"))
        .ok()
        .and_then(|t| t.trim().parse().ok());
    match saved {
        Some(ms) => {
            let ago = Duration::from_millis(now_ms().saturating_sub(ms));
            now.checked_sub(ago).unwrap_or(now)
        }
        None => now,
    }
}

/// Records the acknowledgements kept in memory and removes the outbox segment once
/// nothing in it waits (every [`ACK_FLUSH`] and at shutdown); failures are logged.
fn flush_outbox(shared: &Shared) {
    let mut outbox = lock(&shared.outbox);
    if let Err(e) = outbox.flush_acked() {
        tracing::warn!(error = %e, "could not record acknowledgements; updates may be resent");
    }
    if let Err(e) = outbox.close_idle_segment() {
        tracing::warn!(error = %e, "could not remove the drained outbox segment");
    }
}

/// The master's lease as last learned, if one was recorded.
fn restore_lease(data_dir: &Path) -> Option<Duration> {
    std::fs::read_to_string(data_dir.join(MASTER_LEASE))
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .filter(|ms| *ms > 0)
        .map(Duration::from_millis)
}

/// The exclusive lease in force now.
fn lease(shared: &Shared) -> Duration {
    Duration::from_millis(shared.lease_ms.load(Ordering::SeqCst))
}

/// Adopts the lease a registration answer carries (`None`: a master that does not
/// send one, so the configured `lease` applies) and records it for the next start,
/// so a restarted agent that cannot reach the master still counts the master's lease.
fn learn_lease(shared: &Shared, from_master: Option<u64>) {
    let path = shared.cfg.data_dir.join(MASTER_LEASE);
    let saved = match from_master.filter(|ms| *ms > 0) {
        Some(ms) => {
            shared.lease_ms.store(ms, Ordering::SeqCst);
            write_atomic(&path, ms.to_string().as_bytes(), false)
        }
        None => {
            let ms = shared.cfg.lease.as_millis() as u64;
            shared.lease_ms.store(ms, Ordering::SeqCst);
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            }
        }
    };
    if let Err(e) = saved {
        tracing::warn!(path = %path.display(), error = %e, "could not record the master's lease; a restart uses the configured lease until the master answers");
    }
}

/// Records a contact with the master as of `sent`, when the answered request left:
/// the master heard the agent no earlier than that, so the exclusive lease never
/// counts from later than the master's own clock does, even when a partition held
/// the answer back. The in-memory contact is exact; the file is rewritten only when
/// `contact_needs_recording` says so (see there for why a stale file is safe).
fn record_contact(shared: &Shared, sent: Instant) {
    *lock(&shared.last_contact) = sent;
    let sent_ms = now_ms().saturating_sub(sent.elapsed().as_millis() as u64);
    {
        let mut recorded = lock(&shared.contact_recorded_ms);
        if !contact_needs_recording(*recorded, sent_ms) {
            return;
        }
        *recorded = sent_ms;
    }
    let path = shared.cfg.data_dir.join("last-contact");
    if let Err(e) = write_atomic(&path, sent_ms.to_string().as_bytes(), false) {
        tracing::warn!(error = %e, "could not record the last master contact");
    }
}

/// Most the recorded `last-contact` may lag behind the real last contact.
const CONTACT_RECORD_EVERY_MS: u64 = 1000;

/// Whether a contact at `sent_ms` must be written to `last-contact` when the file
/// holds `recorded_ms` (pure). Each rewrite is a temp file + rename, which creates
/// one inode and frees another, and answered requests come every heartbeat; so the
/// file is rewritten only once the contact moved on by `CONTACT_RECORD_EVERY_MS`.
/// The file is read only by a restarted agent, to keep counting the exclusive lease;
/// a recorded time that is older than the real one makes that agent count the
/// master as silent for longer, so it kills exclusive tasks at most that much
/// EARLIER, never later than the master replaces them: the safe side. A contact
/// that goes backwards (a clock step) is recorded at once, for the same reason.
fn contact_needs_recording(recorded_ms: u64, sent_ms: u64) -> bool {
    sent_ms < recorded_ms || sent_ms - recorded_ms >= CONTACT_RECORD_EVERY_MS
}

// ---------------------------------------------------------------- re-adoption

/// Scans the sandbox root: live executors are re-adopted, ended tasks reported once,
/// orphans cleaned up and reported LOST. Nothing is ever started here.
fn readopt(shared: &Arc<Shared>, set: &mut JoinSet<()>) {
    let ids = match shared.layout.list() {
        Ok(ids) => ids,
        Err(e) => {
            tracing::error!(root = %shared.layout.root().display(), error = %e, "cannot scan the sandbox root");
            return;
        }
    };
    {
        let present: HashSet<&str> = ids.iter().map(String::as_str).collect();
        let pruned = lock(&shared.outbox).prune_acked(|id| present.contains(id));
        if pruned > 0 {
            tracing::debug!(pruned, "dropped ack records of tasks without a sandbox");
        }
    }
    let running = executor::find_running_executors(&shared.exe_name, shared.layout.root());
    match shared.layout.list_old() {
        Ok(old) => {
            for id in old {
                tracing::warn!(task_id = %id, "sandbox of the older layout (task-writable files); not trusting it: cleaning up, reporting LOST");
                let rx = hold_live(shared, &id, None, false);
                drop(rx);
                let shared = shared.clone();
                let pid = running.get(&id).copied();
                set.spawn(async move { retire_old_sandbox(&shared, &id, pid).await });
            }
        }
        Err(e) => {
            tracing::error!(root = %shared.layout.root().display(), error = %e, "cannot scan the sandbox root for old sandboxes");
        }
    }
    for id in ids {
        let meta = shared.layout.read_meta(&id);
        if let Some(verdict) = shared.layout.read_final(&id) {
            hold_terminal(
                shared,
                &id,
                verdict.state,
                verdict.timestamp_ms,
                meta.exclusive,
            );
            let _ = shared.updates_tx.send(verdict);
            continue;
        }
        let status = shared.layout.read_status(&id);
        let live = executor::socket_is_live(&shared.layout.socket(&id))
            || running.contains_key(&id)
            || recorded_executor_pid(&shared.layout, &id)
                .is_some_and(|pid| executor::executor_pid_is_live(pid, &shared.exe_name));
        match classify(live, status.clone()) {
            Found::Live => {
                tracing::info!(task_id = %id, "re-adopting running executor");
                let rx = hold_live(shared, &id, status.map(|s| s.state), meta.exclusive);
                let pid = running.get(&id).copied();
                set.spawn(watch_task(shared.clone(), id, Watched::Adopted(pid), rx));
            }
            Found::Ended(s) => {
                tracing::info!(task_id = %id, state = %s.state, "task ended while the agent was away");
                hold_terminal(shared, &id, s.state, s.timestamp_ms, meta.exclusive);
                let _ = shared.updates_tx.send(update_from_status(&s));
            }
            Found::Orphaned(s) => {
                tracing::warn!(task_id = %id, "executor gone before its task ended; cleaning up");
                let rx = hold_live(shared, &id, s.map(|s| s.state), meta.exclusive);
                drop(rx);
                let shared = shared.clone();
                set.spawn(async move { executor_lost(&shared, &id, 0).await });
            }
        }
    }
}

/// Ends a task whose sandbox has the older layout, in which the task could write the
/// executor's checkpoint, task file and logs: nothing in it is believed. Its executor
/// (if one still runs) is killed, then the task's cgroup, the sandbox is removed
/// (std's `remove_dir_all` never follows a link), and the task is reported LOST.
async fn retire_old_sandbox(shared: &Shared, id: &str, executor_pid: Option<u32>) {
    if let Some(pid) = executor_pid.and_then(|p| i32::try_from(p).ok()) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    if let Err(e) = shared.exec.cleanup(&shared.layout, id).await {
        tracing::error!(task_id = %id, error = %e, "cleanup of an old-layout sandbox failed");
    }
    let dir = shared.layout.task_dir(id);
    if let Err(e) = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir)).await {
        tracing::warn!(task_id = %id, error = %e, "removing an old-layout sandbox panicked");
    }
    let seq = lock(&shared.outbox).last_seq(id) + 1;
    report_lost(
        shared,
        id,
        seq,
        "found in a sandbox of an older agent's layout, whose status the task could have forged; its processes were killed".into(),
    );
}

/// Records and reports task `id` LOST (`executor_lost`) with `seq` and `message`.
fn report_lost(shared: &Shared, id: &str, seq: u64, message: String) {
    finish(
        shared,
        StatusUpdate {
            task_id: id.to_string(),
            seq,
            state: TaskState::Lost,
            exit_reason: Some(ExitReason::ExecutorLost),
            message,
            timestamp_ms: now_ms(),
            processes: vec![],
        },
    );
}

/// The executor pid recorded in the sandbox: the agent's `agent.json` (written for
/// exclusive tasks only), else the executor's own `status.json`.
fn recorded_executor_pid(layout: &Layout, id: &str) -> Option<u32> {
    layout.read_meta(id).executor_pid.or_else(|| {
        layout
            .read_status(id)
            .map(|s| s.executor_pid)
            .filter(|pid| *pid > 0)
    })
}

fn hold_live(
    shared: &Shared,
    id: &str,
    state: Option<TaskState>,
    exclusive: bool,
) -> mpsc::UnboundedReceiver<ExitReason> {
    let (tx, rx) = mpsc::unbounded_channel();
    let mut t = lock(&shared.tasks);
    t.local.insert(
        id.to_string(),
        LocalTask {
            state: state.unwrap_or(TaskState::Assigned),
            kill_requested: false,
            exclusive,
        },
    );
    t.killers.insert(id.to_string(), tx);
    rx
}

fn hold_terminal(shared: &Shared, id: &str, state: TaskState, at_ms: u64, exclusive: bool) {
    let mut t = lock(&shared.tasks);
    t.local.insert(
        id.to_string(),
        LocalTask {
            state,
            kill_requested: false,
            exclusive,
        },
    );
    // A status stamped before this agent started: its age by the wall clock, once.
    let age = now_ms().saturating_sub(at_ms);
    t.terminal_at
        .insert(id.to_string(), mono_ms().saturating_sub(age));
}

// ---------------------------------------------------------------- executors

/// Starts the executor of a new task, then watches it.
async fn start_task(
    shared: Arc<Shared>,
    assignment: Assignment,
    kill_rx: mpsc::UnboundedReceiver<ExitReason>,
) {
    let id = assignment.task.task_id.clone();
    if std::fs::symlink_metadata(shared.layout.task_dir(&id)).is_ok() {
        // A sandbox exists: the task ran or runs here. Never start a second copy.
        tracing::warn!(task_id = %id, "sandbox already exists; adopting instead of starting");
        return watch_task(shared, id, Watched::Adopted(None), kill_rx).await;
    }
    // At most MAX_STARTING executors between spawn and socket at once: a burst of
    // thousands of assignments otherwise starts thousands of executors together,
    // which then compete for the CPU and finish later than in a queue.
    let permit = shared.starting.clone().acquire_owned().await.ok();
    let t0 = std::time::Instant::now();
    let spawned = shared
        .exec
        .spawn(&shared.layout, &assignment, shared.fork.as_ref());
    tracing::debug!(task_id = %id, us = t0.elapsed().as_micros() as u64, "executor spawned (microseconds)");
    match spawned {
        Ok(mut spawned) => {
            tracing::debug!(task_id = %id, pid = ?spawned.child.id(), "executor started");
            if let Some(ready) = spawned.ready.take() {
                // One byte once the socket listens, EOF if the executor died first;
                // either way the first connect in `watch_task` is the right moment.
                // An executor that ignores the pipe holds it open: then the wait
                // ends after READY_WAIT and the socket is polled.
                let _ = tokio::time::timeout(READY_WAIT, wait_readable(&ready)).await;
            }
            drop(permit);
            let watched = match spawned.child {
                ExecutorProcess::Untracked { pid } => Watched::Adopted(pid),
                _ => Watched::Child(Box::new(spawned)),
            };
            watch_task(shared, id, watched, kill_rx).await
        }
        Err(e) => {
            tracing::error!(task_id = %id, error = %e, "could not start executor");
            let seq = lock(&shared.outbox).last_seq(&id) + 1;
            let update = StatusUpdate {
                task_id: id.clone(),
                seq,
                state: TaskState::Failed,
                exit_reason: Some(ExitReason::SandboxSetupFailed {
                    error: e.to_string(),
                }),
                message: e.to_string(),
                timestamp_ms: now_ms(),
                processes: vec![],
            };
            finish(&shared, update);
        }
    }
}

/// Waits until the readiness pipe has a byte or is at EOF.
async fn wait_readable(ready: &tokio::net::unix::pipe::Receiver) {
    loop {
        if ready.readable().await.is_err() {
            return;
        }
        let mut buf = [0u8; 8];
        match ready.try_read(&mut buf) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            _ => return,
        }
    }
}

/// Records and reports an agent-decided final status.
fn finish(shared: &Shared, update: StatusUpdate) {
    if std::fs::symlink_metadata(shared.layout.task_dir(&update.task_id)).is_ok_and(|m| m.is_dir())
    {
        if let Err(e) = shared.layout.write_final(&update) {
            tracing::warn!(task_id = %update.task_id, error = %e, "could not record final status in the sandbox");
        }
    }
    lock(&shared.tasks).killers.remove(&update.task_id);
    let _ = shared.updates_tx.send(update);
}

/// The executor a watcher follows.
enum Watched {
    /// Spawned by this agent (and waited for until its socket listened): reaped
    /// here, its exit is known at once.
    Child(Box<executor::Spawned>),
    /// Found running at start (pid from /proc when known; else from agent.json).
    Adopted(Option<u32>),
}

/// Follows one executor: subscribes to its statuses (reconnecting when the socket
/// drops), forwards kill requests, and when the executor is gone decides between its
/// checkpointed terminal status and LOST.
async fn watch_task(
    shared: Arc<Shared>,
    id: String,
    watched: Watched,
    mut kill_rx: mpsc::UnboundedReceiver<ExitReason>,
) {
    let socket = shared.layout.socket(&id);
    let mut connection = None;
    let (child_exited, known_pid) = match watched {
        Watched::Child(spawned) => {
            connection = spawned.connection;
            let mut child = spawned.child;
            let (tx, rx) = watch::channel(false);
            tokio::spawn(async move {
                let _ = child.wait().await;
                let _ = tx.send(true);
            });
            (Some(rx), None)
        }
        Watched::Adopted(pid) => (None, pid),
    };
    let is_alive = |shared: &Shared| match &child_exited {
        Some(rx) => !*rx.borrow(),
        None => recorded_executor_pid(&shared.layout, &id)
            .or(known_pid)
            .is_some_and(|pid| executor::executor_pid_is_live(pid, &shared.exe_name)),
    };
    let mut last = lock(&shared.outbox).last_seq(&id);
    let mut pending_kill: Option<ExitReason> = None;
    let mut delay = Duration::from_millis(1);
    let mut attempts = 0u32;
    'connect: loop {
        // The connection the executor was forked with first (it binds its socket only
        // once that closes), then the socket.
        let subscribed = match connection.take() {
            Some(stream) => executor::subscribe_on(stream, last)
                .await
                .map_err(|source| executor::ExecutorError::Socket {
                    path: socket.clone(),
                    source,
                }),
            None => executor::subscribe(&socket, last).await,
        };
        let mut lines = match subscribed {
            Ok(lines) => lines,
            Err(e) => {
                while let Ok(r) = kill_rx.try_recv() {
                    pending_kill = Some(r);
                }
                if is_alive(&shared) {
                    // Starting up (no socket yet) or between connections. A failed
                    // connect is one cheap syscall, so poll every millisecond for the
                    // first 20 tries (the first status is on the job-create-to-RUNNING
                    // path), then back off to 20 ms so that many executors starting
                    // at once do not cost the host a core.
                    tokio::time::sleep(delay).await;
                    attempts += 1;
                    if attempts > 20 {
                        delay = (delay * 2).min(Duration::from_millis(20));
                    }
                    continue 'connect;
                }
                tracing::debug!(task_id = %id, error = %e, "executor unreachable and not running");
                break 'connect;
            }
        };
        tracing::debug!(task_id = %id, after_seq = last, "subscribed to executor");
        if let Some(reason) = pending_kill.take() {
            if let Err(e) = executor::send_kill_on(&mut lines, reason.clone()).await {
                tracing::warn!(task_id = %id, error = %e, "kill not delivered yet");
                pending_kill = Some(reason);
            }
        }
        loop {
            tokio::select! {
                line = lines.next_line() => match line {
                    Ok(Some(line)) => {
                        let Some(status) = executor::parse_status(&line) else {
                            tracing::warn!(task_id = %id, line, "unreadable status line from executor");
                            continue;
                        };
                        if status.seq <= last {
                            continue;
                        }
                        last = status.seq;
                        delay = Duration::from_millis(1);
                        attempts = 0;
                        tracing::debug!(task_id = %id, seq = status.seq, state = %status.state, "executor status");
                        let terminal = status.state.is_terminal();
                        let _ = shared.updates_tx.send(update_from_status(&status));
                        if terminal {
                            lock(&shared.tasks).killers.remove(&id);
                            return;
                        }
                    }
                    Ok(None) | Err(_) => {
                        // Dropped: reconnect, backing off while nothing comes through.
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(Duration::from_millis(100));
                        continue 'connect;
                    }
                },
                Some(reason) = kill_rx.recv() => {
                    if let Err(e) = executor::send_kill_on(&mut lines, reason.clone()).await {
                        tracing::warn!(task_id = %id, error = %e, "kill not delivered yet");
                        pending_kill = Some(reason);
                        continue 'connect;
                    }
                }
            }
        }
    }
    // The executor is gone. Its checkpoint says whether the task ended.
    match shared.layout.read_status(&id) {
        Some(s) if s.state.is_terminal() => {
            if s.seq > last {
                let _ = shared.updates_tx.send(update_from_status(&s));
            }
            lock(&shared.tasks).killers.remove(&id);
        }
        _ => executor_lost(&shared, &id, last).await,
    }
}

/// The executor died before its task ended: kill what is left, report LOST.
async fn executor_lost(shared: &Shared, id: &str, last_seen: u64) {
    if let Err(e) = shared.exec.cleanup(&shared.layout, id).await {
        tracing::error!(task_id = %id, error = %e, "cleanup after executor loss failed");
    }
    let checkpoint = shared.layout.read_status(id).map(|s| s.seq).unwrap_or(0);
    let known = lock(&shared.outbox).last_seq(id);
    let seq = last_seen.max(checkpoint).max(known) + 1;
    let message = match executor::last_stderr_line(&shared.layout, id) {
        Some(line) => {
            format!("executor lost; what remained of the task was killed (executor said: {line})")
        }
        None => "executor lost; what remained of the task was killed".to_string(),
    };
    tracing::warn!(task_id = %id, seq, message, "reporting task LOST");
    report_lost(shared, id, seq, message);
}

fn request_kill(t: &mut Tasks, task_id: &str, reason: ExitReason) {
    if let Some(local) = t.local.get_mut(task_id) {
        local.kill_requested = true;
    }
    if let Some(tx) = t.killers.get(task_id) {
        let _ = tx.send(reason);
    }
}

/// Converges on a new assignment set.
fn apply(
    shared: &Arc<Shared>,
    set: &AssignmentSet,
) -> Vec<(Assignment, mpsc::UnboundedReceiver<ExitReason>)> {
    let mut starts = Vec::new();
    let mut reports = Vec::new();
    {
        let mut t = lock(&shared.tasks);
        for a in &set.assignments {
            if let Some(local) = t.local.get_mut(&a.task.task_id) {
                local.exclusive = a.exclusive;
            }
        }
        t.desired = Some(
            set.assignments
                .iter()
                .map(|a| a.task.task_id.clone())
                .collect(),
        );
        for action in converge(set, &t.local) {
            match action {
                Action::Start(a) => {
                    let id = a.task.task_id.clone();
                    if !is_valid_name(&id) {
                        tracing::error!(task_id = %id, "refusing a task id that is not a valid name");
                        t.local.insert(
                            id.clone(),
                            LocalTask {
                                state: TaskState::Failed,
                                kill_requested: false,
                                exclusive: a.exclusive,
                            },
                        );
                        t.terminal_at.insert(id.clone(), mono_ms());
                        reports.push((
                            id,
                            TaskState::Failed,
                            ExitReason::SandboxSetupFailed {
                                error: "task id is not a valid name ([A-Za-z0-9_.-], 1-64 chars)"
                                    .into(),
                            },
                        ));
                        continue;
                    }
                    let (tx, rx) = mpsc::unbounded_channel();
                    t.local.insert(id.clone(), LocalTask::starting(a.exclusive));
                    t.killers.insert(id, tx);
                    starts.push((*a, rx));
                }
                Action::Kill {
                    task_id,
                    reason,
                    cause,
                } => {
                    tracing::info!(%task_id, ?cause, %reason, "killing task");
                    request_kill(&mut t, &task_id, reason);
                }
                Action::ReportKilled { task_id, reason } => {
                    t.local.insert(
                        task_id.clone(),
                        LocalTask {
                            state: TaskState::Killed,
                            kill_requested: true,
                            exclusive: false,
                        },
                    );
                    t.terminal_at.insert(task_id.clone(), mono_ms());
                    reports.push((task_id, TaskState::Killed, reason));
                }
            }
        }
    }
    for (task_id, state, reason) in reports {
        let seq = lock(&shared.outbox).last_seq(&task_id) + 1;
        let _ = shared.updates_tx.send(StatusUpdate {
            task_id,
            seq,
            state,
            message: reason.to_string(),
            exit_reason: Some(reason),
            timestamp_ms: now_ms(),
            processes: vec![],
        });
    }
    shared.applied_version.store(set.version, Ordering::SeqCst);
    starts
}

// ---------------------------------------------------------------- outbox and relay

/// Writes updates to the outbox in batches (one fsync per batch), then updates the
/// local view and wakes the relay.
async fn write_outbox(shared: Arc<Shared>, mut rx: mpsc::UnboundedReceiver<StatusUpdate>) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while let Ok(u) = rx.try_recv() {
            batch.push(u);
        }
        loop {
            let outbox = shared.outbox.clone();
            let b = batch.clone();
            match tokio::task::spawn_blocking(move || lock(&outbox).put(b)).await {
                Ok(Ok(n)) => {
                    tracing::debug!(written = n, "outbox batch written");
                    break;
                }
                Ok(Err(e)) => tracing::error!(error = %e, "outbox write failed; retrying"),
                Err(e) => tracing::error!(error = %e, "outbox writer panicked; retrying"),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        {
            let mut t = lock(&shared.tasks);
            for u in &batch {
                let became_terminal = match t.local.get_mut(&u.task_id) {
                    Some(local) if !local.state.is_terminal() => {
                        local.state = u.state;
                        u.state.is_terminal()
                    }
                    _ => false,
                };
                if became_terminal {
                    t.terminal_at.insert(u.task_id.clone(), mono_ms());
                }
            }
        }
        shared.relay.notify_one();
    }
}

/// Sends what the outbox holds to the master, deleting what it acknowledges;
/// retries with backoff while the master is unreachable.
async fn relay(shared: Arc<Shared>) {
    let mut epoch = shared.epoch.subscribe();
    let _ = epoch.wait_for(|e| *e > 0).await;
    let mut backoff = Backoff::new(shared.cfg.max_backoff);
    loop {
        let batch = lock(&shared.outbox).pending(RELAY_BATCH);
        if batch.is_empty() {
            shared.relay.notified().await;
            continue;
        }
        let body = StatusUpdateBatch { updates: batch };
        match shared.client.updates(&shared.agent_id, &body).await {
            Ok(ack) => {
                tracing::debug!(sent = body.updates.len(), "updates acknowledged");
                let outbox = shared.outbox.clone();
                let acked = ack.acked;
                let res = tokio::task::spawn_blocking(move || {
                    let mut ob = lock(&outbox);
                    ob.ack(&acked)?;
                    Ok::<bool, OutboxError>(
                        body.updates
                            .iter()
                            .any(|u| ob.is_pending(&u.task_id, u.seq)),
                    )
                })
                .await;
                match res {
                    Ok(Ok(false)) => backoff.reset(),
                    Ok(Ok(true)) => {
                        tracing::warn!("master did not acknowledge every update; retrying later");
                        tokio::time::sleep(backoff.step()).await;
                    }
                    Ok(Err(e)) => {
                        tracing::error!(error = %e, "recording an acknowledgement failed");
                        tokio::time::sleep(backoff.step()).await;
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "ack task panicked");
                        tokio::time::sleep(backoff.step()).await;
                    }
                }
            }
            Err(e) => {
                if matches!(e, MasterError::UnknownAgent { .. }) {
                    shared.reregister.notify_one();
                }
                tracing::warn!(error = %e, pending = body.updates.len(), "relaying status updates failed; retrying");
                tokio::time::sleep(backoff.step()).await;
            }
        }
    }
}

// ---------------------------------------------------------------- master

/// Registers, and again whenever the master asks.
async fn registrar(shared: Arc<Shared>) {
    let mut backoff = Backoff::new(shared.cfg.max_backoff);
    loop {
        let req = RegisterRequest {
            protocol_version: PROTOCOL_VERSION,
            agent_id: shared.agent_id.clone(),
            hostname: shared.cfg.hostname.clone(),
            address: shared.address.clone(),
            resources: AgentResources {
                cpu: shared.cfg.cpu,
                ram_bytes: shared.cfg.ram_bytes,
                disk_bytes: shared.cfg.disk_bytes,
                port_range: shared.cfg.port_range,
            },
            attributes: shared.cfg.attributes.clone(),
        };
        let sent = Instant::now();
        match shared.client.register(&req).await {
            Ok(resp) => {
                backoff.reset();
                record_contact(&shared, sent);
                learn_lease(&shared, resp.exclusive_lease_ms);
                shared
                    .heartbeat_ms
                    .store(resp.heartbeat_interval_ms.max(10), Ordering::SeqCst);
                shared.epoch.send_modify(|e| *e += 1);
                tracing::info!(agent_id = %shared.agent_id, heartbeat_ms = resp.heartbeat_interval_ms, lease_ms = lease(&shared).as_millis() as u64, "registered with the master");
                shared.reregister.notified().await;
                tracing::info!("registering again");
            }
            Err(e) => {
                tracing::warn!(error = %e, "registration failed; retrying");
                tokio::time::sleep(backoff.step()).await;
            }
        }
    }
}

fn heartbeat_request(shared: &Shared, full: bool) -> HeartbeatRequest {
    let (digest, held): (u64, Vec<(String, TaskState)>) = {
        let t = lock(&shared.tasks);
        let digest = task_set_digest(held_task_ids(&t.local));
        let held = if full {
            t.local
                .iter()
                .filter(|(_, l)| !l.state.is_terminal())
                .map(|(id, l)| (id.clone(), l.state))
                .collect()
        } else {
            Vec::new()
        };
        (digest, held)
    };
    let tasks = full.then(|| {
        let ob = lock(&shared.outbox);
        held.into_iter()
            .map(|(task_id, state)| AgentTaskReport {
                seq: ob.last_seq(&task_id),
                task_id,
                state,
            })
            .collect()
    });
    HeartbeatRequest {
        task_digest: digest,
        assignments_version: shared.applied_version.load(Ordering::SeqCst),
        tasks,
    }
}

/// Heartbeats every interval; sends the full task set when the master asks.
async fn heartbeats(shared: Arc<Shared>) {
    let mut epoch = shared.epoch.subscribe();
    let _ = epoch.wait_for(|e| *e > 0).await;
    epoch.borrow_and_update();
    let mut full = true;
    let mut failing_since: Option<Instant> = None;
    loop {
        let req = heartbeat_request(&shared, full);
        let sent_full = full;
        full = false;
        let sent = Instant::now();
        match shared.client.heartbeat(&shared.agent_id, &req).await {
            Ok(resp) => {
                record_contact(&shared, sent);
                if let Some(since) = failing_since.take() {
                    tracing::info!(
                        down_ms = since.elapsed().as_millis() as u64,
                        "master answers heartbeats again"
                    );
                }
                if resp.reregister {
                    shared.reregister.notify_one();
                    let _ = epoch.changed().await;
                    full = true;
                    continue;
                }
                if resp.send_full_task_set {
                    full = true;
                    if !sent_full {
                        continue;
                    }
                }
            }
            Err(MasterError::UnknownAgent { message }) => {
                tracing::warn!(message, "master does not know this agent");
                shared.reregister.notify_one();
                let _ = epoch.changed().await;
                full = true;
                continue;
            }
            Err(e) => {
                // Once per outage at warn; the lease check says when it matters.
                if failing_since.is_none() {
                    tracing::warn!(error = %e, "heartbeat failed; retrying every interval");
                    failing_since = Some(Instant::now());
                } else {
                    tracing::debug!(error = %e, "heartbeat failed");
                }
            }
        }
        let interval = Duration::from_millis(shared.heartbeat_ms.load(Ordering::SeqCst));
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = epoch.changed() => full = true,
        }
    }
}

/// Long-polls the assignment set and converges on each one.
async fn poll_assignments(shared: Arc<Shared>) {
    let mut epoch = shared.epoch.subscribe();
    let _ = epoch.wait_for(|e| *e > 0).await;
    epoch.borrow_and_update();
    let mut version = 0u64;
    let mut discarded: Option<u64> = None;
    let mut backoff = Backoff::new(shared.cfg.max_backoff);
    let mut last_set: Option<(tokio::time::Instant, usize)> = None;
    loop {
        if let Some((at, tasks)) = last_set.take() {
            tokio::select! {
                _ = tokio::time::sleep_until(at + poll_gap(tasks)) => {}
                _ = epoch.changed() => {
                    version = 0;
                    continue;
                }
            }
        }
        let got = tokio::select! {
            r = shared.client.assignments(&shared.agent_id, version, shared.cfg.poll_wait) => r,
            _ = epoch.changed() => {
                // Registered again: ask for the whole set at once.
                version = 0;
                continue;
            }
        };
        let max_flight = max_answer_flight(lease(&shared));
        match got {
            Ok((set, in_flight))
                if discard_stale(in_flight, max_flight, set.version, discarded) =>
            {
                // Delayed by a partition: the master may have replaced these tasks
                // since. Ask again (answered at once) before acting on it.
                tracing::warn!(
                    version = set.version,
                    in_flight_ms = in_flight.as_millis() as u64,
                    "assignment set arrived late; asking again before acting on it"
                );
                discarded = Some(set.version);
            }
            Ok((set, _)) => {
                discarded = None;
                tracing::debug!(
                    version = set.version,
                    tasks = set.assignments.len(),
                    "assignment set"
                );
                backoff.reset();
                version = set.version;
                last_set = Some((tokio::time::Instant::now(), set.assignments.len()));
                for (assignment, kill_rx) in apply(&shared, &set) {
                    lock(&shared.spawned).spawn(start_task(shared.clone(), assignment, kill_rx));
                }
            }
            Err(MasterError::UnknownAgent { message }) => {
                tracing::warn!(message, "master does not know this agent");
                shared.reregister.notify_one();
                tokio::time::sleep(backoff.step()).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "polling assignments failed; retrying");
                tokio::time::sleep(backoff.step()).await;
            }
        }
    }
}

// ---------------------------------------------------------------- lease and GC

/// Checks the exclusive-task lease and collects old sandboxes.
async fn ticker(shared: Arc<Shared>) {
    let gc_every =
        (shared.cfg.sandbox_retention / 10).clamp(Duration::from_secs(1), Duration::from_secs(60));
    let mut next_gc = Instant::now() + gc_every;
    let mut next_ack_flush = Instant::now() + ACK_FLUSH;
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        {
            let mut spawned = lock(&shared.spawned);
            while spawned.try_join_next().is_some() {}
        }
        if Instant::now() >= next_ack_flush {
            next_ack_flush = Instant::now() + ACK_FLUSH;
            flush_outbox(&shared);
        }
        let since = lock(&shared.last_contact).elapsed();
        {
            let mut t = lock(&shared.tasks);
            for action in lease_kills(&t.local, since, lease(&shared)) {
                if let Action::Kill {
                    task_id, reason, ..
                } = action
                {
                    tracing::warn!(%task_id, since_ms = since.as_millis() as u64, "master unreachable past the lease: killing exclusive task");
                    request_kill(&mut t, &task_id, reason);
                }
            }
        }
        if Instant::now() >= next_gc {
            next_gc = Instant::now() + gc_every;
            collect_sandboxes(&shared).await;
        }
    }
}

/// Removes sandboxes of terminal tasks that left the assignment set more than the
/// retention period ago and have nothing left to relay.
async fn collect_sandboxes(shared: &Arc<Shared>) {
    let retention_ms = shared.cfg.sandbox_retention.as_millis() as u64;
    let now = mono_ms();
    let candidates: Vec<String> = {
        let t = lock(&shared.tasks);
        let Some(desired) = &t.desired else { return };
        t.local
            .iter()
            .filter(|(id, l)| {
                l.state.is_terminal()
                    && !desired.contains(*id)
                    && !t.killers.contains_key(*id)
                    && t.terminal_at
                        .get(*id)
                        .is_some_and(|at| at + retention_ms <= now)
            })
            .map(|(id, _)| id.clone())
            .collect()
    };
    for id in candidates {
        if lock(&shared.outbox).has_pending_for(&id) {
            continue;
        }
        // The task directory, with the task's `sandbox/`: std's `remove_dir_all` opens
        // each directory without following links and unlinks relative to it, so a
        // symlink the task left in `sandbox/` is removed, never followed.
        let dir = shared.layout.task_dir(&id);
        let removed = tokio::task::spawn_blocking(move || match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        })
        .await;
        match removed {
            Ok(Ok(())) => {
                tracing::info!(task_id = %id, "sandbox removed after retention");
                {
                    let mut t = lock(&shared.tasks);
                    t.local.remove(&id);
                    t.terminal_at.remove(&id);
                }
                lock(&shared.outbox).forget(&id);
            }
            Ok(Err(e)) => tracing::warn!(task_id = %id, error = %e, "could not remove sandbox"),
            Err(e) => tracing::warn!(task_id = %id, error = %e, "sandbox removal panicked"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh temp dir (dropped with the first element) with empty `data` and
    /// `root` directories: a data dir and a sandbox root.
    fn data_and_sandbox_root() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let (data, root) = (dir.path().join("data"), dir.path().join("root"));
        std::fs::create_dir_all(&data).unwrap();
        std::fs::create_dir_all(&root).unwrap();
        (dir, data, root)
    }

    #[test]
    fn a_small_assignment_set_is_polled_again_at_once_and_a_large_one_after_a_bounded_wait() {
        assert_eq!(poll_gap(0), Duration::ZERO);
        assert!(poll_gap(2) <= Duration::from_millis(1));
        assert!(poll_gap(50) > poll_gap(10));
        assert_eq!(poll_gap(256), MAX_POLL_GAP);
        assert_eq!(poll_gap(usize::MAX), MAX_POLL_GAP);
    }

    #[test]
    fn agent_id_is_created_once_and_kept() {
        let (_dir, data, root) = data_and_sandbox_root();
        let a = load_or_create_agent_id(&data, &root, "host.example").unwrap();
        let b = load_or_create_agent_id(&data, &root, "other").unwrap();
        assert_eq!(a, b);
        assert!(a.starts_with("host-example-"), "{a}");
    }

    #[test]
    fn a_lost_data_dir_keeps_the_agent_id_from_the_sandbox_root() {
        let (_dir, data, root) = data_and_sandbox_root();
        let a = load_or_create_agent_id(&data, &root, "h").unwrap();
        std::fs::remove_dir_all(&data).unwrap();
        std::fs::create_dir_all(&data).unwrap();
        assert_eq!(load_or_create_agent_id(&data, &root, "h").unwrap(), a);
        assert_eq!(std::fs::read_to_string(data.join("agent-id")).unwrap(), a);
    }

    #[test]
    fn last_contact_is_rewritten_only_once_it_moved_on_or_went_back() {
        assert!(contact_needs_recording(0, 5_000));
        assert!(!contact_needs_recording(5_000, 5_000));
        assert!(!contact_needs_recording(5_000, 5_999));
        assert!(contact_needs_recording(5_000, 6_000));
        assert!(contact_needs_recording(5_000, 4_999), "a clock step back");
    }

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let mut b = Backoff::new(Duration::from_millis(300));
        let steps: Vec<u128> = (0..5).map(|_| b.step().as_millis()).collect();
        assert_eq!(steps, vec![50, 100, 200, 300, 300]);
        b.reset();
        assert_eq!(b.step(), Duration::from_millis(50));
    }
}
