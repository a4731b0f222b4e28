//! End-to-end numbers of the master alone, with fake agents speaking the real HTTP
//! agent API against an in-process master on a real SQLite store:
//! 1. job create -> RUNNING acknowledged (one task, agent answers at once): median,
//! 2. 5,000 one-shot tasks on 4 agents, submit -> all FINISHED: tasks/s,
//! 3. master memory per stored task at 100,000 tasks (the pure core),
//! 4. master restart with 10,000 tasks on 20 agents: load + serve.
//!
//! Not run in CI: `cargo bench -p drover-master --bench e2e`.
//! `E2E_ONLY_THROUGHPUT=1` runs the throughput part (and the restart) only;
//! `E2E_STORE=etcd://h:p,...` runs the throughput part on an empty etcd cluster
//! (with `E2E_ETCD_MAX_TXN_OPS` the cluster's --max-txn-ops, default 128).

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use drover_common::wire::{
    self, AgentResources, AssignmentSet, RegisterRequest, StatusUpdate, StatusUpdateBatch,
};
use drover_common::{DesiredState, TaskState};
use drover_master::auth::Grant;
use drover_master::core::{Core, CoreConfig, Event, Now, Reply};
use drover_master::Handle;
use serde_json::json;

/// GET `url` and read its JSON answer as T (panics on failure: a bench aborts).
async fn get_json<T: serde::de::DeserializeOwned>(http: &reqwest::Client, url: String) -> T {
    http.get(url).send().await.unwrap().json().await.unwrap()
}

/// POSTs a job spec to `base` and checks it was created (201).
async fn create_job(
    http: &reqwest::Client,
    base: &str,
    spec: &serde_json::Value,
) -> reqwest::Response {
    let r = http
        .post(format!("{base}/v1/jobs"))
        .json(spec)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    r
}

/// A client that sends a new token of `grant` with every request.
fn client(h: &Handle, grant: Grant) -> reqwest::Client {
    let (_, token) = h.tokens.create(grant, String::new(), "bench", 0).unwrap();
    let mut headers = reqwest::header::HeaderMap::new();
    let value = format!("Bearer {token}").parse().unwrap();
    headers.insert(reqwest::header::AUTHORIZATION, value);
    reqwest::Client::builder()
        .default_headers(headers)
        .build()
        .unwrap()
}

fn agent_client(h: &Handle) -> reqwest::Client {
    client(h, Grant::Agent { agent_id: None })
}

fn job(name: &str, instances: u32) -> serde_json::Value {
    json!({"role": "bench", "environment": "prod", "name": name, "instances": instances,
           "task": {"processes": [{"name": "m", "cmdline": "true"}],
                    "resources": {"cpu": 0.01, "ram": "1MiB", "disk": "1MiB"}}})
}

fn register_req(id: &str) -> RegisterRequest {
    RegisterRequest {
        ip: None,
        protocol_version: wire::PROTOCOL_VERSION,
        agent_id: id.to_string(),
        hostname: id.to_string(),
        address: String::new(),
        resources: AgentResources {
            cpu: 10_000.0,
            ram_bytes: 1 << 40,
            disk_bytes: 1 << 40,
            port_range: (31000, 32000),
        },
        attributes: Default::default(),
        versions: None,
    }
}

/// A fake agent: long-polls, and reports each new task's states in one batch.
async fn fake_agent(
    http: reqwest::Client,
    base: String,
    id: String,
    finals: Vec<TaskState>,
    done: Arc<AtomicUsize>,
    stop: Arc<AtomicUsize>,
) {
    http.post(format!("{base}/v1/agents/register"))
        .json(&register_req(&id))
        .send()
        .await
        .unwrap();
    let mut version = 0;
    let mut seen = std::collections::HashSet::new();
    while stop.load(Ordering::Relaxed) == 0 {
        let set: AssignmentSet = get_json(
            &http,
            format!("{base}/v1/agents/{id}/assignments?after_version={version}&wait_ms=200"),
        )
        .await;
        version = set.version;
        let mut updates = Vec::new();
        for a in set.assignments {
            if a.desired != DesiredState::Running || !seen.insert(a.task.task_id.clone()) {
                continue;
            }
            for (i, s) in finals.iter().enumerate() {
                updates.push(StatusUpdate {
                    task_id: a.task.task_id.clone(),
                    seq: i as u64 + 1,
                    state: *s,
                    exit_reason: None,
                    message: String::new(),
                    timestamp_ms: 0,
                    processes: Vec::new(),
                    processes_omitted: None,
                });
            }
        }
        if updates.is_empty() {
            continue;
        }
        for chunk in updates.chunks(300 * finals.len()) {
            let r = http
                .post(format!("{base}/v1/agents/{id}/updates"))
                .json(&StatusUpdateBatch {
                    updates: chunk.to_vec(),
                })
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            done.fetch_add(chunk.len() / finals.len(), Ordering::SeqCst);
        }
    }
}

