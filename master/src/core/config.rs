//! The thresholds of the lifecycle rules ([`CoreConfig`]); the runtime's config
//! file fills them, tests shorten them.

/// Every threshold of the lifecycle rules, durations in milliseconds on the
/// monotonic clock (tests shorten them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoreConfig {
    /// A task that ran shorter than this is flapping (Aurora: 5 min).
    pub flapping_threshold_ms: u64,
    /// First THROTTLED penalty (Aurora: 30 s); doubles per consecutive flap.
    pub throttle_initial_ms: u64,
    /// Largest THROTTLED penalty (Aurora: 5 min).
    pub throttle_max_ms: u64,
    /// ASSIGNED or STARTING longer than this becomes LOST (Aurora: 5 min).
    pub transient_timeout_ms: u64,
    /// An agent silent this long is unreachable (at the shortest interval; a
    /// longer one told stretches it, see `heartbeat`).
    pub agent_timeout_ms: u64,
    /// How often agents heartbeat, at least: the interval told in a small cell.
    pub heartbeat_interval_ms: u64,
    /// Heartbeats a second the whole cell sends, at most: a larger cell is told a
    /// longer interval (see `heartbeat`).
    pub max_heartbeat_rate: u32,
    /// Terminal tasks kept per instance.
    pub task_history_limit: usize,
    /// Period of implicit reconciliation (Mesos: e.g. 15 min).
    pub reconcile_interval_ms: u64,
    /// First retry delay of explicit reconciliation; doubles per round.
    pub reconcile_backoff_initial_ms: u64,
    /// Largest retry delay of explicit reconciliation.
    pub reconcile_backoff_max_ms: u64,
    /// After the master starts, nothing is replaced for agents that have not come
    /// back yet until this has passed.
    pub restart_grace_ms: u64,
    /// How long an agent that lost the master keeps exclusive tasks before killing
    /// them (at the shortest interval; stretched like `agent_timeout_ms`).
    pub exclusive_lease_ms: u64,
    /// A task the agent does not report is LOST only once it has been missing from
    /// its full task sets this long (a terminal update may be on its way).
    pub missing_grace_ms: u64,
    /// The eviction guard engages when more than this share (per mille) of the
    /// fleet went unreachable within `eviction_guard_window_ms`.
    pub eviction_guard_share_permille: u32,
    /// The window in which agents going unreachable count as one storm.
    pub eviction_guard_window_ms: u64,
    /// Tasks made LOST by agent loss, at most, per second.
    pub agent_loss_rate: u32,
    /// How long resources freed by preemption stay reserved for their preemptor.
    pub preemption_reservation_ms: u64,
    /// A cron firing missed while the master was down runs at start if it is at
    /// most this old.
    pub cron_grace_ms: u64,
    /// Test switch: cron schedules may have a leading seconds field (6 fields).
    pub cron_seconds: bool,
    /// While hosts drain, the drain round runs at most once per this interval
    /// (a burst of status reports costs one round, not one per report); a
    /// maintenance request always runs one at once. Not a config key.
    pub drain_round_interval_ms: u64,
    /// Tasks one drain round moves off draining hosts, at most: a drain of
    /// thousands of tasks goes in rounds of this many, one
    /// `drain_round_interval_ms` apart, so that no event of the master takes long
    /// (the budgets still decide what may go). Not a config key.
    pub drain_round_max_tasks: u32,
    /// A host where this many tasks ended for host-side causes (sandbox setup
    /// failed, executor lost) within `quarantine_window_ms`, of at least
    /// `quarantine_jobs` different jobs, is quarantined (SCHEDULED). 0: never.
    pub quarantine_failures: u32,
    /// The window of `quarantine_failures`.
    pub quarantine_window_ms: u64,
    /// How many different jobs the failures must come from.
    pub quarantine_jobs: u32,
    /// Task configs a job keeps for history beyond those its instances run and
    /// its unfinished update may need: the newest this many.
    pub config_history: usize,
}

impl Default for CoreConfig {
    fn default() -> Self {
        CoreConfig {
            flapping_threshold_ms: 5 * 60_000,
            throttle_initial_ms: 30_000,
            throttle_max_ms: 5 * 60_000,
            transient_timeout_ms: 5 * 60_000,
            agent_timeout_ms: 15_000,
            heartbeat_interval_ms: 1_000,
            max_heartbeat_rate: 100,
            task_history_limit: 10,
            reconcile_interval_ms: 15 * 60_000,
            reconcile_backoff_initial_ms: 1_000,
            reconcile_backoff_max_ms: 60_000,
            restart_grace_ms: 30_000,
            exclusive_lease_ms: 10_000,
            missing_grace_ms: 5_000,
            eviction_guard_share_permille: 500,
            eviction_guard_window_ms: 60_000,
            agent_loss_rate: 100,
            preemption_reservation_ms: 120_000,
            cron_grace_ms: 15 * 60_000,
            cron_seconds: false,
            drain_round_interval_ms: 100,
            drain_round_max_tasks: 1_000,
            quarantine_failures: 5,
            quarantine_window_ms: 10 * 60_000,
            quarantine_jobs: 2,
            config_history: 10,
        }
    }
}
