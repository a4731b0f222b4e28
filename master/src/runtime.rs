//! The thin runtime around the pure core: one lock around the core, effects executed
//! in order (store batches handed to the group-commit writer under the lock, so the
//! store sees them in seq order), callers answered after their batch committed, one
//! timer task that ticks the core when its earliest timer is due. The HTTP server
//! around it is `server`.
//!
//! Read-only mode (a full disk, see `store`): writes are refused before they reach
//! the core ([`ApplyError::ReadOnly`], 507); agents' heartbeats are still handled
//! (without the task reports they may carry, whose reconciliation would write);
//! timers wait. A batch the store could not take is undone by reloading the core
//! from the store, and so is the core when writes resume (as a restarted master
//! would be, with its grace for agents and tasks), so memory never runs ahead of
//! what is stored.

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use drover_common::state::{mono_ms, now_ms, MonoMillis};
use tokio::sync::watch;

use crate::config::Config;
use crate::core::{Core, CoreError, Effect, Event, Now, Reply};
use crate::store::{
    CommitState, DeferredSqliteStore, Notifier, SqliteStore, Store, StoreError, Writer, DB_FILE,
};

/// Why an event could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error(transparent)]
    Core(#[from] CoreError),
    #[error("the store failed; the master is stopping: retry against the restarted master")]
    StoreFailed,
    /// The store is out of space: nothing was changed.
    #[error("nothing was changed: {0}")]
    ReadOnly(String),
}

