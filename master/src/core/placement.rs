//! Pure placement: PENDING tasks onto agents with enough free cpu, ram, disk and
//! ports, honouring value constraints, `limit:N` per attribute value, dedicated hosts
//! and the implicit one-per-host of services, each task by its own config's needs
//! and constraints. Fast paths: candidate agents are
//! precomputed per job from an attribute index, each job keeps a rotating cursor so
//! the next task starts at the last good agent, and once one task of a job does not
//! fit, its identical siblings are not tried again in the same pass. A job's counts
//! per `limit:N` attribute value for its newest config are kept between passes
//! ([`LimitCache`]): updated from the tasks each event changed, counted afresh only
//! when the agent index or the job's limits change (another config's counts are
//! counted per pass). Also the glue the scheduler works through: the attribute index
//! and `place`, which records a placement.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use drover_common::spec::Constraint;
use drover_common::state::{EventSource, TaskState};
use drover_common::wire::MaintenanceMode;

use super::model::{Agent, Job, Need};
use super::timers::Timer;
use super::{Core, Now};

/// Per-pass counts of a job's active tasks per (limit attribute, value).
pub(super) type LimitCounts = Vec<HashMap<String, u32>>;

/// A job's limit counts kept across scheduling passes: valid for one agent index
/// generation (an agent's attributes may change with a new one) and the limits they
/// were counted for, with the tasks counted in them, so a task's change is applied
/// once.
#[derive(Clone, Debug, Default)]
pub(super) struct LimitCache {
    gen: u64,
    limits: Vec<(String, u32)>,
    pub(super) counts: LimitCounts,
    counted: HashSet<String>,
}

impl LimitCache {
    /// Whether task `id` is counted in.
    pub(super) fn counts_task(&self, id: &str) -> bool {
        self.counted.contains(id)
    }

    /// Counts task `id` in (`on`) or out, on `agent`.
    fn apply(&mut self, id: &str, agent: &Agent, on: bool) {
        for ((attr, _), per_value) in self.limits.iter().zip(self.counts.iter_mut()) {
            let Some(v) = agent.attr(attr) else {
                continue;
            };
            if on {
                match per_value.get_mut(v) {
                    Some(n) => *n += 1,
                    None => {
                        per_value.insert(v.to_string(), 1);
                    }
                }
            } else if let Some(n) = per_value.get_mut(v) {
                *n -= 1;
                if *n == 0 {
                    per_value.remove(v);
                }
            }
        }
        if on {
            self.counted.insert(id.to_string());
        } else {
            self.counted.remove(id);
        }
    }
}

impl Core {
    /// Places every queued PENDING task that fits; the others wait, per job, with a
    /// reason until capacity changes.
    pub(super) fn schedule(&mut self, now: Now) {
        self.sync_limit_counts();
        self.place_reserved(now);
        let retry = self.take_capacity_changed() && !self.blocked.is_empty();
        if self.queue.is_empty() && !retry {
            return;
        }
        self.rebuild_index_if_dirty();
        let mut limits: HashMap<String, LimitCounts> = HashMap::new();
        // Jobs that found no agent in this pass: room only shrinks within a pass,
        // so their next tasks go straight to preemption.
        let mut no_fit: HashSet<String> = HashSet::new();
        if retry {
            // Freed room goes to the highest standing first (production, then
            // priority): a preempted task's replacement must not take its
            // preemptor's room. Each task stands by its own config (an update may
            // have changed the job's tier or priority since it was queued): a job's
            // waiting tasks go highest standing first, and the jobs by the standing
            // of the task each places next.
            let mut jobs: Vec<String> = self.blocked.keys().cloned().collect();
            for job in &jobs {
                self.order_blocked_by_standing(job);
            }
            jobs.sort_by_cached_key(|j| {
                let front = self.blocked.get(j).and_then(|q| q.front());
                std::cmp::Reverse(front.and_then(|id| self.standing_of_task(id)).map(|s| s.0))
            });
            for job in jobs {
                loop {
                    self.prune_blocked_front(&job);
                    let Some(id) = self.blocked.get(&job).and_then(|q| q.front()).cloned() else {
                        // Every blocked task of the job is placed or gone.
                        if let Some(j) = self.jobs.get_mut(&job) {
                            j.pending_reason = None;
                        }
                        break;
                    };
                    if !self.place_or_preempt(&job, &id, &mut limits, &mut no_fit, now) {
                        break;
                    }
                    if let Some(q) = self.blocked.get_mut(&job) {
                        q.pop_front();
                    }
                }
            }
        }
        while let Some(id) = self.queue.pop_front() {
            let Some(task) = self.tasks.get(&id) else {
                continue;
            };
            if task.status.state != TaskState::Pending {
                continue;
            }
            let job = task.job.clone();
            // A job with blocked tasks blocks its newcomers too (one queue per job,
            // whatever their config).
            self.prune_blocked_front(&job);
            if let Some(q) = self.blocked.get_mut(&job).filter(|q| !q.is_empty()) {
                q.push_back(id);
                continue;
            }
            if !self.place_or_preempt(&job, &id, &mut limits, &mut no_fit, now) {
                self.blocked.entry(job).or_default().push_back(id);
            }
        }
    }

