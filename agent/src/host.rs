//! The agent's pure core: the tasks this host holds and every decision about them
//! that does not need I/O. It converges on an assignment set (which ids to start,
//! which to refuse, which to kill, which to report KILLED without running them),
//! advances the tasks' states as statuses are recorded, picks the exclusive tasks
//! the lease kills, the sandboxes the garbage collector may remove, what a gone
//! executor leaves behind (its checkpoint or LOST) and the next sequence number of a
//! status the agent writes itself. Times come in as arguments (monotonic ms); no
//! clock, file, socket or log is touched here. The runtime (`runtime/`) carries the
//! actions out, as it does `converge`'s.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use drover_common::spec::is_valid_name;
use drover_common::state::{ExitReason, TaskState};
use drover_common::wire::{
    task_set_digest, Assignment, AssignmentSet, ExecutorStatus, StatusUpdate,
};

use crate::config::TaskUsers;
use crate::converge::{
    converge, held_task_ids, lease_kills, Action, KillCause, LocalTask, LocalTasks,
};

/// A status the agent decides itself (no executor wrote it), before it has a
/// sequence number: see [`next_seq`] and [`Verdict::into_update`].
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    /// The task it is about.
    pub task_id: String,
    /// A terminal state.
    pub state: TaskState,
    /// Why the task ended.
    pub reason: ExitReason,
    /// The status's message.
    pub message: String,
}

impl Verdict {
    /// A task whose executor could not be started (`error` says why): FAILED.
    pub fn setup_failed(task_id: &str, error: String) -> Verdict {
        Verdict {
            task_id: task_id.to_string(),
            state: TaskState::Failed,
            message: error.clone(),
            reason: ExitReason::SandboxSetupFailed { error },
        }
    }

    /// A task whose executor is gone before the task ended: LOST.
    pub fn lost(task_id: &str, message: String) -> Verdict {
        Verdict {
            task_id: task_id.to_string(),
            state: TaskState::Lost,
            reason: ExitReason::ExecutorLost,
            message,
        }
    }

    /// A task whose executor did not end it within `waited` of a kill for `reason`:
    /// the agent killed the executor and the task's cgroup itself. KILLED, with what
    /// the cleanup found in the message (`left`: None when nothing was left).
    pub fn kill_overdue(
        task_id: &str,
        reason: ExitReason,
        waited: Duration,
        left: Option<String>,
    ) -> Verdict {
        let mut message = format!(
            "{reason}; the executor did not end the task within {}s of the kill, so the agent killed it and the task's cgroup",
            waited.as_secs()
        );
        if let Some(left) = left {
            message.push_str(&format!(" ({left})"));
        }
        Verdict {
            task_id: task_id.to_string(),
            state: TaskState::Killed,
            reason,
            message,
        }
    }

    /// A terminal `state` for `reason`, which is also the message.
    fn ended(task_id: &str, state: TaskState, reason: ExitReason) -> Verdict {
        Verdict {
            task_id: task_id.to_string(),
            state,
            message: reason.to_string(),
            reason,
        }
    }

    /// The status update to record, numbered `seq`, stamped `timestamp_ms` (wall).
    pub fn into_update(self, seq: u64, timestamp_ms: u64) -> StatusUpdate {
        StatusUpdate {
            task_id: self.task_id,
            seq,
            state: self.state,
            exit_reason: Some(self.reason),
            message: self.message,
            timestamp_ms,
            processes: vec![],
            processes_omitted: None,
        }
    }
}

/// The sequence number of a status the agent writes for a task: one past every
/// number already known for it (the outbox's, the executor's checkpoint, the last one
/// a watcher saw), so the master never takes it for a repeat.
pub fn next_seq(known: impl IntoIterator<Item = u64>) -> u64 {
    known.into_iter().max().unwrap_or(0) + 1
}

