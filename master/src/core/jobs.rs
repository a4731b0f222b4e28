//! Jobs: creation (a PENDING task per instance), kill and restart of instances.

use std::sync::Arc;

use drover_common::spec::JobSpec;
use drover_common::state::{DesiredState, EventSource, ExitReason, TaskState};
use drover_common::wire::ActionResponse;

use super::model::CronState;
use super::model::{constraints_of, need_of, new_task, Job};
use super::{Change, Core, CoreError, Now, Reply};

impl Core {
    pub(super) fn create_job(&mut self, spec: JobSpec, now: Now) -> Result<Reply, CoreError> {
        let key = spec.key().to_string();
        let constraints = constraints_of(&spec)?;
        let schedule = self.schedule_of(&spec)?;
        self.check_user(&spec)?;
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
        if spec.is_production() {
            self.check_quota(&spec.role, &key, &need_of(&spec), spec.instances)?;
        }
        let spec = Arc::new(spec);
        self.job_changes
            .push(Change::PutJob(spec.clone(), key.clone(), now.wall));
        let mut job = Job::new(key.clone(), spec.clone(), now.wall);
        job.constraints = constraints;
        self.job_changes.push(Change::PutConfig {
            job: key.clone(),
            hash: job.config.clone(),
            spec: spec.clone(),
            used_ms: now.wall,
        });
        job.cron = schedule.map(|schedule| CronState {
            schedule,
            next: None,
            last_fired: None,
        });
        if job.cron.is_some() {
            // A template: each firing starts a run (see `cron`).
            self.jobs.insert(key.clone(), job);
            self.arm_cron(&key, now.wall, now);
            return Ok(Reply::JobCreated {
                job: key,
                tasks: Vec::new(),
            });
        }
        let mut ids = Vec::with_capacity(spec.instances as usize);
        for instance in 0..spec.instances {
            let id = self.next_task_id(&spec.name, instance);
            let mut task = new_task(
                &id,
                &key,
                instance,
                0,
                now.wall,
                TaskState::Pending,
                "created",
            );
            task.config = job.config.clone();
            job.slots[instance as usize].current = Some(id.clone());
            self.tasks.insert(id.clone(), Box::new(task));
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
    pub(super) fn drop_job(&mut self, key: &str) {
        if let Some(job) = self.jobs.remove(key) {
            for slot in job.slots {
                for id in slot.current.into_iter().chain(slot.history) {
                    self.tasks.remove(&id);
                    self.dirty_tasks.remove(&id);
                    self.deleted_tasks.push(id);
                }
            }
            self.blocked.remove(key);
            self.updates.remove(key);
            self.job_changes.push(Change::DeleteJob(key.to_string()));
        }
    }

    pub(super) fn instances_of(
        &self,
        job: &str,
        wanted: Option<Vec<u32>>,
    ) -> Result<Vec<u32>, CoreError> {
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

    pub(super) fn current_of(&self, job: &str, instance: u32) -> Option<String> {
        self.jobs
            .get(job)?
            .slots
            .get(instance as usize)?
            .current
            .clone()
    }

    /// Asks a task to stop: `via` is KILLING or RESTARTING for placed tasks; tasks not
    /// placed become KILLED at once. Returns whether anything changed.
    pub(super) fn stop_task(
        &mut self,
        id: &str,
        via: TaskState,
        source: EventSource,
        message: &str,
        now: Now,
    ) -> bool {
        // A restart says so in the replaced task's end (not "killed by request").
        let reason = if via == TaskState::Restarting {
            ExitReason::Restarted
        } else {
            ExitReason::KilledByRequest
        };
        self.stop_task_for(id, via, source, reason, message, now)
    }

    /// `stop_task` with the reason the task ends with (KILLED by request, updated).
    pub(super) fn stop_task_for(
        &mut self,
        id: &str,
        via: TaskState,
        source: EventSource,
        reason: ExitReason,
        message: &str,
        now: Now,
    ) -> bool {
        let Some(task) = self.tasks.get_mut(id) else {
            return false;
        };
        if via == TaskState::Killing
            && task.status.state.is_stopping()
            && task.replace_at_end.is_some()
        {
            // A kill (or an update removing the instance) overrides a restart or
            // update that waits for this task's end (see `replace_at_end`): no
            // replacement then.
            task.replace_at_end = None;
            task.kill_reason = Some(reason);
            self.mark(id);
            return true;
        }
        let state = task.status.state;
        if state.is_terminal() || state.is_stopping() {
            return false;
        }
        // Withdrawn from service discovery first; the kill waits `drain_delay`.
        let held = self.withdraw_before_kill(id, now);
        let Some(task) = self.tasks.get_mut(id) else {
            return false;
        };
        task.desired = DesiredState::Shutdown;
        task.kill_reason = Some(reason.clone());
        if matches!(state, TaskState::Pending | TaskState::Throttled) {
            self.release_reservation(id);
            let Some(task) = self.tasks.get_mut(id) else {
                return false;
            };
            let _ =
                task.status
                    .transition(TaskState::Killed, Some(reason), now.wall, source, message);
            self.mark(id);
            return true;
        }
        if task
            .status
            .transition(via, None, now.wall, source, message)
            .is_err()
        {
            return false;
        }
        let agent = task.agent.clone().filter(|_| !held);
        self.mark(id);
        if let Some(idx) = agent.and_then(|a| self.agent_idx.get(&a).copied()) {
            self.bump_agent(idx);
        }
        true
    }

    /// Kill (`via` KILLING) or restart (`via` RESTARTING: each stopped task gets a
    /// replacement) the current tasks of `instances` (all when None). Answers the
    /// tasks stopped, or for a restart the replacements created.
    pub(super) fn stop_instances(
        &mut self,
        job: &str,
        instances: Option<Vec<u32>>,
        via: TaskState,
        now: Now,
    ) -> Result<Reply, CoreError> {
        let restart = via == TaskState::Restarting;
        let message = if restart {
            "restart requested"
        } else {
            "killed by request"
        };
        let mut tasks = Vec::new();
        let instances = self.instances_of(job, instances)?;
        if restart {
            // Each replacement runs its instance's config: its user must be granted.
            let configs: Vec<String> = instances
                .iter()
                .filter_map(|i| self.current_of(job, *i))
                .filter_map(|id| self.tasks.get(&id))
                .filter(|t| !t.status.state.is_terminal())
                .map(|t| t.config.clone())
                .collect();
            self.check_configs_user(job, &configs)?;
        }
        // The current task is looked up as each instance comes: an instance named
        // twice meets the task the first round left there.
        for i in instances {
            let Some(id) = self.current_of(job, i) else {
                continue;
            };
            // A task already ended or stopping is left alone (stop_task says false).
            if !self.stop_task(&id, via, EventSource::Operator, message, now) {
                continue;
            }
            if !restart {
                tasks.push(id);
            } else if self.replace_at_end(&id, None) {
                // Replaced when it ended (see `replace_at_end`).
            } else if let Some(new_id) = self.create_replacement(&id, now, None, "restart") {
                tasks.push(new_id);
            }
        }
        Ok(Reply::Action(ActionResponse {
            update: None,
            job: job.to_string(),
            tasks,
        }))
    }

    /// An exclusive task just asked to stop for a restart or update (`config`:
    /// the replacement's; None: its own) on a host the master cannot reach: the
    /// kill may not get there, and a replacement made now could run beside it. It
    /// stays RESTARTING and is replaced when it ends (`replace_after_end`):
    /// reported by its agent once back, or ended by the partition policy after the
    /// lease and kill time, as a drain leaves such a task to the policy (b87e3d2).
    /// Answers whether it waits so (else the caller replaces it at once).
    pub(super) fn replace_at_end(&mut self, id: &str, config: Option<&str>) -> bool {
        let Some(t) = self.tasks.get(id) else {
            return false;
        };
        let exclusive = self
            .jobs
            .get(&t.job)
            .is_some_and(|j| j.spec.partition_policy.exclusive);
        let lost_host = t
            .agent
            .as_ref()
            .and_then(|a| self.agent_idx.get(a))
            .is_some_and(|&idx| !self.agents[idx as usize].reachable);
        if !exclusive || !lost_host || t.status.state != TaskState::Restarting {
            return false;
        }
        let config = config.map_or_else(|| t.config.clone(), str::to_string);
        if let Some(t) = self.tasks.get_mut(id) {
            t.replace_at_end = Some(config);
        }
        self.mark(id);
        true
    }
}