    /// Puts a job's waiting tasks in order of their own config's standing, highest
    /// first (queue order among equals). Only a job running several configs can
    /// have tasks of different standing.
    fn order_blocked_by_standing(&mut self, job: &str) {
        if self.jobs.get(job).is_none_or(|j| j.configs.len() < 2) {
            return;
        }
        let Some(mut q) = self.blocked.remove(job) else {
            return;
        };
        q.make_contiguous()
            .sort_by_cached_key(|id| std::cmp::Reverse(self.standing_of_task(id).map(|s| s.0)));
        self.blocked.insert(job.to_string(), q);
    }

    /// Drops tasks that are no longer PENDING (killed, replaced job) from the front
    /// of the job's blocked list.
    fn prune_blocked_front(&mut self, job: &str) {
        let Some(q) = self.blocked.get_mut(job) else {
            return;
        };
        while let Some(id) = q.front() {
            if self
                .tasks
                .get(id)
                .is_some_and(|t| t.status.state == TaskState::Pending && t.job == job)
            {
                break;
            }
            q.pop_front();
        }
        if q.is_empty() {
            self.blocked.remove(job);
        }
    }

    /// Applies the tasks this event changed so far to their jobs' kept limit counts
    /// (placements made by `try_place_as` are counted there).
    fn sync_limit_counts(&mut self) {
        for id in &self.dirty_tasks {
            let Some(t) = self.tasks.get(id) else {
                continue;
            };
            let Some(job) = self.jobs.get_mut(&t.job) else {
                continue;
            };
            let Some(cache) = job.limit_cache.as_mut() else {
                continue;
            };
            let agent = t
                .agent
                .as_ref()
                .and_then(|a| self.agent_idx.get(a))
                .map(|&i| &self.agents[i as usize]);
            let on = t.status.state.is_on_agent() && agent.is_some();
            if on == cache.counts_task(id) {
                continue;
            }
            match agent {
                Some(agent) => cache.apply(id, agent, on),
                // Counted on an agent it no longer names: count afresh.
                None => job.limit_cache = None,
            }
        }
    }

    /// Runs `f` with the job's placement inputs (needs, constraints, candidates) set
    /// to task `id`'s own config: a task of another config than the job's newest
    /// (during or after an update) is placed, and preempts, by its own config's
    /// needs and constraints. `f` gets the key naming that config's limit counts
    /// (the job key for the newest config).
    pub(super) fn as_task_config<R>(
        &mut self,
        job_key: &str,
        id: &str,
        f: impl FnOnce(&mut Core, &str) -> R,
    ) -> R {
        let config = self
            .tasks
            .get(id)
            .map(|t| t.config.clone())
            .unwrap_or_default();
        let other = self
            .jobs
            .get(job_key)
            .is_some_and(|j| config != j.config && j.configs.contains_key(&config));
        if !other {
            return f(self, job_key);
        }
        let key = format!("{job_key}\u{0}{config}");
        if let Some(job) = self.jobs.get_mut(job_key) {
            job.swap_placement(&config);
        }
        let out = f(self, &key);
        if let Some(job) = self.jobs.get_mut(job_key) {
            job.swap_placement(&config);
        }
        out
    }

    /// Places the task, or when it fits nowhere gives preemption its turn (see
    /// `preemption`): the task then waits for its reservation instead of blocking
    /// its job.
    fn place_or_preempt(
        &mut self,
        job_key: &str,
        id: &str,
        limits: &mut HashMap<String, LimitCounts>,
        no_fit: &mut HashSet<String>,
        now: Now,
    ) -> bool {
        self.as_task_config(job_key, id, |core, key| {
            if !no_fit.contains(key) {
                if core.try_place_as(job_key, key, id, limits, now) {
                    return true;
                }
                no_fit.insert(key.to_string());
            }
            let Some((cache, kept)) = core.take_counts(job_key, key, limits) else {
                return false;
            };
            let preempted = core.try_preempt(job_key, id, &cache.counts, now);
            core.put_counts(job_key, key, cache, kept, limits);
            preempted
        })
    }

