//! The master's pure core: every job, task and agent in memory, and the lifecycle
//! rules, reconciliation and timers as deterministic code. `Core::handle(event, now)`
//! changes the state and returns what the runtime must do (persist, wake an agent's
//! long poll, arm the timer). No I/O, no clock, no randomness beyond a seeded counter.

mod views;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use drover_common::spec::{parse_constraint, Constraint, JobSpec};
use drover_common::state::{
    DesiredState, EventSource, ExitReason, TaskState, TaskStatus, UnixMillis,
};
use drover_common::wire::{
    self, ActionResponse, AgentResources, HeartbeatRequest, HeartbeatResponse, ProcessStatus,
    RegisterRequest, RegisterResponse, StatusAck, StatusUpdate,
};
use serde::{Deserialize, Serialize};

/// Every threshold of the lifecycle rules, in milliseconds (tests shorten them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoreConfig {
    /// A task that ran shorter than this is flapping (Aurora: 5 min).
    pub flapping_threshold_ms: u64,
    /// First THROTTLED penalty (Aurora: 30 s); doubles per consecutive flap.
    pub throttle_initial_ms: u64,
    /// Largest THROTTLED penalty (Aurora: 5 min).
    pub throttle_max_ms: u64,
    /// ASSIGNED or STARTING longer than this becomes LOST (Aurora: 5 min).
    pub transient_timeout_ms: u64,
    /// An agent silent this long is unreachable.
    pub agent_timeout_ms: u64,
    /// How often agents heartbeat.
    pub heartbeat_interval_ms: u64,
    /// Terminal tasks kept per instance.
    pub task_history_limit: usize,
    /// Period of implicit reconciliation (Mesos: e.g. 15 min).
    pub reconcile_interval_ms: u64,
    /// First retry delay of explicit reconciliation; doubles per round.
    pub reconcile_backoff_initial_ms: u64,
    /// Largest retry delay of explicit reconciliation.
    pub reconcile_backoff_max_ms: u64,
    /// After the master starts, nothing is replaced for agents that have not come
    /// back yet until this has passed.
    pub restart_grace_ms: u64,
    /// How long an agent that lost the master keeps exclusive tasks before killing them.
    pub exclusive_lease_ms: u64,
    /// A task the agent does not report is LOST only once it has been missing from
    /// its full task sets this long (a terminal update may be on its way).
    pub missing_grace_ms: u64,
}

impl Default for CoreConfig {
    fn default() -> Self {
        CoreConfig {
            flapping_threshold_ms: 5 * 60_000,
            throttle_initial_ms: 30_000,
            throttle_max_ms: 5 * 60_000,
            transient_timeout_ms: 5 * 60_000,
            agent_timeout_ms: 15_000,
            heartbeat_interval_ms: 1_000,
            task_history_limit: 10,
            reconcile_interval_ms: 15 * 60_000,
            reconcile_backoff_initial_ms: 1_000,
            reconcile_backoff_max_ms: 60_000,
            restart_grace_ms: 30_000,
            exclusive_lease_ms: 10_000,
            missing_grace_ms: 5_000,
        }
    }
}

/// A task: one run of one instance of a job. Also its stored form.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Task {
    pub id: String,
    /// The job key, `role/env/name`.
    pub job: String,
    pub instance: u32,
    /// Position in its instance's history: the first task is 0, its replacement 1...
    pub gen: u32,
    pub status: TaskStatus,
    pub desired: DesiredState,
    #[serde(default)]
    pub kill_reason: Option<ExitReason>,
    #[serde(default)]
    pub agent: Option<String>,
    #[serde(default)]
    pub ports: Vec<(String, u16)>,
    /// The agent's assignment version in which this task was placed on it.
    #[serde(default)]
    pub assigned_version: u64,
    /// The highest status seq applied.
    #[serde(default)]
    pub last_seq: Option<u64>,
    #[serde(default)]
    pub processes: Vec<ProcessStatus>,
    pub created_ms: UnixMillis,
    #[serde(default)]
    pub running_since: Option<UnixMillis>,
    /// FAILED tasks of this instance before this one.
    #[serde(default)]
    pub failures: u32,
    /// Consecutive flapping terminations of this instance before this one.
    #[serde(default)]
    pub flaps: u32,
    #[serde(default)]
    pub throttle_until: Option<UnixMillis>,
    /// When the agent last told us about this task (status or full task set).
    #[serde(skip)]
    pub last_report_ms: UnixMillis,
    /// Since when the agent's full task sets lack this task.
    #[serde(skip)]
    pub missing_since: Option<UnixMillis>,
}

/// The stored form of an agent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AgentRecord {
    pub id: String,
    pub hostname: String,
    pub address: String,
    pub resources: AgentResources,
    pub attributes: BTreeMap<String, String>,
    pub version: u64,
    pub last_heartbeat_ms: UnixMillis,
}

/// The stored form of a job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    pub key: String,
    pub spec: JobSpec,
    pub created_ms: UnixMillis,
}

/// Everything the store holds, as loaded at start.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub jobs: Vec<JobRecord>,
    pub tasks: Vec<Task>,
    pub agents: Vec<AgentRecord>,
}

/// One change for the store.
#[derive(Clone, Debug)]
pub enum Change {
    PutJob(Arc<JobSpec>, String, UnixMillis),
    DeleteJob(String),
    PutTask(Box<Task>),
    DeleteTask(String),
    PutAgent(Box<AgentRecord>),
}

/// What the core reacts to.
#[derive(Clone, Debug)]
pub enum Event {
    /// POST /v1/jobs (the spec is already validated).
    CreateJob(Box<JobSpec>),
    /// POST .../kill; `None`: every instance.
    Kill {
        job: String,
        instances: Option<Vec<u32>>,
    },
    /// POST .../restart; `None`: every instance.
    Restart {
        job: String,
        instances: Option<Vec<u32>>,
    },
    Register(Box<RegisterRequest>),
    Heartbeat {
        agent: String,
        request: HeartbeatRequest,
    },
    Updates {
        agent: String,
        updates: Vec<StatusUpdate>,
    },
    /// Time passed: fire due timers.
    Tick,
}

/// The answer to the event's sender.
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    None,
    JobCreated { job: String, tasks: Vec<String> },
    Action(ActionResponse),
    Registered(RegisterResponse),
    Heartbeat(HeartbeatResponse),
    Ack(StatusAck),
}

