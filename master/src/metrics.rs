//! Prometheus metrics of the master (`GET /metrics`, text exposition format,
//! docs/master.md "Metrics"). Counters and histograms are process-wide atomics
//! bumped where things happen (no lock on any hot path: a histogram is one atomic
//! add per bucket it falls in, plus count and sum); gauges of the state (tasks by
//! state, agents, pending reasons) are computed from the core when scraped. No
//! label carries a task id.

use std::sync::LazyLock;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use drover_common::metrics::{AtomicHistogram, HistogramFamily, Static, StaticFamily};

use crate::core::{Change, MetricsState, UpdateDirection};

use drover_common::metrics::{SECONDS, SIZES};

/// Update directions as labels, in [`direction_index`]'s order.
const DIRECTIONS: [&str; 2] = ["forward", "rollback"];

fn direction_index(direction: UpdateDirection) -> usize {
    match direction {
        UpdateDirection::Forward => 0,
        UpdateDirection::Rollback => 1,
    }
}

/// The master's counters and histograms.
#[derive(Debug)]
pub struct Metrics {
    /// Tasks placed on an agent (PENDING -> ASSIGNED).
    pub placements: Counter,
    /// From a task's creation to its placement.
    pub scheduling_latency: AtomicHistogram,
    /// One group commit of the store (one SQLite transaction).
    pub store_commit: AtomicHistogram,
    /// Core batches in one group commit.
    pub group_commit_batches: AtomicHistogram,
    /// Status reports in one `POST /v1/agents/{id}/updates`.
    pub update_batch: AtomicHistogram,
    /// Tasks in one answered assignment long poll.
    pub assignment_set: AtomicHistogram,
    /// Answers of the change stream (`GET /v1/changes`).
    pub change_polls: Counter,
    /// Instances in one rolling-update batch started, by direction ([`DIRECTIONS`]).
    pub rolling_update_batches: HistogramFamily,
}

/// The process's metrics.
pub static METRICS: LazyLock<Metrics> = LazyLock::new(|| Metrics {
    placements: Counter::default(),
    scheduling_latency: AtomicHistogram::new(SECONDS),
    store_commit: AtomicHistogram::new(SECONDS),
    group_commit_batches: AtomicHistogram::new(SIZES),
    update_batch: AtomicHistogram::new(SIZES),
    assignment_set: AtomicHistogram::new(SIZES),
    change_polls: Counter::default(),
    rolling_update_batches: HistogramFamily::new("direction", &DIRECTIONS, SIZES),
});

/// Counts a rolling-update batch the core started ([`crate::core::Effect::UpdateBatch`]).
pub fn update_batch_started(direction: UpdateDirection, instances: u32) {
    METRICS
        .rolling_update_batches
        .observe(direction_index(direction), f64::from(instances));
}

