//! Soft placement preferences, pure: a score for each agent that fits a job's next
//! task, from the job's `placement` strategy, `spread` and `affinity` entries.
//! Feasibility stays the hard filter; a job without any of these is placed by its
//! rotating cursor alone and never reaches this file.
//!
//! The score is a sum: the strategy adds up to 100 (binpack: the host's use, the
//! larger of CPU and RAM in percent; spread: 100 minus it); each `spread` entry adds
//! `weight * (share - held) / share`, clamped to `-weight..=weight`, where `held` is
//! the job's instances already on hosts with this host's value and `share` the even
//! share of the job's instances once this one is placed (a host without the
//! attribute: `-weight`); each matching `affinity` entry adds its weight. The highest
//! score wins; ties go to the first agent in the rotating cursor's order.

use std::collections::HashMap;

use drover_common::spec::{Constraint, JobSpec, PlacementStrategy};

use super::limits::LimitCounts;

/// What scoring reads of a host that fits (the model's agent implements it, so this
/// file needs nothing of the model).
pub(super) trait Candidate {
    /// The host's use in percent once its placed tasks count: the larger of CPU and RAM.
    fn used_percent(&self) -> f64;
    /// The host's value of `attribute` (`host` is its id), if it has one.
    fn attr(&self, attribute: &str) -> Option<&str>;
}

/// A job's soft preferences, parsed once.
#[derive(Clone, Debug, Default)]
pub(super) struct Soft {
    pub(super) strategy: Option<PlacementStrategy>,
    /// (index into the job's counted attributes, weight).
    pub(super) spread: Vec<(usize, u32)>,
    /// (attribute, value expression, weight).
    pub(super) affinity: Vec<(String, Constraint, i32)>,
}

impl Soft {
    /// The spec's soft preferences; spread attributes not already counted (as a
    /// limit) are appended to `counted`.
    pub(super) fn of(spec: &JobSpec, counted: &mut Vec<(String, u32)>) -> Soft {
        let mut soft = Soft {
            strategy: spec.placement,
            ..Soft::default()
        };
        for s in spec.spread.iter().flatten() {
            let i = match counted.iter().position(|(a, _)| *a == s.attribute) {
                Some(i) => i,
                None => {
                    counted.push((s.attribute.clone(), u32::MAX));
                    counted.len() - 1
                }
            };
            soft.spread.push((i, s.weight));
        }
        for a in spec.affinity.iter().flatten() {
            // A limit or unparsable value was refused by validation; ignored here.
            if let Ok(c @ Constraint::Value { .. }) = a.value.parsed() {
                soft.affinity
                    .push((a.attribute.clone(), c.clone(), a.weight));
            }
        }
        soft
    }

    /// Whether the job has any soft preference (else: the rotating cursor alone).
    pub(super) fn is_set(&self) -> bool {
        self.strategy.is_some() || !self.spread.is_empty() || !self.affinity.is_empty()
    }

    /// The score of placing the job's next task on `agent`. `counted` names the
    /// attributes of `counts`; `values` is how many values each has in the cluster.
    pub(super) fn score(
        &self,
        agent: &impl Candidate,
        counted: &[(String, u32)],
        counts: &LimitCounts,
        values: &dyn Fn(&str) -> usize,
    ) -> f64 {
        let mut score = 0.0;
        if let Some(strategy) = self.strategy {
            let used = agent.used_percent();
            score += match strategy {
                PlacementStrategy::Binpack => used,
                PlacementStrategy::Spread => 100.0 - used,
            };
        }
        for &(i, weight) in &self.spread {
            let w = f64::from(weight);
            let (Some((attr, _)), Some(per_value)) = (counted.get(i), counts.get(i)) else {
                continue;
            };
            let Some(v) = agent.attr(attr) else {
                score -= w;
                continue;
            };
            let held = f64::from(per_value.get(v).copied().unwrap_or(0));
            let total: u32 = per_value.values().sum();
            let share = f64::from(total + 1) / values(attr).max(1) as f64;
            score += (w * (share - held) / share).clamp(-w, w);
        }
        for (attr, c, weight) in &self.affinity {
            if c.allows_value(agent.attr(attr)) {
                score += f64::from(*weight);
            }
        }
        score
    }
}

