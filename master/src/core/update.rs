//! Rolling updates (Aurora's updater, seed 001): a job moves onto a new task config
//! batch by batch. A batch starts only when the one before it is done: each of its
//! instances RUNNING (and so passing its health check) for the `watch` time, or
//! gone if the update removes it. A task of the new config that ends on its own
//! (not drained, not lost with its agent) is a failure of its instance; past `max_per_instance_failures` the instance has
//! failed, past `max_total_failures` failed instances the update has: with
//! `rollback_on_failure` every instance it touched goes back to the config it had,
//! in reverse order from the point of failure and in batches of the same size,
//! else it stops as FAILED. Operators pause, resume, abort and roll back by hand.
//!
//! A state machine driven by `Core::handle`: every event ends with
//! [`Core::drive_updates`], which looks at the instances in flight and starts the
//! next batch; a timer wakes the core when a watch ends. The record
//! ([`UpdateRecord`]) is stored whenever it changes, so a restarted master goes on.
//! Replaced tasks end KILLED with reason `updated` and do not count as flapping.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use drover_common::configs::{config_hash, format_ranges, plan_update};
use drover_common::spec::JobSpec;
use drover_common::state::{DesiredState, EventSource, ExitReason, MonoMillis, TaskState};
use drover_common::wire::{
    InstanceProgress, InstanceUpdateState, MaintenanceMode, UpdateEvent, UpdateState, UpdateView,
};
use serde::{Deserialize, Serialize};

use super::model::{constraints_of, need_of, new_task, JobConfig, Slot};
use super::timers::Timer;
use super::{Change, Core, CoreError, Now, Reply, UpdateAction, UpdateDirection};

/// Events kept per update (the oldest are dropped beyond this).
const MAX_EVENTS: usize = 500;

/// An update and the engine's place in it; also its stored form.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UpdateRecord {
    /// What the API shows.
    pub view: UpdateView,
    /// The job's config hash before the update (restored by a full rollback).
    pub old_config: String,
    /// Positions in `view.instances` started forward so far.
    pub next: usize,
    /// Rolling back: the instances to put back, in order, and how many started.
    #[serde(default)]
    pub back: Vec<u32>,
    #[serde(default)]
    pub back_next: usize,
    /// Instances in the current batch.
    #[serde(default)]
    pub in_flight: Vec<u32>,
    /// The task watched per instance in flight.
    #[serde(default)]
    pub watched: BTreeMap<u32, String>,
    /// The state a pause left (resume goes back to it).
    #[serde(default)]
    pub paused_from: Option<UpdateState>,
    /// The store batch (change index) that last wrote it (see `Task::rev`).
    #[serde(default)]
    pub rev: u64,
    /// The watch timer armed last, monotonic (one per deadline, not one per event;
    /// not stored: a restarted master re-arms it from the tasks' re-derived
    /// `running_mono`).
    #[serde(skip)]
    pub armed: Option<MonoMillis>,
    /// Something it waits for may have happened (its watch timer fired, it was
    /// started, steered or loaded): drive it in this event even if none of its
    /// tasks changed.
    #[serde(skip)]
    pub poked: bool,
}

impl UpdateRecord {
    fn pos(&self, instance: u32) -> Option<usize> {
        self.view
            .instances
            .binary_search_by_key(&instance, |p| p.instance)
            .ok()
    }

    fn progress(&mut self, instance: u32) -> Option<&mut InstanceProgress> {
        let pos = self.pos(instance)?;
        self.view.instances.get_mut(pos)
    }

    fn event(&mut self, now: Now, message: String) {
        self.view.events.push(UpdateEvent {
            at_ms: now.wall,
            message,
        });
        if self.view.events.len() > MAX_EVENTS {
            let extra = self.view.events.len() - MAX_EVENTS;
            self.view.events.drain(..extra);
        }
    }

    fn failed_instances(&self) -> u32 {
        self.view
            .instances
            .iter()
            .filter(|p| p.state == InstanceUpdateState::Failed)
            .count() as u32
    }

    fn rolling_back(&self) -> bool {
        self.view.state == UpdateState::RollingBack
            || self.paused_from == Some(UpdateState::RollingBack)
    }
}

/// Whether the next batch started.
enum Batch {
    Started,
    /// Not now, for this reason (a drain has instances down).
    Held(String),
    /// Nothing is left to start.
    Done,
}

/// Counts a batch just started, `left` instances still to go after it.
fn count_batch(u: &mut UpdateRecord, left: usize) {
    let size = u.view.settings.batch_size.max(1) as usize;
    u.view.batch += 1;
    u.view.batches = u.view.batch + left.div_ceil(size) as u32;
}

/// Sets what the update waits for; whether that changed.
fn set_waiting(u: &mut UpdateRecord, why: Option<String>) -> bool {
    if u.view.waiting == why {
        return false;
    }
    u.view.waiting = why;
    true
}

