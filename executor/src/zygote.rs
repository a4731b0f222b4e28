//! The executor fork server (`drover-executor zygote --socket-fd N`): one resident,
//! single-threaded executor process per agent that forks (without exec) one child per
//! task, so that a task does not pay the executor's exec, dynamic linking and start-up
//! again (Android's zygote, Python's forkserver).
//!
//! Protocol (`wire::ZygoteRequest` / `wire::ZygoteReply`) on the inherited
//! SOCK_SEQPACKET socket: the zygote says `ready` once; then per request (the `run`
//! arguments, with the readiness pipe's write end and the stderr file (or the task
//! directory, where the executor then creates `executor.stderr` on its first line) attached by
//! SCM_RIGHTS) it forks, and answers `started` with the child's pidfd attached, or
//! `failed` when nothing was forked. It exits when the agent's end closes; executors
//! already forked keep running (each leads its own session), as after an agent crash.
//!
//! This process never builds a tokio runtime (its epoll instance and threads would be
//! inherited by every child): only the child, which becomes an ordinary `run`
//! executor, does. SIGCHLD stays blocked except inside `ppoll`, so a child exits into
//! the main loop's reaping and is never reaped between `fork` and `pidfd_open` (its
//! pid cannot be reused before the pidfd holds it).

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, IntoRawFd, OwnedFd, RawFd};

use drover_common::wire::{ZygoteReply, ZygoteRequest};
use nix::sys::signal::{sigprocmask, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use crate::runner::{Options, Usage};

/// Largest request accepted (a run command line is a few hundred bytes).
const MAX_MESSAGE: usize = 64 * 1024;
/// Descriptors a request carries: the readiness pipe's write end, the stderr file (or
/// the task directory: stderr deferred, see `sandbox::defer_stderr`);
/// optionally one more, the agent's connection to the executor (a connected stream
/// socket, `Options::agent_fd`).
const REQUEST_FDS: usize = 2;
/// An executor forked within this of the previous one skips the cgroup prewarm
/// thread ([`Options::migration_warm`]): the previous task's cgroup join keeps the
/// kernel's migration lock warm for about this long (an RCU grace period after the
/// last migration; ~100 ms measured on a quiet host, docs/agent.md "Host tuning").
pub const WARM: std::time::Duration = std::time::Duration::from_millis(50);

/// Why the fork server stopped serving.
#[derive(Debug, thiserror::Error)]
pub enum ZygoteError {
    #[error("--socket-fd {fd} is not an open descriptor: {source}; the agent passes it")]
    Socket { fd: RawFd, source: io::Error },
    #[error("zygote setup ({what}): {source}")]
    Setup {
        what: &'static str,
        source: io::Error,
    },
    #[error("zygote socket ({what}): {source}")]
    Io {
        what: &'static str,
        source: io::Error,
    },
}

/// Why a request forked nothing: the text of the `failed` answer.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("unreadable request: {0}")]
    Unreadable(serde_json::Error),
    #[error(
        "a request carries {fds} or {more} descriptors (readiness pipe, stderr, optionally the agent's connection)",
        fds = REQUEST_FDS,
        more = REQUEST_FDS + 1
    )]
    Descriptors,
    #[error("the arguments must start with `run`")]
    NotRun,
    #[error(transparent)]
    Usage(#[from] Usage),
    #[error("task directory {path}: {source}")]
    TaskDir {
        path: std::path::PathBuf,
        source: io::Error,
    },
    #[error("fork: {0}")]
    Fork(io::Error),
}