/// Why the master could not run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot create the data dir {path}: {source}")]
    DataDir {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot listen on {addr}: {source}; pick another --listen address")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    AddrFile {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("cannot open the token registry: {0}")]
    Tokens(#[from] crate::tokens::TokenError),
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    #[error("cannot open the audit log in {path}: {source}")]
    Audit {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("cannot listen for DNS on {addr}: {source}; pick another dns_listen address")]
    Dns {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("http server failed: {0}")]
    Serve(std::io::Error),
    #[error("the store failed while running; restart the master to reload the committed state")]
    StoreFailed,
}

struct Inner {
    core: Core,
    writer: Writer,
    /// The store epoch the core agrees with (see `CommitState::epoch`).
    epoch: u64,
    /// Whether the store was read-only when last looked at.
    read_only: bool,
}

/// The master's shared state: the core behind a lock plus the commit machinery.
pub struct Master {
    inner: Mutex<Inner>,
    commit: Arc<CommitState>,
    notifier: Arc<Notifier>,
    /// The core's next timer (monotonic).
    timer: watch::Sender<Option<MonoMillis>>,
    pub(crate) stopping: watch::Sender<bool>,
}

impl Master {
    /// Wraps a core and a writer.
    pub fn new(core: Core, writer: Writer) -> Arc<Master> {
        let next = core.next_wake();
        let (epoch, read_only) = (writer.state.epoch(), writer.state.read_only().is_some());
        Arc::new(Master {
            commit: writer.state.clone(),
            notifier: writer.notifier.clone(),
            inner: Mutex::new(Inner {
                core,
                writer,
                epoch,
                read_only,
            }),
            timer: watch::channel(next).0,
            stopping: watch::channel(false).0,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves the core as it was at that point;
        // keep serving rather than poisoning every later request.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads the core under the lock.
    pub fn read<R>(&self, f: impl FnOnce(&Core) -> R) -> R {
        f(&self.lock().core)
    }

    /// Long-poll wake-ups.
    pub fn notifier(&self) -> &Notifier {
        &self.notifier
    }

    /// Becomes true when the master starts shutting down (long polls end early).
    pub fn stopping(&self) -> watch::Receiver<bool> {
        self.stopping.subscribe()
    }

    /// Commit progress.
    pub fn commit_state(&self) -> &CommitState {
        &self.commit
    }

    /// Why the master takes no writes now (its store is out of space), if so.
    pub fn read_only(&self) -> Option<String> {
        self.commit.read_only()
    }

    /// Reloads the core from the store when the store dropped a batch unstored
    /// (the core is ahead of it) or writes just resumed (a fresh start, with the
    /// grace a restarted master gives agents and tasks).
    fn follow_store(&self, inner: &mut Inner) -> Result<(), ApplyError> {
        let epoch = self.commit.epoch();
        let read_only = self.commit.read_only().is_some();
        let resumed = inner.read_only && !read_only;
        inner.read_only = read_only;
        if epoch == inner.epoch && !resumed {
            return Ok(());
        }
        let snapshot = match inner.writer.load() {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "cannot reload the core from the store; the master must restart");
                self.commit.fail();
                return Err(ApplyError::StoreFailed);
            }
        };
        let cfg = inner.core.config().clone();
        inner.core = Core::load(cfg, snapshot, now(), seed());
        inner.epoch = epoch;
        if resumed {
            tracing::warn!("writes resumed: the core was reloaded from the store");
        } else {
            tracing::warn!("a write was not stored (no space): the core was reloaded from the store, undoing it");
        }
        self.timer.send_replace(inner.core.next_wake());
        Ok(())
    }

    /// Applies an event and answers once everything it changed is committed.
    /// While the store is read-only only heartbeats are handled; anything else is
    /// refused with [`ApplyError::ReadOnly`] before it reaches the core.
    pub async fn apply(&self, mut event: Event) -> Result<Reply, ApplyError> {
        if self.commit.failed() {
            return Err(ApplyError::StoreFailed);
        }
        let (reply, seq, epoch) = {
            let mut inner = self.lock();
            self.follow_store(&mut inner)?;
            if let Some(why) = self.commit.read_only() {
                match &mut event {
                    // Reconciling the tasks it reports would write; the agent
                    // sends them again once asked.
                    Event::Heartbeat { request, .. } => request.tasks = None,
                    _ => return Err(ApplyError::ReadOnly(why)),
                }
            }
            let out = inner.core.handle(event, now());
            let mut notify = Vec::new();
            let mut persist = None;
            for e in out.effects {
                match e {
                    Effect::Persist { seq, changes } => {
                        crate::metrics::count_placements(&changes);
                        persist = Some((seq, changes));
                    }
                    Effect::Notify { agent } => notify.push(agent),
                    Effect::UpdateBatch {
                        direction,
                        instances,
                    } => crate::metrics::update_batch_started(direction, instances),
                    Effect::EvictionGuard { engaged, message } => {
                        if engaged {
                            tracing::warn!(eviction_guard = "engaged", "{message}");
                        } else {
                            tracing::warn!(eviction_guard = "released", "{message}");
                        }
                    }
                    Effect::WakeAt(at) => {
                        self.timer.send_if_modified(|cur| {
                            let changed = *cur != Some(at);
                            *cur = Some(at);
                            changed
                        });
                    }
                }
            }
            let epoch = inner.epoch;
            match persist {
                Some((seq, changes)) => inner.writer.submit_from(seq, epoch, changes, notify),
                None => {
                    let seq = inner.core.seq();
                    inner.writer.wake_now(&notify, seq);
                }
            }
            (out.reply, inner.core.seq(), epoch)
        };
        if let Err(e) = self.wait_stored(seq, epoch).await {
            if matches!(e, ApplyError::ReadOnly(_)) {
                // Undo it in memory before answering, so no read shows it.
                let mut inner = self.lock();
                self.follow_store(&mut inner)?;
            }
            return Err(e);
        }
        Ok(reply?)
    }

    /// Waits until batch `seq` is committed.
    pub async fn wait_committed(&self, seq: u64) -> Result<(), ApplyError> {
        let epoch = self.commit.epoch();
        self.wait_stored(seq, epoch).await
    }

    /// Waits until batch `seq`, made by a core of store epoch `epoch`, is committed;
    /// `ReadOnly` when the store dropped it unstored (the epoch moved on).
    async fn wait_stored(&self, seq: u64, epoch: u64) -> Result<(), ApplyError> {
        let mut rx = self.commit.subscribe();
        loop {
            if self.commit.failed() {
                return Err(ApplyError::StoreFailed);
            }
            if self.commit.committed() >= seq {
                return Ok(());
            }
            if self.commit.epoch() != epoch {
                let why = self
                    .commit
                    .read_only()
                    .unwrap_or_else(|| "the store dropped the write; try again".to_string());
                return Err(ApplyError::ReadOnly(why));
            }
            if rx.changed().await.is_err() {
                return Err(ApplyError::StoreFailed);
            }
        }
    }

    /// Ticks the core whenever its earliest timer is due, until `shutdown`. Under
    /// a systemd watchdog this loop also pings it (after reading the core under its
    /// lock), so a hung core or loop gets the master restarted.
    pub async fn run_timers(self: Arc<Self>, shutdown: impl Future<Output = ()>) {
        let mut rx = self.timer.subscribe();
        let mut watchdog = crate::systemd::watchdog();
        tokio::pin!(shutdown);
        loop {
            let next = *rx.borrow_and_update();
            let read_only = self.read_only().is_some();
            let wait_ms = match next {
                // Read-only: timers wait (what they do would write); the loop
                // looks again each second, and its first tick after writes resume
                // reloads the core.
                _ if read_only => crate::store::READ_ONLY_RETRY.as_millis() as u64,
                Some(at) => at.saturating_sub(mono_ms()),
                None => 1_000,
            };
            let wait = std::time::Duration::from_millis(wait_ms);
            let ping_in = watchdog.as_ref().map_or(wait, |w| {
                std::time::Duration::from_millis(w.until_due_ms(mono_ms()))
            });
            tokio::select! {
                _ = &mut shutdown => return,
                _ = rx.changed() => {}
                _ = tokio::time::sleep(wait.min(ping_in)) => {
                    if wait <= ping_in && !read_only {
                        match self.apply(Event::Tick).await {
                            Ok(_) | Err(ApplyError::ReadOnly(_)) => {}
                            Err(e) => {
                                tracing::error!(error = %e, "timer tick failed");
                                return;
                            }
                        }
                    }
                }
            }
            if watchdog.as_mut().is_some_and(|w| w.due(mono_ms())) {
                crate::systemd::ping(&self.status());
            }
        }
    }

    /// The one-line summary systemd shows (STATUS=): read-only first when it is.
    pub fn status(&self) -> String {
        let status = self.read(crate::systemd::status);
        match self.read_only() {
            Some(_) => format!("read-only (the store is full: see /health); {status}"),
            None => status,
        }
    }

    /// Stops the writer after it committed what is queued.
    pub fn close(&self) {
        self.lock().writer.close();
    }
}

/// Both clocks, read once per event: the core's one source of time.
pub fn now() -> Now {
    Now {
        mono: mono_ms(),
        wall: now_ms(),
    }
}

/// Opens the SQLite store in `data_dir`, loads it and starts the writer. A full
/// disk keeps SQLite from opening the store (its `-shm` file cannot grow): the
/// store is then loaded read-only and the master starts read-only, to open the
/// store for writing once space is back.
pub fn open(config: &Config, seed: u64) -> Result<Arc<Master>, RunError> {
    prepare_data_dir(config)?;
    let path = config.data_dir.join(DB_FILE);
    match SqliteStore::open(&path) {
        Ok(store) => open_store(config, Box::new(store), seed),
        Err(e) if e.is_no_space() => {
            tracing::error!(error = %e, "cannot open the store for writing: starting read-only until space is freed");
            let started = std::time::Instant::now();
            let snapshot = SqliteStore::load_read_only(&path)?;
            let core = load_core(config, snapshot, seed, started);
            let store = Box::new(DeferredSqliteStore::new(&path));
            let writer = Writer::start_read_only(store, core.seq(), &e);
            Ok(Master::new(core, writer))
        }
        Err(e) => Err(e.into()),
    }
}

/// Creates the data dir (mode 0700) if needed.
pub fn prepare_data_dir(config: &Config) -> Result<(), RunError> {
    // The store holds every job's `task.env`: the data dir is the master's alone.
    std::fs::create_dir_all(&config.data_dir)
        .and_then(|()| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&config.data_dir, std::fs::Permissions::from_mode(0o700))
        })
        .map_err(|source| RunError::DataDir {
            path: config.data_dir.clone(),
            source,
        })
}

