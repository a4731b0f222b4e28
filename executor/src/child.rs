//! The code that runs in a child process sharing the executor's memory, and the
//! calls that start one: with [`crate::sys`], the only module that allows `unsafe`.
//!
//! - A task process or shell health check between its `CLONE_VM | CLONE_VFORK` clone
//!   and its exec ([`clone_vfork`], for [`crate::spawn`]). Everything it uses is
//!   prepared before the clone ([`ChildPlan`]); it runs on its own 32 KiB stack,
//!   allocates nothing and makes raw system calls only.
//! - The task namespaces' init ([`start_init`], for [`crate::ns`]): a `CLONE_VM`
//!   child that makes the task's mounts, reports on a pipe and then reaps for the
//!   task's whole life, with raw system calls that touch nothing of the executor's
//!   (not even `errno`: [`crate::sys::syscall6`]).
//! - The zygote's `fork` ([`fork_process`]).

#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use crate::sys::syscall6;

// ---- A task process between clone and exec.

/// Everything the clone child uses, prepared (and kept alive) by the parent.
pub(crate) struct ChildPlan<'a> {
    pub(crate) program: *const libc::c_char,
    pub(crate) argv: *const *const libc::c_char,
    pub(crate) sh: *const libc::c_char,
    pub(crate) sh_argv: *const *const libc::c_char,
    pub(crate) envp: *const *const libc::c_char,
    pub(crate) cwd: *const libc::c_char,
    /// What becomes the child's descriptors 0, 1 and 2.
    pub(crate) stdio: [RawFd; 3],
    /// `cgroup.procs` files to write `0` into.
    pub(crate) procs: &'a [*const libc::c_char],
    /// Whether to write them: false when the child was born in the cgroup.
    pub(crate) join_by_write: std::sync::atomic::AtomicBool,
    /// `pids.current` and the limit to check after joining by writing.
    pub(crate) pids_check: Option<(*const libc::c_char, u64)>,
    /// The pidfd of the task's pid namespace init, whose namespaces (`ns_flags`,
    /// except the pid namespace, which the parent enters for the clone) the child
    /// enters; -1 for none.
    pub(crate) ns_fd: RawFd,
    pub(crate) ns_flags: libc::c_int,
    pub(crate) user: Option<(u32, u32, &'a [u32])>,
    /// The errno of the step that failed in the child; 0 when it exec'd.
    pub(crate) error: std::sync::atomic::AtomicI32,
}

/// Signal numbers are below this (Linux's `_NSIG` + 1 on x86-64 and arm64).
const NSIG: libc::c_int = 65;

/// Size of the clone child's stack (it runs a few frames of raw system calls).
const CHILD_STACK: usize = 32 * 1024;

/// Entering the task's pid namespace for this thread's children around a clone
/// (implemented by [`crate::ns::TaskNamespaces`]). Between the two nothing but the
/// clone may happen: a thread this thread created meanwhile would fail
/// (`CLONE_THREAD` into another pid namespace).
pub(crate) trait PidNamespace {
    /// This thread's next children are born in the task's pid namespace.
    fn enter(&self) -> io::Result<()>;
    /// Back to this thread's own pid namespace for its children.
    fn leave(&self) -> io::Result<()>;
}

/// Clones a `CLONE_VM | CLONE_VFORK` child that runs [`child_main`] on `plan`, with
/// every signal blocked around it: returns once the child exec'd or exited, with its
/// pid and pidfd. With a cgroup v2 directory (`cgroup`) the child is made by `clone3`
/// with `CLONE_INTO_CGROUP` (a kernel without it: the plain clone, and the child
/// writes `cgroup.procs`); with namespaces, this thread enters the task's pid
/// namespace (`pid_ns`) for its children just around the clone.
pub(crate) fn clone_vfork(
    plan: &ChildPlan<'_>,
    cgroup: Option<BorrowedFd<'_>>,
    pid_ns: Option<&dyn PidNamespace>,
) -> io::Result<(u32, OwnedFd)> {
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
    if let Some(Err(e)) = pid_ns.map(|ns| ns.enter()) {
        restore_mask();
        return Err(e);
    }
    let arg = plan as *const ChildPlan<'_> as *mut libc::c_void;
    let mut pid: isize = -(libc::ENOSYS as isize);
    if let Some(cgroup) = cgroup.filter(|_| crate::sys::SUPPORTED) {
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
    let left = pid_ns.map(|ns| ns.leave());
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
        crate::sys::reap_exited(pid as u32);
        return Err(e);
    }
    Ok((pid as u32, pidfd))
}

