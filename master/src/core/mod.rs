//! The master's pure core: every job, task and agent in memory, and the lifecycle
//! rules, reconciliation and timers as deterministic code. `Core::handle(event, now)`
//! is the one door: it changes the state and returns what the runtime must do
//! (persist, wake an agent's long poll, arm the timer). No I/O, no clock, no
//! randomness beyond a seeded counter.
//!
//! One concern per file, each an `impl Core` block or a small type; the files
//! and their concerns are listed once, in docs/ARCHITECTURE.md ("The master's
//! core").
//!
//! A new concern (preemption, quotas, cron) is a
//! file of its own here beside these, entered from `handle` through a new `Event`.

mod agents;
mod changes;
mod clock;
mod config;
mod cron;
mod disruption;
mod events;
mod eviction_guard;
mod feasibility;
mod heartbeat;
mod jobs;
mod lifecycle;
mod limits;
mod maintenance;
mod model;
mod placement;
mod placement_soft;
mod poll;
mod preemption;
mod probe;
mod quota;
mod reconciliation;
mod restart;
mod rollout;
mod scoring;
mod services;
mod snapshot;
mod stats;
mod stuck;
mod timers;
mod update;
mod user_grants;
mod views;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;

use drover_common::state::{MonoMillis, TaskState};

pub use changes::{ChangeFilter, ChangesPage};
pub use clock::Now;
pub use config::CoreConfig;
pub use cron::{catch_up, parse as parse_cron, CronSpecError, Schedule};
pub use events::{Change, CoreError, Effect, Event, Output, Reply, UpdateAction, UpdateDirection};
pub use maintenance::{HostFailure, HostMaintenance, MaintenanceOp};
pub use model::Need;
use model::{Agent, Job};
pub use model::{AgentRecord, JobRecord, Task};
pub use poll::{poll_step, PollStep};
pub use preemption::{may_preempt, victims_on_host, Candidate, Free, Standing};
pub use quota::{check as check_quota, Usage};
pub use restart::rolls as restart_rolls;
pub use services::address_host;
pub use snapshot::{ConfigRecord, Snapshot};
pub use stats::MetricsState;
pub use update::UpdateRecord;
pub use user_grants::{check as check_user, may_run_as, UserGrants};
pub use views::InstancePage;

use eviction_guard::EvictionGuard;
use maintenance::Drains;
use reconciliation::Reconciliation;
use timers::Timer;

/// The master's state. See the module docs.
pub struct Core {
    cfg: CoreConfig,
    jobs: BTreeMap<String, Job>,
    /// Boxed: growing the map moves pointers, not whole tasks (a rehash of 20,000
    /// tasks in place cost ~15 ms in one event).
    tasks: HashMap<String, Box<Task>>,
    agents: Vec<Agent>,
    agent_idx: HashMap<String, u32>,
    /// Reachable agents: the cell the heartbeat interval is spread over.
    live_agents: usize,
    /// Attribute -> value -> agents, rebuilt when agents change.
    attr_index: HashMap<String, HashMap<String, Vec<u32>>>,
    /// Agents without a `dedicated` attribute.
    open_agents: Arc<Vec<u32>>,
    /// Every agent by its use, for soft placement (`placement_soft`).
    usage: placement_soft::UsageIndex,
    index_gen: u64,
    index_dirty: bool,
    /// PENDING tasks to place, in order.
    queue: VecDeque<String>,
    /// Per job, PENDING tasks that did not fit, oldest first; retried when capacity
    /// changes (one failed try blocks the whole job: its tasks are identical).
    blocked: BTreeMap<String, VecDeque<String>>,
    capacity_changed: bool,
    /// Preemptors and the resources freed for them, by task id.
    reservations: HashMap<String, preemption::Reservation>,
    /// Agents with reservations whose room grew: their preemptors may fit now.
    reserved_wake: BTreeSet<u32>,
    /// Production quotas by role.
    quotas: BTreeMap<String, Usage>,
    /// The users each role's tasks may run as beside the role's own.
    user_grants: UserGrants,
    /// Armed timers by monotonic deadline.
    timers: BinaryHeap<Reverse<(MonoMillis, Timer)>>,
    rng: u64,
    seq: u64,
    /// When this master started (monotonic): the restart grace counts from here.
    start_mono: MonoMillis,
    guard: EvictionGuard,
    recon: Option<Reconciliation>,
    next_recon_id: u64,
    /// Each job's latest update (running or ended); shared with the store's batch
    /// until it is written, copied on the next change only if still shared.
    updates: BTreeMap<String, Arc<UpdateRecord>>,
    /// Draining hosts and why they wait.
    drains: Drains,
    // Per-event scratch.
    dirty_updates: BTreeSet<String>,
    dirty_tasks: BTreeSet<String>,
    deleted_tasks: Vec<String>,
    dirty_agents: BTreeSet<u32>,
    bumped_agents: BTreeSet<u32>,
    /// Agents whose set changed in this event only by tasks they reported ending.
    quiet_agents: BTreeSet<u32>,
    job_changes: Vec<Change>,
    /// Update batches started in this event (direction, instances), for `/metrics`.
    batches_started: Vec<(UpdateDirection, u32)>,
    /// The last batch that may have removed a service from `/v1/services`
    /// (`services.rs`, `services_gone_index`).
    services_gone: u64,
}

