//! Feasibility, pure: which agents a job may use at all (value constraints,
//! dedicated hosts), why one agent cannot take the job's next task (resources,
//! ports, limits, attributes, maintenance, the one-per-host of services), and the
//! pending reason that sums up why none can.

use std::collections::HashMap;
use std::sync::Arc;

use drover_common::spec::Constraint;
use drover_common::wire::MaintenanceMode;

use super::limits::LimitCounts;
use super::model::{Agent, Job, Need};

/// The agents a job may use at all (value constraints and dedicated hosts).
pub(super) fn candidates_for(
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
pub(super) fn misfit(
    agent: &Agent,
    need: &Need,
    job: &Job,
    counts: &LimitCounts,
) -> Option<Misfit> {
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
pub(super) enum Misfit {
    Unreachable,
    Maintenance,
    Cpu,
    Ram,
    Disk,
    Ports,
    Limit(usize),
    NoAttribute(usize),
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
pub(super) fn explain(
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
