//! Raw system calls for code that runs in a process sharing the executor's memory
//! (`CLONE_VM`): the pid namespace's init ([`crate::ns`]) runs beside the executor for
//! the task's whole life, so it must not touch anything the executor's threads use,
//! not even `errno` (the C library's `syscall` and wrappers write it in the calling
//! thread's TLS, which for a `CLONE_VM` child is the executor's main thread's). And
//! `clone3`, which the C library does not export, to start a process directly inside
//! the task's cgroup (`CLONE_INTO_CGROUP`, cgroup v2) on its own stack.
//!
//! x86-64 and arm64 only; elsewhere [`SUPPORTED`] is false and the callers fall back
//! (no `clone3`) or refuse (no namespaces).

#![allow(unsafe_code)]

/// Whether raw system calls and [`clone3`] exist on this architecture.
pub const SUPPORTED: bool = cfg!(any(target_arch = "x86_64", target_arch = "aarch64"));

/// `clone3`'s argument (`struct clone_args`, version 2 with `cgroup`).
#[repr(C)]
#[derive(Default, Debug)]
pub struct CloneArgs {
    pub flags: u64,
    pub pidfd: u64,
    pub child_tid: u64,
    pub parent_tid: u64,
    pub exit_signal: u64,
    /// The lowest address of the child's stack.
    pub stack: u64,
    pub stack_size: u64,
    pub tls: u64,
    pub set_tid: u64,
    pub set_tid_size: u64,
    /// A descriptor of the cgroup v2 directory to start in (`CLONE_INTO_CGROUP`).
    pub cgroup: u64,
}

/// `CLONE_INTO_CGROUP` (Linux 5.7).
pub const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// The system call number `n` with six arguments: the kernel's return value
/// (`-errno` on failure). Touches no memory of its own.
///
/// # Safety
/// As for the system call: pointer arguments must be valid for it.
#[cfg(target_arch = "x86_64")]
pub unsafe fn syscall6(n: libc::c_long, a: [usize; 6]) -> isize {
    let ret: isize;
    core::arch::asm!(
        "syscall",
        inlateout("rax") n as isize => ret,
        in("rdi") a[0], in("rsi") a[1], in("rdx") a[2],
        in("r10") a[3], in("r8") a[4], in("r9") a[5],
        lateout("rcx") _, lateout("r11") _,
        options(nostack),
    );
    ret
}

/// See the x86-64 version.
///
/// # Safety
/// As for the system call: pointer arguments must be valid for it.
#[cfg(target_arch = "aarch64")]
pub unsafe fn syscall6(n: libc::c_long, a: [usize; 6]) -> isize {
    let ret: isize;
    core::arch::asm!(
        "svc 0",
        in("x8") n,
        inlateout("x0") a[0] as isize => ret,
        in("x1") a[1], in("x2") a[2], in("x3") a[3], in("x4") a[4], in("x5") a[5],
        options(nostack),
    );
    ret
}

/// Fallback where raw system calls are not written: the C library's (callers check
/// [`SUPPORTED`] before running it in a `CLONE_VM` child).
///
/// # Safety
/// As for the system call: pointer arguments must be valid for it.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub unsafe fn syscall6(n: libc::c_long, a: [usize; 6]) -> isize {
    let r = libc::syscall(n, a[0], a[1], a[2], a[3], a[4], a[5]);
    if r == -1 {
        -(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO) as isize)
    } else {
        r as isize
    }
}

/// `clone3(args)`: in the parent, the child's pid or `-errno`; the child starts on
/// `args.stack` (which must be set, its top 16-byte aligned) and calls `f(arg)`, which
/// must not return (it execs or `_exit`s; should it return, the child exits with its
/// value).
///
/// # Safety
/// `args` as `clone3` wants it; `f` must be safe to run in the child the flags make
/// (with `CLONE_VM`: only raw system calls on prepared memory).
#[cfg(target_arch = "x86_64")]
pub unsafe fn clone3(
    args: &CloneArgs,
    f: extern "C" fn(*mut libc::c_void) -> libc::c_int,
    arg: *mut libc::c_void,
) -> isize {
    let ret: isize;
    core::arch::asm!(
        "syscall",
        "test rax, rax",
        "jnz 2f",
        // The child, on its own stack: f(arg), then exit with what it returned.
        "and rsp, -16",
        "mov rdi, r12",
        "call r13",
        "mov edi, eax",
        "mov eax, 60",
        "syscall",
        "ud2",
        "2:",
        inlateout("rax") libc::SYS_clone3 as isize => ret,
        in("rdi") args as *const CloneArgs,
        in("rsi") std::mem::size_of::<CloneArgs>(),
        in("r12") arg,
        in("r13") f,
        lateout("rcx") _, lateout("r11") _,
    );
    ret
}

