//! Starting one process of the task: the cmdline's words executed directly when it has
//! no shell syntax (see [`direct_argv`]), `/bin/sh -c <cmdline>` otherwise, in the
//! sandbox with the `DROVER_*` environment, stdout and stderr piped to the executor
//! (which writes the rotated log files). Shell health checks start the same way
//! ([`check_command`]), output discarded. The child is born inside the task's cgroup
//! (cgroup v2: `clone3` with `CLONE_INTO_CGROUP`, so the kernel counts it against
//! `pids.max` like any fork of the task; v1, or a kernel without `clone3`: it joins the
//! cgroup first thing, before it could fork, and backs out with `EAGAIN` when the
//! cgroup is then over its pids limit, since a migration is not checked by the
//! kernel), and inside the task's pid and mount namespaces ([`crate::ns`]). Between
//! clone and exec it starts its own session, drops to the task user and sets
//! `PR_SET_NO_NEW_PRIVS`.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::Arc;

use crate::ns::TaskNamespaces;
use crate::sandbox::TaskUser;

/// Where and as whom a child starts, prepared before cloning so the child only makes
/// raw system calls (no allocation after the clone).
#[derive(Clone, Debug, Default)]
pub struct Isolation {
    /// `cgroup.procs` files to write `0` (this process) into: the way in on v1, and
    /// on v2 when `clone3` is not available.
    pub procs_files: Vec<CString>,
    /// `pids.current` of the task cgroup and its limit: after joining by writing
    /// `procs_files` the child reads the count and backs out (`EAGAIN`, as a fork
    /// over the limit fails) when it is above the limit.
    pub pids_check: Option<(CString, u64)>,
    /// cgroup v2: the task cgroup's directory, to start the child in
    /// (`CLONE_INTO_CGROUP`); `procs_files` are then not written.
    pub cgroup_dir: Option<Arc<OwnedFd>>,
    /// The task's pid and mount (and network) namespaces.
    pub ns: Option<Arc<TaskNamespaces>>,
    /// The user to become, if we switch.
    pub user: Option<(u32, u32, Vec<u32>)>,
}

impl Isolation {
    /// Prepares joining `procs_files` and becoming `user`.
    pub fn new(procs_files: &[PathBuf], user: &TaskUser) -> Isolation {
        Isolation {
            procs_files: procs_files.iter().filter_map(|p| c_path(p)).collect(),
            user: user
                .switch
                .then(|| (user.uid, user.gid, user.groups.clone())),
            ..Isolation::default()
        }
    }

    /// Starts children in the cgroup v2 directory `dir` with `CLONE_INTO_CGROUP`
    /// (the `procs_files` stay the fallback for a kernel without `clone3`).
    pub fn into_cgroup_dir(mut self, dir: &Path) -> io::Result<Isolation> {
        let fd = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(dir)?;
        self.cgroup_dir = Some(Arc::new(fd.into()));
        Ok(self)
    }

    /// Makes a child that joined by writing `cgroup.procs` check `pids_current`
    /// against `limit` (0: no check).
    pub fn checking_pids(mut self, pids_current: &Path, limit: u64) -> Isolation {
        if limit > 0 {
            self.pids_check = c_path(pids_current).map(|p| (p, limit));
        }
        self
    }

    /// Starts children in the task's namespaces.
    pub fn in_namespaces(mut self, ns: Arc<TaskNamespaces>) -> Isolation {
        self.ns = Some(ns);
        self
    }
}

fn c_path(p: &Path) -> Option<CString> {
    CString::new(p.as_os_str().as_bytes()).ok()
}

/// Characters that make a cmdline need the shell: quoting, expansion, redirection,
/// pipes and lists, globbing, grouping, comments, assignments.
const SHELL_SYNTAX: &[char] = &[
    '"', '\'', '$', '`', '\\', '|', '&', ';', '<', '>', '(', ')', '*', '?', '[', ']', '{', '}',
    '~', '#', '=', '\n',
];

/// Shell builtins and reserved words that have no program of the same name to exec
/// (or behave differently as one): a cmdline starting with one of them goes to the shell.
const SHELL_WORDS: &[&str] = &[
    "!", ".", ":", "alias", "bg", "break", "case", "cd", "command", "continue", "do", "done",
    "elif", "else", "esac", "eval", "exec", "exit", "export", "fc", "fg", "fi", "for", "getopts",
    "hash", "if", "jobs", "local", "read", "readonly", "return", "set", "shift", "source", "then",
    "times", "trap", "type", "ulimit", "umask", "unalias", "unset", "until", "wait", "while",
];

