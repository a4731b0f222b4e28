//! The task lifecycle: status reports from the executors, the end of a task (its
//! resources freed), the decision to replace it (services always, batch jobs up to
//! `max_task_failures`), THROTTLED penalties for flapping, and LOST by the master.

use std::collections::HashSet;

use drover_common::state::{DesiredState, EventSource, ExitReason, TaskState};
use drover_common::wire::{StatusAck, StatusUpdate};

use super::model::new_task;
use super::timers::Timer;
use super::{Core, CoreError, Now, Reply};

impl Core {
    /// Applies an agent's status reports in order and acknowledges, per task, the
    /// highest seq received (applied, or older than one applied).
    pub(super) fn status_reports(
        &mut self,
        agent: &str,
        reports: Vec<StatusUpdate>,
        now: Now,
    ) -> Result<Reply, CoreError> {
        if !self.agent_idx.contains_key(agent) {
            return Err(CoreError::UnknownAgent(agent.to_string()));
        }
        let mut acked: Vec<(String, u64)> = Vec::new();
        for u in reports {
            match acked.iter_mut().find(|(id, _)| *id == u.task_id) {
                Some(entry) => entry.1 = entry.1.max(u.seq),
                None => acked.push((u.task_id.clone(), u.seq)),
            }
            self.apply_status_report(agent, u, now);
        }
        Ok(Reply::Ack(StatusAck { acked }))
    }

    pub(super) fn apply_status_report(&mut self, agent: &str, u: StatusUpdate, now: Now) {
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
        task.last_report_ms = now.mono;
        task.missing_since = None;
        if !u.processes.is_empty() {
            task.processes = u.processes;
            task.processes_omitted = u.processes_omitted;
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
                    now.wall,
                    EventSource::Executor,
                    &u.message,
                );
                self.push_timer(
                    now.mono + self.cfg.transient_timeout_ms,
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
                            now.wall,
                            EventSource::Executor,
                            &u.message,
                        )
                        .is_ok() =>
            {
                task.running_since = Some(now.wall);
                task.running_mono = Some(now.mono);
            }
            // Progress while STARTING (the agent fetching artifacts, then the
            // executor): the STARTING event's message follows, without a new event.
            TaskState::Starting if from == TaskState::Starting && !u.message.is_empty() => {
                if let Some(e) = task
                    .status
                    .events
                    .last_mut()
                    .filter(|e| e.state == TaskState::Starting)
                {
                    e.message = u.message;
                }
            }
            // An announced task's executor stops it for a failed health check or a
            // broken limit (its disk) after its drain delay, saying so in a RUNNING
            // report with the reason: withdrawn now (ended, as usual, when it
            // reports so).
            TaskState::Running
                if from == TaskState::Running
                    && task.withdrawn_ms.is_none()
                    && matches!(
                        u.exit_reason,
                        Some(
                            ExitReason::HealthCheckFailed { .. }
                                | ExitReason::DiskLimitExceeded { .. }
                        )
                    ) =>
            {
                task.withdrawn_ms = Some(now.wall);
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

    /// Creates the next task of `old`'s instance: PENDING, or THROTTLED until
    /// `throttle` ends (penalty ms, flaps, the cause its event names). The old task
    /// moves into the history.
    pub(super) fn create_replacement(
        &mut self,
        old_id: &str,
        now: Now,
        throttle: Option<(u64, u32, &str)>,
        why: &str,
    ) -> Option<String> {
        let old = self.tasks.get(old_id)?;
        let (job_key, instance, gen, failures) =
            (old.job.clone(), old.instance, old.gen, old.failures);
        let config = old.config.clone();
        let failed_now = u32::from(old.status.state == TaskState::Failed);
        let name = self.jobs.get(&job_key)?.spec.name.clone();
        let id = self.next_task_id(&name, instance);
        let (initial, flaps, penalty) = match throttle {
            Some((penalty, flaps, cause)) => (TaskState::Throttled, flaps, Some((penalty, cause))),
            None => (TaskState::Pending, 0, None),
        };
        let message = match penalty {
            Some((p, cause)) => format!("{why}; throttled for {p} ms ({cause})"),
            None => format!("{why}; replaces {old_id}"),
        };
        let penalty = penalty.map(|(p, _)| p);
        let mut task = new_task(
            &id,
            &job_key,
            instance,
            gen + 1,
            now.wall,
            initial,
            &message,
        );
        task.failures = failures + failed_now;
        task.flaps = flaps;
        task.throttle_until = penalty.map(|p| now.wall + p);
        task.config = config;
        self.tasks.insert(id.clone(), Box::new(task));
        self.mark(&id);
        match penalty {
            Some(p) => self.push_timer(now.mono + p, Timer::Throttle { task: id.clone() }),
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
            // A pruned task still counted towards a limit (it ended in this event)
            // leaves its job's limit counts to be counted afresh.
            if let Some(cache) = &job.limit_cache {
                if drop.iter().any(|h| cache.counts_task(h)) {
                    job.limit_cache = None;
                }
            }
            for h in drop {
                self.tasks.remove(h);
                self.dirty_tasks.remove(h);
                self.deleted_tasks.push(h.clone());
            }
        }
        Some(id)
    }

    /// Moves a task to a terminal state and frees its resources.
    pub(super) fn end_task(
        &mut self,
        id: &str,
        to: TaskState,
        reason: Option<ExitReason>,
        source: EventSource,
        message: &str,
        now: Now,
    ) -> bool {
        let Some(task) = self.tasks.get_mut(id) else {
            return false;
        };
        if task
            .status
            .transition(to, reason, now.wall, source, message)
            .is_err()
        {
            return false;
        }
        task.missing_since = None;
        let agent = task.agent.clone();
        let ports: Vec<u16> = task.ports.iter().map(|(_, p)| *p).collect();
        let need = self
            .jobs
            .get(&task.job)
            .map(|j| j.need_for(&task.config))
            .unwrap_or_default();
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
                self.note_usage(idx);
                let a = &mut self.agents[idx as usize];
                if a.reserved_for.is_empty() {
                    self.capacity_changed = true;
                } else {
                    // Promised to preemptors first; others only get what is left.
                    self.reserved_wake.insert(idx);
                    if a.has_room_beyond_reservations() {
                        self.capacity_changed = true;
                    }
                }
            }
            if source == EventSource::Executor {
                self.bump_agent_quietly(idx);
            } else {
                self.bump_agent(idx);
            }
        }
        self.note_task_end(id, now);
        true
    }

