//! Host maintenance (Aurora's host_deactivate / host_drain / host_status /
//! host_activate): each host's mode NONE -> SCHEDULED (cordoned) -> DRAINING ->
//! DRAINED and back to NONE, stored with the agent's record so it survives a
//! restart; and the drain round, run after every event while a host drains, that
//! moves tasks off draining hosts (RUNNING -> DRAINING -> KILLED through the normal
//! kill escalation, a replacement created at once and placed only on hosts in NONE)
//! as fast as their jobs' SLA budgets (`disruption`) allow, forcing what is left
//! once a drain's deadline passes. A host is DRAINED only once no non-terminal task
//! is left on it: every ending was heard from its agent (or decided by the
//! partition policy for a host that was lost). Also quarantine: a host where tasks
//! of several jobs keep ending for host-side causes is cordoned automatically.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use drover_common::state::{EventSource, ExitReason, MonoMillis, TaskState, UnixMillis};
use drover_common::wire::{HostEvent, HostView, MaintenanceMode};
use serde::{Deserialize, Serialize};

use super::disruption::Budget;
use super::model::Agent;
use super::timers::Timer;
use super::{Core, CoreError, Now, Reply};

/// Host events kept per host.
const HOST_EVENTS_KEPT: usize = 20;

/// Host-side failures kept per host at most (the window's, newest first), whatever
/// `quarantine_failures` is.
const HOST_FAILURES_KEPT: usize = 100;

/// A host's stored maintenance state, part of its agent record.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostMaintenance {
    pub mode: MaintenanceMode,
    /// Why: `maintenance` (an operator's request) or `quarantined`; absent in NONE.
    #[serde(default)]
    pub reason: Option<String>,
    /// When the current mode began (wall clock, for people).
    #[serde(default)]
    pub since_ms: UnixMillis,
    /// While DRAINING: when what is left is forced (wall clock, for people and for
    /// the time left at load; the core forces on the monotonic clock).
    #[serde(default)]
    pub deadline_ms: Option<UnixMillis>,
    /// While SCHEDULED by `drain --start-at`: when the drain starts (wall clock,
    /// stored; the core starts it on the monotonic clock, re-derived at load).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_at_ms: Option<UnixMillis>,
    /// With `drain_at_ms`: the drain's deadline, counted from its start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_deadline_ms: Option<u64>,
    /// The latest maintenance events, oldest first.
    #[serde(default)]
    pub events: VecDeque<HostEvent>,
    /// Tasks that ended here for host-side causes within the quarantine window,
    /// oldest first: stored, so a master restart keeps counting them.
    #[serde(default, skip_serializing_if = "VecDeque::is_empty")]
    pub failures: VecDeque<HostFailure>,
}

/// A task that ended on a host for a host-side cause (counts towards quarantine).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostFailure {
    /// When, on the wall clock (stored; the window left is re-derived at load).
    pub at_ms: UnixMillis,
    /// When, on the monotonic clock (the window runs on it).
    #[serde(skip)]
    pub at_mono: MonoMillis,
    pub job: String,
    pub reason: String,
}

/// What an operator asks of hosts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaintenanceOp {
    /// NONE -> SCHEDULED: no new placements, running tasks stay.
    Cordon,
    /// -> DRAINING; `deadline_ms` after the request, what is left is forced.
    Drain { deadline_ms: Option<u64> },
    /// -> SCHEDULED now, DRAINING at wall clock time `at_ms` (Aurora's maintenance
    /// schedule: cordoned at once, drained when the window opens); `deadline_ms`
    /// counts from the drain's start. A time not in the future drains at once.
    DrainAt {
        at_ms: UnixMillis,
        deadline_ms: Option<u64>,
    },
    /// -> NONE.
    Activate,
}

impl MaintenanceOp {
    fn name(self) -> &'static str {
        match self {
            MaintenanceOp::Cordon => "cordon",
            MaintenanceOp::Drain { .. } => "drain",
            MaintenanceOp::DrainAt { .. } => "drain --start-at",
            MaintenanceOp::Activate => "activate",
        }
    }
}

