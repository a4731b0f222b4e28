//! The rolling update engine (pure): after every event, each running update
//! moves one step: the instances in flight are checked (RUNNING through their
//! watch, failed, gone), failures counted against the update's limits, the next
//! batch started forward or back, and an update that is done finished. The
//! record, its views and the operators' actions are in `update.rs`.

use std::collections::BTreeSet;
use std::sync::Arc;

use drover_common::state::{DesiredState, EventSource, ExitReason, MonoMillis, TaskState};
use drover_common::wire::{InstanceProgress, InstanceUpdateState, MaintenanceMode, UpdateState};

use super::model::{constraints_of, need_of, new_task, Slot};
use super::timers::Timer;
use super::update::{begin_rollback, UpdateRecord};
use super::{Change, Core, Now, UpdateDirection};

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
                if !super::restart::replaces(u.restart, same) {
                    u.watched.insert(instance, id);
                    return;
                }
                let (reason, message) = if u.restart {
                    (ExitReason::Restarted, "restarted by a rolling restart")
                } else {
                    (ExitReason::Updated, "replaced by update")
                };
                self.stop_task_for(
                    &id,
                    TaskState::Restarting,
                    EventSource::Master,
                    reason,
                    message,
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
