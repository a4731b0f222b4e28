//! The task state machine: Aurora's task states, the legal transitions as one table,
//! the exit reason as a second component with its own override rules (Treadmill), and
//! the event history every task keeps. Desired state (what the master wants) is kept
//! apart from the observed state (what the executor reported), as in SwarmKit.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Milliseconds since the Unix epoch.
pub type UnixMillis = u64;

/// The wall clock as [`UnixMillis`] (0 if the clock is before the epoch). The one
/// place every process reads it; pure code takes the time as an argument instead.
pub fn now_ms() -> UnixMillis {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Milliseconds on the monotonic clock (see [`mono_ms`]): only differences mean
/// anything, and only within one process.
pub type MonoMillis = u64;

/// Where [`mono_ms`] starts: far enough from zero that a duration subtracted from any
/// reading (a task's age re-derived at load) never underflows.
pub const MONO_ORIGIN_MS: MonoMillis = 1 << 40;

/// The monotonic clock (`CLOCK_MONOTONIC` through [`std::time::Instant`]) as
/// [`MonoMillis`]: [`MONO_ORIGIN_MS`] plus the milliseconds since the first call in
/// this process. Wall clock steps (NTP, an operator, a VM resumed) do not move it,
/// nor does the time a suspended machine sleeps. Every timeout is measured on it;
/// the wall clock ([`now_ms`]) is only for what people read.
pub fn mono_ms() -> MonoMillis {
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let origin = *ORIGIN.get_or_init(std::time::Instant::now);
    MONO_ORIGIN_MS + origin.elapsed().as_millis() as u64
}

/// Aurora's task states.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TaskState {
    /// Waiting for a host.
    Pending,
    /// Waiting out a flapping penalty before it becomes PENDING.
    Throttled,
    /// Placed on an agent, stored; the agent has not confirmed it yet.
    Assigned,
    /// The executor is building the sandbox and starting processes.
    Starting,
    /// Processes run and the liveness requirement is met.
    Running,
    /// Every process succeeded.
    Finished,
    /// A failure limit was reached.
    Failed,
    /// Being killed on request.
    Killing,
    /// Killed on request; never restarted.
    Killed,
    /// Being killed while an identical replacement is scheduled.
    Restarting,
    /// Being killed for a production task's resources.
    Preempting,
    /// Being killed because its host goes into maintenance.
    Draining,
    /// Gone: its agent vanished, or it was stuck in a transient state.
    Lost,
}

/// Every state, in lifecycle order.
pub const ALL_STATES: [TaskState; 13] = [
    TaskState::Pending,
    TaskState::Throttled,
    TaskState::Assigned,
    TaskState::Starting,
    TaskState::Running,
    TaskState::Finished,
    TaskState::Failed,
    TaskState::Killing,
    TaskState::Killed,
    TaskState::Restarting,
    TaskState::Preempting,
    TaskState::Draining,
    TaskState::Lost,
];

use TaskState::*;

/// The legal transitions: `(from, [to...])`. Anything not listed is illegal.
/// Terminal states have no row, so nothing leaves them.
pub const TRANSITIONS: &[(TaskState, &[TaskState])] = &[
    (Pending, &[Assigned, Killing, Killed, Lost]),
    (Throttled, &[Pending, Killing, Killed]),
    (
        Assigned,
        &[
            Starting, Running, Finished, Failed, Killing, Killed, Restarting, Preempting, Draining,
            Lost,
        ],
    ),
    (
        Starting,
        &[
            Running, Finished, Failed, Killing, Killed, Restarting, Preempting, Draining, Lost,
        ],
    ),
    (
        Running,
        &[
            Finished, Failed, Killing, Killed, Restarting, Preempting, Draining, Lost,
        ],
    ),
    (Killing, &[Killed, Lost]),
    (Restarting, &[Finished, Failed, Killed, Lost]),
    (Preempting, &[Finished, Failed, Killed, Lost]),
    (Draining, &[Finished, Failed, Killed, Lost]),
];

/// A transition the table does not allow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("illegal task transition from {from} to {to}")]
pub struct IllegalTransition {
    pub from: TaskState,
    pub to: TaskState,
}

impl TaskState {
    /// FINISHED, FAILED, KILLED and LOST: final, nothing leaves them.
    pub const fn is_terminal(self) -> bool {
        matches!(self, Finished | Failed | Killed | Lost)
    }

    /// Being stopped on the master's request (KILLING, RESTARTING, PREEMPTING,
    /// DRAINING).
    pub const fn is_stopping(self) -> bool {
        matches!(self, Killing | Restarting | Preempting | Draining)
    }

    /// Placed on an agent and not terminal: the agent is expected to hold it.
    pub const fn is_on_agent(self) -> bool {
        !self.is_terminal() && !matches!(self, Pending | Throttled)
    }

