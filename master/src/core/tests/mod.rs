//! Tests of the pure core: lifecycle, scheduling, faults and reconciliation, driven
//! by events and virtual time, plus a property test over random event sequences.

use std::collections::{BTreeMap, HashMap};

use drover_common::spec::JobSpec;
use drover_common::state::{DesiredState, ExitReason, TaskState};
use drover_common::wire::{
    self, AgentResources, AgentTaskReport, HeartbeatRequest, HeartbeatResponse, RegisterRequest,
    StatusUpdate,
};
use proptest::prelude::*;

use super::*;

mod agents;
mod changes;
mod clocks;
mod cron;
mod eviction_guard;
mod heartbeat;
mod invariants;
mod jobs;
mod lifecycle;
mod maintenance;
mod placement;
mod poll;
mod preemption;
mod quota;
mod reconciliation;
mod restart;
mod services;
mod snapshot;
mod update;
mod user_grants;
mod views;

const GIB: u64 = 1 << 30;

fn cfg() -> CoreConfig {
    CoreConfig {
        flapping_threshold_ms: 10_000,
        throttle_initial_ms: 1_000,
        throttle_max_ms: 4_000,
        transient_timeout_ms: 20_000,
        agent_timeout_ms: 3_000,
        heartbeat_interval_ms: 500,
        max_heartbeat_rate: 100,
        task_history_limit: 3,
        reconcile_interval_ms: 600_000,
        reconcile_backoff_initial_ms: 1_000,
        reconcile_backoff_max_ms: 8_000,
        restart_grace_ms: 6_000,
        exclusive_lease_ms: 2_000,
        missing_grace_ms: 1_000,
        eviction_guard_share_permille: 500,
        eviction_guard_window_ms: 10_000,
        agent_loss_rate: 1_000,
        preemption_reservation_ms: 30_000,
        cron_grace_ms: 60_000,
        cron_seconds: true,
        drain_round_interval_ms: 0,
        drain_round_max_tasks: 1_000,
        config_history: 2,
        quarantine_failures: 3,
        quarantine_window_ms: 60_000,
        quarantine_jobs: 2,
    }
}

fn agent_req(id: &str, cpu: f64, ram_gib: u64, attrs: &[(&str, &str)]) -> RegisterRequest {
    RegisterRequest {
        ip: None,
        protocol_version: wire::PROTOCOL_VERSION,
        agent_id: id.to_string(),
        hostname: format!("{id}.example"),
        address: format!("http://{id}:1"),
        resources: AgentResources {
            cpu,
            ram_bytes: ram_gib * GIB,
            disk_bytes: 100 * GIB,
            port_range: (31000, 31009),
        },
        attributes: attrs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        versions: None,
    }
}

fn spec(name: &str, instances: u32, service: bool, extra: &str) -> JobSpec {
    let text = format!(
        r#"{{"role":"www","environment":"prod","name":"{name}","instances":{instances},
        "service":{service},
        "task":{{"processes":[{{"name":"main","cmdline":"sleep 100"}}],
                "resources":{{"cpu":1,"ram":"1GiB","disk":"1GiB","ports":["http"]}}}}
        {extra}}}"#
    );
    serde_json::from_str(&text).unwrap()
}

struct World {
    core: Core,
    /// The monotonic clock.
    now: u64,
    /// How far the wall clock is from the monotonic one (steps move it).
    wall_skew: i64,
    seqs: HashMap<String, u64>,
    persisted: Vec<Change>,
    /// Update batches the core reported started (`Effect::UpdateBatch`).
    update_batches: Vec<(UpdateDirection, u32)>,
    /// Forget the kept limit counts before every event (the scheduler counts
    /// afresh): a shadow world to compare placements with.
    fresh_limit_counts: bool,
}

impl World {
    fn new() -> World {
        World::with(cfg())
    }

