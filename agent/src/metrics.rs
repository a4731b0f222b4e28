//! Prometheus metrics of the agent (`GET /metrics` on its HTTP server, text
//! exposition format; docs/agent.md, "Metrics"). Counters and histograms are
//! process-wide atomics bumped where things happen (a status written to the outbox,
//! an executor started, a watcher seeing a status): no lock and no allocation on
//! those paths. The outbox gauges are read when scraped. No label carries a task id.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;

use drover_common::metrics::{AtomicHistogram, HistogramFamily, Static, StaticFamily, SECONDS};
use drover_common::state::ExitReason;
use drover_common::wire::{EscalationSteps, StatusUpdate};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Exit reasons as labels, in [`reason_index`]'s order; `none` for a terminal
/// status without a reason.
pub const REASONS: [&str; 17] = [
    "exit_code",
    "signal",
    "oom_killed",
    "health_check_failed",
    "killed_by_request",
    "restarted",
    "updated",
    "drained",
    "preempted",
    "agent_lost",
    "transient_state_timeout",
    "sandbox_setup_failed",
    "executor_lost",
    "failed_to_start",
    "artifact_fetch_failed",
    "disk_limit_exceeded",
    "none",
];

/// The index of a reason's label in [`REASONS`].
pub fn reason_index(reason: Option<&ExitReason>) -> usize {
    match reason {
        Some(ExitReason::ExitCode { .. }) => 0,
        Some(ExitReason::Signal { .. }) => 1,
        Some(ExitReason::OomKilled) => 2,
        Some(ExitReason::HealthCheckFailed { .. }) => 3,
        Some(ExitReason::KilledByRequest) => 4,
        Some(ExitReason::Restarted) => 5,
        Some(ExitReason::Updated) => 6,
        Some(ExitReason::Drained) => 7,
        Some(ExitReason::Preempted { .. }) => 8,
        Some(ExitReason::AgentLost) => 9,
        Some(ExitReason::TransientStateTimeout { .. }) => 10,
        Some(ExitReason::SandboxSetupFailed { .. }) => 11,
        Some(ExitReason::ExecutorLost) => 12,
        Some(ExitReason::FailedToStart { .. }) => 13,
        Some(ExitReason::ArtifactFetchFailed { .. }) => 14,
        Some(ExitReason::DiskLimitExceeded { .. }) => 15,
        None => 16,
    }
}

