//! The invariants, checked after every step of a run and at the moments the world
//! tells ([`crate::world::Seen`]), and the ledger of what the master acknowledged
//! (in [`crate::memory`]) checked against every core loaded from the store.
//!
//! - no acknowledged write lost: a status the master acknowledged (`StatusAck`),
//!   a job it said it created, a kill, a maintenance request and an update it
//!   answered are in every core loaded from the store afterwards; a master that
//!   crashed with nothing uncommitted comes back with every task it held as stored;
//! - never two copies of an exclusive instance running (simulated processes);
//! - a task id runs at most once (tasks are one-shot);
//! - no host over-committed: neither the master's assignment sets nor the
//!   processes really running (kills in progress aside);
//! - no task placed on a cordoned or draining host;
//! - every DRAINED host empty;
//! - task states only move along the transition table, in what is committed;
//! - updates roll forward in their order and back in reverse order;
//! - a cron job never fires twice for the same time.

use std::collections::{BTreeMap, BTreeSet};

use drover_common::state::{DesiredState, TaskState};
use drover_common::wire::{InstanceUpdateState, MaintenanceMode};
use drover_master::core::{Change, Core};

use crate::memory::fingerprint;
use crate::world::{Seen, World};

fn reachable(from: TaskState, to: TaskState) -> bool {
    let mut seen = vec![from];
    let mut i = 0;
    while i < seen.len() {
        for s in seen[i].successors() {
            if !seen.contains(s) {
                seen.push(*s);
            }
        }
        i += 1;
    }
    seen.contains(&to)
}

/// An exclusive instance's running copies: (task, host, stop requested).
type Copies<'a> = BTreeMap<(&'a str, u32), Vec<(&'a str, &'a str, bool)>>;

/// The invariants at moment `seen` of a run ([`crate::world::Hooks::watch`]).
pub fn watch(w: &mut World, seen: Seen<'_>) -> Result<(), String> {
    match seen {
        Seen::Step => after_step(w),
        Seen::Batch(changes) => on_batch(w, changes),
        Seen::Commit(changes) => on_commit(w, changes),
        Seen::Load(core) => after_load(w, core),
        Seen::Start(agent, id) => on_start(w, agent, id),
    }
}

/// A core just loaded from the store holds everything acknowledged.
fn after_load(w: &World, core: &Core) -> Result<(), String> {
    let l = &w.ledger;
    for (task, seq) in &l.statuses {
        if let Some(t) = core.task(task) {
            // A task the master ended itself ignores later reports (they are
            // acknowledged all the same).
            if t.last_seq.unwrap_or(0) < *seq && !t.status.state.is_terminal() {
                return Err(format!(
                    "acknowledged write lost: status #{seq} of {task} was acknowledged, the loaded core has #{:?} ({})",
                    t.last_seq, t.status.state
                ));
            }
        } else if w
            .master
            .store
            .task(task)
            .is_some_and(|t| !t.status.state.is_terminal())
        {
            return Err(format!(
                "acknowledged write lost: task {task} is stored but not loaded"
            ));
        }
    }
    for key in &l.jobs {
        if core.job_view(key).is_none() {
            return Err(format!(
                "acknowledged write lost: job {key} was created, the loaded core lacks it"
            ));
        }
    }
    for task in &l.kills {
        if let Some(t) = core.task(task) {
            if t.desired != DesiredState::Shutdown && !t.status.state.is_terminal() {
                return Err(format!(
                    "acknowledged write lost: {task} was killed, the loaded core wants it {:?}",
                    t.desired
                ));
            }
        }
    }
    let hosts = core.host_views();
    for (host, out) in &l.maintenance {
        if let Some(h) = hosts.iter().find(|h| &h.agent_id == host) {
            if *out && h.mode == MaintenanceMode::None {
                return Err(format!(
                    "acknowledged write lost: {host} was taken out of service, the loaded core has it in service"
                ));
            }
        }
    }
    for job in &l.updates {
        if core.update_view(job).is_none() {
            return Err(format!("acknowledged write lost: the update of {job} was started, the loaded core has none"));
        }
    }
    if let Some(before) = &w.checker.before_crash {
        let after = fingerprint(core, &w.jobs);
        let after: BTreeMap<_, _> = after.into_iter().map(|t| (t.0.clone(), t)).collect();
        // Terminal tasks of instances an update removed are not loaded.
        for t in before.iter().filter(|t| !t.1.is_terminal()) {
            let Some(a) = after.get(&t.0) else {
                return Err(format!(
                    "committed task {} missing after the master restarted",
                    t.0
                ));
            };
            // Cron catch-up at load may stop a run (KILL_EXISTING): compare what
            // the store must have kept, not what load did next.
            if a.3 != t.3 || a.4 != t.4 || (a.1 != t.1 && !reachable(t.1, a.1)) {
                return Err(format!(
                    "committed task differs after the master restarted: before {t:?}, after {a:?}"
                ));
            }
        }
    }
    Ok(())
}