/// The drain bookkeeping kept in memory (rebuilt from the records at start). Every
/// instant here is monotonic.
#[derive(Clone, Debug, Default)]
pub(super) struct Drains {
    /// Agents in DRAINING.
    draining: BTreeSet<u32>,
    /// Per draining agent with a deadline: when what is left is forced.
    deadlines: HashMap<u32, MonoMillis>,
    /// Per SCHEDULED agent with a drain start time: when its drain starts.
    starts: BTreeMap<u32, MonoMillis>,
    /// Per draining agent, why tasks wait, one line per job.
    blocked: HashMap<u32, Vec<String>>,
    /// The earliest drain timer armed and not yet fired.
    armed_at: Option<MonoMillis>,
    /// When the last round ran; None: the next event runs one.
    last_round: Option<MonoMillis>,
    /// The draining agent the next round starts with: a round that reached
    /// `drain_round_max_tasks` stopped there, so every host gets its turn.
    cursor: u32,
}

impl Drains {
    /// The drains of agents loaded from the store at `now`. A deadline keeps what
    /// was left of it by the wall clock, at most the whole time from the drain's
    /// start to its deadline (a wall clock step while the master was down cannot
    /// push it further out than the operator asked for); one that passed while the
    /// master was down forces what is left at once.
    pub(super) fn rebuild(agents: &[Agent], now: Now) -> Drains {
        let mut drains = Drains::default();
        for (i, a) in agents.iter().enumerate() {
            let m = &a.rec.maintenance;
            if let (MaintenanceMode::Scheduled, Some(at)) = (m.mode, m.drain_at_ms) {
                // Like a deadline: what was left of the wait by the wall clock, at
                // most the whole wait the operator asked for.
                let whole = at.saturating_sub(m.since_ms);
                drains.starts.insert(i as u32, now.mono_of(at, whole));
            }
            if m.mode != MaintenanceMode::Draining {
                continue;
            }
            drains.draining.insert(i as u32);
            if let Some(deadline) = m.deadline_ms {
                let whole = deadline.saturating_sub(m.since_ms);
                drains
                    .deadlines
                    .insert(i as u32, now.mono_of(deadline, whole));
            }
        }
        drains
    }

    /// The monotonic deadlines and drain starts armed at load, for their timers.
    pub(super) fn deadlines(&self) -> Vec<MonoMillis> {
        self.deadlines
            .values()
            .chain(self.starts.values())
            .copied()
            .collect()
    }

    /// A drain timer fired.
    pub(super) fn fired(&mut self) {
        self.armed_at = None;
    }

    /// Arms the drain timer for `at` unless one at or before it is armed.
    fn arm(&mut self, at: MonoMillis) -> bool {
        if self.armed_at.is_none_or(|armed| at < armed) {
            self.armed_at = Some(at);
            return true;
        }
        false
    }

    /// Sets (or, with None, keeps) a draining agent's monotonic deadline.
    fn set_deadline(&mut self, idx: u32, deadline: Option<MonoMillis>) {
        if let Some(d) = deadline {
            self.deadlines.insert(idx, d);
        }
    }
}

impl HostMaintenance {
    /// Loaded from the store at `now`: the failures keep what was left of the
    /// quarantine window by the wall clock, at most the whole window (those past
    /// it are dropped).
    pub(super) fn loaded(&mut self, now: Now, window: u64) {
        self.failures
            .retain(|f| now.wall.saturating_sub(f.at_ms) <= window);
        for f in &mut self.failures {
            f.at_mono = now.mono_of(f.at_ms, window).min(now.mono);
        }
    }

    fn set(&mut self, mode: MaintenanceMode, now: Now, message: String) {
        self.mode = mode;
        self.since_ms = now.wall;
        if mode == MaintenanceMode::None {
            self.reason = None;
        }
        if mode != MaintenanceMode::Draining {
            self.deadline_ms = None;
        }
        if mode != MaintenanceMode::Scheduled {
            self.drain_at_ms = None;
            self.drain_deadline_ms = None;
        }
        self.event(now, message);
    }

    fn event(&mut self, now: Now, message: String) {
        self.events.push_back(HostEvent {
            timestamp_ms: now.wall,
            message,
        });
        while self.events.len() > HOST_EVENTS_KEPT {
            self.events.pop_front();
        }
    }
}

