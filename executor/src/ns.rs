//! The task's namespaces: a pid namespace (its processes see and signal only each
//! other; `/proc` shows only them), a mount namespace (a private `/tmp` and `/var/tmp`
//! bound from the task directory's `tmp/`, its own `/proc`) and, for
//! `task.network: isolated`, a network namespace with only loopback, up.
//!
//! The executor stays outside as the supervisor. At setup it clones the namespaces'
//! init: a tiny process sharing the executor's memory (`CLONE_VM`, so it costs no page
//! table copy and no memory of its own but a 64 KiB stack) that makes the mounts,
//! reports, closes every descriptor it inherited, blocks every signal and then only
//! reaps what is reparented to it, with raw system calls ([`crate::child`], the init's
//! code). It is not in
//! the task's cgroup (it takes none of the task's pids) and dies with the executor
//! (`PR_SET_PDEATHSIG`); its death kills whatever is left in the namespace.
//!
//! Task processes and shell health checks are still the executor's children, so it
//! waits on them, signals them and reads their pids as before: for each clone the
//! executor's thread enters the pid namespace for its children and leaves it right
//! after ([`crate::child::PidNamespace`]), and the child enters the mount (and
//! network) namespace itself before its `chdir`. Inside, the pid of the init is 1; a
//! process of the task signalling it is ignored by the kernel (init has no handler),
//! and pids outside (other tasks', the host's) do not exist there.

use std::ffi::CString;
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::child::{InitPlan, STEPS, STEP_DATA, STEP_TMP};
use crate::sys;

/// The namespaces of one task, held by its executor.
#[derive(Debug)]
pub struct TaskNamespaces {
    init_pid: u32,
    init_pidfd: OwnedFd,
    /// A pidfd of the executor, whose pid namespace this thread goes back to after a
    /// clone.
    own_pid_ns: OwnedFd,
    /// What a child enters through the init's pidfd: mount, and network when isolated.
    join_flags: libc::c_int,
}

/// Why the task's namespaces could not be made.
#[derive(Debug, thiserror::Error)]
pub enum NsError {
    #[error("task namespaces need x86-64 or arm64 (raw system calls for their init)")]
    Unsupported,
    #[error("the task directory's path holds a nul byte")]
    NulInPath,
    #[error("cannot {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("the task namespaces' init exited during setup")]
    InitExited,
    /// A setup step of the init failed; `at` names the directory for the steps
    /// about `tmp/`.
    #[error("cannot {step}{at} in the task's namespaces: {source}")]
    Step {
        step: &'static str,
        at: String,
        #[source]
        source: io::Error,
    },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> NsError {
    let what = what.into();
    move |source| NsError::Io { what, source }
}

fn c_string(bytes: &[u8]) -> Result<CString, NsError> {
    CString::new(bytes).map_err(|_| NsError::NulInPath)
}

impl TaskNamespaces {
    /// Starts making the namespaces with their init; `tmp_outer` is the task
    /// directory's `tmp/` (root's, mode 0700), in which the init makes `data/`, the
    /// task's own temporary directory, owned by `owner` (uid, gid) with mode 0700. The
    /// init makes both, unshares the mount (and network) namespace and mounts while the
    /// executor goes on with its own setup; [`PendingNamespaces::wait_ready`] waits
    /// for it. Fails with an error naming the step.
    pub fn create(
        task_dir: &Path,
        tmp_outer: &Path,
        owner: (u32, u32),
        network_isolated: bool,
    ) -> Result<PendingNamespaces, NsError> {
        if !sys::SUPPORTED {
            return Err(NsError::Unsupported);
        }
        let tmp_path = tmp_outer.to_path_buf();
        let tmp_outer = c_string(tmp_outer.as_os_str().as_bytes())?;
        // A pidfd of the executor itself: `setns` through it with `CLONE_NEWPID` enters
        // its active pid namespace, as `/proc/thread-self/ns/pid` would, without a
        // path walk through procfs on the way to the first process.
        let own_pid_ns = sys::pidfd_open(std::process::id() as libc::pid_t)
            .map_err(io_err("open a pidfd of the executor (pidfd_open)"))?;
        let (ready_r, ready_w) = sys::pipe().map_err(io_err("make a pipe"))?;
        let var_tmp = Path::new("/var/tmp").is_dir();
        let real = std::fs::canonicalize(task_dir)
            .map_err(io_err(format!("resolve {}", task_dir.display())))?;
        let mut under = None;
        for (which, target, present) in [(1, "/tmp", true), (2, "/var/tmp", var_tmp)] {
            let base = std::fs::canonicalize(target).unwrap_or_else(|_| target.into());
            if let (true, Ok(rest)) = (present, real.strip_prefix(&base)) {
                // The top directory there that holds the task directory (a test's temp
                // dir, with what its tasks run beside it).
                if let Some(top) = rest.components().next() {
                    under = Some((which, base.join(top), top.as_os_str().to_owned()));
                }
            }
        }
        let reach = match under {
            Some((which, top, name)) => Some((
                c_string(top.as_os_str().as_bytes())?,
                which,
                vec![c_string(name.as_bytes())?],
            )),
            None => None,
        };
        let unshare = if network_isolated {
            libc::CLONE_NEWNS | libc::CLONE_NEWNET
        } else {
            libc::CLONE_NEWNS
        };
        let plan: &'static InitPlan = Box::leak(Box::new(InitPlan {
            ready: ready_w.as_raw_fd(),
            unshare,
            tmp_outer,
            owner,
            var_tmp,
            loopback: network_isolated,
            reach,
        }));
        let (init_pid, init_pidfd) =
            crate::child::start_init(plan).map_err(io_err("clone the task's namespaces"))?;
        drop(ready_w);
        let ns = TaskNamespaces {
            init_pid,
            init_pidfd,
            own_pid_ns,
            join_flags: unshare,
        };
        Ok(PendingNamespaces {
            ns,
            ready: ready_r,
            tmp_outer: tmp_path,
        })
    }

    /// The init's pidfd, through which a child enters [`TaskNamespaces::join_flags`].
    pub fn pidfd(&self) -> RawFd {
        self.init_pidfd.as_raw_fd()
    }

    /// The init's pidfd, borrowed (`setns` through it enters its namespaces).
    pub fn init_pidfd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.init_pidfd)
    }

    /// The namespaces a child enters itself (mount; network when isolated).
    pub fn join_flags(&self) -> libc::c_int {
        self.join_flags
    }

    /// The init's pid (as the executor sees it).
    pub fn init_pid(&self) -> u32 {
        self.init_pid
    }

    /// Kills the init, which kills every process left in the namespace, and reaps it
    /// if it is gone already (it waits for the executor to reap its own children in
    /// the namespace first, so this never blocks on it; a zombie left goes with the
    /// executor).
    pub fn end(&self) {
        let _ = sys::pidfd_send_signal(self.init_pidfd.as_fd(), libc::SIGKILL);
        for _ in 0..20 {
            if !matches!(sys::reap(self.init_pid), Ok(None)) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_micros(250));
        }
    }
}

