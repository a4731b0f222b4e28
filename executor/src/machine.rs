//! The Thermos process semantics as a pure state machine: given process exits and the
//! time, it decides which processes to start (ordering, max_concurrency,
//! min_duration), which to restart (max_failures, daemon), when the task's regular
//! work is over (ephemeral processes are not waited for, task max_failures), and
//! which final processes run during finalization. It never touches a process; the
//! runner does what it says. Time is milliseconds since the executor started.
//!
//! The kill escalation's step order, deadlines and step durations live here too
//! ([`Escalation`]).

use std::time::Duration;

use drover_common::spec::{HttpLifecycle, TaskSpec};
use drover_common::state::{ExitReason, TaskState};
use drover_common::wire::{EscalationSteps, ProcessState, ProcessStatus};

/// Milliseconds since the executor started.
pub type Millis = u64;

/// Why a task spec cannot be run.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpecError {
    #[error("task.order names process `{0}`, which is not in task.processes")]
    UnknownProcess(String),
    #[error("task.order mixes final process `{0}` with regular ones; order final processes only among themselves")]
    MixedFinal(String),
    #[error("task.order has a cycle through `{0}`")]
    Cycle(String),
    #[error("task.processes is empty; give the task at least one process")]
    NoProcesses,
}

/// One process definition as the machine needs it.
#[derive(Clone, Debug)]
struct Def {
    name: String,
    max_failures: u32,
    daemon: bool,
    ephemeral: bool,
    min_duration: Millis,
    is_final: bool,
    /// Indexes of the processes that must succeed before this one starts.
    after: Vec<usize>,
}

#[derive(Clone, Debug)]
struct Proc {
    state: ProcessState,
    pid: Option<u32>,
    runs: u32,
    failures: u32,
    last_start: Option<Millis>,
    last_exit: Option<ExitReason>,
    /// Told to stop: its exit counts as killed, not as a failure.
    stopping: bool,
}

/// Where the task is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Regular processes run.
    Active,
    /// Regular work is over or the task is being killed: running processes were told
    /// to stop and final processes run.
    Finalizing,
}

/// The process runner's decisions.
#[derive(Clone, Debug)]
pub struct Machine {
    defs: Vec<Def>,
    procs: Vec<Proc>,
    task_max_failures: u32,
    max_concurrency: u32,
    phase: Phase,
    /// The process whose failure failed the task.
    failed_by: Option<usize>,
}

impl Machine {
    /// Builds the machine from a task spec, checking the ordering constraints.
    pub fn new(task: &TaskSpec) -> Result<Machine, SpecError> {
        if task.processes.is_empty() {
            return Err(SpecError::NoProcesses);
        }
        let index = |name: &str| {
            task.processes
                .iter()
                .position(|p| p.name == name)
                .ok_or_else(|| SpecError::UnknownProcess(name.to_string()))
        };
        let mut defs: Vec<Def> = task
            .processes
            .iter()
            .map(|p| Def {
                name: p.name.clone(),
                max_failures: p.max_failures,
                daemon: p.daemon,
                ephemeral: p.ephemeral,
                min_duration: p.min_duration.get().as_millis() as Millis,
                is_final: p.is_final,
                after: Vec::new(),
            })
            .collect();
        for chain in &task.order {
            for pair in chain.windows(2) {
                let (a, b) = (index(&pair[0])?, index(&pair[1])?);
                if defs[a].is_final != defs[b].is_final {
                    let which = if defs[a].is_final { a } else { b };
                    return Err(SpecError::MixedFinal(defs[which].name.clone()));
                }
                if !defs[b].after.contains(&a) {
                    defs[b].after.push(a);
                }
            }
        }
        // A cycle would leave its processes waiting forever: reject it.
        let mut done = vec![false; defs.len()];
        loop {
            let mut progressed = false;
            for i in 0..defs.len() {
                if !done[i] && defs[i].after.iter().all(|&a| done[a]) {
                    done[i] = true;
                    progressed = true;
                }
            }
            if !progressed {
                break;
            }
        }
        if let Some(i) = done.iter().position(|d| !d) {
            return Err(SpecError::Cycle(defs[i].name.clone()));
        }
        let procs = defs
            .iter()
            .map(|_| Proc {
                state: ProcessState::Waiting,
                pid: None,
                runs: 0,
                failures: 0,
                last_start: None,
                last_exit: None,
                stopping: false,
            })
            .collect();
        Ok(Machine {
            defs,
            procs,
            task_max_failures: task.max_failures,
            max_concurrency: task.max_concurrency,
            phase: Phase::Active,
            failed_by: None,
        })
    }

