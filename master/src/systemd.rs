//! The master's side of systemd's notification protocol (sd_notify(3), through the
//! `sd-notify` crate; every call is a no-op without NOTIFY_SOCKET): `READY=1` once
//! the store is loaded and the listener bound, `STATUS=` with a one-line summary of
//! the cluster, and `WATCHDOG=1` from the timer loop (`Master::run_timers`), after
//! it has read the core under its lock: a master whose core or loop hangs stops
//! pinging and systemd restarts it (`WatchdogSec=` in the unit).

use drover_common::state::mono_ms;
use drover_common::systemd::{status_line, WatchdogPacer};
use sd_notify::NotifyState;

use crate::core::Core;

/// The one-line status systemd shows (`systemctl status`, StatusText).
pub fn status(core: &Core) -> String {
    let c = core.cluster_view();
    let mut s = format!(
        "{}/{} agents reachable, {} tasks",
        c.reachable_agents,
        c.agents,
        core.task_count()
    );
    if c.eviction_guard.engaged {
        s.push_str("; eviction guard engaged");
    }
    s
}

/// Tells systemd the master serves (READY=1) with `status`. Errors are logged:
/// a lost notification must not stop a master that serves.
pub fn ready(status: &str) {
    send(&[
        NotifyState::Ready,
        NotifyState::Status(&status_line(status)),
    ]);
}

/// Pings the watchdog (WATCHDOG=1) with a fresh `status`.
pub fn ping(status: &str) {
    send(&[
        NotifyState::Watchdog,
        NotifyState::Status(&status_line(status)),
    ]);
}

/// The watchdog systemd asked for (WATCHDOG_USEC, and WATCHDOG_PID naming this
/// process when set), paced from now; `None` without one.
pub fn watchdog() -> Option<WatchdogPacer> {
    let timeout = sd_notify::watchdog_enabled()?;
    tracing::info!(
        timeout_ms = timeout.as_millis() as u64,
        "systemd watchdog on"
    );
    Some(WatchdogPacer::new(timeout, mono_ms()))
}

/// Sends `states`; logs a failure.
fn send(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!(error = %e, "cannot notify systemd (NOTIFY_SOCKET)");
    }
}