/// Why the core refused an event.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CoreError {
    #[error(
        "job {0} exists and has tasks that are not terminal; kill it first or pick another name"
    )]
    JobExists(String),
    #[error("no job {0}")]
    NoJob(String),
    #[error("instances {bad:?} do not exist: job {job} has instances 0-{last}")]
    BadInstances {
        job: String,
        bad: Vec<u32>,
        last: u32,
    },
    #[error("unknown agent {0}: register first")]
    UnknownAgent(String),
    #[error("protocol version {got} is not supported; this master speaks {want}")]
    Protocol { got: u32, want: u32 },
    #[error("constraint {attribute}: {message}")]
    BadConstraint { attribute: String, message: String },
}

/// What the runtime must do after an event.
#[derive(Clone, Debug)]
pub enum Effect {
    /// Commit these changes; `seq` increases with every batch.
    Persist { seq: u64, changes: Vec<Change> },
    /// The agent's assignment set changed: wake its long poll once `seq` is committed.
    Notify { agent: String },
    /// Call `handle(Event::Tick)` at this time (the earliest pending timer).
    WakeAt(UnixMillis),
}

/// The result of `handle`.
#[derive(Debug)]
pub struct Output {
    pub reply: Result<Reply, CoreError>,
    pub effects: Vec<Effect>,
}

/// One instance of a job (SwarmKit's slot): its latest task and the older ones.
#[derive(Clone, Debug, Default)]
pub(crate) struct Slot {
    pub(crate) current: Option<String>,
    /// Older tasks, oldest first.
    pub(crate) history: VecDeque<String>,
}

/// A job's constraints, parsed once.
#[derive(Clone, Debug, Default)]
pub(crate) struct JobConstraints {
    /// Attribute -> value constraint.
    pub(crate) values: Vec<(String, Constraint)>,
    /// Attribute -> at most N active tasks per value.
    pub(crate) limits: Vec<(String, u32)>,
    /// A non-negated value constraint on `dedicated`.
    pub(crate) names_dedicated: bool,
}

#[derive(Clone, Debug)]
pub(crate) struct Job {
    pub(crate) key: String,
    pub(crate) spec: Arc<JobSpec>,
    pub(crate) created_ms: UnixMillis,
    pub(crate) slots: Vec<Slot>,
    pub(crate) constraints: JobConstraints,
    /// Resource needs in scheduler units.
    pub(crate) need: Need,
    /// Candidate agents (cached for one agent index generation) and a cursor.
    pub(crate) candidates: Option<(u64, Arc<Vec<u32>>)>,
    pub(crate) cursor: usize,
    /// Why its PENDING tasks do not fit, from the last try.
    pub(crate) pending_reason: Option<String>,
}

/// What one task of a job needs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Need {
    pub(crate) cpu_milli: u64,
    pub(crate) ram: u64,
    pub(crate) disk: u64,
    pub(crate) ports: u32,
}

#[derive(Clone, Debug)]
pub(crate) struct Agent {
    pub(crate) rec: AgentRecord,
    pub(crate) cpu_milli: u64,
    pub(crate) used_cpu_milli: u64,
    pub(crate) used_ram: u64,
    pub(crate) used_disk: u64,
    pub(crate) used_ports: BTreeSet<u16>,
    pub(crate) next_port: u16,
    /// Non-terminal tasks placed here.
    pub(crate) tasks: BTreeSet<String>,
    pub(crate) reachable: bool,
    /// Heartbeated or registered since the master started.
    pub(crate) seen: bool,
    pub(crate) want_full_set: bool,
    /// The store batch that last changed its assignment set.
    pub(crate) last_change_seq: u64,
    /// The assignment set version of the last change the agent was woken for. A
    /// task the agent itself reported ending leaves the set without waking the
    /// agent's long poll (it knows already), so its version may lag `rec.version`
    /// while its task digest still matches.
    pub(crate) notified_version: u64,
}

impl Agent {
    fn new(rec: AgentRecord) -> Agent {
        let cpu_milli = cpu_to_milli(rec.resources.cpu);
        let rec_version = rec.version;
        let next_port = rec.resources.port_range.0;
        Agent {
            rec,
            cpu_milli,
            used_cpu_milli: 0,
            used_ram: 0,
            used_disk: 0,
            used_ports: BTreeSet::new(),
            next_port,
            tasks: BTreeSet::new(),
            reachable: true,
            seen: false,
            want_full_set: true,
            last_change_seq: 0,
            notified_version: rec_version,
        }
    }

    /// The agent's value of `attribute`; `host` falls back to the agent id.
    pub(crate) fn attr(&self, attribute: &str) -> Option<&str> {
        match self.rec.attributes.get(attribute) {
            Some(v) => Some(v.as_str()),
            None if attribute == "host" => Some(self.rec.id.as_str()),
            None => None,
        }
    }

    pub(crate) fn port_count(&self) -> u32 {
        let (lo, hi) = self.rec.resources.port_range;
        if hi < lo {
            0
        } else {
            u32::from(hi - lo) + 1
        }
    }
}

/// A timer; stale ones are recognised when they fire and ignored.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    /// The task entered `state` (ASSIGNED or STARTING) and may be stuck there.
    Transient { task: String, state: TaskState },
    /// The task's THROTTLED penalty ends.
    Throttle { task: String },
    /// The task's agent was unreachable; the partition policy's wait is over.
    Partition { agent: String, task: String },
    /// Check every agent's last heartbeat.
    AgentSweep,
    /// Start a periodic (implicit) reconciliation.
    Reconcile,
    /// Next round of reconciliation `id`.
    ReconcileRound { id: u64 },
}

/// A reconciliation in progress (Mesos's algorithm).
#[derive(Clone, Debug)]
struct Reconciliation {
    id: u64,
    start: UnixMillis,
    backoff_ms: u64,
}

