//! Preemption (seed 000): a PENDING task that fits on no agent may have tasks of
//! lower standing on one agent killed (PREEMPTING, then KILLED) so that it fits
//! there, with the freed resources reserved for it until it is placed or the
//! reservation times out.
//!
//! The rules, pure and tested without I/O ([`may_preempt`], [`victims_on_host`]):
//! - A task's standing is (production, priority). Production (`tier: preferred`) is
//!   never a victim. A production task may preempt any preemptible task; a
//!   preemptible task may preempt a preemptible task of its own role with a lower
//!   priority. Standing strictly drops from preemptor to victim, so no task placed by
//!   preempting can be preempted by a task of equal or lower standing, and no chain
//!   of preemptions comes back to where it started.
//! - A victim's job that declares an `sla_policy` (see `disruption`) is honoured:
//!   no victim set takes more of its instances down than the policy allows at once.
//!   A job without one may lose any number of tasks (the maintenance default, one
//!   at a time, is for drains: a full cluster never runs the replacements that
//!   would let a second go).
//! - On one agent, the victims are the lowest priorities first; a single victim that
//!   frees enough is preferred to several; the set is then pruned so that no victim
//!   in it could be spared (it never frees more than the preemptor needs plus one
//!   task).
//! - Across agents: the candidate agents are scanned from the job's cursor, and the
//!   agent needing the fewest victims (then the lowest highest victim priority) among
//!   the first [`SCAN_FEASIBLE`] feasible ones wins; a one-victim agent ends the scan.
//!   Agents already holding a reservation are only looked at when no other will do
//!   (their room is promised), and never one holding a reservation for the same job
//!   (its limits count the reserved task as if placed there).
//!
//! - Each task by its own config (a job being updated runs several): the preemptor
//!   by its config's needs, constraints and standing (placement swaps them in), a
//!   victim by its config's standing and needs; never a task of the preemptor's job.
//!
//! The glue (`impl Core`): choosing the agent, moving the victims to PREEMPTING with
//! their replacements PENDING, the reservation (counted in the agent's `reserved`
//! so that nothing else takes it) and its timer.

use std::collections::HashMap;

use drover_common::state::{DesiredState, EventSource, ExitReason, MonoMillis, TaskState};

use super::disruption::Budget;
use super::feasibility::misfit_ignoring_resources;
use super::limits::LimitCounts;
use super::model::{Agent, Need};
use super::timers::Timer;
use super::{Core, Now};

/// How many feasible agents the search compares before it takes the best one seen.
pub const SCAN_FEASIBLE: usize = 16;

/// Where a task stands when preemption is decided: production first, then priority.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Standing {
    /// `tier: preferred`.
    pub production: bool,
    /// The job's `priority` (higher is more important).
    pub priority: u32,
}

/// Whether a task of standing `by` in role `by_role` may preempt a task of standing
/// `victim` in role `victim_role`.
pub fn may_preempt(by: Standing, by_role: &str, victim: Standing, victim_role: &str) -> bool {
    if victim.production {
        return false;
    }
    if by.production {
        return true;
    }
    by_role == victim_role && by.priority > victim.priority
}

/// What one agent has free for a new task; negative when it is promised away.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Free {
    pub cpu_milli: i64,
    pub ram: i64,
    pub disk: i64,
    pub ports: i64,
}

impl Free {
    fn covers(&self, need: &Need) -> bool {
        self.cpu_milli >= need.cpu_milli as i64
            && self.ram >= need.ram as i64
            && self.disk >= need.disk as i64
            && self.ports >= i64::from(need.ports)
    }

    fn add(&mut self, n: &Need) {
        self.cpu_milli += n.cpu_milli as i64;
        self.ram += n.ram as i64;
        self.disk += n.disk as i64;
        self.ports += i64::from(n.ports);
    }

    fn sub(&mut self, n: &Need) {
        self.cpu_milli -= n.cpu_milli as i64;
        self.ram -= n.ram as i64;
        self.disk -= n.disk as i64;
        self.ports -= i64::from(n.ports);
    }
}

/// A task the preemptor may kill: what it holds and its priority.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub need: Need,
    pub priority: u32,
}

