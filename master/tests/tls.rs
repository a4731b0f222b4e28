//! mTLS between agents and the master, in one process: certificates from `drover
//! tls` (the CLI's code), a master serving TLS, agents' client certificates bound
//! to their agent ids; plain HTTP and foreign certificates refused; the master's
//! client of agents' log servers trusting each agent's own certificate only.

#![allow(clippy::unwrap_used)] // unwrap is how tests fail

mod common;

use std::path::Path;

use common::{config, register_body, token};
use drover::tls::{init_ca, issue, Kind};
use drover_master::auth::Grant;
use drover_master::tls::TlsFiles;
use serde_json::json;

fn client(dir: &Path, ca: &Path, agent: Option<&str>) -> reqwest::Client {
    let ca = reqwest::Certificate::from_pem(&std::fs::read(ca).unwrap()).unwrap();
    let mut builder = reqwest::Client::builder().add_root_certificate(ca);
    if let Some(name) = agent {
        let mut pem = std::fs::read(dir.join(format!("agent-{name}.pem"))).unwrap();
        pem.extend(std::fs::read(dir.join(format!("agent-{name}.key"))).unwrap());
        builder = builder.identity(reqwest::Identity::from_pem(&pem).unwrap());
    }
    builder.build().unwrap()
}

async fn status(request: reqwest::RequestBuilder) -> u16 {
    request.send().await.unwrap().status().as_u16()
}

#[tokio::test]
async fn agent_certificates_are_bound_to_their_agent_ids() {
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path().join("tls");
    init_ca(&pki).unwrap();
    issue(&pki, Kind::Master, "127.0.0.1", &[]).unwrap();
    issue(&pki, Kind::Agent, "a1", &[]).unwrap();
    issue(&pki, Kind::Agent, "a2", &[]).unwrap();
    let mut cfg = config(&dir.path().join("master"));
    cfg.tls = Some(TlsFiles {
        cert: pki.join("master-127.0.0.1.pem"),
        key: pki.join("master-127.0.0.1.key"),
        client_ca: pki.join("ca.pem"),
    });
    let h = drover_master::start(cfg).await.unwrap();
    let base = format!("https://127.0.0.1:{}", h.addr.port());
    let ca = pki.join("ca.pem");
    let (a1, a2, anon) = (
        client(&pki, &ca, Some("a1")),
        client(&pki, &ca, Some("a2")),
        client(&pki, &ca, None),
    );

    let register = |c: &reqwest::Client, id: &str| {
        c.post(format!("{base}/v1/agents/register"))
            .json(&register_body(id))
    };
    assert_eq!(status(register(&a1, "a1")).await, 200);
    // a2's certificate cannot register as, heartbeat for, poll or report for a1.
    assert_eq!(status(register(&a2, "a1")).await, 403);
    let heartbeat = json!({"task_digest": 0, "assignments_version": 0});
    assert_eq!(
        status(
            a2.post(format!("{base}/v1/agents/a1/heartbeat"))
                .json(&heartbeat)
        )
        .await,
        403
    );
    assert_eq!(
        status(
            a2.post(format!("{base}/v1/agents/a1/updates"))
                .json(&json!({"updates": []}))
        )
        .await,
        403
    );
    assert_eq!(
        status(a2.get(format!(
            "{base}/v1/agents/a1/assignments?after_version=0&wait_ms=0"
        )))
        .await,
        403
    );
    assert_eq!(
        status(
            a1.post(format!("{base}/v1/agents/a1/heartbeat"))
                .json(&heartbeat)
        )
        .await,
        200
    );
    // Without a certificate, the agent API is refused even with an agent token.
    let agent_token = token(&h, Grant::Agent { agent_id: None });
    assert_eq!(
        status(register(&anon, "a3").bearer_auth(&agent_token)).await,
        401
    );
    // The admin API takes tokens over TLS, without a client certificate.
    let admin = token(&h, Grant::Admin);
    assert_eq!(
        status(anon.get(format!("{base}/v1/agents")).bearer_auth(&admin)).await,
        200
    );
    // Forbidding an agent refuses its certificate too.
    assert_eq!(
        status(
            anon.post(format!("{base}/v1/agents/a1/forbid"))
                .bearer_auth(&admin)
                .json(&json!({}))
        )
        .await,
        200
    );
    assert_eq!(
        status(
            a1.post(format!("{base}/v1/agents/a1/heartbeat"))
                .json(&heartbeat)
        )
        .await,
        403
    );
    // Plain HTTP to the TLS port gets no answer.
    let plain = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{}/health", h.addr.port()))
        .send()
        .await;
    assert!(
        plain.is_err() || !plain.unwrap().status().is_success(),
        "plain HTTP was served"
    );
    // A certificate from another CA fails the handshake.
    let other = dir.path().join("other");
    init_ca(&other).unwrap();
    issue(&other, Kind::Agent, "a1", &[]).unwrap();
    let foreign = {
        let mut pem = std::fs::read(other.join("agent-a1.pem")).unwrap();
        pem.extend(std::fs::read(other.join("agent-a1.key")).unwrap());
        reqwest::Client::builder()
            .add_root_certificate(
                reqwest::Certificate::from_pem(&std::fs::read(&ca).unwrap()).unwrap(),
            )
            .identity(reqwest::Identity::from_pem(&pem).unwrap())
            .build()
            .unwrap()
    };
    assert!(register(&foreign, "a1").send().await.is_err());
    h.stop().await.unwrap();
}