    fn with(cfg: CoreConfig) -> World {
        World {
            core: Core::new(
                cfg,
                Now {
                    mono: 1_000_000,
                    wall: 1_000_000,
                },
                7,
            ),
            now: 1_000_000,
            wall_skew: 0,
            seqs: HashMap::new(),
            persisted: Vec::new(),
            update_batches: Vec::new(),
            fresh_limit_counts: false,
        }
    }

    /// Both clocks now.
    fn at(&self) -> Now {
        Now {
            mono: self.now,
            wall: self.now.saturating_add_signed(self.wall_skew),
        }
    }

    fn handle(&mut self, e: Event) -> Output {
        if self.fresh_limit_counts {
            self.core.forget_limit_counts();
        }
        let out = self.core.handle(e, self.at());
        // The limit counts the scheduler keeps between passes equal a fresh count
        // after every event of every test.
        if let Some(drift) = self.core.limit_counts_drift() {
            panic!("limit counts drifted: {drift}");
        }
        // So do the slots' copies of their current tasks' states (drain budgets).
        if let Some(drift) = self.core.slot_drift() {
            panic!("slot states drifted: {drift}");
        }
        for e in &out.effects {
            match e {
                Effect::Persist { changes, .. } => {
                    self.persisted.extend(changes.iter().cloned());
                }
                Effect::UpdateBatch {
                    direction,
                    instances,
                } => self.update_batches.push((*direction, *instances)),
                _ => {}
            }
        }
        out
    }

    fn register(&mut self, id: &str, cpu: f64, ram: u64, attrs: &[(&str, &str)]) {
        self.handle(Event::Register(Box::new(agent_req(id, cpu, ram, attrs))))
            .reply
            .unwrap();
    }

    fn create(&mut self, s: JobSpec) -> Vec<String> {
        match self.handle(Event::CreateJob(Box::new(s))).reply.unwrap() {
            Reply::JobCreated { tasks, .. } => tasks,
            r => panic!("{r:?}"),
        }
    }

    fn report(&mut self, task: &str, state: TaskState, reason: Option<ExitReason>) {
        let agent = self.core.task(task).unwrap().agent.clone().unwrap();
        let seq = self.seqs.entry(task.to_string()).or_insert(0);
        *seq += 1;
        let u = StatusUpdate {
            task_id: task.to_string(),
            seq: *seq,
            state,
            exit_reason: reason,
            message: String::new(),
            timestamp_ms: self.at().wall,
            processes: Vec::new(),
            processes_omitted: None,
        };
        self.handle(Event::StatusReports {
            agent,
            reports: vec![u],
        })
        .reply
        .unwrap();
    }

    fn advance(&mut self, ms: u64) {
        let end = self.now + ms;
        while let Some(at) = self.core.next_wake().filter(|at| *at <= end) {
            self.now = self.now.max(at);
            self.handle(Event::Tick);
        }
        self.now = end;
        self.handle(Event::Tick);
    }

    /// Lets time pass while every reachable agent heartbeats.
    fn pass(&mut self, ms: u64) {
        let mut left = ms;
        while left > 0 {
            let step = left.min(500);
            self.advance(step);
            left -= step;
            let ids: Vec<String> = self.core.agents.iter().map(|a| a.rec.id.clone()).collect();
            for id in ids {
                self.heartbeat(&id, None);
            }
        }
    }

    fn heartbeat(&mut self, agent: &str, tasks: Option<Vec<&str>>) -> HeartbeatResponse {
        let (version, _) = self.core.agent_version(agent).unwrap_or((0, 0));
        let held: Vec<String> = self
            .core
            .assignment_set(agent)
            .map(|s| s.assignments.into_iter().map(|a| a.task.task_id).collect())
            .unwrap_or_default();
        let request = HeartbeatRequest {
            task_digest: wire::task_set_digest(held.iter().map(String::as_str)),
            assignments_version: version,
            tasks: tasks.map(|t| {
                t.into_iter()
                    .map(|id| AgentTaskReport {
                        task_id: id.to_string(),
                        state: TaskState::Running,
                        seq: 1,
                    })
                    .collect()
            }),
        };
        match self
            .handle(Event::Heartbeat {
                agent: agent.to_string(),
                request,
            })
            .reply
            .unwrap()
        {
            Reply::Heartbeat(r) => r,
            r => panic!("{r:?}"),
        }
    }