    /// The states this one may move to.
    pub fn successors(self) -> &'static [TaskState] {
        TRANSITIONS
            .iter()
            .find(|(from, _)| *from == self)
            .map(|(_, to)| *to)
            .unwrap_or(&[])
    }

    /// Checks `self -> to` against the table.
    pub fn check_transition(self, to: TaskState) -> Result<(), IllegalTransition> {
        if self.successors().contains(&to) {
            Ok(())
        } else {
            Err(IllegalTransition { from: self, to })
        }
    }

    /// The upper-case name used on the wire and in the UI.
    pub const fn as_str(self) -> &'static str {
        match self {
            Pending => "PENDING",
            Throttled => "THROTTLED",
            Assigned => "ASSIGNED",
            Starting => "STARTING",
            Running => "RUNNING",
            Finished => "FINISHED",
            Failed => "FAILED",
            Killing => "KILLING",
            Killed => "KILLED",
            Restarting => "RESTARTING",
            Preempting => "PREEMPTING",
            Draining => "DRAINING",
            Lost => "LOST",
        }
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the master wants of a task (SwarmKit's desired state).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum DesiredState {
    /// Run it.
    Running,
    /// Stop it (and keep it stopped).
    Shutdown,
}

/// Why a task ended: the second component of a task's state (Treadmill's exit status).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ExitReason {
    /// A process exited with this code (0 is success).
    ExitCode { code: i32 },
    /// A process was killed by this signal.
    Signal { signal: i32 },
    /// The task's cgroup hit its memory limit (read from the cgroup's counter).
    OomKilled,
    /// Health checks failed past the limit.
    HealthCheckFailed { last_error: String },
    /// Killed because someone asked (job kill).
    KilledByRequest,
    /// Stopped because someone restarted its instance (job restart): a replacement
    /// task takes its place.
    Restarted,
    /// Replaced by a rolling update (or its rollback) with a task of another config.
    Updated,
    /// Its host went into maintenance.
    Drained,
    /// Killed to make room for the task `by` (a production task, or a preemptible
    /// one of the same role with a higher priority).
    Preempted {
        #[serde(default)]
        by: String,
    },
    /// Its agent stopped reporting.
    AgentLost,
    /// Stuck in ASSIGNED or STARTING past the transient state timeout.
    TransientStateTimeout { state: TaskState },
    /// The sandbox or cgroup could not be built.
    SandboxSetupFailed { error: String },
    /// The executor died; what remained of the task was killed.
    ExecutorLost,
    /// A process could not be started (binary not found, permission denied).
    FailedToStart { process: String, error: String },
    /// An artifact of `task.artifacts` could not be fetched, verified or unpacked
    /// (`url` and the cause: HTTP status, checksum mismatch, too large, unpack refused).
    ArtifactFetchFailed { url: String, error: String },
    /// What the task wrote (`sandbox/` and its `/tmp`) went over `resources.disk`.
    DiskLimitExceeded { used_bytes: u64, limit_bytes: u64 },
}

impl ExitReason {
    /// A final reason is never overridden by a later one. Only what a process
    /// reported on its own (exit code, signal) may be refined, e.g. a SIGKILL that the
    /// cgroup's counter shows was an OOM kill.
    pub const fn is_final(&self) -> bool {
        !matches!(
            self,
            ExitReason::ExitCode { .. } | ExitReason::Signal { .. }
        )
    }

    /// Applies Treadmill's override rule: returns the reason that stands.
    pub fn merge(current: Option<ExitReason>, new: ExitReason) -> ExitReason {
        match current {
            Some(existing) if existing.is_final() => existing,
            _ => new,
        }
    }
}

impl fmt::Display for ExitReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExitReason::ExitCode { code } => write!(f, "exit code {code}"),
            ExitReason::Signal { signal } => write!(f, "killed by signal {signal}"),
            ExitReason::OomKilled => write!(f, "out of memory (OOM kill)"),
            ExitReason::HealthCheckFailed { last_error } => {
                write!(f, "health check failed: {last_error}")
            }
            ExitReason::KilledByRequest => write!(f, "killed by request"),
            ExitReason::Restarted => write!(f, "restarted by request (replaced)"),
            ExitReason::Updated => write!(f, "updated"),
            ExitReason::Drained => write!(f, "drained for maintenance"),
            ExitReason::Preempted { by } => write!(f, "preempted by {by}"),
            ExitReason::AgentLost => write!(f, "agent lost"),
            ExitReason::TransientStateTimeout { state } => {
                write!(f, "stuck in {state} past the transient state timeout")
            }
            ExitReason::SandboxSetupFailed { error } => write!(f, "sandbox setup failed: {error}"),
            ExitReason::ExecutorLost => write!(f, "executor lost"),
            ExitReason::FailedToStart { process, error } => {
                write!(f, "process {process} failed to start: {error}")
            }
            ExitReason::ArtifactFetchFailed { url, error } => {
                write!(f, "artifact {url} failed: {error}")
            }
            ExitReason::DiskLimitExceeded {
                used_bytes,
                limit_bytes,
            } => write!(
                f,
                "disk limit exceeded: {used_bytes} bytes used, resources.disk is {limit_bytes} bytes"
            ),
        }
    }
}

