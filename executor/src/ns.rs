//! The task's namespaces: a pid namespace (its processes see and signal only each
//! other; `/proc` shows only them), a mount namespace (a private `/tmp` and `/var/tmp`
//! bound from the task directory's `tmp/`, its own `/proc`) and, for
//! `task.network: isolated`, a network namespace with only loopback, up.
//!
//! The executor stays outside as the supervisor. At setup it clones the namespaces'
//! init: a tiny process sharing the executor's memory (`CLONE_VM`, so it costs no page
//! table copy and no memory of its own but a 64 KiB stack) that makes the mounts,
//! reports, closes every descriptor it inherited, blocks every signal and then only
//! reaps what is reparented to it, with raw system calls ([`crate::sys`]). It is not in
//! the task's cgroup (it takes none of the task's pids) and dies with the executor
//! (`PR_SET_PDEATHSIG`); its death kills whatever is left in the namespace.
//!
//! Task processes and shell health checks are still the executor's children, so it
//! waits on them, signals them and reads their pids as before: for each clone the
//! executor's thread enters the pid namespace for its children and leaves it right
//! after ([`TaskNamespaces::enter_for_children`]), and the child enters the mount (and
//! network) namespace itself before its `chdir`. Inside, the pid of the init is 1; a
//! process of the task signalling it is ignored by the kernel (init has no handler),
//! and pids outside (other tasks', the host's) do not exist there.

#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::sys::syscall6;

/// The namespaces of one task, held by its executor.
#[derive(Debug)]
pub struct TaskNamespaces {
    init_pid: u32,
    init_pidfd: OwnedFd,
    /// This thread's own pid namespace, to go back to after a clone.
    own_pid_ns: OwnedFd,
    /// What a child enters through the init's pidfd: mount, and network when isolated.
    join_flags: libc::c_int,
}

/// What the init needs, prepared (and leaked: the init runs as long as the task).
struct InitPlan {
    /// The write end of the pipe its setup result goes to.
    ready: RawFd,
    /// The namespaces the init unshares itself (mount; network when isolated), so that
    /// copying the host's mount table (and making a network namespace) happens beside
    /// the executor's own setup instead of in its `clone`.
    unshare: libc::c_int,
    /// `<task dir>/tmp`: made by the init, root's, mode 0700.
    tmp_outer: CString,
    /// Who owns `tmp/data/` (the task user's uid and gid), made in it with mode 0700
    /// and bound onto `/tmp` and `/var/tmp`.
    owner: (u32, u32),
    /// Whether `/var/tmp` exists (to bind onto).
    var_tmp: bool,
    /// Bring loopback up (a new network namespace).
    loopback: bool,
    /// When the task directory lies under `/tmp` or `/var/tmp` (tests do that): the
    /// top directory there that holds it (opened by the init before the bind covers
    /// it: a bind's source must be in the init's own mount namespace), which of the
    /// two (1 `/tmp`, 2 `/var/tmp`) and its name, so that it is bound back at its own
    /// path inside the private one.
    reach: Option<(CString, usize, Vec<CString>)>,
}

/// Size of the init's stack.
const INIT_STACK: usize = 64 * 1024;

