//! A small client for the master's admin API and the agents' log API, with errors
//! that tell an operator what to do.
//!
//! Given several masters (sharing an etcd store), the client rides a failover:
//! a request that finds no leader (connection refused, 503 `not_leader`) is sent
//! to the leader the refusal names, or the next master, for up to
//! [`FAILOVER_WAIT`], saying so on stderr. A request whose answer was lost (the
//! master died after taking it) is sent again only when that is safe: reads,
//! and job creates, where `job_exists` with the identical spec then means the
//! lost attempt created it. Other writes report that they may or may not have
//! been done.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use drover_common::spec::{is_valid_name, JobKey, JobSpec};
use drover_common::wire::{
    ActionResponse, AgentAccessResponse, AgentView, ApiError, ApiErrorBody, ChangesView,
    ClusterView, CreateTokenRequest, CreateTokenResponse, CronView, HostProbe, HostView,
    HostsRequest, InstancesRequest, JobSummary, JobView, QuotaResources, QuotaView, RestartRequest,
    RoleUserRequest, RoleView, SetQuotaRequest, TaskView, TokenInfo, UpdateRequest, UpdateView,
    ALLOW_STALE_HEADER, LEADER_HEADER, LOG_SIZE_HEADER,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Everything that can go wrong talking to the master or an agent.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The address is not an http:// or https:// URL.
    #[error("`{url}` is not a master address: write e.g. http://127.0.0.1:7070 or https://10.0.0.1:7070 (--master or DROVER_MASTER)")]
    BadAddress { url: String },
    /// No connection to the master.
    #[error("cannot reach the master at {url}: is it running? set --master or DROVER_MASTER")]
    MasterUnreachable {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    /// An http:// address whose port speaks TLS.
    #[error("the master at {url} speaks TLS, not plain HTTP: use {https} and the cluster's CA, e.g. --master {https} --ca CA.pem (or DROVER_MASTER and DROVER_CA; a `drover dev` cluster prints both when it starts: its CA is DATA_DIR/tls/ca.pem)")]
    SpeaksTls { url: String, https: String },
    /// An https:// master whose certificate the CLI does not trust.
    #[error("the certificate of the master at {url} is not signed by a CA the CLI trusts ({message}): pass the cluster's CA with --ca CA.pem (or DROVER_CA; a `drover dev` cluster's is DATA_DIR/tls/ca.pem)")]
    UntrustedMaster { url: String, message: String },
    /// The server answered with a JSON error.
    #[error("{}", describe_api_error(*status, error))]
    Api { status: u16, error: ApiError },
    /// The server answered with an error that is not the API's JSON.
    #[error("{url} answered HTTP {status}: {body}")]
    Http {
        url: String,
        status: u16,
        body: String,
    },
    /// The answer could not be read.
    #[error("could not read the answer of {url}: {message} (are the CLI and the master the same version?)")]
    Decode { url: String, message: String },
    /// A token id that cannot be one.
    #[error("`{0}` is not a token id: `drover token list` lists them")]
    BadTokenId(String),
    /// A task id that cannot be one.
    #[error("`{0}` is not a task id: `drover job status KEY` lists them")]
    BadTaskId(String),
    /// The master took a write but its answer was lost (it failed over).
    #[error("the master at {url} took the request but did not answer ({message}): it may or may not have been done; check (e.g. `drover job status`) before trying again")]
    OutcomeUnknown { url: String, message: String },
    /// A role name that cannot be one.
    #[error("`{0}` is not a role name (1-64 of A-Z a-z 0-9 _ . -)")]
    BadRole(String),
    /// A host name that cannot be one.
    #[error("`{0}` is not a host name or agent id: `drover host list` lists them")]
    BadHost(String),
}

impl ClientError {
    /// The API error code, if the server sent one.
    pub fn api_code(&self) -> Option<&str> {
        match self {
            ClientError::Api { error, .. } => Some(&error.code),
            _ => None,
        }
    }
}

/// Where the CLI looks for its token, for 401 answers.
pub const TOKEN_HINT: &str = "the CLI reads its token from --token-file FILE (or DROVER_TOKEN_FILE), DROVER_TOKEN, or `token` / `token_file` in ~/.config/drover/config.toml";

/// Formats an API error: code, message, the field, and every detail on its own line.
pub fn describe_api_error(status: u16, error: &ApiError) -> String {
    let mut out = format!("{} (HTTP {status}): {}", error.code, error.message);
    if let Some(field) = &error.field {
        let _ = write!(out, "\n  field: {field}");
    }
    for detail in &error.details {
        let _ = write!(out, "\n  {}: {}", detail.field, detail.message);
    }
    if status == 401 {
        let _ = write!(out, "\n  {TOKEN_HINT}");
    }
    out
}

/// A piece of a log file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogChunk {
    pub bytes: Vec<u8>,
    /// The file's size when it was read (header `x-drover-log-size`), if sent.
    pub size: Option<u64>,
}

