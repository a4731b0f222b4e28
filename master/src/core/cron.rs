//! Cron jobs (Aurora): a job with a `cron_schedule` is stored as a template and
//! each firing starts a run of it (a task per instance). The timetable is pure and
//! lives in common ([`drover_common::cron`]: the schedule, its validation, the
//! catch-up rule); the glue here (`impl Core`) arms the firing timers, applies the
//! collision policy and records each firing durably.
//!
//! - A firing while the previous run still has active tasks: KILL_EXISTING kills
//!   them and starts the new run, CANCEL_NEW skips the firing.
//! - The last firing handled is stored in the same batch as the run it started, so
//!   a restarted master never runs one firing twice. Firings missed while the master
//!   was down: the latest of them runs once at start if it is at most `cron_grace`
//!   old; older ones are skipped (no burst of missed runs).
//! - Timers are monotonic: a firing's timer is armed for the wall-clock distance to
//!   it and checked against the wall clock when it fires (a clock stepped back
//!   re-arms it).

use std::sync::Arc;

pub use drover_common::cron::{catch_up, job_schedule, parse, CronSpecError, Schedule};
use drover_common::spec::CronCollisionPolicy;
use drover_common::state::{EventSource, TaskState, UnixMillis};
use drover_common::wire::{ActionResponse, CronView};

use super::model::new_task;
use super::timers::Timer;
use super::{Change, Core, CoreError, Now, Reply};

impl Core {
    /// The spec's schedule parsed, or the error naming the field (the validator in
    /// common, with the `cron_seconds` switch).
    pub(super) fn schedule_of(
        &self,
        spec: &drover_common::spec::JobSpec,
    ) -> Result<Option<Arc<Schedule>>, CoreError> {
        job_schedule(spec, self.cfg.cron_seconds)
            .map(|s| s.map(Arc::new))
            .map_err(CoreError::BadCron)
    }

    /// Arms the timer of the job's next firing after `after` (wall clock) and after
    /// its last firing: a time fires at most once, even when the wall clock stepped
    /// back over firings already made (at a restart, the catch-up and this arm by a
    /// wall clock behind `last_fired`).
    pub(super) fn arm_cron(&mut self, key: &str, after: UnixMillis, now: Now) {
        let Some(cron) = self.jobs.get_mut(key).and_then(|j| j.cron.as_mut()) else {
            return;
        };
        let after = cron.last_fired.map_or(after, |last| after.max(last));
        cron.next = cron.schedule.next_after(after);
        if let Some(next) = cron.next {
            let at = now.mono + next.saturating_sub(now.wall);
            self.push_timer(
                at,
                Timer::Cron {
                    job: key.to_string(),
                    at_wall: next,
                },
            );
        }
    }

    /// A firing timer: runs the firing if it is still the job's next one and due
    /// by the wall clock.
    pub(super) fn cron_timer(&mut self, key: &str, at_wall: UnixMillis, now: Now) {
        let Some(cron) = self.jobs.get(key).and_then(|j| j.cron.as_ref()) else {
            return;
        };
        if cron.next != Some(at_wall) {
            return;
        }
        if now.wall < at_wall {
            // The wall clock is behind the monotonic estimate: wait the rest.
            self.push_timer(
                now.mono + (at_wall - now.wall),
                Timer::Cron {
                    job: key.to_string(),
                    at_wall,
                },
            );
            return;
        }
        self.cron_fire(key, Some(at_wall), now);
        self.arm_cron(key, now.wall.max(at_wall), now);
    }

    /// One firing of cron job `key` (`scheduled`: the firing time; None: started by
    /// hand). Applies the collision policy and answers the tasks started.
    pub(super) fn cron_fire(
        &mut self,
        key: &str,
        scheduled: Option<UnixMillis>,
        now: Now,
    ) -> Vec<String> {
        let Some(job) = self.jobs.get(key) else {
            return Vec::new();
        };
        let policy = job.spec.cron_collision_policy;
        let active: Vec<String> = job
            .slots
            .iter()
            .filter_map(|s| s.current.clone())
            .filter(|id| {
                self.tasks
                    .get(id)
                    .is_some_and(|t| !t.status.state.is_terminal())
            })
            .collect();
        if let Some(at) = scheduled {
            if let Some(c) = self.jobs.get_mut(key).and_then(|j| j.cron.as_mut()) {
                c.last_fired = Some(at);
            }
            self.job_changes
                .push(Change::PutCronFired(key.to_string(), at));
        }
        if !active.is_empty() {
            match policy {
                CronCollisionPolicy::CancelNew => return Vec::new(),
                CronCollisionPolicy::KillExisting => {
                    for id in &active {
                        self.stop_task(
                            id,
                            TaskState::Killing,
                            EventSource::Master,
                            "killed by a new cron run (KILL_EXISTING)",
                            now,
                        );
                    }
                }
            }
        }
        let why = match scheduled {
            Some(at) => format!("cron firing at {at}"),
            None => "cron run started by hand".to_string(),
        };
        self.start_run(key, &why, now)
    }