/// What one instance in flight is doing.
enum Check {
    Done,
    Failed(String),
    /// Until the monotonic instant its watch ends, if it is being watched.
    Waiting(Option<MonoMillis>),
}

impl Core {
    /// A job's latest update (GET .../update).
    pub fn update_view(&self, job: &str) -> Option<UpdateView> {
        self.updates.get(job).map(|u| self.with_pending(u))
    }

    /// Every job's latest update, by job key (for the web page).
    pub fn update_views(&self) -> Vec<UpdateView> {
        self.updates
            .values()
            .map(|u| self.with_pending(u))
            .collect()
    }

    /// The stored view, with why its batch's PENDING instances wait and whether
    /// it is stuck, as of now (read time: the scheduler runs after the update's
    /// step, so the record's own text may predate the reason).
    fn with_pending(&self, u: &UpdateRecord) -> UpdateView {
        let mut view = u.view.clone();
        if view.state.is_terminal() || view.state == UpdateState::Paused {
            return view;
        }
        if let Some(pending) = self.pending_of(&view.job, &u.in_flight) {
            let line = pending.describe();
            view.waiting = Some(match view.waiting.take() {
                Some(w) => format!("{w}; {line}"),
                None => line.clone(),
            });
            if pending.stuck {
                view.stuck = Some(format!(
                    "{line}, and no task of the job is starting or stopping: nothing \
                     the update does changes that (more agents, a looser constraint in a \
                     new spec, or the end of a maintenance would)"
                ));
            }
        }
        view
    }

    /// The config hash each instance of the job runs: its current task's.
    pub(super) fn instance_configs(&self, job: &str) -> Vec<String> {
        let Some(j) = self.jobs.get(job) else {
            return Vec::new();
        };
        j.slots
            .iter()
            .map(|s| {
                s.current
                    .as_ref()
                    .and_then(|id| self.tasks.get(id))
                    .map_or_else(|| j.config.clone(), |t| t.config.clone())
            })
            .collect()
    }

    pub(super) fn load_updates(&mut self, updates: Vec<UpdateRecord>) {
        for u in updates {
            let newer = self
                .updates
                .get(&u.view.job)
                .is_none_or(|old| old.view.created_ms <= u.view.created_ms);
            if newer && self.jobs.contains_key(&u.view.job) {
                self.updates.insert(u.view.job.clone(), Arc::new(u));
            }
        }
        // Running ones are driven at the first event: their watches are re-armed.
        for u in self.updates.values_mut() {
            let u = Arc::make_mut(u);
            u.poked = !u.view.state.is_terminal();
        }
    }

    /// The job's watch timer fired.
    pub(super) fn poke_update(&mut self, job: &str) {
        if let Some(u) = self.updates.get_mut(job) {
            Arc::make_mut(u).poked = true;
        }
    }

