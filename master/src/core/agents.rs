//! Agents: registration, heartbeats, and the sweep that finds silent agents and
//! arms the partition timers of their tasks (the task is LOST when one fires).

use drover_common::spec::JobSpec;
use drover_common::state::MonoMillis;
use drover_common::wire::{
    self, HeartbeatRequest, HeartbeatResponse, RegisterRequest, RegisterResponse,
};

use super::heartbeat::{self, Told};
use super::model::{cpu_to_milli, Agent};
use super::timers::Timer;
use super::{services, AgentRecord, Core, CoreError, Now, Reply};

impl Core {
    pub(super) fn register(&mut self, req: RegisterRequest, now: Now) -> Result<Reply, CoreError> {
        if req.protocol_version != wire::PROTOCOL_VERSION {
            return Err(CoreError::Protocol {
                got: req.protocol_version,
                want: wire::PROTOCOL_VERSION,
            });
        }
        let idx = match self.agent_idx.get(&req.agent_id) {
            Some(&idx) => {
                let a = &mut self.agents[idx as usize];
                a.rec.hostname = req.hostname;
                a.rec.ip = services::agent_ip(req.ip.as_deref(), &req.address);
                a.rec.address = req.address;
                if a.rec.attributes != req.attributes {
                    self.index_dirty = true;
                }
                a.rec.attributes = req.attributes;
                a.rec.versions = req.versions;
                a.cpu_milli = cpu_to_milli(req.resources.cpu);
                a.rec.resources = req.resources;
                idx
            }
            None => {
                let idx = self.agents.len() as u32;
                self.agent_idx.insert(req.agent_id.clone(), idx);
                self.agents.push(Agent::new(
                    AgentRecord {
                        id: req.agent_id.clone(),
                        hostname: req.hostname,
                        ip: services::agent_ip(req.ip.as_deref(), &req.address),
                        address: req.address,
                        resources: req.resources,
                        attributes: req.attributes,
                        version: 0,
                        last_heartbeat_ms: now.wall,
                        rev: 0,
                        maintenance: Default::default(),
                        versions: req.versions,
                    },
                    now.mono,
                ));
                self.index_dirty = true;
                self.live_agents += 1;
                idx
            }
        };
        let a = &mut self.agents[idx as usize];
        a.rec.last_heartbeat_ms = now.wall;
        a.last_seen = now.mono;
        let returned = !a.reachable;
        if returned {
            self.live_agents += 1;
        }
        let told = self.tell(idx, now);
        let a = &mut self.agents[idx as usize];
        a.reachable = true;
        a.unreachable_since = None;
        a.seen = true;
        a.want_full_set = true;
        self.capacity_changed = true;
        self.dirty_agents.insert(idx);
        // Its size may have changed, so its use in percent.
        self.note_usage(idx);
        if returned {
            self.touch_announced_on(idx);
            self.evaluate_guard(now);
        }
        Ok(Reply::Registered(RegisterResponse {
            agent_id: req.agent_id,
            heartbeat_interval_ms: told.interval_ms,
            exclusive_lease_ms: Some(told.exclusive_lease_ms),
        }))
    }

    pub(super) fn heartbeat(
        &mut self,
        agent: &str,
        req: HeartbeatRequest,
        now: Now,
    ) -> Result<Reply, CoreError> {
        let Some(&idx) = self.agent_idx.get(agent) else {
            return Ok(Reply::Heartbeat(HeartbeatResponse {
                send_full_task_set: false,
                reregister: true,
                heartbeat_interval_ms: None,
                exclusive_lease_ms: None,
            }));
        };
        let returned = {
            let a = &mut self.agents[idx as usize];
            a.rec.last_heartbeat_ms = now.wall;
            a.last_seen = now.mono;
            a.seen = true;
            let returned = !a.reachable;
            if returned {
                a.reachable = true;
                a.unreachable_since = None;
                a.want_full_set = true;
                self.capacity_changed = true;
            }
            returned
        };
        if returned {
            self.live_agents += 1;
        }
        let told = self.tell(idx, now);
        if returned {
            self.touch_announced_on(idx);
            self.evaluate_guard(now);
        }
        if let Some(reports) = req.tasks {
            self.reconcile_agent(idx, &reports, req.assignments_version, now);
        }
        let a = &mut self.agents[idx as usize];
        let digest = wire::task_set_digest(a.tasks.iter().map(String::as_str));
        let send = a.want_full_set
            || (digest != req.task_digest && req.assignments_version >= a.notified_version);
        Ok(Reply::Heartbeat(HeartbeatResponse {
            send_full_task_set: send,
            reregister: false,
            heartbeat_interval_ms: Some(told.interval_ms),
            exclusive_lease_ms: Some(told.exclusive_lease_ms),
        }))
    }

