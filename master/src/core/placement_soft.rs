//! Soft placement without scoring every host, pure: the cell's hosts ordered by
//! use (`UsageIndex`), and a job's candidate hosts grouped by their values of the
//! job's `spread` and `affinity` attributes (`SoftGroups`). Every host of a group
//! gets the same spread and affinity terms of the score (`scoring`), so a task
//! scores each group once, not each host:
//!
//! - without `placement`, the groups are tried from the highest score down (equal
//!   groups in turn, starting after the group used last) and the task takes the
//!   first host that fits in the first group that has one, each group keeping a
//!   rotating cursor as a plain job does;
//! - with `placement`, the hosts are walked in the order of its term (binpack: most
//!   used first; spread: least used first), skipping non-candidates, and the walk
//!   stops at the first host whose strategy term plus the highest term of each
//!   entry over all groups cannot beat the best score so far.
//!
//! Either way the chosen host has the highest score `Soft::score` gives any
//! candidate that fits (the terms are added in the same order, and a float sum
//! never falls when a term grows, so the walk's bound holds); among equal hosts
//! which one wins is this file's order, not the exhaustive scan's. A test compares
//! the two on random cells. Cost per task: the groups' terms (groups x entries),
//! then the hosts tried until one fits (without `placement`) or walked until the
//! bound (with it: one host when nothing but the strategy scores, more when spread
//! terms differ between groups; every host at worst, as the exhaustive scan).

use std::collections::{BTreeSet, HashMap};

use drover_common::spec::PlacementStrategy;

use super::limits::LimitCounts;
use super::scoring::{spread_term, Soft};

/// Every agent ordered by its use in percent (`Candidate::used_percent`), kept
/// current by the core wherever an agent's use or size changes.
#[derive(Clone, Debug, Default)]
pub(super) struct UsageIndex {
    order: BTreeSet<(u64, u32)>,
    keys: Vec<Option<u64>>,
}

/// The ordered key of a use in percent: for non-negative floats the bits order as
/// the values.
fn key_of(used_percent: f64) -> u64 {
    used_percent.max(0.0).to_bits()
}

impl UsageIndex {
    /// Records agent `idx`'s use.
    pub(super) fn set(&mut self, idx: u32, used_percent: f64) {
        let key = key_of(used_percent);
        let i = idx as usize;
        if self.keys.len() <= i {
            self.keys.resize(i + 1, None);
        }
        if self.keys[i] == Some(key) {
            return;
        }
        if let Some(old) = self.keys[i] {
            self.order.remove(&(old, idx));
        }
        self.order.insert((key, idx));
        self.keys[i] = Some(key);
    }

    pub(super) fn clear(&mut self) {
        self.order.clear();
        self.keys.clear();
    }

    /// Whether agent `idx` is recorded with this use.
    #[cfg(test)]
    pub(super) fn holds(&self, idx: u32, used_percent: f64) -> bool {
        self.keys.get(idx as usize).copied().flatten() == Some(key_of(used_percent))
    }

    /// The agents, most used first or least used first.
    fn walk(&self, most_used_first: bool) -> Box<dyn Iterator<Item = u32> + '_> {
        if most_used_first {
            Box::new(self.order.iter().rev().map(|&(_, i)| i))
        } else {
            Box::new(self.order.iter().map(|&(_, i)| i))
        }
    }
}

/// A scored `spread` entry: its position, weight, counts per value, total, values.
type Entry<'a> = (usize, u32, &'a HashMap<String, u32>, u32, usize);

/// Candidates sharing their values of the job's soft attributes.
#[derive(Clone, Debug)]
struct Group {
    /// Per `spread` entry: the hosts' value.
    values: Vec<Option<String>>,
    /// Per `affinity` entry: whether the hosts' value matches.
    matches: Vec<bool>,
    hosts: Vec<u32>,
    /// Where the next scan of `hosts` starts.
    cursor: usize,
}

/// A job's candidate agents grouped by their soft attribute values, valid for one
/// agent index generation.
#[derive(Clone, Debug, Default)]
pub(super) struct SoftGroups {
    gen: u64,
    groups: Vec<Group>,
    /// Agent index -> its group (`u32::MAX`: not a candidate); only with `placement`.
    member: Vec<u32>,
    /// The group the last task went to: equal groups are tried from the next one.
    last: usize,
}