    /// POST .../update.
    pub(super) fn start_update(
        &mut self,
        job: &str,
        spec: JobSpec,
        instances: Option<Vec<u32>>,
        user: &str,
        now: Now,
    ) -> Result<Reply, CoreError> {
        let bad = |message: String| CoreError::BadUpdate {
            job: job.to_string(),
            message,
        };
        let Some(j) = self.jobs.get(job) else {
            return Err(CoreError::NoJob(job.to_string()));
        };
        if spec.key().to_string() != job {
            return Err(bad(format!(
                "the spec is for job {}, not {job}; update the job the spec names",
                spec.key()
            )));
        }
        if let Some(u) = self
            .updates
            .get(job)
            .filter(|u| !u.view.state.is_terminal())
        {
            return Err(CoreError::UpdateRunning {
                job: job.to_string(),
                id: u.view.id.clone(),
                state: u.view.state.to_string(),
            });
        }
        let constraints = constraints_of(&spec)?;
        self.check_user(&spec)?;
        let new_hash = config_hash(&spec);
        let current = self.instance_configs(job);
        let plan =
            plan_update(&current, &new_hash, spec.instances, instances.as_deref()).map_err(bad)?;
        // The configs a rollback would put back: their users must be granted too.
        let back = plan.replace.iter().map(|(_, from)| from);
        let removed = plan.remove.iter().filter_map(|i| current.get(*i as usize));
        self.check_configs_user(job, back.chain(removed))?;
        let old_config = j.config.clone();
        let before = j.slots.len() as u32;
        // Quota: the config each instance runs once the update is done.
        let mut after: Vec<String> = (0..plan.instances_after as usize)
            .map(|i| current.get(i).cloned().unwrap_or_else(|| new_hash.clone()))
            .collect();
        let scope = plan.replace.iter().map(|(i, _)| i);
        for i in scope.chain(&plan.add).chain(&plan.unchanged) {
            if let Some(h) = after.get_mut(*i as usize) {
                *h = new_hash.clone();
            }
        }
        self.check_update_quota(job, (&new_hash, &spec), &after)?;

        let mut spec = spec;
        spec.instances = plan.instances_after;
        let spec = Arc::new(spec);
        let settings = spec.update.clone();
        let Some(j) = self.jobs.get_mut(job) else {
            return Err(CoreError::NoJob(job.to_string()));
        };
        j.configs
            .entry(new_hash.clone())
            .or_insert_with(|| JobConfig::new(spec.clone(), now.wall))
            .used_ms = now.wall;
        j.spec = spec.clone();
        j.config = new_hash.clone();
        j.need = need_of(&spec);
        j.constraints = constraints;
        j.candidates = None;
        let created = j.created_ms;
        self.job_changes
            .push(Change::PutJob(spec.clone(), job.to_string(), created));
        self.job_changes.push(Change::PutConfig {
            job: job.to_string(),
            hash: new_hash.clone(),
            spec,
            used_ms: now.wall,
        });

        let mut progress: Vec<InstanceProgress> = Vec::new();
        for (i, from) in &plan.replace {
            progress.push(instance_progress(*i, Some(from.clone()), Some(&new_hash)));
        }
        for i in &plan.add {
            progress.push(instance_progress(*i, None, Some(&new_hash)));
        }
        for i in &plan.remove {
            progress.push(instance_progress(
                *i,
                current.get(*i as usize).cloned(),
                None,
            ));
        }
        progress.sort_by_key(|p| p.instance);
        let mut u = UpdateRecord {
            view: UpdateView {
                id: format!("{}-{}", job.replace('/', "-"), now.wall),
                job: job.to_string(),
                user: user.to_string(),
                created_ms: now.wall,
                state: UpdateState::RollingForward,
                settings,
                to_config: new_hash,
                instances_before: before,
                instances_after: plan.instances_after,
                instances: progress,
                events: Vec::new(),
                batch: 0,
                batches: 0,
                waiting: None,
                stuck: None,
            },
            old_config,
            next: 0,
            back: Vec::new(),
            back_next: 0,
            in_flight: Vec::new(),
            watched: BTreeMap::new(),
            paused_from: None,
            rev: 0,
            armed: None,
            poked: true,
        };
        u.event(
            now,
            format!(
                "started by {user}: replace [{}], add [{}], remove [{}], unchanged [{}]; \
                 batch size {}, watch {}",
                format_ranges(&plan.replace.iter().map(|(i, _)| *i).collect::<Vec<_>>()),
                format_ranges(&plan.add),
                format_ranges(&plan.remove),
                format_ranges(&plan.unchanged),
                u.view.settings.batch_size,
                u.view.settings.watch
            ),
        );
        let view = u.view.clone();
        self.updates.insert(job.to_string(), Arc::new(u));
        self.dirty_updates.insert(job.to_string());
        self.prune_configs(job);
        Ok(Reply::Update(Box::new(view)))
    }

    /// POST .../update/{pause,resume,abort,rollback}.
    pub(super) fn update_action(
        &mut self,
        job: &str,
        action: UpdateAction,
        now: Now,
    ) -> Result<Reply, CoreError> {
        if !self.jobs.contains_key(job) {
            return Err(CoreError::NoJob(job.to_string()));
        }
        self.check_update_users(job, action)?;
        let Some(u) = self
            .updates
            .get_mut(job)
            .filter(|u| !u.view.state.is_terminal())
            .map(Arc::make_mut)
        else {
            return Err(CoreError::NoActiveUpdate(job.to_string()));
        };
        let bad = |message: &str| CoreError::BadUpdate {
            job: job.to_string(),
            message: message.to_string(),
        };
        match action {
            UpdateAction::Pause => {
                if u.view.state == UpdateState::Paused {
                    return Err(bad("it is paused already; resume or abort it"));
                }
                u.paused_from = Some(u.view.state);
                u.view.state = UpdateState::Paused;
                u.event(now, "paused by request".to_string());
            }
            UpdateAction::Resume => {
                let Some(from) = u.paused_from.take() else {
                    return Err(bad("it is not paused; pause it first"));
                };
                u.view.state = from;
                u.event(now, format!("resumed by request ({from})"));
            }
            UpdateAction::Abort => {
                u.view.state = UpdateState::Aborted;
                u.paused_from = None;
                u.in_flight.clear();
                u.event(
                    now,
                    "aborted by request: every instance stays on the config it runs".to_string(),
                );
            }
            UpdateAction::Rollback => {
                if u.rolling_back() {
                    return Err(bad("it is rolling back already"));
                }
                u.paused_from = None;
                begin_rollback(u, now, "rollback requested".to_string());
            }
        }
        u.poked = true;
        let view = u.view.clone();
        self.dirty_updates.insert(job.to_string());
        if view.state.is_terminal() {
            self.keep_instance_count(job, view.state);
            self.prune_configs(job);
        }
        Ok(Reply::Update(Box::new(view)))
    }