/// A batch the core emitted (before it is committed): new placements go to hosts
/// in service only.
fn on_batch(w: &mut World, changes: &[Change]) -> Result<(), String> {
    let Some(core) = w.master.core.as_ref() else {
        return Ok(());
    };
    let mut modes: Option<BTreeMap<String, MaintenanceMode>> = None;
    // The master stops a task of an exclusive instance on a host it cannot reach
    // and makes its replacement in the same event: a copy nobody can stop may run
    // beside it (only the partition policy's LOST, after lease and kill time, may
    // replace such a task).
    let mut reachable: Option<BTreeMap<String, bool>> = None;
    let mut unstoppable: BTreeMap<(String, u32), String> = BTreeMap::new();
    let mut fresh = Vec::new();
    for c in changes {
        let Change::PutTask(t) = c else {
            continue;
        };
        let prev = w.checker.last_state.insert(t.id.clone(), t.status.state);
        if prev.is_none() && t.gen > 0 {
            fresh.push(t);
        }
        let newly_stopping =
            t.status.state.is_stopping() && !prev.is_some_and(TaskState::is_stopping);
        if !newly_stopping {
            continue;
        }
        let Some(agent) = t.agent.as_ref() else {
            continue;
        };
        let reach = reachable.get_or_insert_with(|| {
            core.agent_views()
                .into_iter()
                .map(|a| (a.agent_id, a.reachable))
                .collect()
        });
        if reach.get(agent) == Some(&false) {
            unstoppable.insert(
                (t.job.clone(), t.instance),
                format!("{} ({}) on {agent}", t.id, t.status.state),
            );
        }
    }
    for t in fresh {
        let Some(old) = unstoppable.get(&(t.job.clone(), t.instance)) else {
            continue;
        };
        let exclusive = core
            .job_view(&t.job)
            .is_some_and(|v| v.spec.partition_policy.exclusive);
        if exclusive {
            return Err(format!(
                "replacement {} of exclusive {}/{} made while stopping {old}, which the master cannot reach",
                t.id, t.job, t.instance
            ));
        }
    }
    for c in changes {
        let Change::PutTask(t) = c else {
            continue;
        };
        let Some(agent) = t.agent.as_ref() else {
            continue;
        };
        if t.status.state != TaskState::Assigned {
            continue;
        }
        if w.checker.placed.get(&t.id) == Some(agent) {
            continue;
        }
        w.checker.placed.insert(t.id.clone(), agent.clone());
        let modes = modes.get_or_insert_with(|| {
            core.host_views()
                .into_iter()
                .map(|h| (h.agent_id, h.mode))
                .collect()
        });
        let mode = modes.get(agent).copied().unwrap_or_default();
        if mode != MaintenanceMode::None {
            return Err(format!(
                "task {} placed on {agent}, which is {mode:?}",
                t.id
            ));
        }
    }
    Ok(())
}