/// The clone child: sets up stdio, the working directory, signals and the isolation,
/// then execs. On a failure it stores the errno in the plan and exits 127.
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

// ---- The task namespaces' init.

/// What the init needs, prepared (and leaked: the init runs as long as the task).
pub(crate) struct InitPlan {
    /// The write end of the pipe its setup result goes to.
    pub(crate) ready: RawFd,
    /// The namespaces the init unshares itself (mount; network when isolated), so that
    /// copying the host's mount table (and making a network namespace) happens beside
    /// the executor's own setup instead of in its `clone`.
    pub(crate) unshare: libc::c_int,
    /// `<task dir>/tmp`: made by the init, root's, mode 0700.
    pub(crate) tmp_outer: CString,
    /// Who owns `tmp/data/` (the task user's uid and gid), made in it with mode 0700
    /// and bound onto `/tmp` and `/var/tmp`.
    pub(crate) owner: (u32, u32),
    /// Whether `/var/tmp` exists (to bind onto).
    pub(crate) var_tmp: bool,
    /// Bring loopback up (a new network namespace).
    pub(crate) loopback: bool,
    /// When the task directory lies under `/tmp` or `/var/tmp` (tests do that): the
    /// top directory there that holds it (opened by the init before the bind covers
    /// it: a bind's source must be in the init's own mount namespace), which of the
    /// two (1 `/tmp`, 2 `/var/tmp`) and its name, so that it is bound back at its own
    /// path inside the private one.
    pub(crate) reach: Option<(CString, usize, Vec<CString>)>,
}

/// Size of the init's stack.
const INIT_STACK: usize = 64 * 1024;

/// The setup steps, as reported on failure.
pub(crate) const STEPS: [&str; 11] = [
    "",
    "make the mounts private (mount / MS_SLAVE)",
    "bind the task's tmp/ onto /tmp",
    "bind the task's tmp/ onto /var/tmp",
    "mount /proc for the pid namespace",
    "bring up loopback",
    "set the parent-death signal",
    "bind the task directory back at its path under the private /tmp",
    "create the task directory's tmp/ (root's, mode 0700; remove it if it is not a directory of root's)",
    "create tmp/data/ for the task user (mode 0700)",
    "unshare the mount (and network) namespace",
];

/// [`STEPS`] of the task directory's `tmp/` and `tmp/data/`.
pub(crate) const STEP_TMP: usize = 8;
pub(crate) const STEP_DATA: usize = 9;
pub(crate) const STEP_UNSHARE: usize = 10;

/// Clones the task namespaces' init: a `CLONE_VM | CLONE_NEWPID` child on a stack of
/// its own that runs [`init_main`] on `plan` (leaked: it lives as long as the init),
/// with every signal blocked around the clone so that it starts with all of them
/// blocked. Its pid and pidfd.
pub(crate) fn start_init(plan: &'static InitPlan) -> io::Result<(u32, OwnedFd)> {
    // SAFETY: a fresh anonymous private mapping, never unmapped: the init runs on
    // it for as long as it lives.
    let stack = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            INIT_STACK,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
            -1,
            0,
        )
    };
    if stack == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let top = (stack as usize + INIT_STACK) as *mut libc::c_void;
    // Only the pid namespace is made by the clone (a child is born in it); the init
    // unshares the others itself.
    let flags = libc::CLONE_VM | libc::CLONE_NEWPID | libc::CLONE_PIDFD;
    let mut pidfd: libc::c_int = -1;
    let mut all = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    let mut old = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: every signal is blocked around the clone, so the init starts with all
    // of them blocked and no executor handler can run in it; it runs `init_main` on
    // its own stack with `plan` (leaked, so alive as long as it), making only raw
    // system calls (no errno, no allocation, no lock), so sharing our memory is
    // sound. The kernel stores its pidfd in `pidfd`.
    let pid = unsafe {
        libc::sigfillset(all.as_mut_ptr());
        libc::pthread_sigmask(libc::SIG_SETMASK, all.as_ptr(), old.as_mut_ptr());
        let pid = libc::clone(
            init_main,
            top,
            flags | libc::SIGCHLD,
            plan as *const InitPlan as *mut libc::c_void,
            &mut pidfd as *mut libc::c_int,
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::pid_t>(),
        );
        let err = io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, old.as_ptr(), std::ptr::null_mut());
        if pid < 0 {
            return Err(err);
        }
        pid
    };
    // SAFETY: the kernel just created this descriptor for us (CLONE_PIDFD).
    Ok((pid as u32, unsafe { OwnedFd::from_raw_fd(pidfd) }))
}