/// Why this agent refuses to run a task as `user` (`uid` on this host; None: no
/// such user here), or None when it may: root (by name or uid 0) only with
/// `allow_root`, whatever `users` lists; anyone else when `users` names the user
/// or holds its uid.
pub fn user_refusal(
    users: &TaskUsers,
    allow_root: bool,
    user: &str,
    uid: Option<u32>,
) -> Option<String> {
    if user == "root" || uid == Some(0) {
        return (!allow_root).then(|| {
            format!(
                "task user `{user}` is root (uid 0), which this agent runs no task as; set allow_root in its config to allow it"
            )
        });
    }
    if users.names.iter().any(|n| n == user) {
        return None;
    }
    let uid_text = match uid {
        Some(uid) if users.uids.iter().any(|(lo, hi)| (*lo..=*hi).contains(&uid)) => return None,
        Some(uid) => format!("uid {uid}"),
        None => "no such user on this host".to_string(),
    };
    Some(format!(
        "task user `{user}` ({uid_text}) is not in this agent's task_users ({}); run the task as an allowed user or add it to task_users in the agent's config",
        users.describe()
    ))
}

/// The agent's own check of the users tasks run as (see [`user_refusal`]).
#[derive(Clone, Debug)]
pub struct UserCheck {
    pub users: TaskUsers,
    pub allow_root: bool,
    /// The uid of a user name on this host (None: no such user).
    pub uid_of: fn(&str) -> Option<u32>,
}

/// What the runtime should do after [`Host::apply`] or [`Host::lease_kills`].
#[derive(Clone, Debug, PartialEq)]
pub enum HostAction {
    /// Start an executor for a new task (already held as ASSIGNED), then hand its
    /// watcher to [`Host::watch`].
    Start(Box<Assignment>),
    /// Send `reason` to the task's executor (through its watcher, if it has one).
    Kill {
        task_id: String,
        reason: ExitReason,
        cause: KillCause,
    },
    /// An assignment the agent refuses to run (its id is not a valid name, or its
    /// user is not one this agent runs tasks as): report the verdict; the task is
    /// held FAILED.
    Refuse(Verdict),
    /// The master wants a task stopped that never ran here: report the verdict
    /// (KILLED); the task is held KILLED.
    ReportKilled(Verdict),
}

/// What an executor that is gone leaves behind, by its checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub enum Gone {
    /// The task ended: relay the checkpoint unless a watcher already did (`None`).
    Ended(Option<ExecutorStatus>),
    /// The task did not end: clean up and report it LOST.
    Lost,
}

/// Decides what a gone executor leaves: its checkpointed status when terminal
/// (relayed only when newer than `last_relayed`, the last sequence number relayed
/// from it), else LOST.
pub fn executor_gone(checkpoint: Option<ExecutorStatus>, last_relayed: u64) -> Gone {
    match checkpoint {
        Some(s) if s.state.is_terminal() => Gone::Ended((s.seq > last_relayed).then_some(s)),
        _ => Gone::Lost,
    }
}

/// The monotonic ms at which a status stamped `at_wall_ms` (by an earlier run of the
/// agent, say) was written, given the clocks now: its age by the wall clock, taken
/// once from the monotonic now.
pub fn since_mono(now_mono_ms: u64, now_wall_ms: u64, at_wall_ms: u64) -> u64 {
    now_mono_ms.saturating_sub(now_wall_ms.saturating_sub(at_wall_ms))
}

/// The tasks this host holds, with each one's watcher (`W`: how the runtime reaches
/// a watched executor; a kill channel in the agent, anything in tests).
#[derive(Debug)]
pub struct Host<W> {
    local: LocalTasks,
    /// Monotonic ms when a task was seen terminal (for sandbox retention).
    terminal_at: HashMap<String, u64>,
    /// The watcher of each task whose executor is still followed.
    watchers: HashMap<String, W>,
    /// Task ids of the latest assignment set, once one arrived.
    desired: Option<HashSet<String>>,
    /// The users tasks may run as; None: not checked (`no_isolation`: tasks run
    /// as the agent's own user).
    users: Option<UserCheck>,
}