/// A one-request TLS server with `cert`/`key` (PEM files) that requires a client
/// certificate from `ca` and answers `ok`; its port.
async fn log_server(ca: &Path, cert: &Path, key: &Path) -> u16 {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = drover_master::tls::provider();
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        std::sync::Arc::new(roots),
        provider.clone(),
    )
    .build()
    .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            CertificateDer::pem_file_iter(cert)
                .unwrap()
                .map(|c| c.unwrap())
                .collect(),
            PrivateKeyDer::from_pem_file(key).unwrap(),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let Ok(mut stream) = acceptor.accept(tcp).await else {
                continue;
            };
            let mut head = [0u8; 4096];
            let _ = stream.read(&mut head).await;
            let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok";
            let _ = stream.write_all(answer).await;
            let _ = stream.shutdown().await;
        }
    });
    port
}

#[tokio::test]
async fn the_master_reads_a_log_server_only_with_the_agents_own_certificate() {
    use drover_master::tls::{answered_by, log_client};
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path().join("tls");
    init_ca(&pki).unwrap();
    issue(&pki, Kind::Master, "127.0.0.1", &[]).unwrap();
    issue(&pki, Kind::Agent, "a2", &[]).unwrap();
    let ca = pki.join("ca.pem");
    let files = TlsFiles {
        cert: pki.join("master-127.0.0.1.pem"),
        key: pki.join("master-127.0.0.1.key"),
        client_ca: ca.clone(),
    };
    let client = log_client(Some(&files)).unwrap();
    let get = |port: u16| client.get(format!("https://127.0.0.1:{port}/")).send();

    // The master presents its certificate (the server requires one) and accepts
    // an agent's whatever the URL's host; the answer says whose it is.
    let a2 = log_server(&ca, &pki.join("agent-a2.pem"), &pki.join("agent-a2.key")).await;
    let answer = get(a2).await.unwrap();
    assert!(answered_by(&answer, "a2"));
    assert!(!answered_by(&answer, "a1"), "a2's server is not a1's");
    assert_eq!(answer.text().await.unwrap(), "ok");
    // A server with a master's certificate (no agent name) is refused.
    let master = log_server(&ca, &files.cert, &files.key).await;
    assert!(get(master).await.is_err());
    // A server whose certificate is from another CA is refused.
    let other = dir.path().join("other");
    init_ca(&other).unwrap();
    issue(&other, Kind::Agent, "a2", &[]).unwrap();
    let foreign = log_server(
        &ca,
        &other.join("agent-a2.pem"),
        &other.join("agent-a2.key"),
    )
    .await;
    assert!(get(foreign).await.is_err());
    // Without TLS files the client reads plain log servers only: no answer
    // from an https one is trusted.
    let plain = log_client(None).unwrap();
    assert!(plain
        .get(format!("https://127.0.0.1:{a2}/"))
        .send()
        .await
        .is_err());
}

#[tokio::test]
async fn the_master_relays_a_log_only_from_the_agent_the_task_is_on() {
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path().join("tls");
    init_ca(&pki).unwrap();
    issue(&pki, Kind::Master, "127.0.0.1", &[]).unwrap();
    issue(&pki, Kind::Agent, "a1", &[]).unwrap();
    issue(&pki, Kind::Agent, "a2", &[]).unwrap();
    let ca = pki.join("ca.pem");
    let mut cfg = config(&dir.path().join("master"));
    cfg.tls = Some(TlsFiles {
        cert: pki.join("master-127.0.0.1.pem"),
        key: pki.join("master-127.0.0.1.key"),
        client_ca: ca.clone(),
    });
    let h = drover_master::start(cfg).await.unwrap();
    let base = format!("https://127.0.0.1:{}", h.addr.port());
    let a1 = client(&pki, &ca, Some("a1"));
    let admin = (client(&pki, &ca, None), token(&h, Grant::Admin));
    // a1 registers with the address of a log server; the job's task lands on a1.
    let register = |port: u16| {
        let mut body = register_body("a1");
        body["address"] = json!(format!("https://127.0.0.1:{port}"));
        a1.post(format!("{base}/v1/agents/register")).json(&body)
    };
    let a1_server = log_server(&ca, &pki.join("agent-a1.pem"), &pki.join("agent-a1.key")).await;
    let a2_server = log_server(&ca, &pki.join("agent-a2.pem"), &pki.join("agent-a2.key")).await;
    assert_eq!(status(register(a2_server)).await, 200);
    let created = admin
        .0
        .post(format!("{base}/v1/jobs"))
        .bearer_auth(&admin.1)
        .json(&common::job("logs", 1, false))
        .send()
        .await
        .unwrap();
    assert!(created.status().is_success(), "{created:?}");
    let job: serde_json::Value = admin
        .0
        .get(format!("{base}/v1/jobs/www/prod/logs"))
        .bearer_auth(&admin.1)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let task = job["instances"][0]["current"]["task_id"]
        .as_str()
        .unwrap_or_else(|| panic!("a placed task: {job}"))
        .to_string();
    let read = || async {
        let answer = admin
            .0
            .get(format!("{base}/v1/tasks/{task}/logs/main/stdout"))
            .bearer_auth(&admin.1)
            .send()
            .await
            .unwrap();
        (answer.status().as_u16(), answer.text().await.unwrap())
    };
    // At a1's address, a log server with a2's certificate: not relayed.
    let (s, text) = read().await;
    assert_eq!(s, 502, "{text}");
    assert!(text.contains("a1.agent.drover"), "{text}");
    assert!(!text.contains("\"ok\"") && text != "ok", "{text}");
    // With a1's own certificate (the server requires the master's): relayed.
    assert_eq!(status(register(a1_server)).await, 200);
    assert_eq!(read().await, (200, "ok".to_string()));
    h.stop().await.unwrap();
}