    /// `try_place` with the job's placement inputs as they stand; `key` names the
    /// limit counts of the config tried.
    fn try_place_as(
        &mut self,
        job_key: &str,
        key: &str,
        id: &str,
        limits: &mut HashMap<String, LimitCounts>,
        now: Now,
    ) -> bool {
        let Some((mut cache, kept)) = self.take_counts(job_key, key, limits) else {
            return false;
        };
        let gen = self.index_gen;
        let found = match self.jobs.get_mut(job_key) {
            Some(job) => find_agent(
                &self.agents,
                &self.attr_index,
                &self.open_agents,
                gen,
                job,
                &cache.counts,
            ),
            None => Err((String::new(), false)),
        };
        let placed = match found {
            Ok(idx) => {
                self.place_at(job_key, key, id, idx, &mut cache, kept, limits, now);
                true
            }
            Err((reason, fixed)) => {
                if let Some(job) = self.jobs.get_mut(job_key) {
                    job.pending_reason = Some(reason);
                    job.pending_fixed = fixed;
                }
                false
            }
        };
        self.put_counts(job_key, key, cache, kept, limits);
        placed
    }

    /// The limit counts `key` names, taken out for a placement decision (give them
    /// back with `put_counts`), and whether they are the job's kept counts (its
    /// newest config, with limits); another config's are counted once per pass.
    pub(super) fn take_counts(
        &mut self,
        job_key: &str,
        key: &str,
        limits: &mut HashMap<String, LimitCounts>,
    ) -> Option<(LimitCache, bool)> {
        let gen = self.index_gen;
        let job = self.jobs.get(job_key)?;
        let kept = key == job_key && !job.constraints.limits.is_empty();
        if kept {
            let stale = job
                .limit_cache
                .as_ref()
                .is_none_or(|c| c.gen != gen || c.limits != job.constraints.limits);
            if stale {
                let cache = self.limit_cache_of(job_key);
                if let Some(job) = self.jobs.get_mut(job_key) {
                    job.limit_cache = Some(cache);
                }
            }
        } else if !limits.contains_key(key) {
            let counts = self.limit_cache_of(job_key).counts;
            limits.insert(key.to_string(), counts);
        }
        let job = self.jobs.get_mut(job_key)?;
        Some(if kept {
            (job.limit_cache.take().unwrap_or_default(), true)
        } else {
            let cache = LimitCache {
                counts: limits.remove(key).unwrap_or_default(),
                limits: job.constraints.limits.clone(),
                ..LimitCache::default()
            };
            (cache, false)
        })
    }

    /// Gives back counts taken with `take_counts`.
    pub(super) fn put_counts(
        &mut self,
        job_key: &str,
        key: &str,
        cache: LimitCache,
        kept: bool,
        limits: &mut HashMap<String, LimitCounts>,
    ) {
        if kept {
            if let Some(job) = self.jobs.get_mut(job_key) {
                job.limit_cache = Some(cache);
            }
        } else {
            limits.insert(key.to_string(), cache.counts);
        }
    }