/// How long a command keeps trying while masters fail over.
pub const FAILOVER_WAIT: Duration = Duration::from_secs(10);
/// The pause between two tries during a failover.
const FAILOVER_PAUSE: Duration = Duration::from_millis(200);

/// When a request is sent again after its answer was lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Resend {
    /// Always (reads, and creates, which `create_job` reconciles).
    Always,
    /// Only when it certainly was not done (a write that is not idempotent).
    IfNotDone,
}

/// What one try of a request became.
enum Try {
    /// The master answered (any status but a standby's refusal).
    Answer(Answer),
    /// Certainly not done: no connection, or refused by a master that does not
    /// lead (naming the leader when it knows it).
    NotDone {
        leader: Option<String>,
        error: ClientError,
    },
    /// Sent but not answered: may or may not have been done.
    Lost(ClientError),
}

/// A master's answer, read whole.
struct Answer {
    url: String,
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Vec<u8>,
}

impl Answer {
    fn ok(self) -> Result<Answer, ClientError> {
        if (200..300).contains(&self.status) {
            return Ok(self);
        }
        let body = String::from_utf8_lossy(&self.body);
        Err(error_from_body(&self.url, self.status, &body))
    }

    fn json<T: DeserializeOwned>(self) -> Result<T, ClientError> {
        let answer = self.ok()?;
        serde_json::from_slice(&answer.body).map_err(|e| ClientError::Decode {
            url: answer.url.clone(),
            message: e.to_string(),
        })
    }
}

/// An answer, and whether an earlier try of it was lost on the way.
struct Sent {
    answer: Answer,
    lost_before: bool,
}

/// The admin API client.
#[derive(Clone)]
pub struct Client {
    base: String,
    http: reqwest::Client,
    /// The bearer token sent to the master (never to agents).
    token: Option<String>,
    /// Every master, when several share a store (else empty: no failover).
    masters: Vec<String>,
    /// The master requests go to now (moves during a failover).
    current: Arc<Mutex<String>>,
    /// GETs accept a standby's copy of the state (`X-Drover-Allow-Stale`).
    stale: bool,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("base", &self.base)
            .field("token", &self.token.as_ref().map(|_| "(set)"))
            .finish()
    }
}

impl Client {
    /// A client for the master at `url` (`http://host:port`) sending `token`.
    pub fn with_token(url: &str, token: Option<String>) -> Result<Client, ClientError> {
        Client::connect(url, token, None)
    }