/// Who caused a transition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EventSource {
    /// The master's lifecycle rules or scheduler.
    Master,
    /// An operator through the API or CLI.
    Operator,
    /// The agent (e.g. executor lost).
    Agent,
    /// The executor's report.
    Executor,
    /// Reconciliation.
    Reconciliation,
}

/// One entry of a task's history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TaskEvent {
    pub timestamp_ms: UnixMillis,
    pub state: TaskState,
    pub source: EventSource,
    pub message: String,
}

/// A task's observed state with its history. Applying a transition checks the table;
/// an illegal one changes nothing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskStatus {
    pub state: TaskState,
    pub exit_reason: Option<ExitReason>,
    pub events: Vec<TaskEvent>,
}

impl TaskStatus {
    /// A new task in `initial` (PENDING or THROTTLED).
    pub fn new(initial: TaskState, at: UnixMillis, source: EventSource, message: &str) -> Self {
        TaskStatus {
            state: initial,
            exit_reason: None,
            events: vec![TaskEvent {
                timestamp_ms: at,
                state: initial,
                source,
                message: message.to_string(),
            }],
        }
    }

    /// Moves to `to` if the table allows it, records the event, and merges `reason`
    /// under the override rule.
    pub fn transition(
        &mut self,
        to: TaskState,
        reason: Option<ExitReason>,
        at: UnixMillis,
        source: EventSource,
        message: &str,
    ) -> Result<(), IllegalTransition> {
        self.state.check_transition(to)?;
        self.state = to;
        if let Some(reason) = reason {
            self.exit_reason = Some(ExitReason::merge(self.exit_reason.take(), reason));
        }
        self.events.push(TaskEvent {
            timestamp_ms: at,
            state: to,
            source,
            message: message.to_string(),
        });
        Ok(())
    }

    /// When the task entered its current state.
    pub fn since(&self) -> UnixMillis {
        self.events.last().map(|e| e.timestamp_ms).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn terminal_states_have_no_successors() {
        for s in ALL_STATES {
            if s.is_terminal() {
                assert!(s.successors().is_empty(), "{s} has successors");
            }
        }
    }

    #[test]
    fn every_pair_is_legal_by_the_table_or_rejected_naming_both() {
        for from in ALL_STATES {
            for to in ALL_STATES {
                match from.check_transition(to) {
                    Ok(()) => assert!(from.successors().contains(&to)),
                    Err(e) => {
                        let text = e.to_string();
                        assert!(text.contains(from.as_str()) && text.contains(to.as_str()));
                    }
                }
            }
        }
    }

    #[test]
    fn final_reason_is_never_overridden() {
        let r = ExitReason::merge(
            Some(ExitReason::OomKilled),
            ExitReason::ExitCode { code: 1 },
        );
        assert_eq!(r, ExitReason::OomKilled);
        let r = ExitReason::merge(
            Some(ExitReason::Signal { signal: 9 }),
            ExitReason::OomKilled,
        );
        assert_eq!(r, ExitReason::OomKilled);
    }

    #[test]
    fn state_names_round_trip_through_json() {
        for s in ALL_STATES {
            let json = serde_json::to_string(&s).unwrap();
            assert_eq!(json, format!("\"{}\"", s.as_str()));
            assert_eq!(serde_json::from_str::<TaskState>(&json).unwrap(), s);
        }
    }

    fn any_state() -> impl Strategy<Value = TaskState> {
        (0..ALL_STATES.len()).prop_map(|i| ALL_STATES[i])
    }

    proptest! {
        #[test]
        fn no_path_leaves_a_terminal_state(path in proptest::collection::vec(any_state(), 0..40)) {
            let mut status = TaskStatus::new(Pending, 0, EventSource::Master, "created");
            let mut reached_terminal = false;
            for (i, to) in path.into_iter().enumerate() {
                let before = status.state;
                let result = status.transition(to, None, i as u64, EventSource::Master, "");
                if reached_terminal {
                    prop_assert!(result.is_err());
                    prop_assert_eq!(status.state, before);
                }
                if result.is_err() {
                    prop_assert_eq!(status.state, before);
                }
                reached_terminal |= status.state.is_terminal();
            }
        }
    }
}
