//! The task-level rules of one executor, pure: what the task's state is, when it is
//! RUNNING, when a health check is due, when the kill escalation starts and moves on,
//! when the recovery timeout kills the task, and how the task ends (a kill reason
//! beats a health failure, which beats the processes' outcome).
//!
//! Events come in as method calls with the time (a process exited, a health check's
//! result, a kill request, a client connected or gone, the time passing in
//! [`Supervisor::tick`]); what is to be done goes out as [`Command`]s through the
//! [`Io`] the caller passes, which also answers the few questions a decision needs
//! right away (the pid of a process it starts, whether anything of the task is left,
//! whether health checks are snoozed). The runner implements [`Io`] with processes,
//! signals and the cgroup; the unit tests with a recording fake. The Thermos process
//! semantics are the [`Machine`]'s, the escalation's steps [`Escalation`]'s.

use std::time::Duration;

use drover_common::spec::{HealthCheck, HttpLifecycle};
use drover_common::state::{ExitReason, TaskState};
use drover_common::wire::{EscalationSteps, ProcessStatus};

use crate::health::{HealthError, HealthTracker, Verdict};
use crate::machine::{Escalation, Machine, Millis, Phase, Step};

/// How often the runner looks for processes that outlived their parent while it
/// waits for everything to exit.
pub const RESIDUAL_POLL: Millis = 10;

/// How long a task stays RUNNING before its executor counts as settled.
pub const SETTLE: Millis = 2_000;

/// The least time between a status and the next one that only reports changed
/// processes: changes in between are reported together, so a task whose processes
/// change all the time (thousands of short runs) costs at most one status a second
/// (issue 27). A change of the task's state is reported at once, with the list.
pub const PROCESS_REPORT_INTERVAL: Millis = 1_000;

/// How far ahead the loop sleeps when nothing is due.
const IDLE: Millis = 3_600_000;

/// What the supervisor asks the runner to do.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// Report a status (the runner numbers, checkpoints and publishes it).
    Emit {
        /// The task's state.
        state: TaskState,
        /// Set on the terminal status.
        exit_reason: Option<ExitReason>,
        /// Human-readable.
        message: String,
        /// The processes as the machine sees them now.
        processes: Vec<ProcessStatus>,
        /// Set on the terminal status of a task stopped by a kill or a failed health
        /// check: how long each escalation step took.
        escalation: Option<EscalationSteps>,
    },
    /// Run one health check; its result comes back through
    /// [`Supervisor::health_result`].
    CheckHealth,
    /// POST the lifecycle endpoint of this step ([`Step::PostGraceful`] or
    /// [`Step::PostShutdown`]); its answer comes back through [`Supervisor::posted`].
    Post(Step),
    /// SIGTERM the process groups and processes of these pids, then whatever else
    /// the task left behind.
    Terminate {
        /// The pids of the running processes to stop.
        pids: Vec<u32>,
    },
    /// The task has been RUNNING for [`SETTLE`]: drop the pages only starting needed.
    ReleaseStartupPages,
}

/// The runner's side: carries out commands and answers what a decision needs now.
pub trait Io {
    /// Starts process `idx`: its pid, or why it could not start.
    fn start(&mut self, idx: usize) -> Result<u32, ExitReason>;
    /// Whether anything of the task still runs (the cgroup is not empty; without
    /// one, a started process group is alive).
    fn residue_alive(&mut self) -> bool;
    /// Whether health checks are paused (the snooze file exists).
    fn snoozed(&mut self) -> bool;
    /// SIGKILLs everything of the task and waits until nothing is left where it can
    /// tell (the cgroup), for a bounded time; returns how long that took, and what
    /// could not be killed in that time (in words), if anything.
    fn kill_all(&mut self) -> (Millis, Option<String>);
    /// Carries out a command.
    fn command(&mut self, command: Command);
}

/// The settings the rules depend on.
#[derive(Clone, Debug)]
pub struct Config {
    /// The task's health check, if any.
    pub health_check: Option<HealthCheck>,
    /// The task's HTTP lifecycle (escalation steps 2 and 3), if any.
    pub http: Option<HttpLifecycle>,
    /// The task's `finalization_wait`.
    pub finalization_wait: Duration,
    /// No client connected this long: kill the task (`agent_lost`).
    pub recovery_timeout: Duration,
    /// No recovery timeout.
    pub standalone: bool,
    /// An announced task's drain delay: a failed health check is reported first
    /// (the master withdraws the instance) and the escalation waits this long.
    pub drain_delay: Duration,
}

