//! The thin runtime around the pure core: one lock around the core, effects executed
//! in order (store batches handed to the group-commit writer under the lock, so the
//! store sees them in seq order), callers answered after their batch committed, one
//! timer task that ticks the core when its earliest timer is due. The HTTP server
//! around it is `server`.

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use drover_common::state::{mono_ms, now_ms, MonoMillis};
use tokio::sync::watch;

use crate::config::Config;
use crate::core::{Core, CoreError, Effect, Event, Now, Reply};
use crate::store::{CommitState, Notifier, SqliteStore, Store, StoreError, Writer, DB_FILE};

/// Why an event could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error(transparent)]
    Core(#[from] CoreError),
    #[error("the store failed; the master is stopping: retry against the restarted master")]
    StoreFailed,
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
    #[error("http server failed: {0}")]
    Serve(std::io::Error),
    #[error("the store failed while running; restart the master to reload the committed state")]
    StoreFailed,
}

struct Inner {
    core: Core,
    writer: Writer,
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
        Arc::new(Master {
            commit: writer.state.clone(),
            notifier: writer.notifier.clone(),
            inner: Mutex::new(Inner { core, writer }),
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

    /// Applies an event and answers once everything it changed is committed.
    pub async fn apply(&self, event: Event) -> Result<Reply, ApplyError> {
        if self.commit.failed() {
            return Err(ApplyError::StoreFailed);
        }
        let (reply, seq) = {
            let mut inner = self.lock();
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
            match persist {
                Some((seq, changes)) => inner.writer.submit(seq, changes, notify),
                None => {
                    let seq = inner.core.seq();
                    inner.writer.wake_now(&notify, seq);
                }
            }
            (out.reply, inner.core.seq())
        };
        self.wait_committed(seq).await?;
        Ok(reply?)
    }

    /// Waits until batch `seq` is committed.
    pub async fn wait_committed(&self, seq: u64) -> Result<(), ApplyError> {
        let mut rx = self.commit.subscribe();
        loop {
            if self.commit.failed() {
                return Err(ApplyError::StoreFailed);
            }
            if self.commit.committed() >= seq {
                return Ok(());
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
            let wait_ms = match next {
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
                    if wait <= ping_in {
                        if let Err(e) = self.apply(Event::Tick).await {
                            tracing::error!(error = %e, "timer tick failed");
                            return;
                        }
                    }
                }
            }
            if watchdog.as_mut().is_some_and(|w| w.due(mono_ms())) {
                crate::systemd::ping(&self.read(crate::systemd::status));
            }
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

/// Opens the SQLite store in `data_dir`, loads it and starts the writer.
pub fn open(config: &Config, seed: u64) -> Result<Arc<Master>, RunError> {
    prepare_data_dir(config)?;
    let store = SqliteStore::open(&config.data_dir.join(DB_FILE))?;
    open_store(config, Box::new(store), seed)
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
    // Committed up to the last batch stored (the core goes on from there).
    let writer = Writer::start(store, core.seq());
    Ok(Master::new(core, writer))
}

/// Writes `addr` to `<data_dir>/master.addr` atomically (tmp + rename).
pub fn write_addr_file(data_dir: &Path, addr: SocketAddr) -> Result<(), RunError> {
    let path = data_dir.join("master.addr");
    let tmp = data_dir.join(".master.addr.tmp");
    let err = |source| RunError::AddrFile {
        path: path.clone(),
        source,
    };
    std::fs::write(&tmp, format!("{addr}\n")).map_err(err)?;
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