/// The master's state. See the module docs.
pub struct Core {
    pub(crate) cfg: CoreConfig,
    pub(crate) jobs: BTreeMap<String, Job>,
    pub(crate) tasks: HashMap<String, Task>,
    pub(crate) agents: Vec<Agent>,
    pub(crate) agent_idx: HashMap<String, u32>,
    /// Attribute -> value -> agents, rebuilt when agents change.
    pub(crate) attr_index: HashMap<String, HashMap<String, Vec<u32>>>,
    /// Agents without a `dedicated` attribute.
    pub(crate) open_agents: Arc<Vec<u32>>,
    pub(crate) index_gen: u64,
    index_dirty: bool,
    /// PENDING tasks to place, in order.
    pub(crate) queue: VecDeque<String>,
    /// Per job, PENDING tasks that did not fit, oldest first; retried when capacity
    /// changes (one failed try blocks the whole job: its tasks are identical).
    pub(crate) blocked: BTreeMap<String, VecDeque<String>>,
    capacity_changed: bool,
    timers: BinaryHeap<Reverse<(UnixMillis, Timer)>>,
    rng: u64,
    seq: u64,
    start_ms: UnixMillis,
    recon: Option<Reconciliation>,
    next_recon_id: u64,
    // Per-event scratch.
    dirty_tasks: BTreeSet<String>,
    deleted_tasks: Vec<String>,
    dirty_agents: BTreeSet<u32>,
    bumped_agents: BTreeSet<u32>,
    /// Agents whose set changed in this event only by tasks they reported ending.
    quiet_agents: BTreeSet<u32>,
    job_changes: Vec<Change>,
}

pub(crate) fn cpu_to_milli(cpu: f64) -> u64 {
    if cpu.is_finite() && cpu > 0.0 {
        (cpu * 1000.0).round() as u64
    } else {
        0
    }
}

/// Parses a job's constraints, adding the implicit `host: limit:1` of services.
fn parse_constraints(spec: &JobSpec) -> Result<JobConstraints, CoreError> {
    let mut out = JobConstraints::default();
    for (attribute, expr) in &spec.constraints {
        let c = parse_constraint(expr).map_err(|e| CoreError::BadConstraint {
            attribute: attribute.clone(),
            message: e.to_string(),
        })?;
        match c {
            Constraint::Limit(n) => out.limits.push((attribute.clone(), n)),
            Constraint::Value { negated, .. } => {
                if attribute == "dedicated" && !negated {
                    out.names_dedicated = true;
                }
                out.values.push((attribute.clone(), c));
            }
        }
    }
    if spec.service && !spec.constraints.contains_key("host") {
        out.limits.push(("host".to_string(), 1));
    }
    Ok(out)
}

fn need_of(spec: &JobSpec) -> Need {
    let r = &spec.task.resources;
    Need {
        cpu_milli: cpu_to_milli(r.cpu),
        ram: r.ram.bytes(),
        disk: r.disk.bytes(),
        ports: r.ports.len() as u32,
    }
}

impl Core {
    /// An empty master started at `now`; `seed` makes task ids unique across runs.
    pub fn new(cfg: CoreConfig, now: UnixMillis, seed: u64) -> Core {
        let mut core = Core {
            cfg,
            jobs: BTreeMap::new(),
            tasks: HashMap::new(),
            agents: Vec::new(),
            agent_idx: HashMap::new(),
            attr_index: HashMap::new(),
            open_agents: Arc::new(Vec::new()),
            index_gen: 0,
            index_dirty: true,
            queue: VecDeque::new(),
            blocked: BTreeMap::new(),
            capacity_changed: false,
            timers: BinaryHeap::new(),
            rng: seed ^ 0x9e37_79b9_7f4a_7c15,
            seq: 0,
            start_ms: now,
            recon: None,
            next_recon_id: 1,
            dirty_tasks: BTreeSet::new(),
            deleted_tasks: Vec::new(),
            dirty_agents: BTreeSet::new(),
            bumped_agents: BTreeSet::new(),
            quiet_agents: BTreeSet::new(),
            job_changes: Vec::new(),
        };
        core.push_timer(now + core.sweep_interval(), Timer::AgentSweep);
        core.push_timer(now + core.cfg.reconcile_interval_ms, Timer::Reconcile);
        core
    }

    /// A master restarted at `now` with the stored state. Agents count as alive from
    /// `now` on; nothing is replaced because of them before the restart grace.
    pub fn load(cfg: CoreConfig, snapshot: Snapshot, now: UnixMillis, seed: u64) -> Core {
        let mut core = Core::new(cfg, now, seed);
        for rec in snapshot.agents {
            let mut rec = rec;
            rec.last_heartbeat_ms = now;
            let idx = core.agents.len() as u32;
            core.agent_idx.insert(rec.id.clone(), idx);
            core.agents.push(Agent::new(rec));
        }
        for job in snapshot.jobs {
            let constraints = parse_constraints(&job.spec).unwrap_or_default();
            let need = need_of(&job.spec);
            let slots = vec![Slot::default(); job.spec.instances as usize];
            core.jobs.insert(
                job.key.clone(),
                Job {
                    key: job.key,
                    spec: Arc::new(job.spec),
                    created_ms: job.created_ms,
                    slots,
                    constraints,
                    need,
                    candidates: None,
                    cursor: 0,
                    pending_reason: None,
                },
            );
        }
        let mut tasks = snapshot.tasks;
        tasks.sort_by(|a, b| (&a.job, a.instance, a.gen).cmp(&(&b.job, b.instance, b.gen)));
        let grace_until = now + core.cfg.restart_grace_ms;
        for task in tasks {
            let Some(job) = core.jobs.get_mut(&task.job) else {
                continue;
            };
            let Some(slot) = job.slots.get_mut(task.instance as usize) else {
                continue;
            };
            if let Some(prev) = slot.current.take() {
                slot.history.push_back(prev);
            }
            slot.current = Some(task.id.clone());
            let state = task.status.state;
            if state.is_on_agent() {
                if let Some(&idx) = task.agent.as_ref().and_then(|a| core.agent_idx.get(a)) {
                    let need = job.need;
                    let agent = &mut core.agents[idx as usize];
                    agent.used_cpu_milli += need.cpu_milli;
                    agent.used_ram += need.ram;
                    agent.used_disk += need.disk;
                    for (_, p) in &task.ports {
                        agent.used_ports.insert(*p);
                    }
                    agent.tasks.insert(task.id.clone());
                }
            }
            match state {
                TaskState::Pending => core.queue.push_back(task.id.clone()),
                TaskState::Throttled => {
                    let at = task.throttle_until.unwrap_or(now).max(now);
                    core.push_timer(
                        at,
                        Timer::Throttle {
                            task: task.id.clone(),
                        },
                    );
                }
                TaskState::Assigned | TaskState::Starting => {
                    let at = (task.status.since() + core.cfg.transient_timeout_ms).max(grace_until);
                    core.push_timer(
                        at,
                        Timer::Transient {
                            task: task.id.clone(),
                            state,
                        },
                    );
                }
                _ => {}
            }
            core.tasks.insert(task.id.clone(), task);
        }
        if !core.agents.is_empty() {
            core.start_reconciliation(now);
        }
        core
    }