/// Loads `store` and starts the writer over it.
pub fn open_store(
    config: &Config,
    mut store: Box<dyn Store>,
    seed: u64,
) -> Result<Arc<Master>, RunError> {
    let started = std::time::Instant::now();
    let snapshot = store.load()?;
    let core = load_core(config, snapshot, seed, started);
    // Committed up to the last batch stored (the core goes on from there).
    let writer = Writer::start(store, core.seq());
    Ok(Master::new(core, writer))
}

/// The core of `snapshot`, logged with what it holds and the time since `started`.
fn load_core(
    config: &Config,
    snapshot: crate::core::Snapshot,
    seed: u64,
    started: std::time::Instant,
) -> Core {
    let (jobs, tasks, agents) = (
        snapshot.jobs.len(),
        snapshot.tasks.len(),
        snapshot.agents.len(),
    );
    let core = Core::load(config.core.clone(), snapshot, now(), seed);
    tracing::info!(
        jobs,
        tasks,
        agents,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "loaded the store"
    );
    core
}

/// Writes `addr` to `<data_dir>/master.addr` atomically (tmp + rename); a file
/// that already says so is left alone (a master restarted on a full disk).
pub fn write_addr_file(data_dir: &Path, addr: SocketAddr) -> Result<(), RunError> {
    let path = data_dir.join("master.addr");
    let text = format!("{addr}\n");
    if std::fs::read_to_string(&path).is_ok_and(|old| old == text) {
        return Ok(());
    }
    let tmp = data_dir.join(".master.addr.tmp");
    let err = |source| RunError::AddrFile {
        path: path.clone(),
        source,
    };
    std::fs::write(&tmp, text).map_err(err)?;
    std::fs::rename(&tmp, &path).map_err(err)?;
    Ok(())
}

/// A seed for task ids that differs between runs.
pub fn seed() -> u64 {
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    t ^ (u64::from(std::process::id()) << 32)
}
