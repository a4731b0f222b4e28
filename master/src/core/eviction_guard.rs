//! The eviction-storm guard: when more than a configured share of the fleet goes
//! unreachable within a short window, the fault is most likely the master's own or
//! the network's, not the agents'. While it is engaged, tasks on unreachable agents
//! are neither LOST nor replaced (exclusive tasks excepted: the agent's lease ends
//! them whoever is at fault, so they are replaced as before); it releases when
//! enough agents return or an operator says so. Below the share, losses by agent
//! loss go through at a bounded rate (`agent_loss_rate` tasks per second), so a rack
//! switch failing does not schedule thousands of replacements in one second.
//!
//! Agents a sweep finds silent are only acted on `settle_ms` later (two of the
//! heartbeat intervals told now, see `heartbeat`): a fleet that went silent at once times out spread over one heartbeat
//! interval and a sweep, and is judged as one event, not as a first agent replaced
//! before the rest is seen. DRAINED hosts are left out of the count: maintenance
//! powers them off on purpose.

use std::collections::BTreeMap;

use drover_common::state::{MonoMillis, UnixMillis};
use drover_common::wire::{Capacity, ClusterView, EvictionGuardView, MaintenanceMode};

use super::timers::Timer;
use super::{Core, Effect, Now, Reply};

/// The guard's state.
#[derive(Clone, Debug, Default)]
pub(super) struct EvictionGuard {
    engaged: Option<Engaged>,
    /// Agents that went unreachable before this count for no storm (an operator
    /// released the guard at this time).
    counts_from: MonoMillis,
    /// Timers held back while engaged, re-armed at release.
    held: Vec<Timer>,
    /// The rate limit: the current one-second window and the losses in it.
    window_start: MonoMillis,
    lost_in_window: u32,
    /// Engaged or released in this event (the runtime logs it).
    changed: Option<String>,
}

#[derive(Clone, Debug)]
struct Engaged {
    since_wall: UnixMillis,
    /// Agents unreachable since this time belong to the storm.
    from: MonoMillis,
    /// The fleet the share was measured against.
    fleet: u32,
}

impl Core {
    /// How long after a sweep finds an agent silent its tasks may be LOST at the
    /// earliest (see the module docs): two of the intervals told now.
    pub(super) fn settle_ms(&self) -> u64 {
        2 * self.told_now().interval_ms
    }

    /// Agents that went unreachable since `from` (still unreachable), and the fleet
    /// they are measured against: those plus the reachable agents. DRAINED hosts
    /// count for neither: they carry no task, and going away (powered off for
    /// maintenance) is what they were drained for.
    fn storm_counts(&self, from: MonoMillis) -> (u32, u32) {
        let mut out = 0;
        let mut fleet = 0;
        for a in &self.agents {
            if a.rec.maintenance.mode == MaintenanceMode::Drained {
                continue;
            }
            if a.reachable {
                fleet += 1;
            } else if a.unreachable_since.is_some_and(|s| s >= from) {
                out += 1;
                fleet += 1;
            }
        }
        (out, fleet)
    }

    fn over_share(&self, out: u32, fleet: u32) -> bool {
        u64::from(out) * 1000 > u64::from(self.cfg.eviction_guard_share_permille) * u64::from(fleet)
    }

    /// After agents changed reachability: engages the guard when more than the
    /// share of the fleet went unreachable within the window, releases it when
    /// enough of those returned.
    pub(super) fn evaluate_guard(&mut self, now: Now) {
        match &self.guard.engaged {
            None => {
                let from = now
                    .mono
                    .saturating_sub(self.cfg.eviction_guard_window_ms)
                    .max(self.guard.counts_from);
                let (out, fleet) = self.storm_counts(from);
                if self.over_share(out, fleet) {
                    self.guard.engaged = Some(Engaged {
                        since_wall: now.wall,
                        from,
                        fleet,
                    });
                    self.guard.changed = Some(format!(
                        "eviction guard engaged: {out} of {fleet} agents went unreachable within \
                         {} ms; tasks on unreachable agents are not LOST or replaced until agents \
                         return or an operator releases the guard",
                        self.cfg.eviction_guard_window_ms
                    ));
                }
            }
            Some(e) => {
                let (out, _) = self.storm_counts(e.from);
                if !self.over_share(out, e.fleet) {
                    let fleet = e.fleet;
                    self.guard.changed = Some(format!(
                        "eviction guard released: agents returned, {out} of {fleet} still \
                         unreachable; their tasks are handled as ordinary agent losses"
                    ));
                    // The agents still out get one more agent timeout to return.
                    self.release_guard(now.mono + self.told_now().loss_timeout_ms);
                }
            }
        }
    }