    fn sweep_interval(&self) -> u64 {
        (self.cfg.agent_timeout_ms / 4)
            .min(self.cfg.heartbeat_interval_ms)
            .max(50)
    }

    fn push_timer(&mut self, at: UnixMillis, timer: Timer) {
        self.timers.push(Reverse((at, timer)));
    }

    /// The earliest armed timer.
    pub fn next_wake(&self) -> Option<UnixMillis> {
        self.timers.peek().map(|Reverse((at, _))| *at)
    }

    /// The last store batch sequence number handed out.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The agent's assignment set version and the store batch that last changed it.
    pub fn agent_version(&self, agent: &str) -> Option<(u64, u64)> {
        let idx = *self.agent_idx.get(agent)?;
        let a = &self.agents[idx as usize];
        Some((a.rec.version, a.last_change_seq))
    }

    /// The version of the agent's latest assignment set change that should wake its
    /// long poll: a poll that has seen it waits, even if tasks the agent reported
    /// ending have left the set since (they are served with the next answer).
    pub fn agent_notified_version(&self, agent: &str) -> Option<u64> {
        let idx = *self.agent_idx.get(agent)?;
        Some(self.agents[idx as usize].notified_version)
    }

    /// Number of tasks held (for metrics and tests).
    pub fn task_count(&self) -> usize {
        self.tasks.len()
    }

    /// A task by id.
    pub fn task(&self, id: &str) -> Option<&Task> {
        self.tasks.get(id)
    }

    fn next_task_id(&mut self, name: &str, instance: u32) -> String {
        let short: String = name.chars().take(24).collect();
        loop {
            // splitmix64
            self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.rng;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            let id = format!("{short}-{instance}-{:012x}", z & 0xffff_ffff_ffff);
            if !self.tasks.contains_key(&id) {
                return id;
            }
        }
    }

    /// Applies one event at `now`.
    pub fn handle(&mut self, event: Event, now: UnixMillis) -> Output {
        let reply = match event {
            Event::CreateJob(spec) => self.create_job(*spec, now),
            Event::Kill { job, instances } => {
                self.stop_instances(&job, instances, TaskState::Killing, now)
            }
            Event::Restart { job, instances } => {
                self.stop_instances(&job, instances, TaskState::Restarting, now)
            }
            Event::Register(req) => self.register(*req, now),
            Event::Heartbeat { agent, request } => self.heartbeat(&agent, request, now),
            Event::Updates { agent, updates } => self.updates(&agent, updates, now),
            Event::Tick => {
                self.tick(now);
                Ok(Reply::None)
            }
        };
        self.schedule(now);
        let effects = self.finish();
        Output { reply, effects }
    }

    fn finish(&mut self) -> Vec<Effect> {
        let mut changes = std::mem::take(&mut self.job_changes);
        for id in std::mem::take(&mut self.dirty_tasks) {
            if let Some(t) = self.tasks.get(&id) {
                changes.push(Change::PutTask(Box::new(t.clone())));
            }
        }
        for id in std::mem::take(&mut self.deleted_tasks) {
            changes.push(Change::DeleteTask(id));
        }
        for idx in std::mem::take(&mut self.dirty_agents) {
            changes.push(Change::PutAgent(Box::new(
                self.agents[idx as usize].rec.clone(),
            )));
        }
        let mut effects = Vec::new();
        if !changes.is_empty() {
            self.seq += 1;
            effects.push(Effect::Persist {
                seq: self.seq,
                changes,
            });
        }
        for idx in std::mem::take(&mut self.bumped_agents) {
            let agent = &mut self.agents[idx as usize];
            agent.last_change_seq = self.seq;
            effects.push(Effect::Notify {
                agent: agent.rec.id.clone(),
            });
        }
        // Served with the next answer the agent gets anyway, never before committed.
        for idx in std::mem::take(&mut self.quiet_agents) {
            self.agents[idx as usize].last_change_seq = self.seq;
        }
        if let Some(at) = self.next_wake() {
            effects.push(Effect::WakeAt(at));
        }
        effects
    }

    /// The agent's assignment set changes in this event.
    fn bump_agent(&mut self, idx: u32) -> u64 {
        if self.bumped_agents.insert(idx) {
            if !self.quiet_agents.contains(&idx) {
                self.agents[idx as usize].rec.version += 1;
            }
            self.dirty_agents.insert(idx);
        }
        let a = &mut self.agents[idx as usize];
        a.notified_version = a.rec.version;
        a.rec.version
    }

    /// The agent's assignment set changes in this event only because a task it
    /// reported ending leaves it: a new version, but no wake-up of its long poll
    /// (at 500 endings per second, each wake-up resent the agent's whole set).
    fn bump_agent_quietly(&mut self, idx: u32) {
        if !self.bumped_agents.contains(&idx) && self.quiet_agents.insert(idx) {
            self.agents[idx as usize].rec.version += 1;
            self.dirty_agents.insert(idx);
        }
    }

    fn mark(&mut self, task: &str) {
        if !self.dirty_tasks.contains(task) {
            self.dirty_tasks.insert(task.to_string());
        }
    }

    // ------------------------------------------------------------ jobs

    fn create_job(&mut self, spec: JobSpec, now: UnixMillis) -> Result<Reply, CoreError> {
        let key = spec.key().to_string();
        let constraints = parse_constraints(&spec)?;
        if let Some(old) = self.jobs.get(&key) {
            let active = old.slots.iter().any(|s| {
                s.current.iter().chain(s.history.iter()).any(|id| {
                    self.tasks
                        .get(id)
                        .is_some_and(|t| !t.status.state.is_terminal())
                })
            });
            if active {
                return Err(CoreError::JobExists(key));
            }
            self.drop_job(&key);
        }
        let need = need_of(&spec);
        let spec = Arc::new(spec);
        self.job_changes
            .push(Change::PutJob(spec.clone(), key.clone(), now));
        let mut job = Job {
            key: key.clone(),
            spec: spec.clone(),
            created_ms: now,
            slots: vec![Slot::default(); spec.instances as usize],
            constraints,
            need,
            candidates: None,
            cursor: 0,
            pending_reason: None,
        };
        let mut ids = Vec::with_capacity(spec.instances as usize);
        for instance in 0..spec.instances {
            let id = self.next_task_id(&spec.name, instance);
            let task = new_task(&id, &key, instance, 0, now, TaskState::Pending, "created");
            job.slots[instance as usize].current = Some(id.clone());
            self.tasks.insert(id.clone(), task);
            self.queue.push_back(id.clone());
            self.mark(&id);
            ids.push(id);
        }
        self.jobs.insert(key.clone(), job);
        Ok(Reply::JobCreated {
            job: key,
            tasks: ids,
        })
    }

