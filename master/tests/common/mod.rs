//! Shared helpers for the master's in-process HTTP tests: a master on 127.0.0.1:0
//! in a temp dir, a JSON client and a minimal fake agent.

#![allow(dead_code, clippy::unwrap_used)]

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use drover_common::wire::{
    self, AgentResources, AssignmentSet, HeartbeatRequest, HeartbeatResponse, RegisterRequest,
    StatusAck, StatusUpdate, StatusUpdateBatch,
};
use drover_common::TaskState;
use drover_master::auth::Grant;
use drover_master::core::CoreConfig;
use drover_master::tokens::Tokens;
use drover_master::{Config, Handle};
use serde_json::Value;

pub fn config(dir: &Path) -> Config {
    let listen = "127.0.0.1:0".parse().unwrap();
    Config {
        listen,
        store: drover_master::config::StoreChoice::Sqlite,
        ha: drover_master::config::HaConfig::for_listen(listen, false),
        dns: None,
        data_dir: dir.to_path_buf(),
        insecure: false,
        tls: None,
        core: CoreConfig {
            agent_timeout_ms: 5_000,
            heartbeat_interval_ms: 500,
            restart_grace_ms: 10_000,
            ..CoreConfig::default()
        },
    }
}

pub async fn start(dir: &Path) -> Handle {
    drover_master::start(config(dir)).await.unwrap()
}

/// A token of `grant` made directly in the master's registry.
pub fn token(h: &Handle, grant: Grant) -> String {
    h.tokens.create(grant, String::new(), "test", 0).unwrap().1
}

/// A JSON client that sends an admin token to admin routes and, to an agent's
/// routes, an agent token of its own per agent id (made on first use).
#[derive(Clone)]
pub struct Client {
    pub base: String,
    pub http: reqwest::Client,
    pub admin: String,
    tokens: Arc<Tokens>,
    agents: Arc<Mutex<HashMap<String, String>>>,
}

impl Client {
    pub fn new(h: &Handle) -> Client {
        Client {
            base: format!("http://{}", h.addr),
            http: reqwest::Client::new(),
            admin: token(h, Grant::Admin),
            tokens: h.tokens.clone(),
            agents: Default::default(),
        }
    }

    /// The same client (same tokens, as a restarted agent keeps its token) for a
    /// restarted master `h` on the same data dir.
    pub fn reconnect(&self, h: &Handle) -> Client {
        Client {
            base: format!("http://{}", h.addr),
            tokens: h.tokens.clone(),
            ..self.clone()
        }
    }

    /// The token a request to `path` (with `body`) is sent with.
    pub fn token_for(&self, path: &str, body: Option<&Value>) -> String {
        let parts: Vec<&str> = path.split(['/', '?']).collect();
        let agent = match parts.as_slice() {
            ["", "v1", "agents", "register", ..] => body
                .and_then(|b| b["agent_id"].as_str())
                .map(str::to_string),
            ["", "v1", "agents", id, "heartbeat" | "assignments" | "updates", ..] => {
                Some(id.to_string())
            }
            _ => None,
        };
        match agent {
            None => self.admin.clone(),
            Some(id) => self
                .agents
                .lock()
                .unwrap()
                .entry(id)
                .or_insert_with(|| {
                    self.tokens
                        .create(Grant::Agent { agent_id: None }, String::new(), "test", 0)
                        .unwrap()
                        .1
                })
                .clone(),
        }
    }

    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let r = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(self.token_for(path, Some(body)))
            .json(body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    pub async fn post_raw(&self, path: &str, body: String) -> (u16, Value) {
        let r = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(self.token_for(path, serde_json::from_str(&body).ok().as_ref()))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let r = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(self.token_for(path, None))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }
}

/// The body of a registration of agent `id` (small resources).
pub fn register_body(id: &str) -> Value {
    serde_json::to_value(RegisterRequest {
        ip: None,
        protocol_version: wire::PROTOCOL_VERSION,
        agent_id: id.to_string(),
        hostname: "h".to_string(),
        address: "http://127.0.0.1:9".to_string(),
        resources: AgentResources {
            cpu: 4.0,
            ram_bytes: 1 << 30,
            disk_bytes: 1 << 30,
            port_range: (31000, 31100),
        },
        attributes: Default::default(),
        versions: None,
    })
    .unwrap()
}

pub fn job(name: &str, instances: u32, service: bool) -> Value {
    serde_json::json!({
        "role": "www", "environment": "prod", "name": name,
        "instances": instances, "service": service,
        "task": {
            "processes": [{"name": "main", "cmdline": "sleep 100"}],
            "resources": {"cpu": 0.5, "ram": "64MiB", "disk": "64MiB", "ports": ["http"]}
        }
    })
}

/// A fake agent speaking the agent API.
pub struct FakeAgent {
    pub id: String,
    pub version: u64,
    pub seqs: std::collections::HashMap<String, u64>,
}

impl FakeAgent {
    pub async fn register(c: &Client, id: &str, cpu: f64) -> FakeAgent {
        let req = RegisterRequest {
            ip: None,
            protocol_version: wire::PROTOCOL_VERSION,
            agent_id: id.to_string(),
            hostname: "localhost".to_string(),
            address: "http://127.0.0.1:9".to_string(),
            resources: AgentResources {
                cpu,
                ram_bytes: 64 << 30,
                disk_bytes: 64 << 30,
                port_range: (31000, 32000),
            },
            attributes: [("host".to_string(), id.to_string())].into(),
            versions: None,
        };
        let (s, _) = c
            .post("/v1/agents/register", &serde_json::to_value(req).unwrap())
            .await;
        assert_eq!(s, 200);
        FakeAgent {
            id: id.to_string(),
            version: 0,
            seqs: Default::default(),
        }
    }

    pub async fn poll(&mut self, c: &Client, wait_ms: u64) -> AssignmentSet {
        let (s, v) = c
            .get(&format!(
                "/v1/agents/{}/assignments?after_version={}&wait_ms={wait_ms}",
                self.id, self.version
            ))
            .await;
        assert_eq!(s, 200, "{v}");
        let set: AssignmentSet = serde_json::from_value(v).unwrap();
        self.version = set.version;
        set
    }

    pub async fn report(&mut self, c: &Client, updates: &[(&str, TaskState)]) -> StatusAck {
        let batch = StatusUpdateBatch {
            updates: updates
                .iter()
                .map(|(id, state)| {
                    let seq = self.seqs.entry(id.to_string()).or_insert(0);
                    *seq += 1;
                    StatusUpdate {
                        task_id: id.to_string(),
                        seq: *seq,
                        state: *state,
                        exit_reason: None,
                        message: String::new(),
                        timestamp_ms: 0,
                        processes: Vec::new(),
                        processes_omitted: None,
                    }
                })
                .collect(),
        };
        let (s, v) = c
            .post(
                &format!("/v1/agents/{}/updates", self.id),
                &serde_json::to_value(batch).unwrap(),
            )
            .await;
        assert_eq!(s, 200, "{v}");
        serde_json::from_value(v).unwrap()
    }

    pub async fn heartbeat(&self, c: &Client, held: &[&str]) -> HeartbeatResponse {
        let req = HeartbeatRequest {
            task_digest: wire::task_set_digest(held.iter().copied()),
            assignments_version: self.version,
            tasks: None,
        };
        let (s, v) = c
            .post(
                &format!("/v1/agents/{}/heartbeat", self.id),
                &serde_json::to_value(req).unwrap(),
            )
            .await;
        assert_eq!(s, 200, "{v}");
        serde_json::from_value(v).unwrap()
    }
}