    /// A client for the master at `url` (`http://` or `https://host:port`) sending
    /// `token`, trusting the cluster CA in `ca` (PEM) for https.
    pub fn connect(
        url: &str,
        token: Option<String>,
        ca: Option<&std::path::Path>,
    ) -> Result<Client, ClientError> {
        let base = url.trim().trim_end_matches('/').to_string();
        let scheme_len = if base.starts_with("https://") {
            "https://".len()
        } else if base.starts_with("http://") {
            "http://".len()
        } else {
            0
        };
        if scheme_len == 0 || base.len() <= scheme_len {
            return Err(ClientError::BadAddress {
                url: url.to_string(),
            });
        }
        let bad = |message: String| ClientError::Decode {
            url: base.clone(),
            message,
        };
        let mut builder = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(60));
        if let Some(path) = ca {
            let pem = std::fs::read(path)
                .map_err(|e| bad(format!("cannot read the CA {}: {e}", path.display())))?;
            let cert = reqwest::Certificate::from_pem(&pem)
                .map_err(|e| bad(format!("the CA {} is not PEM: {e}", path.display())))?;
            builder = builder.add_root_certificate(cert);
        }
        let http = builder.build().map_err(|e| bad(e.to_string()))?;
        Ok(Client {
            current: Arc::new(Mutex::new(base.clone())),
            base,
            http,
            token,
            masters: Vec::new(),
            stale: false,
        })
    }

    /// With `stale`, reads say they accept an answer from a standby's copy of the
    /// state while no leader answers (masters on etcd; `--stale`).
    pub fn with_stale(mut self, stale: bool) -> Client {
        self.stale = stale;
        self
    }

    /// Rides failovers between `masters` (see the module doc); fewer than two
    /// change nothing.
    pub fn with_masters(mut self, masters: Vec<String>) -> Client {
        if masters.len() > 1 {
            self.masters = masters;
        }
        self
    }

    /// Splits a comma-separated list of master URLs.
    pub fn master_list(list: &str) -> Vec<String> {
        list.split(',')
            .map(|u| u.trim().trim_end_matches('/').to_string())
            .filter(|u| !u.is_empty())
            .collect()
    }

    fn current(&self) -> String {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// One try of `method path` on master `base`.
    async fn try_once(
        &self,
        base: &str,
        method: &reqwest::Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&serde_json::Value>,
    ) -> Try {
        let url = format!("{base}{path}");
        let mut request = self.request(method.clone(), &url);
        if !query.is_empty() {
            request = request.query(query);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = match request.send().await {
            Ok(r) => r,
            Err(source) if source.is_connect() => {
                return Try::NotDone {
                    leader: None,
                    error: unreachable(base, source),
                }
            }
            Err(source) => return Try::Lost(unreachable(base, source)),
        };
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = match response.bytes().await {
            Ok(b) => b.to_vec(),
            Err(source) => return Try::Lost(unreachable(base, source)),
        };
        let answer = Answer {
            url,
            status,
            headers,
            body,
        };
        match refusal(&answer) {
            Refusal::None => Try::Answer(answer),
            Refusal::NotLeader => Try::NotDone {
                leader: answer
                    .headers
                    .get(LEADER_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .map(|v| v.trim_end_matches('/').to_string()),
                error: answer.ok().err().unwrap_or_else(|| ClientError::Http {
                    url: base.to_string(),
                    status,
                    body: String::new(),
                }),
            },
            Refusal::Lost => Try::Lost(answer.ok().err().unwrap_or_else(|| ClientError::Http {
                url: base.to_string(),
                status,
                body: String::new(),
            })),
        }
    }

    /// Sends `method path` to the current master, riding a failover between
    /// several (module doc): the answer, or the last error once out of time.
    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&serde_json::Value>,
        resend: Resend,
    ) -> Result<Sent, ClientError> {
        let deadline = Instant::now() + FAILOVER_WAIT;
        let mut lost_before = false;
        let mut said: Option<Instant> = None;
        loop {
            let base = self.current();
            let (leader, error, why) = match self.try_once(&base, &method, path, query, body).await
            {
                Try::Answer(answer) => {
                    if said.is_some() {
                        eprintln!("drover: {base} answered");
                    }
                    return Ok(Sent {
                        answer,
                        lost_before,
                    });
                }
                Try::NotDone { leader, error } => {
                    let why = if leader.is_some() || error.api_code().is_some() {
                        "does not lead"
                    } else {
                        "cannot be reached"
                    };
                    (leader, error, why)
                }
                Try::Lost(error) if self.masters.is_empty() => return Err(error),
                Try::Lost(error) if resend == Resend::IfNotDone => {
                    return Err(ClientError::OutcomeUnknown {
                        url: base,
                        message: error.to_string(),
                    })
                }
                Try::Lost(error) => {
                    lost_before = true;
                    (None, error, "took the request but did not answer")
                }
            };
            if self.masters.is_empty() || Instant::now() >= deadline {
                return Err(error);
            }
            let next = next_master(&self.masters, &base, leader.as_deref());
            let left = deadline.saturating_duration_since(Instant::now()).as_secs();
            if said.is_none_or(|at| at.elapsed() >= Duration::from_secs(2)) {
                if said.is_none() {
                    eprintln!(
                        "drover: {base} {why} (failover?); trying the other masters for up to {} s",
                        FAILOVER_WAIT.as_secs()
                    );
                } else {
                    eprintln!("drover: no leader answered yet; trying for {left} s more");
                }
                said = Some(Instant::now());
            }
            *self.current.lock().unwrap_or_else(|p| p.into_inner()) = next;
            tokio::time::sleep(FAILOVER_PAUSE).await;
        }
    }

    /// A request to the master, with the token.
    fn request(&self, method: reqwest::Method, url: &str) -> reqwest::RequestBuilder {
        let mut request = self.http.request(method.clone(), url);
        if self.stale && method == reqwest::Method::GET {
            request = request.header(ALLOW_STALE_HEADER, "true");
        }
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    /// Opens an exec stream: `GET path?query` upgraded to the `drover-exec`
    /// protocol on the current master (docs/api.md, "Exec"). A refusal is the
    /// master's error.
    pub async fn upgrade(
        &self,
        path: &str,
        query: &[(&str, String)],
    ) -> Result<reqwest::Upgraded, ClientError> {
        let base = self.current();
        let url = format!("{base}{path}");
        let response = self
            .request(reqwest::Method::GET, &url)
            .query(query)
            .header(reqwest::header::CONNECTION, "upgrade")
            .header(reqwest::header::UPGRADE, drover_common::wire::EXEC_PROTOCOL)
            .send()
            .await
            .map_err(|e| unreachable(&base, e))?;
        if response.status() != reqwest::StatusCode::SWITCHING_PROTOCOLS {
            let status = response.status().as_u16();
            let headers = response.headers().clone();
            let body = response
                .bytes()
                .await
                .map_err(|e| unreachable(&base, e))?
                .to_vec();
            let answer = Answer {
                url: url.clone(),
                status,
                headers,
                body,
            };
            return Err(answer.ok().err().unwrap_or_else(|| ClientError::Http {
                url,
                status,
                body: "the master did not switch protocols".into(),
            }));
        }
        response.upgrade().await.map_err(|e| unreachable(&base, e))
    }

    /// A client for the master at `url` (`http://host:port`), without a token.
    pub fn new(url: &str) -> Result<Client, ClientError> {
        Client::connect(url, None, None)
    }

    /// The master's address.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// Of several masters (URLs separated by commas: masters sharing an etcd
    /// store), the one that leads: the first whose `/health` says
    /// `"leader": true`, else the `leader_url` a standby names, else the first
    /// URL (whose errors then say what is wrong). One URL is returned as it is.
    pub async fn find_leader(list: &str, ca: Option<&std::path::Path>) -> String {
        let urls: Vec<&str> = list
            .split(',')
            .map(|u| u.trim().trim_end_matches('/'))
            .filter(|u| !u.is_empty())
            .collect();
        if urls.len() < 2 {
            return list.to_string();
        }
        let mut hint = None;
        for url in &urls {
            let Ok(client) = Client::connect(url, None, ca) else {
                continue;
            };
            let health = client
                .http
                .get(format!("{url}/health"))
                .timeout(Duration::from_secs(2))
                .send()
                .await;
            let Ok(text) = (match health {
                Ok(r) => r.text().await,
                Err(_) => continue,
            }) else {
                continue;
            };
            match serde_json::from_str::<serde_json::Value>(&text) {
                Ok(v) if v["leader"] == serde_json::Value::Bool(true) => return url.to_string(),
                Ok(v) => {
                    if let Some(l) = v["leader_url"].as_str() {
                        hint.get_or_insert(l.to_string());
                    }
                }
                // A master on SQLite answers "ok": it is the only one.
                Err(_) => return url.to_string(),
            }
        }
        hint.unwrap_or_else(|| urls[0].to_string())
    }

    /// GET /health: Ok when the master answers.
    pub async fn health(&self) -> Result<(), ClientError> {
        let url = format!("{}/health", self.base);
        let response = self
            .http
            .get(&url)
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .map_err(|source| unreachable(&self.base, source))?;
        check_status(&url, response).await.map(|_| ())
    }

    /// POST /v1/jobs. Sent again when a failover lost its answer; a job of
    /// the same key and the identical spec then found there is the one the lost
    /// try created, and counts as created.
    pub async fn create_job(&self, spec: &JobSpec) -> Result<ActionResponse, ClientError> {
        let body = serde_json::to_value(spec).map_err(|e| ClientError::Decode {
            url: self.base.clone(),
            message: e.to_string(),
        })?;
        let sent = self
            .send(
                reqwest::Method::POST,
                "/v1/jobs",
                &[],
                Some(&body),
                Resend::Always,
            )
            .await?;
        let lost_before = sent.lost_before;
        match sent.answer.json() {
            Err(e) if lost_before && e.api_code() == Some("job_exists") => {
                let view = self.job(&spec.key()).await?;
                let created = created_by_lost_try(view, spec).ok_or(e)?;
                eprintln!(
                    "drover: an earlier try's answer was lost; {} is there with this spec: created",
                    created.job
                );
                Ok(created)
            }
            other => other,
        }
    }

    /// GET /v1/jobs[?role=R].
    pub async fn jobs(&self, role: Option<&str>) -> Result<Vec<JobSummary>, ClientError> {
        let query = match role {
            Some(role) => vec![("role", role.to_string())],
            None => Vec::new(),
        };
        self.send(
            reqwest::Method::GET,
            "/v1/jobs",
            &query,
            None,
            Resend::Always,
        )
        .await?
        .answer
        .json()
    }

    /// GET /v1/jobs/{role}/{env}/{name}: the job with every instance, in one read.
    pub async fn job(&self, key: &JobKey) -> Result<JobView, ClientError> {
        self.get(&format!("/v1/jobs/{key}")).await
    }

    /// GET /v1/jobs/{role}/{env}/{name}?limit=N[&after=I]: the job's summary and
    /// one page of its instances (`next_after` when more follow).
    pub async fn job_page(
        &self,
        key: &JobKey,
        limit: u32,
        after: Option<u32>,
    ) -> Result<JobView, ClientError> {
        let mut path = format!("/v1/jobs/{key}?limit={limit}");
        if let Some(after) = after {
            path.push_str(&format!("&after={after}"));
        }
        self.get(&path).await
    }

    /// The job with every instance, read page by page (`MAX_INSTANCE_PAGE` at a
    /// time): the summary of the last page, the instances of all, no `next_after`.
    /// A master older than paging answers every instance at once; that is kept.
    pub async fn job_all_pages(&self, key: &JobKey) -> Result<JobView, ClientError> {
        let limit = drover_common::wire::MAX_INSTANCE_PAGE;
        let mut view = self.job_page(key, limit, None).await?;
        let mut last: Option<u32> = None;
        while let Some(after) = view.next_after {
            if last.is_some_and(|last| after <= last) {
                break; // never read a page twice
            }
            last = Some(after);
            let mut next = self.job_page(key, limit, Some(after)).await?;
            let mut instances = std::mem::take(&mut view.instances);
            instances.append(&mut next.instances);
            next.instances = instances;
            view = next;
        }
        view.next_after = None;
        Ok(view)
    }

    /// GET /v1/changes: what changed after `index` (only `job`'s tasks when given),
    /// waiting up to `wait` for the next change.
    pub async fn changes(
        &self,
        index: u64,
        job: Option<&JobKey>,
        wait: Duration,
    ) -> Result<ChangesView, ClientError> {
        let mut path = format!("/v1/changes?index={index}&wait_ms={}", wait.as_millis());
        if let Some(key) = job {
            path.push_str(&format!("&job={}", urlencode(&key.to_string())));
        }
        self.get(&path).await
    }

    /// POST /v1/jobs/{key}/kill.
    pub async fn kill(
        &self,
        key: &JobKey,
        instances: Option<String>,
    ) -> Result<ActionResponse, ClientError> {
        self.post(
            &format!("/v1/jobs/{key}/kill"),
            &InstancesRequest { instances },
        )
        .await
    }

    /// POST /v1/jobs/{key}/restart (a whole job rolls unless `all_at_once`).
    pub async fn restart(
        &self,
        key: &JobKey,
        instances: Option<String>,
        all_at_once: bool,
    ) -> Result<ActionResponse, ClientError> {
        self.post(
            &format!("/v1/jobs/{key}/restart"),
            &RestartRequest {
                instances,
                all_at_once,
            },
        )
        .await
    }

    /// POST /v1/jobs/{key}/update.
    pub async fn start_update(
        &self,
        key: &JobKey,
        request: &UpdateRequest,
    ) -> Result<UpdateView, ClientError> {
        self.post(&format!("/v1/jobs/{key}/update"), request).await
    }

    /// GET /v1/jobs/{key}/update: the job's latest update.
    pub async fn update(&self, key: &JobKey) -> Result<UpdateView, ClientError> {
        self.get(&format!("/v1/jobs/{key}/update")).await
    }

    /// POST /v1/jobs/{key}/update/{action} (pause, resume, abort, rollback).
    pub async fn update_action(
        &self,
        key: &JobKey,
        action: &str,
    ) -> Result<UpdateView, ClientError> {
        self.post_empty(&format!("/v1/jobs/{key}/update/{action}"))
            .await
    }

    /// GET /v1/tasks/{id}.
    pub async fn task(&self, task_id: &str) -> Result<TaskView, ClientError> {
        if !is_valid_name(task_id) {
            return Err(ClientError::BadTaskId(task_id.to_string()));
        }
        self.get(&format!("/v1/tasks/{task_id}")).await
    }

    /// GET /v1/cluster.
    pub async fn cluster(&self) -> Result<ClusterView, ClientError> {
        self.get("/v1/cluster").await
    }

    /// POST /v1/cluster/eviction-guard/release.
    pub async fn release_guard(&self) -> Result<ClusterView, ClientError> {
        self.post_empty("/v1/cluster/eviction-guard/release").await
    }

    /// GET /v1/quotas, or /v1/quotas/{role} (as a list of one).
    pub async fn quotas(&self, role: Option<&str>) -> Result<Vec<QuotaView>, ClientError> {
        match role {
            None => self.get("/v1/quotas").await,
            Some(role) => {
                if !is_valid_name(role) {
                    return Err(ClientError::BadRole(role.to_string()));
                }
                Ok(vec![self.get(&format!("/v1/quotas/{role}")).await?])
            }
        }
    }

    /// POST /v1/quotas/{role}: sets (Some) or removes (None) the role's quota.
    pub async fn set_quota(
        &self,
        role: &str,
        quota: Option<QuotaResources>,
    ) -> Result<QuotaView, ClientError> {
        if !is_valid_name(role) {
            return Err(ClientError::BadRole(role.to_string()));
        }
        let body = SetQuotaRequest::from(quota);
        self.post(&format!("/v1/quotas/{role}"), &body).await
    }

    /// GET /v1/roles/{role}.
    pub async fn role(&self, role: &str) -> Result<RoleView, ClientError> {
        if !is_valid_name(role) {
            return Err(ClientError::BadRole(role.to_string()));
        }
        self.get(&format!("/v1/roles/{role}")).await
    }

    /// POST /v1/roles/{role}/grant-user (`grant`) or .../revoke-user.
    pub async fn grant_user(
        &self,
        role: &str,
        user: &str,
        grant: bool,
    ) -> Result<RoleView, ClientError> {
        if !is_valid_name(role) {
            return Err(ClientError::BadRole(role.to_string()));
        }
        let what = if grant { "grant-user" } else { "revoke-user" };
        let body = RoleUserRequest {
            user: user.to_string(),
        };
        self.post(&format!("/v1/roles/{role}/{what}"), &body).await
    }

    /// GET /v1/cron.
    pub async fn cron_jobs(&self) -> Result<Vec<CronView>, ClientError> {
        self.get("/v1/cron").await
    }

    /// POST /v1/cron/{key}/start or /deschedule.
    pub async fn cron_action(
        &self,
        key: &JobKey,
        action: &str,
    ) -> Result<ActionResponse, ClientError> {
        self.post_empty(&format!(
            "/v1/cron/{}/{}/{}/{action}",
            key.role, key.environment, key.name
        ))
        .await
    }

    /// GET /v1/agents.
    pub async fn agents(&self) -> Result<Vec<AgentView>, ClientError> {
        self.get("/v1/agents").await
    }

    /// GET /v1/hosts.
    pub async fn hosts(&self) -> Result<Vec<HostView>, ClientError> {
        self.get("/v1/hosts").await
    }

    /// GET /v1/hosts/{host}.
    pub async fn host(&self, host: &str) -> Result<HostView, ClientError> {
        if !is_valid_name(host) {
            return Err(ClientError::BadHost(host.to_string()));
        }
        self.get(&format!("/v1/hosts/{host}")).await
    }

    /// POST /v1/hosts/{op} with op cordon, drain or activate.
    pub async fn maintain(
        &self,
        op: &str,
        request: &HostsRequest,
    ) -> Result<Vec<HostView>, ClientError> {
        self.post(&format!("/v1/hosts/{op}"), request).await
    }

    /// POST /v1/hosts/drain with dry_run: what a drain would do.
    pub async fn probe_drain(&self, hosts: Vec<String>) -> Result<Vec<HostProbe>, ClientError> {
        let request = HostsRequest {
            hosts,
            deadline_ms: None,
            start_at_ms: None,
            dry_run: true,
        };
        self.post("/v1/hosts/drain", &request).await
    }

    /// GET /v1/tokens.
    pub async fn tokens(&self) -> Result<Vec<TokenInfo>, ClientError> {
        self.get("/v1/tokens").await
    }

    /// POST /v1/tokens: the new token's record and text.
    pub async fn create_token(
        &self,
        request: &CreateTokenRequest,
    ) -> Result<CreateTokenResponse, ClientError> {
        self.post("/v1/tokens", request).await
    }

    /// POST /v1/tokens/{id}/revoke.
    pub async fn revoke_token(&self, id: &str) -> Result<TokenInfo, ClientError> {
        if !is_valid_name(id) {
            return Err(ClientError::BadTokenId(id.to_string()));
        }
        self.post_empty(&format!("/v1/tokens/{id}/revoke")).await
    }

    /// POST /v1/agents/{id}/forbid (`forbid` true) or /allow.
    pub async fn set_agent_forbidden(
        &self,
        agent_id: &str,
        forbid: bool,
    ) -> Result<AgentAccessResponse, ClientError> {
        let verb = if forbid { "forbid" } else { "allow" };
        self.post_empty(&format!("/v1/agents/{agent_id}/{verb}"))
            .await
    }

    /// GET /v1/tasks/{id}/logs/{process}/{stream}?offset=N on the master, which
    /// reads it from the task's agent.
    pub async fn fetch_log(
        &self,
        task_id: &str,
        process: &str,
        stream: &str,
        offset: u64,
    ) -> Result<LogChunk, ClientError> {
        if !is_valid_name(task_id) {
            return Err(ClientError::BadTaskId(task_id.to_string()));
        }
        let path = format!("/v1/tasks/{task_id}/logs/{process}/{stream}");
        let query = [("offset", offset.to_string())];
        let sent = self
            .send(reqwest::Method::GET, &path, &query, None, Resend::Always)
            .await?;
        let answer = sent.answer.ok()?;
        let size = answer
            .headers
            .get(LOG_SIZE_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok());
        Ok(LogChunk {
            bytes: answer.body,
            size,
        })
    }

    pub(crate) async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.send(reqwest::Method::GET, path, &[], None, Resend::Always)
            .await?
            .answer
            .json()
    }

    /// POST to a route that takes no body, not sent again once its answer is lost.
    async fn post_empty<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.send(reqwest::Method::POST, path, &[], None, Resend::IfNotDone)
            .await?
            .answer
            .json()
    }

    /// POST a write that is not sent again once its answer is lost.
    async fn post<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ClientError> {
        let body = serde_json::to_value(body).map_err(|e| ClientError::Decode {
            url: self.base.clone(),
            message: e.to_string(),
        })?;
        self.send(
            reqwest::Method::POST,
            path,
            &[],
            Some(&body),
            Resend::IfNotDone,
        )
        .await?
        .answer
        .json()
    }
}