    /// Removes a fully terminal job with its tasks.
    fn drop_job(&mut self, key: &str) {
        if let Some(job) = self.jobs.remove(key) {
            for slot in job.slots {
                for id in slot.current.into_iter().chain(slot.history) {
                    self.tasks.remove(&id);
                    self.dirty_tasks.remove(&id);
                    self.deleted_tasks.push(id);
                }
            }
            self.blocked.remove(key);
            self.job_changes.push(Change::DeleteJob(key.to_string()));
        }
    }

    fn instances_of(&self, job: &str, wanted: Option<Vec<u32>>) -> Result<Vec<u32>, CoreError> {
        let j = self
            .jobs
            .get(job)
            .ok_or_else(|| CoreError::NoJob(job.to_string()))?;
        let n = j.slots.len() as u32;
        match wanted {
            None => Ok((0..n).collect()),
            Some(list) => {
                let bad: Vec<u32> = list.iter().copied().filter(|i| *i >= n).collect();
                if bad.is_empty() {
                    Ok(list)
                } else {
                    Err(CoreError::BadInstances {
                        job: job.to_string(),
                        bad,
                        last: n.saturating_sub(1),
                    })
                }
            }
        }
    }

    fn current_of(&self, job: &str, instance: u32) -> Option<String> {
        self.jobs
            .get(job)?
            .slots
            .get(instance as usize)?
            .current
            .clone()
    }

    /// Asks a task to stop: `via` is KILLING or RESTARTING for placed tasks; tasks not
    /// placed become KILLED at once. Returns whether anything changed.
    fn stop_task(
        &mut self,
        id: &str,
        via: TaskState,
        source: EventSource,
        message: &str,
        now: UnixMillis,
    ) -> bool {
        let Some(task) = self.tasks.get_mut(id) else {
            return false;
        };
        let state = task.status.state;
        if state.is_terminal() || state.is_stopping() {
            return false;
        }
        task.desired = DesiredState::Shutdown;
        task.kill_reason = Some(ExitReason::KilledByRequest);
        if matches!(state, TaskState::Pending | TaskState::Throttled) {
            let _ = task.status.transition(
                TaskState::Killed,
                Some(ExitReason::KilledByRequest),
                now,
                source,
                message,
            );
            self.mark(id);
            return true;
        }
        if task
            .status
            .transition(via, None, now, source, message)
            .is_err()
        {
            return false;
        }
        let agent = task.agent.clone();
        self.mark(id);
        if let Some(idx) = agent.and_then(|a| self.agent_idx.get(&a).copied()) {
            self.bump_agent(idx);
        }
        true
    }

    /// Kill (`via` KILLING) or restart (`via` RESTARTING: each stopped task gets a
    /// replacement) the current tasks of `instances` (all when None). Answers the
    /// tasks stopped, or for a restart the replacements created.
    fn stop_instances(
        &mut self,
        job: &str,
        instances: Option<Vec<u32>>,
        via: TaskState,
        now: UnixMillis,
    ) -> Result<Reply, CoreError> {
        let restart = via == TaskState::Restarting;
        let message = if restart {
            "restart requested"
        } else {
            "killed by request"
        };
        let mut tasks = Vec::new();
        // The current task is looked up as each instance comes: an instance named
        // twice meets the task the first round left there.
        for i in self.instances_of(job, instances)? {
            let Some(id) = self.current_of(job, i) else {
                continue;
            };
            // A task already ended or stopping is left alone (stop_task says false).
            if !self.stop_task(&id, via, EventSource::Operator, message, now) {
                continue;
            }
            if !restart {
                tasks.push(id);
            } else if let Some(new_id) = self.create_replacement(&id, now, None, "restart") {
                tasks.push(new_id);
            }
        }
        Ok(Reply::Action(ActionResponse {
            job: job.to_string(),
            tasks,
        }))
    }

    /// Creates the next task of `old`'s instance: PENDING, or THROTTLED until
    /// `throttle` ends. The old task moves into the history.
    fn create_replacement(
        &mut self,
        old_id: &str,
        now: UnixMillis,
        throttle: Option<(u64, u32)>,
        why: &str,
    ) -> Option<String> {
        let old = self.tasks.get(old_id)?;
        let (job_key, instance, gen, failures) =
            (old.job.clone(), old.instance, old.gen, old.failures);
        let failed_now = u32::from(old.status.state == TaskState::Failed);
        let name = self.jobs.get(&job_key)?.spec.name.clone();
        let id = self.next_task_id(&name, instance);
        let (initial, flaps, until) = match throttle {
            Some((penalty, flaps)) => (TaskState::Throttled, flaps, Some(now + penalty)),
            None => (TaskState::Pending, 0, None),
        };
        let message = match until {
            Some(u) => format!("{why}; throttled for {} ms (flapping)", u - now),
            None => format!("{why}; replaces {old_id}"),
        };
        let mut task = new_task(&id, &job_key, instance, gen + 1, now, initial, &message);
        task.failures = failures + failed_now;
        task.flaps = flaps;
        task.throttle_until = until;
        self.tasks.insert(id.clone(), task);
        self.mark(&id);
        match until {
            Some(at) => self.push_timer(at, Timer::Throttle { task: id.clone() }),
            None => self.queue.push_back(id.clone()),
        }
        let limit = self.cfg.task_history_limit;
        let job = self.jobs.get_mut(&job_key)?;
        let slot = job.slots.get_mut(instance as usize)?;
        if let Some(prev) = slot.current.replace(id.clone()) {
            slot.history.push_back(prev);
        }
        // Prune the oldest terminal tasks beyond the limit.
        let terminal: Vec<String> = slot
            .history
            .iter()
            .filter(|h| {
                self.tasks
                    .get(*h)
                    .is_none_or(|t| t.status.state.is_terminal())
            })
            .cloned()
            .collect();
        if terminal.len() > limit {
            let drop: HashSet<&String> = terminal[..terminal.len() - limit].iter().collect();
            slot.history.retain(|h| !drop.contains(h));
            for h in drop {
                self.tasks.remove(h);
                self.dirty_tasks.remove(h);
                self.deleted_tasks.push(h.clone());
            }
        }
        Some(id)
    }

