//! TLS for the master's listener (rustls, `ring` provider): the server certificate
//! and key, and the cluster CA that client certificates must chain to. Clients
//! without a certificate are let through the handshake (admin clients use bearer
//! tokens); the agent API requires one (see `guard`). A certificate's identity is
//! a DNS name in its subject alternative names: `<agent_id>.agent.drover` for an
//! agent, `master.drover` for a master (`drover tls issue`, docs/auth.md). Also the
//! client the master reads agents' `https://` log servers with (`log_client`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};

/// The DNS-name suffix of an agent's identity: `<agent_id>.agent.drover`.
pub const AGENT_NAME_SUFFIX: &str = "agent.drover";
/// The DNS name of a master's identity.
pub const MASTER_NAME: &str = "master.drover";

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {what} {path}: {message}")]
    Read {
        what: &'static str,
        path: PathBuf,
        message: String,
    },
    #[error("{what} {path} holds no PEM {expected}")]
    Empty {
        what: &'static str,
        path: PathBuf,
        expected: &'static str,
    },
    #[error("TLS setup failed: {0}")]
    Rustls(String),
}

/// The files of the master's TLS setup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The master's certificate chain (PEM), from `drover tls issue master NAME`.
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// The cluster CA (PEM) that agents' client certificates must chain to.
    pub client_ca: PathBuf,
}

/// The PEM certificates in `path`.
pub fn load_certs(
    what: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let read = |message: String| TlsError::Read {
        what,
        path: path.to_path_buf(),
        message,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| read(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| read(e.to_string()))?;
    if certs.is_empty() {
        return Err(TlsError::Empty {
            what,
            path: path.to_path_buf(),
            expected: "CERTIFICATE",
        });
    }
    Ok(certs)
}

fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| TlsError::Read {
        what: "tls_key",
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// The provider every TLS object of the master uses.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The cluster CA of `files` (`tls_client_ca`) as a root store: what clients'
/// certificates, and agents' log servers' certificates, must chain to.
fn cluster_ca(files: &TlsFiles) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for ca in load_certs("tls_client_ca", &files.client_ca)? {
        roots
            .add(ca)
            .map_err(|e| TlsError::Rustls(format!("tls_client_ca: {e}")))?;
    }
    Ok(roots)
}

/// The rustls server configuration for `files`.
pub fn server_config(files: &TlsFiles) -> Result<Arc<ServerConfig>, TlsError> {
    let certs = load_certs("tls_cert", &files.cert)?;
    let key = load_key(&files.key)?;
    let roots = cluster_ca(files)?;
    let provider = provider();
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .allow_unauthenticated()
        .build()
        .map_err(|e| TlsError::Rustls(e.to_string()))?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Rustls(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .map_err(|e| TlsError::Rustls(format!("tls_cert/tls_key: {e}")))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The client certificate a connection presented (verified against the cluster
/// CA during the handshake), as a request extension.
#[derive(Clone, Debug)]
pub struct PeerCert(pub Arc<CertificateDer<'static>>);

impl PeerCert {
    /// Whether the certificate names `dns` among its subject alternative names.
    fn names(&self, dns: &str) -> bool {
        let Ok(name) = ServerName::try_from(dns) else {
            return false;
        };
        webpki::EndEntityCert::try_from(self.0.as_ref())
            .is_ok_and(|cert| cert.verify_is_valid_for_subject_name(&name).is_ok())
    }

    /// Whether this is the certificate of agent `agent_id`.
    pub fn is_agent(&self, agent_id: &str) -> bool {
        drover_common::spec::is_valid_name(agent_id)
            && self.names(&format!("{agent_id}.{AGENT_NAME_SUFFIX}"))
    }
}

/// The client the master reads agents' log servers with (docs/auth.md, "The
/// agents' log servers"). With `files` (a master serving TLS) it presents the
/// master's certificate and trusts an `https://` log server only with a
/// certificate chaining to the cluster CA that names an agent
/// (`<id>.agent.drover`, whatever host the URL names); `answered_by` then checks
/// that it is the agent asked. Plain `http://` log servers are read as before.
pub fn log_client(files: Option<&TlsFiles>) -> Result<reqwest::Client, TlsError> {
    let builder = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none());
    let Some(files) = files else {
        return builder.build().map_err(|e| TlsError::Rustls(e.to_string()));
    };
    let certs = load_certs("tls_cert", &files.cert)?;
    let key = load_key(&files.key)?;
    let roots = cluster_ca(files)?;
    let provider = provider();
    let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .map_err(|e| TlsError::Rustls(e.to_string()))?;
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Rustls(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AgentVerifier { inner }))
        .with_client_auth_cert(certs, key)
        .map_err(|e| TlsError::Rustls(format!("tls_cert/tls_key: {e}")))?;
    builder
        .use_preconfigured_tls(config)
        .tls_info(true)
        .build()
        .map_err(|e| TlsError::Rustls(e.to_string()))
}

/// The agent identity (`<id>.agent.drover`) a certificate names, if any.
fn agent_name(cert: &CertificateDer<'_>) -> Option<String> {
    let cert = webpki::EndEntityCert::try_from(cert).ok()?;
    let suffix = format!(".{AGENT_NAME_SUFFIX}");
    let name = cert.valid_dns_names().find(|n| n.ends_with(&suffix))?;
    Some(name.to_string())
}

/// Verifies an agent's log server: the full web PKI check (chain to the cluster
/// CA, validity, server-auth usage) for the agent name its certificate carries,
/// not for the URL's host (agent certificates name their identity only).
#[derive(Debug)]
struct AgentVerifier {
    inner: Arc<rustls::client::WebPkiServerVerifier>,
}

impl rustls::client::danger::ServerCertVerifier for AgentVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        let name = agent_name(end_entity)
            .and_then(|n| ServerName::try_from(n).ok())
            .ok_or(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName,
            ))?;
        self.inner
            .verify_server_cert(end_entity, intermediates, &name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// Whether `answer` came over TLS from agent `agent_id`: its certificate (checked
/// against the cluster CA by `log_client`) names `<agent_id>.agent.drover`.
pub fn answered_by(answer: &reqwest::Response, agent_id: &str) -> bool {
    answer
        .extensions()
        .get::<reqwest::tls::TlsInfo>()
        .and_then(|info| info.peer_certificate())
        .is_some_and(|der| {
            PeerCert(Arc::new(CertificateDer::from(der.to_vec()))).is_agent(agent_id)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_or_missing_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let garbage = dir.path().join("garbage.pem");
        std::fs::write(
            &garbage,
            "-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "nothing here\n").unwrap();
        let files = |cert: &Path| TlsFiles {
            cert: cert.to_path_buf(),
            key: garbage.clone(),
            client_ca: garbage.clone(),
        };
        let e = server_config(&files(&garbage)).unwrap_err().to_string();
        assert!(e.contains("tls_cert") && e.contains("garbage.pem"), "{e}");
        let e = server_config(&files(&empty)).unwrap_err().to_string();
        assert!(e.contains("holds no PEM CERTIFICATE"), "{e}");
        let e = server_config(&files(&dir.path().join("missing.pem")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing.pem"), "{e}");
    }
}