/// The words to execute directly (program first, looked up in `PATH` when it has no
/// `/`) when `cmdline` is plain words separated by whitespace, optionally after
/// `exec`; `None` when it needs `/bin/sh -c` (shell syntax, a builtin or reserved word
/// first, or no words).
pub fn direct_argv(cmdline: &str) -> Option<Vec<&str>> {
    if cmdline.contains(SHELL_SYNTAX) {
        return None;
    }
    let mut words: Vec<&str> = cmdline.split_whitespace().collect();
    // `exec prog args` is what the shell would do with `prog args` anyway (but not
    // `exec -a name ...`, exec's own options).
    if words.first() == Some(&"exec") && words.get(1).is_some_and(|w| !w.starts_with('-')) {
        words.remove(0);
    }
    match words.first() {
        Some(first) if !SHELL_WORDS.contains(first) => Some(words),
        _ => None,
    }
}

/// A task process: executed directly when [`direct_argv`] allows it (a program
/// without `/` resolved in `PATH` here), else through `/bin/sh -c`; stdout and stderr
/// piped. Fails with the failed-to-start message (the path that is missing or not
/// executable) when the program cannot be started; see [`check_program`]. Started by
/// [`TaskCommand::spawn`], without copying the executor (see there).
pub fn task_command(
    cmdline: &str,
    cwd: &Path,
    env: &[(String, String)],
    isolation: &Isolation,
) -> Result<TaskCommand, String> {
    check_program(cmdline, cwd)?;
    let (program, argv) = match direct_argv(cmdline) {
        Some(words) if words[0].contains('/') => (
            PathBuf::from(words[0]),
            words.iter().map(|w| w.to_string()).collect(),
        ),
        Some(words) => (
            find_in_path(words[0])?,
            words.iter().map(|w| w.to_string()).collect(),
        ),
        None => (
            PathBuf::from("/bin/sh"),
            vec!["/bin/sh".to_string(), "-c".to_string(), cmdline.to_string()],
        ),
    };
    Ok(TaskCommand::new(program, argv, cwd, env, isolation, true))
}

/// A shell health check's command: `/bin/sh -c <cmdline>` started like a task process
/// (same sandbox, environment and [`Isolation`]), its output discarded.
pub fn check_command(
    cmdline: &str,
    cwd: &Path,
    env: &[(String, String)],
    isolation: &Isolation,
) -> TaskCommand {
    let argv = vec!["/bin/sh".to_string(), "-c".to_string(), cmdline.to_string()];
    TaskCommand::new(PathBuf::from("/bin/sh"), argv, cwd, env, isolation, false)
}

/// A task process ready to start: what [`task_command`] prepared.
#[derive(Clone, Debug)]
pub struct TaskCommand {
    program: PathBuf,
    /// The arguments, `argv[0]` first.
    argv: Vec<String>,
    /// `NAME=value`, sorted by name, each name once.
    env: Vec<String>,
    cwd: PathBuf,
    isolation: Isolation,
    /// stdout and stderr piped to the executor; else /dev/null.
    piped: bool,
}

/// A started task process: its pid, its output pipes and a pidfd to wait on.
#[derive(Debug)]
pub struct TaskChild {
    pid: u32,
    /// The read end of the process's stdout.
    pub stdout: Option<tokio::net::unix::pipe::Receiver>,
    /// The read end of the process's stderr.
    pub stderr: Option<tokio::net::unix::pipe::Receiver>,
    pidfd: Option<tokio::io::unix::AsyncFd<OwnedFd>>,
}

impl TaskChild {
    /// The process id (Some until [`TaskChild::wait`] returned, like tokio's `Child`).
    pub fn id(&self) -> Option<u32> {
        self.pidfd.as_ref().map(|_| self.pid)
    }

    /// Waits for the process to exit and reaps it.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        let Some(pidfd) = self.pidfd.as_ref() else {
            return Err(io::Error::other("the process was already waited for"));
        };
        loop {
            let mut ready = pidfd.readable().await?;
            match reap(self.pid)? {
                Some(status) => {
                    self.pidfd = None;
                    return Ok(status);
                }
                None => ready.clear_ready(),
            }
        }
    }
}

/// `waitpid(pid, WNOHANG)`: the exit status once `pid` exited, None while it runs.
#[allow(unsafe_code)]
fn reap(pid: u32) -> io::Result<Option<ExitStatus>> {
    use std::os::unix::process::ExitStatusExt;
    let mut status = 0;
    loop {
        // SAFETY: waitpid writes one int, `status`, which lives across the call.
        let r = unsafe { libc::waitpid(pid as libc::pid_t, &mut status, libc::WNOHANG) };
        return match r {
            0 => Ok(None),
            -1 if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => continue,
            -1 => Err(io::Error::last_os_error()),
            _ => Ok(Some(ExitStatus::from_raw(status))),
        };
    }
}