    /// POST /v1/cluster/eviction-guard/release.
    pub(super) fn release_guard_by_operator(&mut self, now: Now) -> Reply {
        if self.guard.engaged.is_some() {
            let held = self.guard.held.len();
            self.guard.changed = Some(format!(
                "eviction guard released by an operator: {held} held task timeouts proceed \
                 at up to {} tasks per second",
                self.cfg.agent_loss_rate
            ));
            self.guard.counts_from = now.mono;
            self.release_guard(now.mono);
        }
        Reply::Cluster(self.cluster_view())
    }

    fn release_guard(&mut self, at: MonoMillis) {
        self.guard.engaged = None;
        for timer in std::mem::take(&mut self.guard.held) {
            self.push_timer(at, timer);
        }
    }

    /// Whether `task` may be made LOST now because its agent is unreachable. If not,
    /// `again` (the timer that would do it) is kept until the guard releases (while
    /// it is engaged, unless the task is exclusive: its agent kills it after the
    /// lease anyway), or re-armed for the next second (over `agent_loss_rate`).
    pub(super) fn loss_may_go(&mut self, task: &str, again: Timer, now: Now) -> bool {
        let exclusive = self
            .tasks
            .get(task)
            .and_then(|t| self.jobs.get(&t.job))
            .is_some_and(|j| j.spec.partition_policy.exclusive);
        if self.guard.engaged.is_some() && !exclusive {
            self.guard.held.push(again);
            return false;
        }
        if now.mono >= self.guard.window_start + 1_000 {
            self.guard.window_start = now.mono;
            self.guard.lost_in_window = 0;
        }
        if self.guard.lost_in_window >= self.cfg.agent_loss_rate.max(1) {
            self.push_timer(self.guard.window_start + 1_000, again);
            return false;
        }
        self.guard.lost_in_window += 1;
        true
    }

    /// Whether the guard is engaged.
    pub fn guard_engaged(&self) -> bool {
        self.guard.engaged.is_some()
    }

    /// The guard's change in this event, for the runtime's log.
    pub(super) fn take_guard_change(&mut self) -> Option<Effect> {
        let message = self.guard.changed.take()?;
        Some(Effect::EvictionGuard {
            engaged: self.guard.engaged.is_some(),
            message,
        })
    }

    /// GET /v1/cluster.
    pub fn cluster_view(&self) -> ClusterView {
        let reachable = self.agents.iter().filter(|a| a.reachable).count() as u32;
        let eviction_guard = match &self.guard.engaged {
            Some(e) => {
                let (out, _) = self.storm_counts(e.from);
                EvictionGuardView {
                    engaged: true,
                    since_ms: Some(e.since_wall),
                    unreachable_agents: out,
                    fleet_agents: e.fleet,
                    held_tasks: self.guard.held.len() as u32,
                    message: format!(
                        "{out} of {} agents unreachable: tasks on them are not LOST or \
                         replaced until agents return or an operator runs `drover cluster \
                         release-guard`",
                        e.fleet
                    ),
                }
            }
            None => EvictionGuardView {
                engaged: false,
                since_ms: None,
                unreachable_agents: self.agents.len() as u32 - reachable,
                fleet_agents: self.agents.len() as u32,
                held_tasks: 0,
                message: "not engaged: agent losses are handled as they come".to_string(),
            },
        };
        let mut maintenance = BTreeMap::new();
        let (mut capacity, mut free) = (Capacity::default(), Capacity::default());
        let mut free_cpu_milli = 0;
        for a in &self.agents {
            *maintenance.entry(a.rec.maintenance.mode).or_insert(0) += 1;
            let r = &a.rec.resources;
            capacity.cpu += r.cpu;
            capacity.ram_bytes = capacity.ram_bytes.saturating_add(r.ram_bytes);
            capacity.disk_bytes = capacity.disk_bytes.saturating_add(r.disk_bytes);
            free_cpu_milli += a.cpu_milli.saturating_sub(a.used_cpu_milli);
            free.ram_bytes = free
                .ram_bytes
                .saturating_add(r.ram_bytes.saturating_sub(a.used_ram));
            free.disk_bytes = free
                .disk_bytes
                .saturating_add(r.disk_bytes.saturating_sub(a.used_disk));
        }
        free.cpu = free_cpu_milli as f64 / 1000.0;
        ClusterView {
            agents: self.agents.len() as u32,
            reachable_agents: reachable,
            eviction_guard,
            maintenance,
            capacity,
            free,
        }
    }
}
