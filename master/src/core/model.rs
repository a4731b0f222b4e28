//! The model: the records the core holds (Task, Job, Agent and their stored forms),
//! what a job's task needs and where it may go, and the small constructors of each.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use drover_common::spec::{Constraint, JobSpec};
use drover_common::state::{
    DesiredState, EventSource, ExitReason, MonoMillis, TaskState, TaskStatus, UnixMillis,
};
use drover_common::wire::{AgentResources, AgentVersions, ProcessStatus};
use serde::{Deserialize, Serialize};

use super::limits::LimitCache;
use super::{CoreError, HostMaintenance};

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
    /// A restart or update of this exclusive task, asked while its host was
    /// unreachable, makes the replacement (on this config) only when the task
    /// ended: a copy the master cannot stop may still run until then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replace_at_end: Option<String>,
    #[serde(default)]
    pub agent: Option<String>,
    /// When it was withdrawn from service discovery (wall clock), while that is
    /// not its state's doing: a kill held for `announce.drain_delay` (a stopping
    /// state; the agent's set keeps it desired RUNNING until then), or a RUNNING
    /// task its executor is stopping for a failed health check (`core/services.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub withdrawn_ms: Option<UnixMillis>,
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
    /// What the last status with processes left out of them beyond the agent's cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes_omitted: Option<drover_common::wire::OmittedProcesses>,
    /// Wall clock, for people.
    pub created_ms: UnixMillis,
    /// When it became RUNNING (wall clock, for people).
    #[serde(default)]
    pub running_since: Option<UnixMillis>,
    /// When it became RUNNING on the monotonic clock (how long it ran decides
    /// flapping); re-derived from `running_since` at load.
    #[serde(skip)]
    pub running_mono: Option<MonoMillis>,
    /// FAILED tasks of this instance before this one.
    #[serde(default)]
    pub failures: u32,
    /// Consecutive flapping terminations of this instance before this one.
    #[serde(default)]
    pub flaps: u32,
    /// When its THROTTLED penalty ends (wall clock, for people and for the penalty
    /// left at load).
    #[serde(default)]
    pub throttle_until: Option<UnixMillis>,
    /// The task whose preemption ended this task's predecessor (a replacement).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempted_by: Option<String>,
    /// The hash of the task config this task runs (its job's `configs`); empty in
    /// records written before jobs had several configs: the job's own config.
    #[serde(default)]
    pub config: String,
    /// When the agent last told us about this task (status or full task set),
    /// monotonic.
    #[serde(skip)]
    pub last_report_ms: MonoMillis,
    /// Since when the agent's full task sets lack this task, monotonic.
    #[serde(skip)]
    pub missing_since: Option<MonoMillis>,
    /// The store batch (change index) that last wrote this task: the change stream
    /// (`GET /v1/changes`) reports it to clients that saw an older index.
    #[serde(default)]
    pub rev: u64,
}

/// The stored form of an agent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AgentRecord {
    pub id: String,
    pub hostname: String,
    pub address: String,
    /// The IP address its announced tasks are published at (see
    /// `services::agent_ip`); empty when none is known.
    #[serde(default)]
    pub ip: String,
    pub resources: AgentResources,
    pub attributes: BTreeMap<String, String>,
    pub version: u64,
    /// Wall clock of the last heartbeat, for people (timeouts use the monotonic
    /// `Agent::last_seen`).
    pub last_heartbeat_ms: UnixMillis,
    /// The store batch (change index) that last wrote this agent (see `Task::rev`).
    #[serde(default)]
    pub rev: u64,
    /// The host's maintenance mode and its history.
    #[serde(default)]
    pub maintenance: HostMaintenance,
    /// What the agent reported at its latest registration.
    #[serde(default)]
    pub versions: Option<AgentVersions>,
}

/// The stored form of a job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    pub key: String,
    pub spec: JobSpec,
    pub created_ms: UnixMillis,
}

