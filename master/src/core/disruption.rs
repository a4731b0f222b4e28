//! SLA budgets for drains (Aurora's `sla_policy`, a PodDisruptionBudget): how many
//! of a job's instances a drain may take down at once. Pure arithmetic over one
//! job's current tasks, kept up to date within one drain round as tasks are taken.
//! How long a task has been RUNNING is measured on the monotonic clock.

use drover_common::spec::SlaPolicy;
use drover_common::state::{MonoMillis, TaskState};

use super::model::Job;
use super::{Core, Task};

/// The policy of a job that declares none: one instance at a time.
const DEFAULT_MAX_DISRUPTED: u32 = 1;

/// One job's disruption budget during a drain round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Budget {
    job: String,
    instances: u32,
    /// Current tasks RUNNING for at least the policy's `min_time`.
    healthy: u32,
    /// Current tasks not terminal and not RUNNING (replacements on their way,
    /// tasks starting or stopping).
    disrupted: u32,
    /// `min_healthy` or `min_healthy_percent` resolved to a count.
    min_healthy: Option<u32>,
    max_disrupted: Option<u32>,
    min_time_ms: u64,
    /// When the next RUNNING task that is not yet healthy becomes healthy.
    pub(super) next_healthy_at: Option<MonoMillis>,
}

impl Budget {
    /// The budget of `job` at `now`; `task` looks a task up by id.
    pub(super) fn of<'a>(
        job: &Job,
        task: impl Fn(&str) -> Option<&'a Task>,
        now: MonoMillis,
    ) -> Budget {
        let states = job.slots.iter().map(|slot| {
            let t = slot.current.as_deref().and_then(&task)?;
            Some((t.status.state, t.running_mono))
        });
        Budget::of_states(job, states, now)
    }

    /// The budget of `job` at `now` from its slots' `seen` states (synced by
    /// [`Core::sync_slots`]): no task lookups, so a drain round over many jobs is
    /// cheap.
    pub(super) fn of_slots(job: &Job, now: MonoMillis) -> Budget {
        Budget::of_states(job, job.slots.iter().map(|s| s.seen), now)
    }

    /// The budget from each slot's current task (state, RUNNING since).
    fn of_states(
        job: &Job,
        states: impl Iterator<Item = Option<(TaskState, Option<MonoMillis>)>>,
        now: MonoMillis,
    ) -> Budget {
        let instances = job.slots.len() as u32;
        let (min_healthy, max_disrupted, min_time_ms) = match &job.spec.sla_policy {
            None => (None, Some(DEFAULT_MAX_DISRUPTED), 0),
            Some(p) => resolve(p, instances),
        };
        let mut b = Budget {
            job: job.key.clone(),
            instances,
            healthy: 0,
            disrupted: 0,
            min_healthy,
            max_disrupted,
            min_time_ms,
            next_healthy_at: None,
        };
        for (state, running_mono) in states.flatten() {
            match state {
                TaskState::Running => {
                    let since = running_mono.unwrap_or(0);
                    let at = since.saturating_add(min_time_ms);
                    if at <= now {
                        b.healthy += 1;
                    } else {
                        b.next_healthy_at = Some(b.next_healthy_at.map_or(at, |n| n.min(at)));
                    }
                }
                s if s.is_terminal() => {}
                _ => b.disrupted += 1,
            }
        }
        b
    }

    /// Whether a task counts as healthy under this budget.
    pub(super) fn is_healthy(&self, t: &Task, now: MonoMillis) -> bool {
        t.status.state == TaskState::Running
            && t.running_mono.unwrap_or(0).saturating_add(self.min_time_ms) <= now
    }

    /// Whether the policy can never let one instance go, whatever happens.
    pub(super) fn never(&self) -> bool {
        self.min_healthy.is_some_and(|k| k >= self.instances)
    }

    /// May one more RUNNING instance (healthy or not) be disrupted? If not, why.
    pub(super) fn check(&self, healthy: bool) -> Result<(), String> {
        if let Some(m) = self.max_disrupted {
            if self.disrupted + 1 > m {
                return Err(format!(
                    "{}: {} of {} instances disrupted, the policy allows {m} at once; waiting for replacements to run",
                    self.job, self.disrupted, self.instances
                ));
            }
        }
        if let Some(k) = self.min_healthy {
            if self.never() {
                return Err(format!(
                    "{}: the policy keeps {k} of {} instances healthy, so no instance can ever be drained; give the drain a deadline or relax sla_policy",
                    self.job, self.instances
                ));
            }
            if self.healthy.saturating_sub(u32::from(healthy)) < k {
                return Err(format!(
                    "{}: {} of {} instances healthy{}, the policy keeps {k}; waiting for replacements",
                    self.job,
                    self.healthy,
                    self.instances,
                    if self.min_time_ms > 0 {
                        format!(" for {} ms", self.min_time_ms)
                    } else {
                        String::new()
                    }
                ));
            }
        }
        Ok(())
    }

    /// How many healthy RUNNING instances the policy lets go at once now.
    pub(super) fn at_once(&self) -> u32 {
        let by_disrupted = self.max_disrupted.map(|m| m.saturating_sub(self.disrupted));
        let by_healthy = self.min_healthy.map(|k| self.healthy.saturating_sub(k));
        match (by_disrupted, by_healthy) {
            (Some(a), Some(b)) => a.min(b),
            (Some(a), None) | (None, Some(a)) => a,
            (None, None) => self.instances,
        }
    }

    /// Whether the policy keeps a minimum healthy time (ms).
    pub(super) fn min_time_ms(&self) -> u64 {
        self.min_time_ms
    }

    /// Records that one RUNNING instance was taken down.
    pub(super) fn take(&mut self, healthy: bool) {
        self.healthy -= u32::from(healthy && self.healthy > 0);
        self.disrupted += 1;
    }
}