/// The smallest set of candidates (indices into `cands`) whose removal lets `need`
/// fit in `free`, or None when even all of them would not do. Lowest priorities
/// first; one victim when one suffices; pruned so that none could be spared.
pub fn victims_on_host(free: Free, need: &Need, cands: &[Candidate]) -> Option<Vec<usize>> {
    if free.covers(need) {
        return Some(Vec::new());
    }
    let mut order: Vec<usize> = (0..cands.len()).collect();
    // Lowest priority first; among equals the biggest first (fewer victims).
    order.sort_by(|&a, &b| {
        let (ca, cb) = (&cands[a], &cands[b]);
        ca.priority
            .cmp(&cb.priority)
            .then(cb.need.cpu_milli.cmp(&ca.need.cpu_milli))
            .then(cb.need.ram.cmp(&ca.need.ram))
            .then(a.cmp(&b))
    });
    for &i in &order {
        let mut f = free;
        f.add(&cands[i].need);
        if f.covers(need) {
            return Some(vec![i]);
        }
    }
    let mut f = free;
    let mut chosen = Vec::new();
    for &i in &order {
        f.add(&cands[i].need);
        chosen.push(i);
        if f.covers(need) {
            break;
        }
    }
    if !f.covers(need) {
        return None;
    }
    // Spare the most important victims that are not needed.
    let mut k = chosen.len();
    while k > 0 {
        k -= 1;
        let i = chosen[k];
        let mut without = f;
        without.sub(&cands[i].need);
        if without.covers(need) {
            f = without;
            chosen.remove(k);
        }
    }
    Some(chosen)
}

/// The resources freed for a preemptor on one agent, held until it is placed there
/// or `until` (monotonic) passes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Reservation {
    pub(super) agent: u32,
    pub(super) need: Need,
    pub(super) until: MonoMillis,
}

impl Agent {
    /// Whether some cpu and ram are left beyond what is used and reserved.
    pub(super) fn has_room_beyond_reservations(&self) -> bool {
        let f = free_of(self);
        f.cpu_milli > 0 && f.ram > 0
    }
}

/// The agent's resources left for a task that holds no reservation there.
fn free_of(agent: &Agent) -> Free {
    Free {
        cpu_milli: agent.cpu_milli as i64
            - agent.used_cpu_milli as i64
            - agent.reserved.cpu_milli as i64,
        ram: agent.rec.resources.ram_bytes as i64
            - agent.used_ram as i64
            - agent.reserved.ram as i64,
        disk: agent.rec.resources.disk_bytes as i64
            - agent.used_disk as i64
            - agent.reserved.disk as i64,
        ports: i64::from(agent.port_count())
            - agent.used_ports.len() as i64
            - i64::from(agent.reserved.ports),
    }
}

impl Core {
    /// The standing of task `id`, by its own config (an update may change `tier`
    /// and `priority`).
    pub(super) fn standing_of_task(&self, id: &str) -> Option<(Standing, &str)> {
        let task = self.tasks.get(id)?;
        let spec = self.jobs.get(&task.job)?.spec_of(&task.config);
        Some((
            Standing {
                production: spec.is_production(),
                priority: spec.priority,
            },
            spec.role.as_str(),
        ))
    }