    // ------------------------------------------------------------ task endings

    /// Moves a task to a terminal state and frees its resources.
    fn end_task(
        &mut self,
        id: &str,
        to: TaskState,
        reason: Option<ExitReason>,
        source: EventSource,
        message: &str,
        now: UnixMillis,
    ) -> bool {
        let Some(task) = self.tasks.get_mut(id) else {
            return false;
        };
        if task
            .status
            .transition(to, reason, now, source, message)
            .is_err()
        {
            return false;
        }
        task.missing_since = None;
        let agent = task.agent.clone();
        let ports: Vec<u16> = task.ports.iter().map(|(_, p)| *p).collect();
        let need = self.jobs.get(&task.job).map(|j| j.need).unwrap_or_default();
        self.mark(id);
        if let Some(idx) = agent.and_then(|a| self.agent_idx.get(&a).copied()) {
            let a = &mut self.agents[idx as usize];
            if a.tasks.remove(id) {
                a.used_cpu_milli = a.used_cpu_milli.saturating_sub(need.cpu_milli);
                a.used_ram = a.used_ram.saturating_sub(need.ram);
                a.used_disk = a.used_disk.saturating_sub(need.disk);
                for p in ports {
                    a.used_ports.remove(&p);
                }
                self.capacity_changed = true;
            }
            if source == EventSource::Executor {
                self.bump_agent_quietly(idx);
            } else {
                self.bump_agent(idx);
            }
        }
        true
    }

    /// After a task the master wanted running ended: replace it as its job says.
    fn replace_after_end(&mut self, id: &str, now: UnixMillis) {
        let Some(task) = self.tasks.get(id) else {
            return;
        };
        if task.desired != DesiredState::Running {
            return;
        }
        let Some(job) = self.jobs.get(&task.job) else {
            return;
        };
        if job
            .slots
            .get(task.instance as usize)
            .and_then(|s| s.current.as_deref())
            != Some(id)
        {
            return;
        }
        let state = task.status.state;
        let spec = &job.spec;
        // Every ending counts towards flapping except the loss of the whole agent: a
        // task whose host died is replaced at once, however short it ran.
        let natural = task.status.exit_reason != Some(ExitReason::AgentLost);
        let replace = if spec.service {
            true
        } else {
            match state {
                TaskState::Finished => false,
                TaskState::Failed => {
                    spec.max_task_failures == 0 || task.failures + 1 < spec.max_task_failures
                }
                _ => true,
            }
        };
        if !replace {
            return;
        }
        let ran = task.running_since.map(|s| now.saturating_sub(s));
        let flapping = natural && ran.is_none_or(|r| r < self.cfg.flapping_threshold_ms);
        let throttle = if flapping {
            let shift = task.flaps.min(20);
            let penalty = self
                .cfg
                .throttle_initial_ms
                .saturating_mul(1u64 << shift)
                .min(self.cfg.throttle_max_ms);
            Some((penalty, task.flaps + 1))
        } else {
            None
        };
        let why = format!("{} ended {state}", id);
        self.create_replacement(id, now, throttle, &why);
    }

    /// LOST by the master's decision (timeouts, agent loss, reconciliation), then
    /// replaced.
    fn lose_task(&mut self, id: &str, reason: ExitReason, source: EventSource, now: UnixMillis) {
        let message = reason.to_string();
        let stopping = self
            .tasks
            .get(id)
            .is_some_and(|t| t.status.state.is_stopping());
        let to = if stopping {
            TaskState::Killed
        } else {
            TaskState::Lost
        };
        let reason = if stopping { None } else { Some(reason) };
        if self.end_task(id, to, reason, source, &message, now) {
            self.replace_after_end(id, now);
        }
    }

    // ------------------------------------------------------------ agents

    fn register(&mut self, req: RegisterRequest, now: UnixMillis) -> Result<Reply, CoreError> {
        if req.protocol_version != wire::PROTOCOL_VERSION {
            return Err(CoreError::Protocol {
                got: req.protocol_version,
                want: wire::PROTOCOL_VERSION,
            });
        }
        let idx = match self.agent_idx.get(&req.agent_id) {
            Some(&idx) => {
                let a = &mut self.agents[idx as usize];
                a.rec.hostname = req.hostname;
                a.rec.address = req.address;
                if a.rec.attributes != req.attributes {
                    self.index_dirty = true;
                }
                a.rec.attributes = req.attributes;
                a.cpu_milli = cpu_to_milli(req.resources.cpu);
                a.rec.resources = req.resources;
                idx
            }
            None => {
                let idx = self.agents.len() as u32;
                self.agent_idx.insert(req.agent_id.clone(), idx);
                self.agents.push(Agent::new(AgentRecord {
                    id: req.agent_id.clone(),
                    hostname: req.hostname,
                    address: req.address,
                    resources: req.resources,
                    attributes: req.attributes,
                    version: 0,
                    last_heartbeat_ms: now,
                }));
                self.index_dirty = true;
                idx
            }
        };
        let a = &mut self.agents[idx as usize];
        a.rec.last_heartbeat_ms = now;
        a.reachable = true;
        a.seen = true;
        a.want_full_set = true;
        self.capacity_changed = true;
        self.dirty_agents.insert(idx);
        Ok(Reply::Registered(RegisterResponse {
            agent_id: req.agent_id,
            heartbeat_interval_ms: self.cfg.heartbeat_interval_ms,
            exclusive_lease_ms: Some(self.cfg.exclusive_lease_ms),
        }))
    }

    fn heartbeat(
        &mut self,
        agent: &str,
        req: HeartbeatRequest,
        now: UnixMillis,
    ) -> Result<Reply, CoreError> {
        let Some(&idx) = self.agent_idx.get(agent) else {
            return Ok(Reply::Heartbeat(HeartbeatResponse {
                send_full_task_set: false,
                reregister: true,
            }));
        };
        {
            let a = &mut self.agents[idx as usize];
            a.rec.last_heartbeat_ms = now;
            a.seen = true;
            if !a.reachable {
                a.reachable = true;
                a.want_full_set = true;
                self.capacity_changed = true;
            }
        }
        if let Some(reports) = req.tasks {
            self.reconcile_agent(idx, &reports, req.assignments_version, now);
        }
        let a = &mut self.agents[idx as usize];
        let digest = wire::task_set_digest(a.tasks.iter().map(String::as_str));
        let send = a.want_full_set
            || (digest != req.task_digest && req.assignments_version >= a.notified_version);
        Ok(Reply::Heartbeat(HeartbeatResponse {
            send_full_task_set: send,
            reregister: false,
        }))
    }

