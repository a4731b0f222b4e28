//! The agent's pure decision logic: given the master's complete assignment set and
//! the tasks this host holds, which executors to start, which tasks to kill and what
//! to report for tasks that never ran here. No I/O; the runtime executes the actions.

use std::collections::BTreeMap;
use std::time::Duration;

use drover_common::state::{DesiredState, ExitReason, TaskState};
use drover_common::wire::{Assignment, AssignmentSet, ExecutorTask};

/// A task as this agent holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalTask {
    /// The latest state the executor reported (ASSIGNED until its first status).
    pub state: TaskState,
    /// A kill was already sent (or is being sent); never send it twice.
    pub kill_requested: bool,
    /// The task must die when the agent loses the master for its lease.
    pub exclusive: bool,
}

impl LocalTask {
    /// A task whose executor was just started.
    pub fn starting(exclusive: bool) -> LocalTask {
        LocalTask {
            state: TaskState::Assigned,
            kill_requested: false,
            exclusive,
        }
    }
}

/// Every task this agent holds, by task id.
pub type LocalTasks = BTreeMap<String, LocalTask>;

/// Why the agent kills a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KillCause {
    /// The master set its desired state to SHUTDOWN.
    Shutdown,
    /// The master's set does not contain it: an errant task (seed 000).
    Errant,
    /// An exclusive task and the master was unreachable for the lease.
    LeaseExpired,
}

/// What the runtime should do.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Start an executor for a new task.
    Start(Box<Assignment>),
    /// Ask the task's executor to run its kill escalation.
    Kill {
        task_id: String,
        reason: ExitReason,
        cause: KillCause,
    },
    /// The master wants a task stopped that never ran here: report it KILLED so the
    /// master need not wait for a timeout.
    ReportKilled { task_id: String, reason: ExitReason },
}

/// Decides how to bring `actual` to `desired`. Never starts a task this agent already
/// holds (even a terminal one: tasks are one-shot), never repeats a kill.
pub fn converge(desired: &AssignmentSet, actual: &LocalTasks) -> Vec<Action> {
    let mut actions = Vec::new();
    let mut wanted: BTreeMap<&str, &Assignment> = BTreeMap::new();
    for a in &desired.assignments {
        wanted.insert(a.task.task_id.as_str(), a);
    }
    for (task_id, a) in &wanted {
        let reason = a.kill_reason.clone().unwrap_or(ExitReason::KilledByRequest);
        match (a.desired, actual.get(*task_id)) {
            // Started before (the master has reports on it) but not held here: its
            // sandbox was lost. Never a second run; the master's reconciliation sees
            // it missing from the full task set, makes it LOST and replaces it.
            (DesiredState::Running, None) if a.started => {}
            (DesiredState::Running, None) => actions.push(Action::Start(Box::new((*a).clone()))),
            (DesiredState::Running, Some(_)) => {}
            (DesiredState::Shutdown, None) => actions.push(Action::ReportKilled {
                task_id: task_id.to_string(),
                reason,
            }),
            (DesiredState::Shutdown, Some(local)) => {
                if !local.state.is_terminal() && !local.kill_requested {
                    actions.push(Action::Kill {
                        task_id: task_id.to_string(),
                        reason,
                        cause: KillCause::Shutdown,
                    });
                }
            }
        }
    }
    for (task_id, local) in actual {
        if !wanted.contains_key(task_id.as_str())
            && !local.state.is_terminal()
            && !local.kill_requested
        {
            actions.push(Action::Kill {
                task_id: task_id.clone(),
                reason: ExitReason::KilledByRequest,
                cause: KillCause::Errant,
            });
        }
    }
    actions
}

/// What a kill's escalation may take beyond its configured waits before the agent
/// stops waiting for the executor: its SIGKILL loop's 10 s, and room for a loaded host.
pub const KILL_SLACK: Duration = Duration::from_secs(60);

/// How long after a kill request the agent waits for the executor to end the task
/// before it gives up on it (kills the executor and the task's cgroup itself and
/// reports the task KILLED with why): the escalation's configured waits (the HTTP
/// lifecycle's two waits, `finalization_wait`) plus `slack` ([`KILL_SLACK`]). Without
/// the task file (None), the waits are assumed generously (5 minutes).
pub fn kill_deadline(task: Option<&ExecutorTask>, slack: Duration) -> Duration {
    let Some(task) = task else {
        return Duration::from_secs(300) + slack;
    };
    let http = task
        .lifecycle
        .as_ref()
        .and_then(|l| l.http.as_ref())
        .map_or(Duration::ZERO, |h| {
            h.graceful_shutdown_wait.get() + h.shutdown_wait.get()
        });
    http + task.task.finalization_wait.get() + slack
}

