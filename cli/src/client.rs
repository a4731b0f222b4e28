//! A small client for the master's admin API and the agents' log API, with errors
//! that tell an operator what to do.

use std::fmt::Write as _;
use std::time::Duration;

use drover_common::spec::{is_valid_name, JobKey, JobSpec};
use drover_common::wire::{
    ActionResponse, AgentView, ApiError, ApiErrorBody, InstancesRequest, JobSummary, JobView,
    TaskView, UpdateRequest, UpdateView,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Everything that can go wrong talking to the master or an agent.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The address is not an http:// URL.
    #[error("`{url}` is not a master address: write e.g. http://127.0.0.1:7070 (--master or DROVER_MASTER)")]
    BadAddress { url: String },
    /// No connection to the master.
    #[error("cannot reach the master at {url}: is it running? set --master or DROVER_MASTER")]
    MasterUnreachable {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    /// No connection to an agent.
    #[error("cannot reach the agent at {url}: is it running? `drover agent list` shows whether it is reachable")]
    AgentUnreachable {
        url: String,
        #[source]
        source: reqwest::Error,
    },
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
    /// A task id that cannot be one.
    #[error("`{0}` is not a task id: `drover job status KEY` lists them")]
    BadTaskId(String),
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

/// Formats an API error: code, message, the field, and every detail on its own line.
pub fn describe_api_error(status: u16, error: &ApiError) -> String {
    let mut out = format!("{} (HTTP {status}): {}", error.code, error.message);
    if let Some(field) = &error.field {
        let _ = write!(out, "\n  field: {field}");
    }
    for detail in &error.details {
        let _ = write!(out, "\n  {}: {}", detail.field, detail.message);
    }
    out
}

/// The answer to POST /v1/jobs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateJobResponse {
    #[serde(default)]
    pub job: String,
    #[serde(default)]
    pub tasks: Vec<String>,
}

/// A piece of a log file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogChunk {
    pub bytes: Vec<u8>,
    /// The file's size when it was read (header `x-drover-log-size`), if sent.
    pub size: Option<u64>,
}

/// Which server a request goes to, for the error message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Peer {
    Master,
    Agent,
}

/// The admin API client.
#[derive(Clone, Debug)]
pub struct Client {
    base: String,
    http: reqwest::Client,
}

impl Client {
    /// A client for the master at `url` (`http://host:port`).
    pub fn new(url: &str) -> Result<Client, ClientError> {
        let base = url.trim().trim_end_matches('/').to_string();
        if !base.starts_with("http://") || base.len() <= "http://".len() {
            return Err(ClientError::BadAddress {
                url: url.to_string(),
            });
        }
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| ClientError::Decode {
                url: base.clone(),
                message: e.to_string(),
            })?;
        Ok(Client { base, http })
    }

    /// The master's address.
    pub fn base(&self) -> &str {
        &self.base
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
            .map_err(|source| unreachable(Peer::Master, &self.base, source))?;
        check_status(&url, response).await.map(|_| ())
    }

    /// POST /v1/jobs.
    pub async fn create_job(&self, spec: &JobSpec) -> Result<CreateJobResponse, ClientError> {
        self.post("/v1/jobs", spec).await
    }

    /// GET /v1/jobs[?role=R].
    pub async fn jobs(&self, role: Option<&str>) -> Result<Vec<JobSummary>, ClientError> {
        match role {
            Some(role) => {
                let url = format!("{}/v1/jobs", self.base);
                let request = self.http.get(&url).query(&[("role", role)]);
                send_json(Peer::Master, &self.base, &url, request).await
            }
            None => self.get("/v1/jobs").await,
        }
    }

    /// GET /v1/jobs/{role}/{env}/{name}.
    pub async fn job(&self, key: &JobKey) -> Result<JobView, ClientError> {
        self.get(&format!("/v1/jobs/{key}")).await
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

    /// POST /v1/jobs/{key}/restart.
    pub async fn restart(
        &self,
        key: &JobKey,
        instances: Option<String>,
    ) -> Result<ActionResponse, ClientError> {
        self.post(
            &format!("/v1/jobs/{key}/restart"),
            &InstancesRequest { instances },
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
        self.post(
            &format!("/v1/jobs/{key}/update/{action}"),
            &serde_json::json!({}),
        )
        .await
    }

    /// GET /v1/tasks/{id}.
    pub async fn task(&self, task_id: &str) -> Result<TaskView, ClientError> {
        if !is_valid_name(task_id) {
            return Err(ClientError::BadTaskId(task_id.to_string()));
        }
        self.get(&format!("/v1/tasks/{task_id}")).await
    }

    /// GET /v1/agents.
    pub async fn agents(&self) -> Result<Vec<AgentView>, ClientError> {
        self.get("/v1/agents").await
    }

    /// GET {agent}/v1/tasks/{id}/logs/{process}/{stream}?offset=N.
    pub async fn fetch_log(
        &self,
        agent_address: &str,
        task_id: &str,
        process: &str,
        stream: &str,
        offset: u64,
    ) -> Result<LogChunk, ClientError> {
        let agent = agent_address.trim_end_matches('/');
        let url = format!("{agent}/v1/tasks/{task_id}/logs/{process}/{stream}");
        let response = self
            .http
            .get(&url)
            .query(&[("offset", offset)])
            .send()
            .await
            .map_err(|source| unreachable(Peer::Agent, agent, source))?;
        let size = response
            .headers()
            .get("x-drover-log-size")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok());
        let response = check_status(&url, response).await?;
        let bytes = response.bytes().await.map_err(|e| ClientError::Decode {
            url: url.clone(),
            message: e.to_string(),
        })?;
        Ok(LogChunk {
            bytes: bytes.to_vec(),
            size,
        })
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        let url = format!("{}{path}", self.base);
        let request = self.http.get(&url);
        send_json(Peer::Master, &self.base, &url, request).await
    }

    async fn post<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ClientError> {
        let url = format!("{}{path}", self.base);
        let request = self.http.post(&url).json(body);
        send_json(Peer::Master, &self.base, &url, request).await
    }
}

fn unreachable(peer: Peer, base: &str, source: reqwest::Error) -> ClientError {
    let url = base.to_string();
    match peer {
        Peer::Master => ClientError::MasterUnreachable { url, source },
        Peer::Agent => ClientError::AgentUnreachable { url, source },
    }
}

async fn send_json<T: DeserializeOwned>(
    peer: Peer,
    base: &str,
    url: &str,
    request: reqwest::RequestBuilder,
) -> Result<T, ClientError> {
    let response = request
        .send()
        .await
        .map_err(|source| unreachable(peer, base, source))?;
    let response = check_status(url, response).await?;
    let bytes = response.bytes().await.map_err(|e| ClientError::Decode {
        url: url.to_string(),
        message: e.to_string(),
    })?;
    serde_json::from_slice(&bytes).map_err(|e| ClientError::Decode {
        url: url.to_string(),
        message: e.to_string(),
    })
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
}
