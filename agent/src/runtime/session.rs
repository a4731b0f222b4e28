//! The session with the master: registration (again whenever the master asks),
//! heartbeats (with the full task set when asked), the long poll of the assignment
//! set, each one converged on by the pure core, and the self-drain at the end of a
//! session when the host shuts down.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use drover_common::state::{mono_ms, ExitReason};
use drover_common::wire::{
    AgentResources, AgentTaskReport, Assignment, AssignmentSet, HeartbeatRequest, RegisterRequest,
    PROTOCOL_VERSION,
};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::lease::{learn_lease, lease, record_contact};
use super::watching::{numbered, send_kill, start_task};
use super::{lock, Backoff, Shared};
use crate::converge::{discard_stale, max_answer_flight};
use crate::host::HostAction;
use crate::master::MasterError;

/// After an assignment set arrived, the next long poll waits this much per task in
/// the set (at most [`MAX_POLL_GAP`]); see [`poll_gap`].
const POLL_GAP_PER_TASK: Duration = Duration::from_micros(400);

/// The longest wait between an assignment set and the next long poll.
const MAX_POLL_GAP: Duration = Duration::from_millis(100);

/// How long after an assignment set of `tasks` tasks the next long poll is sent. Each
/// answer is the agent's whole set (every task placed here and not ended: 256 per
/// agent in the throughput bench, where the master answered ~27 times a second per
/// agent, each answer ~2 ms of CPU to build, serialize, parse and converge, ~11% of
/// both cores). Waiting in proportion to the set's size lets the master collect the
/// changes of that time into one answer, bounding that cost, while a small set (a
/// job of a few tasks, the latency path) is polled again at once. A large set means a
/// backlog of placed tasks here, which a late-learned placement does not starve.
fn poll_gap(tasks: usize) -> Duration {
    POLL_GAP_PER_TASK
        .saturating_mul(tasks.min(u32::MAX as usize) as u32)
        .min(MAX_POLL_GAP)
}

/// Converges on a new assignment set: the pure core decides, this carries it out.
/// Returns the executors to start, each with the receiver of its kill requests.
fn apply(
    shared: &Arc<Shared>,
    set: &AssignmentSet,
) -> Vec<(Assignment, mpsc::UnboundedReceiver<ExitReason>)> {
    let mut starts = Vec::new();
    let mut reports = Vec::new();
    {
        let mut t = lock(&shared.tasks);
        for action in t.apply(set, mono_ms()) {
            match action {
                HostAction::Start(a) => {
                    let (tx, rx) = mpsc::unbounded_channel();
                    t.watch(&a.task.task_id, tx);
                    starts.push((*a, rx));
                }
                HostAction::Kill {
                    task_id,
                    reason,
                    cause,
                } => {
                    tracing::info!(%task_id, ?cause, %reason, "killing task");
                    send_kill(&t, &task_id, reason);
                }
                HostAction::Refuse(verdict) => {
                    tracing::error!(task_id = %verdict.task_id, reason = %verdict.message, "refusing a task");
                    reports.push(verdict);
                }
                HostAction::ReportKilled(verdict) => reports.push(verdict),
            }
        }
    }
    for verdict in reports {
        let _ = shared.updates_tx.send(numbered(shared, verdict, 0));
    }
    shared.applied_version.store(set.version, Ordering::SeqCst);
    starts
}