struct Health {
    tracker: HealthTracker,
    interval: Millis,
    next_at: Millis,
    in_flight: bool,
}

/// The task's rules and state (see the module documentation).
pub struct Supervisor {
    machine: Machine,
    config: Config,
    health: Option<Health>,
    state: TaskState,
    escalation: Option<Escalation>,
    kill_reason: Option<ExitReason>,
    health_failure: Option<ExitReason>,
    clients: usize,
    clients_changed: Millis,
    terminal_delivered: bool,
    process_changed: bool,
    release_at: Option<Millis>,
    /// When the last status was emitted.
    last_emit: Option<Millis>,
    /// Processes changed since the last status ([`PROCESS_REPORT_INTERVAL`]).
    report_due: bool,
    /// What SIGKILL could not kill, said in the terminal status.
    kill_left: Option<String>,
    /// A failed health check's escalation waits until then (`Config::drain_delay`).
    drain_until: Option<Millis>,
}

impl Supervisor {
    /// A task in STARTING at time 0, nothing started yet.
    pub fn new(machine: Machine, config: Config) -> Supervisor {
        let health = config.health_check.as_ref().map(|hc| Health {
            tracker: HealthTracker::new(
                0,
                hc.initial_interval.get(),
                hc.max_consecutive_failures,
                hc.min_consecutive_successes,
            ),
            interval: (hc.interval.get().as_millis() as Millis).max(1),
            next_at: 0,
            in_flight: false,
        });
        Supervisor {
            machine,
            config,
            health,
            state: TaskState::Starting,
            escalation: None,
            kill_reason: None,
            health_failure: None,
            clients: 0,
            clients_changed: 0,
            terminal_delivered: false,
            process_changed: false,
            release_at: None,
            last_emit: None,
            report_due: false,
            kill_left: None,
            drain_until: None,
        }
    }

    /// The process machine (names, pids, statuses).
    pub fn machine(&self) -> &Machine {
        &self.machine
    }

    /// The task's current state.
    pub fn state(&self) -> TaskState {
        self.state
    }

    /// Whether a subscriber was sent the terminal status.
    pub fn terminal_delivered(&self) -> bool {
        self.terminal_delivered
    }

    /// Whether a client is connected.
    pub fn has_clients(&self) -> bool {
        self.clients > 0
    }

    /// Whether the checkpoint must be synced: it holds a terminal status that no
    /// connected agent has taken (the executor may wait for one for the recovery
    /// timeout, and that status must outlive a power loss).
    pub fn terminal_untaken(&self) -> bool {
        self.state.is_terminal() && self.clients == 0 && !self.terminal_delivered
    }

    /// The start: the first processes, then STARTING (with `ready`, what the sandbox
    /// is), and RUNNING at once for a task without a health check.
    pub fn begin(&mut self, now: Millis, ready: String, io: &mut dyn Io) {
        for idx in self.machine.to_start(now) {
            self.start_process(idx, now, io);
        }
        self.emit(now, TaskState::Starting, None, ready, io);
        if self.health.is_none() && self.machine.any_running() {
            self.emit(
                now,
                TaskState::Running,
                None,
                "processes started".into(),
                io,
            );
        }
    }

    /// Decides and acts on everything due at `now`; a change of the processes is
    /// reported as a status.
    pub fn tick(&mut self, now: Millis, io: &mut dyn Io) {
        if self.step(now, io) {
            self.report_due = true;
        }
        if self.report_due && !self.state.is_terminal() && now >= self.report_at() {
            self.emit_same(now, "processes changed".into(), io);
        }
    }

    /// When changed processes may be reported ([`PROCESS_REPORT_INTERVAL`]).
    fn report_at(&self) -> Millis {
        self.last_emit
            .map_or(0, |at| at.saturating_add(PROCESS_REPORT_INTERVAL))
    }