/// fork() of the zygote: Some(child pid) in the parent, None in the child.
///
/// The zygote is single-threaded (it never starts a thread or a runtime), so the
/// child inherits no lock held by another thread and may run ordinary Rust code,
/// including the allocator; nothing else may call this.
pub(crate) fn fork_process() -> io::Result<Option<libc::pid_t>> {
    // SAFETY: see above: the only caller is the single-threaded zygote.
    match unsafe { libc::fork() } {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(None),
        pid => Ok(Some(pid)),
    }
}

/// The init: sets up, reports `[step, errno]` on the pipe (zeros when ready), then
/// reaps forever. Raw system calls only.
extern "C" fn init_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the leaked `InitPlan`.
    let plan = unsafe { &*(arg as *const InitPlan) };
    // SAFETY: raw system calls on the plan's prepared strings and on this stack.
    let (step, errno) = unsafe { init_setup(plan) };
    let mut report = [0u8; 8];
    report[..4].copy_from_slice(&(step as u32).to_ne_bytes());
    report[4..].copy_from_slice(&errno.to_ne_bytes());
    // SAFETY: as above.
    unsafe {
        syscall6(
            libc::SYS_write,
            [
                plan.ready as usize,
                report.as_ptr() as usize,
                report.len(),
                0,
                0,
                0,
            ],
        );
        syscall6(libc::SYS_close, [plan.ready as usize, 0, 0, 0, 0, 0]);
        if step != 0 {
            syscall6(libc::SYS_exit, [1, 0, 0, 0, 0, 0]);
        }
        reap_forever()
    }
}

/// The init's setup: (0, 0), or the failed step and its errno.
unsafe fn init_setup(plan: &InitPlan) -> (usize, i32) {
    let fail = |step: usize, r: isize| (step, (-r) as i32);
    // Dies with the executor (its memory is ours anyway); that kills the namespace.
    let r = syscall6(
        libc::SYS_prctl,
        [
            libc::PR_SET_PDEATHSIG as usize,
            libc::SIGKILL as usize,
            0,
            0,
            0,
            0,
        ],
    );
    if r < 0 {
        return fail(6, r);
    }
    // Close every descriptor inherited from the executor (its stdout to the agent,
    // its socket, the agent's connection) but the report pipe, so that none stays
    // open for as long as the task runs.
    let mut first = 0usize;
    for k in [plan.ready as usize, usize::MAX] {
        let last = k.min(u32::MAX as usize + 1);
        if last > first {
            let end = last - 1;
            if syscall6(libc::SYS_close_range, [first, end, 0, 0, 0, 0]) < 0 {
                for fd in first..=end.min(4096) {
                    syscall6(libc::SYS_close, [fd, 0, 0, 0, 0, 0]);
                }
            }
        }
        first = k.saturating_add(1);
    }
    let r = syscall6(libc::SYS_unshare, [plan.unshare as usize, 0, 0, 0, 0, 0]);
    if r < 0 {
        return fail(STEP_UNSHARE, r);
    }
    let null = std::ptr::null::<libc::c_char>() as usize;
    let r = syscall6(
        libc::SYS_mount,
        [
            null,
            c"/".as_ptr() as usize,
            null,
            (libc::MS_REC | libc::MS_SLAVE) as usize,
            0,
            0,
        ],
    );
    if r < 0 {
        return fail(1, r);
    }
    // The task directory, before a bind below may cover its path.
    let mut orig = -1;
    if let Some((path, _, _)) = &plan.reach {
        orig = syscall6(
            libc::SYS_openat,
            [
                libc::AT_FDCWD as usize,
                path.as_ptr() as usize,
                (libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC) as usize,
                0,
                0,
                0,
            ],
        );
        if orig < 0 {
            return fail(7, orig);
        }
    }
    // The task directory's tmp/ (root's, 0700: the task reaches data/ only through
    // its mount namespace) and tmp/data/, the task user's, made here rather than on
    // the executor's way to the first process, and in this namespace, so that the
    // descriptor of tmp/data/ that made it is also the source of the binds (a bind's
    // source must be in the init's own mount namespace): one open each.
    let tmp = match make_tmp(plan) {
        Ok(fd) => fd,
        Err(failed) => return failed,
    };
    let mut source = [0u8; 32];
    let source = fd_path(&mut source, tmp as RawFd);
    let bind = |target: &std::ffi::CStr| {
        syscall6(
            libc::SYS_mount,
            [
                source,
                target.as_ptr() as usize,
                null,
                libc::MS_BIND as usize,
                0,
                0,
            ],
        )
    };
    let r = bind(c"/tmp");
    if r < 0 {
        return fail(2, r);
    }
    if plan.var_tmp {
        let r = bind(c"/var/tmp");
        if r < 0 {
            return fail(3, r);
        }
    }
    syscall6(libc::SYS_close, [tmp as usize, 0, 0, 0, 0, 0]);
    if let Some((_, which, parts)) = &plan.reach {
        let r = bind_back(
            orig as RawFd,
            if *which == 1 { c"/tmp" } else { c"/var/tmp" },
            parts,
        );
        if r < 0 {
            return fail(7, r);
        }
    }
    let r = syscall6(
        libc::SYS_mount,
        [
            c"proc".as_ptr() as usize,
            c"/proc".as_ptr() as usize,
            c"proc".as_ptr() as usize,
            (libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC) as usize,
            0,
            0,
        ],
    );
    if r < 0 {
        return fail(4, r);
    }
    if plan.loopback {
        let r = loopback_up();
        if r < 0 {
            return fail(5, r);
        }
    }
    (0, 0)
}