    /// Refuses a resume or rollback of job `job`'s update that would start tasks on
    /// a config whose user the role is not granted (any longer): a rollback's, or
    /// a resume of one rolling back, the configs the instances go back to; a resume
    /// forward, the new config.
    fn check_update_users(&self, job: &str, action: UpdateAction) -> Result<(), CoreError> {
        let Some(u) = self
            .updates
            .get(job)
            .filter(|u| !u.view.state.is_terminal())
        else {
            return Ok(());
        };
        let back = match action {
            UpdateAction::Rollback => true,
            UpdateAction::Resume => u.paused_from == Some(UpdateState::RollingBack),
            UpdateAction::Pause | UpdateAction::Abort => return Ok(()),
        };
        let configs: Vec<&String> = if back {
            u.view
                .instances
                .iter()
                .filter_map(|p| p.from.as_ref())
                .collect()
        } else {
            vec![&u.view.to_config]
        };
        self.check_configs_user(job, configs)
    }

    /// A kill of the job (or some instances) while it is updated ends the update
    /// as ABORTED: what was killed stays killed, nothing else changes.
    pub(super) fn abort_update_for_kill(&mut self, job: &str, now: Now) {
        if let Some(u) = self
            .updates
            .get_mut(job)
            .filter(|u| !u.view.state.is_terminal())
            .map(Arc::make_mut)
        {
            u.view.state = UpdateState::Aborted;
            u.paused_from = None;
            u.in_flight.clear();
            u.event(now, "aborted: the job was killed".to_string());
            self.dirty_updates.insert(job.to_string());
            self.keep_instance_count(job, UpdateState::Aborted);
        }
    }

    /// After an update ended ABORTED or FAILED, every instance stays as it is, so
    /// the job has as many instances as it has slots: its spec says so too (one
    /// instance count for `job status`, `job list` and the web page), durably.
    fn keep_instance_count(&mut self, job: &str, state: UpdateState) {
        if !matches!(state, UpdateState::Aborted | UpdateState::Failed) {
            return;
        }
        let Some(j) = self.jobs.get_mut(job) else {
            return;
        };
        let have = j.slots.len() as u32;
        if j.spec.instances == have {
            return;
        }
        let mut spec = j.spec.as_ref().clone();
        spec.instances = have;
        let spec = Arc::new(spec);
        j.spec = spec.clone();
        let created = j.created_ms;
        self.job_changes
            .push(Change::PutJob(spec, job.to_string(), created));
    }

    /// Drives each running update one step, after every event that changed one of
    /// its job's tasks or poked it (events that touch neither, like most
    /// heartbeats, cost one pass over the running updates).
    pub(super) fn drive_updates(&mut self, now: Now) {
        let mut active: Vec<String> = Vec::new();
        let mut waiting: BTreeSet<&str> = BTreeSet::new();
        for u in self.updates.values() {
            if u.view.state.is_terminal() {
                continue;
            }
            if u.poked {
                active.push(u.view.job.clone());
            } else {
                waiting.insert(u.view.job.as_str());
            }
        }
        if !waiting.is_empty() {
            let mut touched: BTreeSet<String> = BTreeSet::new();
            for id in &self.dirty_tasks {
                if let Some(t) = self.tasks.get(id) {
                    if waiting.contains(t.job.as_str()) && !touched.contains(&t.job) {
                        touched.insert(t.job.clone());
                    }
                }
            }
            active.extend(touched);
        }
        for job in active {
            if let Some(mut shared) = self.updates.remove(&job) {
                let u = Arc::make_mut(&mut shared);
                u.poked = false;
                let changed = self.drive(u, now);
                let ended = u.view.state.is_terminal();
                self.updates.insert(job.clone(), shared);
                if changed {
                    self.dirty_updates.insert(job.clone());
                }
                if ended {
                    let state = self.updates.get(&job).map(|u| u.view.state);
                    if let Some(state) = state {
                        self.keep_instance_count(&job, state);
                    }
                    self.prune_configs(&job);
                }
            }
        }
    }

    /// One step of one update; whether its record changed.
    fn drive(&mut self, u: &mut UpdateRecord, now: Now) -> bool {
        let mut changed = false;
        if !self.jobs.contains_key(&u.view.job) {
            u.view.state = UpdateState::Aborted;
            u.event(now, "aborted: the job is gone".to_string());
            return true;
        }
        loop {
            changed |= self.check_in_flight(u, now);
            if u.view.state.is_terminal() {
                set_waiting(u, None);
                return true;
            }
            if u.view.state == UpdateState::Paused {
                return changed | set_waiting(u, Some("paused; resume or abort it".to_string()));
            }
            if !u.in_flight.is_empty() {
                return changed;
            }
            // The batch is done: start the next or finish.
            let batch = match u.view.state {
                UpdateState::RollingForward => self.start_forward_batch(u, now),
                UpdateState::RollingBack => self.start_back_batch(u, now),
                _ => Batch::Done,
            };
            match batch {
                Batch::Started => changed = true,
                Batch::Held(why) => return changed | set_waiting(u, Some(why)),
                Batch::Done => {
                    self.finish_update(u, now);
                    set_waiting(u, None);
                    return true;
                }
            }
        }
    }

