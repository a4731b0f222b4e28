//! Opening a master: the API over a loaded master (`api`: the token registry with
//! the bootstrap admin token, the audit log; in the data dir, or in etcd for a
//! leader), a single master's store and listener, running a single master, and
//! masters inside this process (`start`, `Handle`: tests, benches, embedding).
//! It wires `runtime` and `http` together so neither imports the other's server
//! side; `lib.rs`'s `run` chooses between a single master and one of several on
//! etcd (`leader`).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::audit::Audit;
use crate::config::Config;
use crate::etcd_auth::EtcdAudit;
use crate::etcd_store::{EtcdConn, EtcdStore, Fence};
use crate::http::Api;
use crate::runtime::{open, open_store, prepare_data_dir, seed, write_addr_file, Master, RunError};
use crate::server::serve;
use crate::store::Store;
use crate::store::DB_FILE;
use crate::tokens::Tokens;
use drover_common::state::now_ms;

/// Opens the store, binds `config.listen` and writes master.addr: what `run` and
/// `start` do before serving.
type Bound = (
    Arc<Api>,
    TcpListener,
    SocketAddr,
    Option<Arc<rustls::ServerConfig>>,
);

async fn open_and_bind(config: &Config, store: Option<Box<dyn Store>>) -> Result<Bound, RunError> {
    let tls = match &config.tls {
        Some(files) => Some(crate::tls::server_config(files)?),
        None => None,
    };
    let master = match store {
        None => open(config, seed())?,
        Some(store) => {
            prepare_data_dir(config)?;
            open_store(config, store, seed())?
        }
    };
    let api = api(config, master, tls.is_some(), None)?;
    let bind_err = |source| RunError::Bind {
        addr: config.listen,
        source,
    };
    let listener = TcpListener::bind(config.listen).await.map_err(bind_err)?;
    let addr = listener.local_addr().map_err(bind_err)?;
    if let Err(e) = write_addr_file(&config.data_dir, addr) {
        // On a full disk the master still serves reads (read-only mode).
        if api.master.read_only().is_none() {
            return Err(e);
        }
        tracing::error!(error = %e, %addr, "cannot write master.addr (read-only: the disk is full)");
    }
    Ok((api, listener, addr, tls))
}

/// The API over a loaded master: the token registry (with the bootstrap admin
/// token) and the audit log, in the data dir, or in etcd for a leader on etcd
/// (`etcd`: the connection and the leader's fence).
pub(crate) fn api(
    config: &Config,
    master: Arc<Master>,
    agent_certs: bool,
    etcd: Option<(Arc<EtcdConn>, Fence)>,
) -> Result<Arc<Api>, RunError> {
    let audit_err = |source| RunError::Audit {
        path: config.data_dir.clone(),
        source,
    };
    let (tokens, audit) = match etcd {
        None => (
            Tokens::open(&config.data_dir.join(DB_FILE))?,
            Audit::open(&config.data_dir).map_err(audit_err)?,
        ),
        Some((conn, fence)) => {
            let term = fence.revision;
            let tokens = Tokens::open_etcd(EtcdStore::new(conn.clone(), Some(fence.clone())))?;
            let writer = EtcdAudit::start(EtcdStore::new(conn, Some(fence)), term);
            (tokens, Audit::etcd(writer.map_err(audit_err)?))
        }
    };
    let tokens = Arc::new(tokens);
    if let Some(path) = tokens.bootstrap(&config.data_dir, now_ms())? {
        tracing::warn!(path = %path.display(), "first start: created the bootstrap admin token (mode 0600); use it to create other tokens, then keep it safe");
    }
    Ok(Arc::new(Api {
        master,
        tokens,
        audit,
        agent_certs,
        http: crate::tls::log_client(config.tls.as_ref())?,
        limiter: Default::default(),
    }))
}

/// A single master (SQLite): opens the store, binds, writes master.addr and
/// serves until `shutdown`.
pub async fn run_single(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    let (api, listener, addr, tls) = open_and_bind(&config, None).await?;
    if !addr.ip().is_loopback() && tls.is_none() {
        tracing::warn!(%addr, "INSECURE: --insecure is set and the API is served over plain HTTP on a non-loopback address; bearer tokens and agent traffic cross the network in clear text");
    }
    tracing::info!(%addr, data_dir = %config.data_dir.display(), "drover-master listening");
    // The store is loaded and the listener bound: connections from now on queue
    // until `serve` accepts them a moment later.
    let dns = {
        let master = api.master.clone();
        crate::dns::start_configured(config.dns_server(), &config.data_dir, move || {
            Some(master.clone())
        })
        .await?
    };
    let status = api.master.status();
    crate::systemd::ready(&format!("serving on {addr}; {status}"));
    let served = serve(api, listener, tls, shutdown).await;
    if let Some(dns) = dns {
        dns.stop().await;
    }
    served
}

/// A master running inside this process (tests, benches, embedding).
pub struct Handle {
    /// The bound address.
    pub addr: SocketAddr,
    /// The shared state, for inspection.
    pub master: Arc<Master>,
    /// The token registry, e.g. for tests to create tokens.
    pub tokens: Arc<Tokens>,
    /// The DNS server's address, when `dns_listen` is set.
    pub dns: Option<SocketAddr>,
    dns_server: Option<crate::dns::Running>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    join: Option<tokio::task::JoinHandle<Result<(), RunError>>>,
}

impl Handle {
    /// Stops accepting, finishes requests, flushes the store and waits for all that.
    pub async fn stop(mut self) -> Result<(), RunError> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(dns) = self.dns_server.take() {
            dns.stop().await;
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
    start_with(config, None).await
}

/// `start` on `store` instead of the SQLite store of `config` (benches; no
/// election: the caller makes sure this master is the only writer).
pub async fn start_with(config: Config, store: Option<Box<dyn Store>>) -> Result<Handle, RunError> {
    let (api, listener, addr, tls) = open_and_bind(&config, store).await?;
    let (master, tokens) = (api.master.clone(), api.tokens.clone());
    let dns_server = {
        let master = master.clone();
        crate::dns::start_configured(config.dns_server(), &config.data_dir, move || {
            Some(master.clone())
        })
        .await?
    };
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let join = tokio::spawn(serve(api, listener, tls, async move {
        let _ = rx.await;
    }));
    Ok(Handle {
        addr,
        master,
        tokens,
        dns: dns_server.as_ref().map(|d| d.addr),
        dns_server,
        stop: Some(tx),
        join: Some(join),
    })
}