/// A create answered `job_exists` after an earlier try's answer was lost: the
/// job found is the one that try created when its spec is the one sent (then
/// the create's answer), else it is another's.
fn created_by_lost_try(view: JobView, spec: &JobSpec) -> Option<ActionResponse> {
    (view.spec == *spec).then(|| ActionResponse {
        update: None,
        job: view.key,
        tasks: view
            .instances
            .iter()
            .filter_map(|i| i.current.as_ref().map(|t| t.task_id.clone()))
            .collect(),
    })
}

/// How a master's answer refuses a request it did not do.
#[derive(Debug, PartialEq, Eq)]
enum Refusal {
    /// Not a refusal.
    None,
    /// 503 `not_leader`: a standby (or a deposed leader) did nothing.
    NotLeader,
    /// The outcome is unknown: a standby's leader took it and was lost (502
    /// `leader_lost`), or the leader's store failed while committing (503
    /// `store_failed`).
    Lost,
}

fn refusal(answer: &Answer) -> Refusal {
    if answer.status != 502 && answer.status != 503 {
        return Refusal::None;
    }
    let code = serde_json::from_slice::<ApiErrorBody>(&answer.body)
        .map(|b| b.error.code)
        .unwrap_or_default();
    match code.as_str() {
        "not_leader" => Refusal::NotLeader,
        "leader_lost" | "store_failed" => Refusal::Lost,
        _ => Refusal::None,
    }
}