/// Serves fork requests on the inherited socket `socket_fd` until the agent closes its
/// end. `parse` turns the arguments after `run` into executor options (it must not do
/// I/O; a mistake is answered as `failed`). Returns in the zygote only; a forked child
/// runs the task and exits with `run`'s code.
pub fn serve(
    socket_fd: RawFd,
    parse: impl Fn(&[String]) -> Result<Options, Usage>,
) -> Result<(), ZygoteError> {
    let socket = crate::sys::adopt_fd(socket_fd).map_err(|source| ZygoteError::Socket {
        fd: socket_fd,
        source,
    })?;
    let setup = |what| move |source| ZygoteError::Setup { what, source };
    let null = File::options()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(setup("opening /dev/null"))?;
    crate::sys::install_sigchld_handler(on_sigchld).map_err(setup("SIGCHLD handler"))?;
    let mut chld = SigSet::empty();
    chld.add(Signal::SIGCHLD);
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&chld), None).map_err(|e| ZygoteError::Setup {
        what: "blocking SIGCHLD",
        source: e.into(),
    })?;
    let ready = ZygoteReply::Ready {
        pid: std::process::id(),
        version: env!("CARGO_PKG_VERSION").to_string(),
    };
    if !reply(&socket, &ready, None)? {
        return Ok(());
    }
    let mut buf = vec![0u8; MAX_MESSAGE];
    let mut last_fork: Option<std::time::Instant> = None;
    loop {
        reap_children();
        match crate::sys::wait_readable(socket.as_fd()) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(source) => {
                return Err(ZygoteError::Io {
                    what: "ppoll",
                    source,
                })
            }
        }
        let (len, fds) = match recv_with_fds(socket.as_fd(), &mut buf) {
            Ok(got) => got,
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                let answer = ZygoteReply::Failed {
                    error: e.to_string(),
                };
                if !reply(&socket, &answer, None)? {
                    return Ok(());
                }
                continue;
            }
            Err(e)
                if e.kind() == io::ErrorKind::Interrupted
                    || e.kind() == io::ErrorKind::WouldBlock =>
            {
                continue
            }
            Err(source) => {
                return Err(ZygoteError::Io {
                    what: "recvmsg",
                    source,
                })
            }
        };
        if len == 0 && fds.is_empty() {
            // The agent's end closed: the agent stopped or restarts its zygote.
            return Ok(());
        }
        let warm = last_fork.is_some_and(|at| at.elapsed() < WARM);
        let (answer, pidfd) = match start(&buf[..len], fds, &socket, &null, &parse, warm) {
            Ok((pid, pidfd)) => {
                last_fork = Some(std::time::Instant::now());
                (ZygoteReply::Started { pid }, pidfd)
            }
            Err(e) => (
                ZygoteReply::Failed {
                    error: e.to_string(),
                },
                None,
            ),
        };
        if !reply(&socket, &answer, pidfd.as_ref().map(|f| f.as_fd()))? {
            return Ok(());
        }
    }
}

/// Decodes one request and forks its executor: (pid, pidfd), or why nothing was
/// forked. The pidfd is None only when the kernel cannot make one (before 5.3).
fn start(
    message: &[u8],
    fds: Vec<OwnedFd>,
    socket: &OwnedFd,
    null: &File,
    parse: &impl Fn(&[String]) -> Result<Options, Usage>,
    migration_warm: bool,
) -> Result<(u32, Option<OwnedFd>), StartError> {
    let request: ZygoteRequest = serde_json::from_slice(message).map_err(StartError::Unreadable)?;
    let mut fds = fds.into_iter();
    let (Some(ready), Some(stderr), agent, None) = (fds.next(), fds.next(), fds.next(), fds.next())
    else {
        return Err(StartError::Descriptors);
    };
    let args = match request.args.split_first() {
        Some((cmd, rest)) if cmd == "run" => rest,
        _ => return Err(StartError::NotRun),
    };
    let mut opts = parse(args)?;
    opts.migration_warm = migration_warm;
    // Opened here so that a missing task directory is answered instead of failing in
    // the child; root's, so it is opened by path, but never through a symlink.
    let sandbox = open_dir_nofollow(&opts.sandbox).map_err(|source| StartError::TaskDir {
        path: opts.sandbox.clone(),
        source,
    })?;
    match crate::child::fork_process().map_err(StartError::Fork)? {
        Some(pid) => {
            // The child is not reaped before this (SIGCHLD is blocked and only the
            // main loop reaps), so `pid` is still the child.
            let pidfd = match crate::sys::pidfd_open(pid) {
                Ok(fd) => Some(fd),
                Err(e) => {
                    eprintln!("drover-executor zygote: pidfd_open({pid}): {e}");
                    None
                }
            };
            Ok((pid as u32, pidfd))
        }
        None => {
            // A directory instead of a file: the task directory, where `executor.stderr` is
            // created on the executor's first line (until then stderr is /dev/null).
            let deferred = nix::sys::stat::fstat(stderr.as_raw_fd())
                .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR);
            let target = if deferred {
                null.as_fd()
            } else {
                stderr.as_fd()
            };
            let setup = become_executor(socket, null, target, &sandbox);
            drop(sandbox);
            if deferred {
                crate::sandbox::defer_stderr(stderr);
            } else {
                drop(stderr);
            }
            let code = match setup {
                Ok(()) => {
                    opts.ready_fd = Some(ready.into_raw_fd());
                    opts.agent_fd = agent.map(IntoRawFd::into_raw_fd);
                    crate::runner::run(opts)
                }
                Err(e) => {
                    // Through `diag!`: with deferred stderr, fd 2 may be /dev/null by now.
                    crate::diag!("drover-executor: setting up the forked executor: {e}");
                    2
                }
            };
            crate::sys::exit_now(code)
        }
    }
}

