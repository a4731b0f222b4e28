//! The agent's client of the master's agent API: register, heartbeat, long-poll the
//! assignment set, post status updates; every request carries the agent's token.
//! With several masters (on etcd) the client talks to one at a time and moves on
//! when it cannot reach it or it answers 503 `not_leader`: to the leader that
//! answer names (`X-Drover-Leader`) when it is one of the list, else to the next.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use std::time::Duration;

use drover_common::wire::{
    ApiErrorBody, AssignmentSet, HeartbeatRequest, HeartbeatResponse, RegisterRequest,
    RegisterResponse, SelfDrainRequest, StatusAck, StatusUpdateBatch, ASSIGNMENTS_HELD_MS_HEADER,
    LEADER_HEADER, LOGS_KEY_HEADER,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// A call to the master failed.
#[derive(Debug, thiserror::Error)]
pub enum MasterError {
    #[error("master at {url} unreachable: {source}")]
    Unreachable { url: String, source: reqwest::Error },
    #[error("master does not know this agent ({message}); registering again")]
    UnknownAgent { message: String },
    #[error("master answered {status} to {url}: {message}")]
    Rejected {
        url: String,
        status: u16,
        message: String,
    },
}

/// What an agent needs to reach an https master: the cluster CA and its identity.
#[derive(Clone, Debug)]
pub struct MasterTls {
    pub ca: reqwest::Certificate,
    /// The agent's certificate and key (None: the CA only, with a token).
    pub identity: Option<reqwest::Identity>,
}

impl MasterTls {
    /// Reads the CA and the agent's certificate and key (PEM files).
    pub fn load(
        ca: &std::path::Path,
        identity: Option<(&std::path::Path, &std::path::Path)>,
    ) -> Result<MasterTls, String> {
        let read = |p: &std::path::Path| {
            std::fs::read(p).map_err(|e| format!("cannot read {}: {e}", p.display()))
        };
        let ca_cert = reqwest::Certificate::from_pem(&read(ca)?)
            .map_err(|e| format!("tls_ca {}: {e}", ca.display()))?;
        let identity = match identity {
            None => None,
            Some((cert, key)) => {
                let mut pem = read(cert)?;
                pem.push(b'\n');
                pem.extend(read(key)?);
                Some(
                    reqwest::Identity::from_pem(&pem)
                        .map_err(|e| format!("tls_cert/tls_key {}: {e}", cert.display()))?,
                )
            }
        };
        Ok(MasterTls {
            ca: ca_cert,
            identity,
        })
    }
}

/// HTTP client of the master (one of a list).
#[derive(Clone, Debug)]
pub struct MasterClient {
    bases: Arc<Vec<String>>,
    current: Arc<AtomicUsize>,
    http: reqwest::Client,
    /// Sent at registration: what the log server requires from the master.
    logs_key: Option<String>,
}

impl MasterClient {
    /// A client of the master at `base` (`http://host:port`, or several
    /// separated by commas: the masters sharing an etcd store) sending `token`
    /// (`drv_...`) as its bearer token.
    pub fn new(base: &str, token: Option<&str>) -> MasterClient {
        MasterClient::with_tls(base, token, None)
    }

    /// Like `new`, for an https master: `tls` holds the cluster CA and this
    /// agent's certificate chain and key, presented instead of a token.
    pub fn with_tls(base: &str, token: Option<&str>, tls: Option<&MasterTls>) -> MasterClient {
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(value) = token.and_then(|t| format!("Bearer {t}").parse().ok()) {
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        let mut builder = reqwest::Client::builder();
        if let Some(tls) = tls {
            builder = builder.add_root_certificate(tls.ca.clone());
            if let Some(identity) = &tls.identity {
                builder = builder.identity(identity.clone());
            }
        }
        let http = builder
            .default_headers(headers)
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true)
            .pool_idle_timeout(Duration::from_secs(50))
            .build()
            .unwrap_or_else(|_| reqwest::Client::new());
        let bases: Vec<String> = base
            .split(',')
            .map(|b| b.trim().trim_end_matches('/').to_string())
            .filter(|b| !b.is_empty())
            .collect();
        MasterClient {
            bases: Arc::new(bases),
            current: Arc::new(AtomicUsize::new(0)),
            http,
            logs_key: None,
        }
    }

    /// The master talked to now.
    fn base(&self) -> &str {
        let i = self.current.load(Ordering::Relaxed);
        self.bases
            .get(i % self.bases.len().max(1))
            .map_or("", String::as_str)
    }

    /// Moves on from the master at `failed` (unless another request already did):
    /// to `leader` when it is in the list, else to the next one.
    fn move_on(&self, failed: &str, leader: Option<&str>) {
        if self.bases.len() < 2 {
            return;
        }
        let at = self.current.load(Ordering::Relaxed);
        if !failed.starts_with(self.base()) {
            return;
        }
        let next = leader
            .and_then(|l| self.bases.iter().position(|b| b == l.trim_end_matches('/')))
            .unwrap_or((at + 1) % self.bases.len());
        if self
            .current
            .compare_exchange(at, next, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            tracing::info!(master = %self.bases[next], "switching to another master");
        }
    }

    async fn send<T: DeserializeOwned>(
        &self,
        req: reqwest::RequestBuilder,
        url: String,
    ) -> Result<T, MasterError> {
        let resp = self.send_ok(req, url.clone()).await?;
        resp.json::<T>()
            .await
            .map_err(|source| MasterError::Unreachable { url, source })
    }

    /// Sends `req`; the response if it is a success, else the error it means.
    async fn send_ok(
        &self,
        req: reqwest::RequestBuilder,
        url: String,
    ) -> Result<reqwest::Response, MasterError> {
        let resp = match req.send().await {
            Ok(resp) => resp,
            Err(source) => {
                if source.is_connect() {
                    self.move_on(&url, None);
                }
                return Err(MasterError::Unreachable { url, source });
            }
        };
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let leader = resp
            .headers()
            .get(LEADER_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let text = resp.text().await.unwrap_or_default();
        let body = serde_json::from_str::<ApiErrorBody>(&text).ok();
        if body.as_ref().is_some_and(|b| b.error.code == "not_leader") {
            self.move_on(&url, leader.as_deref());
        }
        let about_agent = body
            .as_ref()
            .is_some_and(|b| b.error.field.as_deref() == Some("agent_id"));
        let message = body
            .map(|b| format!("{}: {}", b.error.code, b.error.message))
            .unwrap_or(text);
        // Only a 404 about the agent id means "register again"; any other 404 is an
        // error to retry, never a reason to loop on registration.
        if status == reqwest::StatusCode::NOT_FOUND && about_agent {
            return Err(MasterError::UnknownAgent { message });
        }
        Err(MasterError::Rejected {
            url,
            status: status.as_u16(),
            message,
        })
    }

    async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
        timeout: Duration,
    ) -> Result<T, MasterError> {
        let url = format!("{}{}", self.base(), path);
        let req = self.http.post(&url).json(body).timeout(timeout);
        self.send(req, url).await
    }

    /// The key sent at registration (header `x-drover-logs-key`) that the agent's
    /// log server requires from the master (None: a log server over TLS, which
    /// requires the master's certificate instead).
    pub fn with_logs_key(mut self, key: Option<String>) -> MasterClient {
        self.logs_key = key;
        self
    }

    /// POST /v1/agents/register
    pub async fn register(&self, req: &RegisterRequest) -> Result<RegisterResponse, MasterError> {
        let url = format!("{}/v1/agents/register", self.base());
        let mut request = self
            .http
            .post(&url)
            .json(req)
            .timeout(Duration::from_secs(15));
        if let Some(key) = &self.logs_key {
            request = request.header(LOGS_KEY_HEADER, key);
        }
        self.send(request, url).await
    }

    /// POST /v1/agents/{id}/heartbeat
    pub async fn heartbeat(
        &self,
        agent_id: &str,
        req: &HeartbeatRequest,
    ) -> Result<HeartbeatResponse, MasterError> {
        let path = format!("/v1/agents/{agent_id}/heartbeat");
        self.post(&path, req, Duration::from_secs(10)).await
    }

    /// GET /v1/agents/{id}/assignments: returns at once when the master has a newer
    /// version than `after_version`, else within about `wait`. Also returns how long
    /// the answer was in flight: the round trip minus the time the master held the
    /// poll (its `x-drover-held-ms` header; without it, zero), measured with this
    /// host's monotonic clock only. A long flight means a partition delayed the
    /// answer and the set may be stale.
    pub async fn assignments(
        &self,
        agent_id: &str,
        after_version: u64,
        wait: Duration,
    ) -> Result<(AssignmentSet, Duration), MasterError> {
        let url = format!(
            "{}/v1/agents/{agent_id}/assignments?after_version={after_version}&wait_ms={}",
            self.base(),
            wait.as_millis()
        );
        let sent = std::time::Instant::now();
        let req = self.http.get(&url).timeout(wait + Duration::from_secs(15));
        let resp = self.send_ok(req, url.clone()).await?;
        let held = resp
            .headers()
            .get(ASSIGNMENTS_HELD_MS_HEADER)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            .map(Duration::from_millis);
        let set = resp
            .json::<AssignmentSet>()
            .await
            .map_err(|source| MasterError::Unreachable { url, source })?;
        let in_flight = match held {
            Some(held) => sent.elapsed().saturating_sub(held),
            None => Duration::ZERO,
        };
        Ok((set, in_flight))
    }

    /// POST /v1/agents/{id}/drain: this host is shutting down; the master forces
    /// what is left `deadline` after the request.
    pub async fn drain_self(&self, agent_id: &str, deadline: Duration) -> Result<(), MasterError> {
        let path = format!("/v1/agents/{agent_id}/drain");
        let body = SelfDrainRequest {
            deadline_ms: Some(deadline.as_millis() as u64),
        };
        self.post::<_, serde::de::IgnoredAny>(&path, &body, Duration::from_secs(10))
            .await
            .map(|_| ())
    }

    /// POST /v1/agents/{id}/updates
    pub async fn updates(
        &self,
        agent_id: &str,
        batch: &StatusUpdateBatch,
    ) -> Result<StatusAck, MasterError> {
        let path = format!("/v1/agents/{agent_id}/updates");
        self.post(&path, batch, Duration::from_secs(15)).await
    }
}