/// See the x86-64 version.
///
/// # Safety
/// As there.
#[cfg(target_arch = "aarch64")]
pub unsafe fn clone3(
    args: &CloneArgs,
    f: extern "C" fn(*mut libc::c_void) -> libc::c_int,
    arg: *mut libc::c_void,
) -> isize {
    let ret: isize;
    core::arch::asm!(
        "svc 0",
        "cbnz x0, 2f",
        "mov x0, x9",
        "blr x10",
        "mov x8, #93",
        "svc 0",
        "brk #1",
        "2:",
        in("x8") libc::SYS_clone3,
        inlateout("x0") args as *const CloneArgs as isize => ret,
        in("x1") std::mem::size_of::<CloneArgs>(),
        in("x9") arg,
        in("x10") f,
    );
    ret
}

/// Where `clone3` is not written: `-ENOSYS`, so callers take their fallback.
///
/// # Safety
/// Always safe; unsafe to match the others.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub unsafe fn clone3(
    _args: &CloneArgs,
    _f: extern "C" fn(*mut libc::c_void) -> libc::c_int,
    _arg: *mut libc::c_void,
) -> isize {
    -(libc::ENOSYS as isize)
}

// ---- `drover-executor exec` (crate::exec): a single-threaded helper process. ----

/// A pidfd of process `pid` (`pidfd_open`).
pub fn pidfd_open(pid: u32) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd as _;
    // SAFETY: pidfd_open takes no pointers; on success it returns a new descriptor
    // nobody else owns.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: as above, a fresh descriptor.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as std::os::fd::RawFd) })
}

/// Forks this process: `Some(child)` in the parent, `None` in the child.
/// Only for a process with a single thread (the exec helper), so the child holds no
/// lock another thread held.
pub fn fork_single_threaded() -> std::io::Result<Option<nix::unistd::Pid>> {
    // SAFETY: the caller is single-threaded (documented above), so the child may go
    // on running ordinary Rust code until it execs.
    match unsafe { nix::unistd::fork() }.map_err(std::io::Error::from)? {
        nix::unistd::ForkResult::Parent { child } => Ok(Some(child)),
        nix::unistd::ForkResult::Child => Ok(None),
    }
}