    /// Records task `id` of `job_key` on agent `idx` by the job's placement inputs
    /// as they stand: its limit counts (`cache`, taken for `key`), resources and
    /// ports. Counts of the job's other configs are dropped, to be counted again.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn place_at(
        &mut self,
        job_key: &str,
        key: &str,
        id: &str,
        idx: u32,
        cache: &mut LimitCache,
        kept: bool,
        limits: &mut HashMap<String, LimitCounts>,
        now: Now,
    ) {
        let config = self
            .tasks
            .get(id)
            .map(|t| t.config.clone())
            .unwrap_or_default();
        let Some(job) = self.jobs.get_mut(job_key) else {
            return;
        };
        cache.apply(id, &self.agents[idx as usize], true);
        if !kept {
            // Placed by another config's limits: the newest's kept counts miss it
            // until the next pass; count them afresh.
            job.limit_cache = None;
        }
        let need = job.need;
        let mixed = job.configs.len() > 1;
        let names = job.spec_of(&config).task.resources.ports.clone();
        let agent = &mut self.agents[idx as usize];
        agent.used_cpu_milli += need.cpu_milli;
        agent.used_ram += need.ram;
        agent.used_disk += need.disk;
        let ports = take_ports(agent, &names);
        if mixed {
            let prefix = format!("{job_key}\u{0}");
            limits.retain(|k, _| k == key || (k != job_key && !k.starts_with(&prefix)));
        }
        self.place(id, idx, ports, now);
    }
    /// Counts the job's tasks on agents per value of each limit attribute, afresh.
    fn limit_cache_of(&self, job_key: &str) -> LimitCache {
        let mut cache = LimitCache {
            gen: self.index_gen,
            ..LimitCache::default()
        };
        let Some(job) = self.jobs.get(job_key) else {
            return cache;
        };
        cache.limits = job.constraints.limits.clone();
        cache.counts = vec![HashMap::new(); cache.limits.len()];
        if cache.counts.is_empty() {
            return cache;
        }
        for slot in &job.slots {
            for id in slot.current.iter().chain(slot.history.iter()) {
                let Some(t) = self.tasks.get(id) else {
                    continue;
                };
                if !t.status.state.is_on_agent() {
                    continue;
                }
                let Some(&idx) = t.agent.as_ref().and_then(|a| self.agent_idx.get(a)) else {
                    continue;
                };
                cache.apply(id, &self.agents[idx as usize], true);
            }
        }
        cache
    }

    /// Test support: drops every job's kept limit counts (the next pass counts
    /// afresh).
    #[cfg(test)]
    pub(super) fn forget_limit_counts(&mut self) {
        for job in self.jobs.values_mut() {
            job.limit_cache = None;
        }
    }

    /// Test support: every job's kept limit counts (where valid for the current
    /// agent index and the job's limits) equal a fresh count. The job where they
    /// differ, if any.
    #[cfg(test)]
    pub(super) fn limit_counts_drift(&self) -> Option<String> {
        if self.index_dirty {
            // Attributes changed since the index was built: the next pass counts
            // afresh before it reads a count.
            return None;
        }
        for (key, job) in &self.jobs {
            let Some(cache) = &job.limit_cache else {
                continue;
            };
            if cache.gen != self.index_gen || cache.limits != job.constraints.limits {
                continue;
            }
            let fresh = self.limit_cache_of(key);
            if fresh.counts != cache.counts || fresh.counted != cache.counted {
                return Some(format!(
                    "{key}: kept {:?} ({} tasks), counted afresh {:?} ({} tasks)",
                    cache.counts,
                    cache.counted.len(),
                    fresh.counts,
                    fresh.counted.len()
                ));
            }
        }
        None
    }
}

/// The agents a job may use at all (value constraints and dedicated hosts).
fn candidates_for(
    agents: &[Agent],
    attr_index: &HashMap<String, HashMap<String, Vec<u32>>>,
    open: &Arc<Vec<u32>>,
    job: &Job,
) -> Arc<Vec<u32>> {
    let c = &job.constraints;
    if c.values.is_empty() {
        return open.clone();
    }
    // Start from the buckets of the first positive value constraint, else all open.
    let positive = c
        .values
        .iter()
        .find(|(_, v)| matches!(v, Constraint::Value { negated: false, .. }));
    let mut list: Vec<u32> = match positive {
        Some((attr, Constraint::Value { values, .. })) => {
            let mut l: Vec<u32> = values
                .iter()
                .filter_map(|v| attr_index.get(attr).and_then(|m| m.get(v)))
                .flatten()
                .copied()
                .collect();
            l.sort_unstable();
            l.dedup();
            l
        }
        _ => open.as_ref().clone(),
    };
    list.retain(|&i| {
        let a = &agents[i as usize];
        if !c.names_dedicated && a.rec.attributes.contains_key("dedicated") {
            return false;
        }
        c.values
            .iter()
            .all(|(attr, cons)| cons.allows_value(a.attr(attr)))
    });
    Arc::new(list)
}

