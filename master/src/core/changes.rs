//! The change stream's read of the core (`GET /v1/changes`): every task and agent
//! whose row a store batch wrote after a given index, as current views. Each row
//! carries the number of the batch that last wrote it (`rev`), so the answer is
//! derived from the state itself and stays right across master restarts. Pure.

use std::collections::BTreeSet;

use drover_common::wire::{ChangesView, JobSummary};

use super::Core;

/// Which changes a client may and wants to see.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChangeFilter {
    /// Only this job's tasks (`role/env/name`).
    pub job: Option<String>,
    /// Only these roles' jobs; None: every role.
    pub roles: Option<Vec<String>>,
    /// Whether agents are included (tokens that may read everything).
    pub agents: bool,
}

impl Core {
    /// What was written in batches `after + 1 ..= upto` (`upto`: the last committed
    /// batch, so nothing uncommitted is shown), answered with `index = upto`.
    pub fn changes_since(&self, after: u64, upto: u64, filter: &ChangeFilter) -> ChangesView {
        let fresh = |rev: u64| rev > after && rev <= upto;
        let role_ok = |role: &str| {
            filter
                .roles
                .as_ref()
                .is_none_or(|roles| roles.iter().any(|r| r == role))
        };
        let mut tasks = Vec::new();
        let mut jobs = BTreeSet::new();
        match &filter.job {
            Some(key) => {
                if let Some(job) = self.jobs.get(key).filter(|j| role_ok(&j.spec.role)) {
                    let ids = job
                        .slots
                        .iter()
                        .flat_map(|s| s.history.iter().chain(s.current.iter()));
                    for t in ids.filter_map(|id| self.tasks.get(id)) {
                        if fresh(t.rev) {
                            tasks.push(self.task_view_of(t));
                            jobs.insert(key.as_str());
                        }
                    }
                }
            }
            None => {
                for t in self.tasks.values().filter(|t| fresh(t.rev)) {
                    let Some(job) = self.jobs.get(&t.job) else {
                        continue;
                    };
                    if role_ok(&job.spec.role) {
                        tasks.push(self.task_view_of(t));
                        jobs.insert(job.key.as_str());
                    }
                }
            }
        }
        tasks.sort_by(|a, b| {
            (&a.job, a.instance, &a.task_id).cmp(&(&b.job, b.instance, &b.task_id))
        });
        let jobs: Vec<JobSummary> = jobs
            .into_iter()
            .filter_map(|key| self.jobs.get(key))
            .map(|j| self.job_summary(j))
            .collect();
        let agents = if filter.agents {
            self.agent_views()
                .into_iter()
                .filter(|a| {
                    self.agent_idx
                        .get(&a.agent_id)
                        .is_some_and(|idx| fresh(self.agents[*idx as usize].rec.rev))
                })
                .collect()
        } else {
            Vec::new()
        };
        let updates = self
            .updates
            .values()
            .filter(|u| fresh(u.rev))
            .filter(|u| filter.job.as_ref().is_none_or(|key| *key == u.view.job))
            .filter(|u| {
                self.jobs
                    .get(&u.view.job)
                    .is_some_and(|j| role_ok(&j.spec.role))
            })
            .map(|u| u.view.clone())
            .collect();
        ChangesView {
            index: upto,
            reset: false,
            tasks,
            jobs,
            agents,
            updates,
        }
    }
}