    /// [`Supervisor::tick`]'s work: returns whether processes changed.
    fn step(&mut self, now: Millis, io: &mut dyn Io) -> bool {
        let mut changed = std::mem::take(&mut self.process_changed);
        if self.state.is_terminal() {
            return false;
        }
        if self.release_at.is_some_and(|at| now >= at) {
            self.release_at = None;
            io.command(Command::ReleaseStartupPages);
        }
        if !self.config.standalone && self.clients == 0 && now >= self.recovery_deadline(now) {
            let after = self.config.recovery_timeout;
            self.kill_requested(
                now,
                ExitReason::AgentLost,
                &format!("the recovery timeout: no agent connected for {after:?}"),
                io,
            );
        }
        if self.drain_until.is_some_and(|at| now >= at) {
            self.drain_until = None;
            if self.escalation.is_none() {
                self.start_escalation(now, true, io);
                changed = true;
            }
        }
        // Start what the machine allows (regular processes only when no escalation
        // runs; final processes during finalization).
        if self.escalation.is_none() || self.machine.phase() == Phase::Finalizing {
            for _ in 0..4 {
                let starts = self.machine.to_start(now);
                if starts.is_empty() {
                    break;
                }
                for idx in starts {
                    self.start_process(idx, now, io);
                    changed = true;
                }
            }
        }
        if self.escalation.is_none() && self.machine.regular_done() {
            // Regular work is over: stop ephemeral processes, run final ones.
            self.start_escalation(now, false, io);
            for idx in self.machine.to_start(now) {
                self.start_process(idx, now, io);
            }
            changed = true;
        }
        if self.escalation.is_none() && self.drain_until.is_none() {
            self.maybe_check_health(now, io);
        }
        let residue_wait = self.waiting_on_residue();
        if let Some(mut esc) = self.escalation.take() {
            let mut step = None;
            if residue_wait && !io.residue_alive() {
                step = esc.on_all_exited(now);
            }
            if step.is_none() {
                step = esc.on_time(now);
            }
            self.escalation = Some(esc);
            if let Some(step) = step {
                self.perform(step, io);
                changed = true;
                if step == Step::Terminate {
                    for idx in self.machine.to_start(now) {
                        self.start_process(idx, now, io);
                    }
                }
            }
            let done = self.machine.phase() == Phase::Finalizing
                && self.machine.finals_done()
                && (self
                    .escalation
                    .as_ref()
                    .is_some_and(|e| e.deadline().is_none())
                    || !io.residue_alive());
            if done {
                self.finish(now, io);
                return false;
            }
        }
        changed
    }

    /// Process `idx` exited for `reason`.
    pub fn process_exited(&mut self, idx: usize, reason: ExitReason) {
        self.machine.exited(idx, reason);
        self.process_changed = true;
    }

    /// A health check's result: RUNNING once healthy, the escalation (and FAILED in
    /// the end) once unhealthy. Ignored once the escalation began.
    pub fn health_result(&mut self, now: Millis, result: Result<(), HealthError>, io: &mut dyn Io) {
        let Some(h) = self.health.as_mut() else {
            return;
        };
        h.in_flight = false;
        if self.escalation.is_some() || self.drain_until.is_some() || self.state.is_terminal() {
            return;
        }
        match h.tracker.record(now, result) {
            Verdict::Unchanged => {}
            Verdict::BecameHealthy => {
                if self.state == TaskState::Starting {
                    self.emit(
                        now,
                        TaskState::Running,
                        None,
                        "health check passed".into(),
                        io,
                    );
                }
            }
            Verdict::Unhealthy { last_error } => {
                let reason = ExitReason::HealthCheckFailed {
                    last_error: last_error.clone(),
                };
                self.stop_failing(
                    now,
                    reason,
                    format!("health check failed: {last_error}"),
                    io,
                );
            }
        }
    }

    /// The task broke a limit the executor enforces (`reason`, e.g. its disk;
    /// `message` says how): the escalation, and FAILED with `reason` in the end, as
    /// for a failed health check. Ignored once the escalation or that delay began.
    pub fn limit_exceeded(
        &mut self,
        now: Millis,
        reason: ExitReason,
        message: String,
        io: &mut dyn Io,
    ) {
        if self.escalation.is_some() || self.drain_until.is_some() || self.state.is_terminal() {
            return;
        }
        self.stop_failing(now, reason, message, io);
    }

