//! The durable outbox and its relay: statuses are written in batches (one fsync per
//! batch), the pure core learns each state, and the relay sends what waits to the
//! master, deleting what it acknowledges.

use std::sync::Arc;
use std::time::Duration;

use drover_common::state::mono_ms;
use drover_common::wire::{StatusUpdate, StatusUpdateBatch};
use tokio::sync::mpsc;

use super::{lock, Backoff, Shared};
use crate::master::MasterError;
use crate::outbox::OutboxError;

/// Most updates sent in one POST.
const RELAY_BATCH: usize = 1000;

/// Most bytes (updates as JSON) sent in one POST: half the master's 16 MiB limit on
/// agent bodies, so the envelope never tips a batch over it.
const RELAY_BATCH_BYTES: u64 = 8 << 20;

/// Whether the master refused a batch for what it holds (too large, or an update it
/// cannot take), rather than for who sent it or its own trouble: then the batch is
/// split, and a single update it refuses is dropped, so that one bad update never
/// blocks every other task's reports.
fn refused_for_content(e: &MasterError) -> bool {
    matches!(e, MasterError::Rejected { status, .. } if matches!(status, 400 | 413 | 422))
}

/// How often the outbox's ack record is written when it changed. Each write is a
/// temp file + rename (an inode created, one freed); losing the latest changes only
/// resends updates the master ignores.
pub(super) const ACK_FLUSH: Duration = Duration::from_secs(2);

/// Records the acknowledgements kept in memory and removes the outbox segment once
/// nothing in it waits (every [`ACK_FLUSH`] and at shutdown); failures are logged.
pub(super) fn flush_outbox(shared: &Shared) {
    let mut outbox = lock(&shared.outbox);
    if let Err(e) = outbox.flush_acked() {
        tracing::warn!(error = %e, "could not record acknowledgements; updates may be resent");
    }
    if let Err(e) = outbox.close_idle_segment() {
        tracing::warn!(error = %e, "could not remove the drained outbox segment");
    }
}

/// Writes updates to the outbox in batches (one fsync per batch), then updates the
/// local view and wakes the relay.
pub(super) async fn write_outbox(
    shared: Arc<Shared>,
    mut rx: mpsc::UnboundedReceiver<StatusUpdate>,
) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while let Ok(u) = rx.try_recv() {
            batch.push(u);
        }
        loop {
            let outbox = shared.outbox.clone();
            let b = batch.clone();
            match tokio::task::spawn_blocking(move || lock(&outbox).put(b)).await {
                Ok(Ok(n)) => {
                    tracing::debug!(written = n, "outbox batch written");
                    for update in &batch {
                        crate::metrics::METRICS.status_written(update);
                    }
                    break;
                }
                Ok(Err(e)) => tracing::error!(error = %e, "outbox write failed; retrying"),
                Err(e) => tracing::error!(error = %e, "outbox writer panicked; retrying"),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        lock(&shared.tasks).recorded(&batch, mono_ms());
        shared.relay.notify_one();
    }
}

/// Sends what the outbox holds to the master, deleting what it acknowledges;
/// retries with backoff while the master is unreachable.
pub(super) async fn relay(shared: Arc<Shared>) {
    let mut epoch = shared.epoch.subscribe();
    let _ = epoch.wait_for(|e| *e > 0).await;
    let mut backoff = Backoff::new(shared.cfg.max_backoff);
    // Halved at each refused batch down to one update, doubled back after each
    // accepted one.
    let mut limit = RELAY_BATCH;
    loop {
        let batch = lock(&shared.outbox).pending(limit, RELAY_BATCH_BYTES);
        if batch.is_empty() {
            shared.relay.notified().await;
            continue;
        }
        let body = StatusUpdateBatch { updates: batch };
        match shared.client.updates(&shared.agent_id, &body).await {
            Ok(ack) => {
                tracing::debug!(sent = body.updates.len(), "updates acknowledged");
                limit = (limit * 2).min(RELAY_BATCH);
                let outbox = shared.outbox.clone();
                let acked = ack.acked;
                let res = tokio::task::spawn_blocking(move || {
                    let mut ob = lock(&outbox);
                    ob.ack(&acked)?;
                    Ok::<bool, OutboxError>(
                        body.updates
                            .iter()
                            .any(|u| ob.is_pending(&u.task_id, u.seq)),
                    )
                })
                .await;
                match res {
                    Ok(Ok(false)) => backoff.reset(),
                    Ok(Ok(true)) => {
                        tracing::warn!("master did not acknowledge every update; retrying later");
                        tokio::time::sleep(backoff.step()).await;
                    }
                    Ok(Err(e)) => {
                        tracing::error!(error = %e, "recording an acknowledgement failed");
                        tokio::time::sleep(backoff.step()).await;
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "ack task panicked");
                        tokio::time::sleep(backoff.step()).await;
                    }
                }
            }
            Err(e) if refused_for_content(&e) && body.updates.len() > 1 => {
                limit = (body.updates.len() / 2).max(1);
                tracing::warn!(error = %e, sent = body.updates.len(), next = limit, "the master refused a batch of status updates; sending it in smaller batches");
            }
            Err(e) if refused_for_content(&e) => {
                let Some(u) = body.updates.first() else {
                    continue;
                };
                // The first pending update of its task: dropping it is acknowledging
                // it locally (what an acknowledgement does to the outbox).
                tracing::error!(error = %e, task_id = %u.task_id, seq = u.seq, state = %u.state, "the master refused this status update on its own; dropping it so the other updates can go");
                crate::metrics::METRICS.updates_refused.inc();
                let outbox = shared.outbox.clone();
                let key = vec![(u.task_id.clone(), u.seq)];
                let dropped = tokio::task::spawn_blocking(move || lock(&outbox).ack(&key)).await;
                if !matches!(dropped, Ok(Ok(()))) {
                    tracing::error!("dropping the refused update failed; retrying later");
                    tokio::time::sleep(backoff.step()).await;
                }
            }
            Err(e) => {
                if matches!(e, MasterError::UnknownAgent { .. }) {
                    shared.reregister.notify_one();
                }
                tracing::warn!(error = %e, pending = body.updates.len(), "relaying status updates failed; retrying");
                tokio::time::sleep(backoff.step()).await;
            }
        }
    }
}