/// Ends a forked executor with `_exit`: straight to the kernel, without the C
/// library's exit (atexit handlers, every library's destructors) in a process about to
/// vanish. Its page faults and symbol lookups were a tenth of a one-shot executor's CPU.
/// Nothing is lost: statuses on stdout are flushed as they are written, stderr and
/// every file the executor writes are unbuffered.
/// In a freshly forked child: undo what the zygote changed (its socket, SIGCHLD's
/// handler and mask: tasks exec'd later would inherit a blocked mask), then take the
/// shape an exec'd executor has: own session, stdin and stdout null, stderr to the
/// given file, working directory the task directory (root's; the processes work in
/// its `sandbox/`).
fn become_executor(
    socket: &OwnedFd,
    null: &File,
    stderr: BorrowedFd<'_>,
    sandbox: &File,
) -> io::Result<()> {
    // Closed so that the agent sees the zygote's death as EOF (no child holds its end).
    nix::unistd::close(socket.as_raw_fd())?;
    crate::sys::reset_sigchld()?;
    sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)?;
    nix::unistd::setsid()?;
    nix::unistd::dup2(null.as_raw_fd(), 0)?;
    nix::unistd::dup2(null.as_raw_fd(), 1)?;
    nix::unistd::dup2(stderr.as_raw_fd(), 2)?;
    nix::unistd::fchdir(sandbox.as_raw_fd())?;
    Ok(())
}

/// Opens a directory for `fchdir`, refusing a symlink in its place.
fn open_dir_nofollow(path: &std::path::Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// Sends one reply; false when the agent is gone (EPIPE), which ends the zygote.
fn reply(
    socket: &OwnedFd,
    reply: &ZygoteReply,
    fd: Option<BorrowedFd<'_>>,
) -> Result<bool, ZygoteError> {
    let bytes = serde_json::to_vec(reply).map_err(|e| ZygoteError::Io {
        what: "encoding a reply",
        source: io::Error::other(e),
    })?;
    loop {
        return match send_with_fds(socket.as_fd(), &bytes, fd.as_slice()) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if matches!(e.raw_os_error(), Some(libc::EPIPE) | Some(libc::ECONNRESET)) => {
                Ok(false)
            }
            Err(source) => Err(ZygoteError::Io {
                what: "sendmsg",
                source,
            }),
        };
    }
}

/// Reaps every exited child without blocking.
fn reap_children() {
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(_) => return,
            Ok(_) => continue,
        }
    }
}

/// The zygote's SIGCHLD handler: does nothing (async-signal-safe); it only makes
/// `ppoll` return EINTR when a child exits (the default disposition discards it).
extern "C" fn on_sigchld(_: libc::c_int) {}

/// Receives one message and the descriptors attached to it (close-on-exec), without
/// blocking (WouldBlock when none is queued). A message or descriptor list too long
/// for `buf` is InvalidData. (0, []) means the peer closed. Public for tests that play
/// the agent.
pub fn recv_with_fds(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags, UnixAddr};
    // Room for more descriptors than a request carries, so that a request with too
    // many is answered by name (`start`) instead of as truncated.
    let mut cmsg = nix::cmsg_space!([RawFd; 8]);
    let mut iov = [io::IoSliceMut::new(buf)];
    let msg = recvmsg::<UnixAddr>(
        fd.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::MSG_CMSG_CLOEXEC | MsgFlags::MSG_DONTWAIT,
    )?;
    let mut fds = Vec::new();
    for c in msg.cmsgs().into_iter().flatten() {
        if let ControlMessageOwned::ScmRights(raw) = c {
            fds.extend(raw.into_iter().map(crate::sys::owned_received_fd));
        }
    }
    if msg
        .flags
        .intersects(MsgFlags::MSG_CTRUNC | MsgFlags::MSG_TRUNC)
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "request or its descriptors truncated",
        ));
    }
    Ok((msg.bytes, fds))
}

/// Sends one message on a SOCK_SEQPACKET socket with `attach` passed by SCM_RIGHTS.
/// A gone peer is EPIPE, never SIGPIPE. Public for tests that play the agent.
pub fn send_with_fds(
    fd: BorrowedFd<'_>,
    bytes: &[u8],
    attach: &[BorrowedFd<'_>],
) -> io::Result<()> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags, UnixAddr};
    let raw: Vec<RawFd> = attach.iter().map(|f| f.as_raw_fd()).collect();
    let rights = [ControlMessage::ScmRights(&raw)];
    let cmsgs: &[ControlMessage] = if raw.is_empty() { &[] } else { &rights };
    sendmsg::<UnixAddr>(
        fd.as_raw_fd(),
        &[io::IoSlice::new(bytes)],
        cmsgs,
        MsgFlags::MSG_NOSIGNAL,
        None,
    )?;
    Ok(())
}