    /// The current phase.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// A process's name.
    pub fn name(&self, idx: usize) -> &str {
        &self.defs[idx].name
    }

    /// How many processes the task has.
    pub fn len(&self) -> usize {
        self.defs.len()
    }

    /// Never true: a machine has at least one process.
    pub fn is_empty(&self) -> bool {
        self.defs.is_empty()
    }

    fn running_count(&self) -> usize {
        self.procs
            .iter()
            .filter(|p| p.state == ProcessState::Running)
            .count()
    }

    /// Whether process `i` may start at `now`, ignoring concurrency.
    fn startable(&self, i: usize, now: Millis) -> bool {
        let (def, p) = (&self.defs[i], &self.procs[i]);
        let in_phase = match self.phase {
            Phase::Active => !def.is_final,
            Phase::Finalizing => def.is_final,
        };
        in_phase
            && p.state == ProcessState::Waiting
            && def
                .after
                .iter()
                .all(|&a| self.procs[a].state == ProcessState::Succeeded)
            && p.last_start
                .is_none_or(|t| now >= t.saturating_add(def.min_duration))
    }

    /// The processes to start now, in spec order; the caller starts each and reports
    /// [`Machine::started`] or [`Machine::exited`] (a failed start is an exit).
    pub fn to_start(&self, now: Millis) -> Vec<usize> {
        let mut budget = match self.max_concurrency {
            0 => usize::MAX,
            n => (n as usize).saturating_sub(self.running_count()),
        };
        let mut out = Vec::new();
        for i in 0..self.defs.len() {
            if budget == 0 {
                break;
            }
            if self.startable(i, now) {
                out.push(i);
                budget -= 1;
            }
        }
        out
    }

    /// The earliest time a waiting process becomes startable by time alone
    /// (min_duration), if any.
    pub fn next_wakeup(&self, now: Millis) -> Option<Millis> {
        (0..self.defs.len())
            .filter(|&i| {
                let p = &self.procs[i];
                p.state == ProcessState::Waiting && p.last_start.is_some()
            })
            .filter_map(|i| {
                let at = self.procs[i].last_start? + self.defs[i].min_duration;
                (at > now).then_some(at)
            })
            .min()
    }

    /// Process `idx` was started with `pid` at `now`.
    pub fn started(&mut self, idx: usize, pid: u32, now: Millis) {
        let p = &mut self.procs[idx];
        p.state = ProcessState::Running;
        p.pid = Some(pid);
        p.runs += 1;
        p.last_start = Some(now);
    }

    /// Process `idx` could not be started at `now`: a failed run.
    pub fn failed_to_start(&mut self, idx: usize, reason: ExitReason, now: Millis) {
        let p = &mut self.procs[idx];
        p.runs += 1;
        p.last_start = Some(now);
        p.state = ProcessState::Running;
        self.exited(idx, reason);
    }

    /// Process `idx`'s current run ended with `reason`.
    pub fn exited(&mut self, idx: usize, reason: ExitReason) {
        let def = &self.defs[idx];
        let p = &mut self.procs[idx];
        if p.state != ProcessState::Running {
            return;
        }
        p.pid = None;
        let success = reason == ExitReason::ExitCode { code: 0 };
        p.last_exit = Some(reason);
        if p.stopping {
            p.state = if success {
                ProcessState::Succeeded
            } else {
                ProcessState::Killed
            };
            return;
        }
        if success {
            p.state = if def.daemon && !def.is_final {
                ProcessState::Waiting
            } else {
                ProcessState::Succeeded
            };
            return;
        }
        p.failures += 1;
        if def.max_failures != 0 && p.failures >= def.max_failures {
            p.state = ProcessState::Failed;
            if !def.is_final {
                let failed = self
                    .procs
                    .iter()
                    .zip(&self.defs)
                    .filter(|(p, d)| p.state == ProcessState::Failed && !d.is_final)
                    .count() as u32;
                if self.task_max_failures != 0 && failed >= self.task_max_failures {
                    self.failed_by.get_or_insert(idx);
                }
            }
        } else {
            p.state = ProcessState::Waiting;
        }
    }

