//! The agent's side of systemd's notification protocol (sd_notify(3); the sending is
//! `drover_os::systemd`'s, a no-op without NOTIFY_SOCKET).
//!
//! `READY=1` once the log server's listener is bound and the executors already on
//! the host are re-adopted: the agent then serves its host, whether or not the
//! master answers yet (a master that is down must not fail the agent's start, or
//! keep `systemctl start` waiting: the agent registers in the background and says
//! so in its status). `STATUS=` carries a one-line summary, and `WATCHDOG=1` comes
//! from the ticker loop (lease checks, sandbox collection) after it has taken the
//! task table's lock: an agent whose loop hangs stops pinging and systemd restarts
//! it; its executors and tasks keep running (`KillMode=process` in the unit).

use std::time::Duration;

pub use drover_os::systemd::{ping, ready, watchdog};

/// The agent's one-line status: running tasks, and the master's contact.
pub fn status(running: usize, registered: bool, since_contact: Duration) -> String {
    let master = if !registered {
        "not registered with the master yet".to_string()
    } else if since_contact > Duration::from_secs(5) {
        format!("master unreachable for {}s", since_contact.as_secs())
    } else {
        "registered with the master".to_string()
    };
    format!("{running} tasks running; {master}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_says_what_the_master_contact_is() {
        assert_eq!(
            status(3, true, Duration::from_secs(1)),
            "3 tasks running; registered with the master"
        );
        assert_eq!(
            status(0, true, Duration::from_secs(42)),
            "0 tasks running; master unreachable for 42s"
        );
        assert_eq!(
            status(1, false, Duration::ZERO),
            "1 tasks running; not registered with the master yet"
        );
    }
}