async fn latency() {
    let dir = tempfile::tempdir().unwrap();
    let h = drover_master::start(common::config(dir.path()))
        .await
        .unwrap();
    let base = format!("http://{}", h.addr);
    let done = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicUsize::new(0));
    let agent = tokio::spawn(fake_agent(
        agent_client(&h),
        base.clone(),
        "lat".to_string(),
        vec![TaskState::Starting, TaskState::Running],
        done.clone(),
        stop.clone(),
    ));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let http = client(&h, Grant::Admin);
    let mut samples = Vec::new();
    for i in 0..200 {
        let t0 = Instant::now();
        let before = done.load(Ordering::SeqCst);
        let _response = create_job(&http, &base, &job(&format!("lat{i}"), 1)).await;
        while done.load(Ordering::SeqCst) == before {
            tokio::task::yield_now().await;
        }
        samples.push(t0.elapsed());
    }
    samples.sort();
    println!(
        "create -> RUNNING acked (fake agent, HTTP, SQLite): median {:.2} ms, p90 {:.2} ms",
        samples[samples.len() / 2].as_secs_f64() * 1e3,
        samples[samples.len() * 9 / 10].as_secs_f64() * 1e3
    );
    stop.store(1, Ordering::SeqCst);
    let _ = agent.await;
    h.stop().await.unwrap();
}

/// The store of the throughput run: SQLite, or the etcd cluster named by
/// `E2E_STORE=etcd://host:port,...` (an empty one: the bench's job must be new).
fn bench_store() -> Option<Box<dyn drover_master::store::Store>> {
    let url = std::env::var("E2E_STORE").ok()?;
    let mut options =
        drover_master::etcd_store::EtcdOptions::parse(&url, None, None, None).unwrap();
    if let Ok(n) = std::env::var("E2E_ETCD_MAX_TXN_OPS") {
        options.max_txn_ops = n.parse().unwrap();
    }
    let conn = drover_master::etcd_store::EtcdConn::connect(&options).unwrap();
    Some(Box::new(drover_master::etcd_store::EtcdStore::new(
        conn, None,
    )))
}