    /// Whether the regular work is over: the task failed, or every regular
    /// non-ephemeral process succeeded or failed for good.
    pub fn regular_done(&self) -> bool {
        if self.failed_by.is_some() {
            return true;
        }
        self.defs
            .iter()
            .zip(&self.procs)
            .filter(|(d, _)| !d.is_final && !d.ephemeral)
            .all(|(_, p)| matches!(p.state, ProcessState::Succeeded | ProcessState::Failed))
    }

    /// Enters finalization: returns the running processes to stop (SIGTERM). Waiting
    /// regular processes will never start.
    pub fn finalize(&mut self) -> Vec<usize> {
        self.phase = Phase::Finalizing;
        let mut stop = Vec::new();
        for (i, (d, p)) in self.defs.iter().zip(self.procs.iter_mut()).enumerate() {
            if d.is_final {
                continue;
            }
            match p.state {
                ProcessState::Running => {
                    p.stopping = true;
                    stop.push(i);
                }
                ProcessState::Waiting => p.state = ProcessState::Killed,
                _ => {}
            }
        }
        stop
    }

    /// Marks every running process (final ones too) as being stopped; returns them.
    pub fn stop_all(&mut self) -> Vec<usize> {
        let mut stop = Vec::new();
        for (i, p) in self.procs.iter_mut().enumerate() {
            if p.state == ProcessState::Running {
                p.stopping = true;
                stop.push(i);
            }
        }
        stop
    }

    /// Whether any process is running.
    pub fn any_running(&self) -> bool {
        self.running_count() > 0
    }

    /// Whether any regular (non-final) process is running.
    pub fn any_regular_running(&self) -> bool {
        self.defs
            .iter()
            .zip(&self.procs)
            .any(|(d, p)| !d.is_final && p.state == ProcessState::Running)
    }

    /// In finalization: whether every final process is done, i.e. none runs and none
    /// can ever start (a predecessor did not succeed).
    pub fn finals_done(&self) -> bool {
        self.phase == Phase::Finalizing
            && !self.any_running()
            && self.to_start(Millis::MAX).is_empty()
    }

    /// Marks waiting final processes as killed (finalization ran out of time).
    pub fn abandon_waiting(&mut self) {
        for p in &mut self.procs {
            if p.state == ProcessState::Waiting {
                p.state = ProcessState::Killed;
            }
        }
    }

    /// How the task ended if nobody killed it: FAILED with the reason of the process
    /// that failed it, or FINISHED with exit code 0.
    pub fn outcome(&self) -> (TaskState, ExitReason) {
        match self.failed_by {
            Some(i) => (
                TaskState::Failed,
                self.procs[i]
                    .last_exit
                    .clone()
                    .unwrap_or(ExitReason::ExitCode { code: 1 }),
            ),
            None => (TaskState::Finished, ExitReason::ExitCode { code: 0 }),
        }
    }

    /// The pids of running processes.
    pub fn running_pids(&self) -> Vec<(usize, u32)> {
        self.procs
            .iter()
            .enumerate()
            .filter_map(|(i, p)| p.pid.map(|pid| (i, pid)))
            .collect()
    }

    /// Every process's status, for the wire.
    pub fn statuses(&self) -> Vec<ProcessStatus> {
        self.defs
            .iter()
            .zip(&self.procs)
            .map(|(d, p)| ProcessStatus {
                name: d.name.clone(),
                state: p.state,
                pid: p.pid,
                runs: p.runs,
                failures: p.failures,
                last_exit: p.last_exit.clone(),
            })
            .collect()
    }
}

/// A step of the kill escalation (seed 000).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// (2) POST the graceful shutdown endpoint.
    PostGraceful,
    /// (3) POST the shutdown endpoint.
    PostShutdown,
    /// (4) SIGTERM every process and run the final processes.
    Terminate,
    /// (5) SIGKILL everything in the cgroup.
    KillAll,
}