/// A commit: states move along the table, updates keep their order, cron
/// firings never repeat.
fn on_commit(w: &mut World, changes: &[Change]) -> Result<(), String> {
    let c = &mut w.checker;
    let t = w.t;
    let t_now = w.t;
    for change in changes {
        match change {
            Change::PutTask(t) => {
                let to = t.status.state;
                if to.is_terminal() && c.committed_state.get(&t.id) != Some(&to) {
                    let why = t
                        .status
                        .events
                        .last()
                        .map(|e| e.message.clone())
                        .unwrap_or_default();
                    w.trace
                        .line(t_now, format!("committed: {} {to} ({why})", t.id));
                }
                if let Some(from) = c.committed_state.insert(t.id.clone(), to) {
                    if from != to && !reachable(from, to) {
                        return Err(format!("task {} went {from} -> {to} in the store", t.id));
                    }
                }
            }
            Change::DeleteTask(id) => {
                w.ledger.forget_task(id);
                c.committed_state.remove(id);
            }
            Change::DeleteJob(key) => {
                w.ledger.forget_job(key);
                c.cron_fired.remove(key);
                c.updates.remove(key);
            }
            Change::PutCronFired(job, at) => {
                w.trace
                    .line(t, format!("committed: cron {job} fired for {at}"));
                // A wall clock step back may make a schedule pass earlier times
                // again; the same time must never fire twice.
                if !c.cron_fired.entry(job.clone()).or_default().insert(*at) {
                    return Err(format!("cron job {job} fired twice for {at}"));
                }
            }
            Change::PutUpdate(u) => {
                let v = &u.view;
                let pos_of = |i: u32| v.instances.iter().position(|p| p.instance == i);
                // Forward: only the first `next` instances have left PENDING.
                for (pos, p) in v.instances.iter().enumerate() {
                    if pos >= u.next && p.state != InstanceUpdateState::Pending {
                        return Err(format!(
                            "update {} of {}: instance {} is {:?} but only {} were started, in order",
                            v.id, v.job, p.instance, p.state, u.next
                        ));
                    }
                }
                // Rollback: in reverse order of the forward roll.
                let mut last: Option<usize> = None;
                for i in &u.back {
                    let Some(pos) = pos_of(*i) else {
                        continue;
                    };
                    if last.is_some_and(|l| pos >= l) {
                        return Err(format!(
                            "update {} of {}: rollback order {:?} is not the reverse of the forward order",
                            v.id, v.job, u.back
                        ));
                    }
                    last = Some(pos);
                }
                for p in &v.instances {
                    let rolling = matches!(
                        p.state,
                        InstanceUpdateState::RollingBack | InstanceUpdateState::RolledBack
                    );
                    if rolling && !u.back[..u.back_next.min(u.back.len())].contains(&p.instance) {
                        return Err(format!(
                            "update {} of {}: instance {} is {:?} before its turn ({:?}, {} started)",
                            v.id, v.job, p.instance, p.state, u.back, u.back_next
                        ));
                    }
                }
                let terminal = v.state.is_terminal();
                if let Some((id, was_terminal, next, back_next)) = c.updates.get(&v.job) {
                    if *id == v.id {
                        if *was_terminal && !terminal {
                            return Err(format!(
                                "update {} of {} ended, then went on ({:?})",
                                v.id, v.job, v.state
                            ));
                        }
                        if u.next < *next || u.back_next < *back_next {
                            return Err(format!(
                                "update {} of {} went back in its order",
                                v.id, v.job
                            ));
                        }
                    }
                }
                c.updates
                    .insert(v.job.clone(), (v.id.clone(), terminal, u.next, u.back_next));
            }
            _ => {}
        }
    }
    Ok(())
}

/// An executor starts task `id` on agent `i`: never the same task twice.
/// A host whose disk was wiped may run a task again that the master never heard
/// of; once the master stored a report on it, never.
fn on_start(w: &mut World, i: usize, id: &str) -> Result<(), String> {
    let reported = w
        .master
        .store
        .task(id)
        .is_some_and(|t| t.last_seq.is_some());
    if !w.checker.started.insert(id.to_string()) && reported {
        return Err(format!(
            "task {id} started a second time (on {}) after the master stored a report on it: tasks are one-shot",
            w.agents[i].id
        ));
    }
    Ok(())
}

/// The invariants that hold after every step.
fn after_step(w: &mut World) -> Result<(), String> {
    let overlap = invariants(w)?;
    if let Some(core) = w.master.core.as_ref() {
        let mut stopping = BTreeSet::new();
        for a in &w.agents {
            for (id, e) in &a.execs {
                if e.alive
                    && e.exclusive
                    && core.task(id).is_some_and(|t| {
                        t.desired == DesiredState::Shutdown && t.status.state.is_stopping()
                    })
                {
                    stopping.insert(id.clone());
                }
            }
        }
        w.checker.stopping = stopping;
    }
    if let Some(o) = overlap {
        w.stats.exclusive_overlap_steps += 1;
        if w.stats.exclusive_overlap_first.is_none() {
            w.stats.exclusive_overlap_first = Some(format!("at {} ms: {o}", w.stats.sim_ms));
        }
    }
    Ok(())
}

