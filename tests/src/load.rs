//! A load generator: hundreds of simulated agents in one process, each speaking the
//! real agent API to a real master (register, heartbeats with the task digest and,
//! when asked, the full task set, the assignments long poll, status updates). A
//! simulated agent "runs" a task by reporting STARTING then RUNNING, and checks every
//! assignment set it gets against its own capacity, so an over-committing master is
//! caught where it would hurt. Kills (a task leaving the set or desired SHUTDOWN) are
//! counted: a master restart or a burst of returning agents must cause none. Like
//! the real agent, each heartbeats at the interval the master tells it (registration
//! and heartbeat answers), its first heartbeat spread over that interval.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover_common::state::{now_ms, DesiredState, TaskState};
use drover_common::wire::{
    self, AgentResources, AgentTaskReport, AssignmentSet, HeartbeatRequest, HeartbeatResponse,
    RegisterRequest, StatusUpdate, StatusUpdateBatch,
};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// What every simulated agent offers.
pub const SIM_CPU: f64 = 2.0;
/// RAM of every simulated agent.
pub const SIM_RAM: u64 = 4 << 30;

/// Counters over the whole fleet.
#[derive(Debug, Default)]
pub struct FleetStats {
    /// Assignment sets whose tasks needed more CPU or RAM than the agent has.
    pub overcommits: AtomicU64,
    /// Tasks the master took away from an agent (left the set or desired SHUTDOWN).
    pub kills: AtomicU64,
    /// Heartbeats answered.
    pub heartbeats: AtomicU64,
    /// Requests that failed (the master was down, or an error status).
    pub errors: AtomicU64,
    /// Registrations (initial and after a heartbeat said `reregister`).
    pub registrations: AtomicU64,
    /// Full task sets the master took (answered heartbeats that carried one).
    pub full_sets: AtomicU64,
    /// The longest heartbeat interval the master told any agent, in ms.
    pub told_interval_ms: AtomicU64,
}

#[derive(Default)]
struct SimState {
    /// Applied assignment set version.
    version: u64,
    /// Task id -> (last seq sent, state).
    tasks: BTreeMap<String, (u64, TaskState)>,
}

/// One simulated agent.
struct SimAgent {
    id: String,
    token: Option<String>,
    state: Mutex<SimState>,
}

/// A running fleet of simulated agents; stops when dropped.
pub struct Fleet {
    /// Fleet-wide counters.
    pub stats: Arc<FleetStats>,
    stop: watch::Sender<bool>,
    tasks: JoinSet<()>,
}

impl Fleet {
    /// Starts one simulated agent per entry of `tokens` (its bearer token, if the
    /// master wants one) against `master` (e.g. `http://127.0.0.1:7070`),
    /// heartbeating at the interval the master tells, on the current tokio runtime.
    pub fn start(master: &str, tokens: Vec<Option<String>>) -> Fleet {
        let n = tokens.len();
        let stats = Arc::new(FleetStats::default());
        let (stop, rx) = watch::channel(false);
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(2 * n)
            .timeout(Duration::from_secs(40))
            .build()
            .unwrap_or_else(|_| reqwest::Client::new());
        let mut tasks = JoinSet::new();
        for (k, token) in tokens.into_iter().enumerate() {
            let agent = Arc::new(SimAgent {
                id: format!("sim-{k:04}"),
                token,
                state: Mutex::new(SimState::default()),
            });
            let ctx = Ctx {
                http: http.clone(),
                master: master.trim_end_matches('/').to_string(),
                stats: stats.clone(),
                agent,
            };
            let (c1, r1) = (ctx.clone(), rx.clone());
            // Agents started together would heartbeat in step: the k-th of n waits
            // k/n of an interval before its first heartbeat, as agents started over
            // time would.
            let phase = k as f64 / n as f64;
            tasks.spawn(async move { c1.heartbeats(phase, r1).await });
            let (c2, r2) = (ctx, rx.clone());
            tasks.spawn(async move { c2.polls(r2).await });
        }
        Fleet { stats, stop, tasks }
    }