    /// What an answer to agent `idx` now tells it (the interval for the cell's
    /// size now), with the deadlines that answer implies recorded on the agent.
    fn tell(&mut self, idx: u32, now: Now) -> Told {
        let told = self.told_now();
        self.agents[idx as usize].told(now.mono, told);
        told
    }

    /// The interval, loss timeout and exclusive lease for the cell's size now.
    pub(super) fn told_now(&self) -> Told {
        heartbeat::told(
            heartbeat::Base {
                max_rate: self.cfg.max_heartbeat_rate,
                min_interval_ms: self.cfg.heartbeat_interval_ms,
                agent_timeout_ms: self.cfg.agent_timeout_ms,
                exclusive_lease_ms: self.cfg.exclusive_lease_ms,
            },
            self.live_agents,
        )
    }

    /// Finds agents silent past their loss deadline (monotonic; the agent timeout
    /// told them, see `heartbeat`), lets the eviction guard judge them together,
    /// then arms their tasks' partition timers. Counts the live agents afresh.
    pub(super) fn sweep_agents(&mut self, now: Now) {
        let mut lost = Vec::new();
        let mut live = 0;
        for (idx, a) in self.agents.iter_mut().enumerate() {
            if !a.reachable {
                continue;
            }
            if now.mono <= a.lost_after {
                live += 1;
                continue;
            }
            a.reachable = false;
            a.unreachable_since = Some(now.mono);
            lost.push(idx);
        }
        self.live_agents = live;
        if lost.is_empty() {
            return;
        }
        self.evaluate_guard(now);
        for idx in lost {
            // Withdrawn from service discovery now, committed with this sweep.
            self.touch_announced_on(idx as u32);
            self.arm_partition_timers(idx, now);
        }
    }

    /// The partition timers of the tasks on agent `idx`, just found unreachable.
    fn arm_partition_timers(&mut self, idx: usize, now: Now) {
        let grace_until = self.start_mono + self.cfg.restart_grace_ms;
        let settle = self.settle_ms();
        let a = &self.agents[idx];
        let (exclusive_until, seen) = (a.exclusive_until, a.seen);
        let agent_id = a.rec.id.clone();
        let tasks: Vec<String> = a.tasks.iter().cloned().collect();
        for id in tasks {
            let Some(t) = self.tasks.get(&id) else {
                continue;
            };
            let Some(job) = self.jobs.get(&t.job) else {
                continue;
            };
            let policy = &job.spec.partition_policy;
            if !policy.reschedule {
                continue;
            }
            let mut at = now.mono + (policy.delay.get().as_millis() as u64).max(settle);
            if policy.exclusive {
                at = at.max(exclusive_until + kill_time_ms(&job.spec));
            }
            if !seen {
                at = at.max(grace_until);
            }
            self.push_timer(
                at,
                Timer::Partition {
                    agent: agent_id.clone(),
                    task: id,
                },
            );
        }
    }
}

impl Core {
    /// How long from `now` an exclusive task's copy on `agent` may still run: the
    /// agent's lease (the last one told, or the rest of a longer one told before),
    /// then its kill. A replacement of an exclusive task the master could not stop
    /// waits this long (the transient-state timeout, see `replace_after_end`; the
    /// partition policy's LOST counts from the agent's `exclusive_until`).
    pub(super) fn exclusive_wait_ms(&self, spec: &JobSpec, agent: Option<&str>, now: Now) -> u64 {
        let lease = match agent.and_then(|id| self.agent_idx.get(id)) {
            Some(&idx) => {
                let a = &self.agents[idx as usize];
                a.exclusive_lease_ms
                    .max(a.exclusive_until.saturating_sub(now.mono))
            }
            None => self.told_now().exclusive_lease_ms,
        };
        lease.max(self.cfg.exclusive_lease_ms) + kill_time_ms(spec)
    }
}

impl Agent {
    /// Records the deadlines an answer at `now` telling `told` implies: they only
    /// move later, as the agent may not have received this answer.
    pub(super) fn told(&mut self, now: MonoMillis, told: Told) {
        self.lost_after = self.lost_after.max(now + told.loss_timeout_ms);
        self.exclusive_until = self.exclusive_until.max(now + told.exclusive_lease_ms);
        self.exclusive_lease_ms = told.exclusive_lease_ms;
    }
}

/// The longest a kill escalation of this job's task can take, plus slack.
pub(super) fn kill_time_ms(spec: &JobSpec) -> u64 {
    let mut ms = spec.task.finalization_wait.get().as_millis() as u64 + 5_000;
    if let Some(http) = spec.lifecycle.as_ref().and_then(|l| l.http.as_ref()) {
        ms += http.graceful_shutdown_wait.get().as_millis() as u64
            + http.shutdown_wait.get().as_millis() as u64;
    }
    ms
}