/// Makes `tmp/` (root's, mode 0700: an existing one must be a directory of root's)
/// and `tmp/data/` in it (mode 0700, the task user's), each opened without following
/// links. The descriptor of `tmp/data/`, or the failed step and its errno.
unsafe fn make_tmp(plan: &InitPlan) -> Result<isize, (usize, i32)> {
    let dir_flags =
        (libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC) as usize;
    let r = syscall6(
        libc::SYS_mkdirat,
        [
            libc::AT_FDCWD as usize,
            plan.tmp_outer.as_ptr() as usize,
            0o700,
            0,
            0,
            0,
        ],
    );
    if r < 0 && r != -(libc::EEXIST as isize) {
        return Err((STEP_TMP, (-r) as i32));
    }
    let outer = syscall6(
        libc::SYS_openat,
        [
            libc::AT_FDCWD as usize,
            plan.tmp_outer.as_ptr() as usize,
            dir_flags,
            0,
            0,
            0,
        ],
    );
    if outer < 0 {
        return Err((STEP_TMP, (-outer) as i32));
    }
    let close = |fd: isize| syscall6(libc::SYS_close, [fd as usize, 0, 0, 0, 0, 0]);
    let mut st: libc::stat = std::mem::zeroed();
    let r = syscall6(
        libc::SYS_fstat,
        [
            outer as usize,
            &mut st as *mut libc::stat as usize,
            0,
            0,
            0,
            0,
        ],
    );
    if r < 0 || st.st_uid != 0 {
        close(outer);
        return Err((STEP_TMP, if r < 0 { (-r) as i32 } else { libc::EPERM }));
    }
    let data = c"data";
    let r = syscall6(
        libc::SYS_mkdirat,
        [outer as usize, data.as_ptr() as usize, 0o700, 0, 0, 0],
    );
    if r < 0 && r != -(libc::EEXIST as isize) {
        close(outer);
        return Err((STEP_DATA, (-r) as i32));
    }
    let fd = syscall6(
        libc::SYS_openat,
        [outer as usize, data.as_ptr() as usize, dir_flags, 0, 0, 0],
    );
    close(outer);
    if fd < 0 {
        return Err((STEP_DATA, (-fd) as i32));
    }
    let mut r = syscall6(libc::SYS_fchmod, [fd as usize, 0o700, 0, 0, 0, 0]);
    if r >= 0 {
        let (uid, gid) = plan.owner;
        r = syscall6(
            libc::SYS_fchown,
            [fd as usize, uid as usize, gid as usize, 0, 0, 0],
        );
    }
    if r < 0 {
        close(fd);
        return Err((STEP_DATA, (-r) as i32));
    }
    Ok(fd)
}

