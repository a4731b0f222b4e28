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
type LimitCounts = Vec<HashMap<String, u32>>;

/// A job's limit counts kept across scheduling passes: valid for one agent index
/// generation (an agent's attributes may change with a new one) and the limits they
/// were counted for, with the tasks counted in them, so a task's change is applied
/// once.
#[derive(Clone, Debug, Default)]
pub(super) struct LimitCache {
    gen: u64,
    limits: Vec<(String, u32)>,
    counts: LimitCounts,
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
        let retry = self.take_capacity_changed() && !self.blocked.is_empty();
        if self.queue.is_empty() && !retry {
            return;
        }
        self.rebuild_index_if_dirty();
        let mut limits: HashMap<String, LimitCounts> = HashMap::new();
        if retry {
            let jobs: Vec<String> = self.blocked.keys().cloned().collect();
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
                    if !self.try_place(&job, &id, &mut limits, now) {
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
            if !self.try_place(&job, &id, &mut limits, now) {
                self.blocked.entry(job).or_default().push_back(id);
            }
        }
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

    /// Places one task of `job` or records why it cannot be placed. A task of
    /// another config than the job's newest (during or after an update) is placed
    /// by its own config's needs and constraints.
    fn try_place(
        &mut self,
        job_key: &str,
        id: &str,
        limits: &mut HashMap<String, LimitCounts>,
        now: Now,
    ) -> bool {
        let config = self.tasks.get(id).map(|t| t.config.as_str()).unwrap_or("");
        let Some(job) = self.jobs.get(job_key) else {
            return false;
        };
        if config == job.config || !job.configs.contains_key(config) {
            return self.try_place_as(job_key, job_key, id, limits, now);
        }
        let config = config.to_string();
        let key = format!("{job_key}\u{0}{config}");
        if let Some(job) = self.jobs.get_mut(job_key) {
            job.swap_placement(&config);
        }
        let placed = self.try_place_as(job_key, &key, id, limits, now);
        if let Some(job) = self.jobs.get_mut(job_key) {
            job.swap_placement(&config);
        }
        placed
    }

    /// `try_place` with the job's placement inputs as they stand; `key` names the
    /// limit counts of the config tried (counts of the job's other configs are
    /// dropped after a placement, to be counted again).
    fn try_place_as(
        &mut self,
        job_key: &str,
        key: &str,
        id: &str,
        limits: &mut HashMap<String, LimitCounts>,
        now: Now,
    ) -> bool {
        // The newest config's counts are kept between passes; another config's
        // are counted for this pass.
        let gen = self.index_gen;
        let Some(job) = self.jobs.get(job_key) else {
            return false;
        };
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
        let Some(job) = self.jobs.get_mut(job_key) else {
            return false;
        };
        let mut cache = if kept {
            job.limit_cache.take().unwrap_or_default()
        } else {
            LimitCache {
                counts: limits.remove(key).unwrap_or_default(),
                limits: job.constraints.limits.clone(),
                ..LimitCache::default()
            }
        };
        let found = find_agent(
            &self.agents,
            &self.attr_index,
            &self.open_agents,
            gen,
            job,
            &cache.counts,
        );
        if kept {
            if let Ok(idx) = found {
                cache.apply(id, &self.agents[idx as usize], true);
            }
            job.limit_cache = Some(cache);
        } else {
            if let Ok(idx) = found {
                cache.apply(id, &self.agents[idx as usize], true);
                // Placed by another config's limits: the newest's kept counts miss
                // it until the next pass; count them afresh.
                job.limit_cache = None;
            }
            limits.insert(key.to_string(), cache.counts);
        }
        match found {
            Ok(idx) => {
                let config = self.tasks.get(id).map(|t| t.config.as_str()).unwrap_or("");
                let need = job.need;
                let mixed = job.configs.len() > 1;
                let names = job.spec_of(config).task.resources.ports.clone();
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
                true
            }
            Err(reason) => {
                job.pending_reason = Some(reason);
                false
            }
        }
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
    if agent.used_cpu_milli + need.cpu_milli > agent.cpu_milli {
        return Some(Misfit::Cpu);
    }
    if agent.used_ram + need.ram > agent.rec.resources.ram_bytes {
        return Some(Misfit::Ram);
    }
    if agent.used_disk + need.disk > agent.rec.resources.disk_bytes {
        return Some(Misfit::Disk);
    }
    if need.ports > 0 && agent.used_ports.len() as u32 + need.ports > agent.port_count() {
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

/// Finds an agent for the job's next task, or says why there is none.
fn find_agent(
    agents: &[Agent],
    attr_index: &HashMap<String, HashMap<String, Vec<u32>>>,
    open: &Arc<Vec<u32>>,
    index_gen: u64,
    job: &mut Job,
    counts: &LimitCounts,
) -> Result<u32, String> {
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

/// "insufficient ram on 12 agents; rack limit reached on 3".
fn explain(
    agents: &[Agent],
    cands: &[u32],
    need: &Need,
    job: &Job,
    counts: &LimitCounts,
) -> String {
    if agents.is_empty() {
        return "no agents registered".to_string();
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
        "no agent fits".to_string()
    } else {
        parts.join("; ")
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
