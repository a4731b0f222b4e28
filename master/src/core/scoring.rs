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
//! score wins. This file is the score itself (and the reference that scores every
//! host); `placement_soft` finds a host with the highest score without scoring
//! every candidate.

use std::collections::HashMap;

use drover_common::spec::{Constraint, JobSpec, PlacementStrategy};

#[cfg(test)]
use super::limits::LimitCounts;
use super::placement_soft::SoftGroups;

/// What scoring reads of a host that fits (the model's agent implements it, so this
/// file needs nothing of the model).
pub(super) trait Candidate {
    /// The host's use in percent once its placed tasks count: the larger of CPU and RAM.
    fn used_percent(&self) -> f64;
    /// The host's value of `attribute` (`host` is its id), if it has one.
    #[cfg(test)]
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
    /// The job's candidates grouped by their soft attribute values, for one agent
    /// index generation (see `placement_soft`); built at the first placement.
    pub(super) groups: Option<Box<SoftGroups>>,
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
    /// The reference: placement finds a host of the highest score without it
    /// (`placement_soft`, tested against this).
    #[cfg(test)]
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
            let (Some((attr, _)), Some(per_value)) = (counted.get(i), counts.get(i)) else {
                continue;
            };
            let total: u32 = per_value.values().sum();
            score += spread_term(
                weight,
                agent
                    .attr(attr)
                    .map(|v| per_value.get(v).copied().unwrap_or(0)),
                total,
                values(attr),
            );
        }
        for (attr, c, weight) in &self.affinity {
            if c.allows_value(agent.attr(attr)) {
                score += f64::from(*weight);
            }
        }
        score
    }
}

/// A `spread` entry's term for a host whose value holds `held` of the job's
/// instances (None: the host lacks the attribute), `total` instances counted over
/// the attribute's values, which number `values` in the cluster.
pub(super) fn spread_term(weight: u32, held: Option<u32>, total: u32, values: usize) -> f64 {
    let w = f64::from(weight);
    let Some(held) = held else {
        return -w;
    };
    let share = f64::from(total + 1) / values.max(1) as f64;
    (w * (share - f64::from(held)) / share).clamp(-w, w)
}

/// How many values `attr` has among the agents (from the attribute index).
pub(super) fn value_count(index: &HashMap<String, HashMap<String, Vec<u32>>>, attr: &str) -> usize {
    index.get(attr).map_or(0, |m| m.len())
}