/// Makes `base/parts...` inside the private temporary directory (root's directories,
/// mode 0711, each opened without following links) and binds the task directory
/// (`orig`, opened before `base` was covered, closed here) onto it.
unsafe fn bind_back(orig: RawFd, base: &std::ffi::CStr, parts: &[CString]) -> isize {
    let flags = (libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC) as usize;
    let mut dir = syscall6(
        libc::SYS_openat,
        [
            libc::AT_FDCWD as usize,
            base.as_ptr() as usize,
            flags,
            0,
            0,
            0,
        ],
    );
    if dir < 0 {
        return dir;
    }
    for part in parts {
        let r = syscall6(
            libc::SYS_mkdirat,
            [dir as usize, part.as_ptr() as usize, 0o711, 0, 0, 0],
        );
        if r < 0 && r != -(libc::EEXIST as isize) {
            syscall6(libc::SYS_close, [dir as usize, 0, 0, 0, 0, 0]);
            return r;
        }
        let next = syscall6(
            libc::SYS_openat,
            [dir as usize, part.as_ptr() as usize, flags, 0, 0, 0],
        );
        syscall6(libc::SYS_close, [dir as usize, 0, 0, 0, 0, 0]);
        if next < 0 {
            return next;
        }
        dir = next;
    }
    let mut from = [0u8; 32];
    let mut to = [0u8; 32];
    let r = syscall6(
        libc::SYS_mount,
        [
            fd_path(&mut from, orig),
            fd_path(&mut to, dir as RawFd),
            0,
            (libc::MS_BIND | libc::MS_REC) as usize,
            0,
            0,
        ],
    );
    syscall6(libc::SYS_close, [dir as usize, 0, 0, 0, 0, 0]);
    syscall6(libc::SYS_close, [orig as usize, 0, 0, 0, 0, 0]);
    r
}

/// `/proc/self/fd/<fd>` as a C string in `buf`; its address.
fn fd_path(buf: &mut [u8; 32], fd: RawFd) -> usize {
    let prefix = b"/proc/self/fd/";
    buf[..prefix.len()].copy_from_slice(prefix);
    let mut digits = [0u8; 10];
    let mut n = fd.max(0) as u32;
    let mut len = 0;
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for i in 0..len {
        buf[prefix.len() + i] = digits[len - 1 - i];
    }
    buf[prefix.len() + len] = 0;
    buf.as_ptr() as usize
}

/// Sets `IFF_UP` on `lo` (a new network namespace has it down).
unsafe fn loopback_up() -> isize {
    let s = syscall6(
        libc::SYS_socket,
        [
            libc::AF_INET as usize,
            (libc::SOCK_DGRAM | libc::SOCK_CLOEXEC) as usize,
            0,
            0,
            0,
            0,
        ],
    );
    if s < 0 {
        return s;
    }
    let mut req: libc::ifreq = std::mem::zeroed();
    for (i, b) in b"lo".iter().enumerate() {
        req.ifr_name[i] = *b as libc::c_char;
    }
    let mut r = syscall6(
        libc::SYS_ioctl,
        [
            s as usize,
            libc::SIOCGIFFLAGS as usize,
            &mut req as *mut libc::ifreq as usize,
            0,
            0,
            0,
        ],
    );
    if r >= 0 {
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        r = syscall6(
            libc::SYS_ioctl,
            [
                s as usize,
                libc::SIOCSIFFLAGS as usize,
                &mut req as *mut libc::ifreq as usize,
                0,
                0,
                0,
            ],
        );
    }
    syscall6(libc::SYS_close, [s as usize, 0, 0, 0, 0, 0]);
    r
}

/// Reaps every process reparented to the init, sleeping in `rt_sigtimedwait` for
/// SIGCHLD (blocked, like every signal) between rounds.
unsafe fn reap_forever() -> ! {
    let sigchld: u64 = 1 << (libc::SIGCHLD - 1);
    loop {
        loop {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let r = syscall6(
                libc::SYS_waitid,
                [
                    libc::P_ALL as usize,
                    0,
                    &mut info as *mut libc::siginfo_t as usize,
                    (libc::WEXITED | libc::WNOHANG) as usize,
                    0,
                    0,
                ],
            );
            if r < 0 || info.si_pid() == 0 {
                break;
            }
        }
        syscall6(
            libc::SYS_rt_sigtimedwait,
            [&sigchld as *const u64 as usize, 0, 0, 8, 0, 0],
        );
    }
}