async fn throughput() {
    let dir = tempfile::tempdir().unwrap();
    let store = bench_store();
    println!(
        "throughput store: {}",
        std::env::var("E2E_STORE").unwrap_or_else(|_| "sqlite".into())
    );
    let h = drover_master::start_with(common::config(dir.path()), store)
        .await
        .unwrap();
    let base = format!("http://{}", h.addr);
    let done = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicUsize::new(0));
    let mut agents = Vec::new();
    for i in 0..4 {
        agents.push(tokio::spawn(fake_agent(
            agent_client(&h),
            base.clone(),
            format!("tp{i}"),
            vec![TaskState::Starting, TaskState::Running, TaskState::Finished],
            done.clone(),
            stop.clone(),
        )));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t0 = Instant::now();
    let http = client(&h, Grant::Admin);
    let r = create_job(&http, &base, &job("oneshot", 5_000)).await;
    if std::env::var_os("E2E_DEBUG").is_some() {
        let v: serde_json::Value = r.json().await.unwrap();
        let id = v["tasks"][0].as_str().unwrap().to_string();
        let t: serde_json::Value = get_json(&http, format!("{base}/v1/tasks/{id}")).await;
        eprintln!("{t}");
        let a: serde_json::Value = get_json(&http, format!("{base}/v1/agents")).await;
        eprintln!("{a}");
    }
    loop {
        let v: serde_json::Value = get_json(&http, format!("{base}/v1/jobs")).await;
        if v[0]["state_counts"]["FINISHED"] == 5_000 {
            break;
        }
        if std::env::var_os("E2E_DEBUG").is_some() {
            eprintln!("{} {}", t0.elapsed().as_millis(), v[0]["state_counts"]);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let el = t0.elapsed();
    println!(
        "5000 one-shot tasks on 4 fake agents, submit -> all FINISHED: {:.2} s = {:.0} tasks/s",
        el.as_secs_f64(),
        5000.0 / el.as_secs_f64()
    );
    stop.store(1, Ordering::SeqCst);
    for a in agents {
        let _ = a.await;
    }
    h.stop().await.unwrap();
}

fn memory() {
    let before = common::proc_status_bytes("VmRSS");
    let mut core = Core::new(CoreConfig::default(), Now::both(1_000), 1);
    for i in 0..100 {
        core.handle(
            Event::Register(Box::new(register_req(&format!("m{i}")))),
            Now::both(1_000),
        );
    }
    let mut ids = Vec::new();
    for j in 0..100 {
        let spec = serde_json::from_value(job(&format!("mem{j}"), 1_000)).unwrap();
        if let Ok(Reply::JobCreated { tasks, .. }) = core
            .handle(Event::CreateJob(Box::new(spec)), Now::both(2_000))
            .reply
        {
            ids.extend(tasks);
        }
    }
    // Every task goes STARTING and RUNNING (events and processes recorded).
    for chunk in ids.chunks(1_000) {
        let mut by_agent: std::collections::HashMap<String, Vec<StatusUpdate>> = Default::default();
        for id in chunk {
            let agent = core.task(id).unwrap().agent.clone().unwrap();
            for (seq, state) in [(1, TaskState::Starting), (2, TaskState::Running)] {
                by_agent
                    .entry(agent.clone())
                    .or_default()
                    .push(StatusUpdate {
                        task_id: id.clone(),
                        seq,
                        state,
                        exit_reason: None,
                        message: "started".to_string(),
                        timestamp_ms: 0,
                        processes: Vec::new(),
                        processes_omitted: None,
                    });
            }
        }
        for (agent, updates) in by_agent {
            core.handle(
                Event::StatusReports {
                    agent,
                    reports: updates,
                },
                Now::both(3_000),
            );
        }
    }
    let after = common::proc_status_bytes("VmRSS");
    println!(
        "memory: {} tasks, RSS +{:.1} MiB = {:.0} bytes per task",
        core.task_count(),
        (after - before) as f64 / (1 << 20) as f64,
        (after - before) as f64 / core.task_count() as f64
    );
}

async fn restart() {
    let dir = tempfile::tempdir().unwrap();
    let h = drover_master::start(common::config(dir.path()))
        .await
        .unwrap();
    let base = format!("http://{}", h.addr);
    let http = client(&h, Grant::Admin);
    let agents: Vec<reqwest::Client> = (0..20).map(|_| agent_client(&h)).collect();
    for (i, agent) in agents.iter().enumerate() {
        agent
            .post(format!("{base}/v1/agents/register"))
            .json(&register_req(&format!("r{i}")))
            .send()
            .await
            .unwrap();
    }
    for j in 0..10 {
        let _response = create_job(&http, &base, &job(&format!("restart{j}"), 1_000)).await;
    }
    h.stop().await.unwrap();
    let t0 = Instant::now();
    let h = drover_master::start(common::config(dir.path()))
        .await
        .unwrap();
    let r = http
        .get(format!("http://{}/v1/jobs", h.addr))
        .send()
        .await
        .unwrap();
    let jobs: serde_json::Value = r.json().await.unwrap();
    let el = t0.elapsed();
    assert_eq!(jobs.as_array().unwrap().len(), 10);
    let tasks = h.master.read(|c| c.task_count());
    println!(
        "restart with {tasks} tasks on 20 agents: loaded and serving in {:.0} ms",
        el.as_secs_f64() * 1e3
    );
    // Every agent comes back with its full task set; the master reconciles.
    let base = format!("http://{}", h.addr);
    for (i, agent) in agents.iter().enumerate() {
        let id = format!("r{i}");
        let set: AssignmentSet = get_json(
            agent,
            format!("{base}/v1/agents/{id}/assignments?after_version=0&wait_ms=0"),
        )
        .await;
        let ids: Vec<String> = set
            .assignments
            .iter()
            .map(|a| a.task.task_id.clone())
            .collect();
        let req = wire::HeartbeatRequest {
            task_digest: wire::task_set_digest(ids.iter().map(String::as_str)),
            assignments_version: set.version,
            tasks: Some(
                ids.iter()
                    .map(|t| wire::AgentTaskReport {
                        task_id: t.clone(),
                        state: TaskState::Running,
                        seq: 0,
                    })
                    .collect(),
            ),
        };
        agent
            .post(format!("{base}/v1/agents/{id}/heartbeat"))
            .json(&req)
            .send()
            .await
            .unwrap();
    }
    while h.master.read(|c| c.reconciling()) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let el = t0.elapsed();
    let v: serde_json::Value = http
        .get(format!("{base}/v1/jobs"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let assigned: u64 = v
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["state_counts"]["ASSIGNED"].as_u64().unwrap_or(0))
        .sum();
    println!(
        "  reconciled with all 20 agents {:.0} ms after the start; {assigned} of {tasks} tasks still placed (none killed)",
        el.as_secs_f64() * 1e3
    );
    h.stop().await.unwrap();
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if std::env::var_os("E2E_ONLY_THROUGHPUT").is_none() {
        memory();
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    if std::env::var_os("E2E_ONLY_THROUGHPUT").is_none() {
        rt.block_on(latency());
    }
    rt.block_on(throughput());
    rt.block_on(restart());
}