/// Reaps `pid`, which has exited or is exiting (blocks until it is a zombie).
#[allow(unsafe_code)]
fn reap_exited(pid: u32) {
    let mut status = 0;
    // SAFETY: waitpid writes one int, `status`, which lives across the call.
    while unsafe { libc::waitpid(pid as libc::pid_t, &mut status, 0) } == -1
        && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted
    {}
}

impl TaskCommand {
    fn new(
        program: PathBuf,
        argv: Vec<String>,
        cwd: &Path,
        env: &[(String, String)],
        isolation: &Isolation,
        piped: bool,
    ) -> TaskCommand {
        // As `Command::env` does: a later value of a name replaces an earlier one.
        let mut vars = std::collections::BTreeMap::new();
        vars.insert("PATH", DEFAULT_PATH);
        for (k, v) in env {
            vars.insert(k.as_str(), v.as_str());
        }
        TaskCommand {
            program,
            argv,
            env: vars.into_iter().map(|(k, v)| format!("{k}={v}")).collect(),
            cwd: cwd.to_path_buf(),
            isolation: isolation.clone(),
            piped,
        }
    }

    /// Starts the process: stdin /dev/null, stdout and stderr piped (or /dev/null for
    /// a health check, [`check_command`]), the working
    /// directory, exactly the prepared environment, and [`Isolation`] applied between
    /// the clone and the exec (join the cgroup, `setsid`, drop to the task user,
    /// `PR_SET_NO_NEW_PRIVS`).
    ///
    /// The child is a `CLONE_VM | CLONE_VFORK` clone, as `posix_spawn` makes: it runs
    /// on its own small stack in the executor's memory while the executor waits, so
    /// no page table is copied and no page is copied on write afterwards (a `fork`
    /// did both, for every task). Everything the child needs is prepared here before
    /// the clone; the child only makes raw system calls, allocates nothing and takes
    /// no lock, and reports a failure (the errno of the step that failed) through
    /// memory the two share. All signals are blocked around the clone and the child
    /// resets every handled signal to its default before unblocking, so no executor
    /// signal handler ever runs in it. A program the kernel cannot execute as it is
    /// (`ENOEXEC`: a script without `#!`) is run by `/bin/sh`, as `execvp` does.
    pub fn spawn(&mut self) -> io::Result<TaskChild> {
        let program = cstring(self.program.as_os_str().as_bytes())?;
        let argv = self
            .argv
            .iter()
            .map(|a| cstring(a.as_bytes()))
            .collect::<io::Result<Vec<_>>>()?;
        let env = self
            .env
            .iter()
            .map(|e| cstring(e.as_bytes()))
            .collect::<io::Result<Vec<_>>>()?;
        let cwd = cstring(self.cwd.as_os_str().as_bytes())?;
        let sh = c"/bin/sh";
        let args = argv.get(1..).unwrap_or_default();
        let argv_ptrs = null_terminated(argv.iter().map(|a| &**a));
        let envp = null_terminated(env.iter().map(|e| &**e));
        // `execvp`'s fallback for ENOEXEC: /bin/sh <program> <args...>.
        let sh_argv = null_terminated([sh, &*program].into_iter().chain(args.iter().map(|a| &**a)));
        let procs = self
            .isolation
            .procs_files
            .iter()
            .map(|p| p.as_ptr())
            .collect::<Vec<_>>();
        let null = dev_null()?;
        let (out_r, out_w) = self.pipe()?;
        let (err_r, err_w) = self.pipe()?;
        let plan = ChildPlan {
            program: program.as_ptr(),
            argv: argv_ptrs.as_ptr(),
            sh: sh.as_ptr(),
            sh_argv: sh_argv.as_ptr(),
            envp: envp.as_ptr(),
            cwd: cwd.as_ptr(),
            stdio: [
                null.as_raw_fd(),
                out_w.as_ref().map_or(null.as_raw_fd(), |w| w.as_raw_fd()),
                err_w.as_ref().map_or(null.as_raw_fd(), |w| w.as_raw_fd()),
            ],
            procs: &procs,
            join_by_write: std::sync::atomic::AtomicBool::new(true),
            pids_check: self
                .isolation
                .pids_check
                .as_ref()
                .map(|(file, limit)| (file.as_ptr(), *limit)),
            ns_fd: self.isolation.ns.as_ref().map_or(-1, |ns| ns.pidfd()),
            ns_flags: self.isolation.ns.as_ref().map_or(0, |ns| ns.join_flags()),
            user: self
                .isolation
                .user
                .as_ref()
                .map(|(uid, gid, groups)| (*uid, *gid, groups.as_slice())),
            error: std::sync::atomic::AtomicI32::new(0),
        };
        let (pid, pidfd) = clone_vfork(&plan, &self.isolation)?;
        // The child has exec'd (or exited) by now; its copies of the write ends are
        // what keeps the pipes open.
        drop((out_w, err_w));
        let error = plan.error.load(std::sync::atomic::Ordering::SeqCst);
        if error != 0 {
            // It exited without exec: reap it so that no zombie stays.
            drop(pidfd);
            reap_exited(pid);
            return Err(io::Error::from_raw_os_error(error));
        }
        let watched = (|| {
            Ok::<_, io::Error>((
                out_r.map(receiver).transpose()?,
                err_r.map(receiver).transpose()?,
                watch(pidfd)?,
            ))
        })();
        match watched {
            Ok((stdout, stderr, pidfd)) => Ok(TaskChild {
                pid,
                stdout,
                stderr,
                pidfd: Some(pidfd),
            }),
            Err(e) => {
                // The runtime cannot watch it (no memory for epoll): it must not run
                // unobserved.
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
                reap_exited(pid);
                Err(e)
            }
        }
    }
}

