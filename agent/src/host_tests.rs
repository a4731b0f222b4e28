//! Fast tests of the agent's pure core: no processes, files or sockets.

use std::collections::{BTreeSet, HashSet};
use std::time::Duration;

use drover_common::state::{DesiredState, ExitReason, TaskState};
use drover_common::wire::{AssignmentSet, ExecutorStatus, StatusUpdate};
use proptest::prelude::*;

use super::*;
use crate::config::TaskUsers;
use crate::converge::tests::assignment;
use crate::converge::KillCause;

fn set(version: u64, assignments: Vec<Assignment>) -> AssignmentSet {
    AssignmentSet {
        version,
        assignments,
    }
}

fn running(id: &str) -> Assignment {
    assignment(id, DesiredState::Running)
}

fn shutdown(id: &str) -> Assignment {
    assignment(id, DesiredState::Shutdown)
}

fn update(id: &str, seq: u64, state: TaskState) -> StatusUpdate {
    StatusUpdate {
        task_id: id.into(),
        seq,
        state,
        exit_reason: None,
        message: String::new(),
        timestamp_ms: 0,
        processes: vec![],
        processes_omitted: None,
    }
}

fn checkpoint(seq: u64, state: TaskState) -> ExecutorStatus {
    serde_json::from_value(serde_json::json!({
        "task_id": "t1", "seq": seq, "state": state, "message": "", "timestamp_ms": 0,
        "executor_pid": 1, "processes": []
    }))
    .unwrap()
}

/// A host holding `t1` started from an assignment set and watched.
fn host_running_t1() -> Host<()> {
    let mut host = Host::default();
    host.apply(&set(1, vec![running("t1")]), 0);
    host.watch("t1", ());
    host.recorded(&[update("t1", 1, TaskState::Running)], 0);
    host
}

#[test]
fn a_new_task_is_started_once_and_held_assigned_until_its_first_status() {
    let mut host: Host<()> = Host::default();
    let actions = host.apply(&set(1, vec![running("t1")]), 0);
    assert!(matches!(&actions[..], [HostAction::Start(a)] if a.task.task_id == "t1"));
    assert_eq!(host.tasks()["t1"].state, TaskState::Assigned);
    assert_eq!(host.held(), vec![("t1".to_string(), TaskState::Assigned)]);
    assert!(host.apply(&set(2, vec![running("t1")]), 0).is_empty());
}

#[test]
fn a_task_id_that_is_not_a_valid_name_is_refused_failed_once_and_never_started() {
    let mut host: Host<()> = Host::default();
    let actions = host.apply(&set(1, vec![running("../etc")]), 7);
    let [HostAction::Refuse(verdict)] = &actions[..] else {
        panic!("{actions:?}");
    };
    assert_eq!(verdict.state, TaskState::Failed);
    assert!(
        matches!(&verdict.reason, ExitReason::SandboxSetupFailed { error } if error.contains("not a valid name")),
        "{verdict:?}"
    );
    assert_eq!(verdict.message, verdict.reason.to_string());
    assert_eq!(host.tasks()["../etc"].state, TaskState::Failed);
    assert!(host.apply(&set(2, vec![running("../etc")]), 8).is_empty());
}

/// The uids of a made-up host: www-data 33, postgres 104, alice 1001, root 0.
fn uid_of(name: &str) -> Option<u32> {
    match name {
        "root" | "toor" => Some(0),
        "www-data" => Some(33),
        "postgres" => Some(104),
        "alice" => Some(1001),
        _ => None,
    }
}

fn as_user(id: &str, user: Option<&str>) -> Assignment {
    let mut a = running(id);
    a.task.task.user = user.map(str::to_string);
    a
}

#[test]
fn the_default_task_users_are_nobody_www_data_and_regular_uids_never_root() {
    let users = TaskUsers::default();
    let refused =
        |user: &str, allow_root: bool| user_refusal(&users, allow_root, user, uid_of(user));
    for ok in ["www-data", "nobody", "alice"] {
        assert_eq!(refused(ok, false), None, "{ok}");
    }
    let msg = refused("postgres", false).unwrap();
    for part in [
        "`postgres`",
        "uid 104",
        "task_users",
        "nobody, www-data, uids 1000-",
    ] {
        assert!(msg.contains(part), "{msg}");
    }
    assert!(refused("ghost", false).unwrap().contains("no such user"));
    // Root, by name or by uid, only with allow_root, whatever the list says.
    let wide = TaskUsers::parse(&["root".into(), "toor".into(), "0-200".into()]).unwrap();
    for root in ["root", "toor"] {
        let msg = user_refusal(&wide, false, root, uid_of(root)).unwrap();
        assert!(msg.contains("allow_root"), "{msg}");
        assert_eq!(user_refusal(&users, true, root, uid_of(root)), None);
    }
    assert_eq!(user_refusal(&wide, false, "postgres", Some(104)), None);
}