    /// Compares the agent's full task set with what the master expects there.
    fn reconcile_agent(
        &mut self,
        idx: u32,
        reports: &[wire::AgentTaskReport],
        agent_version: u64,
        now: UnixMillis,
    ) {
        let held: HashMap<&str, TaskState> = reports
            .iter()
            .map(|r| (r.task_id.as_str(), r.state))
            .collect();
        let expected: Vec<String> = self.agents[idx as usize].tasks.iter().cloned().collect();
        let mut still_missing = false;
        for id in expected {
            let Some(task) = self.tasks.get_mut(&id) else {
                continue;
            };
            match held.get(id.as_str()) {
                Some(state) if !state.is_terminal() => {
                    task.last_report_ms = now;
                    task.missing_since = None;
                }
                // Terminal on the agent: its update is on the way.
                Some(_) => task.last_report_ms = now,
                None => {
                    if agent_version < task.assigned_version {
                        continue; // the agent has not seen it yet
                    }
                    let since = *task.missing_since.get_or_insert(now);
                    if task.status.state.is_stopping() {
                        self.lose_task(
                            &id,
                            ExitReason::KilledByRequest,
                            EventSource::Reconciliation,
                            now,
                        );
                    } else if now.saturating_sub(since) >= self.cfg.missing_grace_ms {
                        self.lose_task(
                            &id,
                            ExitReason::ExecutorLost,
                            EventSource::Reconciliation,
                            now,
                        );
                    } else {
                        still_missing = true;
                    }
                }
            }
        }
        let a = &mut self.agents[idx as usize];
        a.want_full_set = still_missing;
    }

    fn updates(
        &mut self,
        agent: &str,
        updates: Vec<StatusUpdate>,
        now: UnixMillis,
    ) -> Result<Reply, CoreError> {
        if !self.agent_idx.contains_key(agent) {
            return Err(CoreError::UnknownAgent(agent.to_string()));
        }
        let mut acked: Vec<(String, u64)> = Vec::new();
        for u in updates {
            match acked.iter_mut().find(|(id, _)| *id == u.task_id) {
                Some(entry) => entry.1 = entry.1.max(u.seq),
                None => acked.push((u.task_id.clone(), u.seq)),
            }
            self.apply_update(agent, u, now);
        }
        Ok(Reply::Ack(StatusAck { acked }))
    }

    fn apply_update(&mut self, agent: &str, u: StatusUpdate, now: UnixMillis) {
        let Some(task) = self.tasks.get_mut(&u.task_id) else {
            return;
        };
        if task.agent.as_deref() != Some(agent) {
            return;
        }
        if task.last_seq.is_some_and(|l| u.seq <= l) {
            return;
        }
        task.last_seq = Some(u.seq);
        task.last_report_ms = now;
        task.missing_since = None;
        if !u.processes.is_empty() {
            task.processes = u.processes;
        }
        let from = task.status.state;
        let id = u.task_id;
        self.mark(&id);
        let Some(task) = self.tasks.get_mut(&id) else {
            return;
        };
        match u.state {
            TaskState::Starting if from == TaskState::Assigned => {
                let _ = task.status.transition(
                    TaskState::Starting,
                    None,
                    now,
                    EventSource::Executor,
                    &u.message,
                );
                self.push_timer(
                    now + self.cfg.transient_timeout_ms,
                    Timer::Transient {
                        task: id,
                        state: TaskState::Starting,
                    },
                );
            }
            TaskState::Running
                if matches!(from, TaskState::Assigned | TaskState::Starting)
                    && task
                        .status
                        .transition(
                            TaskState::Running,
                            None,
                            now,
                            EventSource::Executor,
                            &u.message,
                        )
                        .is_ok() =>
            {
                task.running_since = Some(now);
            }
            s if s.is_terminal() && !from.is_terminal() => {
                let (to, reason) = if from.is_stopping() {
                    let reason = task.kill_reason.clone().or(u.exit_reason);
                    (TaskState::Killed, reason)
                } else {
                    (s, u.exit_reason)
                };
                if self.end_task(&id, to, reason, EventSource::Executor, &u.message, now) {
                    self.replace_after_end(&id, now);
                }
            }
            _ => {}
        }
    }

    // ------------------------------------------------------------ timers

    fn tick(&mut self, now: UnixMillis) {
        while let Some(Reverse((at, _))) = self.timers.peek() {
            if *at > now {
                break;
            }
            let Some(Reverse((_, timer))) = self.timers.pop() else {
                break;
            };
            self.fire(timer, now);
        }
    }

    fn fire(&mut self, timer: Timer, now: UnixMillis) {
        match timer {
            Timer::Transient { task, state } => {
                let Some(t) = self.tasks.get(&task) else {
                    return;
                };
                if t.status.state != state {
                    return;
                }
                let due = t.status.since() + self.cfg.transient_timeout_ms;
                if due > now {
                    self.push_timer(due, Timer::Transient { task, state });
                    return;
                }
                self.lose_task(
                    &task,
                    ExitReason::TransientStateTimeout { state },
                    EventSource::Master,
                    now,
                );
            }
            Timer::Throttle { task } => {
                let Some(t) = self.tasks.get_mut(&task) else {
                    return;
                };
                if t.status.state != TaskState::Throttled {
                    return;
                }
                if t.status
                    .transition(
                        TaskState::Pending,
                        None,
                        now,
                        EventSource::Master,
                        "penalty over",
                    )
                    .is_ok()
                {
                    self.mark(&task);
                    self.queue.push_back(task);
                }
            }
            Timer::Partition { agent, task } => {
                let Some(&idx) = self.agent_idx.get(&agent) else {
                    return;
                };
                if self.agents[idx as usize].reachable {
                    return;
                }
                let Some(t) = self.tasks.get(&task) else {
                    return;
                };
                if t.agent.as_deref() != Some(agent.as_str()) || t.status.state.is_terminal() {
                    return;
                }
                self.lose_task(&task, ExitReason::AgentLost, EventSource::Master, now);
            }
            Timer::AgentSweep => {
                self.sweep_agents(now);
                self.push_timer(now + self.sweep_interval(), Timer::AgentSweep);
            }
            Timer::Reconcile => {
                self.start_reconciliation(now);
                self.push_timer(now + self.cfg.reconcile_interval_ms, Timer::Reconcile);
            }
            Timer::ReconcileRound { id } => self.reconcile_round(id, now),
        }
    }

