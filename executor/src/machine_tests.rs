//! Unit tests of the Thermos state machine and the escalation steps.

use super::*;
use drover_common::spec::{ProcessSpec, Resources};
use drover_common::units::{ByteSize, Duration as D};

/// A one-shot process `name` (also used by the supervisor's tests).
pub(crate) fn proc(name: &str) -> ProcessSpec {
    ProcessSpec {
        name: name.into(),
        cmdline: "true".into(),
        max_failures: 1,
        daemon: false,
        ephemeral: false,
        min_duration: D::from_secs(5),
        is_final: false,
    }
}

/// A task of `processes` ordered in the chains `order`.
pub(crate) fn task(processes: Vec<ProcessSpec>, order: &[&[&str]]) -> TaskSpec {
    TaskSpec {
        processes,
        order: order
            .iter()
            .map(|c| c.iter().map(|s| s.to_string()).collect())
            .collect(),
        resources: Resources {
            cpu: 1.0,
            ram: ByteSize::mib(64),
            disk: ByteSize::mib(64),
            ports: vec![],
            pids: None,
        },
        max_failures: 1,
        max_concurrency: 0,
        finalization_wait: D::from_secs(30),
        user: None,
        allow_root: false,
        env: Default::default(),
        artifacts: vec![],
        network: Default::default(),
    }
}

const OK: ExitReason = ExitReason::ExitCode { code: 0 };
const BAD: ExitReason = ExitReason::ExitCode { code: 3 };

#[test]
fn ordering_starts_the_next_process_only_after_the_previous_succeeded() {
    let mut m = Machine::new(&task(vec![proc("a"), proc("b")], &[&["a", "b"]])).unwrap();
    assert_eq!(m.to_start(0), vec![0]);
    m.started(0, 10, 0);
    assert!(m.to_start(1).is_empty());
    m.exited(0, OK);
    assert_eq!(m.to_start(2), vec![1]);
}

#[test]
fn failed_process_restarts_until_max_failures_no_faster_than_min_duration() {
    let mut p = proc("a");
    p.max_failures = 3;
    let mut m = Machine::new(&task(vec![p], &[])).unwrap();
    let mut now = 0;
    for run in 1..=3 {
        assert_eq!(m.to_start(now), vec![0], "run {run}");
        m.started(0, run, now);
        m.exited(0, BAD);
        if run < 3 {
            // Not before min_duration after the last start.
            assert!(m.to_start(now + 4_999).is_empty());
            assert_eq!(m.next_wakeup(now + 10), Some(now + 5_000));
            now += 5_000;
        }
    }
    assert!(m.to_start(now + 100_000).is_empty());
    assert!(m.regular_done());
    assert_eq!(m.outcome(), (TaskState::Failed, BAD));
    assert_eq!(m.statuses()[0].failures, 3);
    assert_eq!(m.statuses()[0].state, ProcessState::Failed);
}

#[test]
fn daemon_restarts_after_success() {
    let mut p = proc("d");
    p.daemon = true;
    let mut m = Machine::new(&task(vec![p], &[])).unwrap();
    m.started(0, 1, 0);
    m.exited(0, OK);
    assert!(!m.regular_done());
    assert_eq!(m.to_start(5_000), vec![0]);
}

#[test]
fn ephemeral_process_is_not_waited_for_and_is_stopped_at_finalization() {
    let mut e = proc("side");
    e.ephemeral = true;
    let mut m = Machine::new(&task(vec![proc("main"), e], &[])).unwrap();
    assert_eq!(m.to_start(0), vec![0, 1]);
    m.started(0, 1, 0);
    m.started(1, 2, 0);
    m.exited(0, OK);
    assert!(m.regular_done());
    assert_eq!(m.finalize(), vec![1]);
    m.exited(1, ExitReason::Signal { signal: 15 });
    assert_eq!(m.statuses()[1].state, ProcessState::Killed);
    assert!(m.finals_done());
    assert_eq!(m.outcome().0, TaskState::Finished);
}

#[test]
fn final_processes_run_in_order_only_during_finalization() {
    let mut f1 = proc("f1");
    f1.is_final = true;
    let mut f2 = proc("f2");
    f2.is_final = true;
    let mut m = Machine::new(&task(vec![proc("main"), f1, f2], &[&["f1", "f2"]])).unwrap();
    assert_eq!(m.to_start(0), vec![0]);
    m.started(0, 1, 0);
    m.exited(0, OK);
    assert!(m.regular_done());
    assert!(m.finalize().is_empty());
    assert!(!m.finals_done());
    assert_eq!(m.to_start(1), vec![1]);
    m.started(1, 2, 1);
    assert!(m.to_start(2).is_empty());
    m.exited(1, OK);
    assert_eq!(m.to_start(3), vec![2]);
    m.started(2, 3, 3);
    m.exited(2, OK);
    assert!(m.finals_done());
}

