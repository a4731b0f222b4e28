//! Counts of the state for the `/metrics` gauges: tasks by state and tier, agents by
//! reachability and maintenance mode, PENDING tasks and why they wait, jobs running
//! as a user their role is not granted. Pure, one
//! pass over the tasks (a scrape of 100,000 tasks stays in milliseconds). Also the
//! note of an update batch started, handed out as an effect for the counters.

use std::collections::BTreeMap;

use drover_common::spec::Tier;
use drover_common::state::TaskState;

use super::{Core, UpdateDirection};

/// What `/metrics` shows of the state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetricsState {
    /// (state, tier of the task's own config) -> tasks.
    pub tasks_by_state: BTreeMap<(TaskState, &'static str), u64>,
    /// (reachable, maintenance mode) -> agents.
    pub agents: BTreeMap<(bool, String), u64>,
    pub pending: u64,
    /// Why PENDING tasks wait, most common first: each part of a job's pending
    /// reason without its agent count (`insufficient ram on 3 agents` counts as
    /// `insufficient ram`), so the label set stays small.
    pub pending_reasons: Vec<(String, u64)>,
    /// Jobs with a live task (or a cron template) running as a user their role is
    /// not granted (see `user_grants`).
    pub jobs_ungranted_user: u64,
}

impl Core {
    /// The counts behind the `/metrics` gauges.
    pub fn metrics_state(&self) -> MetricsState {
        let mut state = MetricsState::default();
        let mut pending_by_job: BTreeMap<&str, u64> = BTreeMap::new();
        for t in self.tasks.values() {
            let tier = match self.jobs.get(&t.job).map(|j| j.spec_of(&t.config).tier) {
                Some(Tier::Preemptible) => "preemptible",
                _ => "preferred",
            };
            *state
                .tasks_by_state
                .entry((t.status.state, tier))
                .or_insert(0) += 1;
            if t.status.state == TaskState::Pending {
                state.pending += 1;
                *pending_by_job.entry(t.job.as_str()).or_insert(0) += 1;
            }
        }
        for a in &self.agents {
            let mode = serde_json::to_value(a.rec.maintenance.mode)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default();
            *state.agents.entry((a.reachable, mode)).or_insert(0) += 1;
        }
        let mut reasons: BTreeMap<String, u64> = BTreeMap::new();
        for (job, n) in pending_by_job {
            let Some(reason) = self.jobs.get(job).and_then(|j| j.pending_reason.as_deref()) else {
                continue;
            };
            for part in reason.split("; ").map(without_agent_count) {
                *reasons.entry(part.to_string()).or_insert(0) += n;
            }
        }
        let mut reasons: Vec<(String, u64)> = reasons.into_iter().collect();
        reasons.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        state.pending_reasons = reasons;
        state.jobs_ungranted_user = self.ungranted_jobs(None).len() as u64;
        state
    }
}

impl Core {
    /// A rolling update started a batch of `instances`: reported with this event's
    /// effects ([`super::Effect::UpdateBatch`]).
    pub(super) fn batch_started(&mut self, direction: UpdateDirection, instances: usize) {
        self.batches_started
            .push((direction, u32::try_from(instances).unwrap_or(u32::MAX)));
    }
}

/// `insufficient ram on 3 agents` -> `insufficient ram`.
fn without_agent_count(part: &str) -> &str {
    match part.rsplit_once(" on ") {
        Some((what, count))
            if count
                .split_whitespace()
                .next()
                .is_some_and(|n| n.parse::<u64>().is_ok()) =>
        {
            what
        }
        _ => part,
    }
}

#[cfg(test)]
mod tests {
    use super::without_agent_count;

    #[test]
    fn agent_counts_are_cut_from_reasons() {
        assert_eq!(
            without_agent_count("insufficient ram on 3 agents"),
            "insufficient ram"
        );
        assert_eq!(
            without_agent_count("host limit reached on 1 agent"),
            "host limit reached"
        );
        assert_eq!(
            without_agent_count("no agents registered"),
            "no agents registered"
        );
    }
}