/// One instance of a job (SwarmKit's slot): its latest task and the older ones.
#[derive(Clone, Debug, Default)]
pub(super) struct Slot {
    pub(super) current: Option<String>,
    /// Older tasks, oldest first.
    pub(super) history: VecDeque<String>,
    /// The current task's state and RUNNING start as of the end of the last
    /// event (or the start of this event's drain round): the drain's SLA budgets
    /// read a job's slots without looking each task up (see `Core::sync_slots`).
    pub(super) seen: Option<(TaskState, Option<MonoMillis>)>,
}

/// A job's constraints, parsed once.
#[derive(Clone, Debug, Default)]
pub(super) struct JobConstraints {
    /// Attribute -> value constraint.
    pub(super) values: Vec<(String, Constraint)>,
    /// Attribute -> at most N active tasks per value.
    pub(super) limits: Vec<(String, u32)>,
    /// A non-negated value constraint on `dedicated`.
    pub(super) names_dedicated: bool,
    /// The attributes whose per-value counts the scheduler keeps: `limits`, then
    /// the `spread` attributes (their bound unused).
    pub(super) counted: Vec<(String, u32)>,
    /// Soft preferences (see `scoring`); empty: the rotating cursor alone.
    pub(super) soft: super::scoring::Soft,
}

/// One task config of a job and what placing its tasks takes: its needs, its
/// constraints and its cached candidate agents.
#[derive(Clone, Debug)]
pub(super) struct JobConfig {
    pub(super) spec: Arc<JobSpec>,
    pub(super) need: Need,
    pub(super) constraints: JobConstraints,
    pub(super) candidates: Option<(u64, Arc<Vec<u32>>)>,
    /// When it last became the job's newest config (wall clock): the newest
    /// `config_history` are kept for history.
    pub(super) used_ms: UnixMillis,
}

impl JobConfig {
    /// A config of `spec` (its constraints were checked when it was accepted),
    /// the job's newest at `used_ms`.
    pub(super) fn new(spec: Arc<JobSpec>, used_ms: UnixMillis) -> JobConfig {
        JobConfig {
            need: need_of(&spec),
            constraints: constraints_of(&spec).unwrap_or_default(),
            spec,
            candidates: None,
            used_ms,
        }
    }
}

#[derive(Clone, Debug)]
pub(super) struct Job {
    pub(super) key: String,
    /// The job's newest config: what new instances run and what placement checks.
    pub(super) spec: Arc<JobSpec>,
    /// The hash of `spec`'s task config.
    pub(super) config: String,
    /// Every task config its tasks run, by hash (see drover_common::configs).
    pub(super) configs: BTreeMap<String, JobConfig>,
    pub(super) created_ms: UnixMillis,
    pub(super) slots: Vec<Slot>,
    pub(super) constraints: JobConstraints,
    /// Resource needs in scheduler units.
    pub(super) need: Need,
    /// Candidate agents (cached for one agent index generation) and a cursor.
    pub(super) candidates: Option<(u64, Arc<Vec<u32>>)>,
    pub(super) cursor: usize,
    /// Why its PENDING tasks do not fit, from the last try.
    pub(super) pending_reason: Option<String>,
    /// The last try failed only on what no other job's ending and no agent coming
    /// back can change: the job's limits and constraints, hosts in maintenance.
    pub(super) pending_fixed: bool,
    /// A cron job's schedule and firings; None for other jobs.
    pub(super) cron: Option<CronState>,
    /// Its active tasks per `limit:N` attribute value, kept up to date between
    /// scheduling passes (None: counted afresh at the next pass that needs them).
    pub(super) limit_cache: Option<LimitCache>,
}

/// A cron job's state in the core (see `cron`).
#[derive(Clone, Debug)]
pub(super) struct CronState {
    pub(super) schedule: Arc<drover_common::cron::Schedule>,
    /// The next scheduled firing (wall clock).
    pub(super) next: Option<UnixMillis>,
    /// The last scheduled firing handled (stored).
    pub(super) last_fired: Option<UnixMillis>,
}

