//! Read-only views of the core for the admin API and the agents' assignment sets
//! (pure: built from the in-memory state).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use drover_common::state::{DesiredState, TaskState};
use drover_common::wire::{
    AgentResources, AgentView, Assignment, AssignmentSet, ExecutorTask, InstanceView, JobSummary,
    JobView, RecentEvent, TaskView,
};

use super::{Core, Job, Task};

/// How many task events `JobView.recent_events` holds.
pub const RECENT_EVENTS: usize = 50;

/// Which instances a job read answers (GET /v1/jobs/{key}?after=I&limit=N&state=S).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InstancePage {
    /// Only instances numbered above this one.
    pub after: Option<u32>,
    /// At most this many (None: all).
    pub limit: Option<u32>,
    /// Only instances whose current task is in this state.
    pub state: Option<TaskState>,
}

impl Core {
    /// GET /v1/tasks/{id}.
    pub fn task_view(&self, id: &str) -> Option<TaskView> {
        self.tasks.get(id).map(|t| self.task_view_of(t))
    }

    fn state_counts(&self, job: &Job) -> BTreeMap<TaskState, u32> {
        let mut counts = BTreeMap::new();
        for slot in &job.slots {
            if let Some(t) = slot.current.as_ref().and_then(|id| self.tasks.get(id)) {
                *counts.entry(t.status.state).or_insert(0) += 1;
            }
        }
        counts
    }

    /// GET /v1/jobs/{key} with every instance.
    pub fn job_view(&self, key: &str) -> Option<JobView> {
        self.job_view_page(key, &InstancePage::default())
    }

    /// GET /v1/jobs/{key}[?after=I&limit=N&state=S]: the job's summary (state and
    /// config counts, recent events, configs, update) and the instances `page`
    /// picks, with `next_after` when more match after them. The work is one pass
    /// over the job's instances plus the views of the page's tasks.
    pub fn job_view_page(&self, key: &str, page: &InstancePage) -> Option<JobView> {
        let job = self.jobs.get(key)?;
        let configs = self.instance_configs(key);
        let current = |i: usize| {
            job.slots[i]
                .current
                .as_ref()
                .and_then(|id| self.tasks.get(id))
        };
        let start = page.after.map_or(0, |a| (a as usize).saturating_add(1));
        let limit = page.limit.map_or(usize::MAX, |l| l as usize);
        let mut matching = (start.min(job.slots.len())..job.slots.len()).filter(|&i| {
            page.state
                .is_none_or(|s| current(i).is_some_and(|t| t.status.state == s))
        });
        let picked: Vec<usize> = matching.by_ref().take(limit).collect();
        let next_after = match (picked.last(), matching.next()) {
            (Some(&last), Some(_)) => Some(last as u32),
            _ => None,
        };
        let instances = picked
            .into_iter()
            .map(|i| {
                let slot = &job.slots[i];
                InstanceView {
                    instance: i as u32,
                    config: configs.get(i).cloned(),
                    current: current(i).map(|t| self.task_view_of(t)),
                    history: slot
                        .history
                        .iter()
                        .rev()
                        .filter_map(|id| self.tasks.get(id))
                        .map(|t| self.task_view_of(t))
                        .collect(),
                }
            })
            .collect();
        let mut config_counts: BTreeMap<String, u32> = BTreeMap::new();
        for hash in &configs {
            *config_counts.entry(hash.clone()).or_insert(0) += 1;
        }
        Some(JobView {
            key: job.key.clone(),
            spec: job.spec.as_ref().clone(),
            created_ms: job.created_ms,
            state_counts: self.state_counts(job),
            instance_count: job.slots.len() as u32,
            instances,
            next_after,
            recent_events: self.recent_events(job),
            cron: self.cron_view(key),
            configs: config_counts
                .keys()
                .map(|h| (h.clone(), job.spec_of(h).as_ref().clone()))
                .collect(),
            config_counts,
            update: self.update_view(key),
            ungranted_user: self.ungranted_user(key),
        })
    }

    /// The job's latest `RECENT_EVENTS` task events over every instance's tasks
    /// (current and history), newest first; a task's events of the same
    /// millisecond newest first too.
    fn recent_events(&self, job: &Job) -> Vec<RecentEvent> {
        // (timestamp, position in its task's events, task id): a bounded heap of
        // the newest, so a job of 10,000 instances costs one pass and no big sort.
        let mut newest: BinaryHeap<Reverse<(u64, usize, &str)>> = BinaryHeap::new();
        let tasks = job
            .slots
            .iter()
            .flat_map(|s| s.current.iter().chain(s.history.iter()))
            .filter_map(|id| self.tasks.get(id));
        for t in tasks {
            for (seq, e) in t.status.events.iter().enumerate() {
                let entry = Reverse((e.timestamp_ms, seq, t.id.as_str()));
                if newest.len() < RECENT_EVENTS {
                    newest.push(entry);
                } else if newest.peek().is_some_and(|min| entry < *min) {
                    newest.pop();
                    newest.push(entry);
                }
            }
        }
        newest
            .into_sorted_vec()
            .into_iter()
            .filter_map(|Reverse((_, seq, id))| {
                let t = self.tasks.get(id)?;
                Some(RecentEvent {
                    task_id: t.id.clone(),
                    instance: t.instance,
                    event: t.status.events.get(seq)?.clone(),
                })
            })
            .collect()
    }