/// Registers, and again whenever the master asks.
pub(super) async fn registrar(shared: Arc<Shared>) {
    let mut backoff = Backoff::new(shared.cfg.max_backoff);
    loop {
        let req = RegisterRequest {
            ip: None,
            protocol_version: PROTOCOL_VERSION,
            agent_id: shared.agent_id.clone(),
            hostname: shared.cfg.hostname.clone(),
            address: shared.address.clone(),
            resources: AgentResources {
                cpu: shared.cfg.cpu,
                ram_bytes: shared.cfg.ram_bytes,
                disk_bytes: shared.cfg.disk_bytes,
                port_range: shared.cfg.port_range,
            },
            attributes: shared.cfg.attributes.clone(),
            versions: Some(shared.versions.clone()),
        };
        let sent = Instant::now();
        match shared.client.register(&req).await {
            Ok(resp) => {
                backoff.reset();
                record_contact(&shared, sent);
                learn_lease(&shared, resp.exclusive_lease_ms);
                shared
                    .heartbeat_ms
                    .store(resp.heartbeat_interval_ms.max(10), Ordering::SeqCst);
                shared.epoch.send_modify(|e| *e += 1);
                tracing::info!(agent_id = %shared.agent_id, heartbeat_ms = resp.heartbeat_interval_ms, lease_ms = lease(&shared).as_millis() as u64, "registered with the master");
                shared.reregister.notified().await;
                tracing::info!("registering again");
            }
            Err(e) => {
                tracing::warn!(error = %e, "registration failed; retrying");
                tokio::time::sleep(backoff.step()).await;
            }
        }
    }
}

fn heartbeat_request(shared: &Shared, full: bool) -> HeartbeatRequest {
    let (digest, held) = {
        let t = lock(&shared.tasks);
        (t.digest(), if full { t.held() } else { Vec::new() })
    };
    let tasks = full.then(|| {
        let ob = lock(&shared.outbox);
        held.into_iter()
            .map(|(task_id, state)| AgentTaskReport {
                seq: ob.last_seq(&task_id),
                task_id,
                state,
            })
            .collect()
    });
    HeartbeatRequest {
        task_digest: digest,
        assignments_version: shared.applied_version.load(Ordering::SeqCst),
        tasks,
    }
}

/// Adopts the interval and exclusive lease a heartbeat answer carries (absent: an
/// older master, or a `reregister`; the ones in force stay). The master stretches
/// both as the cell grows and shrinks them as it shrinks; the lease file is
/// rewritten only when the lease changed.
fn follow(shared: &Shared, interval_ms: Option<u64>, lease_ms: Option<u64>) {
    if let Some(ms) = interval_ms {
        let ms = ms.max(10);
        if shared.heartbeat_ms.swap(ms, Ordering::SeqCst) != ms {
            tracing::info!(
                heartbeat_ms = ms,
                "the master changed the heartbeat interval"
            );
        }
    }
    if let Some(ms) = lease_ms.filter(|ms| *ms > 0) {
        if lease(shared).as_millis() as u64 != ms {
            learn_lease(shared, Some(ms));
        }
    }
}

/// Heartbeats every interval (as the master last told); sends the full task set
/// when the master asks.
pub(super) async fn heartbeats(shared: Arc<Shared>) {
    let mut epoch = shared.epoch.subscribe();
    let _ = epoch.wait_for(|e| *e > 0).await;
    epoch.borrow_and_update();
    let mut full = true;
    let mut failing_since: Option<Instant> = None;
    loop {
        let req = heartbeat_request(&shared, full);
        let sent_full = full;
        full = false;
        let sent = Instant::now();
        match shared.client.heartbeat(&shared.agent_id, &req).await {
            Ok(resp) => {
                record_contact(&shared, sent);
                follow(&shared, resp.heartbeat_interval_ms, resp.exclusive_lease_ms);
                if let Some(since) = failing_since.take() {
                    tracing::info!(
                        down_ms = since.elapsed().as_millis() as u64,
                        "master answers heartbeats again"
                    );
                }
                if resp.reregister {
                    shared.reregister.notify_one();
                    let _ = epoch.changed().await;
                    full = true;
                    continue;
                }
                if resp.send_full_task_set {
                    full = true;
                    if !sent_full {
                        continue;
                    }
                }
            }
            Err(MasterError::UnknownAgent { message }) => {
                tracing::warn!(message, "master does not know this agent");
                shared.reregister.notify_one();
                let _ = epoch.changed().await;
                full = true;
                continue;
            }
            Err(e) => {
                // Once per outage at warn; the lease check says when it matters.
                if failing_since.is_none() {
                    tracing::warn!(error = %e, "heartbeat failed; retrying every interval");
                    failing_since = Some(Instant::now());
                } else {
                    tracing::debug!(error = %e, "heartbeat failed");
                }
            }
        }
        let interval = Duration::from_millis(shared.heartbeat_ms.load(Ordering::SeqCst));
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = epoch.changed() => full = true,
        }
    }
}

