//! Self-drain on host shutdown: when the agent is stopped because the host itself
//! is going down (poweroff, reboot, halt, kexec), it asks the master to drain its
//! host and waits, up to `shutdown_drain_timeout`, for its tasks to end there, so a
//! `systemctl poweroff` does not cost a service its capacity. A plain stop or restart
//! of the agent (`systemctl restart drover-agent`) leaves every task running.
//!
//! How the two are told apart: systemd queues a job for the shutdown target before
//! it stops services, so during a host shutdown `systemctl list-jobs` lists
//! `shutdown.target` (and `poweroff.target`, `reboot.target`...); during an agent
//! restart it does not. On hosts without systemd, an init script can create the
//! file named by `shutdown_marker` before stopping the agent.

use std::path::Path;
use std::process::Command;

/// Targets whose queued job means the host is going down.
const SHUTDOWN_TARGETS: &[&str] = &[
    "shutdown.target",
    "poweroff.target",
    "reboot.target",
    "halt.target",
    "kexec.target",
    "final.target",
];

/// Whether `systemctl list-jobs --no-legend` output lists a shutdown target.
pub fn jobs_mean_shutdown(list_jobs: &str) -> bool {
    list_jobs.lines().any(|line| {
        line.split_whitespace()
            .any(|word| SHUTDOWN_TARGETS.contains(&word))
    })
}

/// Whether the host is shutting down: the marker file exists, or systemd has a
/// shutdown target queued. Any failure to ask systemd (not installed, not PID 1)
/// means "no".
pub fn host_is_shutting_down(marker: Option<&Path>) -> bool {
    if marker.is_some_and(Path::exists) {
        return true;
    }
    match Command::new("systemctl")
        .args(["list-jobs", "--no-legend", "--no-pager"])
        .output()
    {
        Ok(out) if out.status.success() => {
            jobs_mean_shutdown(&String::from_utf8_lossy(&out.stdout))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queued_shutdown_target_means_the_host_goes_down() {
        let poweroff =
            "  1 poweroff.target   start waiting\n 57 drover-agent.service stop running\n";
        assert!(jobs_mean_shutdown(poweroff));
        let restart = "123 drover-agent.service restart running\n";
        assert!(!jobs_mean_shutdown(restart));
        assert!(!jobs_mean_shutdown(""));
    }

    #[test]
    fn the_marker_file_means_the_host_goes_down() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("shutting-down");
        assert!(!host_is_shutting_down(Some(&marker)));
        std::fs::write(&marker, "").unwrap();
        assert!(host_is_shutting_down(Some(&marker)));
    }
}