impl TaskCommand {
    /// A pipe for one output stream when piped: (read end, write end).
    #[allow(clippy::type_complexity)]
    fn pipe(&self) -> io::Result<(Option<OwnedFd>, Option<OwnedFd>)> {
        if !self.piped {
            return Ok((None, None));
        }
        let (r, w) = pipe()?;
        Ok((Some(r), Some(w)))
    }
}

/// Registers a pidfd with the runtime, to wait until it is readable (the process exited).
#[allow(unsafe_code)]
fn watch(pidfd: OwnedFd) -> io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    // SAFETY: the AsyncFd owns the OwnedFd, which stays open and the same descriptor
    // until the AsyncFd is dropped.
    Ok(unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE)
    }?)
}

fn cstring(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "nul byte found in a program, argument, variable or directory",
        )
    })
}

/// The pointers of `items` followed by a null pointer, as `execve` takes them (valid
/// while the strings live).
fn null_terminated<'a>(
    items: impl Iterator<Item = &'a std::ffi::CStr>,
) -> Vec<*const libc::c_char> {
    items
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

/// /dev/null for reading and writing, opened once per executor.
fn dev_null() -> io::Result<BorrowedFd<'static>> {
    static NULL: std::sync::OnceLock<OwnedFd> = std::sync::OnceLock::new();
    if let Some(fd) = NULL.get() {
        return Ok(fd.as_fd());
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    Ok(NULL.get_or_init(|| file.into()).as_fd())
}

/// A pipe, both ends close-on-exec: (read end, non-blocking, write end, blocking as a
/// process's stdout must be).
#[allow(unsafe_code)]
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 just created both descriptors for us; nothing else owns them.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: fcntl sets the status flags of the read end, a descriptor we own (a
    // pipe's read end has no other status flag to keep).
    if unsafe { libc::fcntl(r.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((r, w))
}

fn receiver(fd: OwnedFd) -> io::Result<tokio::net::unix::pipe::Receiver> {
    // The read end is a pipe and non-blocking (`pipe`).
    tokio::net::unix::pipe::Receiver::from_owned_fd_unchecked(fd)
}

/// Everything the clone child uses, prepared (and kept alive) by the parent.
struct ChildPlan<'a> {
    program: *const libc::c_char,
    argv: *const *const libc::c_char,
    sh: *const libc::c_char,
    sh_argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    cwd: *const libc::c_char,
    /// What becomes the child's descriptors 0, 1 and 2.
    stdio: [RawFd; 3],
    /// `cgroup.procs` files to write `0` into.
    procs: &'a [*const libc::c_char],
    /// Whether to write them: false when the child was born in the cgroup.
    join_by_write: std::sync::atomic::AtomicBool,
    /// `pids.current` and the limit to check after joining by writing.
    pids_check: Option<(*const libc::c_char, u64)>,
    /// The pidfd of the task's pid namespace init, whose namespaces (`ns_flags`,
    /// except the pid namespace, which the parent enters for the clone) the child
    /// enters; -1 for none.
    ns_fd: RawFd,
    ns_flags: libc::c_int,
    user: Option<(u32, u32, &'a [u32])>,
    /// The errno of the step that failed in the child; 0 when it exec'd.
    error: std::sync::atomic::AtomicI32,
}

/// Signal numbers are below this (Linux's `_NSIG` + 1 on x86-64 and arm64).
const NSIG: libc::c_int = 65;

/// Size of the clone child's stack (it runs a few frames of raw system calls).
const CHILD_STACK: usize = 32 * 1024;

/// Clones a `CLONE_VM | CLONE_VFORK` child that runs [`child_main`] on `plan`, with
/// every signal blocked around it: returns once the child exec'd or exited, with its
/// pid and pidfd. With a cgroup v2 directory in `iso` the child is made by `clone3`
/// with `CLONE_INTO_CGROUP` (a kernel without it: the plain clone, and the child
/// writes `cgroup.procs`); with namespaces, this thread enters the task's pid
/// namespace for its children just around the clone ([`TaskNamespaces::enter_for_children`]).
#[allow(unsafe_code)]
fn clone_vfork(plan: &ChildPlan<'_>, iso: &Isolation) -> io::Result<(u32, OwnedFd)> {
    // Not zeroed: the child touches only the top pages it uses.
    let mut stack: Vec<u8> = Vec::with_capacity(CHILD_STACK);
    // The stack grows down from its end, which the ABI wants 16-byte aligned.
    let top = ((stack.as_mut_ptr() as usize + CHILD_STACK) & !15) as *mut libc::c_void;
    let mut all = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    let mut old = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    let mut pidfd: libc::c_int = -1;
    // SAFETY: sigfillset initialises `all`; pthread_sigmask reads it and stores the
    // previous mask in `old`.
    unsafe {
        libc::sigfillset(all.as_mut_ptr());
        libc::pthread_sigmask(libc::SIG_SETMASK, all.as_ptr(), old.as_mut_ptr());
    }
    let restore_mask = || {
        // SAFETY: `old` was initialised by the pthread_sigmask above.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, old.as_ptr(), std::ptr::null_mut()) };
    };
    let entered = match &iso.ns {
        Some(ns) => match ns.enter_for_children() {
            Ok(guard) => Some(guard),
            Err(e) => {
                restore_mask();
                return Err(e);
            }
        },
        None => None,
    };
    let arg = plan as *const ChildPlan<'_> as *mut libc::c_void;
    let mut pid: isize = -(libc::ENOSYS as isize);
    if let Some(cgroup) = iso.cgroup_dir.as_ref().filter(|_| crate::sys::SUPPORTED) {
        plan.join_by_write
            .store(false, std::sync::atomic::Ordering::SeqCst);
        let args = crate::sys::CloneArgs {
            flags: (libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD) as u64
                | crate::sys::CLONE_INTO_CGROUP,
            pidfd: &mut pidfd as *mut libc::c_int as u64,
            exit_signal: libc::SIGCHLD as u64,
            stack: stack.as_mut_ptr() as u64,
            stack_size: (top as usize - stack.as_mut_ptr() as usize) as u64,
            cgroup: cgroup.as_raw_fd() as u64,
            ..Default::default()
        };
        // SAFETY: as for the clone below; `args` points at our stack and `pidfd`,
        // both alive across the call, which CLONE_VFORK makes last until the child
        // exec'd or exited.
        pid = unsafe { crate::sys::clone3(&args, child_main, arg) };
        if pid == -(libc::ENOSYS as isize) || pid == -(libc::E2BIG as isize) {
            // No clone3, or one without CLONE_INTO_CGROUP: join by writing.
            plan.join_by_write
                .store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }
    let result = if pid >= 0 {
        Ok(pid)
    } else if pid == -(libc::ENOSYS as isize) || pid == -(libc::E2BIG as isize) {
        // SAFETY: clone runs `child_main` on `stack` (alive until the clone returned,
        // which CLONE_VFORK makes wait for the child's exec or exit) with `plan`,
        // which outlives the call too; `child_main` only makes async-signal-safe raw
        // system calls on memory prepared before, so sharing our memory (CLONE_VM) is
        // sound. With CLONE_PIDFD the kernel stores the pidfd in `pidfd` (the
        // parent_tid argument of clone).
        let pid = unsafe {
            libc::clone(
                child_main,
                top,
                libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD | libc::SIGCHLD,
                arg,
                &mut pidfd as *mut libc::c_int,
                std::ptr::null_mut::<libc::c_void>(),
                std::ptr::null_mut::<libc::pid_t>(),
            )
        };
        if pid < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(pid as isize)
        }
    } else {
        Err(io::Error::from_raw_os_error(-pid as i32))
    };
    let left = entered.map(|guard| guard.leave());
    restore_mask();
    drop(stack);
    let pid = result?;
    // SAFETY: the kernel just created this descriptor for us (CLONE_PIDFD).
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    if let Some(Err(e)) = left {
        // This thread's children would be born in the task's pid namespace: nothing
        // may be started any more. Should not happen (our own namespace is always
        // enterable); the child is ended rather than left half-tracked.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        reap_exited(pid as u32);
        return Err(e);
    }
    Ok((pid as u32, pidfd))
}

/// The clone child: sets up stdio, the working directory, signals and the isolation,
/// then execs. On a failure it stores the errno in the plan and exits 127.
#[allow(unsafe_code)]
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `ChildPlan` clone_vfork passed, alive while we run.
    let plan = unsafe { &*(arg as *const ChildPlan<'_>) };
    // SAFETY: the raw system calls below read only the plan's prepared data, write
    // only the plan's `error`, kernel sigaction structs on this stack, and allocate
    // nothing. setgroups/setgid/setuid are made as system calls, not through libc,
    // whose versions would change the credentials of every thread of the executor
    // (which this child is not) by signalling them.
    let errno = unsafe { child_steps(plan) };
    plan.error
        .store(errno.max(1), std::sync::atomic::Ordering::SeqCst);
    // SAFETY: _exit ends this child only, without running any exit handler.
    unsafe { libc::_exit(127) }
}

/// The child's steps; returns the errno of the one that failed (it returns only then).
#[allow(unsafe_code)]
unsafe fn child_steps(plan: &ChildPlan<'_>) -> i32 {
    let errno = || {
        io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO)
    };
    for (target, &fd) in plan.stdio.iter().enumerate() {
        let target = target as RawFd;
        let r = if fd == target {
            libc::fcntl(fd, libc::F_SETFD, 0)
        } else {
            libc::dup2(fd, target)
        };
        if r < 0 {
            return errno();
        }
    }
    // The task's mount (and network) namespace: entered before the working
    // directory is looked up, since entering a mount namespace resets it.
    if plan.ns_fd >= 0 && libc::setns(plan.ns_fd, plan.ns_flags) != 0 {
        return errno();
    }
    if libc::chdir(plan.cwd) != 0 {
        return errno();
    }
    // No executor handler may run here (we share its memory): every handled signal
    // back to its default; SIGPIPE too, which Rust ignores and a task expects default.
    // Ignored signals stay ignored, as across an exec.
    let mut act: libc::sigaction = std::mem::zeroed();
    for sig in 1..NSIG {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        if libc::sigaction(sig, std::ptr::null(), &mut act) != 0 {
            continue;
        }
        let handled = act.sa_sigaction != libc::SIG_DFL && act.sa_sigaction != libc::SIG_IGN;
        if handled || sig == libc::SIGPIPE {
            act.sa_sigaction = libc::SIG_DFL;
            act.sa_flags = 0;
            libc::sigemptyset(&mut act.sa_mask);
            libc::sigaction(sig, &act, std::ptr::null_mut());
        }
    }
    let mut none: libc::sigset_t = std::mem::zeroed();
    libc::sigemptyset(&mut none);
    if libc::syscall(
        libc::SYS_rt_sigprocmask,
        libc::SIG_SETMASK,
        &none as *const libc::sigset_t,
        std::ptr::null_mut::<libc::sigset_t>(),
        8usize,
    ) != 0
    {
        return errno();
    }
    // Join the cgroup first (unless born in it): after dropping root we could not,
    // and nothing runs before that could fork.
    if plan.join_by_write.load(std::sync::atomic::Ordering::SeqCst) {
        for &path in plan.procs {
            let fd = libc::open(path, libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return errno();
            }
            let n = libc::write(fd, b"0".as_ptr().cast(), 1);
            let e = errno();
            libc::close(fd);
            if n != 1 {
                return e;
            }
        }
        // The kernel does not hold a migration to pids.max: count ourselves and back
        // out as a fork over the limit would fail.
        if let Some((file, limit)) = plan.pids_check {
            match read_count(file) {
                Some(n) if n > limit => return libc::EAGAIN,
                Some(_) => {}
                None => return errno(),
            }
        }
    }
    // Own session and process group: signals to the group reach its children.
    if libc::syscall(libc::SYS_setsid) < 0 {
        return errno();
    }
    if let Some((uid, gid, groups)) = plan.user {
        if libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) != 0
            || libc::syscall(libc::SYS_setgid, gid) != 0
            || libc::syscall(libc::SYS_setuid, uid) != 0
        {
            return errno();
        }
    }
    if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
        return errno();
    }
    libc::execve(plan.program, plan.argv, plan.envp);
    let e = errno();
    if e == libc::ENOEXEC {
        libc::execve(plan.sh, plan.sh_argv, plan.envp);
        return errno();
    }
    e
}

/// The number in the file `path` (`pids.current`), read with raw calls into a buffer
/// on the stack; None when it cannot be read (errno set).
#[allow(unsafe_code)]
unsafe fn read_count(path: *const libc::c_char) -> Option<u64> {
    let fd = libc::open(path, libc::O_RDONLY | libc::O_CLOEXEC);
    if fd < 0 {
        return None;
    }
    let mut buf = [0u8; 32];
    let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
    libc::close(fd);
    if n <= 0 {
        return None;
    }
    let mut value: u64 = 0;
    for &b in &buf[..n as usize] {
        match b {
            b'0'..=b'9' => value = value.saturating_mul(10).saturating_add((b - b'0') as u64),
            _ => break,
        }
    }
    Some(value)
}

/// The first executable regular file named `program` in [`DEFAULT_PATH`], as
/// `execvp` would find it.
fn find_in_path(program: &str) -> Result<PathBuf, String> {
    let mut not_executable = None;
    for dir in DEFAULT_PATH.split(':') {
        let path = Path::new(dir).join(program);
        match std::fs::metadata(&path) {
            Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => return Ok(path),
            Ok(m) if m.is_file() => not_executable = not_executable.or(Some(path)),
            _ => {}
        }
    }
    Err(match not_executable {
        Some(path) => format!("{}: permission denied (not executable)", path.display()),
        None => format!("`{program}`: command not found (PATH {DEFAULT_PATH})"),
    })
}

/// The `PATH` every task process gets.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Checks the program a cmdline runs before starting it, so that "not found" and
/// "permission denied" name the path instead of surfacing as exit code 127/126.
/// Only commands given as a path are checked; others are left to the shell.
pub fn check_program(cmdline: &str, cwd: &Path) -> Result<(), String> {
    let mut words = cmdline.split_whitespace();
    let mut first = words.next().unwrap_or("");
    if first == "exec" {
        first = words.next().unwrap_or("");
    }
    if !first.contains('/') || first.contains(['$', '`', '*', '?', '"', '\'', '(', ';', '&', '|']) {
        return Ok(());
    }
    let path = cwd.join(first);
    match std::fs::metadata(&path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            Err(format!("{}: binary not found", path.display()))
        }
        Err(e) => Err(format!("{}: {e}", path.display())),
        Ok(m) if m.is_dir() => Err(format!("{}: is a directory", path.display())),
        Ok(m) if m.permissions().mode() & 0o111 == 0 => Err(format!(
            "{}: permission denied (not executable)",
            path.display()
        )),
        Ok(_) => Ok(()),
    }
}