    /// Tries to make room for PENDING task `id` of `job_key` by preempting tasks of
    /// lower standing on one agent. On success the victims are PREEMPTING, their
    /// replacements PENDING, and the freed resources reserved for `id`.
    pub(super) fn try_preempt(
        &mut self,
        job_key: &str,
        id: &str,
        counts: &LimitCounts,
        now: Now,
    ) -> bool {
        let Some((by, by_role)) = self.standing_of_task(id) else {
            return false;
        };
        // Preemptible tasks of priority 0 can preempt nothing: skip the scan.
        if !by.production && by.priority == 0 {
            return false;
        }
        let by_role = by_role.to_string();
        let Some(job) = self.jobs.get(job_key) else {
            return false;
        };
        let need = job.need;
        let Some((_, cands)) = job.candidates.clone() else {
            return false;
        };
        let n = cands.len();
        if n == 0 {
            return false;
        }
        let start = job.cursor % n;
        // (victim count, highest victim priority, position, agent, victim ids)
        let mut best: Option<(usize, u32, usize, u32, Vec<String>)> = None;
        let mut feasible = 0;
        let mut ids: Vec<&str> = Vec::new();
        let mut list: Vec<Candidate> = Vec::new();
        // Disruption budgets of the victims' jobs that declare an sla_policy.
        let mut budgets: HashMap<&str, Budget> = HashMap::new();
        let mut healthy: Vec<Option<bool>> = Vec::new();
        for step in 0..2 * n {
            if step == n && best.is_some() {
                break;
            }
            // First pass: agents without reservations; second: the others.
            let reserved_pass = step >= n;
            let pos = (start + step) % n;
            let idx = cands[pos];
            let agent = &self.agents[idx as usize];
            if agent.reserved_for.is_empty() == reserved_pass {
                continue;
            }
            if reserved_pass
                && agent
                    .reserved_for
                    .iter()
                    .any(|r| self.tasks.get(r).is_some_and(|t| t.job == job_key))
            {
                continue;
            }
            if misfit_ignoring_resources(agent, job, counts) {
                continue;
            }
            ids.clear();
            list.clear();
            healthy.clear();
            for tid in &agent.tasks {
                let Some(t) = self.tasks.get(tid) else {
                    continue;
                };
                if t.status.state.is_stopping() || t.desired != DesiredState::Running {
                    continue;
                }
                // Never its own job's tasks (an update may have raised the
                // priority of its newer config).
                if t.job == job_key {
                    continue;
                }
                let Some(vjob) = self.jobs.get(&t.job) else {
                    continue;
                };
                // Each task by its own config: standing and what it holds.
                let vspec = vjob.spec_of(&t.config);
                let v = Standing {
                    production: vspec.is_production(),
                    priority: vspec.priority,
                };
                if !may_preempt(by, &by_role, v, &vspec.role) {
                    continue;
                }
                let mut vneed = vjob.need_for(&t.config);
                vneed.ports = t.ports.len() as u32;
                let mut sla = None;
                if vjob.spec.sla_policy.is_some() {
                    let b = budgets.entry(t.job.as_str()).or_insert_with(|| {
                        Budget::of(vjob, |i| self.tasks.get(i).map(|t| &**t), now.mono)
                    });
                    let h = b.is_healthy(t, now.mono);
                    if b.check(h).is_err() {
                        continue;
                    }
                    sla = Some(h);
                }
                healthy.push(sla);
                ids.push(tid.as_str());
                list.push(Candidate {
                    need: vneed,
                    priority: v.priority,
                });
            }
            let Some(chosen) = victims_on_host(free_of(agent), &need, &list) else {
                continue;
            };
            if chosen.is_empty() {
                // Fits without victims (a reservation ended meanwhile): placement
                // takes it on its next pass.
                continue;
            }
            // Several victims of one job with a policy: all of them within it.
            let mut trial: HashMap<&str, Budget> = HashMap::new();
            let within = chosen.iter().all(|&i| {
                let Some(h) = healthy[i] else {
                    return true;
                };
                let Some(job_key) = self.tasks.get(ids[i]).map(|t| t.job.as_str()) else {
                    return false;
                };
                let Some(b) = budgets.get(job_key) else {
                    return false;
                };
                let b = trial.entry(job_key).or_insert_with(|| b.clone());
                let ok = b.check(h).is_ok();
                b.take(h);
                ok
            });
            if !within {
                continue;
            }
            feasible += 1;
            let top = chosen.iter().map(|&i| list[i].priority).max().unwrap_or(0);
            let better = best
                .as_ref()
                .is_none_or(|(c, p, _, _, _)| (chosen.len(), top) < (*c, *p));
            if better {
                let victims = chosen.iter().map(|&i| ids[i].to_string()).collect();
                best = Some((chosen.len(), top, pos, idx, victims));
            }
            if best.as_ref().is_some_and(|b| b.0 == 1) || feasible >= SCAN_FEASIBLE {
                break;
            }
        }
        let Some((_, _, pos, idx, victims)) = best else {
            return false;
        };
        for v in &victims {
            self.preempt_task(v, id, now);
        }
        let until = now.mono + self.cfg.preemption_reservation_ms;
        self.reserve(id, idx, need, until);
        if let Some(job) = self.jobs.get_mut(job_key) {
            // Spread: the job's next task starts after this agent.
            job.cursor = pos + 1;
        }
        true
    }

    /// Kills `victim` through PREEMPTING for `by`; its replacement waits PENDING.
    fn preempt_task(&mut self, victim: &str, by: &str, now: Now) {
        if self
            .tasks
            .get(victim)
            .is_none_or(|t| t.status.state.is_terminal() || t.status.state.is_stopping())
        {
            return;
        }
        // Withdrawn from service discovery first; the kill waits `drain_delay`.
        let held = self.withdraw_before_kill(victim, now);
        let Some(task) = self.tasks.get_mut(victim) else {
            return;
        };
        let message = format!("preempted by {by}");
        if task
            .status
            .transition(
                TaskState::Preempting,
                None,
                now.wall,
                EventSource::Master,
                &message,
            )
            .is_err()
        {
            return;
        }
        task.desired = DesiredState::Shutdown;
        task.kill_reason = Some(ExitReason::Preempted { by: by.to_string() });
        let agent = task.agent.clone().filter(|_| !held);
        self.mark(victim);
        if let Some(idx) = agent.and_then(|a| self.agent_idx.get(&a).copied()) {
            self.bump_agent(idx);
        }
        if let Some(new_id) = self.create_replacement(victim, now, None, &message) {
            if let Some(t) = self.tasks.get_mut(&new_id) {
                t.preempted_by = Some(by.to_string());
            }
        }
    }