impl SoftGroups {
    /// Groups `candidates` by their values (`attr(agent, attribute)`) of `soft`'s
    /// attributes; `agents` is how many agents the index covers.
    pub(super) fn build<'a>(
        soft: &Soft,
        counted: &[(String, u32)],
        candidates: &[u32],
        agents: usize,
        gen: u64,
        attr: impl Fn(u32, &str) -> Option<&'a str>,
    ) -> SoftGroups {
        let mut by_key: HashMap<(Vec<Option<String>>, Vec<bool>), usize> = HashMap::new();
        let mut groups: Vec<Group> = Vec::new();
        let mut member = if soft.strategy.is_some() {
            vec![u32::MAX; agents]
        } else {
            Vec::new()
        };
        for &idx in candidates {
            let values: Vec<Option<String>> = soft
                .spread
                .iter()
                .map(|&(i, _)| {
                    counted
                        .get(i)
                        .and_then(|(a, _)| attr(idx, a))
                        .map(str::to_string)
                })
                .collect();
            let matches: Vec<bool> = soft
                .affinity
                .iter()
                .map(|(a, c, _)| c.allows_value(attr(idx, a)))
                .collect();
            let g = *by_key.entry((values, matches)).or_insert_with_key(|k| {
                groups.push(Group {
                    values: k.0.clone(),
                    matches: k.1.clone(),
                    hosts: Vec::new(),
                    cursor: 0,
                });
                groups.len() - 1
            });
            groups[g].hosts.push(idx);
            if let Some(m) = member.get_mut(idx as usize) {
                *m = g as u32;
            }
        }
        SoftGroups {
            gen,
            groups,
            member,
            last: usize::MAX,
        }
    }

    /// Whether the groups were built for agent index generation `gen`.
    pub(super) fn is_for(&self, gen: u64) -> bool {
        self.gen == gen
    }

    /// Each group's spread and affinity terms, in `Soft::score`'s order, `width`
    /// per group (flat).
    fn terms(
        &self,
        soft: &Soft,
        counted: &[(String, u32)],
        counts: &LimitCounts,
        values: &dyn Fn(&str) -> usize,
    ) -> (Vec<f64>, usize) {
        // Entries `Soft::score` scores (those with counts), their totals and values.
        let mut spread: Vec<Entry<'_>> = Vec::new();
        for (j, &(i, weight)) in soft.spread.iter().enumerate() {
            if let (Some((attr, _)), Some(per_value)) = (counted.get(i), counts.get(i)) {
                let total: u32 = per_value.values().sum();
                spread.push((j, weight, per_value, total, values(attr)));
            }
        }
        let width = spread.len() + soft.affinity.len();
        let mut out = Vec::with_capacity(width * self.groups.len());
        for g in &self.groups {
            for &(j, weight, per_value, total, n) in &spread {
                let held = g.values[j]
                    .as_ref()
                    .map(|v| per_value.get(v).copied().unwrap_or(0));
                out.push(spread_term(weight, held, total, n));
            }
            for (k, (_, _, weight)) in soft.affinity.iter().enumerate() {
                out.push(if g.matches[k] {
                    f64::from(*weight)
                } else {
                    0.0
                });
            }
        }
        (out, width)
    }

    /// A candidate with the highest score that `fits`, or None when none fits.
    /// `used` is an agent's use in percent (as `usage` orders it).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn choose(
        &mut self,
        soft: &Soft,
        counted: &[(String, u32)],
        counts: &LimitCounts,
        values: &dyn Fn(&str) -> usize,
        usage: &UsageIndex,
        used: &dyn Fn(u32) -> f64,
        fits: &mut dyn FnMut(u32) -> bool,
    ) -> Option<u32> {
        if self.groups.is_empty() {
            return None;
        }
        let (terms, width) = self.terms(soft, counted, counts, values);
        let sum = |start: f64, g: usize| -> f64 {
            terms[g * width..(g + 1) * width]
                .iter()
                .fold(start, |s, t| s + t)
        };
        let Some(strategy) = soft.strategy else {
            // Groups by score, highest first; equal ones in turn after the last used.
            let n = self.groups.len();
            let first = self.last.wrapping_add(1) % n;
            let scores: Vec<f64> = (0..n).map(|g| sum(0.0, g)).collect();
            let mut order: Vec<usize> = (0..n).map(|s| (first + s) % n).collect();
            order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
            for g in order {
                let group = &mut self.groups[g];
                let len = group.hosts.len();
                for step in 0..len {
                    let pos = (group.cursor + step) % len;
                    let idx = group.hosts[pos];
                    if fits(idx) {
                        group.cursor = pos + 1;
                        self.last = g;
                        return Some(idx);
                    }
                }
            }
            return None;
        };
        // The highest term of each entry over the groups: no host scores above its
        // strategy term plus these.
        let mut highest = vec![f64::NEG_INFINITY; width];
        for g in 0..self.groups.len() {
            for (h, t) in highest.iter_mut().zip(&terms[g * width..(g + 1) * width]) {
                *h = h.max(*t);
            }
        }
        let binpack = strategy == PlacementStrategy::Binpack;
        let mut best: Option<(f64, u32)> = None;
        for idx in usage.walk(binpack) {
            let u = used(idx);
            let own = if binpack { u } else { 100.0 - u };
            if let Some((b, _)) = best {
                if highest.iter().fold(0.0 + own, |s, t| s + t) <= b {
                    break;
                }
            }
            let Some(&g) = self.member.get(idx as usize).filter(|&&g| g != u32::MAX) else {
                continue;
            };
            if !fits(idx) {
                continue;
            }
            let s = sum(0.0 + own, g as usize);
            if best.is_none_or(|(b, _)| s > b) {
                best = Some((s, idx));
            }
        }
        best.map(|(_, idx)| idx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::scoring::Candidate;
    use drover_common::spec::Constraint;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    struct Host {
        used: f64,
        fits: bool,
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

    /// The attribute index of `hosts`: how many values each attribute has.
    fn value_counts(hosts: &[Host]) -> HashMap<String, usize> {
        let mut seen: HashMap<String, BTreeSet<String>> = HashMap::new();
        for h in hosts {
            for (a, v) in &h.attrs {
                seen.entry(a.to_string()).or_default().insert(v.clone());
            }
        }
        seen.into_iter().map(|(a, v)| (a, v.len())).collect()
    }

    /// Places `tasks` tasks with both the exhaustive scan and `choose`, the
    /// exhaustive scan's choice counted each time (so both see the same counts):
    /// their scores must be equal every time, and both find a host or neither.
    fn compare(hosts: &mut [Host], soft: &Soft, counted: &[(String, u32)], tasks: usize) {
        let mut counts: LimitCounts = vec![HashMap::new(); counted.len()];
        let n = value_counts(hosts);
        let values = |a: &str| n.get(a).copied().unwrap_or(0);
        let candidates: Vec<u32> = (0..hosts.len() as u32).filter(|i| i % 7 != 3).collect();
        let mut groups = SoftGroups::build(soft, counted, &candidates, hosts.len(), 1, |i, a| {
            hosts[i as usize].attr(a)
        });
        for _ in 0..tasks {
            let mut usage = UsageIndex::default();
            for (i, h) in hosts.iter().enumerate() {
                usage.set(i as u32, h.used);
            }
            let exhaustive = candidates
                .iter()
                .filter(|&&i| hosts[i as usize].fits)
                .map(|&i| (soft.score(&hosts[i as usize], counted, &counts, &values), i))
                .fold(None, |best: Option<(f64, u32)>, (s, i)| match best {
                    Some((b, _)) if b >= s => best,
                    _ => Some((s, i)),
                });
            let fast = groups.choose(
                soft,
                counted,
                &counts,
                &values,
                &usage,
                &|i| hosts[i as usize].used,
                &mut |i| hosts[i as usize].fits,
            );
            match (exhaustive, fast) {
                (None, None) => return,
                (Some((s, i)), Some(f)) => {
                    let fs = soft.score(&hosts[f as usize], counted, &counts, &values);
                    assert!(hosts[f as usize].fits && candidates.contains(&f));
                    assert_eq!(fs, s, "fast chose {f} ({fs}), exhaustive {i} ({s})");
                    // Place on the exhaustive choice: the host fills a little.
                    let h = &mut hosts[i as usize];
                    for ((a, _), per_value) in counted.iter().zip(counts.iter_mut()) {
                        if let Some(v) = h.attr(a) {
                            *per_value.entry(v.to_string()).or_default() += 1;
                        }
                    }
                    h.used = (h.used + 3.0).min(100.0);
                    if h.used >= 100.0 {
                        h.fits = false;
                    }
                }
                (e, f) => panic!("exhaustive {e:?}, fast {f:?}"),
            }
        }
    }

    fn host(i: usize, used: u8, fits: bool, racks: usize) -> Host {
        let mut attrs = vec![("zone", format!("z{}", i % 3))];
        if !i.is_multiple_of(11) {
            attrs.push(("rack", format!("r{}", i % racks.max(1))));
        }
        Host {
            used: f64::from(used),
            fits,
            attrs,
        }
    }

    fn soft_of(strategy: u8, spread: &[u32], affinity: u8) -> (Soft, Vec<(String, u32)>) {
        let counted = vec![("rack".to_string(), u32::MAX), ("zone".to_string(), 5)];
        let value = |v: &str, negated| Constraint::Value {
            values: vec![v.to_string()],
            negated,
        };
        let soft = Soft {
            strategy: match strategy % 3 {
                0 => None,
                1 => Some(PlacementStrategy::Binpack),
                _ => Some(PlacementStrategy::Spread),
            },
            spread: spread.iter().enumerate().map(|(i, &w)| (i, w)).collect(),
            affinity: match affinity % 4 {
                0 => vec![],
                1 => vec![("zone".to_string(), value("z1", false), 40)],
                2 => vec![("zone".to_string(), value("z2", true), -25)],
                _ => vec![
                    ("rack".to_string(), value("r1", false), 100),
                    ("zone".to_string(), value("z0", false), -100),
                ],
            },
            groups: None,
        };
        (soft, counted)
    }

    proptest! {
        #[test]
        fn choose_scores_as_high_as_scoring_every_host(
            used in proptest::collection::vec((0u8..=100, any::<bool>()), 1..80),
            racks in 1usize..9,
            strategy in 0u8..3,
            spread in proptest::collection::vec(1u32..=100, 0..=2),
            affinity in 0u8..4,
            tasks in 1usize..60,
        ) {
            let mut hosts: Vec<Host> = used
                .iter()
                .enumerate()
                .map(|(i, &(u, fits))| host(i, u, fits || u < 50, racks))
                .collect();
            let (soft, counted) = soft_of(strategy, &spread, affinity);
            compare(&mut hosts, &soft, &counted, tasks);
        }
    }

    #[test]
    fn spread_over_racks_stays_even_and_binpack_fills_one_host_first() {
        // 40 hosts in 4 racks, all empty and fitting.
        let mut hosts: Vec<Host> = (0..40)
            .map(|i| Host {
                used: 0.0,
                fits: true,
                attrs: vec![("rack", format!("r{}", i / 10))],
            })
            .collect();
        let counted = vec![("rack".to_string(), u32::MAX)];
        let spread = Soft {
            spread: vec![(0, 50)],
            ..Soft::default()
        };
        let cands: Vec<u32> = (0..40).collect();
        let mut groups = SoftGroups::build(&spread, &counted, &cands, 40, 1, |i, a| {
            hosts[i as usize].attr(a)
        });
        let mut counts: LimitCounts = vec![HashMap::new()];
        let values = |_: &str| 4;
        let usage = UsageIndex::default();
        let mut used_hosts = BTreeSet::new();
        for _ in 0..20 {
            let i = groups
                .choose(
                    &spread,
                    &counted,
                    &counts,
                    &values,
                    &usage,
                    &|_| 0.0,
                    &mut |_| true,
                )
                .unwrap();
            *counts[0].entry(format!("r{}", i / 10)).or_default() += 1;
            used_hosts.insert(i);
        }
        assert_eq!(counts[0].values().copied().collect::<Vec<_>>(), vec![5; 4]);
        // Within a rack the hosts rotate.
        assert_eq!(used_hosts.len(), 20);

        let binpack = Soft {
            strategy: Some(PlacementStrategy::Binpack),
            ..Soft::default()
        };
        let mut groups = SoftGroups::build(&binpack, &[], &cands, 40, 1, |i, a| {
            hosts[i as usize].attr(a)
        });
        let mut usage = UsageIndex::default();
        for (i, h) in hosts.iter().enumerate() {
            usage.set(i as u32, h.used);
        }
        let mut used_hosts = BTreeSet::new();
        for _ in 0..30 {
            let snapshot = hosts.clone();
            let i = groups
                .choose(
                    &binpack,
                    &[],
                    &vec![],
                    &values,
                    &usage,
                    &|i| snapshot[i as usize].used,
                    &mut |i| snapshot[i as usize].fits,
                )
                .unwrap();
            let h = &mut hosts[i as usize];
            h.used += 10.0;
            h.fits = h.used < 100.0;
            usage.set(i, h.used);
            used_hosts.insert(i);
        }
        // 10 tasks fill a host: 30 tasks on 3 hosts.
        assert_eq!(used_hosts.len(), 3);
    }

    #[test]
    fn the_usage_index_moves_an_agent_when_its_use_changes() {
        let mut u = UsageIndex::default();
        u.set(0, 10.0);
        u.set(1, 50.0);
        u.set(2, 30.0);
        assert_eq!(u.walk(true).collect::<Vec<_>>(), vec![1, 2, 0]);
        u.set(0, 90.0);
        assert_eq!(u.walk(true).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert_eq!(u.walk(false).collect::<Vec<_>>(), vec![2, 1, 0]);
        assert!(u.holds(0, 90.0) && !u.holds(0, 10.0) && !u.holds(7, 0.0));
        u.clear();
        assert_eq!(u.walk(true).count(), 0);
    }
}