    fn state(&self, task: &str) -> TaskState {
        self.core.task(task).unwrap().status.state
    }

    fn current(&self, job: &str, instance: u32) -> String {
        self.core.jobs[job].slots[instance as usize]
            .current
            .clone()
            .unwrap()
    }

    /// The snapshot a store holding everything persisted so far would load.
    fn snapshot(&self) -> Snapshot {
        let mut jobs = BTreeMap::new();
        let mut tasks = BTreeMap::new();
        let mut agents = BTreeMap::new();
        let mut fired = BTreeMap::new();
        let mut quotas = BTreeMap::new();
        let mut grants = BTreeMap::new();
        // The writer stores the last batch number with each commit.
        let mut index = self.core.seq();
        let mut configs = BTreeMap::new();
        let mut updates = BTreeMap::new();
        for c in &self.persisted {
            match c {
                Change::PutJob(spec, key, created) => {
                    jobs.insert(
                        key.clone(),
                        JobRecord {
                            key: key.clone(),
                            spec: spec.as_ref().clone(),
                            created_ms: *created,
                        },
                    );
                }
                Change::DeleteJob(key) => {
                    jobs.remove(key);
                    fired.remove(key);
                    configs.retain(|(job, _), _| job != key);
                    updates.remove(key);
                }
                Change::PutTask(t) => {
                    tasks.insert(t.id.clone(), t.as_ref().clone());
                }
                Change::DeleteTask(id) => {
                    tasks.remove(id);
                }
                Change::PutAgent(a) => {
                    agents.insert(a.id.clone(), a.as_ref().clone());
                }
                Change::PutQuota(role, q) => match q {
                    Some(q) => {
                        quotas.insert(role.clone(), *q);
                    }
                    None => {
                        quotas.remove(role);
                    }
                },
                Change::PutCronFired(job, at) => {
                    fired.insert(job.clone(), *at);
                }
                Change::PutUserGrants(role, users) => {
                    if users.is_empty() {
                        grants.remove(role);
                    } else {
                        grants.insert(role.clone(), users.clone());
                    }
                }
                Change::Index(i) => index = *i,
                Change::PutConfig {
                    job,
                    hash,
                    spec,
                    used_ms,
                } => {
                    configs.insert(
                        (job.clone(), hash.clone()),
                        (spec.as_ref().clone(), *used_ms),
                    );
                }
                Change::DeleteConfig { job, hash } => {
                    configs.remove(&(job.clone(), hash.clone()));
                }
                Change::PutUpdate(u) => {
                    updates.insert(u.view.job.clone(), u.as_ref().clone());
                }
            }
        }
        Snapshot {
            jobs: jobs.into_values().collect(),
            tasks: tasks.into_values().collect(),
            agents: agents.into_values().collect(),
            quotas: quotas.into_iter().collect(),
            user_grants: grants.into_iter().collect(),
            cron_fired: fired.into_iter().collect(),
            index,
            configs: configs
                .into_iter()
                .map(|((job, hash), (spec, used_ms))| ConfigRecord {
                    job,
                    hash,
                    spec,
                    used_ms,
                })
                .collect(),
            updates: updates.into_values().collect(),
        }
    }

    fn run(&mut self, task: &str) {
        self.report(task, TaskState::Starting, None);
        self.report(task, TaskState::Running, None);
    }
}

const JOB: &str = "www/prod/hello";

/// Lets `ms` pass (in 500 ms steps) while only the agents `alive` heartbeat.
fn only_heartbeating(w: &mut World, alive: &[&str], ms: u64) {
    for _ in 0..ms / 500 {
        w.advance(500);
        for a in alive {
            w.heartbeat(a, None);
        }
    }
}