impl Core {
    /// Resolves host names (agent ids first, then host names) to agents. Every name
    /// must name exactly one agent.
    pub(super) fn resolve_hosts(&self, names: &[String]) -> Result<Vec<u32>, CoreError> {
        if names.is_empty() {
            return Err(CoreError::NoHosts);
        }
        let mut unknown = Vec::new();
        let mut out = Vec::new();
        for name in names {
            if let Some(&idx) = self.agent_idx.get(name) {
                out.push(idx);
                continue;
            }
            let by_host: Vec<u32> = (0..self.agents.len() as u32)
                .filter(|&i| self.agents[i as usize].rec.hostname == *name)
                .collect();
            match by_host.as_slice() {
                [] => unknown.push(name.clone()),
                [one] => out.push(*one),
                many => {
                    return Err(CoreError::AmbiguousHost {
                        name: name.clone(),
                        agents: many
                            .iter()
                            .map(|&i| self.agents[i as usize].rec.id.clone())
                            .collect(),
                    })
                }
            }
        }
        if !unknown.is_empty() {
            return Err(CoreError::UnknownHosts(unknown));
        }
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }

    /// Cordon, drain or activate hosts: every host is checked before any changes,
    /// so a request is applied whole or not at all.
    pub(super) fn maintenance(
        &mut self,
        op: MaintenanceOp,
        hosts: &[String],
        now: Now,
    ) -> Result<Reply, CoreError> {
        let idxs = self.resolve_hosts(hosts)?;
        // The request is answered after a round with it.
        self.drains.last_round = None;
        for &idx in &idxs {
            let rec = &self.agents[idx as usize].rec;
            let mode = rec.maintenance.mode;
            let conflict = match op {
                MaintenanceOp::Cordon => {
                    matches!(mode, MaintenanceMode::Draining | MaintenanceMode::Drained)
                }
                // A drain start time for a host draining already would be ignored.
                MaintenanceOp::DrainAt { at_ms, .. } => {
                    at_ms > now.wall
                        && matches!(mode, MaintenanceMode::Draining | MaintenanceMode::Drained)
                }
                MaintenanceOp::Drain { .. } | MaintenanceOp::Activate => false,
            };
            if conflict {
                return Err(CoreError::HostConflict {
                    host: rec.hostname.clone(),
                    mode,
                    op: op.name(),
                });
            }
        }
        for &idx in &idxs {
            let a = &mut self.agents[idx as usize];
            let m = &mut a.rec.maintenance;
            let changed = match (op, m.mode) {
                (MaintenanceOp::Cordon, MaintenanceMode::None) => {
                    m.reason = Some("maintenance".to_string());
                    m.set(MaintenanceMode::Scheduled, now, "cordoned".to_string());
                    true
                }
                (MaintenanceOp::Drain { deadline_ms }, mode) => {
                    let deadline = deadline_ms.map(|d| now.mono.saturating_add(d));
                    let message = match deadline_ms {
                        Some(d) => format!("drain requested, deadline in {d} ms"),
                        None => "drain requested, no deadline".to_string(),
                    };
                    match mode {
                        MaintenanceMode::None | MaintenanceMode::Scheduled => {
                            if m.reason.is_none() {
                                m.reason = Some("maintenance".to_string());
                            }
                            self.drains.starts.remove(&idx);
                            m.set(MaintenanceMode::Draining, now, message);
                            m.deadline_ms = deadline.map(|d| now.wall_of(d));
                            self.drains.draining.insert(idx);
                            self.drains.set_deadline(idx, deadline);
                            true
                        }
                        // A new deadline replaces the old one; nothing else changes.
                        MaintenanceMode::Draining if deadline.is_some() => {
                            m.deadline_ms = deadline.map(|d| now.wall_of(d));
                            m.event(now, message);
                            self.drains.set_deadline(idx, deadline);
                            true
                        }
                        _ => false,
                    }
                }
                (MaintenanceOp::DrainAt { at_ms, deadline_ms }, mode) => {
                    let at = now.mono.saturating_add(at_ms.saturating_sub(now.wall));
                    let message = format!(
                        "drain scheduled to start in {} ms{}",
                        at_ms.saturating_sub(now.wall),
                        deadline_ms
                            .map(|d| format!(", deadline {d} ms after its start"))
                            .unwrap_or_default()
                    );
                    match mode {
                        MaintenanceMode::None | MaintenanceMode::Scheduled => {
                            if m.reason.is_none() {
                                m.reason = Some("maintenance".to_string());
                            }
                            m.set(MaintenanceMode::Scheduled, now, message);
                            m.drain_at_ms = Some(at_ms);
                            m.drain_deadline_ms = deadline_ms;
                            self.drains.starts.insert(idx, at);
                            self.push_timer(at, Timer::Drain);
                            true
                        }
                        _ => false,
                    }
                }
                (MaintenanceOp::Activate, MaintenanceMode::None) => false,
                (MaintenanceOp::Activate, _) => {
                    m.set(MaintenanceMode::None, now, "activated".to_string());
                    self.drains.starts.remove(&idx);
                    self.drains.draining.remove(&idx);
                    self.drains.deadlines.remove(&idx);
                    self.drains.blocked.remove(&idx);
                    m.failures.clear();
                    self.capacity_changed = true;
                    true
                }
                (MaintenanceOp::Cordon, _) => false,
            };
            if changed {
                self.dirty_agents.insert(idx);
            }
            if let Some(&at) = self.drains.deadlines.get(&idx) {
                self.push_timer(at, Timer::Drain);
            }
        }
        Ok(Reply::Hosts(
            idxs.iter().map(|&i| self.host_view_of(i)).collect(),
        ))
    }

