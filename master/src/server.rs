//! Serving primitives: the router of `http` (behind `guard`) on a bound
//! listener, with the timers running, until shutdown (or a failed store); then
//! it stops accepting, lets requests finish and flushes the store. The accept
//! loop (HTTP/1.1, TLS with the client certificate as a `PeerCert`, bounded
//! heads). A single master (`open`) and a leader on etcd (`leader`) both serve
//! through these.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::http::Api;
use crate::runtime::RunError;
use crate::tls::PeerCert;

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
    let connection = builder
        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
        .with_upgrades();
    tokio::pin!(connection);
    tokio::select! {
        _ = connection.as_mut() => {}
        _ = async { let _ = stop.wait_for(|s| *s).await; } => {
            connection.as_mut().graceful_shutdown();
            let _ = connection.await;
        }
    }
}
