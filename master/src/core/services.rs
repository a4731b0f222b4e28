//! Service discovery (issue 28): which instances of jobs with `announce` are
//! published, and the withdrawal that comes before every kill the master decides.
//!
//! The rule is derived, never stored: an instance is announced while its task is
//! RUNNING, its task config has `announce`, its kill is not held (below) and its
//! agent is reachable. Everything that makes one of those false is a committed task
//! change, so the change stream, `/v1/services` and DNS see the withdrawal in the
//! batch that makes it.
//!
//! Every kill the master decides (kill, restart, update batch, drain, preemption,
//! cron collision) moves the task out of RUNNING at once, which is the withdrawal.
//! For an announced task with a `drain_delay`, the kill itself is then held: the
//! task keeps `withdrawn_ms` and its agent's assignment set keeps it desired RUNNING
//! until a `Timer::Withdrawn` fires `drain_delay` later, which clears the hold and
//! wakes the agent. So no kill reaches an announced task, and clients have
//! `drain_delay` to drop it first. A kill the executor decides (a failed health
//! check) is told to it in the task (`ExecutorTask::drain_delay_ms`): it reports
//! the failure at once on a RUNNING status with the exit reason, on which the
//! master sets `withdrawn_ms` (withdrawn, nothing held), and escalates the delay
//! later. Agent loss withdraws without a kill: the sweep
//! that finds the agent unreachable touches its announced tasks so the change is
//! committed and seen.

use std::collections::BTreeMap;
use std::net::IpAddr;

use drover_common::spec::Announce;
use drover_common::state::TaskState;
use drover_common::wire::{ServiceEndpoint, ServiceView};

use super::timers::Timer;
use super::{Change, Core, Job, Now, Task};

impl Core {
    /// The `announce` section of the config task `t` runs.
    pub(super) fn announce_of(&self, t: &Task) -> Option<&Announce> {
        let job = self.jobs.get(&t.job)?;
        job.spec_of(&t.config).announce.as_ref()
    }

    /// Whether `t` is published now (see the module docs).
    pub(super) fn announced(&self, t: &Task) -> bool {
        t.status.state == TaskState::Running
            && t.withdrawn_ms.is_none()
            && self.announce_of(t).is_some()
            && t.agent
                .as_ref()
                .and_then(|a| self.agent_idx.get(a))
                .is_some_and(|&idx| self.agents[idx as usize].reachable)
    }

    /// Called by every master-decided kill before the task leaves RUNNING: if it is
    /// announced and its `drain_delay` is not zero, the kill is held (`withdrawn_ms`)
    /// until the delay has passed. Answers whether it is held; the caller then does
    /// not wake the agent (its set is unchanged until the timer fires).
    pub(super) fn withdraw_before_kill(&mut self, id: &str, now: Now) -> bool {
        let Some(t) = self.tasks.get(id) else {
            return false;
        };
        let delay = self.drain_delay_ms(t);
        if !self.announced(t) {
            // Withdrawn already by its executor's report (it stops the task for a
            // failed health check or its disk limit, `drain_delay` after that
            // report): this kill waits what is left of the delay since then, so
            // clients get the whole delay either way. Not withdrawn: not held.
            let since = t
                .withdrawn_ms
                .filter(|_| t.status.state == TaskState::Running);
            let until = since.map(|w| now.mono_of(w, delay) + delay);
            if let Some(at) = until.filter(|at| *at > now.mono) {
                self.push_timer(
                    at,
                    Timer::Withdrawn {
                        task: id.to_string(),
                    },
                );
                return true;
            }
            if let Some(t) = self.tasks.get_mut(id) {
                t.withdrawn_ms = None;
            }
            return false;
        }
        if delay == 0 {
            return false;
        }
        if let Some(t) = self.tasks.get_mut(id) {
            t.withdrawn_ms = Some(now.wall);
        }
        self.push_timer(
            now.mono + delay,
            Timer::Withdrawn {
                task: id.to_string(),
            },
        );
        true
    }

    /// `Timer::Withdrawn`: the drain delay is over, the held kill goes to the agent.
    pub(super) fn release_kill(&mut self, id: &str) {
        let Some(t) = self.tasks.get_mut(id) else {
            return;
        };
        if t.withdrawn_ms.take().is_none() {
            return;
        }
        let on_agent = t.status.state.is_on_agent();
        let agent = t.agent.clone();
        self.mark(id);
        if on_agent {
            if let Some(idx) = agent.and_then(|a| self.agent_idx.get(&a).copied()) {
                self.bump_agent(idx);
            }
        }
    }

    /// The drain delay of a held kill, for its timer after a restart.
    pub(super) fn drain_delay_ms(&self, t: &Task) -> u64 {
        self.announce_of(t)
            .map_or(0, |a| a.drain_delay.get().as_millis() as u64)
    }

    /// Agent `idx` became unreachable or reachable again: its RUNNING tasks with
    /// `announce` are written again, so the change (a withdrawal or a return) is
    /// committed and long polls wake.
    pub(super) fn touch_announced_on(&mut self, idx: u32) {
        let ids: Vec<String> = self.agents[idx as usize]
            .tasks
            .iter()
            .filter(|id| {
                self.tasks.get(*id).is_some_and(|t| {
                    t.status.state == TaskState::Running && self.announce_of(t).is_some()
                })
            })
            .cloned()
            .collect();
        for id in ids {
            self.mark(&id);
        }
    }