impl Soft {
    /// An upper bound of [`Soft::score`] over every agent whose attribute values
    /// are in `index` (the attribute index): the placement loop stops at the first
    /// agent that reaches it, as no later one can beat it (ties go to the first).
    /// Each term is bounded as `score` computes it and summed in the same order (a
    /// float sum keeps the order of its terms): the strategy's (binpack: unbounded,
    /// never an early stop; spread: 100), each spread entry's at the value holding
    /// fewest of the job's instances (none when the index has no value for it),
    /// each affinity entry's weight when it is positive.
    pub(super) fn bound(
        &self,
        counted: &[(String, u32)],
        counts: &LimitCounts,
        index: &HashMap<String, HashMap<String, Vec<u32>>>,
    ) -> f64 {
        let mut bound = 0.0;
        match self.strategy {
            Some(PlacementStrategy::Binpack) => return f64::INFINITY,
            Some(PlacementStrategy::Spread) => bound += 100.0,
            None => {}
        }
        for &(i, weight) in &self.spread {
            let w = f64::from(weight);
            let (Some((attr, _)), Some(per_value)) = (counted.get(i), counts.get(i)) else {
                continue;
            };
            let least = index
                .get(attr)
                .and_then(|values| {
                    values
                        .keys()
                        .map(|v| per_value.get(v).copied().unwrap_or(0))
                        .min()
                })
                .unwrap_or(0);
            let total: u32 = per_value.values().sum();
            let share = f64::from(total + 1) / value_count(index, attr).max(1) as f64;
            bound += (w * (share - f64::from(least)) / share).clamp(-w, w);
        }
        for (_, _, weight) in &self.affinity {
            if *weight > 0 {
                bound += f64::from(*weight);
            }
        }
        bound
    }
}

/// How many values `attr` has among the agents (from the attribute index).
pub(super) fn value_count(index: &HashMap<String, HashMap<String, Vec<u32>>>, attr: &str) -> usize {
    index.get(attr).map_or(0, |m| m.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Host {
        used: f64,
        attrs: Vec<(&'static str, String)>,
    }

    impl Candidate for Host {
        fn used_percent(&self) -> f64 {
            self.used
        }
        fn attr(&self, attribute: &str) -> Option<&str> {
            self.attrs
                .iter()
                .find(|(a, _)| *a == attribute)
                .map(|(_, v)| v.as_str())
        }
    }

    #[test]
    fn no_host_scores_above_the_bound_the_placement_loop_stops_at() {
        // 60 hosts: 7 racks, 3 zones, every 11th without a rack, uneven counts.
        let hosts: Vec<Host> = (0..60)
            .map(|i| {
                let mut attrs = vec![("zone", format!("z{}", i % 3))];
                if i % 11 != 0 {
                    attrs.push(("rack", format!("r{}", i % 7)));
                }
                Host {
                    used: f64::from(i * 13 % 101),
                    attrs,
                }
            })
            .collect();
        let mut index: HashMap<String, HashMap<String, Vec<u32>>> = HashMap::new();
        for (i, h) in hosts.iter().enumerate() {
            for (a, v) in &h.attrs {
                index
                    .entry(a.to_string())
                    .or_default()
                    .entry(v.clone())
                    .or_default()
                    .push(i as u32);
            }
        }
        let counted = vec![("rack".to_string(), u32::MAX), ("zone".to_string(), 2)];
        let values = |a: &str| value_count(&index, a);
        let zone = |v: &str, negated| Constraint::Value {
            values: vec![v.to_string()],
            negated,
        };
        let strategies = [
            None,
            Some(PlacementStrategy::Spread),
            Some(PlacementStrategy::Binpack),
        ];
        let mut reached = 0;
        for round in 0..40u32 {
            // Per-rack and per-zone counts of the job's instances so far.
            let mut counts: LimitCounts = vec![HashMap::new(), HashMap::new()];
            for r in 0..7u32 {
                let n = (round * (r + 3)) % 9;
                if n > 0 && !(round % 5 == 0 && r == 2) {
                    counts[0].insert(format!("r{r}"), n);
                }
            }
            counts[1].insert(format!("z{}", round % 3), round % 4 + 1);
            for strategy in strategies {
                for affinity in [
                    vec![],
                    vec![("zone".to_string(), zone("z1", false), 40)],
                    vec![("zone".to_string(), zone("z2", true), -25)],
                ] {
                    let soft = Soft {
                        strategy,
                        spread: vec![(0, 50), (1, 1 + round % 100)],
                        affinity,
                    };
                    let bound = soft.bound(&counted, &counts, &index);
                    let best = hosts
                        .iter()
                        .map(|h| soft.score(h, &counted, &counts, &values))
                        .fold(f64::NEG_INFINITY, f64::max);
                    assert!(best <= bound, "round {round}: {best} > {bound}");
                    if best == bound {
                        reached += 1;
                    }
                }
            }
        }
        // The bound is tight often enough to stop early.
        assert!(reached > 0);
    }
}
