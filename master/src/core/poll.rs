//! The agents' assignment long poll as a rule (pure): from an agent's version, the
//! set's versions and the store's commit progress to answer now or wait. The HTTP
//! handler (`http/agent_api.rs`) waits on what this decides.

/// What an assignment long poll does next.
#[derive(Debug, PartialEq, Eq)]
pub enum PollStep {
    /// Answer with the current set.
    Answer,
    /// Wait for the agent's wake-up (or the deadline); with `on_commit`, also for
    /// the store's next commit.
    Wait { on_commit: bool },
}

/// Decides a long poll's next step (pure). `after` is the agent's version (None:
/// answer at once), `version`/`change_seq` the set's current version and the batch
/// that last changed it, `notified` the version of its latest change that wakes the
/// agent (tasks the agent reported ending leave the set without waking it: a poll
/// that has seen every other change waits and gets them later). Nothing is served
/// before it is committed. A change to answer that is not committed yet may never
/// wake the poll: only commits of changes that notify the agent do, and a later
/// non-notifying change may have moved `change_seq` past the notifying one; so the
/// poll then also waits for commit progress (without that it slept until `wait_ms`,
/// 30 s stalls at the end of a burst of tasks).
pub fn poll_step(
    after: Option<u64>,
    version: u64,
    notified: u64,
    change_seq: u64,
    committed: u64,
    timed_out: bool,
) -> PollStep {
    let changed = match after {
        Some(a) => a < notified || a > version,
        None => true,
    };
    if !(changed || timed_out) {
        PollStep::Wait { on_commit: false }
    } else if change_seq <= committed {
        PollStep::Answer
    } else {
        PollStep::Wait { on_commit: true }
    }
}