    /// Stops every simulated agent and waits for them.
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        while self.tasks.join_next().await.is_some() {}
    }
}

#[derive(Clone)]
struct Ctx {
    http: reqwest::Client,
    master: String,
    stats: Arc<FleetStats>,
    agent: Arc<SimAgent>,
}

fn lock(m: &Mutex<SimState>) -> std::sync::MutexGuard<'_, SimState> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Ctx {
    /// `request` with the agent's bearer token, if it has one.
    fn auth(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.agent.token {
            Some(t) => request.bearer_auth(t),
            None => request,
        }
    }

    /// Registers; the interval the master told, None if it refused or was down.
    async fn register(&self) -> Option<Duration> {
        let req = RegisterRequest {
            ip: None,
            protocol_version: wire::PROTOCOL_VERSION,
            agent_id: self.agent.id.clone(),
            hostname: format!("{}.sim", self.agent.id),
            address: "http://127.0.0.1:9".to_string(),
            resources: AgentResources {
                cpu: SIM_CPU,
                ram_bytes: SIM_RAM,
                disk_bytes: 64 << 30,
                port_range: (31000, 31999),
            },
            attributes: [("host".to_string(), self.agent.id.clone())].into(),
            versions: None,
        };
        let url = format!("{}/v1/agents/register", self.master);
        let answer = match self.auth(self.http.post(url)).json(&req).send().await {
            Ok(r) if r.status().is_success() => r.json::<wire::RegisterResponse>().await.ok(),
            _ => None,
        };
        match answer {
            Some(a) => {
                self.stats.registrations.fetch_add(1, Ordering::Relaxed);
                Some(self.told(a.heartbeat_interval_ms))
            }
            None => {
                self.stats.errors.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Records an interval the master told.
    fn told(&self, ms: u64) -> Duration {
        self.stats.told_interval_ms.fetch_max(ms, Ordering::Relaxed);
        Duration::from_millis(ms)
    }

    async fn heartbeats(self, phase: f64, mut stop: watch::Receiver<bool>) {
        let mut every;
        loop {
            if let Some(told) = self.register().await {
                every = told;
                break;
            }
            if sleep_or_stop(Duration::from_millis(200), &mut stop).await {
                return;
            }
        }
        if sleep_or_stop(every.mul_f64(phase), &mut stop).await {
            return;
        }
        let mut send_full = true;
        loop {
            let request = {
                let s = lock(&self.agent.state);
                let live = s.tasks.iter().filter(|(_, (_, st))| !st.is_terminal());
                HeartbeatRequest {
                    task_digest: wire::task_set_digest(live.map(|(id, _)| id.as_str())),
                    assignments_version: s.version,
                    tasks: send_full.then(|| {
                        s.tasks
                            .iter()
                            .map(|(id, (seq, state))| AgentTaskReport {
                                task_id: id.clone(),
                                state: *state,
                                seq: *seq,
                            })
                            .collect()
                    }),
                }
            };
            let url = format!("{}/v1/agents/{}/heartbeat", self.master, self.agent.id);
            let answer = match self.auth(self.http.post(url)).json(&request).send().await {
                Ok(r) if r.status().is_success() => r.json::<HeartbeatResponse>().await.ok(),
                _ => None,
            };
            match answer {
                Some(a) => {
                    self.stats.heartbeats.fetch_add(1, Ordering::Relaxed);
                    if send_full {
                        self.stats.full_sets.fetch_add(1, Ordering::Relaxed);
                    }
                    send_full = a.send_full_task_set;
                    if let Some(ms) = a.heartbeat_interval_ms {
                        every = self.told(ms);
                    }
                    if a.reregister {
                        if let Some(told) = self.register().await {
                            every = told;
                        }
                        send_full = true;
                    }
                }
                None => {
                    self.stats.errors.fetch_add(1, Ordering::Relaxed);
                    send_full = true;
                }
            }
            if sleep_or_stop(every, &mut stop).await {
                return;
            }
        }
    }

    async fn polls(self, mut stop: watch::Receiver<bool>) {
        loop {
            if *stop.borrow() {
                return;
            }
            let after = lock(&self.agent.state).version;
            let url = format!(
                "{}/v1/agents/{}/assignments?after_version={after}&wait_ms=20000",
                self.master, self.agent.id
            );
            let got = tokio::select! {
                r = self.auth(self.http.get(url)).send() => r,
                _ = stop.changed() => return,
            };
            let set = match got {
                Ok(r) if r.status().is_success() => r.json::<AssignmentSet>().await.ok(),
                _ => None,
            };
            let Some(set) = set else {
                self.stats.errors.fetch_add(1, Ordering::Relaxed);
                if sleep_or_stop(Duration::from_millis(200), &mut stop).await {
                    return;
                }
                continue;
            };
            let updates = self.apply(set);
            if !updates.is_empty() {
                self.send(updates).await;
            }
        }
    }

    /// Applies an assignment set: starts new tasks (STARTING, RUNNING), counts tasks
    /// taken away, checks capacity; returns the updates to send.
    fn apply(&self, set: AssignmentSet) -> Vec<StatusUpdate> {
        let mut s = lock(&self.agent.state);
        let mut cpu = 0.0;
        let mut ram = 0;
        let mut updates = Vec::new();
        let mut in_set = std::collections::BTreeSet::new();
        for a in &set.assignments {
            let id = &a.task.task_id;
            in_set.insert(id.clone());
            if a.desired != DesiredState::Running {
                if let Some((seq, st)) = s.tasks.get_mut(id) {
                    if !st.is_terminal() {
                        self.stats.kills.fetch_add(1, Ordering::Relaxed);
                        *seq += 1;
                        *st = TaskState::Killed;
                        updates.push(update(id, *seq, TaskState::Killed));
                    }
                }
                continue;
            }
            cpu += a.task.task.resources.cpu;
            ram += a.task.task.resources.ram.bytes();
            if !s.tasks.contains_key(id) && !a.started {
                s.tasks.insert(id.clone(), (2, TaskState::Running));
                updates.push(update(id, 1, TaskState::Starting));
                updates.push(update(id, 2, TaskState::Running));
            }
        }
        let before = s.tasks.len();
        s.tasks
            .retain(|id, (_, st)| in_set.contains(id) || st.is_terminal());
        let gone = before - s.tasks.len();
        self.stats.kills.fetch_add(gone as u64, Ordering::Relaxed);
        if cpu > SIM_CPU + 1e-9 || ram > SIM_RAM {
            self.stats.overcommits.fetch_add(1, Ordering::Relaxed);
        }
        s.version = set.version;
        updates
    }

    async fn send(&self, updates: Vec<StatusUpdate>) {
        let url = format!("{}/v1/agents/{}/updates", self.master, self.agent.id);
        let batch = StatusUpdateBatch { updates };
        // Retried until acknowledged, like the agent's outbox.
        for _ in 0..100 {
            match self.auth(self.http.post(&url)).json(&batch).send().await {
                Ok(r) if r.status().is_success() => return,
                _ => {
                    self.stats.errors.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }
}

fn update(id: &str, seq: u64, state: TaskState) -> StatusUpdate {
    StatusUpdate {
        task_id: id.to_string(),
        seq,
        state,
        exit_reason: None,
        message: "simulated".to_string(),
        timestamp_ms: now_ms(),
        processes: Vec::new(),
        processes_omitted: None,
    }
}

/// Sleeps `d`; true if the fleet is stopping.
async fn sleep_or_stop(d: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    if *stop.borrow() {
        return true;
    }
    tokio::select! {
        _ = tokio::time::sleep(d) => *stop.borrow(),
        _ = stop.changed() => true,
    }
}