/// The longest an assignment answer may have been in flight (round trip minus the
/// time the master held the poll) for the agent to act on it: half the exclusive
/// lease, at most 2 s. A longer flight means a partition delayed it: the master may
/// have replaced its tasks meanwhile, and starting them would run a second copy.
pub fn max_answer_flight(lease: Duration) -> Duration {
    (lease / 2).min(Duration::from_secs(2))
}

/// Whether to drop an assignment set that was `in_flight` long and poll again: when
/// the flight exceeds `limit`, unless this version was already dropped once (then the
/// master answered it twice, so it is current; a steadily slow network never starves
/// the agent).
pub fn discard_stale(
    in_flight: Duration,
    limit: Duration,
    version: u64,
    discarded: Option<u64>,
) -> bool {
    in_flight > limit && discarded != Some(version)
}

/// Exclusive tasks to kill because the master has been unreachable for `lease`
/// (`since_contact` is the time since the last successful heartbeat).
pub fn lease_kills(actual: &LocalTasks, since_contact: Duration, lease: Duration) -> Vec<Action> {
    if since_contact < lease {
        return Vec::new();
    }
    actual
        .iter()
        .filter(|(_, t)| t.exclusive && !t.state.is_terminal() && !t.kill_requested)
        .map(|(id, _)| Action::Kill {
            task_id: id.clone(),
            reason: ExitReason::AgentLost,
            cause: KillCause::LeaseExpired,
        })
        .collect()
}

