//! Reconciliation: an agent's full task set against what the master expects there
//! (a task missing past the grace is LOST), and Mesos's periodic reconciliation
//! with backoff until every agent has reported.

use std::collections::HashMap;

use drover_common::state::{EventSource, ExitReason, MonoMillis, TaskState};
use drover_common::wire;

use super::timers::Timer;
use super::{Core, Now};

/// A reconciliation in progress (Mesos's algorithm).
#[derive(Clone, Debug)]
pub(super) struct Reconciliation {
    id: u64,
    /// When it started (monotonic).
    start: MonoMillis,
    backoff_ms: u64,
}

impl Core {
    /// Compares the agent's full task set with what the master expects there.
    pub(super) fn reconcile_agent(
        &mut self,
        idx: u32,
        reports: &[wire::AgentTaskReport],
        agent_version: u64,
        now: Now,
    ) {
        let held: HashMap<&str, TaskState> = reports
            .iter()
            .map(|r| (r.task_id.as_str(), r.state))
            .collect();
        let expected: Vec<String> = self.agents[idx as usize].tasks.iter().cloned().collect();
        let mut still_missing = false;
        for id in expected {
            let Some(task) = self.tasks.get_mut(&id) else {
                continue;
            };
            match held.get(id.as_str()) {
                Some(state) if !state.is_terminal() => {
                    task.last_report_ms = now.mono;
                    task.missing_since = None;
                }
                // Terminal on the agent: its update is on the way.
                Some(_) => task.last_report_ms = now.mono,
                None => {
                    if agent_version < task.assigned_version {
                        continue; // the agent has not seen it yet
                    }
                    let since = *task.missing_since.get_or_insert(now.mono);
                    if task.status.state.is_stopping() {
                        self.lose_task(
                            &id,
                            ExitReason::KilledByRequest,
                            EventSource::Reconciliation,
                            now,
                        );
                    } else if now.mono.saturating_sub(since) >= self.cfg.missing_grace_ms {
                        self.lose_task(
                            &id,
                            ExitReason::ExecutorLost,
                            EventSource::Reconciliation,
                            now,
                        );
                    } else {
                        still_missing = true;
                    }
                }
            }
        }
        let a = &mut self.agents[idx as usize];
        a.want_full_set = still_missing;
    }

    pub(super) fn start_reconciliation(&mut self, now: Now) {
        let id = self.next_recon_id;
        self.next_recon_id += 1;
        self.recon = Some(Reconciliation {
            id,
            start: now.mono,
            backoff_ms: self.cfg.reconcile_backoff_initial_ms,
        });
        for a in &mut self.agents {
            if !a.tasks.is_empty() || !a.seen {
                a.want_full_set = true;
            }
        }
        self.push_timer(
            now.mono + self.cfg.reconcile_backoff_initial_ms,
            Timer::ReconcileRound { id },
        );
    }

    pub(super) fn reconcile_round(&mut self, id: u64, now: Now) {
        let Some(recon) = self.recon.clone() else {
            return;
        };
        if recon.id != id {
            return; // a newer reconciliation replaced this one
        }
        let mut remaining = false;
        for a in &mut self.agents {
            let behind = a.tasks.iter().any(|t| {
                self.tasks
                    .get(t)
                    .is_some_and(|t| t.last_report_ms < recon.start)
            });
            if behind {
                a.want_full_set = true;
                remaining = true;
            }
        }
        if !remaining {
            self.recon = None;
            return;
        }
        let backoff = (recon.backoff_ms * 2).min(self.cfg.reconcile_backoff_max_ms);
        self.recon = Some(Reconciliation {
            backoff_ms: backoff,
            ..recon
        });
        self.push_timer(now.mono + backoff, Timer::ReconcileRound { id });
    }

    /// Whether a reconciliation is in progress.
    pub fn reconciling(&self) -> bool {
        self.recon.is_some()
    }
}
