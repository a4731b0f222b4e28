//! Timers: the deadlines the core arms (transient states, THROTTLED penalties,
//! partition waits, the agent sweep, reconciliation rounds) and what each does when
//! it fires on `Event::Tick`. Every deadline is on the monotonic clock.

use std::cmp::Reverse;

use drover_common::state::{EventSource, ExitReason, MonoMillis, TaskState, UnixMillis};

use super::{Core, Now};

/// A timer; stale ones are recognised when they fire and ignored.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Timer {
    /// The task entered `state` (ASSIGNED or STARTING) and may be stuck there.
    Transient { task: String, state: TaskState },
    /// The task's THROTTLED penalty ends.
    Throttle { task: String },
    /// The task's agent was unreachable; the partition policy's wait is over.
    Partition { agent: String, task: String },
    /// Check every agent's last heartbeat.
    AgentSweep,
    /// Start a periodic (implicit) reconciliation.
    Reconcile,
    /// Next round of reconciliation `id`.
    ReconcileRound { id: u64 },
    /// The preemptor's reservation runs out.
    Reservation { task: String },
    /// The cron job's firing at `at_wall` (wall clock) is due.
    Cron { job: String, at_wall: UnixMillis },
    /// An updated instance of the job has been watched long enough.
    UpdateWatch { job: String },
    /// The task's kill was held for its `announce.drain_delay`; it goes now.
    Withdrawn { task: String },
    /// A drain's deadline passes or a replacement becomes healthy: the drain round
    /// that runs after every event looks again.
    Drain,
}

impl Core {
    pub(super) fn sweep_interval(&self) -> u64 {
        (self.cfg.agent_timeout_ms / 4)
            .min(self.cfg.heartbeat_interval_ms)
            .max(50)
    }

    pub(super) fn push_timer(&mut self, at: MonoMillis, timer: Timer) {
        self.timers.push(Reverse((at, timer)));
    }

    /// The earliest armed timer (monotonic).
    pub fn next_wake(&self) -> Option<MonoMillis> {
        self.timers.peek().map(|Reverse((at, _))| *at)
    }

    pub(super) fn tick(&mut self, now: Now) {
        while let Some(Reverse((at, _))) = self.timers.peek() {
            if *at > now.mono {
                break;
            }
            let Some(Reverse((_, timer))) = self.timers.pop() else {
                break;
            };
            self.fire(timer, now);
        }
    }

    pub(super) fn fire(&mut self, timer: Timer, now: Now) {
        match timer {
            Timer::Transient { task, state } => {
                let Some(t) = self.tasks.get(&task) else {
                    return;
                };
                if t.status.state != state {
                    return;
                }
                // Stuck on an agent that is unreachable: the guard decides, as for
                // the agent's loss.
                let on_unreachable = t
                    .agent
                    .as_ref()
                    .and_then(|a| self.agent_idx.get(a))
                    .is_some_and(|&idx| !self.agents[idx as usize].reachable);
                let again = Timer::Transient {
                    task: task.clone(),
                    state,
                };
                if on_unreachable && !self.loss_may_go(&task, again, now) {
                    return;
                }
                self.lose_task(
                    &task,
                    ExitReason::TransientStateTimeout { state },
                    EventSource::Master,
                    now,
                );
            }
            Timer::Throttle { task } => {
                let Some(t) = self.tasks.get_mut(&task) else {
                    return;
                };
                if t.status.state != TaskState::Throttled {
                    return;
                }
                if t.status
                    .transition(
                        TaskState::Pending,
                        None,
                        now.wall,
                        EventSource::Master,
                        "penalty over",
                    )
                    .is_ok()
                {
                    self.mark(&task);
                    self.queue.push_back(task);
                }
            }
            Timer::Partition { agent, task } => {
                let Some(&idx) = self.agent_idx.get(&agent) else {
                    return;
                };
                if self.agents[idx as usize].reachable {
                    return;
                }
                let Some(t) = self.tasks.get(&task) else {
                    return;
                };
                if t.agent.as_deref() != Some(agent.as_str()) || t.status.state.is_terminal() {
                    return;
                }
                let again = Timer::Partition {
                    agent,
                    task: task.clone(),
                };
                if !self.loss_may_go(&task, again, now) {
                    return;
                }
                self.lose_task(&task, ExitReason::AgentLost, EventSource::Master, now);
            }
            Timer::AgentSweep => {
                self.sweep_agents(now);
                self.push_timer(now.mono + self.sweep_interval(), Timer::AgentSweep);
            }
            Timer::Reconcile => {
                self.start_reconciliation(now);
                self.push_timer(now.mono + self.cfg.reconcile_interval_ms, Timer::Reconcile);
            }
            Timer::ReconcileRound { id } => self.reconcile_round(id, now),
            Timer::Reservation { task } => self.reservation_expired(&task, now),
            Timer::Cron { job, at_wall } => self.cron_timer(&job, at_wall, now),
            Timer::UpdateWatch { job } => self.poke_update(&job),
            Timer::Drain => self.drains.fired(),
            Timer::Withdrawn { task } => self.release_kill(&task),
        }
    }
}