/// What one task of a job needs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Need {
    pub cpu_milli: u64,
    pub ram: u64,
    pub disk: u64,
    pub ports: u32,
}

#[derive(Clone, Debug)]
pub(super) struct Agent {
    pub(super) rec: AgentRecord,
    pub(super) cpu_milli: u64,
    pub(super) used_cpu_milli: u64,
    pub(super) used_ram: u64,
    pub(super) used_disk: u64,
    pub(super) used_ports: BTreeSet<u16>,
    /// Held for preemptors (freed by their victims), see `preemption`.
    pub(super) reserved: Need,
    /// The preemptors holding `reserved`.
    pub(super) reserved_for: Vec<String>,
    pub(super) next_port: u16,
    /// Non-terminal tasks placed here.
    pub(super) tasks: BTreeSet<String>,
    pub(super) reachable: bool,
    /// The last registration or heartbeat, monotonic.
    pub(super) last_seen: MonoMillis,
    /// When the sweep found it silent (monotonic); None while reachable.
    pub(super) unreachable_since: Option<MonoMillis>,
    /// Silent past this (monotonic), it is lost: the latest of each answer's time
    /// plus the loss timeout that answer implied (see `heartbeat`), so an agent
    /// told a long interval is never declared lost before that interval's timeout.
    pub(super) lost_after: MonoMillis,
    /// By this (monotonic) the agent has killed its exclusive tasks if it has not
    /// reached the master: the latest of each answer's time plus the lease it told.
    pub(super) exclusive_until: MonoMillis,
    /// The exclusive lease of the last answer.
    pub(super) exclusive_lease_ms: u64,
    /// Heartbeated or registered since the master started.
    pub(super) seen: bool,
    pub(super) want_full_set: bool,
    /// The store batch that last changed its assignment set.
    pub(super) last_change_seq: u64,
    /// The assignment set version of the last change the agent was woken for. A
    /// task the agent itself reported ending leaves the set without waking the
    /// agent's long poll (it knows already), so its version may lag `rec.version`
    /// while its task digest still matches.
    pub(super) notified_version: u64,
}

impl Agent {
    /// An agent last seen at monotonic `now`.
    pub(super) fn new(rec: AgentRecord, now: MonoMillis) -> Agent {
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
            reserved: Need::default(),
            reserved_for: Vec::new(),
            next_port,
            tasks: BTreeSet::new(),
            reachable: true,
            last_seen: now,
            unreachable_since: None,
            lost_after: now,
            exclusive_until: now,
            exclusive_lease_ms: 0,
            seen: false,
            want_full_set: true,
            last_change_seq: 0,
            notified_version: rec_version,
        }
    }

    /// The agent's value of `attribute`; `host` falls back to the agent id.
    pub(super) fn attr(&self, attribute: &str) -> Option<&str> {
        match self.rec.attributes.get(attribute) {
            Some(v) => Some(v.as_str()),
            None if attribute == "host" => Some(self.rec.id.as_str()),
            None => None,
        }
    }

    pub(super) fn port_count(&self) -> u32 {
        let (lo, hi) = self.rec.resources.port_range;
        if hi < lo {
            0
        } else {
            u32::from(hi - lo) + 1
        }
    }
}

impl super::scoring::Candidate for Agent {
    fn used_percent(&self) -> f64 {
        let ratio = |used: u64, total: u64| {
            if total == 0 {
                1.0
            } else {
                used as f64 / total as f64
            }
        };
        let cpu = ratio(self.used_cpu_milli, self.cpu_milli);
        let ram = ratio(self.used_ram, self.rec.resources.ram_bytes);
        100.0 * cpu.max(ram)
    }

    #[cfg(test)]
    fn attr(&self, attribute: &str) -> Option<&str> {
        Agent::attr(self, attribute)
    }
}

