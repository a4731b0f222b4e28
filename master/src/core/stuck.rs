//! Why an update or a drain cannot go on as things stand. Both wait for tasks
//! to be placed; when the scheduler refuses them for reasons that only an
//! operator changes (the job's own limits and constraints, hosts in maintenance:
//! not resources that other tasks may free, not an agent that may come back) and
//! no task of the job is starting or stopping (whose end would free a place), the
//! wait can never end by itself. The views say so (`UpdateView::stuck`,
//! `HostView::stuck`), read-time only, so `job update --wait` and `host drain
//! --wait` end early with the scheduler's reason instead of waiting out their
//! timeout.

use drover_common::state::TaskState;
use drover_common::wire::MaintenanceMode;

use super::Core;

/// The PENDING current tasks among some instances of a job, and why they wait.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Pending {
    /// How many of the instances looked at have a PENDING current task.
    pub(super) count: usize,
    /// The scheduler's reason (`host limit reached on 1 agent`).
    pub(super) reason: String,
    /// Only an operator changes it (see the module doc).
    pub(super) stuck: bool,
}

impl Pending {
    /// `1 instance(s) PENDING: host limit reached on 1 agent`.
    pub(super) fn describe(&self) -> String {
        format!("{} instance(s) PENDING: {}", self.count, self.reason)
    }
}

impl Core {
    /// Among `instances` of `job` (empty: all of them), those whose current task
    /// is PENDING and why; None when none is, or the scheduler has not said why.
    pub(super) fn pending_of(&self, job: &str, instances: &[u32]) -> Option<Pending> {
        let j = self.jobs.get(job)?;
        let reason = j.pending_reason.clone()?;
        let state_of = |id: &String| self.tasks.get(id).map(|t| t.status.state);
        let looked_at: Box<dyn Iterator<Item = u32>> = if instances.is_empty() {
            Box::new(0..j.slots.len() as u32)
        } else {
            Box::new(instances.iter().copied())
        };
        let count = looked_at
            .filter_map(|i| j.slots.get(i as usize))
            .filter(|s| s.current.as_ref().and_then(state_of) == Some(TaskState::Pending))
            .count();
        if count == 0 {
            return None;
        }
        // A task of the job that is starting or stopping may free a place (its
        // limit count, its resources) or fail and change what is asked.
        let settled = j.slots.iter().all(|s| {
            s.current.iter().chain(s.history.iter()).all(|id| {
                state_of(id).is_none_or(|state| {
                    state.is_terminal() || matches!(state, TaskState::Pending | TaskState::Running)
                })
            })
        });
        Some(Pending {
            count,
            reason,
            stuck: j.pending_fixed && settled,
        })
    }

    /// While host `idx` drains, `blocked` by some jobs (`JOB: why` lines): why it
    /// cannot go on, when every one of them waits for replacements stuck PENDING.
    pub(super) fn drain_stuck(&self, idx: u32, blocked: &[String]) -> Option<String> {
        let a = self.agents.get(idx as usize)?;
        if a.rec.maintenance.mode != MaintenanceMode::Draining || !a.reachable {
            return None;
        }
        let mut why = Vec::new();
        for line in blocked {
            // Each line is `JOB: why` (see `Budget::check`); a line of no job
            // (an unreachable host) is not stuck.
            let (job, _) = line.split_once(": ")?;
            let pending = self.pending_of(job, &[]).filter(|p| p.stuck)?;
            why.push(format!("{job}: {}", pending.describe()));
        }
        (!why.is_empty()).then(|| {
            format!(
                "{}; the drain waits for them and nothing it does changes that (more \
                 agents, a looser constraint in a new spec, or a drain deadline would)",
                why.join("; ")
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pending_line_names_the_count_and_the_reason() {
        let p = Pending {
            count: 2,
            reason: "host limit reached on 1 agent".to_string(),
            stuck: true,
        };
        assert_eq!(
            p.describe(),
            "2 instance(s) PENDING: host limit reached on 1 agent"
        );
    }
}