    /// Instances of `u`'s job outside its batch that a host drain or an agent loss
    /// has down: the task it took (KILLED `drained`, LOST `agent_lost`) was replaced
    /// and the replacement is not RUNNING yet; (drained, lost). A batch counts them,
    /// so an update never adds a batch to what a drain or a lost host has down (the
    /// drain counts the batch in its SLA budget the same way). Looked at only while
    /// a host drains, is drained or is unreachable.
    fn down_outside(&self, u: &UpdateRecord) -> (usize, usize) {
        let disrupted = self.agents.iter().any(|a| {
            !a.reachable
                || matches!(
                    a.rec.maintenance.mode,
                    MaintenanceMode::Draining | MaintenanceMode::Drained
                )
        });
        let Some(job) = self.jobs.get(&u.view.job).filter(|_| disrupted) else {
            return (0, 0);
        };
        let in_flight: BTreeSet<u32> = u.in_flight.iter().copied().collect();
        let (mut drained, mut lost) = (0, 0);
        for (i, slot) in job.slots.iter().enumerate() {
            if in_flight.contains(&(i as u32)) {
                continue;
            }
            let down = slot
                .current
                .as_ref()
                .and_then(|id| self.tasks.get(id))
                .is_some_and(|t| {
                    t.status.state != TaskState::Running && !t.status.state.is_terminal()
                });
            let Some(before) = slot.history.back().and_then(|id| self.tasks.get(id)) else {
                continue;
            };
            if !down {
                continue;
            }
            if before.kill_reason == Some(ExitReason::Drained) {
                drained += 1;
            } else if before.status.exit_reason == Some(ExitReason::AgentLost) {
                lost += 1;
            }
        }
        (drained, lost)
    }

    /// How many instances the next batch may take: the batch size less what a
    /// drain or an agent loss has down, or why none.
    fn batch_room(&self, u: &UpdateRecord) -> Result<usize, String> {
        let size = u.view.settings.batch_size.max(1) as usize;
        let (drained, lost) = self.down_outside(u);
        if drained + lost >= size {
            let mut why = Vec::new();
            if drained > 0 {
                why.push(format!("{drained} instance(s) down by a host drain"));
            }
            if lost > 0 {
                why.push(format!(
                    "{lost} instance(s) down after their agent was lost"
                ));
            }
            return Err(format!(
                "{} (batch size {size}); the next batch starts when their replacements run",
                why.join(" and ")
            ));
        }
        Ok(size - drained - lost)
    }