    /// After a task the master wanted running ended: replace it as its job says.
    pub(super) fn replace_after_end(&mut self, id: &str, now: Now) {
        let Some(task) = self.tasks.get(id) else {
            return;
        };
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
        if task.desired != DesiredState::Running {
            // A restart or update that waited for this task's end (an exclusive
            // task on a lost host, see `replace_at_end`) makes its replacement now.
            if let Some(config) = self.tasks.get_mut(id).and_then(|t| t.replace_at_end.take()) {
                let why = format!("{id} ended; the restart or update it waited for");
                if let Some(new) = self.create_replacement(id, now, None, &why) {
                    if let Some(t) = self.tasks.get_mut(&new) {
                        t.config = config;
                    }
                }
            }
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
        let ran = task.running_mono.map(|s| now.mono.saturating_sub(s));
        let flapping = natural && ran.is_none_or(|r| r < self.cfg.flapping_threshold_ms);
        let mut throttle = if flapping {
            let shift = task.flaps.min(20);
            let penalty = self
                .cfg
                .throttle_initial_ms
                .saturating_mul(1u64 << shift)
                .min(self.cfg.throttle_max_ms);
            Some((penalty, task.flaps + 1, "flapping"))
        } else {
            None
        };
        // An exclusive task LOST for the transient-state timeout may still be
        // started by its agent (its assignment sets lost, say): the replacement
        // waits the lease and kill time, as after the agent's loss, for the agent
        // to kill that copy as errant.
        let stuck = matches!(
            task.status.exit_reason,
            Some(ExitReason::TransientStateTimeout { .. })
        );
        if stuck && spec.partition_policy.exclusive {
            let wait = self.exclusive_wait_ms(spec, task.agent.as_deref(), now);
            throttle = match throttle {
                Some((p, flaps, why)) if p >= wait => Some((p, flaps, why)),
                Some((_, flaps, _)) => Some((wait, flaps, "exclusive: lease and kill time")),
                None => Some((wait, 0, "exclusive: lease and kill time")),
            };
        }
        let why = format!("{} ended {state}", id);
        self.create_replacement(id, now, throttle, &why);
    }

    /// LOST by the master's decision (timeouts, agent loss, reconciliation), then
    /// replaced.
    pub(super) fn lose_task(
        &mut self,
        id: &str,
        reason: ExitReason,
        source: EventSource,
        now: Now,
    ) {
        let task = self.tasks.get(id);
        let stopping = task.is_some_and(|t| t.status.state.is_stopping());
        let to = if stopping {
            TaskState::Killed
        } else {
            TaskState::Lost
        };
        // A stopping task gone from its agent ended as it was asked to: with the
        // reason it was stopped for (killed by request, drained, updated).
        let reason = match task.and_then(|t| t.kill_reason.clone()) {
            Some(asked) if stopping => asked,
            _ => reason,
        };
        let message = reason.to_string();
        let reason = Some(reason);
        if self.end_task(id, to, reason, source, &message, now) {
            self.replace_after_end(id, now);
        }
    }
}
