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
use drover_common::spec::{JobSpec, UpdateConfig};
use drover_common::state::MonoMillis;
use drover_common::wire::{
    InstanceProgress, InstanceUpdateState, UpdateEvent, UpdateState, UpdateView,
};
use serde::{Deserialize, Serialize};

use super::model::{constraints_of, need_of, JobConfig};
use super::{Change, Core, CoreError, Now, Reply, UpdateAction};

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
    /// A rolling restart (`restart.rs`): each instance is replaced on the config
    /// it runs; no rollback.
    #[serde(default)]
    pub restart: bool,
}

/// What a new update starts from; everything else starts empty
/// ([`UpdateRecord::started`]).
pub(super) struct UpdateStart {
    pub id: String,
    pub job: String,
    pub user: String,
    pub settings: UpdateConfig,
    pub to_config: String,
    pub old_config: String,
    pub instances_before: u32,
    pub instances_after: u32,
    pub instances: Vec<InstanceProgress>,
    pub restart: bool,
}

impl UpdateRecord {
    /// A new update rolling forward from its first batch, started at `now`.
    pub(super) fn started(s: UpdateStart, now: Now) -> UpdateRecord {
        UpdateRecord {
            view: UpdateView {
                id: s.id,
                job: s.job,
                user: s.user,
                created_ms: now.wall,
                state: UpdateState::RollingForward,
                settings: s.settings,
                to_config: s.to_config,
                instances_before: s.instances_before,
                instances_after: s.instances_after,
                instances: s.instances,
                events: Vec::new(),
                batch: 0,
                batches: 0,
                waiting: None,
                stuck: None,
            },
            old_config: s.old_config,
            next: 0,
            back: Vec::new(),
            back_next: 0,
            in_flight: Vec::new(),
            watched: BTreeMap::new(),
            paused_from: None,
            rev: 0,
            armed: None,
            poked: true,
            restart: s.restart,
        }
    }

    pub(super) fn pos(&self, instance: u32) -> Option<usize> {
        self.view
            .instances
            .binary_search_by_key(&instance, |p| p.instance)
            .ok()
    }

    pub(super) fn progress(&mut self, instance: u32) -> Option<&mut InstanceProgress> {
        let pos = self.pos(instance)?;
        self.view.instances.get_mut(pos)
    }

    pub(super) fn event(&mut self, now: Now, message: String) {
        self.view.events.push(UpdateEvent {
            at_ms: now.wall,
            message,
        });
        if self.view.events.len() > MAX_EVENTS {
            let extra = self.view.events.len() - MAX_EVENTS;
            self.view.events.drain(..extra);
        }
    }

    pub(super) fn failed_instances(&self) -> u32 {
        self.view
            .instances
            .iter()
            .filter(|p| p.state == InstanceUpdateState::Failed)
            .count() as u32
    }

    pub(super) fn rolling_back(&self) -> bool {
        self.view.state == UpdateState::RollingBack
            || self.paused_from == Some(UpdateState::RollingBack)
    }
}

impl Core {
    /// Refuses to start an update or a rolling restart of `job` while one of
    /// its updates is not yet finished.
    pub(super) fn refuse_if_updating(&self, job: &str) -> Result<(), CoreError> {
        match self
            .updates
            .get(job)
            .filter(|u| !u.view.state.is_terminal())
        {
            Some(u) => Err(CoreError::UpdateRunning {
                job: job.to_string(),
                id: u.view.id.clone(),
                state: u.view.state.to_string(),
            }),
            None => Ok(()),
        }
    }

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
        self.refuse_if_updating(job)?;
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
        let mut u = UpdateRecord::started(
            UpdateStart {
                id: format!("{}-{}", job.replace('/', "-"), now.wall),
                job: job.to_string(),
                user: user.to_string(),
                settings,
                to_config: new_hash,
                old_config,
                instances_before: before,
                instances_after: plan.instances_after,
                instances: progress,
                restart: false,
            },
            now,
        );
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
                if u.restart {
                    return Err(bad(
                        "a rolling restart has no rollback (no instance changed config); \
                         abort it to stop it",
                    ));
                }
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
        } else if u.restart {
            // A rolling restart puts each instance back on its own config.
            u.view
                .instances
                .iter()
                .filter_map(|p| p.to.as_ref())
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
    pub(super) fn keep_instance_count(&mut self, job: &str, state: UpdateState) {
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
pub(super) fn begin_rollback(u: &mut UpdateRecord, now: Now, why: String) {
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
