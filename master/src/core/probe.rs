//! Drain probes (`drover host drain --dry-run`, Aurora's sla_probe_hosts): for the
//! hosts named, per host and job, whether a drain would stay within each job's SLA
//! policy and how long it would take. Read-only: it changes nothing. The estimate
//! is per job: its tasks on all probed hosts in waves of what its budget lets go at
//! once, each wave a worst-case kill escalation plus the time its current tasks
//! took to become RUNNING plus the policy's `min_time`; jobs drain in parallel, so
//! a host takes as long as its slowest job.

use std::collections::BTreeMap;

use drover_common::state::TaskState;
use drover_common::wire::{HostProbe, JobProbe};

use super::agents::kill_time_ms;
use super::disruption::Budget;
use super::{Core, CoreError, Now};

impl Core {
    /// What draining `names` (agent ids or host names) at `now` would do.
    pub fn drain_probe(&self, names: &[String], now: Now) -> Result<Vec<HostProbe>, CoreError> {
        let idxs = self.resolve_hosts(names)?;
        // Per job: its RUNNING current tasks on the probed hosts.
        let mut on_hosts: BTreeMap<&str, u32> = BTreeMap::new();
        for &idx in &idxs {
            for id in &self.agents[idx as usize].tasks {
                if let Some(t) = self.tasks.get(id) {
                    if !t.status.state.is_stopping() {
                        *on_hosts.entry(t.job.as_str()).or_insert(0) += 1;
                    }
                }
            }
        }
        let mut per_job: BTreeMap<&str, JobProbe> = BTreeMap::new();
        for (&key, &n) in &on_hosts {
            let Some(job) = self.jobs.get(key) else {
                continue;
            };
            let budget = Budget::of(job, |i| self.tasks.get(i).map(|t| &**t), now.mono);
            let at_once = budget.at_once();
            let (within, reason) = if budget.never() {
                (false, budget.check(true).err())
            } else if at_once == 0 {
                (true, budget.check(true).err())
            } else {
                (true, None)
            };
            let waves = if at_once == 0 {
                // Waits for the disruption there is now to heal, then one at a time.
                n + 1
            } else {
                n.div_ceil(at_once)
            };
            // From the wall clock records: an estimate for people.
            let startup = job
                .slots
                .iter()
                .filter_map(|s| self.tasks.get(s.current.as_deref()?))
                .filter(|t| t.status.state == TaskState::Running)
                .filter_map(|t| Some(t.running_since?.saturating_sub(t.created_ms)))
                .max()
                .unwrap_or(0);
            let wave_ms = kill_time_ms(&job.spec) + startup + budget.min_time_ms();
            per_job.insert(
                key,
                JobProbe {
                    job: key.to_string(),
                    tasks_on_host: 0,
                    tasks_on_hosts: n,
                    within_policy: within,
                    at_once,
                    waves,
                    estimate_ms: u64::from(waves) * wave_ms,
                    reason,
                },
            );
        }
        let mut out = Vec::new();
        for idx in idxs {
            let a = &self.agents[idx as usize];
            let mut counts: BTreeMap<&str, u32> = BTreeMap::new();
            for id in &a.tasks {
                if let Some(t) = self.tasks.get(id) {
                    if !t.status.state.is_stopping() {
                        *counts.entry(t.job.as_str()).or_insert(0) += 1;
                    }
                }
            }
            let jobs: Vec<JobProbe> = counts
                .into_iter()
                .filter_map(|(key, n)| {
                    let mut p = per_job.get(key)?.clone();
                    p.tasks_on_host = n;
                    Some(p)
                })
                .collect();
            out.push(HostProbe {
                agent_id: a.rec.id.clone(),
                hostname: a.rec.hostname.clone(),
                tasks: a.tasks.len() as u32,
                within_policy: jobs.iter().all(|j| j.within_policy),
                estimate_ms: jobs.iter().map(|j| j.estimate_ms).max().unwrap_or(0),
                jobs,
            });
        }
        Ok(out)
    }
}