/// The task ids that count for the heartbeat digest: every task held and not terminal.
pub fn held_task_ids(actual: &LocalTasks) -> impl Iterator<Item = &str> {
    actual
        .iter()
        .filter(|(_, t)| !t.state.is_terminal())
        .map(|(id, _)| id.as_str())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use drover_common::spec::TaskSpec;
    use drover_common::wire::ExecutorTask;

    /// An assignment of a one-process task `id` in `desired` state (tests of the
    /// pure cores).
    pub(crate) fn assignment(id: &str, desired: DesiredState) -> Assignment {
        let task: TaskSpec = serde_json::from_value(serde_json::json!({
            "processes": [{"name": "p", "cmdline": "true"}],
            "resources": {"cpu": 0.1, "ram": "16MiB", "disk": "16MiB"}
        }))
        .unwrap();
        Assignment {
            desired,
            kill_reason: None,
            exclusive: false,
            task: ExecutorTask {
                task_id: id.into(),
                role: "r".into(),
                environment: "e".into(),
                name: "n".into(),
                instance: 0,
                task,
                health_check: None,
                lifecycle: None,
                ports: Default::default(),
                drain_delay_ms: None,
                status_seq_base: 0,
            },
            started: false,
        }
    }

    #[test]
    fn a_kill_is_waited_for_as_long_as_its_escalation_may_take_plus_slack() {
        let mut a = assignment("t", DesiredState::Running);
        assert_eq!(
            kill_deadline(Some(&a.task), KILL_SLACK),
            a.task.task.finalization_wait.get() + KILL_SLACK
        );
        a.task.lifecycle = Some(serde_json::from_value(serde_json::json!({"http": {}})).unwrap());
        assert_eq!(
            kill_deadline(Some(&a.task), KILL_SLACK),
            Duration::from_secs(10) + a.task.task.finalization_wait.get() + KILL_SLACK
        );
        assert_eq!(
            kill_deadline(None, KILL_SLACK),
            Duration::from_secs(300) + KILL_SLACK
        );
    }

    fn set(assignments: Vec<Assignment>) -> AssignmentSet {
        AssignmentSet {
            version: 1,
            assignments,
        }
    }

    fn local(state: TaskState) -> LocalTask {
        LocalTask {
            state,
            kill_requested: false,
            exclusive: false,
        }
    }

    #[test]
    fn new_running_assignments_are_started() {
        let actions = converge(
            &set(vec![assignment("t1", DesiredState::Running)]),
            &LocalTasks::new(),
        );
        assert!(matches!(&actions[..], [Action::Start(a)] if a.task.task_id == "t1"));
    }

    #[test]
    fn a_task_already_held_is_never_started_again_even_when_terminal() {
        for state in [TaskState::Assigned, TaskState::Running, TaskState::Finished] {
            let actual = LocalTasks::from([("t1".to_string(), local(state))]);
            let actions = converge(&set(vec![assignment("t1", DesiredState::Running)]), &actual);
            assert!(actions.is_empty(), "{state}: {actions:?}");
        }
    }

    #[test]
    fn a_task_the_master_saw_started_is_not_started_again_when_not_held() {
        let mut started = assignment("t1", DesiredState::Running);
        started.started = true;
        let actions = converge(&set(vec![started]), &LocalTasks::new());
        assert!(actions.is_empty(), "{actions:?}");
    }

    #[test]
    fn a_late_assignment_answer_is_dropped_once_then_trusted() {
        let limit = max_answer_flight(Duration::from_secs(10));
        assert_eq!(limit, Duration::from_secs(2));
        assert_eq!(
            max_answer_flight(Duration::from_secs(2)),
            Duration::from_secs(1)
        );
        let late = Duration::from_secs(12);
        assert!(!discard_stale(Duration::from_millis(5), limit, 7, None));
        assert!(discard_stale(late, limit, 7, None));
        assert!(
            discard_stale(late, limit, 8, Some(7)),
            "a newer version is checked again"
        );
        assert!(
            !discard_stale(late, limit, 7, Some(7)),
            "answered twice: current"
        );
    }

    #[test]
    fn shutdown_kills_a_live_task_once_with_the_masters_reason() {
        let mut a = assignment("t1", DesiredState::Shutdown);
        a.kill_reason = Some(ExitReason::Drained);
        let mut actual = LocalTasks::from([("t1".to_string(), local(TaskState::Running))]);
        let actions = converge(&set(vec![a.clone()]), &actual);
        assert_eq!(
            actions,
            vec![Action::Kill {
                task_id: "t1".into(),
                reason: ExitReason::Drained,
                cause: KillCause::Shutdown
            }]
        );
        actual.get_mut("t1").unwrap().kill_requested = true;
        assert!(converge(&set(vec![a]), &actual).is_empty());
    }

    #[test]
    fn shutdown_of_a_terminal_task_does_nothing() {
        let actual = LocalTasks::from([("t1".to_string(), local(TaskState::Finished))]);
        assert!(converge(
            &set(vec![assignment("t1", DesiredState::Shutdown)]),
            &actual
        )
        .is_empty());
    }

    #[test]
    fn shutdown_of_a_task_never_started_here_is_reported_killed() {
        let actions = converge(
            &set(vec![assignment("t1", DesiredState::Shutdown)]),
            &LocalTasks::new(),
        );
        assert_eq!(
            actions,
            vec![Action::ReportKilled {
                task_id: "t1".into(),
                reason: ExitReason::KilledByRequest
            }]
        );
    }

    #[test]
    fn errant_tasks_not_in_the_set_are_killed_and_terminal_ones_left_alone() {
        let actual = LocalTasks::from([
            ("live".to_string(), local(TaskState::Running)),
            ("done".to_string(), local(TaskState::Failed)),
            ("keep".to_string(), local(TaskState::Running)),
        ]);
        let actions = converge(
            &set(vec![assignment("keep", DesiredState::Running)]),
            &actual,
        );
        assert_eq!(
            actions,
            vec![Action::Kill {
                task_id: "live".into(),
                reason: ExitReason::KilledByRequest,
                cause: KillCause::Errant
            }]
        );
    }

    #[test]
    fn an_empty_set_kills_everything_alive() {
        let actual = LocalTasks::from([
            ("a".to_string(), local(TaskState::Starting)),
            ("b".to_string(), local(TaskState::Assigned)),
        ]);
        assert_eq!(converge(&set(vec![]), &actual).len(), 2);
    }

    #[test]
    fn lease_kills_only_live_exclusive_tasks_after_the_lease() {
        let mut ex = local(TaskState::Running);
        ex.exclusive = true;
        let mut ex_done = local(TaskState::Finished);
        ex_done.exclusive = true;
        let actual = LocalTasks::from([
            ("ex".to_string(), ex),
            ("ex_done".to_string(), ex_done),
            ("plain".to_string(), local(TaskState::Running)),
        ]);
        let lease = Duration::from_secs(10);
        assert!(lease_kills(&actual, Duration::from_secs(9), lease).is_empty());
        assert_eq!(
            lease_kills(&actual, Duration::from_secs(10), lease),
            vec![Action::Kill {
                task_id: "ex".into(),
                reason: ExitReason::AgentLost,
                cause: KillCause::LeaseExpired
            }]
        );
    }

    #[test]
    fn digest_ids_skip_terminal_tasks() {
        let actual = LocalTasks::from([
            ("a".to_string(), local(TaskState::Running)),
            ("b".to_string(), local(TaskState::Lost)),
        ]);
        assert_eq!(held_task_ids(&actual).collect::<Vec<_>>(), vec!["a"]);
    }
}