    /// Looks at each instance in flight; failures may fail the update.
    fn check_in_flight(&mut self, u: &mut UpdateRecord, now: Now) -> bool {
        let mut changed = false;
        let back = u.rolling_back();
        let settings = u.view.settings.clone();
        let mut wake: Option<MonoMillis> = None;
        let mut left: Vec<u32> = Vec::new();
        let mut failure = false;
        let (mut watched, mut starting) = (0, 0);
        for instance in u.in_flight.clone() {
            let Some(p) = u.progress(instance) else {
                continue;
            };
            let want = if back { p.from.clone() } else { p.to.clone() };
            match self.check_instance(u, instance, want.as_deref(), now, &settings) {
                Check::Done => {
                    let state = if back {
                        InstanceUpdateState::RolledBack
                    } else {
                        InstanceUpdateState::Updated
                    };
                    if let Some(p) = u.progress(instance) {
                        p.state = state;
                    }
                    left.push(instance);
                    u.watched.remove(&instance);
                    changed = true;
                }
                Check::Failed(why) => {
                    changed = true;
                    failure = true;
                    let Some(p) = u.progress(instance) else {
                        continue;
                    };
                    p.failures += 1;
                    let failures = p.failures;
                    let over = failures > settings.max_per_instance_failures;
                    if over {
                        p.state = InstanceUpdateState::Failed;
                    }
                    u.event(
                        now,
                        format!("instance {instance} failure {failures}: {why}"),
                    );
                    if over {
                        left.push(instance);
                        u.watched.remove(&instance);
                        u.event(
                            now,
                            format!(
                                "instance {instance} failed ({failures} failure(s), \
                                 max_per_instance_failures {})",
                                settings.max_per_instance_failures
                            ),
                        );
                    }
                }
                Check::Waiting(at) => {
                    if let Some(at) = at {
                        watched += 1;
                        wake = Some(wake.map_or(at, |w: MonoMillis| w.min(at)));
                    } else {
                        starting += 1;
                    }
                }
            }
        }
        if !left.is_empty() {
            let left: BTreeSet<u32> = left.into_iter().collect();
            u.in_flight.retain(|i| !left.contains(i));
        }
        if !u.in_flight.is_empty() && u.view.state != UpdateState::Paused {
            let why = format!(
                "batch {}/{}: {watched} instance(s) RUNNING (each must stay RUNNING {}); \
                 {starting} starting, stopping or waiting for a place",
                u.view.batch, u.view.batches, settings.watch
            );
            changed |= set_waiting(u, Some(why));
        }
        if let Some(at) = wake.filter(|at| u.armed.is_none_or(|a| a <= now.mono || *at < a)) {
            u.armed = Some(at);
            self.push_timer(
                at,
                Timer::UpdateWatch {
                    job: u.view.job.clone(),
                },
            );
        }
        // Counted only when this step saw a failure (the count is over every instance).
        let failed = if failure { u.failed_instances() } else { 0 };
        if failure && failed > settings.max_total_failures && !u.view.state.is_terminal() {
            if back {
                u.view.state = UpdateState::Failed;
                u.paused_from = None;
                u.in_flight.clear();
                u.event(
                    now,
                    format!("failed: {failed} instance(s) failed while rolling back; stopped"),
                );
            } else if settings.rollback_on_failure {
                u.paused_from = None;
                begin_rollback(
                    u,
                    now,
                    format!(
                        "{failed} failed instance(s) > max_total_failures {}",
                        settings.max_total_failures
                    ),
                );
            } else {
                u.view.state = UpdateState::Failed;
                u.paused_from = None;
                u.in_flight.clear();
                u.event(
                    now,
                    format!(
                        "failed: {failed} failed instance(s) > max_total_failures {}; \
                         rollback_on_failure is off, instances stay as they are",
                        settings.max_total_failures
                    ),
                );
            }
            changed = true;
        }
        changed
    }

    /// Whether an instance in flight reached `want` (None: gone).
    fn check_instance(
        &mut self,
        u: &mut UpdateRecord,
        instance: u32,
        want: Option<&str>,
        now: Now,
        settings: &drover_common::spec::UpdateConfig,
    ) -> Check {
        let current = self.current_of(&u.view.job, instance);
        let task = current.as_ref().and_then(|id| self.tasks.get(id));
        let Some(want) = want else {
            return match task {
                Some(t) if !t.status.state.is_terminal() => Check::Waiting(None),
                _ => Check::Done,
            };
        };
        let Some(task) = task else {
            return Check::Waiting(None);
        };
        let watched = u.watched.get(&instance).cloned();
        if watched.as_deref() != Some(task.id.as_str()) {
            u.watched.insert(instance, task.id.clone());
            // The watched task ended and the lifecycle replaced it. Lost with its
            // agent (`agent_lost`), it is no failure of the config, as a drained
            // one is not: its replacement is watched in its place.
            if let Some(old) = watched.and_then(|id| self.tasks.get(&id)) {
                if old.status.state.is_terminal()
                    && old.desired == DesiredState::Running
                    && old.status.exit_reason != Some(ExitReason::AgentLost)
                {
                    return Check::Failed(ended(old));
                }
            }
        }
        if task.config != want {
            return Check::Waiting(None);
        }
        let state = task.status.state;
        if state.is_terminal() {
            // Nothing replaced it: a batch job that finished (done) or gave up.
            if state == TaskState::Finished {
                return Check::Done;
            }
            if task.desired == DesiredState::Running {
                // Counted once: the instance is failed outright.
                let why = ended(task);
                u.watched.remove(&instance);
                if let Some(p) = u.progress(instance) {
                    p.failures = p.failures.max(settings.max_per_instance_failures);
                }
                return Check::Failed(why);
            }
            return Check::Waiting(None);
        }
        match (state, task.running_mono) {
            (TaskState::Running, Some(since)) => {
                let due = since + settings.watch.0.as_millis() as u64;
                if due <= now.mono {
                    Check::Done
                } else {
                    Check::Waiting(Some(due))
                }
            }
            _ => Check::Waiting(None),
        }
    }

    fn start_forward_batch(&mut self, u: &mut UpdateRecord, now: Now) -> Batch {
        if u.next >= u.view.instances.len() {
            return Batch::Done;
        }
        let room = match self.batch_room(u) {
            Ok(room) => room,
            Err(why) => return Batch::Held(why),
        };
        let end = (u.next + room).min(u.view.instances.len());
        let batch: Vec<InstanceProgress> = u.view.instances[u.next..end].to_vec();
        u.next = end;
        let left = u.view.instances.len() - end;
        count_batch(u, left);
        self.batch_started(UpdateDirection::Forward, batch.len());
        let list: Vec<u32> = batch.iter().map(|p| p.instance).collect();
        u.event(now, format!("batch: instances {}", join(&list)));
        for p in batch {
            self.move_instance(u, p.instance, p.to.as_deref(), now);
            if let Some(q) = u.progress(p.instance) {
                q.state = InstanceUpdateState::Updating;
            }
        }
        Batch::Started
    }