pub(super) fn cpu_to_milli(cpu: f64) -> u64 {
    if cpu.is_finite() && cpu > 0.0 {
        (cpu * 1000.0).round() as u64
    } else {
        0
    }
}

/// A job's constraints as parsed when its spec was read, plus the implicit
/// `host: limit:1` of services. A spec that skipped validation may hold an
/// expression that did not parse: refused here, never placed by guesswork.
pub(super) fn constraints_of(spec: &JobSpec) -> Result<JobConstraints, CoreError> {
    let mut out = JobConstraints::default();
    for (attribute, expr) in &spec.constraints {
        let c = expr.parsed().map_err(|e| CoreError::BadConstraint {
            attribute: attribute.clone(),
            message: e.to_string(),
        })?;
        match c {
            Constraint::Limit(n) => out.limits.push((attribute.clone(), *n)),
            Constraint::Value { negated, .. } => {
                if attribute == "dedicated" && !negated {
                    out.names_dedicated = true;
                }
                out.values.push((attribute.clone(), c.clone()));
            }
        }
    }
    if spec.service && !spec.constraints.contains_key("host") {
        out.limits.push(("host".to_string(), 1));
    }
    out.counted = out.limits.clone();
    out.soft = super::scoring::Soft::of(spec, &mut out.counted);
    Ok(out)
}

impl Job {
    /// A job on `spec`, its one config registered.
    pub(super) fn new(key: String, spec: Arc<JobSpec>, created_ms: UnixMillis) -> Job {
        let config = drover_common::configs::config_hash(&spec);
        let need = need_of(&spec);
        let mut configs = BTreeMap::new();
        configs.insert(config.clone(), JobConfig::new(spec.clone(), created_ms));
        Job {
            key,
            slots: vec![Slot::default(); spec.instances as usize],
            spec,
            config,
            configs,
            created_ms,
            constraints: JobConstraints::default(),
            need,
            candidates: None,
            cursor: 0,
            pending_reason: None,
            pending_fixed: false,
            cron: None,
            limit_cache: None,
        }
    }

    /// The spec a task of config `hash` runs (the job's newest if unknown).
    pub(super) fn spec_of(&self, hash: &str) -> &Arc<JobSpec> {
        self.configs.get(hash).map_or(&self.spec, |c| &c.spec)
    }

    /// Swaps the placement inputs of the newest config (needs, constraints, cached
    /// candidates) with those of config `hash`: the scheduler tries a task of an
    /// older config by its own; a second swap puts them back.
    pub(super) fn swap_placement(&mut self, hash: &str) {
        if let Some(c) = self.configs.get_mut(hash) {
            std::mem::swap(&mut self.need, &mut c.need);
            std::mem::swap(&mut self.constraints, &mut c.constraints);
            std::mem::swap(&mut self.candidates, &mut c.candidates);
        }
    }

    /// What a task of config `hash` needs.
    pub(super) fn need_for(&self, hash: &str) -> Need {
        self.configs.get(hash).map_or(self.need, |c| c.need)
    }
}

pub(super) fn need_of(spec: &JobSpec) -> Need {
    let r = &spec.task.resources;
    Need {
        cpu_milli: cpu_to_milli(r.cpu),
        ram: r.ram.bytes(),
        disk: r.disk.bytes(),
        ports: r.ports.len() as u32,
    }
}

pub(super) fn new_task(
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
        replace_at_end: None,
        agent: None,
        withdrawn_ms: None,
        ports: Vec::new(),
        assigned_version: 0,
        last_seq: None,
        processes: Vec::new(),
        processes_omitted: None,
        created_ms: now,
        running_since: None,
        running_mono: None,
        failures: 0,
        flaps: 0,
        throttle_until: None,
        preempted_by: None,
        config: String::new(),
        last_report_ms: 0,
        missing_since: None,
        rev: 0,
    }
}