    /// One drain round: on every draining host, each task its job's budget lets go
    /// (or every task, past the deadline) moves to DRAINING and gets a replacement;
    /// hosts with nothing left become DRAINED. Runs after every event while any
    /// host drains.
    pub(super) fn drain_round(&mut self, now: Now) {
        self.start_scheduled_drains(now);
        if self.drains.draining.is_empty() {
            return;
        }
        if let Some(last) = self.drains.last_round {
            let next = last.saturating_add(self.cfg.drain_round_interval_ms);
            if now.mono < next {
                if self.drains.arm(next) {
                    self.push_timer(next, Timer::Drain);
                }
                return;
            }
        }
        self.drains.last_round = Some(now.mono);
        self.sync_slots();
        let mut budgets: HashMap<String, Budget> = HashMap::new();
        let mut wake: Option<MonoMillis> = None;
        // At most this many tasks move per round; the rest move in the next rounds,
        // one interval apart, starting where this one stopped.
        let max_moves = self.cfg.drain_round_max_tasks.max(1);
        let mut moves = 0u32;
        let mut cut = false;
        let cursor = self.drains.cursor;
        let hosts: Vec<u32> = (self.drains.draining.range(cursor..))
            .chain(self.drains.draining.range(..cursor))
            .copied()
            .collect();
        for idx in hosts {
            let a = &self.agents[idx as usize];
            let forced = self
                .drains
                .deadlines
                .get(&idx)
                .is_some_and(|&d| now.mono >= d);
            let host = a.rec.hostname.clone();
            let mut blocked: BTreeMap<String, String> = BTreeMap::new();
            // A lost host's tasks follow their jobs' partition policy, not the drain
            // (not even past its deadline): a replacement made here would run beside
            // a copy the drain cannot stop (`reschedule: false`, `delay`,
            // `exclusive`). Their endings empty the host; a task the policy keeps
            // holds the drain until the agent is back.
            let ids: Vec<String> = if a.reachable {
                a.tasks.iter().cloned().collect()
            } else {
                if !a.tasks.is_empty() {
                    blocked.insert(
                        String::new(),
                        "host unreachable: its tasks follow their jobs' partition_policy \
                         until it is back"
                            .to_string(),
                    );
                }
                Vec::new()
            };
            for id in ids {
                if moves >= max_moves {
                    cut = true;
                    break;
                }
                let Some(t) = self.tasks.get(&id) else {
                    continue;
                };
                let state = t.status.state;
                if state.is_stopping() || state.is_terminal() {
                    continue;
                }
                let job_key = t.job.clone();
                let Some(job) = self.jobs.get(&job_key) else {
                    continue;
                };
                let current = job
                    .slots
                    .get(t.instance as usize)
                    .and_then(|s| s.current.as_deref())
                    == Some(id.as_str());
                // Only a current RUNNING task costs its job capacity; a task still
                // starting is disrupted already and goes at once.
                if current && state == TaskState::Running {
                    if blocked.contains_key(&job_key) && !forced {
                        continue;
                    }
                    let budget = budgets
                        .entry(job_key.clone())
                        .or_insert_with(|| Budget::of_slots(job, now.mono));
                    let healthy = budget.is_healthy(t, now.mono);
                    if !forced {
                        if let Err(why) = budget.check(healthy) {
                            if let Some(at) = budget.next_healthy_at {
                                wake = Some(wake.map_or(at, |w| w.min(at)));
                            }
                            blocked.insert(job_key, why);
                            continue;
                        }
                    }
                    budget.take(healthy);
                }
                let message = if forced {
                    format!("drain deadline of host {host} passed: forced off")
                } else {
                    format!("host {host} draining")
                };
                if self.stop_task(&id, TaskState::Draining, EventSource::Master, &message, now) {
                    moves += 1;
                    if let Some(t) = self.tasks.get_mut(&id) {
                        t.kill_reason = Some(ExitReason::Drained);
                    }
                    if current {
                        self.create_replacement(&id, now, None, &format!("host {host} draining"));
                    }
                }
            }
            if cut {
                // This host's turn goes on in the next round; what blocks it is
                // known only once all of its tasks were looked at.
                self.drains.cursor = idx;
                break;
            }
            self.note_blocked(idx, blocked.into_values().collect(), now);
            let a = &mut self.agents[idx as usize];
            if a.tasks.is_empty() {
                a.rec.maintenance.set(
                    MaintenanceMode::Drained,
                    now,
                    "drained: no task left, every ending heard".to_string(),
                );
                self.drains.draining.remove(&idx);
                self.drains.deadlines.remove(&idx);
                self.drains.blocked.remove(&idx);
                self.dirty_agents.insert(idx);
            }
        }
        if cut {
            let next = now
                .mono
                .saturating_add(self.cfg.drain_round_interval_ms.max(1));
            wake = Some(wake.map_or(next, |w| w.min(next)));
        }
        if let Some(at) = wake {
            if self.drains.arm(at) {
                self.push_timer(at, Timer::Drain);
            }
        }
    }