    fn start_back_batch(&mut self, u: &mut UpdateRecord, now: Now) -> Batch {
        if u.back_next >= u.back.len() {
            return Batch::Done;
        }
        let room = match self.batch_room(u) {
            Ok(room) => room,
            Err(why) => return Batch::Held(why),
        };
        let end = (u.back_next + room).min(u.back.len());
        let list: Vec<u32> = u.back[u.back_next..end].to_vec();
        u.back_next = end;
        let left = u.back.len() - end;
        count_batch(u, left);
        self.batch_started(UpdateDirection::Rollback, list.len());
        u.event(now, format!("rollback batch: instances {}", join(&list)));
        for instance in list {
            let from = u.progress(instance).and_then(|p| p.from.clone());
            self.move_instance(u, instance, from.as_deref(), now);
            if let Some(q) = u.progress(instance) {
                q.state = InstanceUpdateState::RollingBack;
            }
        }
        Batch::Started
    }

    /// Puts one instance on config `to` (None: removes it) and adds it to the batch.
    fn move_instance(&mut self, u: &mut UpdateRecord, instance: u32, to: Option<&str>, now: Now) {
        let job = u.view.job.clone();
        u.in_flight.push(instance);
        u.watched.remove(&instance);
        let current = self.current_of(&job, instance);
        let Some(to) = to else {
            if let Some(id) = current {
                self.stop_task_for(
                    &id,
                    TaskState::Killing,
                    EventSource::Master,
                    ExitReason::Updated,
                    "removed by update",
                    now,
                );
            }
            return;
        };
        let id = match current {
            Some(id) => {
                let same = self
                    .tasks
                    .get(&id)
                    .is_some_and(|t| t.config == to && !t.status.state.is_terminal());
                if same {
                    u.watched.insert(instance, id);
                    return;
                }
                self.stop_task_for(
                    &id,
                    TaskState::Restarting,
                    EventSource::Master,
                    ExitReason::Updated,
                    "replaced by update",
                    now,
                );
                if self.replace_at_end(&id, Some(to)) {
                    // Replaced on `to` when it ended; watched till then.
                    u.watched.insert(instance, id);
                    return;
                }
                let why = format!("update {}", u.view.id);
                self.create_replacement(&id, now, None, &why)
            }
            None => self.add_instance(&job, instance, now),
        };
        if let Some(id) = id {
            if let Some(t) = self.tasks.get_mut(&id) {
                t.config = to.to_string();
            }
            self.mark(&id);
            u.watched.insert(instance, id);
        }
    }

    /// A first task for a new instance (slots grow up to it).
    fn add_instance(&mut self, job: &str, instance: u32, now: Now) -> Option<String> {
        let name = self.jobs.get(job)?.spec.name.clone();
        let id = self.next_task_id(&name, instance);
        let task = new_task(
            &id,
            job,
            instance,
            0,
            now.wall,
            TaskState::Pending,
            "added by update",
        );
        let j = self.jobs.get_mut(job)?;
        if j.slots.len() <= instance as usize {
            j.slots.resize(instance as usize + 1, Slot::default());
        }
        j.slots[instance as usize].current = Some(id.clone());
        self.tasks.insert(id.clone(), Box::new(task));
        self.queue.push_back(id.clone());
        Some(id)
    }

    /// The last batch is done: the job takes its final shape.
    fn finish_update(&mut self, u: &mut UpdateRecord, now: Now) {
        let job = u.view.job.clone();
        let (state, count) = if u.view.state == UpdateState::RollingBack {
            let restored = self.jobs.get(&job).and_then(|j| {
                let spec = j.configs.get(&u.old_config)?.spec.clone();
                Some((spec, j.created_ms))
            });
            if let Some((config, created)) = restored {
                let mut spec = config.as_ref().clone();
                spec.instances = u.view.instances_before;
                let spec = Arc::new(spec);
                let constraints = constraints_of(&spec).unwrap_or_default();
                if let Some(j) = self.jobs.get_mut(&job) {
                    if let Some(c) = j.configs.get_mut(&u.old_config) {
                        c.used_ms = now.wall;
                    }
                    j.spec = spec.clone();
                    j.config = u.old_config.clone();
                    j.need = need_of(&spec);
                    j.constraints = constraints;
                    j.candidates = None;
                }
                self.job_changes
                    .push(Change::PutJob(spec, job.clone(), created));
                // The job's newest config again (for `config_history`).
                self.job_changes.push(Change::PutConfig {
                    job: job.clone(),
                    hash: u.old_config.clone(),
                    spec: config,
                    used_ms: now.wall,
                });
            }
            (UpdateState::RolledBack, u.view.instances_before)
        } else {
            (UpdateState::RolledForward, u.view.instances_after)
        };
        self.trim_slots(&job, count);
        u.view.state = state;
        u.event(now, format!("{state}"));
    }