#[test]
fn an_assignment_for_a_user_outside_task_users_is_refused_failed_with_the_reason() {
    let mut host: Host<()> = Host::with_user_check(UserCheck {
        users: TaskUsers::default(),
        allow_root: false,
        uid_of,
    });
    let all = vec![
        as_user("db", Some("postgres")),
        as_user("web", Some("www-data")),
        as_user("boss", Some("root")),
        // Without task.user the role's name is the user: `r`, unknown here.
        as_user("role", None),
    ];
    let actions = host.apply(&set(1, all.clone()), 7);
    let mut refused: Vec<(&str, &str)> = Vec::new();
    let mut started = Vec::new();
    for a in &actions {
        match a {
            HostAction::Refuse(v) => {
                assert_eq!(v.state, TaskState::Failed);
                assert_eq!(v.message, v.reason.to_string());
                refused.push((v.task_id.as_str(), v.message.as_str()));
            }
            HostAction::Start(a) => started.push(a.task.task_id.as_str()),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(started, vec!["web"]);
    let reason = |id: &str| refused.iter().find(|(t, _)| *t == id).unwrap().1;
    assert!(reason("db").contains("`postgres` (uid 104) is not in this agent's task_users"));
    assert!(reason("boss").contains("root"));
    assert!(reason("role").contains("`r` (no such user on this host)"));
    assert_eq!(host.tasks()["db"].state, TaskState::Failed);
    assert!(host.apply(&set(2, all), 8).is_empty(), "refused once");
}

#[test]
fn a_task_stopped_before_it_ran_here_is_reported_killed_once() {
    let mut host: Host<()> = Host::default();
    let mut stop = shutdown("t1");
    stop.kill_reason = Some(ExitReason::KilledByRequest);
    let actions = host.apply(&set(1, vec![stop.clone()]), 0);
    let [HostAction::ReportKilled(verdict)] = &actions[..] else {
        panic!("{actions:?}");
    };
    assert_eq!(
        (verdict.state, &verdict.reason),
        (TaskState::Killed, &ExitReason::KilledByRequest)
    );
    assert!(host.tasks()["t1"].kill_requested);
    assert!(host.apply(&set(2, vec![stop]), 0).is_empty());
}

#[test]
fn a_running_task_set_to_shutdown_is_killed_once() {
    let mut host = host_running_t1();
    let actions = host.apply(&set(2, vec![shutdown("t1")]), 0);
    assert!(
        matches!(&actions[..], [HostAction::Kill { task_id, cause: KillCause::Shutdown, .. }] if task_id == "t1"),
        "{actions:?}"
    );
    assert!(host.apply(&set(3, vec![shutdown("t1")]), 0).is_empty());
}

#[test]
fn a_running_task_missing_from_the_set_is_killed_as_errant() {
    let mut host = host_running_t1();
    let actions = host.apply(&set(2, vec![]), 0);
    assert!(
        matches!(
            &actions[..],
            [HostAction::Kill {
                cause: KillCause::Errant,
                ..
            }]
        ),
        "{actions:?}"
    );
}

#[test]
fn the_lease_kills_exclusive_tasks_only_once_it_passed_and_only_once() {
    let mut host: Host<()> = Host::default();
    let mut exclusive = running("x");
    exclusive.exclusive = true;
    host.apply(&set(1, vec![exclusive, running("shared")]), 0);
    let lease = Duration::from_secs(10);
    assert!(host.lease_kills(Duration::from_secs(9), lease).is_empty());
    let kills = host.lease_kills(Duration::from_secs(10), lease);
    assert!(
        matches!(&kills[..], [HostAction::Kill { task_id, reason: ExitReason::AgentLost, cause: KillCause::LeaseExpired }] if task_id == "x"),
        "{kills:?}"
    );
    assert!(host.lease_kills(Duration::from_secs(11), lease).is_empty());
}

#[test]
fn an_assignment_set_carries_a_held_tasks_exclusivity() {
    let mut host = host_running_t1();
    let mut now_exclusive = running("t1");
    now_exclusive.exclusive = true;
    host.apply(&set(2, vec![now_exclusive]), 0);
    assert!(host.tasks()["t1"].exclusive);
}

#[test]
fn recorded_statuses_advance_the_state_and_a_terminal_state_is_final() {
    let mut host = host_running_t1();
    assert_eq!(host.running(), 1);
    host.recorded(&[update("t1", 2, TaskState::Finished)], 5);
    host.recorded(&[update("t1", 3, TaskState::Running)], 6);
    assert_eq!(host.tasks()["t1"].state, TaskState::Finished);
    assert_eq!(host.running(), 0);
    assert!(host.held().is_empty());
    host.recorded(&[update("unknown", 1, TaskState::Running)], 6);
    assert!(!host.tasks().contains_key("unknown"));
}

#[test]
fn a_sandbox_is_collected_only_after_retention_out_of_the_set_and_unwatched() {
    let mut host = host_running_t1();
    host.recorded(&[update("t1", 2, TaskState::Finished)], 1_000);
    // Still watched, still desired.
    assert!(host.collectable(100, 5_000).is_empty());
    host.unwatch("t1");
    assert!(host.collectable(100, 5_000).is_empty(), "still in the set");
    host.apply(&set(2, vec![]), 2_000);
    assert!(host.collectable(100, 1_099).is_empty(), "within retention");
    assert_eq!(host.collectable(100, 1_100), vec!["t1".to_string()]);
    host.forget("t1");
    assert!(host.tasks().is_empty());
    assert!(host.collectable(100, 9_000).is_empty());
}

#[test]
fn nothing_is_collected_before_the_first_assignment_set() {
    let mut host: Host<()> = Host::default();
    host.hold_terminal("old", TaskState::Finished, false, 0);
    assert!(host.collectable(0, 1_000_000).is_empty());
    host.apply(&set(1, vec![]), 0);
    assert_eq!(host.collectable(0, 1_000_000), vec!["old".to_string()]);
}

#[test]
fn a_gone_executor_leaves_its_terminal_checkpoint_or_lost() {
    assert_eq!(
        executor_gone(Some(checkpoint(4, TaskState::Finished)), 3),
        Gone::Ended(Some(checkpoint(4, TaskState::Finished)))
    );
    assert_eq!(
        executor_gone(Some(checkpoint(4, TaskState::Finished)), 4),
        Gone::Ended(None),
        "already relayed"
    );
    assert_eq!(
        executor_gone(Some(checkpoint(4, TaskState::Running)), 1),
        Gone::Lost
    );
    assert_eq!(executor_gone(None, 0), Gone::Lost);
}

#[test]
fn the_next_sequence_number_is_one_past_every_known_one() {
    assert_eq!(next_seq([]), 1);
    assert_eq!(next_seq([0]), 1);
    assert_eq!(next_seq([3, 7, 5]), 8);
    let lost = Verdict::lost("t1", "gone".into()).into_update(next_seq([2, 9]), 123);
    assert_eq!((lost.seq, lost.state), (10, TaskState::Lost));
    assert_eq!(lost.exit_reason, Some(ExitReason::ExecutorLost));
    assert_eq!((lost.message.as_str(), lost.timestamp_ms), ("gone", 123));
}

#[test]
fn a_setup_failure_carries_its_error_as_reason_and_message() {
    let v = Verdict::setup_failed("t1", "no such user".into());
    assert_eq!(v.state, TaskState::Failed);
    assert_eq!(v.message, "no such user");
    assert_eq!(
        v.reason,
        ExitReason::SandboxSetupFailed {
            error: "no such user".into()
        }
    );
}

#[test]
fn a_status_from_before_the_start_is_dated_by_its_wall_clock_age() {
    assert_eq!(since_mono(10_000, 50_000, 47_000), 7_000);
    assert_eq!(since_mono(1_000, 50_000, 47_000), 0, "older than the boot");
    assert_eq!(since_mono(10_000, 50_000, 60_000), 10_000, "a clock step");
}

// ---------------------------------------------------------------- properties

const IDS: [&str; 5] = ["a", "b", "c", "d", "bad/id"];

#[derive(Clone, Debug)]
enum Op {
    /// An assignment set: (id, shutdown?, started?, exclusive?) per entry.
    Apply(Vec<(usize, bool, bool, bool)>),
    /// A status from a task's executor.
    Status(usize, TaskState),
    /// The watcher of a task ends.
    Unwatch(usize),
    /// The lease check, with the master silent `secs` of a 10 s lease.
    Lease(u64),
    /// Time passes, then the collector removes what it may.
    Collect(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let state = prop::sample::select(vec![
        TaskState::Starting,
        TaskState::Running,
        TaskState::Killing,
        TaskState::Finished,
        TaskState::Failed,
        TaskState::Killed,
    ]);
    prop_oneof![
        3 => prop::collection::vec((0..IDS.len(), any::<bool>(), any::<bool>(), any::<bool>()), 0..5)
            .prop_map(Op::Apply),
        3 => (0..IDS.len(), state).prop_map(|(i, s)| Op::Status(i, s)),
        1 => (0..IDS.len()).prop_map(Op::Unwatch),
        1 => (0u64..20).prop_map(Op::Lease),
        1 => (0u64..3_000).prop_map(Op::Collect),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Whatever the master sends and the executors report: a task is started at most
    /// once and killed at most once while held, an invalid id is never started, a
    /// verdict leaves its task held in the verdict's terminal state, a terminal state
    /// never changes, and the collector never takes a task that is live, desired or
    /// watched.
    #[test]
    fn random_sets_and_statuses_keep_every_rule(ops in prop::collection::vec(op(), 1..60)) {
        let mut host: Host<()> = Host::default();
        let mut now = 0u64;
        let mut version = 0u64;
        let mut started: HashSet<String> = HashSet::new();
        let mut killed: HashSet<String> = HashSet::new();
        let mut last_set: BTreeSet<String> = BTreeSet::new();
        for op in ops {
            let before: Vec<(String, TaskState)> = host
                .tasks()
                .iter()
                .filter(|(_, t)| t.state.is_terminal())
                .map(|(id, t)| (id.clone(), t.state))
                .collect();
            let actions = match op {
                Op::Apply(entries) => {
                    version += 1;
                    let mut assignments = Vec::new();
                    let mut seen = HashSet::new();
                    for (i, stop, was_started, exclusive) in entries {
                        if !seen.insert(i) {
                            continue;
                        }
                        let mut a = if stop { shutdown(IDS[i]) } else { running(IDS[i]) };
                        a.started = was_started;
                        a.exclusive = exclusive;
                        assignments.push(a);
                    }
                    last_set = assignments.iter().map(|a| a.task.task_id.clone()).collect();
                    host.apply(&set(version, assignments), now)
                }
                Op::Status(i, state) => {
                    if host.tasks().contains_key(IDS[i]) {
                        host.recorded(&[update(IDS[i], 1, state)], now);
                    }
                    Vec::new()
                }
                Op::Unwatch(i) => {
                    host.unwatch(IDS[i]);
                    Vec::new()
                }
                Op::Lease(secs) => host.lease_kills(Duration::from_secs(secs), Duration::from_secs(10)),
                Op::Collect(ms) => {
                    now += ms;
                    for id in host.collectable(1_000, now) {
                        let t = &host.tasks()[&id];
                        prop_assert!(t.state.is_terminal(), "{id} collected while {}", t.state);
                        prop_assert!(!last_set.contains(&id), "{id} collected while desired");
                        prop_assert!(host.watcher(&id).is_none(), "{id} collected while watched");
                        host.forget(&id);
                        started.remove(&id);
                        killed.remove(&id);
                    }
                    Vec::new()
                }
            };
            for action in actions {
                match action {
                    HostAction::Start(a) => {
                        let id = a.task.task_id.clone();
                        prop_assert!(is_valid_name(&id), "started {id}");
                        prop_assert!(started.insert(id.clone()), "{id} started twice");
                        prop_assert_eq!(host.tasks()[&id].state, TaskState::Assigned);
                        host.watch(&id, ());
                    }
                    HostAction::Kill { task_id, .. } => {
                        prop_assert!(killed.insert(task_id.clone()), "{task_id} killed twice");
                        prop_assert!(host.tasks()[&task_id].kill_requested);
                    }
                    HostAction::Refuse(v) | HostAction::ReportKilled(v) => {
                        prop_assert!(v.state.is_terminal());
                        prop_assert_eq!(host.tasks()[&v.task_id].state, v.state);
                    }
                }
            }
            for (id, state) in before {
                if let Some(t) = host.tasks().get(&id) {
                    prop_assert_eq!(t.state, state, "{} left its terminal state", id);
                }
            }
        }
    }
}
