//! How the agent follows an executor it started (`ExecutorProcess`), the
//! readiness pipe of one start, and the lock under which a child process
//! inherits a descriptor meant for it alone.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use tokio::io::unix::AsyncFd;

/// How the agent learns that an executor it started has exited.
pub enum ExecutorProcess {
    /// Exec'd by the agent: its child, reaped here.
    Child(tokio::process::Child),
    /// Forked by the fork server (which reaps it): its pidfd reads as ready once it
    /// has exited.
    Forked { pid: u32, pidfd: AsyncFd<OwnedFd> },
    /// Forked by the fork server but not watchable by pidfd (it died before saying
    /// which pid, or no pidfd could be made): followed like an executor adopted at
    /// start, through its pid (when known) and its checkpoint.
    Untracked { pid: Option<u32> },
}

/// The readiness pipe of one executor start.
pub(super) struct ReadyPipe {
    pub(super) rx: OwnedFd,
    pub(super) tx: Option<OwnedFd>,
}

impl ReadyPipe {
    pub(super) fn new() -> std::io::Result<ReadyPipe> {
        let (rx, tx) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        Ok(ReadyPipe { rx, tx: Some(tx) })
    }

    /// Whether some process other than us may still hold the write end, or already
    /// wrote to it: checked with our own write end closed.
    pub(super) fn has_writer(&mut self) -> bool {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        self.tx = None;
        let mut fds = [PollFd::new(self.rx.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::ZERO) {
            Ok(0) => true,
            Ok(_) => fds[0]
                .revents()
                .is_some_and(|r| r.contains(PollFlags::POLLIN)),
            Err(_) => true,
        }
    }
}

impl ExecutorProcess {
    /// The executor's pid, when known.
    pub fn id(&self) -> Option<u32> {
        match self {
            ExecutorProcess::Child(c) => c.id(),
            ExecutorProcess::Forked { pid, .. } => Some(*pid),
            ExecutorProcess::Untracked { pid } => *pid,
        }
    }

    /// Waits until the executor has exited. Never returns for `Untracked`, which has
    /// nothing to wait on.
    pub async fn wait(&mut self) -> std::io::Result<()> {
        match self {
            ExecutorProcess::Child(c) => c.wait().await.map(|_| ()),
            ExecutorProcess::Forked { pidfd, .. } => {
                // A pidfd stays readable once the process exited.
                pidfd.readable().await?.retain_ready();
                Ok(())
            }
            ExecutorProcess::Untracked { .. } => std::future::pending().await,
        }
    }
}

/// Held while the agent starts a child process, so that a readiness pipe made
/// inheritable for one executor is inherited by no other child.
static SPAWN: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub(crate) fn lock_spawn() -> std::sync::MutexGuard<'static, ()> {
    SPAWN.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `spawn` with `fd` inheritable, under its own number, by the child it starts:
/// close-on-exec is cleared only while SPAWN is held, so no other child of the agent
/// gets a copy (our copy is closed by the caller right after).
pub(super) fn spawn_inheriting<C>(
    fd: &OwnedFd,
    spawn: impl FnOnce() -> std::io::Result<C>,
) -> std::io::Result<C> {
    let _spawning = lock_spawn();
    set_cloexec(fd, false)?;
    let child = spawn();
    let _ = set_cloexec(fd, true);
    child
}

/// Sets or clears close-on-exec on `fd`.
pub(super) fn set_cloexec(fd: &OwnedFd, on: bool) -> std::io::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, FdFlag};
    let flags = if on {
        FdFlag::FD_CLOEXEC
    } else {
        FdFlag::empty()
    };
    fcntl(fd.as_raw_fd(), FcntlArg::F_SETFD(flags))
        .map(|_| ())
        .map_err(std::io::Error::from)
}