/// Why one agent cannot take the job's next task, if it cannot.
fn misfit(agent: &Agent, need: &Need, job: &Job, counts: &LimitCounts) -> Option<Misfit> {
    if !agent.reachable {
        return Some(Misfit::Unreachable);
    }
    if agent.rec.maintenance.mode != MaintenanceMode::None {
        return Some(Misfit::Maintenance);
    }
    // Reserved: freed by preemption for another task (see `preemption`).
    let r = &agent.reserved;
    if agent.used_cpu_milli + r.cpu_milli + need.cpu_milli > agent.cpu_milli {
        return Some(Misfit::Cpu);
    }
    if agent.used_ram + r.ram + need.ram > agent.rec.resources.ram_bytes {
        return Some(Misfit::Ram);
    }
    if agent.used_disk + r.disk + need.disk > agent.rec.resources.disk_bytes {
        return Some(Misfit::Disk);
    }
    if need.ports > 0 && agent.used_ports.len() as u32 + r.ports + need.ports > agent.port_count() {
        return Some(Misfit::Ports);
    }
    for (i, ((attr, n), per_value)) in job.constraints.limits.iter().zip(counts).enumerate() {
        match agent.attr(attr) {
            None => return Some(Misfit::NoAttribute(i)),
            Some(v) => {
                if per_value.get(v).copied().unwrap_or(0) >= *n {
                    return Some(Misfit::Limit(i));
                }
            }
        }
    }
    None
}

