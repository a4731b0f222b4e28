//! Unit tests of the task-level rules: a fake [`Io`] records the commands and answers
//! with made-up pids; no process, signal or cgroup is involved.

use super::*;
use crate::machine::tests::{proc, task};
use drover_common::spec::ProcessSpec;

const OK: ExitReason = ExitReason::ExitCode { code: 0 };
const BAD: ExitReason = ExitReason::ExitCode { code: 3 };

fn config() -> Config {
    Config {
        health_check: None,
        http: None,
        finalization_wait: Duration::from_secs(30),
        recovery_timeout: Duration::from_secs(60),
        standalone: false,
        drain_delay: Duration::ZERO,
    }
}

/// An HTTP health check: every 1 s, failures ignored for the first 10 s, more than
/// one failure in a row is fatal, one success is healthy.
fn health_check() -> HealthCheck {
    serde_json::from_str(
        r#"{"interval":"1s","initial_interval":"10s","max_consecutive_failures":1,"min_consecutive_successes":1}"#,
    )
    .unwrap()
}

fn http() -> HttpLifecycle {
    serde_json::from_str(r#"{"graceful_shutdown_wait":"5s","shutdown_wait":"5s"}"#).unwrap()
}

/// Records commands; process `idx` gets pid `100 + idx` unless it is in `unstartable`;
/// a SIGKILL of everything is counted in `kills` and takes `kill_takes`.
#[derive(Default)]
struct Fake {
    commands: Vec<Command>,
    started: Vec<usize>,
    unstartable: Vec<usize>,
    residue: bool,
    snoozed: bool,
    kills: usize,
    kill_takes: Millis,
    /// What SIGKILL leaves behind, in words.
    kill_leaves: Option<String>,
}

impl Io for Fake {
    fn start(&mut self, idx: usize) -> Result<u32, ExitReason> {
        self.started.push(idx);
        if self.unstartable.contains(&idx) {
            return Err(ExitReason::FailedToStart {
                process: format!("p{idx}"),
                error: "binary not found".into(),
            });
        }
        Ok(100 + idx as u32)
    }
    fn residue_alive(&mut self) -> bool {
        self.residue
    }
    fn snoozed(&mut self) -> bool {
        self.snoozed
    }
    fn kill_all(&mut self) -> (Millis, Option<String>) {
        self.kills += 1;
        (self.kill_takes, self.kill_leaves.clone())
    }
    fn command(&mut self, command: Command) {
        self.commands.push(command);
    }
}

impl Fake {
    /// The states of the emitted statuses, in order.
    fn states(&self) -> Vec<TaskState> {
        self.commands
            .iter()
            .filter_map(|c| match c {
                Command::Emit { state, .. } => Some(*state),
                _ => None,
            })
            .collect()
    }

    /// The escalation steps on the last emitted status.
    fn last_escalation(&self) -> Option<EscalationSteps> {
        self.commands.iter().rev().find_map(|c| match c {
            Command::Emit { escalation, .. } => Some(*escalation),
            _ => None,
        })?
    }

    /// The exit reason of the last emitted status.
    fn last_reason(&self) -> Option<ExitReason> {
        self.commands.iter().rev().find_map(|c| match c {
            Command::Emit { exit_reason, .. } => Some(exit_reason.clone()),
            _ => None,
        })?
    }

    fn count(&self, wanted: &Command) -> usize {
        self.commands.iter().filter(|c| *c == wanted).count()
    }

    fn has(&self, pred: impl Fn(&Command) -> bool) -> bool {
        self.commands.iter().any(pred)
    }
}

fn supervisor(processes: Vec<ProcessSpec>, config: Config) -> Supervisor {
    Supervisor::new(Machine::new(&task(processes, &[])).unwrap(), config)
}

/// A supervisor of one process `a` with a client connected, begun at time 0.
fn begun_with_one_process(config: Config) -> (Supervisor, Fake) {
    let mut s = supervisor(vec![proc("a")], config);
    let mut io = Fake::default();
    s.client_connected(0);
    s.begin(0, "ready".into(), &mut io);
    (s, io)
}

/// Ticks every 10 ms from `from` until the task is terminal or `until` passes.
fn run_until(s: &mut Supervisor, io: &mut Fake, from: Millis, until: Millis) -> Millis {
    let mut now = from;
    while now <= until && !s.state().is_terminal() {
        s.tick(now, io);
        now += 10;
    }
    now
}

#[test]
fn a_one_shot_task_is_running_at_once_and_finishes_when_its_process_succeeds() {
    let (mut s, mut io) = begun_with_one_process(config());
    assert_eq!(io.started, vec![0]);
    assert_eq!(io.states(), vec![TaskState::Starting, TaskState::Running]);
    s.process_exited(0, OK);
    run_until(&mut s, &mut io, 5, 100);
    assert_eq!(s.state(), TaskState::Finished);
    assert_eq!(io.last_reason(), Some(OK));
    assert!(
        io.has(|c| matches!(c, Command::Terminate { pids } if pids.is_empty())),
        "finalization stops what is left, and no process of the task still runs"
    );
}

#[test]
fn a_process_that_cannot_start_fails_the_task() {
    let mut s = supervisor(vec![proc("a")], config());
    let mut io = Fake {
        unstartable: vec![0],
        ..Fake::default()
    };
    s.client_connected(0);
    s.begin(0, "ready".into(), &mut io);
    assert_eq!(
        io.states(),
        vec![TaskState::Starting],
        "nothing runs: no RUNNING"
    );
    run_until(&mut s, &mut io, 1, 100);
    assert_eq!(s.state(), TaskState::Failed);
    assert!(matches!(
        io.last_reason(),
        Some(ExitReason::FailedToStart { .. })
    ));
}

#[test]
fn a_kill_request_beats_the_process_outcome_and_only_the_first_counts() {
    let (mut s, mut io) = begun_with_one_process(config());
    s.kill_requested(5, ExitReason::KilledByRequest, "SIGTERM", &mut io);
    assert_eq!(s.state(), TaskState::Killing);
    assert!(
        io.has(|c| *c == Command::Terminate { pids: vec![100] }),
        "without an HTTP lifecycle the escalation starts at SIGTERM"
    );
    s.kill_requested(6, ExitReason::AgentLost, "a socket client", &mut io);
    assert_eq!(
        io.states()
            .iter()
            .filter(|s| **s == TaskState::Killing)
            .count(),
        1
    );
    // The process dies of the SIGTERM with a failure of its own.
    s.process_exited(0, ExitReason::Signal { signal: 15 });
    run_until(&mut s, &mut io, 10, 100);
    assert_eq!(s.state(), TaskState::Killed);
    assert_eq!(io.last_reason(), Some(ExitReason::KilledByRequest));
    let emitted = io.commands.len();
    s.kill_requested(200, ExitReason::KilledByRequest, "SIGTERM", &mut io);
    s.tick(300, &mut io);
    assert_eq!(
        io.commands.len(),
        emitted,
        "a terminal task ignores everything"
    );
}

#[test]
fn a_health_failure_beats_the_process_outcome_and_a_kill_beats_both() {
    for kill_too in [false, true] {
        let mut cfg = config();
        cfg.health_check = Some(health_check());
        let mut s = supervisor(vec![proc("a")], cfg);
        let mut io = Fake::default();
        s.client_connected(0);
        s.begin(0, "ready".into(), &mut io);
        assert_eq!(
            io.states(),
            vec![TaskState::Starting],
            "RUNNING waits for health"
        );
        s.tick(0, &mut io);
        assert_eq!(io.count(&Command::CheckHealth), 1);
        s.health_result(1, Ok(()), &mut io);
        assert_eq!(s.state(), TaskState::Running);
        // After the initial interval, two failures in a row are one too many.
        s.health_result(11_000, Err(HealthError::refused(1)), &mut io);
        assert_eq!(s.state(), TaskState::Running);
        s.health_result(12_000, Err(HealthError::refused(2)), &mut io);
        assert!(io.has(|c| matches!(c, Command::Terminate { .. })));
        assert_eq!(
            s.state(),
            TaskState::Running,
            "no KILLING for a health failure"
        );
        if kill_too {
            s.kill_requested(12_001, ExitReason::KilledByRequest, "SIGTERM", &mut io);
        }
        s.process_exited(0, ExitReason::Signal { signal: 15 });
        run_until(&mut s, &mut io, 12_010, 13_000);
        let (state, reason) = if kill_too {
            (TaskState::Killed, ExitReason::KilledByRequest)
        } else {
            (
                TaskState::Failed,
                ExitReason::HealthCheckFailed {
                    last_error: "connect to 127.0.0.1:2: connection refused".into(),
                },
            )
        };
        assert_eq!(s.state(), state);
        assert_eq!(io.last_reason(), Some(reason));
    }
}

#[test]
fn health_checks_run_on_a_fixed_schedule_one_at_a_time_and_not_while_snoozed() {
    let mut cfg = config();
    cfg.health_check = Some(health_check());
    let (mut s, mut io) = begun_with_one_process(cfg);
    s.tick(0, &mut io);
    assert_eq!(io.count(&Command::CheckHealth), 1);
    assert_eq!(s.next_deadline(1), 1_000);
    // Still in flight a second later: not started twice; the schedule moves on.
    s.tick(1_000, &mut io);
    assert_eq!(io.count(&Command::CheckHealth), 1);
    s.health_result(1_100, Ok(()), &mut io);
    // A late wakeup does not shift the schedule.
    s.tick(2_700, &mut io);
    assert_eq!(io.count(&Command::CheckHealth), 2);
    assert_eq!(s.next_deadline(2_700), 3_000);
    s.health_result(2_800, Ok(()), &mut io);
    io.snoozed = true;
    s.tick(3_000, &mut io);
    assert_eq!(io.count(&Command::CheckHealth), 2, "snoozed: skipped");
}

#[test]
fn the_recovery_timeout_kills_the_task_as_agent_lost_only_without_a_client() {
    let mut s = supervisor(vec![proc("a")], config());
    let mut io = Fake::default();
    s.begin(0, "ready".into(), &mut io);
    s.client_connected(1_000);
    s.tick(100_000, &mut io);
    assert_eq!(s.state(), TaskState::Running, "a client is connected");
    s.client_gone(100_000);
    assert_eq!(s.next_deadline(100_001), 160_000);
    s.tick(159_999, &mut io);
    assert_eq!(s.state(), TaskState::Running);
    s.tick(160_000, &mut io);
    assert_eq!(s.state(), TaskState::Killing);
    s.process_exited(0, ExitReason::Signal { signal: 15 });
    run_until(&mut s, &mut io, 160_010, 161_000);
    assert_eq!(s.state(), TaskState::Killed);
    assert_eq!(io.last_reason(), Some(ExitReason::AgentLost));
    assert!(s.terminal_untaken(), "no agent took the terminal status");
    s.client_connected(161_000);
    assert!(!s.terminal_untaken());
    s.delivered_terminal();
    assert!(s.terminal_delivered());
}

#[test]
fn standalone_has_no_recovery_timeout() {
    let mut cfg = config();
    cfg.standalone = true;
    let mut s = supervisor(vec![proc("a")], cfg);
    let mut io = Fake::default();
    s.begin(0, "ready".into(), &mut io);
    s.tick(10_000_000, &mut io);
    assert_eq!(s.state(), TaskState::Running);
}

#[test]
fn the_http_lifecycle_posts_then_skips_ahead_once_everything_exited() {
    let mut cfg = config();
    cfg.http = Some(http());
    let (mut s, mut io) = begun_with_one_process(cfg);
    s.kill_requested(100, ExitReason::KilledByRequest, "a socket client", &mut io);
    assert!(io.has(|c| *c == Command::Post(Step::PostGraceful)));
    s.posted(150, "POST /quitquitquit answered 200".into(), &mut io);
    assert_eq!(io.states().last(), Some(&TaskState::Killing));
    // Still running at the graceful wait's end: the shutdown POST.
    s.tick(5_100, &mut io);
    assert!(io.has(|c| *c == Command::Post(Step::PostShutdown)));
    // The process exits, something it left runs on: wait for it, polling.
    s.process_exited(0, OK);
    io.residue = true;
    s.tick(5_200, &mut io);
    assert_eq!(s.next_deadline(5_200), 5_200 + RESIDUAL_POLL);
    assert!(!io.has(|c| matches!(c, Command::Terminate { .. })));
    io.residue = false;
    run_until(&mut s, &mut io, 5_210, 6_000);
    assert!(
        io.has(|c| matches!(c, Command::Terminate { .. })),
        "skipped ahead to SIGTERM"
    );
    assert_eq!(s.state(), TaskState::Killed);
    assert_eq!(io.kills, 0, "nothing was left to SIGKILL");
    // Graceful wait from 100 to 5,100, the shutdown POST until everything exited,
    // SIGTERM until the task ended: no SIGKILL step.
    let steps = io
        .last_escalation()
        .expect("the steps on the KILLED status");
    assert_eq!(steps.graceful_ms, Some(5_000));
    assert!(steps.shutdown_ms.is_some_and(|ms| ms >= 100), "{steps:?}");
    assert!(steps.term_ms.is_some(), "{steps:?}");
    assert_eq!(steps.kill_ms, None);
}

#[test]
fn what_outlives_finalization_wait_is_killed() {
    let mut s = supervisor(vec![proc("a")], config());
    let mut io = Fake {
        residue: true,
        ..Fake::default()
    };
    s.client_connected(0);
    s.begin(0, "ready".into(), &mut io);
    s.kill_requested(0, ExitReason::KilledByRequest, "SIGTERM", &mut io);
    s.process_exited(0, BAD);
    io.kill_takes = 7;
    s.tick(29_990, &mut io);
    assert_eq!(io.kills, 0);
    s.tick(30_000, &mut io);
    assert_eq!(io.kills, 1);
    assert_eq!(s.state(), TaskState::Killed);
    // SIGTERM's whole wait, then SIGKILL as long as the runner said it took.
    assert_eq!(
        io.last_escalation(),
        Some(EscalationSteps {
            term_ms: Some(30_000),
            kill_ms: Some(7),
            ..EscalationSteps::default()
        })
    );
}

#[test]
fn what_sigkill_cannot_kill_is_said_in_the_terminal_status() {
    let mut s = supervisor(vec![proc("a")], config());
    let mut io = Fake {
        residue: true,
        kill_leaves: Some("3 processes of the task survived 10s of SIGKILL".into()),
        ..Fake::default()
    };
    s.client_connected(0);
    s.begin(0, "ready".into(), &mut io);
    s.kill_requested(0, ExitReason::KilledByRequest, "SIGTERM", &mut io);
    s.process_exited(0, BAD);
    s.tick(30_000, &mut io);
    assert_eq!(s.state(), TaskState::Killed, "the task ends all the same");
    let message = io
        .commands
        .iter()
        .rev()
        .find_map(|c| match c {
            Command::Emit { message, .. } => Some(message.clone()),
            _ => None,
        })
        .unwrap();
    assert!(
        message.ends_with("; 3 processes of the task survived 10s of SIGKILL"),
        "{message}"
    );
}

#[test]
fn a_task_that_ends_on_its_own_reports_no_escalation_steps() {
    // Finalization stops an ephemeral process: the same steps, but no stop.
    let mut eph = proc("helper");
    eph.ephemeral = true;
    let mut s = supervisor(vec![proc("a"), eph], config());
    let mut io = Fake::default();
    s.client_connected(0);
    s.begin(0, "ready".into(), &mut io);
    s.process_exited(0, OK);
    s.tick(10, &mut io);
    s.process_exited(1, ExitReason::Signal { signal: 15 });
    run_until(&mut s, &mut io, 20, 1_000);
    assert_eq!(s.state(), TaskState::Finished);
    assert!(io.has(|c| matches!(c, Command::Terminate { .. })));
    assert_eq!(io.last_escalation(), None);
}

#[test]
fn a_failed_health_check_reports_the_steps_of_its_stop() {
    let config = Config {
        health_check: Some(health_check()),
        ..config()
    };
    let (mut s, mut io) = begun_with_one_process(config);
    s.health_result(11_000, Err(HealthError::refused(1)), &mut io);
    s.health_result(12_000, Err(HealthError::refused(1)), &mut io);
    s.process_exited(0, ExitReason::Signal { signal: 15 });
    run_until(&mut s, &mut io, 12_250, 13_000);
    assert_eq!(s.state(), TaskState::Failed);
    let steps = io
        .last_escalation()
        .expect("the steps on the FAILED status");
    assert_eq!(steps.graceful_ms, None, "no HTTP lifecycle");
    assert_eq!(steps.term_ms, Some(250));
    assert_eq!(steps.kill_ms, None);
}

#[test]
fn running_for_a_while_releases_the_startup_pages_once() {
    let (mut s, mut io) = begun_with_one_process(config());
    assert_eq!(s.next_deadline(0), SETTLE);
    s.tick(SETTLE - 1, &mut io);
    assert_eq!(io.count(&Command::ReleaseStartupPages), 0);
    s.tick(SETTLE, &mut io);
    s.tick(SETTLE + 10, &mut io);
    assert_eq!(io.count(&Command::ReleaseStartupPages), 1);
}

#[test]
fn changed_processes_are_reported_at_most_once_per_interval() {
    let procs: Vec<ProcessSpec> = (0..50).map(|i| proc(&format!("p{i}"))).collect();
    let mut s = supervisor(procs, config());
    let mut io = Fake::default();
    s.client_connected(0);
    s.begin(0, "ready".into(), &mut io);
    let statuses = |io: &Fake| io.states().len();
    let before = statuses(&io);
    // 49 processes end one after another within one interval: one status at most.
    for i in 0..49 {
        s.process_exited(i, OK);
        s.tick(1 + i as Millis * 10, &mut io);
    }
    assert!(statuses(&io) <= before + 1, "{:?}", io.states());
    // The change is not lost: reported once the interval is over.
    let due = s.next_deadline(PROCESS_REPORT_INTERVAL - 1);
    assert!(due <= 2 * PROCESS_REPORT_INTERVAL, "{due}");
    s.tick(due, &mut io);
    let after = statuses(&io);
    assert!(after > before, "{:?}", io.states());
    // Nothing changed since: nothing more.
    s.tick(due + 5 * PROCESS_REPORT_INTERVAL, &mut io);
    assert_eq!(statuses(&io), after);
}

/// A process that exits because the kernel refused its write (`EDQUOT`): the runner
/// reports the limit first, then the exit, and the task ends FAILED with
/// `disk_limit_exceeded`, not with the process's exit code.
#[test]
fn a_disk_limit_reported_before_the_exit_it_caused_is_the_tasks_end() {
    let (mut s, mut io) = begun_with_one_process(config());
    let reason = ExitReason::DiskLimitExceeded {
        used_bytes: 9 << 20,
        limit_bytes: 8 << 20,
    };
    s.limit_exceeded(5, reason.clone(), "over".into(), &mut io);
    s.process_exited(0, BAD);
    run_until(&mut s, &mut io, 10, 100);
    assert_eq!(s.state(), TaskState::Failed);
    assert_eq!(io.last_reason(), Some(reason));
}

#[test]
fn an_announced_task_reports_its_health_failure_and_stops_after_the_drain_delay() {
    let config = Config {
        health_check: Some(health_check()),
        drain_delay: Duration::from_secs(2),
        ..config()
    };
    let (mut s, mut io) = begun_with_one_process(config);
    s.tick(0, &mut io);
    s.health_result(1, Ok(()), &mut io);
    assert_eq!(s.state(), TaskState::Running);
    s.health_result(11_000, Err(HealthError::refused(1)), &mut io);
    s.health_result(12_000, Err(HealthError::refused(2)), &mut io);
    // Said at once: a RUNNING status carrying the reason (the master withdraws).
    assert_eq!(s.state(), TaskState::Running);
    assert_eq!(
        io.last_reason(),
        Some(ExitReason::HealthCheckFailed {
            last_error: "connect to 127.0.0.1:2: connection refused".into()
        })
    );
    assert!(!io.has(|c| matches!(c, Command::Terminate { .. })));
    s.tick(12_000, &mut io);
    let next = s.next_deadline(12_000);
    assert!(
        next > 12_000 && next <= 14_000,
        "wakes for the delay's end, never spins: {next}"
    );
    let checks = io.count(&Command::CheckHealth);
    run_until(&mut s, &mut io, 12_010, 13_990);
    assert!(
        !io.has(|c| matches!(c, Command::Terminate { .. })),
        "nothing stopped during the drain delay"
    );
    assert_eq!(io.count(&Command::CheckHealth), checks, "no more checks");
    s.tick(14_000, &mut io);
    assert!(io.has(|c| matches!(c, Command::Terminate { .. })));
    s.process_exited(0, ExitReason::Signal { signal: 15 });
    run_until(&mut s, &mut io, 14_010, 15_000);
    assert_eq!(s.state(), TaskState::Failed);
    assert_eq!(
        io.last_reason(),
        Some(ExitReason::HealthCheckFailed {
            last_error: "connect to 127.0.0.1:2: connection refused".into()
        })
    );
}

#[test]
fn an_announced_task_over_its_disk_limit_reports_it_and_stops_after_the_drain_delay() {
    let config = Config {
        drain_delay: Duration::from_secs(2),
        ..config()
    };
    let (mut s, mut io) = begun_with_one_process(config);
    run_until(&mut s, &mut io, 0, 100);
    assert_eq!(s.state(), TaskState::Running);
    let reason = ExitReason::DiskLimitExceeded {
        used_bytes: 2,
        limit_bytes: 1,
    };
    s.limit_exceeded(1_000, reason.clone(), "over".into(), &mut io);
    // Said at once: a RUNNING status carrying the reason (the master withdraws).
    assert_eq!(s.state(), TaskState::Running);
    assert_eq!(io.last_reason(), Some(reason.clone()));
    run_until(&mut s, &mut io, 1_000, 2_990);
    assert!(
        !io.has(|c| matches!(c, Command::Terminate { .. })),
        "nothing stopped during the drain delay"
    );
    s.tick(3_000, &mut io);
    assert!(io.has(|c| matches!(c, Command::Terminate { .. })));
    s.process_exited(0, ExitReason::Signal { signal: 15 });
    run_until(&mut s, &mut io, 3_010, 4_000);
    assert_eq!(s.state(), TaskState::Failed);
    assert_eq!(io.last_reason(), Some(reason));
}
