//! A job's counts of its active tasks per `limit:N` (and `spread`) attribute value, kept
//! between scheduling passes (`LimitCache`): updated from the tasks each event
//! changed, counted afresh only when the agent index or the job's limits change;
//! another config's counts are counted per pass (`take_counts`/`put_counts`).

use std::collections::{HashMap, HashSet};

use super::Core;

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

    /// Counts task `id` in (`on`) or out, on the agent whose attributes `attr`
    /// looks up.
    pub(super) fn apply<'a>(&mut self, id: &str, attr: impl Fn(&str) -> Option<&'a str>, on: bool) {
        for ((name, _), per_value) in self.limits.iter().zip(self.counts.iter_mut()) {
            let Some(v) = attr(name) else {
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
    /// Applies the tasks this event changed so far to their jobs' kept limit counts
    /// (placements made by `try_place_as` are counted there).
    pub(super) fn sync_limit_counts(&mut self) {
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
                Some(agent) => cache.apply(id, |a| agent.attr(a), on),
                // Counted on an agent it no longer names: count afresh.
                None => job.limit_cache = None,
            }
        }
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
        let kept = key == job_key && !job.constraints.counted.is_empty();
        if kept {
            let stale = job
                .limit_cache
                .as_ref()
                .is_none_or(|c| c.gen != gen || c.limits != job.constraints.counted);
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
                limits: job.constraints.counted.clone(),
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

    /// Counts the job's tasks on agents per value of each limit attribute, afresh.
    pub(super) fn limit_cache_of(&self, job_key: &str) -> LimitCache {
        let mut cache = LimitCache {
            gen: self.index_gen,
            ..LimitCache::default()
        };
        let Some(job) = self.jobs.get(job_key) else {
            return cache;
        };
        cache.limits = job.constraints.counted.clone();
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
                let agent = &self.agents[idx as usize];
                cache.apply(id, |a| agent.attr(a), true);
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
            if cache.gen != self.index_gen || cache.limits != job.constraints.counted {
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