/// The master to try after `current`: the `leader` a refusal named when it is
/// one of `masters` and not `current`, else the next in the list.
fn next_master(masters: &[String], current: &str, leader: Option<&str>) -> String {
    if let Some(l) = leader.filter(|l| *l != current && masters.iter().any(|m| m == l)) {
        return l.to_string();
    }
    let at = masters.iter().position(|m| m == current);
    let next = at.map_or(0, |i| (i + 1) % masters.len());
    masters[next].clone()
}

fn unreachable(base: &str, source: reqwest::Error) -> ClientError {
    let chain = error_chain(&source);
    if let Some(rest) = base.strip_prefix("http://") {
        // A TLS server's answer to plain HTTP (an alert record) is no HTTP version.
        if chain.contains("invalid HTTP version") {
            return ClientError::SpeaksTls {
                url: base.to_string(),
                https: format!("https://{rest}"),
            };
        }
    } else if chain.contains("UnknownIssuer") || chain.contains("certificate verify failed") {
        return ClientError::UntrustedMaster {
            url: base.to_string(),
            message: "unknown issuer".to_string(),
        };
    }
    ClientError::MasterUnreachable {
        url: base.to_string(),
        source,
    }
}

/// An error and its sources, on one line.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

/// Turns a non-2xx answer into an error, reading the API's JSON error when there is one.
async fn check_status(
    url: &str,
    response: reqwest::Response,
) -> Result<reqwest::Response, ClientError> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let body = response.text().await.unwrap_or_default();
    Err(error_from_body(url, status.as_u16(), &body))
}