/// The setup steps, as reported on failure.
const STEPS: [&str; 11] = [
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
const STEP_TMP: usize = 8;
const STEP_DATA: usize = 9;
const STEP_UNSHARE: usize = 10;

impl TaskNamespaces {
    /// Starts making the namespaces with their init; `tmp_outer` is the task
    /// directory's `tmp/` (root's, mode 0700), in which the init makes `data/`, the
    /// task's own temporary directory, owned by `owner` (uid, gid) with mode 0700. The
    /// init makes both, unshares the mount (and network) namespace and mounts while the
    /// executor goes on with its own setup; [`PendingNamespaces::wait_ready`] waits
    /// for it. Fails with a message naming the step.
    pub fn create(
        task_dir: &Path,
        tmp_outer: &Path,
        owner: (u32, u32),
        network_isolated: bool,
    ) -> Result<PendingNamespaces, String> {
        if !crate::sys::SUPPORTED {
            return Err(
                "task namespaces need x86-64 or arm64 (raw system calls for their init)".into(),
            );
        }
        let tmp_path = tmp_outer.to_path_buf();
        let tmp_outer = CString::new(tmp_outer.as_os_str().as_bytes())
            .map_err(|_| "the task directory's path holds a nul byte".to_string())?;
        let own_pid_ns = std::fs::File::open("/proc/thread-self/ns/pid")
            .map_err(|e| format!("cannot open /proc/thread-self/ns/pid: {e}"))?;
        let mut fds = [0; 2];
        // SAFETY: pipe2 writes two descriptors into `fds`.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(format!("pipe: {}", io::Error::last_os_error()));
        }
        // SAFETY: pipe2 just created both descriptors; nothing else owns them.
        let (ready_r, ready_w) =
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let var_tmp = Path::new("/var/tmp").is_dir();
        let real = std::fs::canonicalize(task_dir)
            .map_err(|e| format!("cannot resolve {}: {e}", task_dir.display()))?;
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
                CString::new(top.as_os_str().as_bytes())
                    .map_err(|_| "the task directory's path holds a nul byte".to_string())?,
                which,
                vec![CString::new(name.as_bytes())
                    .map_err(|_| "the task directory's path holds a nul byte".to_string())?],
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
            return Err(format!(
                "cannot map the init's stack: {}",
                io::Error::last_os_error()
            ));
        }
        let top = (stack as usize + INIT_STACK) as *mut libc::c_void;
        // Only the pid namespace is made by the clone (a child is born in it); the
        // init unshares the others itself.
        let flags = libc::CLONE_VM | libc::CLONE_NEWPID | libc::CLONE_PIDFD;
        let mut pidfd: libc::c_int = -1;
        let mut all = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
        let mut old = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: every signal is blocked around the clone, so the init starts with
        // all of them blocked and no executor handler can run in it; it runs
        // `init_main` on its own stack with `plan` (leaked, so alive as long as it),
        // making only raw system calls (no errno, no allocation, no lock), so sharing
        // our memory is sound. The kernel stores its pidfd in `pidfd`.
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
                return Err(format!("cannot clone the task's namespaces: {err}"));
            }
            pid
        };
        drop(ready_w);
        // SAFETY: the kernel just created this descriptor for us (CLONE_PIDFD).
        let init_pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
        let ns = TaskNamespaces {
            init_pid: pid as u32,
            init_pidfd,
            own_pid_ns: own_pid_ns.into(),
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

    /// The namespaces a child enters itself (mount; network when isolated).
    pub fn join_flags(&self) -> libc::c_int {
        self.join_flags
    }

    /// The init's pid (as the executor sees it).
    pub fn init_pid(&self) -> u32 {
        self.init_pid
    }

    /// Makes this thread's next children be born in the task's pid namespace, until
    /// [`Entered::leave`]. The caller clones at once and leaves: a thread this thread
    /// created meanwhile would fail (`CLONE_THREAD` into another pid namespace), which
    /// is why only the spawn path, with every signal blocked, does this.
    pub fn enter_for_children(&self) -> io::Result<Entered<'_>> {
        // SAFETY: setns on a descriptor we own; it changes only this thread's
        // namespace for its future children.
        if unsafe { libc::setns(self.init_pidfd.as_raw_fd(), libc::CLONE_NEWPID) } != 0 {
            return Err(io::Error::other(format!(
                "cannot enter the task's pid namespace: {}",
                io::Error::last_os_error()
            )));
        }
        Ok(Entered(self))
    }

    /// Kills the init, which kills every process left in the namespace, and reaps it
    /// if it is gone already (it waits for the executor to reap its own children in
    /// the namespace first, so this never blocks on it; a zombie left goes with the
    /// executor).
    pub fn end(&self) {
        // SAFETY: pidfd_send_signal on our pidfd, no pointers but a null siginfo.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.init_pidfd.as_raw_fd(),
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            );
        }
        let mut status = 0;
        for _ in 0..20 {
            // SAFETY: waitpid writes one int, `status`.
            let r =
                unsafe { libc::waitpid(self.init_pid as libc::pid_t, &mut status, libc::WNOHANG) };
            if r != 0 {
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
    tmp_outer: std::path::PathBuf,
}

impl PendingNamespaces {
    /// Waits for the init's report: the namespaces, or the step that failed.
    #[allow(unsafe_code)]
    pub fn wait_ready(self) -> Result<TaskNamespaces, String> {
        let PendingNamespaces {
            ns,
            ready: ready_r,
            tmp_outer,
        } = self;
        let mut report = [0u8; 8];
        let mut got = 0;
        while got < report.len() {
            // SAFETY: read writes at most the rest of `report`.
            let n = unsafe {
                libc::read(
                    ready_r.as_raw_fd(),
                    report[got..].as_mut_ptr().cast(),
                    report.len() - got,
                )
            };
            if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            if n <= 0 {
                break;
            }
            got += n as usize;
        }
        let step = u32::from_ne_bytes([report[0], report[1], report[2], report[3]]) as usize;
        let errno = i32::from_ne_bytes([report[4], report[5], report[6], report[7]]);
        if got < report.len() || step != 0 {
            ns.end();
            let what = STEPS.get(step).copied().unwrap_or("start");
            return Err(if got < report.len() {
                "the task namespaces' init exited during setup".to_string()
            } else if step == STEP_TMP || step == STEP_DATA {
                format!(
                    "cannot {what} at {}: {}",
                    tmp_outer.display(),
                    io::Error::from_raw_os_error(errno)
                )
            } else {
                format!(
                    "cannot {what} in the task's namespaces: {}",
                    io::Error::from_raw_os_error(errno)
                )
            });
        }
        Ok(ns)
    }
}

/// This thread's children are born in the task's pid namespace until [`Entered::leave`].
#[must_use]
pub struct Entered<'a>(&'a TaskNamespaces);

