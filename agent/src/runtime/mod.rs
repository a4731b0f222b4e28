//! The agent's runtime: the thin I/O layer around the pure core (`host`, which uses
//! `converge`). `run` starts the parts below, serves logs, and stops them; each part
//! is a file of its own:
//! - `identity`: the agent id, the token for the master, the log server's key.
//! - `lease`: the exclusive lease and the last contact, kept in files across restarts.
//! - `adopt`: re-adopts, reports or cleans up what the sandbox root holds at start.
//! - `watching`: starts executors and follows each one's statuses until it is gone.
//! - `relay`: writes statuses to the durable outbox and relays them to the master.
//! - `session`: registration, heartbeats, the long poll of the assignment set, and
//!   the self-drain when the host shuts down.
//! - `gc`: the periodic tick: lease kills, acknowledgements, sandbox collection,
//!   the systemd watchdog.

mod adopt;
mod fetch;
mod gc;
mod identity;
mod lease;
mod relay;
mod scrape;
mod session;
pub mod tree;
mod watching;

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use drover_common::layout::Layout;
use drover_common::state::ExitReason;
use drover_common::wire::{AgentVersions, StatusUpdate};
use tokio::sync::{mpsc, watch, Notify};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::config::Config;
use crate::executor::{ExecutorSettings, ForkServer};
use crate::host::{Host, UserCheck};
use crate::master::MasterClient;
use crate::outbox::{write_atomic, Outbox, OutboxError};
use adopt::readopt;
use gc::ticker;
use identity::{
    load_or_create_agent_id, new_logs_key, read_metrics_token, read_token, require_logs_key, Keys,
};
use lease::{restore_last_contact, restore_lease};
use relay::{flush_outbox, relay, write_outbox};
use session::{heartbeats, poll_assignments, registrar, self_drain};

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
    #[error("invalid `metrics_token_file` {path}: {message}")]
    MetricsToken { path: PathBuf, message: String },
    #[error(transparent)]
    Cgroup(#[from] crate::cgroup::PlaceError),
    #[error("binding the log server to {addr}: {source}; pick a free `listen` address")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// How long a stopping agent waits for its outbox to drain.
const DRAIN: Duration = Duration::from_secs(2);

/// Most executors started but not yet listening on their socket, at once.
const MAX_STARTING: usize = 8;

/// The tasks this host holds (the pure core), each watched executor reached by the
/// channel its watcher takes kill requests from.
type Tasks = Host<mpsc::UnboundedSender<ExitReason>>;

/// What every part of the runtime shares.
struct Shared {
    cfg: Config,
    layout: Layout,
    exec: ExecutorSettings,
    /// The executor fork server (`executor_fork_server`), when on.
    fork: Option<ForkServer>,
    exe_name: String,
    /// This agent's and its executor binary's versions, sent at registration.
    versions: AgentVersions,
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
    /// The artifact cache, `<data_dir>/artifacts/`.
    artifacts: Arc<fetch::ArtifactCache>,
}

/// The one-line status systemd shows for the agent (`crate::systemd`).
fn systemd_status(shared: &Shared) -> String {
    let running = lock(&shared.tasks).running();
    let registered = *shared.epoch.borrow() > 0;
    crate::systemd::status(running, registered, lock(&shared.last_contact).elapsed())
}

/// The version `binary --version` prints (`drover-executor 0.1.0`), or
/// `unknown: <why>` (then `drover agent list` shows that instead of hiding it).
fn executor_version(binary: &Path) -> String {
    match std::process::Command::new(binary).arg("--version").output() {
        Ok(out) if out.status.success() => {
            let text = String::from_utf8_lossy(&out.stdout);
            match text.split_whitespace().nth(1) {
                Some(v) => v.to_string(),
                None => format!("unknown: {binary:?} --version printed {text:?}"),
            }
        }
        Ok(out) => format!("unknown: {binary:?} --version failed ({})", out.status),
        Err(e) => format!("unknown: cannot run {binary:?}: {e}"),
    }
}

/// Locks a mutex, carrying on after a panic elsewhere (the data stays consistent:
/// every critical section is a few plain assignments).
/// The uid of user `name` on this host (the system's user database, NSS included),
/// None when there is no such user.
fn uid_of(name: &str) -> Option<u32> {
    nix::unistd::User::from_name(name)
        .ok()
        .flatten()
        .map(|u| u.uid.as_raw())
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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
    crate::disk_quota::log_enforcement(&cfg.sandbox_root, cfg.no_isolation);
    let agent_id = load_or_create_agent_id(&cfg.data_dir, &cfg.sandbox_root, &cfg.hostname)
        .map_err(dir_err("agent id in", &cfg.data_dir))?;
    let outbox = Arc::new(Mutex::new(Outbox::open(&cfg.data_dir)?));
    let metrics_token = match &cfg.metrics_token_file {
        Some(path) => {
            Some(
                read_metrics_token(path).map_err(|message| AgentError::MetricsToken {
                    path: path.clone(),
                    message,
                })?,
            )
        }
        None => None,
    };

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
    // A convenience for scripts and tests: a full disk must not stop an agent whose
    // tasks run on, so a failed write is only reported.
    let addr_file = cfg.data_dir.join("agent.addr");
    if let Err(e) = write_atomic(&addr_file, bound.to_string().as_bytes(), false) {
        tracing::warn!(path = %addr_file.display(), error = %e, "cannot write the bound address; serving anyway");
    }
    // With its own certificate the agent serves its logs over TLS (crate::tls).
    let log_tls = match (&cfg.tls_ca, &cfg.tls_identity) {
        (Some(ca), Some((cert, key))) => {
            Some(crate::tls::server_config(ca, cert, key).map_err(AgentError::Tls)?)
        }
        _ => None,
    };
    let scheme = if log_tls.is_some() { "https" } else { "http" };
    let address = cfg.advertise.clone().unwrap_or_else(|| {
        if bound.ip().is_unspecified() {
            format!("{scheme}://{}:{}", cfg.hostname, bound.port())
        } else {
            format!("{scheme}://{bound}")
        }
    });

    // Before any executor (or the fork server) starts: on v2 the agent may move
    // itself into the leaf of its delegated cgroup, and its children follow it.
    let placement = crate::cgroup::place(
        cfg.cgroup_delegate,
        cfg.cgroup_parent.as_deref(),
        cfg.no_isolation,
        Path::new(crate::cgroup::CGROUP_ROOT),
    )?;
    tracing::info!(parent = placement.parent.as_deref().unwrap_or(crate::cgroup::DEFAULT_PARENT), why = %placement.why, "task cgroups");
    let exec = ExecutorSettings {
        binary: cfg.executor.clone(),
        no_isolation: cfg.no_isolation,
        allow_root: cfg.allow_root,
        recovery_timeout: cfg.executor_recovery_timeout,
        cgroup_parent: placement.parent,
        other_cgroup_parents: placement.others,
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
    // Over TLS the master's certificate is what the log server requires: no key.
    let logs_key = match log_tls {
        Some(_) => None,
        None => Some(new_logs_key().map_err(|source| AgentError::Dir {
            what: "reading /dev/urandom for the log server's key",
            path: PathBuf::from("/dev/urandom"),
            source,
        })?),
    };
    let (updates_tx, updates_rx) = mpsc::unbounded_channel();
    let (epoch, _) = watch::channel(0u64);
    let versions = AgentVersions {
        agent: env!("CARGO_PKG_VERSION").to_string(),
        executor: executor_version(&cfg.executor),
    };
    // With no_isolation executors switch no user: tasks run as the agent's own.
    let host = if cfg.no_isolation {
        Host::default()
    } else {
        Host::with_user_check(UserCheck {
            users: cfg.task_users.clone(),
            allow_root: cfg.allow_root,
            uid_of,
        })
    };
    let artifacts_dir = cfg.data_dir.join("artifacts");
    let artifacts = fetch::ArtifactCache::open(
        artifacts_dir.clone(),
        cfg.artifacts,
        cfg.tls_ca.as_deref(),
        &cfg.executor,
        cfg.allow_root,
    )
    .map_err(|source| AgentError::Dir {
        what: "opening the artifact cache",
        path: artifacts_dir,
        source,
    })?;
    let shared = Arc::new(Shared {
        artifacts: Arc::new(artifacts),
        layout: Layout::new(&cfg.sandbox_root),
        client: MasterClient::with_tls(&cfg.master, token.as_deref(), tls.as_ref())
            .with_logs_key(logs_key.clone()),
        cfg,
        exec,
        fork,
        exe_name,
        versions,
        agent_id,
        address,
        tasks: Mutex::new(host),
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
    // callers (docs/auth.md), with its client certificate over TLS, else with the
    // key this agent gave it at registration. `/metrics` also takes the metrics
    // token (docs/agent.md, "Metrics").
    let keys = Keys {
        logs: logs_key,
        metrics: metrics_token,
    };
    let app = crate::logs::router(shared.layout.clone())
        .merge(crate::exec::router(crate::exec::ExecState {
            layout: shared.layout.clone(),
            executor: shared.cfg.executor.clone(),
            cgroup_root: PathBuf::from(crate::cgroup::CGROUP_ROOT),
        }))
        .route(
            "/metrics",
            axum::routing::get(scrape::metrics).with_state(shared.clone()),
        )
        .layer(axum::middleware::from_fn_with_state(
            Arc::new(keys),
            require_logs_key,
        ));
    let (stop_tx, stop_rx) = watch::channel(false);
    let server = tokio::spawn(async move {
        match log_tls {
            Some(config) => crate::tls::serve(listener, app, config, stop_rx).await,
            None => {
                let mut stop_rx = stop_rx;
                let stopped = async move {
                    let _ = stop_rx.wait_for(|s| *s).await;
                };
                if let Err(e) = axum::serve(listener, app)
                    .with_graceful_shutdown(stopped)
                    .await
                {
                    tracing::error!(error = %e, "log server failed");
                }
            }
        }
    });
    // Serving: the log server is bound and what ran here is re-adopted.
    crate::systemd::ready(&systemd_status(&shared));

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let mut b = Backoff::new(Duration::from_millis(300));
        let steps: Vec<u128> = (0..5).map(|_| b.step().as_millis()).collect();
        assert_eq!(steps, vec![50, 100, 200, 300, 300]);
        b.reset();
        assert_eq!(b.step(), Duration::from_millis(50));
    }
}
