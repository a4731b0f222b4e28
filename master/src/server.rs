//! The HTTP server around the master: opens the store, the token registry (with
//! the bootstrap admin token) and the audit log, binds, serves the router of `http`
//! behind `guard`, and on shutdown stops accepting, lets requests finish and
//! flushes the store. It wires `runtime` and `http` together so neither imports
//! the other's server side.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::audit::Audit;
use crate::config::Config;
use crate::http::Api;
use crate::runtime::{now_ms, open, seed, write_addr_file, Master, RunError};
use crate::store::DB_FILE;
use crate::tokens::Tokens;

/// Runs the master on `listener` until `shutdown` resolves: serves HTTP, fires
/// timers, then stops accepting, lets requests finish and flushes the store.
pub async fn serve(
    api: Arc<Api>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    let master = api.master.clone();
    let (stop_tx, stop_rx) = watch::channel(false);
    let app = crate::http::router(api);
    let timers = {
        let mut rx = stop_rx.clone();
        tokio::spawn(master.clone().run_timers(async move {
            let _ = rx.wait_for(|s| *s).await;
        }))
    };
    let mut failed_rx = master.commit_state().subscribe();
    let failed_master = master.clone();
    let store_failed = async move {
        loop {
            if failed_master.commit_state().failed() {
                return;
            }
            if failed_rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    };
    let stopping_master = master.clone();
    let stop = async move {
        tokio::select! {
            _ = shutdown => {}
            _ = store_failed => {}
        }
        let _ = stop_tx.send(true);
        stopping_master.stopping.send_replace(true);
    };
    let result = axum::serve(listener, app)
        .with_graceful_shutdown(stop)
        .await
        .map_err(RunError::Serve);
    let _ = timers.await;
    let failed = master.commit_state().failed();
    let m = master.clone();
    let _ = tokio::task::spawn_blocking(move || m.close()).await;
    result?;
    if failed {
        return Err(RunError::StoreFailed);
    }
    Ok(())
}

/// Opens the store, binds `config.listen` and writes master.addr: what `run` and
/// `start` do before serving.
async fn open_and_bind(config: &Config) -> Result<(Arc<Api>, TcpListener, SocketAddr), RunError> {
    let master = open(config, seed())?;
    let tokens = Arc::new(Tokens::open(&config.data_dir.join(DB_FILE))?);
    if let Some(path) = tokens.bootstrap(&config.data_dir, now_ms())? {
        tracing::warn!(path = %path.display(), "first start: created the bootstrap admin token (mode 0600); use it to create other tokens, then keep it safe");
    }
    let audit = Audit::open(&config.data_dir).map_err(|source| RunError::Audit {
        path: config.data_dir.clone(),
        source,
    })?;
    let api = Arc::new(Api {
        master,
        tokens,
        audit,
    });
    let bind_err = |source| RunError::Bind {
        addr: config.listen,
        source,
    };
    let listener = TcpListener::bind(config.listen).await.map_err(bind_err)?;
    let addr = listener.local_addr().map_err(bind_err)?;
    write_addr_file(&config.data_dir, addr)?;
    Ok((api, listener, addr))
}

/// Opens the store, binds, writes master.addr and serves until `shutdown`.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    let (api, listener, addr) = open_and_bind(&config).await?;
    if !addr.ip().is_loopback() {
        tracing::warn!(%addr, "INSECURE: --insecure is set and the API is served over plain HTTP on a non-loopback address; bearer tokens and agent traffic cross the network in clear text");
    }
    tracing::info!(%addr, data_dir = %config.data_dir.display(), "drover-master listening");
    serve(api, listener, shutdown).await
}

/// A master running inside this process (tests, benches, embedding).
pub struct Handle {
    /// The bound address.
    pub addr: SocketAddr,
    /// The shared state, for inspection.
    pub master: Arc<Master>,
    /// The token registry, e.g. for tests to create tokens.
    pub tokens: Arc<Tokens>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    join: Option<tokio::task::JoinHandle<Result<(), RunError>>>,
}

impl Handle {
    /// Stops accepting, finishes requests, flushes the store and waits for all that.
    pub async fn stop(mut self) -> Result<(), RunError> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        match self.join.take() {
            Some(j) => j.await.unwrap_or(Ok(())),
            None => Ok(()),
        }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

/// Starts a master in this process (binds, writes master.addr, serves).
pub async fn start(config: Config) -> Result<Handle, RunError> {
    let (api, listener, addr) = open_and_bind(&config).await?;
    let (master, tokens) = (api.master.clone(), api.tokens.clone());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let join = tokio::spawn(serve(api, listener, async move {
        let _ = rx.await;
    }));
    Ok(Handle {
        addr,
        master,
        tokens,
        stop: Some(tx),
        join: Some(join),
    })
}