impl<W> Default for Host<W> {
    fn default() -> Self {
        Host {
            local: LocalTasks::new(),
            terminal_at: HashMap::new(),
            watchers: HashMap::new(),
            desired: None,
            users: None,
        }
    }
}

impl<W> Host<W> {
    /// A host that refuses to start a task as a user `check` does not allow.
    pub fn with_user_check(check: UserCheck) -> Host<W> {
        Host {
            users: Some(check),
            ..Host::default()
        }
    }

    /// Why task `a` may not start here, if it may not.
    fn refusal(&self, a: &Assignment) -> Option<String> {
        if !is_valid_name(&a.task.task_id) {
            return Some("task id is not a valid name ([A-Za-z0-9_.-], 1-64 chars)".into());
        }
        let check = self.users.as_ref()?;
        let user = a.task.task.user.as_deref().unwrap_or(&a.task.role);
        user_refusal(&check.users, check.allow_root, user, (check.uid_of)(user))
    }

    /// The tasks held, by id.
    pub fn tasks(&self) -> &LocalTasks {
        &self.local
    }

    /// How many tasks held have not ended.
    pub fn running(&self) -> usize {
        self.local
            .values()
            .filter(|t| !t.state.is_terminal())
            .count()
    }

    /// Holds a task whose executor runs (or may run): in `state` (ASSIGNED when no
    /// status is known), followed by `watcher`.
    pub fn hold_live(&mut self, id: &str, state: Option<TaskState>, exclusive: bool, watcher: W) {
        self.local.insert(
            id.to_string(),
            LocalTask {
                state: state.unwrap_or(TaskState::Assigned),
                kill_requested: false,
                exclusive,
            },
        );
        self.watchers.insert(id.to_string(), watcher);
    }

    /// Holds a task that ended in `state`, terminal since `since_mono_ms`.
    pub fn hold_terminal(
        &mut self,
        id: &str,
        state: TaskState,
        exclusive: bool,
        since_mono_ms: u64,
    ) {
        self.local.insert(
            id.to_string(),
            LocalTask {
                state,
                kill_requested: false,
                exclusive,
            },
        );
        self.terminal_at.insert(id.to_string(), since_mono_ms);
    }

    /// Follows a started task's executor through `watcher`.
    pub fn watch(&mut self, id: &str, watcher: W) {
        self.watchers.insert(id.to_string(), watcher);
    }

    /// The watcher of task `id`, while one follows it.
    pub fn watcher(&self, id: &str) -> Option<&W> {
        self.watchers.get(id)
    }

    /// Task `id`'s executor is no longer followed.
    pub fn unwatch(&mut self, id: &str) {
        self.watchers.remove(id);
    }

    /// Converges on a new assignment set at `now_ms` (monotonic): records which ids
    /// the master wants and each held task's exclusivity, holds what starts (ASSIGNED),
    /// what is refused (FAILED) and what is reported KILLED, marks what is killed.
    pub fn apply(&mut self, set: &AssignmentSet, now_ms: u64) -> Vec<HostAction> {
        for a in &set.assignments {
            if let Some(local) = self.local.get_mut(&a.task.task_id) {
                local.exclusive = a.exclusive;
            }
        }
        self.desired = Some(
            set.assignments
                .iter()
                .map(|a| a.task.task_id.clone())
                .collect(),
        );
        let mut actions = Vec::new();
        for action in converge(set, &self.local) {
            match action {
                Action::Start(a) => {
                    let id = a.task.task_id.clone();
                    if let Some(error) = self.refusal(&a) {
                        let reason = ExitReason::SandboxSetupFailed { error };
                        self.end_here(&id, TaskState::Failed, false, a.exclusive, now_ms);
                        actions.push(HostAction::Refuse(Verdict::ended(
                            &id,
                            TaskState::Failed,
                            reason,
                        )));
                        continue;
                    }
                    self.local.insert(id, LocalTask::starting(a.exclusive));
                    actions.push(HostAction::Start(a));
                }
                Action::Kill {
                    task_id,
                    reason,
                    cause,
                } => actions.push(self.kill(task_id, reason, cause)),
                Action::ReportKilled { task_id, reason } => {
                    self.end_here(&task_id, TaskState::Killed, true, false, now_ms);
                    actions.push(HostAction::ReportKilled(Verdict::ended(
                        &task_id,
                        TaskState::Killed,
                        reason,
                    )));
                }
            }
        }
        actions
    }