    /// Drops the job's task configs no longer needed, durably (`DeleteConfig`):
    /// each is kept while an instance runs it (a current task, or any task not yet
    /// ended), while an unfinished update may move an instance to it or back (its
    /// instances' configs before and after, the job's config before), and when it
    /// is among the newest `config_history` by when it last became the job's
    /// newest config. The job's newest config is always kept.
    pub(super) fn prune_configs(&mut self, job: &str) {
        let Some(j) = self.jobs.get(job) else {
            return;
        };
        let keep_newest = self.cfg.config_history;
        if j.configs.len() <= keep_newest.max(1) {
            return;
        }
        let mut keep: BTreeSet<&str> = BTreeSet::new();
        keep.insert(j.config.as_str());
        for slot in &j.slots {
            for id in slot.current.iter().chain(slot.history.iter()) {
                let Some(t) = self.tasks.get(id) else {
                    continue;
                };
                if slot.current.as_ref() == Some(id) || !t.status.state.is_terminal() {
                    keep.insert(t.config.as_str());
                }
            }
        }
        if let Some(u) = self
            .updates
            .get(job)
            .filter(|u| !u.view.state.is_terminal())
        {
            keep.insert(u.old_config.as_str());
            for p in &u.view.instances {
                keep.extend(p.from.as_deref());
                keep.extend(p.to.as_deref());
            }
        }
        let mut by_age: Vec<(&String, &JobConfig)> = j.configs.iter().collect();
        by_age.sort_by(|a, b| b.1.used_ms.cmp(&a.1.used_ms).then(b.0.cmp(a.0)));
        keep.extend(by_age.iter().take(keep_newest).map(|(h, _)| h.as_str()));
        let drop: Vec<String> = j
            .configs
            .keys()
            .filter(|h| !keep.contains(h.as_str()))
            .cloned()
            .collect();
        if drop.is_empty() {
            return;
        }
        if let Some(j) = self.jobs.get_mut(job) {
            for hash in drop {
                j.configs.remove(&hash);
                self.job_changes.push(Change::DeleteConfig {
                    job: job.to_string(),
                    hash,
                });
            }
        }
    }

    /// Drops the slots at and above `count` whose tasks have all ended.
    fn trim_slots(&mut self, job: &str, count: u32) {
        loop {
            let Some(j) = self.jobs.get(job) else {
                return;
            };
            if j.slots.len() as u32 <= count {
                return;
            }
            let Some(last) = j.slots.last() else {
                return;
            };
            let ids: Vec<String> = last
                .current
                .iter()
                .chain(last.history.iter())
                .cloned()
                .collect();
            if ids.iter().any(|id| {
                self.tasks
                    .get(id)
                    .is_some_and(|t| !t.status.state.is_terminal())
            }) {
                return;
            }
            if let Some(j) = self.jobs.get_mut(job) {
                j.slots.pop();
                // A task still counted towards a limit (it ended in this event)
                // leaves the kept limit counts to be counted afresh.
                if j.limit_cache
                    .as_ref()
                    .is_some_and(|c| ids.iter().any(|id| c.counts_task(id)))
                {
                    j.limit_cache = None;
                }
            }
            for id in ids {
                self.tasks.remove(&id);
                self.dirty_tasks.remove(&id);
                self.deleted_tasks.push(id);
            }
        }
    }
}

fn instance_progress(instance: u32, from: Option<String>, to: Option<&str>) -> InstanceProgress {
    InstanceProgress {
        instance,
        from,
        to: to.map(str::to_string),
        state: InstanceUpdateState::Pending,
        failures: 0,
    }
}

/// Turns the update around: every instance started forward goes back, the last
/// started first (seed 001: (6,7,8-FAIL) rolls back as (8,7,6) (5,4,3) (2,1,0)).
fn begin_rollback(u: &mut UpdateRecord, now: Now, why: String) {
    let started: Vec<u32> = u.view.instances[..u.next]
        .iter()
        .map(|p| p.instance)
        .rev()
        .collect();
    u.back = started;
    u.back_next = 0;
    u.view.batch = 0;
    u.view.batches = 0;
    u.in_flight.clear();
    u.watched.clear();
    u.view.state = UpdateState::RollingBack;
    u.event(now, format!("rolling back: {why}"));
}

fn ended(task: &super::Task) -> String {
    match &task.status.exit_reason {
        Some(r) => format!("task {} ended {} ({r})", task.id, task.status.state),
        None => format!("task {} ended {}", task.id, task.status.state),
    }
}

fn join(list: &[u32]) -> String {
    list.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}