#[test]
fn max_concurrency_limits_running_processes() {
    let mut t = task(vec![proc("a"), proc("b"), proc("c")], &[]);
    t.max_concurrency = 2;
    let mut m = Machine::new(&t).unwrap();
    assert_eq!(m.to_start(0), vec![0, 1]);
    m.started(0, 1, 0);
    m.started(1, 2, 0);
    assert!(m.to_start(0).is_empty());
    m.exited(0, OK);
    assert_eq!(m.to_start(0), vec![2]);
}

#[test]
fn task_max_failures_counts_failed_processes() {
    let mut t = task(vec![proc("a"), proc("b")], &[]);
    t.max_failures = 2;
    let mut m = Machine::new(&t).unwrap();
    m.started(0, 1, 0);
    m.started(1, 2, 0);
    m.exited(0, BAD);
    // One failed process of two allowed: the task goes on.
    assert!(!m.regular_done());
    m.exited(1, OK);
    assert!(m.regular_done());
    assert_eq!(m.outcome().0, TaskState::Finished);
}

#[test]
fn first_failure_fails_task_and_finalize_stops_the_rest() {
    let mut m = Machine::new(&task(vec![proc("a"), proc("b")], &[])).unwrap();
    m.started(0, 1, 0);
    m.started(1, 2, 0);
    m.exited(0, BAD);
    assert!(m.regular_done());
    assert_eq!(m.finalize(), vec![1]);
    assert_eq!(m.outcome(), (TaskState::Failed, BAD));
}

#[test]
fn bad_order_is_rejected() {
    assert_eq!(
        Machine::new(&task(vec![proc("a")], &[&["a", "zz"]])).unwrap_err(),
        SpecError::UnknownProcess("zz".into())
    );
    assert!(matches!(
        Machine::new(&task(
            vec![proc("a"), proc("b")],
            &[&["a", "b"], &["b", "a"]]
        )),
        Err(SpecError::Cycle(_))
    ));
}

#[test]
fn escalation_without_http_starts_at_sigterm_then_sigkill() {
    let (mut e, first) = Escalation::start(100, None, true, D::from_secs(2).get());
    assert_eq!(first, Step::Terminate);
    assert_eq!(e.deadline(), Some(2_100));
    assert_eq!(e.on_time(2_099), None);
    assert_eq!(e.on_time(2_100), Some(Step::KillAll));
    assert_eq!(e.deadline(), None);
}

#[test]
fn escalation_with_http_posts_twice_with_their_waits() {
    let http = HttpLifecycle {
        port: "health".into(),
        graceful_shutdown_endpoint: "/quitquitquit".into(),
        shutdown_endpoint: "/abortabortabort".into(),
        graceful_shutdown_wait: D::from_secs(1),
        shutdown_wait: D::from_secs(2),
    };
    let (mut e, first) = Escalation::start(0, Some(&http), true, D::from_secs(3).get());
    assert_eq!(first, Step::PostGraceful);
    assert_eq!(e.on_time(1_000), Some(Step::PostShutdown));
    assert_eq!(e.deadline(), Some(3_000));
    // A late wakeup does not stretch the next wait.
    assert_eq!(e.on_time(3_040), Some(Step::Terminate));
    assert_eq!(e.deadline(), Some(6_000));
    // Each step lasted from when it was performed to when the next one was.
    assert_eq!(e.on_time(6_010), Some(Step::KillAll));
    e.killed(4);
    assert_eq!(
        e.durations(6_020),
        EscalationSteps {
            graceful_ms: Some(1_000),
            shutdown_ms: Some(2_040),
            term_ms: Some(2_970),
            kill_ms: Some(4),
        }
    );
}

#[test]
fn escalation_steps_skipped_or_not_reached_have_no_duration() {
    let http = HttpLifecycle {
        port: "health".into(),
        graceful_shutdown_endpoint: "/q".into(),
        shutdown_endpoint: "/a".into(),
        graceful_shutdown_wait: D::from_secs(5),
        shutdown_wait: D::from_secs(5),
    };
    let (mut e, _) = Escalation::start(100, Some(&http), true, D::from_secs(30).get());
    assert_eq!(e.on_all_exited(400), Some(Step::Terminate));
    // The task ended 50 ms into SIGTERM's wait.
    assert_eq!(
        e.durations(450),
        EscalationSteps {
            graceful_ms: Some(300),
            term_ms: Some(50),
            ..EscalationSteps::default()
        }
    );
}

#[test]
fn escalation_skips_to_sigterm_once_everything_exited() {
    let http = HttpLifecycle {
        port: "health".into(),
        graceful_shutdown_endpoint: "/q".into(),
        shutdown_endpoint: "/a".into(),
        graceful_shutdown_wait: D::from_secs(5),
        shutdown_wait: D::from_secs(5),
    };
    let (mut e, _) = Escalation::start(0, Some(&http), true, D::from_secs(30).get());
    assert_eq!(e.on_all_exited(300), Some(Step::Terminate));
    assert_eq!(e.on_all_exited(400), None);
}
