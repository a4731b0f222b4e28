//! Pure placement, spread and choice: PENDING tasks onto agents, each task by
//! its own config's needs and constraints, the queue per job and its order by
//! standing, then the record of a placement (resources, ports, the attribute
//! index). Fast paths: candidate agents are precomputed per job from the
//! attribute index, each job keeps a rotating cursor so the next task starts at
//! the last good agent (spread, not pack), and once one task of a job does not
//! fit, its identical siblings are not tried again in the same pass. Whether an
//! agent can take a task is `feasibility`'s; the `limit:N` counts kept between
//! passes are `limits`'.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use drover_common::state::{EventSource, TaskState};

use super::feasibility::{candidates_for, explain, misfit};
use super::limits::{LimitCache, LimitCounts};
use super::model::{Agent, Job};
use super::placement_soft::{SoftGroups, UsageIndex};
use super::scoring::{value_count, Candidate};
use super::timers::Timer;
use super::{Core, Now};

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
                &self.usage,
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
        let agent = &self.agents[idx as usize];
        cache.apply(id, |a| agent.attr(a), true);
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
        self.note_usage(idx);
        if mixed {
            let prefix = format!("{job_key}\u{0}");
            limits.retain(|k, _| k == key || (k != job_key && !k.starts_with(&prefix)));
        }
        self.place(id, idx, ports, now);
    }
}

/// Finds an agent for the job's next task, or says why there is none (and
/// whether only the job's spec or an operator can change that, see [`explain`]).
fn find_agent(
    agents: &[Agent],
    attr_index: &HashMap<String, HashMap<String, Vec<u32>>>,
    open: &Arc<Vec<u32>>,
    usage: &UsageIndex,
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
    if n > 0 && job.constraints.soft.is_set() {
        // Soft preferences: a host with the highest score (see `placement_soft`).
        let mut groups = match job.constraints.soft.groups.take() {
            Some(g) if g.is_for(index_gen) => g,
            _ => Box::new(SoftGroups::build(
                &job.constraints.soft,
                &job.constraints.counted,
                &cands,
                agents.len(),
                index_gen,
                |i, a| agents[i as usize].attr(a),
            )),
        };
        let values = |a: &str| value_count(attr_index, a);
        let chosen = groups.choose(
            &job.constraints.soft,
            &job.constraints.counted,
            counts,
            &values,
            usage,
            &|i| agents[i as usize].used_percent(),
            &mut |i| misfit(&agents[i as usize], &need, job, counts).is_none(),
        );
        job.constraints.soft.groups = Some(groups);
        if let Some(idx) = chosen {
            return Ok(idx);
        }
    } else if n > 0 {
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
    /// Records agent `idx`'s use in the usage index (after its use or size changed).
    pub(super) fn note_usage(&mut self, idx: u32) {
        if let Some(a) = self.agents.get(idx as usize) {
            self.usage.set(idx, a.used_percent());
        }
    }

    /// Records every agent's use afresh.
    pub(super) fn rebuild_usage(&mut self) {
        self.usage.clear();
        for (i, a) in self.agents.iter().enumerate() {
            self.usage.set(i as u32, a.used_percent());
        }
    }

    /// Test support: whether the usage index holds every agent's current use.
    #[cfg(test)]
    pub(super) fn usage_is_current(&self) -> bool {
        self.agents
            .iter()
            .enumerate()
            .all(|(i, a)| self.usage.holds(i as u32, a.used_percent()))
    }

    pub(super) fn rebuild_index_if_dirty(&mut self) {
        if !self.index_dirty {
            return;
        }
        self.rebuild_usage();
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