    /// Stops a task that fails (`reason`; `what` says how): it will end FAILED with
    /// `reason`. An announced RUNNING task reports it first, so the master withdraws
    /// the instance, and is stopped `drain_delay` later; any other at once, with
    /// "`what`; stopping the task".
    fn stop_failing(&mut self, now: Millis, reason: ExitReason, what: String, io: &mut dyn Io) {
        self.health_failure = Some(reason.clone());
        let delay = self.config.drain_delay.as_millis() as Millis;
        if delay > 0 && self.state == TaskState::Running {
            self.emit(
                now,
                TaskState::Running,
                Some(reason),
                format!("{what}; withdrawn, stopping the task in {delay} ms"),
                io,
            );
            self.drain_until = Some(now + delay);
            return;
        }
        self.emit_same(now, format!("{what}; stopping the task"), io);
        self.start_escalation(now, true, io);
    }

    /// A kill was requested (`from` says by whom): KILLING and the escalation; the
    /// task will end KILLED with `reason`. Only the first request counts.
    pub fn kill_requested(&mut self, now: Millis, reason: ExitReason, from: &str, io: &mut dyn Io) {
        if self.state.is_terminal() || self.kill_reason.is_some() {
            return;
        }
        let message = format!("kill requested by {from}: {reason}");
        self.kill_reason = Some(reason);
        self.emit(now, TaskState::Killing, None, message, io);
        if self.escalation.is_none() {
            self.start_escalation(now, true, io);
        }
    }

    /// A lifecycle POST was answered (or failed): reported while the task runs.
    pub fn posted(&mut self, now: Millis, what: String, io: &mut dyn Io) {
        if !self.state.is_terminal() {
            self.emit_same(now, what, io);
        }
    }

    /// A socket client connected.
    pub fn client_connected(&mut self, now: Millis) {
        self.clients += 1;
        self.clients_changed = now;
    }

    /// A socket client went away.
    pub fn client_gone(&mut self, now: Millis) {
        self.clients = self.clients.saturating_sub(1);
        self.clients_changed = now;
    }

    /// A subscriber was sent the terminal status.
    pub fn delivered_terminal(&mut self) {
        self.terminal_delivered = true;
    }

    /// When the recovery timeout runs out (far ahead while a client is connected or
    /// standalone).
    pub fn recovery_deadline(&self, now: Millis) -> Millis {
        if self.clients > 0 || self.config.standalone {
            return now + IDLE;
        }
        self.clients_changed + self.config.recovery_timeout.as_millis() as Millis
    }

    /// When [`Supervisor::tick`] must run next at the latest.
    pub fn next_deadline(&self, now: Millis) -> Millis {
        let mut next = now + IDLE;
        if let Some(at) = self.drain_until {
            next = next.min(at);
        }
        if self.escalation.is_none() {
            if let Some(t) = self.machine.next_wakeup(now) {
                next = next.min(t);
            }
            // No health check while a failed one's drain delay runs.
            if let Some(h) = self.health.as_ref().filter(|_| self.drain_until.is_none()) {
                next = next.min(h.next_at);
            }
        } else if self.machine.phase() == Phase::Finalizing {
            if let Some(t) = self.machine.next_wakeup(now) {
                next = next.min(t);
            }
        }
        if let Some(e) = &self.escalation {
            if let Some(d) = e.deadline() {
                next = next.min(d);
            }
            if self.waiting_on_residue() {
                next = next.min(now + RESIDUAL_POLL);
            }
        }
        if !self.config.standalone {
            next = next.min(self.recovery_deadline(now));
        }
        if let Some(at) = self.release_at {
            next = next.min(at);
        }
        if self.report_due && !self.state.is_terminal() {
            next = next.min(self.report_at().max(now));
        }
        next
    }

    /// In the escalation, every tracked process exited but something it left behind
    /// (a shell's child, a daemon) may still run.
    fn waiting_on_residue(&self) -> bool {
        match &self.escalation {
            Some(e) if e.deadline().is_some() => match e.step() {
                Step::PostGraceful | Step::PostShutdown => !self.machine.any_regular_running(),
                _ => !self.machine.any_running(),
            },
            _ => false,
        }
    }

