//! The agent's periodic tick: reaps finished watchers, records acknowledgements, kills
//! exclusive tasks once the master is silent past the lease, and collects the
//! sandboxes of tasks that ended and left the assignment set (GC), and pings systemd's
//! watchdog (`crate::systemd`): a tick that stops turning stops the pings.

use std::sync::Arc;
use std::time::Duration;

use drover_common::state::mono_ms;
use tokio::time::Instant;

use super::lease::lease;
use super::relay::{flush_outbox, ACK_FLUSH};
use super::watching::send_kill;
use super::{lock, Shared};
use crate::host::HostAction;

/// How often lease and garbage collection are checked.
const TICK: Duration = Duration::from_millis(250);

/// Checks the exclusive-task lease, collects old sandboxes and pings systemd's
/// watchdog.
pub(super) async fn ticker(shared: Arc<Shared>) {
    let gc_every =
        (shared.cfg.sandbox_retention / 10).clamp(Duration::from_secs(1), Duration::from_secs(60));
    let mut next_gc = Instant::now() + gc_every;
    let mut next_ack_flush = Instant::now() + ACK_FLUSH;
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // systemd's watchdog is pinged from this loop, every TICK at most.
    let mut watchdog = crate::systemd::watchdog();
    loop {
        tick.tick().await;
        {
            let mut spawned = lock(&shared.spawned);
            while spawned.try_join_next().is_some() {}
        }
        if Instant::now() >= next_ack_flush {
            next_ack_flush = Instant::now() + ACK_FLUSH;
            flush_outbox(&shared);
        }
        let since = lock(&shared.last_contact).elapsed();
        {
            let mut t = lock(&shared.tasks);
            for action in t.lease_kills(since, lease(&shared)) {
                if let HostAction::Kill {
                    task_id, reason, ..
                } = action
                {
                    tracing::warn!(%task_id, since_ms = since.as_millis() as u64, "master unreachable past the lease: killing exclusive task");
                    send_kill(&t, &task_id, reason);
                }
            }
        }
        if Instant::now() >= next_gc {
            next_gc = Instant::now() + gc_every;
            collect_sandboxes(&shared).await;
        }
        if watchdog.as_mut().is_some_and(|w| w.due(mono_ms())) {
            crate::systemd::ping(&super::systemd_status(&shared));
        }
    }
}

/// Removes sandboxes of terminal tasks that left the assignment set more than the
/// retention period ago and have nothing left to relay.
async fn collect_sandboxes(shared: &Arc<Shared>) {
    let retention_ms = shared.cfg.sandbox_retention.as_millis() as u64;
    let now = mono_ms();
    let candidates = lock(&shared.tasks).collectable(retention_ms, now);
    for id in candidates {
        if lock(&shared.outbox).has_pending_for(&id) {
            continue;
        }
        // The task directory, with the task's `sandbox/`: std's `remove_dir_all` opens
        // each directory without following links and unlinks relative to it, so a
        // symlink the task left in `sandbox/` is removed, never followed.
        let dir = shared.layout.task_dir(&id);
        let removed = tokio::task::spawn_blocking(move || match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        })
        .await;
        match removed {
            Ok(Ok(())) => {
                tracing::info!(task_id = %id, "sandbox removed after retention");
                lock(&shared.tasks).forget(&id);
                lock(&shared.outbox).forget(&id);
            }
            Ok(Err(e)) => tracing::warn!(task_id = %id, error = %e, "could not remove sandbox"),
            Err(e) => tracing::warn!(task_id = %id, error = %e, "sandbox removal panicked"),
        }
    }
}