impl Core {
    /// Copies the state of each task changed in this event that is its slot's
    /// current task into the slot (`Slot::seen`). Every change of a task marks it
    /// dirty (it must be stored), so the dirty set is a complete list of what
    /// changed; run before a drain round reads the slots and when an event ends.
    pub(super) fn sync_slots(&mut self) {
        for id in &self.dirty_tasks {
            let Some(t) = self.tasks.get(id) else {
                continue;
            };
            let Some(slot) = self
                .jobs
                .get_mut(&t.job)
                .and_then(|j| j.slots.get_mut(t.instance as usize))
            else {
                continue;
            };
            if slot.current.as_deref() == Some(id.as_str()) {
                slot.seen = Some((t.status.state, t.running_mono));
            }
        }
    }

    /// Slots whose `seen` state differs from their current task's (tests check
    /// after every event that there are none).
    #[cfg(test)]
    pub(super) fn slot_drift(&self) -> Option<String> {
        for (key, job) in &self.jobs {
            for (i, slot) in job.slots.iter().enumerate() {
                let actual = slot
                    .current
                    .as_ref()
                    .and_then(|id| self.tasks.get(id))
                    .map(|t| (t.status.state, t.running_mono));
                if actual != slot.seen {
                    return Some(format!(
                        "{key} instance {i}: seen {:?}, is {actual:?}",
                        slot.seen
                    ));
                }
            }
        }
        None
    }
}

/// (min healthy count, max disrupted, min time) of a written policy.
fn resolve(p: &SlaPolicy, instances: u32) -> (Option<u32>, Option<u32>, u64) {
    let pct = p
        .min_healthy_percent
        .map(|pct| (u64::from(pct.min(100)) * u64::from(instances)).div_ceil(100) as u32);
    (
        p.min_healthy.or(pct),
        p.max_disrupted,
        p.min_time.get().as_millis() as u64,
    )
}