    fn sweep_agents(&mut self, now: UnixMillis) {
        let grace_until = self.start_ms + self.cfg.restart_grace_ms;
        for idx in 0..self.agents.len() {
            let a = &mut self.agents[idx];
            if !a.reachable
                || now.saturating_sub(a.rec.last_heartbeat_ms) <= self.cfg.agent_timeout_ms
            {
                continue;
            }
            a.reachable = false;
            let last = a.rec.last_heartbeat_ms;
            let agent_id = a.rec.id.clone();
            let tasks: Vec<String> = a.tasks.iter().cloned().collect();
            for id in tasks {
                let Some(t) = self.tasks.get(&id) else {
                    continue;
                };
                let Some(job) = self.jobs.get(&t.job) else {
                    continue;
                };
                let policy = &job.spec.partition_policy;
                if !policy.reschedule {
                    continue;
                }
                let mut at = now + policy.delay.get().as_millis() as u64;
                if policy.exclusive {
                    at = at.max(last + self.cfg.exclusive_lease_ms + kill_time_ms(&job.spec));
                }
                if !self.agents[idx].seen {
                    at = at.max(grace_until);
                }
                self.push_timer(
                    at,
                    Timer::Partition {
                        agent: agent_id.clone(),
                        task: id,
                    },
                );
            }
        }
    }

    fn start_reconciliation(&mut self, now: UnixMillis) {
        let id = self.next_recon_id;
        self.next_recon_id += 1;
        self.recon = Some(Reconciliation {
            id,
            start: now,
            backoff_ms: self.cfg.reconcile_backoff_initial_ms,
        });
        for a in &mut self.agents {
            if !a.tasks.is_empty() || !a.seen {
                a.want_full_set = true;
            }
        }
        self.push_timer(
            now + self.cfg.reconcile_backoff_initial_ms,
            Timer::ReconcileRound { id },
        );
    }

    fn reconcile_round(&mut self, id: u64, now: UnixMillis) {
        let Some(recon) = self.recon.clone() else {
            return;
        };
        if recon.id != id {
            return; // a newer reconciliation replaced this one
        }
        let mut remaining = false;
        for a in &mut self.agents {
            let behind = a.tasks.iter().any(|t| {
                self.tasks
                    .get(t)
                    .is_some_and(|t| t.last_report_ms < recon.start)
            });
            if behind {
                a.want_full_set = true;
                remaining = true;
            }
        }
        if !remaining {
            self.recon = None;
            return;
        }
        let backoff = (recon.backoff_ms * 2).min(self.cfg.reconcile_backoff_max_ms);
        self.recon = Some(Reconciliation {
            backoff_ms: backoff,
            ..recon
        });
        self.push_timer(now + backoff, Timer::ReconcileRound { id });
    }

    /// Whether a reconciliation is in progress.
    pub fn reconciling(&self) -> bool {
        self.recon.is_some()
    }

    // ------------------------------------------------------------ scheduling glue

    pub(crate) fn rebuild_index_if_dirty(&mut self) {
        if !self.index_dirty {
            return;
        }
        self.index_dirty = false;
        self.index_gen += 1;
        self.attr_index.clear();
        let mut open = Vec::new();
        for (i, a) in self.agents.iter().enumerate() {
            for (k, v) in &a.rec.attributes {
                self.attr_index
                    .entry(k.clone())
                    .or_default()
                    .entry(v.clone())
                    .or_default()
                    .push(i as u32);
            }
            if !a.rec.attributes.contains_key("dedicated") {
                open.push(i as u32);
            }
        }
        self.open_agents = Arc::new(open);
    }

    pub(crate) fn take_capacity_changed(&mut self) -> bool {
        std::mem::take(&mut self.capacity_changed)
    }

    /// Records a placement made by the scheduler.
    pub(crate) fn place(&mut self, id: &str, idx: u32, ports: Vec<(String, u16)>, now: UnixMillis) {
        let version = self.bump_agent(idx);
        let agent_id = self.agents[idx as usize].rec.id.clone();
        let Some(task) = self.tasks.get_mut(id) else {
            return;
        };
        if task
            .status
            .transition(
                TaskState::Assigned,
                None,
                now,
                EventSource::Master,
                &format!("assigned to {agent_id}"),
            )
            .is_err()
        {
            return;
        }
        task.agent = Some(agent_id);
        task.ports = ports;
        task.assigned_version = version;
        task.last_report_ms = now;
        self.agents[idx as usize].tasks.insert(id.to_string());
        self.mark(id);
        self.push_timer(
            now + self.cfg.transient_timeout_ms,
            Timer::Transient {
                task: id.to_string(),
                state: TaskState::Assigned,
            },
        );
    }
}

/// The longest a kill escalation of this job's task can take, plus slack.
fn kill_time_ms(spec: &JobSpec) -> u64 {
    let mut ms = spec.task.finalization_wait.get().as_millis() as u64 + 5_000;
    if let Some(http) = spec.lifecycle.as_ref().and_then(|l| l.http.as_ref()) {
        ms += http.graceful_shutdown_wait.get().as_millis() as u64
            + http.shutdown_wait.get().as_millis() as u64;
    }
    ms
}

fn new_task(
    id: &str,
    job: &str,
    instance: u32,
    gen: u32,
    now: UnixMillis,
    initial: TaskState,
    message: &str,
) -> Task {
    Task {
        id: id.to_string(),
        job: job.to_string(),
        instance,
        gen,
        status: TaskStatus::new(initial, now, EventSource::Master, message),
        desired: DesiredState::Running,
        kill_reason: None,
        agent: None,
        ports: Vec::new(),
        assigned_version: 0,
        last_seq: None,
        processes: Vec::new(),
        created_ms: now,
        running_since: None,
        failures: 0,
        flaps: 0,
        throttle_until: None,
        last_report_ms: 0,
        missing_since: None,
    }
}

#[cfg(test)]
mod tests;