/// Long-polls the assignment set and converges on each one.
pub(super) async fn poll_assignments(shared: Arc<Shared>) {
    let mut epoch = shared.epoch.subscribe();
    let _ = epoch.wait_for(|e| *e > 0).await;
    epoch.borrow_and_update();
    let mut version = 0u64;
    let mut discarded: Option<u64> = None;
    let mut backoff = Backoff::new(shared.cfg.max_backoff);
    let mut last_set: Option<(tokio::time::Instant, usize)> = None;
    loop {
        if let Some((at, tasks)) = last_set.take() {
            tokio::select! {
                _ = tokio::time::sleep_until(at + poll_gap(tasks)) => {}
                _ = epoch.changed() => {
                    version = 0;
                    continue;
                }
            }
        }
        let got = tokio::select! {
            r = shared.client.assignments(&shared.agent_id, version, shared.cfg.poll_wait) => r,
            _ = epoch.changed() => {
                // Registered again: ask for the whole set at once.
                version = 0;
                continue;
            }
        };
        let max_flight = max_answer_flight(lease(&shared));
        match got {
            Ok((set, in_flight))
                if discard_stale(in_flight, max_flight, set.version, discarded) =>
            {
                // Delayed by a partition: the master may have replaced these tasks
                // since. Ask again (answered at once) before acting on it.
                tracing::warn!(
                    version = set.version,
                    in_flight_ms = in_flight.as_millis() as u64,
                    "assignment set arrived late; asking again before acting on it"
                );
                discarded = Some(set.version);
            }
            Ok((set, _)) => {
                discarded = None;
                tracing::debug!(
                    version = set.version,
                    tasks = set.assignments.len(),
                    "assignment set"
                );
                backoff.reset();
                version = set.version;
                last_set = Some((tokio::time::Instant::now(), set.assignments.len()));
                for (assignment, kill_rx) in apply(&shared, &set) {
                    lock(&shared.spawned).spawn(start_task(shared.clone(), assignment, kill_rx));
                }
            }
            Err(MasterError::UnknownAgent { message }) => {
                tracing::warn!(message, "master does not know this agent");
                shared.reregister.notify_one();
                tokio::time::sleep(backoff.step()).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "polling assignments failed; retrying");
                tokio::time::sleep(backoff.step()).await;
            }
        }
    }
}

/// The host is shutting down: asks the master to drain it (forcing what is left
/// after three quarters of `shutdown_drain_timeout`, so forced kills still finish
/// in time) and waits until no task is left running here and every status was
/// delivered, or the timeout passed.
pub(super) async fn self_drain(shared: &Shared) {
    let bound = shared.cfg.shutdown_drain_timeout;
    let until = Instant::now() + bound;
    tracing::info!(
        timeout_ms = bound.as_millis() as u64,
        "host shutting down: asking the master to drain this host"
    );
    if let Err(e) = shared
        .client
        .drain_self(&shared.agent_id, bound * 3 / 4)
        .await
    {
        tracing::warn!(error = %e, "cannot ask the master to drain this host; stopping without");
        return;
    }
    loop {
        let left = lock(&shared.tasks).running();
        if left == 0 && lock(&shared.outbox).is_empty() {
            tracing::info!("host drained: no task left here");
            return;
        }
        if Instant::now() >= until {
            tracing::warn!(tasks_left = left, "shutdown_drain_timeout passed; stopping");
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_assignment_set_is_polled_again_at_once_and_a_large_one_after_a_bounded_wait() {
        assert_eq!(poll_gap(0), Duration::ZERO);
        assert!(poll_gap(2) <= Duration::from_millis(1));
        assert!(poll_gap(50) > poll_gap(10));
        assert_eq!(poll_gap(256), MAX_POLL_GAP);
        assert_eq!(poll_gap(usize::MAX), MAX_POLL_GAP);
    }
}
