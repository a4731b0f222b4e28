//! The master's side of systemd's notification protocol (sd_notify(3); the sending is
//! `drover_os::systemd`'s, a no-op without NOTIFY_SOCKET): `READY=1` once
//! the store is loaded and the listener bound, `STATUS=` with a one-line summary of
//! the cluster, and `WATCHDOG=1` from the timer loop (`Master::run_timers`), after
//! it has read the core under its lock: a master whose core or loop hangs stops
//! pinging and systemd restarts it (`WatchdogSec=` in the unit).

pub use drover_os::systemd::{ping, ready, watchdog};

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
