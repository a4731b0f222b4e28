//! What the invariant checks (`check`) remember from step to step, kept in the
//! [`crate::World`] they watch: the ledger of what the master acknowledged, the
//! checker's record of what it saw, and the fingerprint of the tasks a store must
//! give back after a crash.

use std::collections::{BTreeMap, BTreeSet};

use drover_common::state::{DesiredState, TaskState};
use drover_master::core::Core;

use crate::jobs::SimJob;

/// An operator request the master acknowledged.
#[derive(Clone, Debug)]
pub enum Acked {
    Job(String),
    Killed(Vec<String>),
    Maintenance(Vec<String>, bool),
    Update(String),
}

/// What the master acknowledged.
#[derive(Debug, Default)]
pub struct Ledger {
    pub(crate) statuses: BTreeMap<String, u64>,
    pub(crate) jobs: BTreeSet<String>,
    pub(crate) kills: BTreeSet<String>,
    /// Host -> out of service (cordon or drain) or back in (activate).
    pub(crate) maintenance: BTreeMap<String, bool>,
    pub(crate) updates: BTreeSet<String>,
}

impl Ledger {
    pub fn ack_status(&mut self, task: &str, seq: u64) {
        let e = self.statuses.entry(task.to_string()).or_insert(0);
        *e = (*e).max(seq);
    }

    pub fn ack(&mut self, a: Acked) {
        match a {
            Acked::Job(key) => {
                self.jobs.insert(key);
            }
            Acked::Killed(tasks) => self.kills.extend(tasks),
            Acked::Maintenance(hosts, out) => {
                for h in hosts {
                    self.maintenance.insert(h, out);
                }
            }
            Acked::Update(job) => {
                self.updates.insert(job);
            }
        }
    }

    /// A committed batch deleted these (history pruning): nothing to find.
    pub(crate) fn forget_task(&mut self, id: &str) {
        self.statuses.remove(id);
        self.kills.remove(id);
    }

    pub(crate) fn forget_job(&mut self, key: &str) {
        self.jobs.remove(key);
        self.updates.remove(key);
    }
}

/// Per-run state of the checks.
#[derive(Debug, Default)]
pub struct Checker {
    /// Task id -> the agent it was last placed on (to see new placements).
    pub(crate) placed: BTreeMap<String, String>,
    /// Exclusive tasks the master was stopping after the last step it ran.
    pub(crate) stopping: BTreeSet<String>,
    /// Each task's state in the latest batch that wrote it.
    pub(crate) last_state: BTreeMap<String, TaskState>,
    /// Task ids ever started on an executor.
    pub(crate) started: BTreeSet<String>,
    /// Committed state per task (transitions).
    pub(crate) committed_state: BTreeMap<String, TaskState>,
    /// Committed cron firings per job.
    pub(crate) cron_fired: BTreeMap<String, BTreeSet<u64>>,
    /// Committed update records per job: (id, state terminal, next, back_next).
    pub(crate) updates: BTreeMap<String, (String, bool, usize, usize)>,
    /// The master's tasks when it crashed with nothing uncommitted.
    pub before_crash: Option<Vec<TaskPrint>>,
}

/// A task as the store must keep it: id, state, desired state, agent, last seq.
pub type TaskPrint = (String, TaskState, DesiredState, Option<String>, Option<u64>);

/// Every task of every job the core holds: id, state, desired, agent, last seq.
pub fn fingerprint(core: &Core, jobs: &[SimJob]) -> Vec<TaskPrint> {
    let mut out = Vec::new();
    for j in jobs {
        let Some(view) = core.job_view(&j.key) else {
            continue;
        };
        for inst in view.instances {
            for t in inst.current.iter().chain(inst.history.iter()) {
                let seq = core.task(&t.task_id).and_then(|t| t.last_seq);
                out.push((
                    t.task_id.clone(),
                    t.state,
                    t.desired,
                    t.agent_id.clone(),
                    seq,
                ));
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}