    /// SCHEDULED hosts whose drain start time came: DRAINING from now, with the
    /// deadline they were given counted from now.
    fn start_scheduled_drains(&mut self, now: Now) {
        let due: Vec<u32> = self
            .drains
            .starts
            .iter()
            .filter(|(_, &at)| at <= now.mono)
            .map(|(&idx, _)| idx)
            .collect();
        for idx in due {
            self.drains.starts.remove(&idx);
            let m = &mut self.agents[idx as usize].rec.maintenance;
            if m.mode != MaintenanceMode::Scheduled {
                continue;
            }
            let deadline = m.drain_deadline_ms.map(|d| now.mono.saturating_add(d));
            let message = match m.drain_deadline_ms {
                Some(d) => format!("scheduled drain started, deadline in {d} ms"),
                None => "scheduled drain started, no deadline".to_string(),
            };
            m.set(MaintenanceMode::Draining, now, message);
            m.deadline_ms = deadline.map(|d| now.wall_of(d));
            self.drains.draining.insert(idx);
            self.drains.set_deadline(idx, deadline);
            if let Some(at) = deadline {
                self.push_timer(at, Timer::Drain);
            }
            // The round runs in this event.
            self.drains.last_round = None;
            self.dirty_agents.insert(idx);
        }
    }

    /// Keeps why a host's drain waits, and records a change as a host event.
    fn note_blocked(&mut self, idx: u32, blocked: Vec<String>, now: Now) {
        let old = self.drains.blocked.get(&idx);
        if old.map_or(blocked.is_empty(), |o| *o == blocked) {
            return;
        }
        let m = &mut self.agents[idx as usize].rec.maintenance;
        if blocked.is_empty() {
            m.event(now, "no longer blocked".to_string());
        } else {
            m.event(now, format!("blocked: {}", blocked.join("; ")));
        }
        self.dirty_agents.insert(idx);
        self.drains.blocked.insert(idx, blocked);
    }