    /// GET /v1/services/{role}/{env}/{name}: the service `name` of role and
    /// environment, if a job announces it (the job named `name` when it announces
    /// without another name, else the first job by key whose `announce.name` is
    /// `name`). `index`: the highest change index of the job's current tasks.
    pub fn service_view(&self, role: &str, env: &str, name: &str) -> Option<ServiceView> {
        let key = format!("{role}/{env}/{name}");
        let by_key = self
            .jobs
            .get(&key)
            .filter(|j| service_name(j).as_deref() == Some(name));
        let job = match by_key {
            Some(j) => j,
            None => {
                let prefix = format!("{role}/{env}/");
                self.jobs
                    .range(prefix.clone()..)
                    .take_while(|(k, _)| k.starts_with(&prefix))
                    .map(|(_, j)| j)
                    .find(|j| service_name(j).as_deref() == Some(name))?
            }
        };
        Some(self.view_of(job, name))
    }

    /// The index a `/v1/services` list answer has at least: the last batch that
    /// wrote or deleted a job (a spec that no longer announces, a job re-created),
    /// which may have taken a service off the list, leaving no task change to wake
    /// a long poll; a loaded core starts at its last batch (the list's pollers
    /// wake once after a restart or failover).
    pub fn services_gone_index(&self) -> u64 {
        self.services_gone
    }

    /// Notes the batch `self.seq` of `changes` if it wrote or deleted a job.
    pub(super) fn note_services_gone(&mut self, changes: &[Change]) {
        if changes
            .iter()
            .any(|c| matches!(c, Change::PutJob(..) | Change::DeleteJob(_)))
        {
            self.services_gone = self.seq;
        }
    }

    /// GET /v1/services: every announced service, by role, environment and name.
    pub fn service_views(&self) -> Vec<ServiceView> {
        let mut out: BTreeMap<(String, String, String), ServiceView> = BTreeMap::new();
        for job in self.jobs.values() {
            let Some(name) = service_name(job) else {
                continue;
            };
            let at = (job.spec.role.clone(), job.spec.environment.clone(), name);
            if let std::collections::btree_map::Entry::Vacant(e) = out.entry(at) {
                let view = self.view_of(job, &e.key().2);
                e.insert(view);
            }
        }
        out.into_values().collect()
    }

    fn view_of(&self, job: &Job, name: &str) -> ServiceView {
        let mut index = 0;
        let mut endpoints = Vec::new();
        for slot in &job.slots {
            let Some(t) = slot.current.as_ref().and_then(|id| self.tasks.get(id)) else {
                continue;
            };
            index = index.max(t.rev);
            if let Some(e) = self.endpoint_of(t) {
                endpoints.push(e);
            }
        }
        ServiceView {
            role: job.spec.role.clone(),
            environment: job.spec.environment.clone(),
            name: name.to_string(),
            job: job.key.clone(),
            primary_port: job
                .spec
                .announce
                .as_ref()
                .map(|a| a.primary_port.clone())
                .unwrap_or_default(),
            index,
            endpoints,
        }
    }

    /// The endpoint of `t` if it is announced: its agent's host and IP, the
    /// announced ports (primary first in the config's list, then `ports`).
    fn endpoint_of(&self, t: &Task) -> Option<ServiceEndpoint> {
        if !self.announced(t) {
            return None;
        }
        let a = self.announce_of(t)?;
        let agent = &self.agents[*self.agent_idx.get(t.agent.as_ref()?)? as usize];
        let ports = std::iter::once(&a.primary_port)
            .chain(a.ports.iter())
            .filter_map(|name| {
                t.ports
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(n, p)| (n.clone(), *p))
            })
            .collect();
        Some(ServiceEndpoint {
            instance: t.instance,
            host: agent.rec.hostname.clone(),
            ip: agent.rec.ip.clone(),
            ports,
            task_id: t.id.clone(),
            since: t.running_since.unwrap_or_else(|| t.status.since()),
        })
    }
}

/// The name a job's newest config announces under, if it announces.
fn service_name(job: &Job) -> Option<String> {
    let a = job.spec.announce.as_ref()?;
    Some(a.name.clone().unwrap_or_else(|| job.spec.name.clone()))
}

/// The IP clients reach an agent's tasks at, from its registration: `ip` when the
/// agent (or the master's API, resolving `address`) gave one, else the host of
/// `address` (`http://host:port`) when it is an IP literal; empty when neither.
pub(super) fn agent_ip(given: Option<&str>, address: &str) -> String {
    if let Some(ip) = given.filter(|ip| ip.parse::<IpAddr>().is_ok()) {
        return ip.to_string();
    }
    address_host(address)
        .filter(|h| h.parse::<IpAddr>().is_ok())
        .map(str::to_string)
        .unwrap_or_default()
}

/// The host of `http://host:port` (an IPv6 literal without its brackets).
pub fn address_host(address: &str) -> Option<&str> {
    let rest = address.split_once("://").map_or(address, |(_, r)| r);
    let authority = rest.split('/').next()?;
    if let Some(v6) = authority.strip_prefix('[') {
        return v6.split(']').next();
    }
    let host = authority.rsplit_once(':').map_or(authority, |(h, _)| h);
    (!host.is_empty()).then_some(host)
}