    /// GET /v1/jobs[?role=R], sorted by key.
    pub fn job_summaries(&self, role: Option<&str>) -> Vec<JobSummary> {
        self.jobs
            .values()
            .filter(|j| role.is_none_or(|r| j.spec.role == r))
            .map(|j| self.job_summary(j))
            .collect()
    }

    /// One job's line of GET /v1/jobs.
    pub(super) fn job_summary(&self, j: &Job) -> JobSummary {
        let state_counts = self.state_counts(j);
        JobSummary {
            key: j.key.clone(),
            instances: j.spec.instances,
            service: j.spec.service,
            pending_reason: state_counts
                .contains_key(&TaskState::Pending)
                .then(|| j.pending_reason.clone())
                .flatten(),
            state_counts,
            tier: j.spec.tier,
            priority: j.spec.priority,
            cron: self.cron_view(&j.key),
        }
    }

    /// GET /v1/agents, sorted by id.
    pub fn agent_views(&self) -> Vec<AgentView> {
        let mut out: Vec<AgentView> = self
            .agents
            .iter()
            .map(|a| {
                let r = &a.rec.resources;
                AgentView {
                    agent_id: a.rec.id.clone(),
                    hostname: a.rec.hostname.clone(),
                    address: a.rec.address.clone(),
                    reachable: a.reachable,
                    last_heartbeat_ms: a.rec.last_heartbeat_ms,
                    attributes: a.rec.attributes.clone(),
                    resources: r.clone(),
                    free: AgentResources {
                        cpu: a.cpu_milli.saturating_sub(a.used_cpu_milli) as f64 / 1000.0,
                        ram_bytes: r.ram_bytes.saturating_sub(a.used_ram),
                        disk_bytes: r.disk_bytes.saturating_sub(a.used_disk),
                        port_range: r.port_range,
                    },
                    tasks: a.tasks.iter().cloned().collect(),
                    versions: a.rec.versions.clone(),
                    maintenance: a.rec.maintenance.mode,
                }
            })
            .collect();
        out.sort_by(|a, b| a.agent_id.cmp(&b.agent_id));
        out
    }

    /// The agent's assignment set: every non-terminal task placed on it.
    pub fn assignment_set(&self, agent: &str) -> Option<AssignmentSet> {
        let idx = *self.agent_idx.get(agent)?;
        let a = &self.agents[idx as usize];
        let assignments = a
            .tasks
            .iter()
            .filter_map(|id| {
                let t = self.tasks.get(id)?;
                let job = self.jobs.get(&t.job)?;
                let spec = job.spec_of(&t.config);
                // A kill held for the drain delay is not the agent's yet.
                let desired = match t.withdrawn_ms {
                    Some(_) => DesiredState::Running,
                    None => t.desired,
                };
                Some(Assignment {
                    desired,
                    kill_reason: match desired {
                        DesiredState::Shutdown => t.kill_reason.clone(),
                        DesiredState::Running => None,
                    },
                    exclusive: spec.partition_policy.exclusive,
                    task: ExecutorTask {
                        task_id: t.id.clone(),
                        role: spec.role.clone(),
                        environment: spec.environment.clone(),
                        name: spec.name.clone(),
                        instance: t.instance,
                        task: spec.task.clone(),
                        health_check: spec.health_check.clone(),
                        lifecycle: spec.lifecycle.clone(),
                        ports: t.ports.iter().cloned().collect(),
                        drain_delay_ms: spec
                            .announce
                            .as_ref()
                            .map(|a| a.drain_delay.get().as_millis() as u64)
                            .filter(|ms| *ms > 0),
                        status_seq_base: 0,
                    },
                    started: t.last_seq.is_some(),
                })
            })
            .collect();
        Some(AssignmentSet {
            version: a.rec.version,
            assignments,
        })
    }
}

impl Core {
    pub(super) fn task_view_of(&self, t: &Task) -> TaskView {
        let pending_reason = if t.status.state == TaskState::Pending {
            self.jobs.get(&t.job).and_then(|j| j.pending_reason.clone())
        } else {
            None
        };
        let pending_reason = match (&t.preempted_by, pending_reason) {
            (Some(by), Some(r)) => Some(format!("preempted by {by}; {r}")),
            (_, r) => r,
        };
        task_view(t, pending_reason)
    }
}

fn task_view(t: &Task, pending_reason: Option<String>) -> TaskView {
    TaskView {
        task_id: t.id.clone(),
        job: t.job.clone(),
        instance: t.instance,
        state: t.status.state,
        desired: t.desired,
        exit_reason: t.status.exit_reason.clone(),
        agent_id: t.agent.clone(),
        ports: t.ports.iter().cloned().collect(),
        pending_reason,
        preempted_by: t.preempted_by.clone(),
        events: t.status.events.clone(),
        processes: t.processes.clone(),
        processes_omitted: t.processes_omitted.clone(),
    }
}