/// The pid [`forward_signals`] passes signals on to.
static FORWARD_TO: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn forward(sig: libc::c_int) {
    let pid = FORWARD_TO.load(std::sync::atomic::Ordering::SeqCst);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe and takes no pointers.
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

/// From now on `signals` sent to this process are passed on to `pid`.
pub fn forward_signals(pid: nix::unistd::Pid, signals: &[libc::c_int]) -> std::io::Result<()> {
    FORWARD_TO.store(pid.as_raw(), std::sync::atomic::Ordering::SeqCst);
    for &sig in signals {
        // SAFETY: the handler only loads an atomic and calls kill, both
        // async-signal-safe; sa_mask and the struct live on this stack.
        let r = unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = forward as extern "C" fn(libc::c_int) as usize;
            act.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut act.sa_mask);
            libc::sigaction(sig, &act, std::ptr::null_mut())
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Puts SIGPIPE back to its default action (Rust ignores it, and an exec keeps an
/// ignored signal ignored).
pub fn default_sigpipe() {
    // SAFETY: SIG_DFL installs no handler.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Makes the terminal on `fd` this session's controlling terminal (`TIOCSCTTY`).
pub fn set_controlling_terminal(fd: std::os::fd::RawFd) -> std::io::Result<()> {
    // SAFETY: TIOCSCTTY takes an integer argument, no pointer.
    if unsafe { libc::ioctl(fd, libc::TIOCSCTTY as _, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Whether the process of `pidfd` still exists (signal 0 through the pidfd).
pub fn pidfd_alive(pidfd: std::os::fd::BorrowedFd<'_>) -> bool {
    use std::os::fd::AsRawFd as _;
    // SAFETY: pidfd_send_signal with signal 0 and a null siginfo only checks.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            0,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        ) == 0
    }
}

/// `struct fsxattr` (`FS_IOC_FSGETXATTR` / `FS_IOC_FSSETXATTR`).
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct FsXattr {
    xflags: u32,
    extsize: u32,
    nextents: u32,
    projid: u32,
    cowextsize: u32,
    pad: [u8; 8],
}

/// `_IOR('X', 31, struct fsxattr)`.
const FS_IOC_FSGETXATTR: libc::c_ulong = 0x801c_581f;
/// `_IOW('X', 32, struct fsxattr)`.
const FS_IOC_FSSETXATTR: libc::c_ulong = 0x401c_5820;
/// New entries of a directory with this flag get its project id.
pub const FS_XFLAG_PROJINHERIT: u32 = 0x200;

/// The project id and `xflags` of the file `fd` (`FS_IOC_FSGETXATTR`).
pub fn project_of(fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<(u32, u32)> {
    let mut attr = FsXattr::default();
    // SAFETY: the ioctl writes one `struct fsxattr` into `attr`.
    let r = unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            FS_IOC_FSGETXATTR as _,
            &mut attr,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((attr.projid, attr.xflags))
}

/// Sets the project id of the file `fd` to `projid`, and on a directory
/// [`FS_XFLAG_PROJINHERIT`] so that what is created in it inherits the id
/// (`FS_IOC_FSSETXATTR`).
pub fn set_project(fd: std::os::fd::BorrowedFd<'_>, projid: u32) -> std::io::Result<()> {
    let mut attr = FsXattr::default();
    let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
    // SAFETY: the ioctl writes one `struct fsxattr` into `attr`.
    if unsafe { libc::ioctl(raw, FS_IOC_FSGETXATTR as _, &mut attr) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    attr.projid = projid;
    attr.xflags |= FS_XFLAG_PROJINHERIT;
    // SAFETY: the ioctl reads one `struct fsxattr` from `attr`.
    if unsafe { libc::ioctl(raw, FS_IOC_FSSETXATTR as _, &attr) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `QCMD(Q_GETQUOTA, PRJQUOTA)` and `QCMD(Q_SETQUOTA, PRJQUOTA)`.
const Q_GETQUOTA_PRJ: u32 = (0x80_0007 << 8) | 2;
const Q_SETQUOTA_PRJ: u32 = (0x80_0008 << 8) | 2;
/// `QIF_BLIMITS`: the block limits of a `dqblk` are set.
const QIF_BLIMITS: u32 = 1;

/// `quotactl_fd(fd, cmd, id, addr)` (Linux 5.14): the quota of the filesystem holding
/// `fd`, without naming its block device.
fn quotactl_fd(
    fd: std::os::fd::BorrowedFd<'_>,
    cmd: u32,
    id: u32,
    dq: &mut libc::dqblk,
) -> std::io::Result<()> {
    // SAFETY: quotactl_fd reads or writes one `struct if_dqblk` (`libc::dqblk`) at `dq`.
    let r = unsafe {
        libc::syscall(
            443, // SYS_quotactl_fd, the same number on every architecture
            std::os::fd::AsRawFd::as_raw_fd(&fd) as libc::c_long,
            cmd as libc::c_long,
            id as libc::c_long,
            dq as *mut libc::dqblk,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Bytes charged to project `projid` on the filesystem holding `fd` (`Q_GETQUOTA`,
/// `PRJQUOTA`).
pub fn project_usage(fd: std::os::fd::BorrowedFd<'_>, projid: u32) -> std::io::Result<u64> {
    // SAFETY: all-zero is a valid `dqblk` (plain integers).
    let mut dq: libc::dqblk = unsafe { std::mem::zeroed() };
    quotactl_fd(fd, Q_GETQUOTA_PRJ, projid, &mut dq)?;
    Ok(dq.dqb_curspace)
}

/// Sets the block hard limit of project `projid` on the filesystem holding `fd` to
/// `bytes` (rounded up to the quota's 1 KiB blocks; 0: no limit) (`Q_SETQUOTA`,
/// `PRJQUOTA`).
pub fn set_project_limit(
    fd: std::os::fd::BorrowedFd<'_>,
    projid: u32,
    bytes: u64,
) -> std::io::Result<()> {
    // SAFETY: all-zero is a valid `dqblk` (plain integers).
    let mut dq: libc::dqblk = unsafe { std::mem::zeroed() };
    dq.dqb_bhardlimit = bytes.div_ceil(1024);
    dq.dqb_valid = QIF_BLIMITS;
    quotactl_fd(fd, Q_SETQUOTA_PRJ, projid, &mut dq)
}