/// Counts the placements in a batch of changes the core handed out at `now_wall`:
/// tasks written ASSIGNED whose last event is that ASSIGNED.
pub fn count_placements(changes: &[Change]) {
    for change in changes {
        let Change::PutTask(t) = change else {
            continue;
        };
        if t.status.state != drover_common::state::TaskState::Assigned {
            continue;
        }
        let Some(last) = t.status.events.last() else {
            continue;
        };
        if last.state == drover_common::state::TaskState::Assigned {
            METRICS.placements.inc();
            let ms = last.timestamp_ms.saturating_sub(t.created_ms);
            METRICS.scheduling_latency.observe(ms as f64 / 1000.0);
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct TaskLabels {
    state: String,
    tier: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct AgentLabels {
    reachable: String,
    maintenance: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

/// How many pending reasons `/metrics` lists (the most common).
const TOP_REASONS: usize = 5;

/// The text exposition of every metric, the state's gauges from `state`
/// (`Core::metrics_state`, read under the core's lock; encoding happens outside it).
pub fn render(state: &MetricsState) -> String {
    let mut registry = Registry::with_prefix("drover_master");
    let m = &*METRICS;
    let tasks = Family::<TaskLabels, Gauge>::default();
    let agents = Family::<AgentLabels, Gauge>::default();
    let reasons = Family::<ReasonLabel, Gauge>::default();
    let pending = Gauge::<i64, std::sync::atomic::AtomicI64>::default();
    for ((s, tier), n) in &state.tasks_by_state {
        tasks
            .get_or_create(&TaskLabels {
                state: s.to_string(),
                tier: tier.to_string(),
            })
            .set(*n as i64);
    }
    for ((reachable, mode), n) in &state.agents {
        agents
            .get_or_create(&AgentLabels {
                reachable: reachable.to_string(),
                maintenance: mode.clone(),
            })
            .set(*n as i64);
    }
    for (reason, n) in state.pending_reasons.iter().take(TOP_REASONS) {
        reasons
            .get_or_create(&ReasonLabel {
                reason: reason.clone(),
            })
            .set(*n as i64);
    }
    pending.set(state.pending as i64);
    let ungranted = Gauge::<i64, std::sync::atomic::AtomicI64>::default();
    ungranted.set(state.jobs_ungranted_user as i64);
    registry.register(
        "tasks",
        "Tasks by state and tier (current and kept history)",
        tasks,
    );
    registry.register("pending_tasks", "Tasks waiting for a placement", pending);
    registry.register(
        "pending_reasons",
        "PENDING tasks by why they wait, the most common reasons",
        reasons,
    );
    registry.register(
        "agents",
        "Agents by reachability and maintenance mode",
        agents,
    );
    registry.register(
        "jobs_ungranted_user",
        "Jobs running tasks as a user their role is not granted (revoked since; their next update is refused)",
        ungranted,
    );
    registry.register(
        "placements",
        "Tasks placed on an agent",
        m.placements.clone(),
    );
    registry.register(
        "scheduling_latency_seconds",
        "From a task's creation to its placement",
        Static(&m.scheduling_latency),
    );
    registry.register(
        "store_commit_duration_seconds",
        "One group commit of the store (an SQLite transaction with fsync)",
        Static(&m.store_commit),
    );
    registry.register(
        "store_group_commit_batches",
        "Core batches written by one group commit",
        Static(&m.group_commit_batches),
    );
    registry.register(
        "agent_update_batch_reports",
        "Status reports in one agent updates request",
        Static(&m.update_batch),
    );
    registry.register(
        "assignment_answer_tasks",
        "Tasks in one answered assignment long poll",
        Static(&m.assignment_set),
    );
    registry.register(
        "change_stream_answers",
        "Answers of the change stream (GET /v1/changes)",
        m.change_polls.clone(),
    );
    registry.register(
        "rolling_update_batch_instances",
        "Instances in one rolling-update batch started, by direction (forward or rollback)",
        StaticFamily(&m.rolling_update_batches),
    );
    drover_common::metrics::text(&registry)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn update_batches_are_counted_by_direction() {
        let count = |d: UpdateDirection| {
            METRICS
                .rolling_update_batches
                .get(direction_index(d))
                .map(|h| h.snapshot())
                .map(|(sum, count, _)| (sum, count))
        };
        let (fwd, back) = (
            count(UpdateDirection::Forward).unwrap(),
            count(UpdateDirection::Rollback).unwrap(),
        );
        update_batch_started(UpdateDirection::Forward, 3);
        update_batch_started(UpdateDirection::Forward, 2);
        update_batch_started(UpdateDirection::Rollback, 2);
        assert_eq!(
            count(UpdateDirection::Forward),
            Some((fwd.0 + 5.0, fwd.1 + 2))
        );
        assert_eq!(
            count(UpdateDirection::Rollback),
            Some((back.0 + 2.0, back.1 + 1))
        );
        let text = render(&MetricsState::default());
        assert!(
            text.contains("# TYPE drover_master_rolling_update_batch_instances histogram"),
            "{text}"
        );
        assert!(
            text.contains(
                "drover_master_rolling_update_batch_instances_count{direction=\"rollback\"}"
            ),
            "{text}"
        );
    }
}