/// Bounds of the kill escalation histogram, in seconds: an escalation waits for a
/// graceful shutdown, then SIGTERM's grace (`finalization_wait`), then SIGKILL.
const ESCALATION: &[f64] = &[
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// Bounds of the escalation steps' histograms, in seconds: as [`ESCALATION`], and
/// finer below 10 ms, where SIGKILL's step and a SIGTERM that ends a task at once
/// fall.
const ESCALATION_STEP: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// The agent's counters and histograms.
#[derive(Debug)]
pub struct Metrics {
    /// Executors started (spawned or forked) for new tasks.
    pub executor_starts: Counter,
    /// Executors that could not be started (the task ends LOST, sandbox setup failed).
    pub executor_start_failures: Counter,
    /// Terminal statuses written to the outbox, by exit reason ([`REASONS`]).
    exits: [AtomicU64; REASONS.len()],
    /// Tasks that ended because their health checks failed.
    pub health_check_failures: Counter,
    /// From a task's KILLING status to its terminal one (the executor's clock): the
    /// whole kill escalation as the executor reports it.
    pub kill_escalation: AtomicHistogram,
    /// Each step of a kill escalation ([`EscalationSteps::NAMES`]), as the executor
    /// reports them in the terminal status.
    pub kill_escalation_steps: HistogramFamily,
    /// From the agent starting an executor to the task's first processes started
    /// (its STARTING status).
    pub process_start: AtomicHistogram,
    /// Pending statuses dropped because a later one of the same task and state
    /// superseded them (docs/agent.md, "Outbox bounds").
    pub status_superseded: Counter,
    /// Statuses written without their process list because the outbox was over its
    /// byte bound.
    pub status_lists_dropped: Counter,
    /// Statuses dropped from the outbox because the master refused them one by one.
    pub updates_refused: Counter,
    /// Artifacts found verified in the cache.
    pub artifact_cache_hits: Counter,
    /// Artifacts fetched because the cache did not have them.
    pub artifact_cache_misses: Counter,
    /// Bytes of artifacts downloaded.
    pub artifact_bytes_fetched: Counter,
    /// How long each artifact download took (successful or not).
    pub artifact_fetch: AtomicHistogram,
}

/// The process's metrics.
pub static METRICS: LazyLock<Metrics> = LazyLock::new(|| Metrics {
    executor_starts: Counter::default(),
    executor_start_failures: Counter::default(),
    exits: std::array::from_fn(|_| AtomicU64::new(0)),
    health_check_failures: Counter::default(),
    kill_escalation: AtomicHistogram::new(ESCALATION),
    kill_escalation_steps: HistogramFamily::new("step", &EscalationSteps::NAMES, ESCALATION_STEP),
    process_start: AtomicHistogram::new(SECONDS),
    status_superseded: Counter::default(),
    status_lists_dropped: Counter::default(),
    updates_refused: Counter::default(),
    artifact_cache_hits: Counter::default(),
    artifact_cache_misses: Counter::default(),
    artifact_bytes_fetched: Counter::default(),
    artifact_fetch: AtomicHistogram::new(SECONDS),
});

impl Metrics {
    /// Counts a status written to the outbox: a terminal one by its exit reason,
    /// and a health check failure when that is how the task ended.
    pub fn status_written(&self, update: &StatusUpdate) {
        if !update.state.is_terminal() {
            return;
        }
        let reason = update.exit_reason.as_ref();
        self.exits[reason_index(reason)].fetch_add(1, Ordering::Relaxed);
        if matches!(reason, Some(ExitReason::HealthCheckFailed { .. })) {
            self.health_check_failures.inc();
        }
    }

    /// Records how long each step of a kill escalation took (the steps taken).
    pub fn escalation_steps(&self, steps: &EscalationSteps) {
        for (i, ms) in steps.durations_ms().into_iter().enumerate() {
            if let Some(ms) = ms {
                self.kill_escalation_steps.observe(i, ms as f64 / 1000.0);
            }
        }
    }

    /// Terminal statuses counted for the reason at `index` of [`REASONS`].
    pub fn exits(&self, index: usize) -> u64 {
        self.exits
            .get(index)
            .map_or(0, |n| n.load(Ordering::Relaxed))
    }
}

/// What the agent's state says when scraped.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Gauges {
    /// Status updates in the outbox, not yet acknowledged by the master.
    pub outbox_updates: usize,
    /// Their size as JSON, in bytes.
    pub outbox_bytes: u64,
    /// Age of the oldest of them (0 when empty).
    pub outbox_oldest_age_seconds: f64,
    /// Tasks the agent watches (their executors run).
    pub tasks: usize,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

/// The text exposition of every agent metric.
pub fn render(gauges: &Gauges) -> String {
    let mut registry = Registry::with_prefix("drover_agent");
    let m = &*METRICS;
    let gauge = |value: f64| {
        let g = Gauge::<f64, AtomicU64>::default();
        g.set(value);
        g
    };
    registry.register(
        "outbox_updates",
        "Status updates in the durable outbox, not yet acknowledged by the master",
        gauge(gauges.outbox_updates as f64),
    );
    registry.register(
        "outbox_bytes",
        "Size of the status updates in the durable outbox (as JSON), in bytes",
        gauge(gauges.outbox_bytes as f64),
    );
    registry.register(
        "outbox_oldest_age_seconds",
        "Age of the oldest update in the outbox (0 when it is empty)",
        gauge(gauges.outbox_oldest_age_seconds),
    );
    registry.register(
        "tasks",
        "Tasks whose executor the agent watches",
        gauge(gauges.tasks as f64),
    );
    registry.register(
        "artifact_cache_hits",
        "Artifacts found verified in the host's artifact cache",
        m.artifact_cache_hits.clone(),
    );
    registry.register(
        "artifact_cache_misses",
        "Artifacts the cache did not have, so fetched",
        m.artifact_cache_misses.clone(),
    );
    registry.register(
        "artifact_bytes_fetched",
        "Bytes of artifacts downloaded",
        m.artifact_bytes_fetched.clone(),
    );
    registry.register(
        "artifact_fetch_seconds",
        "Time of each artifact download (successful or not)",
        Static(&m.artifact_fetch),
    );
    registry.register(
        "executor_starts",
        "Executors started for new tasks",
        m.executor_starts.clone(),
    );
    registry.register(
        "executor_start_failures",
        "Executors that could not be started",
        m.executor_start_failures.clone(),
    );
    let exits = Family::<ReasonLabel, Counter>::default();
    for (i, reason) in REASONS.iter().enumerate() {
        let n = m.exits(i);
        if n > 0 {
            exits.get_or_create(&ReasonLabel { reason }).inc_by(n);
        }
    }
    registry.register(
        "task_exits",
        "Tasks that ended on this agent, by exit reason",
        exits,
    );
    registry.register(
        "health_check_failures",
        "Tasks stopped because their health checks failed",
        m.health_check_failures.clone(),
    );
    registry.register(
        "kill_escalation_seconds",
        "From a task's KILLING status to its end, as its executor reports them",
        Static(&m.kill_escalation),
    );
    registry.register(
        "kill_escalation_step_seconds",
        "How long each step of a kill escalation took (graceful, shutdown, term, kill), as its executor reports them",
        StaticFamily(&m.kill_escalation_steps),
    );
    registry.register(
        "process_start_seconds",
        "From the agent starting an executor to the task's first processes started",
        Static(&m.process_start),
    );
    registry.register(
        "status_superseded",
        "Pending statuses dropped because a later one of the same task and state superseded them",
        m.status_superseded.clone(),
    );
    registry.register(
        "status_lists_dropped",
        "Statuses written without their process list because the outbox was over its byte bound",
        m.status_lists_dropped.clone(),
    );
    registry.register(
        "updates_refused",
        "Statuses dropped from the outbox because the master refused them one by one",
        m.updates_refused.clone(),
    );
    drover_common::metrics::text(&registry)
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_common::state::TaskState;

    fn update(state: TaskState, exit_reason: Option<ExitReason>) -> StatusUpdate {
        StatusUpdate {
            task_id: "t-0-abc".into(),
            seq: 1,
            state,
            exit_reason,
            message: String::new(),
            timestamp_ms: 0,
            processes: Vec::new(),
            processes_omitted: None,
        }
    }

    #[test]
    fn every_reason_has_its_own_label() {
        let reasons = [
            ExitReason::ExitCode { code: 1 },
            ExitReason::Signal { signal: 9 },
            ExitReason::OomKilled,
            ExitReason::HealthCheckFailed {
                last_error: String::new(),
            },
            ExitReason::KilledByRequest,
            ExitReason::Restarted,
            ExitReason::Updated,
            ExitReason::Drained,
            ExitReason::Preempted { by: String::new() },
            ExitReason::AgentLost,
            ExitReason::TransientStateTimeout {
                state: TaskState::Starting,
            },
            ExitReason::SandboxSetupFailed {
                error: String::new(),
            },
            ExitReason::ExecutorLost,
            ExitReason::FailedToStart {
                process: String::new(),
                error: String::new(),
            },
            ExitReason::ArtifactFetchFailed {
                url: String::new(),
                error: String::new(),
            },
            ExitReason::DiskLimitExceeded {
                used_bytes: 2,
                limit_bytes: 1,
            },
        ];
        let mut seen: Vec<usize> = reasons.iter().map(|r| reason_index(Some(r))).collect();
        seen.push(reason_index(None));
        // The serialized kind is the label.
        for r in &reasons {
            let kind = serde_json::to_value(r).unwrap()["kind"].clone();
            assert_eq!(kind, REASONS[reason_index(Some(r))], "{r:?}");
        }
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), REASONS.len());
    }

    #[test]
    fn terminal_statuses_are_counted_by_reason_and_health_failures_apart() {
        let m = &*METRICS;
        let health = ExitReason::HealthCheckFailed {
            last_error: "503".into(),
        };
        let (exits_before, failures_before) = (m.exits(3), m.health_check_failures.get());
        m.status_written(&update(TaskState::Running, None));
        m.status_written(&update(TaskState::Failed, Some(health)));
        assert_eq!(m.exits(3), exits_before + 1);
        assert_eq!(m.health_check_failures.get(), failures_before + 1);
        let text = render(&Gauges {
            outbox_updates: 2,
            outbox_bytes: 300,
            outbox_oldest_age_seconds: 1.5,
            tasks: 1,
        });
        assert!(text.contains("drover_agent_outbox_updates 2"), "{text}");
        assert!(text.contains("drover_agent_outbox_bytes 300"), "{text}");
        assert!(
            text.contains("drover_agent_outbox_oldest_age_seconds 1.5"),
            "{text}"
        );
        assert!(
            text.contains("drover_agent_task_exits_total{reason=\"health_check_failed\"}"),
            "{text}"
        );
        assert!(text.contains("# TYPE drover_agent_kill_escalation_seconds histogram"));
    }

    #[test]
    fn escalation_steps_are_observed_under_their_own_label() {
        let m = &*METRICS;
        let count = |step: usize| m.kill_escalation_steps.get(step).map(|h| h.snapshot().1);
        let before: Vec<_> = (0..4).map(count).collect();
        m.escalation_steps(&EscalationSteps {
            term_ms: Some(2_000),
            kill_ms: Some(3),
            ..EscalationSteps::default()
        });
        let after: Vec<_> = (0..4).map(count).collect();
        let plus = |i: usize, n: u64| before[i].map(|b| b + n);
        assert_eq!(after, vec![plus(0, 0), plus(1, 0), plus(2, 1), plus(3, 1)]);
        let text = render(&Gauges::default());
        assert!(
            text.contains("# TYPE drover_agent_kill_escalation_step_seconds histogram"),
            "{text}"
        );
        assert!(
            text.contains("drover_agent_kill_escalation_step_seconds_count{step=\"graceful\"}"),
            "{text}"
        );
    }
}
