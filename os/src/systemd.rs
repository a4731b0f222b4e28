//! The sending side of systemd's notification protocol (sd_notify(3), through the
//! `sd-notify` crate; every call is a no-op without NOTIFY_SOCKET), for the master
//! and the agent: `READY=1`, `STATUS=` and `WATCHDOG=1`. What the status says and
//! when each is sent is the daemon's (its own `systemd` module); the pacing and the
//! one-line status text are `drover_common::systemd`'s.

use drover_common::state::mono_ms;
use drover_common::systemd::{status_line, WatchdogPacer};
use sd_notify::NotifyState;

/// Tells systemd the daemon serves (READY=1) with `status`. Errors are logged: a
/// lost notification must not stop a daemon that serves.
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