/// Namespaces whose init is still setting them up ([`TaskNamespaces::create`]).
pub struct PendingNamespaces {
    ns: TaskNamespaces,
    /// The read end of the pipe the init reports on.
    ready: OwnedFd,
    /// The task directory's `tmp/`, for messages.
    tmp_outer: PathBuf,
}

impl PendingNamespaces {
    /// Waits for the init's report: the namespaces, or the step that failed.
    pub fn wait_ready(self) -> Result<TaskNamespaces, NsError> {
        let PendingNamespaces {
            ns,
            ready,
            tmp_outer,
        } = self;
        let mut report = [0u8; 8];
        let mut got = 0;
        let mut ready = std::fs::File::from(ready);
        while got < report.len() {
            match ready.read(&mut report[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        let step = u32::from_ne_bytes([report[0], report[1], report[2], report[3]]) as usize;
        let errno = i32::from_ne_bytes([report[4], report[5], report[6], report[7]]);
        if got < report.len() || step != 0 {
            ns.end();
            if got < report.len() {
                return Err(NsError::InitExited);
            }
            let at = if step == STEP_TMP || step == STEP_DATA {
                format!(" at {}", tmp_outer.display())
            } else {
                String::new()
            };
            return Err(NsError::Step {
                step: STEPS.get(step).copied().unwrap_or("start"),
                at,
                source: io::Error::from_raw_os_error(errno),
            });
        }
        Ok(ns)
    }
}

impl crate::child::PidNamespace for TaskNamespaces {
    /// `setns` on the init's pidfd, for this thread's children only.
    fn enter(&self) -> io::Result<()> {
        sys::setns(self.init_pidfd.as_fd(), libc::CLONE_NEWPID)
            .map_err(|e| io::Error::other(format!("cannot enter the task's pid namespace: {e}")))
    }

    /// `setns` on our own pid namespace (always enterable).
    fn leave(&self) -> io::Result<()> {
        sys::setns(self.own_pid_ns.as_fd(), libc::CLONE_NEWPID).map_err(|e| {
            io::Error::other(format!(
                "cannot return to the executor's pid namespace: {e}"
            ))
        })
    }
}