/// The error for a failed request's body: the API's JSON error, else the raw text.
pub fn error_from_body(url: &str, status: u16, body: &str) -> ClientError {
    match serde_json::from_str::<ApiErrorBody>(body) {
        Ok(parsed) => ClientError::Api {
            status,
            error: parsed.error,
        },
        Err(_) => {
            let mut body = body.trim().to_string();
            if body.len() > 500 {
                let cut = (0..=500)
                    .rev()
                    .find(|i| body.is_char_boundary(*i))
                    .unwrap_or(0);
                body.truncate(cut);
                body.push_str("...");
            }
            ClientError::Http {
                url: url.to_string(),
                status,
                body,
            }
        }
    }
}

/// Percent-encodes a query value (job keys: `/` and anything not unreserved).
fn urlencode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_errors_show_code_message_field_and_details() {
        let body = r#"{"error":{"code":"invalid_spec","message":"the spec has 2 errors",
            "field":"task.resources.cpu",
            "details":[{"field":"task.resources.cpu","message":"must be > 0"},
                       {"field":"name","message":"must not be empty"}]}}"#;
        let text = error_from_body("http://m/v1/jobs", 400, body).to_string();
        assert_eq!(
            text,
            "invalid_spec (HTTP 400): the spec has 2 errors\n  field: task.resources.cpu\n  \
             task.resources.cpu: must be > 0\n  name: must not be empty"
        );
    }

    #[test]
    fn a_failover_moves_to_the_named_leader_or_the_next_master() {
        let masters: Vec<String> = ["http://a", "http://b", "http://c"]
            .map(String::from)
            .to_vec();
        assert_eq!(
            next_master(&masters, "http://a", Some("http://c")),
            "http://c"
        );
        // A hint naming the master that just failed, or an unknown one, is not followed.
        assert_eq!(
            next_master(&masters, "http://b", Some("http://b")),
            "http://c"
        );
        assert_eq!(
            next_master(&masters, "http://c", Some("http://x")),
            "http://a"
        );
        assert_eq!(next_master(&masters, "http://c", None), "http://a");
        assert_eq!(next_master(&masters, "http://other", None), "http://a");
    }

    #[test]
    fn a_job_with_the_identical_spec_is_the_lost_creates_and_another_is_not() {
        let spec = drover_common::parse::parse_job_json(
            r#"{"role":"www-data","environment":"test","name":"j","instances":1,
                "task":{"processes":[{"name":"main","cmdline":"true"}],
                        "resources":{"cpu":0.1,"ram":"32MiB","disk":"32MiB"}}}"#,
        )
        .expect("a valid spec");
        let view: JobView = serde_json::from_value(serde_json::json!({
            "key": "www-data/test/j",
            "spec": spec,
            "created_ms": 1,
            "state_counts": {},
            "instances": [],
        }))
        .expect("a job view");
        let created = created_by_lost_try(view.clone(), &spec).expect("the same spec");
        assert_eq!(created.job, "www-data/test/j");
        let mut other = spec.clone();
        other.instances = 2;
        assert!(created_by_lost_try(view, &other).is_none());
    }

    #[test]
    fn refusals_that_did_nothing_differ_from_lost_answers() {
        let answer = |status: u16, code: &str| Answer {
            url: "http://m/v1/jobs".to_string(),
            status,
            headers: Default::default(),
            body: format!(r#"{{"error":{{"code":"{code}","message":"m"}}}}"#).into_bytes(),
        };
        assert_eq!(refusal(&answer(503, "not_leader")), Refusal::NotLeader);
        assert_eq!(refusal(&answer(502, "leader_lost")), Refusal::Lost);
        assert_eq!(refusal(&answer(503, "store_failed")), Refusal::Lost);
        assert_eq!(refusal(&answer(409, "job_exists")), Refusal::None);
        assert_eq!(refusal(&answer(503, "other")), Refusal::None);
    }

    #[test]
    fn non_json_errors_keep_status_and_body() {
        let err = error_from_body("http://m/x", 502, "bad gateway");
        assert_eq!(err.to_string(), "http://m/x answered HTTP 502: bad gateway");
        assert_eq!(err.api_code(), None);
    }

    #[test]
    fn master_address_must_be_http() {
        assert!(Client::new("127.0.0.1:7070").is_err());
        assert!(Client::new("http://").is_err());
        assert_eq!(
            Client::new("http://127.0.0.1:7070/").unwrap().base(),
            "http://127.0.0.1:7070"
        );
    }

    #[tokio::test]
    async fn unreachable_master_error_says_what_to_do() {
        // Bind and drop to get a port nobody listens on.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let client = Client::new(&format!("http://127.0.0.1:{port}")).unwrap();
        let text = client.agents().await.unwrap_err().to_string();
        assert!(
            text.contains("cannot reach the master at http://127.0.0.1:"),
            "{text}"
        );
        assert!(text.contains("set --master or DROVER_MASTER"), "{text}");
    }

    #[tokio::test]
    async fn an_http_address_of_a_tls_port_says_to_use_https_and_a_ca() {
        // What a TLS server sends to plain HTTP: an alert record, then it closes.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            use std::io::{Read as _, Write as _};
            let (mut stream, _) = listener.accept().unwrap();
            let mut buffer = [0u8; 1024];
            let _ = stream.read(&mut buffer);
            let _ = stream.write_all(&[0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x50]);
        });
        let client = Client::new(&format!("http://127.0.0.1:{port}")).unwrap();
        let text = client.agents().await.unwrap_err().to_string();
        server.join().unwrap();
        assert!(text.contains("speaks TLS"), "{text}");
        assert!(
            text.contains(&format!("--master https://127.0.0.1:{port} --ca")),
            "{text}"
        );
        assert!(!text.contains("invalid HTTP version"), "{text}");
    }
}