impl Entered<'_> {
    /// Back to this thread's own pid namespace for its children.
    pub fn leave(self) -> io::Result<()> {
        // SAFETY: setns on a descriptor we own (our own pid namespace, always
        // enterable).
        if unsafe { libc::setns(self.0.own_pid_ns.as_raw_fd(), libc::CLONE_NEWPID) } != 0 {
            return Err(io::Error::other(format!(
                "cannot return to the executor's pid namespace: {}",
                io::Error::last_os_error()
            )));
        }
        Ok(())
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
    // The task directory's tmp/ (root's, 0700: the task reaches data/ only through
    // its mount namespace) and tmp/data/, the task user's, made here rather than on
    // the executor's way to the first process.
    let made = make_tmp(plan);
    if made.0 != 0 {
        return made;
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
    // tmp/data/, opened once, in this namespace (a bind's source must be in it): the
    // first bind may cover its path.
    let tmp = open_data(plan);
    if tmp < 0 {
        return fail(2, tmp);
    }
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
/// links. `(0, 0)`, or the failed step and its errno.
unsafe fn make_tmp(plan: &InitPlan) -> (usize, i32) {
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
        return (STEP_TMP, (-r) as i32);
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
        return (STEP_TMP, (-outer) as i32);
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
        return (STEP_TMP, if r < 0 { (-r) as i32 } else { libc::EPERM });
    }
    let data = c"data";
    let r = syscall6(
        libc::SYS_mkdirat,
        [outer as usize, data.as_ptr() as usize, 0o700, 0, 0, 0],
    );
    if r < 0 && r != -(libc::EEXIST as isize) {
        close(outer);
        return (STEP_DATA, (-r) as i32);
    }
    let fd = syscall6(
        libc::SYS_openat,
        [outer as usize, data.as_ptr() as usize, dir_flags, 0, 0, 0],
    );
    close(outer);
    if fd < 0 {
        return (STEP_DATA, (-fd) as i32);
    }
    let mut r = syscall6(libc::SYS_fchmod, [fd as usize, 0o700, 0, 0, 0, 0]);
    if r >= 0 {
        let (uid, gid) = plan.owner;
        r = syscall6(
            libc::SYS_fchown,
            [fd as usize, uid as usize, gid as usize, 0, 0, 0],
        );
    }
    close(fd);
    if r < 0 {
        return (STEP_DATA, (-r) as i32);
    }
    (0, 0)
}

/// `tmp/data/` opened with `O_PATH`, never through a link: its descriptor or `-errno`.
unsafe fn open_data(plan: &InitPlan) -> isize {
    let flags = (libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC) as usize;
    let outer = syscall6(
        libc::SYS_openat,
        [
            libc::AT_FDCWD as usize,
            plan.tmp_outer.as_ptr() as usize,
            flags,
            0,
            0,
            0,
        ],
    );
    if outer < 0 {
        return outer;
    }
    let fd = syscall6(
        libc::SYS_openat,
        [outer as usize, c"data".as_ptr() as usize, flags, 0, 0, 0],
    );
    syscall6(libc::SYS_close, [outer as usize, 0, 0, 0, 0, 0]);
    fd
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