    /// A new task in every instance of `key`, PENDING; older tasks move into the
    /// history.
    fn start_run(&mut self, key: &str, why: &str, now: Now) -> Vec<String> {
        let Some(job) = self.jobs.get(key) else {
            return Vec::new();
        };
        let (name, n) = (job.spec.name.clone(), job.slots.len());
        let mut ids = Vec::with_capacity(n);
        for instance in 0..n as u32 {
            let current = self.current_of(key, instance);
            let id = match current {
                Some(old) => {
                    let Some(id) = self.create_replacement(&old, now, None, why) else {
                        continue;
                    };
                    if let Some(t) = self.tasks.get_mut(&id) {
                        t.failures = 0;
                    }
                    id
                }
                None => {
                    let id = self.next_task_id(&name, instance);
                    let task = new_task(&id, key, instance, 0, now.wall, TaskState::Pending, why);
                    self.tasks.insert(id.clone(), Box::new(task));
                    self.queue.push_back(id.clone());
                    self.mark(&id);
                    if let Some(slot) = self
                        .jobs
                        .get_mut(key)
                        .and_then(|j| j.slots.get_mut(instance as usize))
                    {
                        slot.current = Some(id.clone());
                    }
                    id
                }
            };
            ids.push(id);
        }
        ids
    }

    /// `drover cron start KEY`: a run now, under the collision policy; the schedule
    /// and its last firing are unchanged.
    pub(super) fn cron_start(&mut self, key: &str, now: Now) -> Result<Reply, CoreError> {
        self.cron_job(key)?;
        if let Some(job) = self.jobs.get(key) {
            self.check_user(&job.spec)?;
        }
        let tasks = self.cron_fire(key, None, now);
        Ok(Reply::Action(ActionResponse {
            update: None,
            job: key.to_string(),
            tasks,
        }))
    }

    /// `drover cron deschedule KEY`: no more firings. A job without active tasks
    /// is removed; one with a run going keeps it as an ordinary job.
    pub(super) fn cron_deschedule(&mut self, key: &str, now: Now) -> Result<Reply, CoreError> {
        self.cron_job(key)?;
        let active = self.job_active(key);
        if active {
            if let Some(job) = self.jobs.get_mut(key) {
                job.cron = None;
                let mut spec = job.spec.as_ref().clone();
                spec.cron_schedule = None;
                spec.cron_timezone = None;
                job.spec = Arc::new(spec);
                self.job_changes.push(Change::PutJob(
                    job.spec.clone(),
                    key.to_string(),
                    job.created_ms,
                ));
            }
        } else {
            self.drop_job(key);
        }
        let _ = now;
        Ok(Reply::Action(ActionResponse {
            update: None,
            job: key.to_string(),
            tasks: Vec::new(),
        }))
    }

    fn cron_job(&self, key: &str) -> Result<(), CoreError> {
        match self.jobs.get(key) {
            None => Err(CoreError::NoJob(key.to_string())),
            Some(j) if j.cron.is_none() => Err(CoreError::NotCron(key.to_string())),
            Some(_) => Ok(()),
        }
    }

    /// Whether any task of the job is not terminal.
    pub(super) fn job_active(&self, key: &str) -> bool {
        self.jobs.get(key).is_some_and(|j| {
            j.slots.iter().any(|s| {
                s.current.iter().chain(s.history.iter()).any(|id| {
                    self.tasks
                        .get(id)
                        .is_some_and(|t| !t.status.state.is_terminal())
                })
            })
        })
    }

    /// The cron view of job `key`, if it is a cron job.
    pub fn cron_view(&self, key: &str) -> Option<CronView> {
        let job = self.jobs.get(key)?;
        let cron = job.cron.as_ref()?;
        let active_tasks = job
            .slots
            .iter()
            .filter_map(|s| s.current.as_ref())
            .filter(|id| {
                self.tasks
                    .get(*id)
                    .is_some_and(|t| !t.status.state.is_terminal())
            })
            .count() as u32;
        Some(CronView {
            job: key.to_string(),
            schedule: cron.schedule.text().to_string(),
            timezone: cron.schedule.timezone().to_string(),
            collision_policy: job.spec.cron_collision_policy,
            next_fire_ms: cron.next,
            last_fired_ms: cron.last_fired,
            active_tasks,
        })
    }

    /// GET /v1/cron: every cron job, sorted by key.
    pub fn cron_views(&self) -> Vec<CronView> {
        self.jobs.keys().filter_map(|k| self.cron_view(k)).collect()
    }
}