/// The escalation's position, the deadline of its current step and how long the
/// steps taken so far took.
#[derive(Clone, Debug)]
pub struct Escalation {
    step: Step,
    deadline: Millis,
    shutdown_wait: Millis,
    finalization_wait: Millis,
    done: bool,
    /// When the current step was performed.
    step_began: Millis,
    /// The steps before the current one (and SIGKILL's, once [`Escalation::killed`]).
    took: EscalationSteps,
}

fn ms(d: Duration) -> Millis {
    d.as_millis() as Millis
}

impl Escalation {
    /// Starts at `now`: at (2) with an HTTP lifecycle config and `use_http`, else at
    /// (4). Returns the escalation and the first step to perform.
    pub fn start(
        now: Millis,
        http: Option<&HttpLifecycle>,
        use_http: bool,
        finalization_wait: Duration,
    ) -> (Escalation, Step) {
        let (step, graceful_wait, shutdown_wait) = match http {
            Some(h) if use_http => (
                Step::PostGraceful,
                ms(h.graceful_shutdown_wait.get()),
                ms(h.shutdown_wait.get()),
            ),
            _ => (Step::Terminate, 0, 0),
        };
        let finalization_wait = ms(finalization_wait);
        let deadline = now
            + match step {
                Step::PostGraceful => graceful_wait,
                _ => finalization_wait,
            };
        (
            Escalation {
                step,
                deadline,
                shutdown_wait,
                finalization_wait,
                done: false,
                step_began: now,
                took: EscalationSteps::default(),
            },
            step,
        )
    }

    /// The current step.
    pub fn step(&self) -> Step {
        self.step
    }

    /// When the current step's wait ends; None once SIGKILL was sent.
    pub fn deadline(&self) -> Option<Millis> {
        (!self.done).then_some(self.deadline)
    }

    /// Moves on when the deadline passed; returns the step to perform now.
    pub fn on_time(&mut self, now: Millis) -> Option<Step> {
        if self.done || now < self.deadline {
            return None;
        }
        self.advance(now)
    }

    /// Every regular process exited before the wait ended: skip the HTTP steps and
    /// go to (4) (which runs the final processes); no step after (4) is skipped to.
    pub fn on_all_exited(&mut self, now: Millis) -> Option<Step> {
        match self.step {
            Step::PostGraceful | Step::PostShutdown if !self.done => {
                self.enter(Step::Terminate, now);
                self.deadline = now + self.finalization_wait;
                Some(Step::Terminate)
            }
            _ => None,
        }
    }

    /// SIGKILL (5), performed, took `ms` until nothing of the task was left.
    pub fn killed(&mut self, ms: Millis) {
        self.took.kill_ms = Some(ms);
    }

    /// How long each step taken took, the current one ending at `now` (SIGKILL's
    /// is what [`Escalation::killed`] recorded).
    pub fn durations(&self, now: Millis) -> EscalationSteps {
        let mut took = self.took;
        if self.step != Step::KillAll {
            *slot(&mut took, self.step) = Some(now.saturating_sub(self.step_began));
        }
        took
    }

    /// Ends the current step at `now` and makes `next` current.
    fn enter(&mut self, next: Step, now: Millis) {
        *slot(&mut self.took, self.step) = Some(now.saturating_sub(self.step_began));
        self.step = next;
        self.step_began = now;
    }

    fn advance(&mut self, now: Millis) -> Option<Step> {
        let (next, wait) = match self.step {
            Step::PostGraceful => (Step::PostShutdown, self.shutdown_wait),
            Step::PostShutdown => (Step::Terminate, self.finalization_wait),
            Step::Terminate => (Step::KillAll, 0),
            Step::KillAll => return None,
        };
        self.enter(next, now);
        // Waits add up from the deadline, not from when we noticed, so a late wakeup
        // does not stretch the escalation.
        self.deadline += wait;
        if next == Step::KillAll {
            self.done = true;
        }
        Some(next)
    }
}

/// Where a step's duration goes.
fn slot(took: &mut EscalationSteps, step: Step) -> &mut Option<Millis> {
    match step {
        Step::PostGraceful => &mut took.graceful_ms,
        Step::PostShutdown => &mut took.shutdown_ms,
        Step::Terminate => &mut took.term_ms,
        Step::KillAll => &mut took.kill_ms,
    }
}

#[cfg(test)]
#[path = "machine_tests.rs"]
pub(crate) mod tests;