    fn finish(&mut self, now: Millis, io: &mut dyn Io) {
        self.machine.abandon_waiting();
        let (state, reason) = if let Some(r) = self.kill_reason.clone() {
            (TaskState::Killed, r)
        } else if let Some(r) = self.health_failure.clone() {
            (TaskState::Failed, r)
        } else {
            self.machine.outcome()
        };
        let mut message = match state {
            TaskState::Finished => "all processes succeeded".to_string(),
            _ => reason.to_string(),
        };
        if let Some(left) = &self.kill_left {
            message.push_str(&format!("; {left}"));
        }
        // The steps are reported for a stop, not for the finalization of a task
        // that ended on its own.
        let stopped = self.kill_reason.is_some() || self.health_failure.is_some();
        let escalation = match &self.escalation {
            Some(e) if stopped => Some(e.durations(now)),
            _ => None,
        };
        self.emit_with(now, state, Some(reason), message, escalation, io);
    }

    fn start_process(&mut self, idx: usize, now: Millis, io: &mut dyn Io) {
        match io.start(idx) {
            Ok(pid) => self.machine.started(idx, pid, now),
            Err(reason) => self.machine.failed_to_start(idx, reason, now),
        }
    }

    fn maybe_check_health(&mut self, now: Millis, io: &mut dyn Io) {
        if self.health.as_ref().is_none_or(|h| now < h.next_at) {
            return;
        }
        // Looked at only when a check is due (a stat per tick otherwise).
        let snoozed = io.snoozed();
        let Some(h) = self.health.as_mut() else {
            return;
        };
        // Drift-free: the next check is due one interval after this one was due.
        while h.next_at <= now {
            h.next_at += h.interval;
        }
        if h.in_flight || snoozed {
            return;
        }
        h.in_flight = true;
        io.command(Command::CheckHealth);
    }

    fn start_escalation(&mut self, now: Millis, use_http: bool, io: &mut dyn Io) {
        let (esc, step) = Escalation::start(
            now,
            self.config.http.as_ref(),
            use_http,
            self.config.finalization_wait,
        );
        self.escalation = Some(esc);
        self.perform(step, io);
    }

    fn perform(&mut self, step: Step, io: &mut dyn Io) {
        match step {
            Step::PostGraceful | Step::PostShutdown => {
                if self.config.http.is_some() {
                    io.command(Command::Post(step));
                }
            }
            Step::Terminate => {
                let mut targets = self.machine.finalize();
                for i in self.machine.stop_all() {
                    if !targets.contains(&i) {
                        targets.push(i);
                    }
                }
                let pids = self
                    .machine
                    .running_pids()
                    .into_iter()
                    .filter(|(idx, _)| targets.contains(idx))
                    .map(|(_, pid)| pid)
                    .collect();
                io.command(Command::Terminate { pids });
            }
            Step::KillAll => {
                self.machine.stop_all();
                self.machine.abandon_waiting();
                let (took, left) = io.kill_all();
                if let Some(e) = self.escalation.as_mut() {
                    e.killed(took);
                }
                self.kill_left = left;
            }
        }
    }

    /// Reports a status; entering RUNNING schedules the release of the startup pages.
    fn emit(
        &mut self,
        now: Millis,
        state: TaskState,
        exit_reason: Option<ExitReason>,
        message: String,
        io: &mut dyn Io,
    ) {
        self.emit_with(now, state, exit_reason, message, None, io);
    }

    /// [`Supervisor::emit`] with the escalation's step durations.
    fn emit_with(
        &mut self,
        now: Millis,
        state: TaskState,
        exit_reason: Option<ExitReason>,
        message: String,
        escalation: Option<EscalationSteps>,
        io: &mut dyn Io,
    ) {
        if state != self.state {
            self.release_at = (state == TaskState::Running).then_some(now + SETTLE);
        }
        self.state = state;
        // Every status carries the whole current list.
        self.last_emit = Some(now);
        self.report_due = false;
        io.command(Command::Emit {
            state,
            exit_reason,
            message,
            processes: self.machine.statuses(),
            escalation,
        });
    }

    /// Reports the current state again with the current process list.
    fn emit_same(&mut self, now: Millis, message: String, io: &mut dyn Io) {
        self.emit(now, self.state, None, message, io);
    }
}

#[cfg(test)]
#[path = "supervisor_tests.rs"]
mod tests;
