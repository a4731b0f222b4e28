//! The HTTP server around the master: opens the store, the token registry (with
//! the bootstrap admin token) and the audit log, binds, serves the router of `http`
//! behind `guard`, and on shutdown stops accepting, lets requests finish and
//! flushes the store. It wires `runtime` and `http` together so neither imports
//! the other's server side.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::audit::Audit;
use crate::config::Config;
use crate::etcd_auth::EtcdAudit;
use crate::etcd_store::{EtcdConn, EtcdStore, Fence};
use crate::http::Api;
use crate::runtime::{open, open_store, prepare_data_dir, seed, write_addr_file, Master, RunError};
use crate::store::Store;
use crate::store::DB_FILE;
use crate::tls::PeerCert;
use crate::tokens::Tokens;
use drover_common::state::now_ms;

/// Runs the master on `listener` until `shutdown` resolves: serves HTTP, fires
/// timers, then stops accepting, lets requests finish and flushes the store.
pub async fn serve(
    api: Arc<Api>,
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    serve_wrapped(api, listener, tls, shutdown, |router| router).await
}

/// `serve` with the router wrapped by `wrap` (the leader's gate on etcd).
pub async fn serve_wrapped(
    api: Arc<Api>,
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    wrap: impl FnOnce(axum::Router) -> axum::Router,
) -> Result<(), RunError> {
    let master = api.master.clone();
    let (stop_tx, stop_rx) = watch::channel(false);
    let app = wrap(crate::http::router(api));
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
    tokio::spawn(stop);
    let result = accept_loop(listener, app, tls, stop_rx).await;
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

/// How long a client may take to send a request's head (slow clients are cut off).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a TLS handshake may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest request head (line and headers) read.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// The most headers a request may have.
pub const MAX_HEADERS: usize = 64;

/// Accepts connections until `stop` turns true, then lets each connection finish
/// the request it is serving and waits for them all. Each connection is HTTP/1.1
/// (over TLS when `tls` is set, the client certificate then added to each request
/// as a `PeerCert`), with a bounded head and a read timeout for its head.
pub(crate) async fn accept_loop(
    listener: TcpListener,
    app: axum::Router,
    tls: Option<Arc<rustls::ServerConfig>>,
    stop: watch::Receiver<bool>,
) -> Result<(), RunError> {
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let mut connections = tokio::task::JoinSet::new();
    let mut stopping = stop.clone();
    loop {
        let accepted = tokio::select! {
            _ = async { let _ = stopping.wait_for(|s| *s).await; } => break,
            accepted = listener.accept() => accepted,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let (tcp, peer) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                // Out of descriptors and the like: wait a little rather than spin.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let (app, acceptor, stop) = (app.clone(), acceptor.clone(), stop.clone());
        connections.spawn(async move {
            match acceptor {
                None => serve_connection(tcp, app, None, stop).await,
                Some(acceptor) => {
                    let stream =
                        match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                            Ok(Ok(stream)) => stream,
                            Ok(Err(e)) => {
                                tracing::debug!(%peer, error = %e, "TLS handshake failed");
                                return;
                            }
                            Err(_) => {
                                tracing::debug!(%peer, "TLS handshake timed out");
                                return;
                            }
                        };
                    let cert = stream
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|chain| chain.first())
                        .map(|c| PeerCert(Arc::new(c.clone().into_owned())));
                    serve_connection(stream, app, cert, stop).await
                }
            }
        });
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// Serves one connection's requests until it closes, or until `stop` (then the
/// request in flight is finished first).
async fn serve_connection<S>(
    stream: S,
    app: axum::Router,
    cert: Option<PeerCert>,
    mut stop: watch::Receiver<bool>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use tower::ServiceExt as _;
    let service =
        hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
            if let Some(cert) = &cert {
                request.extensions_mut().insert(cert.clone());
            }
            app.clone().oneshot(request.map(axum::body::Body::new))
        });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(MAX_HEAD_BYTES)
        .max_headers(MAX_HEADERS);
    let connection = builder.serve_connection(hyper_util::rt::TokioIo::new(stream), service);
    tokio::pin!(connection);
    tokio::select! {
        _ = connection.as_mut() => {}
        _ = async { let _ = stop.wait_for(|s| *s).await; } => {
            connection.as_mut().graceful_shutdown();
            let _ = connection.await;
        }
    }
}

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

/// Opens the store, binds, writes master.addr and serves until `shutdown`.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    if let crate::config::StoreChoice::Etcd(options) = &config.store {
        prepare_data_dir(&config)?;
        write_addr_file(&config.data_dir, config.listen)?;
        tracing::info!(url = %config.ha.advertise, data_dir = %config.data_dir.display(), "drover-master on etcd: campaigning");
        crate::systemd::ready("standby on etcd: campaigning for leadership");
        let options = options.clone();
        return crate::leader::run(config, options, shutdown).await;
    }
    let (api, listener, addr, tls) = open_and_bind(&config, None).await?;
    if !addr.ip().is_loopback() && tls.is_none() {
        tracing::warn!(%addr, "INSECURE: --insecure is set and the API is served over plain HTTP on a non-loopback address; bearer tokens and agent traffic cross the network in clear text");
    }
    tracing::info!(%addr, data_dir = %config.data_dir.display(), "drover-master listening");
    // The store is loaded and the listener bound: connections from now on queue
    // until `serve` accepts them a moment later.
    let dns = {
        let master = api.master.clone();
        crate::dns::start_configured(&config, move || Some(master.clone())).await?
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
        crate::dns::start_configured(&config, move || Some(master.clone())).await?
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