/// Checks the invariants; answers an overlap of exclusive copies during a
/// requested stop (counted, not a failure).
fn invariants(w: &World) -> Result<Option<String>, String> {
    // Never two copies of an exclusive instance, and no host's processes beyond
    // its resources.
    let mut exclusive: Copies = BTreeMap::new();
    for a in &w.agents {
        let (mut cpu, mut ram) = (0, 0);
        for (id, e) in &a.execs {
            if !e.alive {
                continue;
            }
            if e.exclusive {
                // Stopping on the master's request: the replacement does not wait
                // for the kill (a finding, counted; see docs/testing.md).
                let requested = e.stop_requested
                    || match w.master.core.as_ref() {
                        Some(c) => c.task(id).is_some_and(|t| {
                            t.desired == DesiredState::Shutdown && t.status.state.is_stopping()
                        }),
                        // The master is down: as it was when it last ran.
                        None => w.checker.stopping.contains(id),
                    };
                exclusive
                    .entry((e.job.as_str(), e.instance))
                    .or_default()
                    .push((id.as_str(), a.id.as_str(), requested));
            }
            if !e.killing {
                cpu += e.cpu_milli;
                ram += e.ram;
            }
        }
        if cpu > a.cpu_milli || ram > a.ram {
            return Err(format!(
                "host {} over-committed: running tasks use {cpu} mcpu / {ram} B of {} / {}",
                a.id, a.cpu_milli, a.ram
            ));
        }
    }
    let mut overlap = None;
    for ((job, instance), copies) in &exclusive {
        let unrequested = copies.iter().filter(|c| !c.2).count();
        if unrequested > 1 {
            return Err(format!(
                "two copies of exclusive instance {job}/{instance} run (task, host, stop requested): {copies:?}"
            ));
        }
        if copies.len() > 1 {
            overlap = Some(format!("{job}/{instance}: {copies:?}"));
        }
    }
    let Some(core) = w.master.core.as_ref() else {
        return Ok(overlap);
    };
    // The master's own accounting: what it assigned to each host fits it.
    for a in &w.agents {
        let Some(set) = core.assignment_set(&a.id) else {
            continue;
        };
        let (mut cpu, mut ram) = (0u64, 0u64);
        for x in &set.assignments {
            let r = &x.task.task.resources;
            cpu += (r.cpu * 1000.0).round() as u64;
            ram += r.ram.bytes();
        }
        if cpu > a.cpu_milli || ram > a.ram {
            return Err(format!(
                "master over-committed {}: assigned {cpu} mcpu / {ram} B of {} / {}",
                a.id, a.cpu_milli, a.ram
            ));
        }
    }
    // Service discovery: every announced instance is RUNNING, and no announced
    // task's agent is told to kill it (the kill waits for the withdrawal).
    for v in core.service_views() {
        for e in &v.endpoints {
            let Some(t) = core.task(&e.task_id) else {
                return Err(format!(
                    "{}/{}: announced task {} is unknown",
                    v.job, e.instance, e.task_id
                ));
            };
            if t.status.state != drover_common::state::TaskState::Running {
                return Err(format!(
                    "announced instance {}/{} ({}) is {}, not RUNNING",
                    v.job, e.instance, e.task_id, t.status.state
                ));
            }
            let agent = t.agent.as_deref().unwrap_or_default();
            let killed = core.assignment_set(agent).is_some_and(|s| {
                s.assignments
                    .iter()
                    .any(|x| x.task.task_id == e.task_id && x.desired == DesiredState::Shutdown)
            });
            if killed {
                return Err(format!(
                    "announced instance {}/{} ({}) is sent a kill",
                    v.job, e.instance, e.task_id
                ));
            }
        }
    }
    // Every DRAINED host is empty.
    for h in core.host_views() {
        if h.mode == MaintenanceMode::Drained && h.tasks_left > 0 {
            return Err(format!(
                "host {} is DRAINED with {} tasks left",
                h.agent_id, h.tasks_left
            ));
        }
    }
    Ok(overlap)
}
