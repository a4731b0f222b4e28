//! The log server's TLS, when the agent has a certificate (`tls_ca`, `tls_cert`,
//! `tls_key`): it serves with the agent's certificate and asks for a client
//! certificate chaining to the cluster CA. Only a master's (DNS name
//! `master.drover` among its subject alternative names, `drover tls issue
//! master`) reads logs; an agent's certificate (`<id>.agent.drover`) never carries
//! that name, so one agent cannot read another's logs (docs/auth.md). A connection
//! without a certificate gets through the handshake for `/health` and the metrics
//! token's `GET /metrics`; the gate (`runtime::identity`) refuses it anything else.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio::net::TcpListener;
use tokio::sync::watch;

/// The DNS name that makes a client certificate a master's.
pub const MASTER_NAME: &str = "master.drover";
/// How long a TLS handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client may take to send a request's head.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

fn certs(what: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{what} {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{what} {} holds no PEM CERTIFICATE",
            path.display()
        ));
    }
    Ok(certs)
}

/// The log server's rustls configuration: `cert` and `key` (the agent's, PEM)
/// served, client certificates verified against `ca` (the cluster CA) and optional
/// at the handshake.
pub fn server_config(ca: &Path, cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, String> {
    let chain = certs("tls_cert", cert)?;
    let key =
        PrivateKeyDer::from_pem_file(key).map_err(|e| format!("tls_key {}: {e}", key.display()))?;
    let mut roots = RootCertStore::empty();
    for c in certs("tls_ca", ca)? {
        roots
            .add(c)
            .map_err(|e| format!("tls_ca {}: {e}", ca.display()))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .allow_unauthenticated()
        .build()
        .map_err(|e| format!("tls_ca {}: {e}", ca.display()))?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| format!("tls_cert/tls_key {}: {e}", cert.display()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The client certificate of a request's connection (verified against the
/// cluster CA during the handshake), as a request extension.
#[derive(Clone, Debug)]
pub struct PeerCert(pub Arc<CertificateDer<'static>>);

impl PeerCert {
    /// Whether the certificate is a master's: it names `master.drover`.
    pub fn is_master(&self) -> bool {
        let Ok(name) = ServerName::try_from(MASTER_NAME) else {
            return false;
        };
        webpki::EndEntityCert::try_from(self.0.as_ref())
            .is_ok_and(|cert| cert.verify_is_valid_for_subject_name(&name).is_ok())
    }
}

/// Serves `app` over TLS on `listener` until `stop` turns true, then lets each
/// connection finish the request in flight. Each connection is HTTP/1.1; its
/// client certificate, if any, is added to each request as a `PeerCert`.
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    config: Arc<ServerConfig>,
    stop: watch::Receiver<bool>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
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
                tracing::warn!(error = %e, "log server: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let (app, acceptor, stop) = (app.clone(), acceptor.clone(), stop.clone());
        connections.spawn(async move {
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "log server: TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "log server: TLS handshake timed out");
                    return;
                }
            };
            let cert = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .map(|c| PeerCert(Arc::new(c.clone().into_owned())));
            serve_connection(stream, app, cert, stop).await;
        });
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
}

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
        .header_read_timeout(HEADER_READ_TIMEOUT);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreadable_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "nothing here\n").unwrap();
        let missing = dir.path().join("missing.pem");
        let e = server_config(&empty, &empty, &empty).unwrap_err();
        assert!(e.contains("tls_cert") && e.contains("holds no PEM"), "{e}");
        let e = server_config(&missing, &missing, &missing).unwrap_err();
        assert!(e.contains("tls_cert") && e.contains("missing.pem"), "{e}");
    }
}