/// What a shell's own exit code says about a failed start: 127 command not found, 126
/// not executable. `None` for a cmdline executed directly: there the exit code is the
/// program's own (a failed exec is reported by the spawn itself, see [`spawn_error`]).
pub fn shell_start_error(code: i32, cmdline: &str) -> Option<String> {
    if direct_argv(cmdline).is_some() {
        return None;
    }
    let program = cmdline.split_whitespace().next().unwrap_or("");
    match code {
        127 => Some(format!(
            "`{program}`: command not found (exit 127 from /bin/sh)"
        )),
        126 => Some(format!(
            "`{program}`: permission denied (exit 126 from /bin/sh)"
        )),
        _ => None,
    }
}

/// The failed-to-start message when spawning `cmdline` in `cwd` failed with `e`.
pub fn spawn_error(cmdline: &str, cwd: &Path, e: &io::Error) -> String {
    match direct_argv(cmdline) {
        Some(_) => format!("`{cmdline}` in {}: {e}", cwd.display()),
        None => format!("/bin/sh -c `{cmdline}` in {}: {e}", cwd.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_and_non_executable_programs_name_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let err = check_program("./nope --flag", dir.path()).unwrap_err();
        assert!(err.contains("nope: binary not found"), "{err}");
        let file = dir.path().join("script");
        std::fs::write(&file, "#!/bin/sh\n").unwrap();
        let err = check_program("exec ./script", dir.path()).unwrap_err();
        assert!(err.contains("permission denied"), "{err}");
        assert!(check_program("sleep 10", dir.path()).is_ok());
        assert!(check_program("/bin/sh -c true", dir.path()).is_ok());
    }

    #[test]
    fn plain_words_run_directly_and_shell_syntax_goes_to_sh() {
        assert_eq!(direct_argv("true"), Some(vec!["true"]));
        assert_eq!(direct_argv("  sleep\t10  "), Some(vec!["sleep", "10"]));
        assert_eq!(
            direct_argv("./bin/app --port 8080"),
            Some(vec!["./bin/app", "--port", "8080"])
        );
        for shell in [
            "echo $HOME",
            "echo 'a b'",
            "echo \"a\"",
            "a | b",
            "a && b",
            "a; b",
            "a > out",
            "ls *.txt",
            "FOO=1 app",
            "app --flag=1",
            "cd /tmp",
            "exec -a name ./app",
            "exec",
            "while true",
            "app # comment",
            "a\nb",
            "echo ~",
            "",
            "   ",
        ] {
            assert_eq!(direct_argv(shell), None, "{shell:?}");
        }
    }

    #[test]
    fn exit_codes_127_and_126_are_the_programs_own_when_run_directly() {
        assert!(shell_start_error(127, "./app --flag").is_none());
        assert!(shell_start_error(126, "app").is_none());
        assert!(shell_start_error(127, "app | tee log")
            .unwrap()
            .contains("command not found"));
    }

    #[test]
    fn a_bare_program_is_resolved_in_path_or_named_as_not_found() {
        let dir = tempfile::tempdir().unwrap();
        assert!(find_in_path("sh").unwrap().is_absolute());
        let err = find_in_path("drover-no-such-program").unwrap_err();
        assert!(
            err.contains("`drover-no-such-program`: command not found"),
            "{err}"
        );
        let iso = Isolation::default();
        let err = task_command("drover-no-such-program --x", dir.path(), &[], &iso).unwrap_err();
        assert!(err.contains("command not found"), "{err}");
        let err = task_command("./missing", dir.path(), &[], &iso).unwrap_err();
        assert!(err.contains("missing: binary not found"), "{err}");
    }

    fn no_isolation() -> Isolation {
        Isolation::default()
    }

    /// Starts `cmdline` in `dir` and returns its exit status and stdout.
    async fn run(cmdline: &str, dir: &Path, env: &[(String, String)]) -> (ExitStatus, String) {
        use tokio::io::AsyncReadExt;
        let mut child = task_command(cmdline, dir, env, &no_isolation())
            .unwrap()
            .spawn()
            .unwrap();
        assert!(child.id().is_some());
        let mut out = String::new();
        child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .await
            .unwrap();
        let status = child.wait().await.unwrap();
        assert_eq!(child.id(), None, "a waited-for child has no id any more");
        (status, out)
    }

    #[tokio::test]
    async fn a_direct_command_gets_its_words_as_arguments() {
        let dir = tempfile::tempdir().unwrap();
        let (status, out) = run("printf %s-%s a b", dir.path(), &[]).await;
        assert!(status.success());
        assert_eq!(out, "a-b");
    }

    #[tokio::test]
    async fn a_process_gets_exactly_its_environment_and_directory() {
        let dir = tempfile::tempdir().unwrap();
        let env = [
            ("FOO".to_string(), "one".to_string()),
            ("FOO".to_string(), "two".to_string()),
        ];
        let (status, out) = run("echo \"$(pwd) $FOO $PATH\"; env | wc -l", dir.path(), &env).await;
        assert!(status.success());
        let dir = std::fs::canonicalize(dir.path()).unwrap();
        // PATH, FOO and the shell's own PWD (and SHLVL, `_` for some shells).
        let mut lines = out.lines();
        assert_eq!(
            lines.next().unwrap(),
            format!("{} two {DEFAULT_PATH}", dir.display())
        );
        let vars: usize = lines.next().unwrap().trim().parse().unwrap();
        assert!(vars <= 5, "{out}");
    }

    #[tokio::test]
    async fn exit_codes_and_signals_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let (status, _) = run("exit 3", dir.path(), &[]).await;
        assert_eq!(status.code(), Some(3));
        let (status, _) = run("kill -9 $$", dir.path(), &[]).await;
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(9));
    }

    #[tokio::test]
    async fn a_task_starts_with_no_signal_blocked_ignored_or_caught() {
        // The executor catches some (tokio) and ignores SIGPIPE (Rust).
        let _term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (status, out) = run("cat /proc/self/status", dir.path(), &[]).await;
        assert!(status.success());
        // Signals 32 and 33 are glibc's own (posix_spawn leaves them ignored too, and
        // the program's glibc takes them over).
        let glibc_internal = (1u64 << 31) | (1u64 << 32);
        for field in ["SigBlk:", "SigIgn:", "SigCgt:"] {
            let line = out.lines().find(|l| l.starts_with(field)).unwrap();
            let mask = u64::from_str_radix(line[field.len()..].trim(), 16).unwrap();
            assert_eq!(mask & !glibc_internal, 0, "{line}");
        }
        let nnp = out.lines().find(|l| l.starts_with("NoNewPrivs:")).unwrap();
        assert!(nnp.ends_with('1'), "{nnp}");
    }

    #[tokio::test]
    async fn a_script_without_an_interpreter_line_runs_with_sh() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("script");
        std::fs::write(&script, "echo from-sh \"$1\"\n").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let (status, out) = run("./script arg", dir.path(), &[]).await;
        assert!(status.success());
        assert_eq!(out, "from-sh arg\n");
    }

    #[tokio::test]
    async fn a_step_failing_before_exec_is_the_spawn_error() {
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("gone");
        let err = task_command("true", &gone, &[], &no_isolation())
            .unwrap()
            .spawn()
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound, "{err}");
        let iso = Isolation {
            procs_files: vec![
                CString::new(gone.join("cgroup.procs").as_os_str().as_bytes()).unwrap(),
            ],
            ..Isolation::default()
        };
        let err = task_command("true", dir.path(), &[], &iso)
            .unwrap()
            .spawn()
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound, "{err}");
    }
}
