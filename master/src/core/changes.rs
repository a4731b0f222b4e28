//! The change stream's read of the core (`GET /v1/changes`): every task and agent
//! whose row a store batch wrote after a given index, as current views. Each row
//! carries the number of the batch that last wrote it (`rev`), so the answer is
//! derived from the state itself and stays right across master restarts; a
//! `limit` cuts it into pages that go on from a (batch, task id) point. Pure.

use std::collections::BTreeSet;

use drover_common::wire::{ChangesView, JobSummary};

use super::{Core, Task};

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

/// One page of the change stream: where it starts inside the first batch and how
/// many tasks it holds at most.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChangesPage {
    /// The last task of the previous page (its `after`): tasks written by batch
    /// `after + 1` whose id sorts at or before it were in that page.
    pub after_task: Option<String>,
    /// At most this many tasks (None: every one; 0 is taken as 1).
    pub limit: Option<usize>,
}

impl Core {
    /// What was written in batches `after + 1 ..= upto` (`upto`: the last committed
    /// batch, so nothing uncommitted is shown), answered with `index = upto`.
    pub fn changes_since(&self, after: u64, upto: u64, filter: &ChangeFilter) -> ChangesView {
        self.changes_page(after, upto, filter, &ChangesPage::default())
    }

    /// `changes_since`, one page at a time: the tasks in order of the batch that
    /// wrote them and their id, at most `page.limit`. When more follow, the answer
    /// has `more`, `index` the batch before the page's last task and `after` that
    /// task: asking again with both goes on exactly after it (a task written again
    /// meanwhile has a later batch, so it comes again later, never is lost).
    /// Agents and updates come with the page that reaches past their batch.
    pub fn changes_page(
        &self,
        after: u64,
        upto: u64,
        filter: &ChangeFilter,
        page: &ChangesPage,
    ) -> ChangesView {
        let fresh = |rev: u64| rev > after && rev <= upto;
        let seen = |t: &Task| {
            page.after_task
                .as_deref()
                .is_some_and(|last| t.rev == after.saturating_add(1) && t.id.as_str() <= last)
        };
        let role_ok = |role: &str| {
            filter
                .roles
                .as_ref()
                .is_none_or(|roles| roles.iter().any(|r| r == role))
        };
        let mut found: Vec<&Task> = Vec::new();
        match &filter.job {
            Some(key) => {
                if let Some(job) = self.jobs.get(key).filter(|j| role_ok(&j.spec.role)) {
                    let ids = job
                        .slots
                        .iter()
                        .flat_map(|s| s.history.iter().chain(s.current.iter()));
                    found.extend(
                        ids.filter_map(|id| self.tasks.get(id))
                            .map(|t| &**t)
                            .filter(|t| fresh(t.rev) && !seen(t)),
                    );
                }
            }
            None => {
                for t in self.tasks.values().map(|t| &**t) {
                    if !fresh(t.rev) || seen(t) {
                        continue;
                    }
                    if self
                        .jobs
                        .get(&t.job)
                        .is_some_and(|job| role_ok(&job.spec.role))
                    {
                        found.push(t);
                    }
                }
            }
        }
        // A page: the first `limit` tasks in (batch, id) order, chosen without
        // sorting everything (index 0 of a big cell is every task).
        let mut cut: Option<&Task> = None;
        if let Some(limit) = page.limit.map(|l| l.max(1)) {
            if found.len() > limit {
                let order = |a: &&Task, b: &&Task| (a.rev, &a.id).cmp(&(b.rev, &b.id));
                found.select_nth_unstable_by(limit - 1, order);
                found.truncate(limit);
                cut = found.iter().copied().max_by(order);
            }
        }
        // What the page covers whole: every batch up to the one before its last
        // task's (that batch goes on in the next page).
        let covered = cut.map_or(upto, |t| t.rev - 1);
        let whole = |rev: u64| rev > after && rev <= covered;
        let mut tasks: Vec<_> = found.into_iter().map(|t| self.task_view_of(t)).collect();
        tasks.sort_by(|a, b| {
            (&a.job, a.instance, &a.task_id).cmp(&(&b.job, b.instance, &b.task_id))
        });
        let jobs: BTreeSet<&str> = tasks.iter().map(|t| t.job.as_str()).collect();
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
                        .is_some_and(|idx| whole(self.agents[*idx as usize].rec.rev))
                })
                .collect()
        } else {
            Vec::new()
        };
        let updates = self
            .updates
            .values()
            .filter(|u| whole(u.rev))
            .filter(|u| filter.job.as_ref().is_none_or(|key| *key == u.view.job))
            .filter(|u| {
                self.jobs
                    .get(&u.view.job)
                    .is_some_and(|j| role_ok(&j.spec.role))
            })
            .map(|u| u.view.clone())
            .collect();
        ChangesView {
            index: covered,
            head: upto,
            more: cut.is_some(),
            after: cut.map(|t| t.id.clone()),
            reset: false,
            tasks,
            jobs,
            agents,
            updates,
        }
    }
}