    /// Holds a task the agent ends itself (never ran here) in `state` since `now_ms`.
    fn end_here(
        &mut self,
        id: &str,
        state: TaskState,
        kill_requested: bool,
        exclusive: bool,
        now_ms: u64,
    ) {
        self.local.insert(
            id.to_string(),
            LocalTask {
                state,
                kill_requested,
                exclusive,
            },
        );
        self.terminal_at.insert(id.to_string(), now_ms);
    }

    /// Marks task `task_id` as being killed and says so.
    fn kill(&mut self, task_id: String, reason: ExitReason, cause: KillCause) -> HostAction {
        if let Some(local) = self.local.get_mut(&task_id) {
            local.kill_requested = true;
        }
        HostAction::Kill {
            task_id,
            reason,
            cause,
        }
    }

    /// The exclusive tasks to kill because the master has been silent `since_contact`,
    /// past `lease`; each is marked so it is killed once.
    pub fn lease_kills(&mut self, since_contact: Duration, lease: Duration) -> Vec<HostAction> {
        lease_kills(&self.local, since_contact, lease)
            .into_iter()
            .filter_map(|action| match action {
                Action::Kill {
                    task_id,
                    reason,
                    cause,
                } => Some(self.kill(task_id, reason, cause)),
                _ => None,
            })
            .collect()
    }

    /// Statuses now durable in the outbox at `now_ms` (monotonic): each advances its
    /// task's state unless the task already ended (a terminal state is final).
    pub fn recorded(&mut self, updates: &[StatusUpdate], now_ms: u64) {
        for u in updates {
            let became_terminal = match self.local.get_mut(&u.task_id) {
                Some(local) if !local.state.is_terminal() => {
                    local.state = u.state;
                    u.state.is_terminal()
                }
                _ => false,
            };
            if became_terminal {
                self.terminal_at.insert(u.task_id.clone(), now_ms);
            }
        }
    }

    /// The tasks whose sandboxes may go at `now_ms` (monotonic): terminal for at least
    /// `retention_ms`, out of the latest assignment set (none before one arrived) and
    /// no longer watched. The runtime still keeps one with statuses left to relay.
    pub fn collectable(&self, retention_ms: u64, now_ms: u64) -> Vec<String> {
        let Some(desired) = &self.desired else {
            return Vec::new();
        };
        self.local
            .iter()
            .filter(|(id, l)| {
                l.state.is_terminal()
                    && !desired.contains(*id)
                    && !self.watchers.contains_key(*id)
                    && self
                        .terminal_at
                        .get(*id)
                        .is_some_and(|at| at + retention_ms <= now_ms)
            })
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Task `id`'s sandbox is gone: it is no longer held.
    pub fn forget(&mut self, id: &str) {
        self.local.remove(id);
        self.terminal_at.remove(id);
    }

    /// The digest of the tasks held and not ended, for a heartbeat.
    pub fn digest(&self) -> u64 {
        task_set_digest(held_task_ids(&self.local))
    }

    /// The tasks held and not ended, with their states, for a full task set.
    pub fn held(&self) -> Vec<(String, TaskState)> {
        self.local
            .iter()
            .filter(|(_, l)| !l.state.is_terminal())
            .map(|(id, l)| (id.clone(), l.state))
            .collect()
    }
}

#[cfg(test)]
#[path = "host_tests.rs"]
mod tests;