impl Core {
    /// An empty master started at `now`; `seed` makes task ids unique across runs.
    pub fn new(cfg: CoreConfig, now: Now, seed: u64) -> Core {
        let mut core = Core {
            cfg,
            jobs: BTreeMap::new(),
            tasks: HashMap::new(),
            agents: Vec::new(),
            agent_idx: HashMap::new(),
            live_agents: 0,
            attr_index: HashMap::new(),
            open_agents: Arc::new(Vec::new()),
            usage: placement_soft::UsageIndex::default(),
            index_gen: 0,
            index_dirty: true,
            queue: VecDeque::new(),
            blocked: BTreeMap::new(),
            capacity_changed: false,
            reservations: HashMap::new(),
            reserved_wake: BTreeSet::new(),
            quotas: BTreeMap::new(),
            user_grants: UserGrants::new(),
            timers: BinaryHeap::new(),
            rng: seed ^ 0x9e37_79b9_7f4a_7c15,
            seq: 0,
            start_mono: now.mono,
            guard: EvictionGuard::default(),
            recon: None,
            next_recon_id: 1,
            updates: BTreeMap::new(),
            dirty_updates: BTreeSet::new(),
            drains: Drains::default(),
            dirty_tasks: BTreeSet::new(),
            deleted_tasks: Vec::new(),
            dirty_agents: BTreeSet::new(),
            bumped_agents: BTreeSet::new(),
            quiet_agents: BTreeSet::new(),
            job_changes: Vec::new(),
            batches_started: Vec::new(),
            services_gone: 0,
        };
        core.push_timer(now.mono + core.sweep_interval(), Timer::AgentSweep);
        core.push_timer(now.mono + core.cfg.reconcile_interval_ms, Timer::Reconcile);
        core
    }

    /// The thresholds this core runs with.
    pub fn config(&self) -> &CoreConfig {
        &self.cfg
    }

    /// The last store batch sequence number handed out. It goes on across restarts
    /// (a loaded core starts at the highest `rev` stored), so it is also the change
    /// stream's index.
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
        self.tasks.get(id).map(|t| &**t)
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

    /// Applies one event at `now`: durations on `now.mono`, timestamps from
    /// `now.wall`.
    pub fn handle(&mut self, event: Event, now: Now) -> Output {
        let reply = match event {
            Event::CreateJob(spec) => self.create_job(*spec, now),
            Event::Kill { job, instances } => {
                self.abort_update_for_kill(&job, now);
                self.stop_instances(&job, instances, TaskState::Killing, now)
            }
            Event::Restart { job, instances } => {
                self.stop_instances(&job, instances, TaskState::Restarting, now)
            }
            Event::RollingRestart { job, user } => self.start_restart(&job, &user, now),
            Event::Register(req) => self.register(*req, now),
            Event::Heartbeat { agent, request } => self.heartbeat(&agent, request, now),
            Event::StatusReports { agent, reports } => self.status_reports(&agent, reports, now),
            Event::StartUpdate {
                job,
                spec,
                instances,
                user,
            } => self.start_update(&job, *spec, instances, &user, now),
            Event::UpdateAction { job, action } => self.update_action(&job, action, now),
            Event::Maintenance { op, hosts } => self.maintenance(op, &hosts, now),
            Event::Tick => {
                self.tick(now);
                Ok(Reply::None)
            }
            Event::ReleaseEvictionGuard => Ok(self.release_guard_by_operator(now)),
            Event::SetQuota { role, quota } => self.set_quota(role, quota),
            Event::SetUserGrant {
                role,
                user,
                granted,
            } => self.set_user_grant(role, user, granted),
            Event::CronStart { job } => self.cron_start(&job, now),
            Event::CronDeschedule { job } => self.cron_deschedule(&job, now),
        };
        self.drive_updates(now);
        self.drain_round(now);
        self.schedule(now);
        let reply = self.hosts_after_round(reply);
        let effects = self.finish();
        Output { reply, effects }
    }

    fn finish(&mut self) -> Vec<Effect> {
        self.sync_slots();
        let mut changes = std::mem::take(&mut self.job_changes);
        // Every row written in this batch carries the batch's number, the change
        // stream's index (it is `self.seq` below when there are changes).
        let rev = self.seq + 1;
        for job in std::mem::take(&mut self.dirty_updates) {
            if let Some(u) = self.updates.get_mut(&job) {
                Arc::make_mut(u).rev = rev;
                changes.push(Change::PutUpdate(u.clone()));
            }
        }
        for id in std::mem::take(&mut self.dirty_tasks) {
            if let Some(t) = self.tasks.get_mut(&id) {
                t.rev = rev;
                changes.push(Change::PutTask(t.clone()));
            }
        }
        for id in std::mem::take(&mut self.deleted_tasks) {
            changes.push(Change::DeleteTask(id));
        }
        for idx in std::mem::take(&mut self.dirty_agents) {
            let rec = &mut self.agents[idx as usize].rec;
            rec.rev = rev;
            changes.push(Change::PutAgent(Box::new(rec.clone())));
        }
        let mut effects = Vec::new();
        if !changes.is_empty() {
            self.seq += 1;
            self.note_services_gone(&changes);
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
        if let Some(e) = self.take_guard_change() {
            effects.push(e);
        }
        for (direction, instances) in std::mem::take(&mut self.batches_started) {
            effects.push(Effect::UpdateBatch {
                direction,
                instances,
            });
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
}

#[cfg(test)]
mod tests;