/// Whether anything but free resources keeps the job's next task off `agent`
/// (unreachable, a limit reached, an attribute missing).
pub(super) fn misfit_ignoring_resources(agent: &Agent, job: &Job, counts: &LimitCounts) -> bool {
    let none = Need::default();
    !matches!(
        misfit(agent, &none, job, counts),
        None | Some(Misfit::Cpu | Misfit::Ram | Misfit::Disk | Misfit::Ports)
    )
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Misfit {
    Unreachable,
    Maintenance,
    Cpu,
    Ram,
    Disk,
    Ports,
    Limit(usize),
    NoAttribute(usize),
}

/// Finds an agent for the job's next task, or says why there is none (and
/// whether only the job's spec or an operator can change that, see [`explain`]).
fn find_agent(
    agents: &[Agent],
    attr_index: &HashMap<String, HashMap<String, Vec<u32>>>,
    open: &Arc<Vec<u32>>,
    index_gen: u64,
    job: &mut Job,
    counts: &LimitCounts,
) -> Result<u32, (String, bool)> {
    let cands = match &job.candidates {
        Some((gen, list)) if *gen == index_gen => list.clone(),
        _ => {
            let list = candidates_for(agents, attr_index, open, job);
            job.candidates = Some((index_gen, list.clone()));
            list
        }
    };
    let n = cands.len();
    let need = job.need;
    if n > 0 {
        let start = job.cursor % n;
        for step in 0..n {
            let pos = (start + step) % n;
            let idx = cands[pos];
            if misfit(&agents[idx as usize], &need, job, counts).is_none() {
                // Spread: the next task of this job starts at the next agent.
                job.cursor = pos + 1;
                return Ok(idx);
            }
        }
    }
    Err(explain(agents, &cands, &need, job, counts))
}

/// Why the agents outside the job's candidate list were excluded, per constraint:
/// "rack constraint not met on 3 agents", "dedicated to other jobs on 1 agent".
fn explain_excluded(agents: &[Agent], cands: &[u32], job: &Job) -> Vec<String> {
    let c = &job.constraints;
    let mut in_cands = vec![false; agents.len()];
    for &idx in cands {
        in_cands[idx as usize] = true;
    }
    let mut tally: Vec<(String, u32)> = Vec::new();
    for (agent, _) in agents.iter().zip(&in_cands).filter(|(_, inside)| !**inside) {
        let why = if !c.names_dedicated && agent.rec.attributes.contains_key("dedicated") {
            "dedicated to other jobs".to_string()
        } else if let Some((attr, _)) = c
            .values
            .iter()
            .find(|(attr, cons)| !cons.allows_value(agent.attr(attr)))
        {
            format!("{attr} constraint not met")
        } else {
            "constraints not met".to_string()
        };
        match tally.iter_mut().find(|(w, _)| *w == why) {
            Some(e) => e.1 += 1,
            None => tally.push((why, 1)),
        }
    }
    tally.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    tally
        .into_iter()
        .map(|(why, n)| format!("{why} on {n} agent{}", if n == 1 { "" } else { "s" }))
        .collect()
}

/// "insufficient ram on 12 agents; rack limit reached on 3", and whether it is
/// fixed: every agent is refused for the job's own limits, constraints or
/// attributes, or for being in maintenance, so no other task's ending and no agent
/// coming back changes it (a new agent, an ended maintenance or another spec does).
fn explain(
    agents: &[Agent],
    cands: &[u32],
    need: &Need,
    job: &Job,
    counts: &LimitCounts,
) -> (String, bool) {
    if agents.is_empty() {
        return ("no agents registered".to_string(), false);
    }
    let mut tally: Vec<(Misfit, u32)> = Vec::new();
    for &idx in cands {
        if let Some(m) = misfit(&agents[idx as usize], need, job, counts) {
            match tally.iter_mut().find(|(k, _)| *k == m) {
                Some(e) => e.1 += 1,
                None => tally.push((m, 1)),
            }
        }
    }
    tally.sort_by_key(|(m, n)| (std::cmp::Reverse(*n), format!("{m:?}")));
    let fixed = tally.iter().all(|(m, _)| {
        matches!(
            m,
            Misfit::Limit(_) | Misfit::NoAttribute(_) | Misfit::Maintenance
        )
    });
    let mut parts: Vec<String> = tally
        .into_iter()
        .map(|(m, n)| {
            let what = match m {
                Misfit::Unreachable => "agent unreachable".to_string(),
                Misfit::Maintenance => "host in maintenance".to_string(),
                Misfit::Cpu => "insufficient cpu".to_string(),
                Misfit::Ram => "insufficient ram".to_string(),
                Misfit::Disk => "insufficient disk".to_string(),
                Misfit::Ports => "insufficient ports".to_string(),
                Misfit::Limit(i) => format!("{} limit reached", job.constraints.limits[i].0),
                Misfit::NoAttribute(i) => {
                    format!("no {} attribute", job.constraints.limits[i].0)
                }
            };
            format!("{what} on {n} agent{}", if n == 1 { "" } else { "s" })
        })
        .collect();
    if agents.len() > cands.len() {
        parts.extend(explain_excluded(agents, cands, job));
    }
    if parts.is_empty() {
        ("no agent fits".to_string(), false)
    } else {
        (parts.join("; "), fixed)
    }
}

/// Picks free ports for the named ports, rotating through the agent's range.
fn take_ports(agent: &mut Agent, names: &[String]) -> Vec<(String, u16)> {
    let (lo, hi) = agent.rec.resources.port_range;
    let mut out = Vec::with_capacity(names.len());
    if names.is_empty() || hi < lo {
        return out;
    }
    let mut p = agent.next_port.clamp(lo, hi);
    for name in names {
        let mut tries = u32::from(hi - lo) + 1;
        while agent.used_ports.contains(&p) && tries > 0 {
            p = if p >= hi { lo } else { p + 1 };
            tries -= 1;
        }
        if tries == 0 {
            break; // cannot happen: the fit check counted free ports
        }
        agent.used_ports.insert(p);
        out.push((name.clone(), p));
        p = if p >= hi { lo } else { p + 1 };
    }
    agent.next_port = p;
    out
}
impl Core {
    pub(super) fn rebuild_index_if_dirty(&mut self) {
        if !self.index_dirty {
            return;
        }
        self.index_dirty = false;
        self.index_gen += 1;
        self.attr_index.clear();
        let mut open = Vec::new();
        for (i, a) in self.agents.iter().enumerate() {
            for (k, v) in &a.rec.attributes {
                self.attr_index
                    .entry(k.clone())
                    .or_default()
                    .entry(v.clone())
                    .or_default()
                    .push(i as u32);
            }
            if !a.rec.attributes.contains_key("dedicated") {
                open.push(i as u32);
            }
        }
        self.open_agents = Arc::new(open);
    }

    pub(super) fn take_capacity_changed(&mut self) -> bool {
        std::mem::take(&mut self.capacity_changed)
    }

    /// Records a placement made by the scheduler.
    pub(super) fn place(&mut self, id: &str, idx: u32, ports: Vec<(String, u16)>, now: Now) {
        let version = self.bump_agent(idx);
        let agent_id = self.agents[idx as usize].rec.id.clone();
        let Some(task) = self.tasks.get_mut(id) else {
            return;
        };
        if task
            .status
            .transition(
                TaskState::Assigned,
                None,
                now.wall,
                EventSource::Master,
                &format!("assigned to {agent_id}"),
            )
            .is_err()
        {
            return;
        }
        task.agent = Some(agent_id);
        task.ports = ports;
        task.assigned_version = version;
        task.last_report_ms = now.mono;
        self.agents[idx as usize].tasks.insert(id.to_string());
        self.mark(id);
        self.push_timer(
            now.mono + self.cfg.transient_timeout_ms,
            Timer::Transient {
                task: id.to_string(),
                state: TaskState::Assigned,
            },
        );
    }
}