    /// Holds `need` on agent `idx` for task `id` until `until`.
    pub(super) fn reserve(&mut self, id: &str, idx: u32, need: Need, until: MonoMillis) {
        self.release_reservation(id);
        let a = &mut self.agents[idx as usize];
        a.reserved.cpu_milli += need.cpu_milli;
        a.reserved.ram += need.ram;
        a.reserved.disk += need.disk;
        a.reserved.ports += need.ports;
        a.reserved_for.push(id.to_string());
        self.reservations.insert(
            id.to_string(),
            Reservation {
                agent: idx,
                need,
                until,
            },
        );
        self.push_timer(
            until,
            Timer::Reservation {
                task: id.to_string(),
            },
        );
    }

    /// Gives a task's reservation back to its agent, for any task to take.
    pub(super) fn release_reservation(&mut self, id: &str) -> Option<Reservation> {
        let r = self.unreserve(id)?;
        self.capacity_changed = true;
        Some(r)
    }

    /// Ends a task's reservation (its holder takes the room itself).
    fn unreserve(&mut self, id: &str) -> Option<Reservation> {
        let r = self.reservations.remove(id)?;
        let a = &mut self.agents[r.agent as usize];
        a.reserved.cpu_milli = a.reserved.cpu_milli.saturating_sub(r.need.cpu_milli);
        a.reserved.ram = a.reserved.ram.saturating_sub(r.need.ram);
        a.reserved.disk = a.reserved.disk.saturating_sub(r.need.disk);
        a.reserved.ports = a.reserved.ports.saturating_sub(r.need.ports);
        a.reserved_for.retain(|t| t != id);
        Some(r)
    }

    /// The reservation timer: a preemptor still unplaced gives its reservation back
    /// and waits like any PENDING task (it may preempt again).
    pub(super) fn reservation_expired(&mut self, id: &str, now: Now) {
        if self.reservations.get(id).is_none_or(|r| r.until > now.mono) {
            return;
        }
        self.release_reservation(id);
        if self
            .tasks
            .get(id)
            .is_some_and(|t| t.status.state == TaskState::Pending)
        {
            self.queue.push_back(id.to_string());
        }
    }

    /// Places the preemptors whose reserved agent's room grew and now fits them
    /// (their victims ended); drops reservations of tasks no longer PENDING.
    pub(super) fn place_reserved(&mut self, now: Now) {
        if self.reserved_wake.is_empty() {
            return;
        }
        let mut ids: Vec<String> = Vec::new();
        for idx in std::mem::take(&mut self.reserved_wake) {
            ids.extend(self.agents[idx as usize].reserved_for.iter().cloned());
        }
        let mut limits: HashMap<String, LimitCounts> = HashMap::new();
        for id in ids {
            let pending = self
                .tasks
                .get(&id)
                .is_some_and(|t| t.status.state == TaskState::Pending);
            if !pending {
                self.release_reservation(&id);
                continue;
            }
            let Some(r) = self.reservations.get(&id).cloned() else {
                continue;
            };
            let agent = &self.agents[r.agent as usize];
            let mut free = free_of(agent);
            free.add(&r.need);
            if !agent.reachable || !free.covers(&r.need) {
                continue;
            }
            self.unreserve(&id);
            let Some(job) = self.tasks.get(&id).map(|t| t.job.clone()) else {
                continue;
            };
            // By the task's own config's limits, counted as placement counts them.
            let placed = self.as_task_config(&job, &id, |core, key| {
                let Some((mut cache, kept)) = core.take_counts(&job, key, &mut limits) else {
                    return false;
                };
                let fits = core.jobs.get(&job).is_some_and(|j| {
                    !misfit_ignoring_resources(&core.agents[r.agent as usize], j, &cache.counts)
                });
                if fits {
                    core.place_at(&job, key, &id, r.agent, &mut cache, kept, &mut limits, now);
                }
                core.put_counts(&job, key, cache, kept, &mut limits);
                fits
            });
            if !placed {
                // A sibling took the agent's last slot under a limit meanwhile:
                // wait like any PENDING task; the room goes back to all.
                self.capacity_changed = true;
                self.queue.push_back(id);
            }
        }
    }
}
