//! How a process's end becomes its [`ExitReason`]: pure, next to the state machine
//! ([`crate::machine`]) that acts on it; the runner observes the end and the cgroup's
//! OOM counter and passes them in.

use drover_common::state::ExitReason;

use crate::spawn;

/// How a process ended, as waiting for it told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// It exited with this code.
    Exited(i32),
    /// A signal ended it.
    Signaled(i32),
    /// Neither (should not happen).
    Unknown,
    /// Waiting for it failed.
    WaitFailed(String),
}

impl Ended {
    /// From what waiting for the process returned.
    pub fn from_wait(status: &std::io::Result<std::process::ExitStatus>) -> Ended {
        use std::os::unix::process::ExitStatusExt;
        match status {
            Ok(s) => match (s.code(), s.signal()) {
                (Some(code), _) => Ended::Exited(code),
                (None, Some(signal)) => Ended::Signaled(signal),
                (None, None) => Ended::Unknown,
            },
            Err(e) => Ended::WaitFailed(e.to_string()),
        }
    }
}

/// The exit reason of `process` (run as `cmdline`) that ended as `ended`, before the
/// OOM counter is looked at ([`with_oom`]): a shell's 127 and 126 for a cmdline run by
/// `/bin/sh` mean the program was not found or not executable
/// ([`spawn::shell_start_error`]).
pub fn exit_reason(process: &str, cmdline: &str, ended: Ended) -> ExitReason {
    match ended {
        Ended::Exited(code) => match spawn::shell_start_error(code, cmdline) {
            Some(error) => ExitReason::FailedToStart {
                process: process.to_string(),
                error,
            },
            None => ExitReason::ExitCode { code },
        },
        Ended::Signaled(signal) => ExitReason::Signal { signal },
        Ended::Unknown => ExitReason::ExitCode { code: -1 },
        Ended::WaitFailed(e) => ExitReason::FailedToStart {
            process: process.to_string(),
            error: format!("waiting for the process failed: {e}"),
        },
    }
}

/// Whether the OOM counter must be read for `reason`: any end but a success.
pub fn needs_oom_check(reason: &ExitReason) -> bool {
    *reason != (ExitReason::ExitCode { code: 0 })
}

/// OOM comes from the cgroup's counter, never guessed from SIGKILL: `reason`, or
/// `OomKilled` when the counter (`now`, None when it could not be read) rose above
/// `seen`; and the count seen from now on.
pub fn with_oom(reason: ExitReason, seen: u64, now: Option<u64>) -> (ExitReason, u64) {
    match now {
        Some(n) if n > seen && needs_oom_check(&reason) => (ExitReason::OomKilled, n),
        _ => (reason, seen),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_signals_and_wait_errors_become_their_reasons() {
        assert_eq!(
            exit_reason("p", "./app", Ended::Exited(3)),
            ExitReason::ExitCode { code: 3 }
        );
        assert_eq!(
            exit_reason("p", "./app", Ended::Signaled(9)),
            ExitReason::Signal { signal: 9 }
        );
        assert_eq!(
            exit_reason("p", "./app", Ended::Unknown),
            ExitReason::ExitCode { code: -1 }
        );
        assert_eq!(
            exit_reason("p", "./app", Ended::WaitFailed("boom".into())),
            ExitReason::FailedToStart {
                process: "p".into(),
                error: "waiting for the process failed: boom".into()
            }
        );
    }

    #[test]
    fn a_shells_127_is_a_failed_start_but_a_direct_programs_is_its_exit_code() {
        assert_eq!(
            exit_reason("p", "nosuch | cat", Ended::Exited(127)),
            ExitReason::FailedToStart {
                process: "p".into(),
                error: "`nosuch`: command not found (exit 127 from /bin/sh)".into()
            }
        );
        assert_eq!(
            exit_reason("p", "./app --flag", Ended::Exited(127)),
            ExitReason::ExitCode { code: 127 }
        );
    }

    #[test]
    fn oom_only_when_the_counter_rose_and_never_for_a_success() {
        let killed = ExitReason::Signal { signal: 9 };
        assert_eq!(
            with_oom(killed.clone(), 1, Some(2)),
            (ExitReason::OomKilled, 2)
        );
        assert_eq!(with_oom(killed.clone(), 2, Some(2)), (killed.clone(), 2));
        assert_eq!(with_oom(killed.clone(), 2, None), (killed, 2));
        let ok = ExitReason::ExitCode { code: 0 };
        assert_eq!(with_oom(ok.clone(), 0, Some(5)), (ok, 0));
    }
}