    /// Counts a task that ended for a host-side cause (sandbox setup failed, executor
    /// lost) against its host, and quarantines the host (NONE -> SCHEDULED, reason
    /// `quarantined`) once `quarantine_failures` of them from `quarantine_jobs`
    /// different jobs fall within `quarantine_window_ms`.
    pub(super) fn note_task_end(&mut self, id: &str, now: Now) {
        let limit = self.cfg.quarantine_failures;
        if limit == 0 {
            return;
        }
        let Some(t) = self.tasks.get(id) else {
            return;
        };
        let reason = match &t.status.exit_reason {
            Some(r @ (ExitReason::SandboxSetupFailed { .. } | ExitReason::ExecutorLost)) => {
                r.to_string()
            }
            _ => return,
        };
        let Some(&idx) = t.agent.as_ref().and_then(|a| self.agent_idx.get(a)) else {
            return;
        };
        let job = t.job.clone();
        let window = self.cfg.quarantine_window_ms;
        self.dirty_agents.insert(idx);
        let m = &mut self.agents[idx as usize].rec.maintenance;
        let list = &mut m.failures;
        list.push_back(HostFailure {
            at_ms: now.wall,
            at_mono: now.mono,
            job,
            reason,
        });
        while list.len() > HOST_FAILURES_KEPT
            || list
                .front()
                .is_some_and(|f| now.mono.saturating_sub(f.at_mono) > window)
        {
            list.pop_front();
        }
        let jobs: BTreeSet<&str> = list.iter().map(|f| f.job.as_str()).collect();
        if (list.len() as u32) < limit || (jobs.len() as u32) < self.cfg.quarantine_jobs {
            return;
        }
        let reasons: BTreeSet<&str> = list.iter().map(|f| f.reason.as_str()).collect();
        let message = format!(
            "quarantined: {} tasks of {} jobs ({}) ended for host-side causes within {} ms: {}",
            list.len(),
            jobs.len(),
            jobs.into_iter().collect::<Vec<_>>().join(", "),
            window,
            reasons.into_iter().collect::<Vec<_>>().join("; ")
        );
        m.failures.clear();
        if m.mode != MaintenanceMode::None {
            return;
        }
        m.reason = Some("quarantined".to_string());
        m.set(MaintenanceMode::Scheduled, now, message);
        self.dirty_agents.insert(idx);
    }

    /// A maintenance request's answer shows its hosts as the event left them (after
    /// the drain round and the placements it ran).
    pub(super) fn hosts_after_round(
        &self,
        reply: Result<Reply, CoreError>,
    ) -> Result<Reply, CoreError> {
        match reply {
            Ok(Reply::Hosts(views)) => Ok(Reply::Hosts(
                views
                    .iter()
                    .filter_map(|v| self.agent_idx.get(&v.agent_id))
                    .map(|&i| self.host_view_of(i))
                    .collect(),
            )),
            other => other,
        }
    }

    /// GET /v1/hosts: every host, sorted by host name then agent id.
    pub fn host_views(&self) -> Vec<HostView> {
        let mut out: Vec<HostView> = (0..self.agents.len() as u32)
            .map(|i| self.host_view_of(i))
            .collect();
        out.sort_by(|a, b| (&a.hostname, &a.agent_id).cmp(&(&b.hostname, &b.agent_id)));
        out
    }

    /// GET /v1/hosts/{host}: the hosts named (agent id or host name).
    pub fn host_views_named(&self, names: &[String]) -> Result<Vec<HostView>, CoreError> {
        Ok(self
            .resolve_hosts(names)?
            .into_iter()
            .map(|i| self.host_view_of(i))
            .collect())
    }

    fn host_view_of(&self, idx: u32) -> HostView {
        let a = &self.agents[idx as usize];
        let m = &a.rec.maintenance;
        HostView {
            agent_id: a.rec.id.clone(),
            hostname: a.rec.hostname.clone(),
            reachable: a.reachable,
            mode: m.mode,
            reason: m.reason.clone(),
            since_ms: m.since_ms,
            deadline_ms: m.deadline_ms,
            drain_at_ms: m.drain_at_ms,
            tasks_left: a.tasks.len() as u32,
            blocked: self.drains.blocked.get(&idx).cloned().unwrap_or_default(),
            stuck: self
                .drains
                .blocked
                .get(&idx)
                .and_then(|blocked| self.drain_stuck(idx, blocked)),
            events: m.events.iter().cloned().collect(),
        }
    }
}
