//! The executor's system interface: every `unsafe` of the executor but the code of
//! its clone children ([`crate::child`]) is here, behind safe functions (descriptors,
//! signals, pidfds, waiting, the disk scan's directory calls, the memory release of a
//! settled executor). New ones go at the end of this file.
//!
//! Also the raw system calls for code that runs in a process sharing the executor's
//! memory (`CLONE_VM`): the pid namespace's init ([`crate::child`]) runs beside the
//! executor for the task's whole life, so it must not touch anything the executor's
//! threads use, not even `errno` (the C library's `syscall` and wrappers write it in
//! the calling thread's TLS, which for a `CLONE_VM` child is the executor's main
//! thread's). And `clone3`, which the C library does not export, to start a process
//! directly inside the task's cgroup (`CLONE_INTO_CGROUP`, cgroup v2) on its own stack.
//!
//! Raw system calls and `clone3`: x86-64 and arm64 only; elsewhere [`SUPPORTED`] is
//! false and the callers fall back (no `clone3`) or refuse (no namespaces).

#![allow(unsafe_code)]

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::process::ExitStatus;

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

// ---- Descriptors.

/// A pipe, both ends close-on-exec: (read end, write end).
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 just created both descriptors for us; nothing else owns them.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Makes `fd` non-blocking (its only status flag: for a pipe's read end).
pub fn set_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: fcntl sets the status flags of a descriptor we borrow; no memory.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Takes ownership of a descriptor handed to this process by number (`--ready-fd`,
/// the fork server's agent connection, the zygote's socket) and marks it
/// close-on-exec so that no task process inherits it. `EBADF` for 0-2 and for a
/// descriptor that is not open. Each number must be taken once, before anything else
/// opens files (the callers do so at start).
pub fn adopt_fd(fd: RawFd) -> io::Result<OwnedFd> {
    if fd < 3 {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    // SAFETY: fcntl only sets the descriptor flags of `fd` (EBADF when not open).
    if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is open (checked above) and was handed to this process for this
    // purpose; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Ownership of a descriptor that arrived by SCM_RIGHTS (the kernel installed it in
/// this process for the message just received; nothing else owns it).
pub fn owned_received_fd(raw: RawFd) -> OwnedFd {
    // SAFETY: as said; the caller passes each received descriptor once.
    unsafe { OwnedFd::from_raw_fd(raw) }
}

/// Opens `name` in `dir` for appending (created with `mode`, never through a link)
/// and puts it on descriptor 2. Errors leave stderr as it was.
pub fn open_onto_stderr(dir: BorrowedFd<'_>, name: &CStr, mode: u32) {
    // SAFETY: openat reads the NUL-terminated name and opens a new descriptor relative
    // to `dir`; dup2 and close only touch descriptors: the new one (ours) and 2.
    unsafe {
        let fd = libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            mode as libc::c_uint,
        );
        if fd >= 0 {
            libc::dup2(fd, 2);
            libc::close(fd);
        }
    }
}

/// Registers a descriptor (a pidfd) with the runtime, to wait until it is readable.
pub fn watch_readable(fd: OwnedFd) -> io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    // SAFETY: the AsyncFd owns the OwnedFd, which stays open and the same descriptor
    // until the AsyncFd is dropped.
    Ok(unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
    }?)
}

/// Waits until `fd` is readable (or hung up), with SIGCHLD unblocked only while
/// waiting: a child's exit interrupts the wait (EINTR) and is never missed between
/// reaping and waiting (the zygote's loop).
pub fn wait_readable(fd: BorrowedFd<'_>) -> io::Result<()> {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let mut unblocked = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: sigemptyset initialises the set; `pfd` is one valid pollfd for the
    // call's duration and a null timeout means none.
    let n = unsafe {
        libc::sigemptyset(unblocked.as_mut_ptr());
        libc::ppoll(&mut pfd, 1, std::ptr::null(), unblocked.as_ptr())
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

// ---- Processes, pidfds and signals.

/// `waitpid(pid, WNOHANG)`: the exit status once `pid` exited, None while it runs.
pub fn reap(pid: u32) -> io::Result<Option<ExitStatus>> {
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
pub fn reap_exited(pid: u32) {
    let mut status = 0;
    // SAFETY: waitpid writes one int, `status`, which lives across the call.
    while unsafe { libc::waitpid(pid as libc::pid_t, &mut status, 0) } == -1
        && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted
    {}
}

/// pidfd_open(2): a descriptor that refers to `pid` and becomes readable when it exits.
pub fn pidfd_open(pid: libc::pid_t) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes two integers and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just created this descriptor for us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// pidfd_send_signal(2) without a siginfo.
pub fn pidfd_send_signal(pidfd: BorrowedFd<'_>, signal: libc::c_int) -> io::Result<()> {
    // SAFETY: integers and a null siginfo pointer.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// setns(2): this thread enters the namespace(s) `nstype` of `fd` (a namespace file or
/// a pidfd).
pub fn setns(fd: BorrowedFd<'_>, nstype: libc::c_int) -> io::Result<()> {
    // SAFETY: setns on a borrowed descriptor; it changes only this thread's namespaces.
    if unsafe { libc::setns(fd.as_raw_fd(), nstype) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Ends the process with `_exit`: straight to the kernel, no exit handler, no
/// destructor.
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit only ends the process.
    unsafe { libc::_exit(code) }
}

/// Installs `handler` for SIGCHLD without SA_RESTART (SA_NOCLDSTOP). The handler must
/// be async-signal-safe; the zygote's does nothing (its only job is to make `ppoll`
/// return EINTR), and no other SIGCHLD handler exists in that process.
pub fn install_sigchld_handler(handler: extern "C" fn(libc::c_int)) -> io::Result<()> {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let action = SigAction::new(
        SigHandler::Handler(handler),
        SaFlags::SA_NOCLDSTOP,
        SigSet::empty(),
    );
    // SAFETY: see above (the handler is given as a plain function that cannot
    // capture; its async-signal safety is the caller's, as documented).
    unsafe { sigaction(Signal::SIGCHLD, &action) }?;
    Ok(())
}

/// Back to SIGCHLD's default disposition.
pub fn reset_sigchld() -> io::Result<()> {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let action = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
    // SAFETY: restoring the default disposition installs no handler.
    unsafe { sigaction(Signal::SIGCHLD, &action) }?;
    Ok(())
}

// ---- Memory (`crate::resident`).

/// One malloc arena for the whole process (`M_ARENA_MAX=1`); before any thread.
pub fn single_malloc_arena() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets a malloc parameter.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Returns the heap's free pages to the kernel (glibc keeps them otherwise).
pub fn malloc_trim() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases memory that malloc considers free.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The page-aligned (address, length) of every loaded segment of the executor's
/// own binary that is mapped without write permission. The RELRO part of the data
/// (relocated, then made read-only) lies inside the writable segment, so it is never
/// among them: unmapping it would bring back unrelocated pointers.
pub fn read_only_segments() -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    // SAFETY: the callback only reads the program headers the loader passes it, for
    // the duration of the call, and writes to `out` through the pointer it is given.
    unsafe {
        libc::dl_iterate_phdr(Some(collect_segments), (&raw mut out).cast());
    }
    out
}

/// `dl_iterate_phdr` callback: the first object is the main program; stop after it.
unsafe extern "C" fn collect_segments(
    info: *mut libc::dl_phdr_info,
    _size: libc::size_t,
    data: *mut libc::c_void,
) -> libc::c_int {
    // SAFETY: the loader passes a valid `dl_phdr_info` whose `dlpi_phdr` points at
    // `dlpi_phnum` headers, and `data` is the Vec given to `dl_iterate_phdr`.
    let (info, out) = unsafe { (&*info, &mut *data.cast::<Vec<(usize, usize)>>()) };
    let headers = if info.dlpi_phdr.is_null() {
        &[][..]
    } else {
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) }
    };
    let page = page_size();
    for h in headers {
        if h.p_type == libc::PT_LOAD && h.p_flags & libc::PF_W == 0 {
            let start = (info.dlpi_addr as usize + h.p_vaddr as usize) & !(page - 1);
            let end =
                (info.dlpi_addr as usize + (h.p_vaddr + h.p_memsz) as usize).div_ceil(page) * page;
            out.push((start, end - start));
        }
    }
    1
}

/// The page size.
pub fn page_size() -> usize {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .map_or(4096, |p| p as usize)
}

/// Drops the mappings of the binary's read-only segments ([`read_only_segments`],
/// `madvise(MADV_DONTNEED)`): a private file mapping never written is mapped again
/// from the file on its next touch. The bytes of address space released.
pub fn release_read_only_segments() -> usize {
    read_only_segments()
        .into_iter()
        .map(|(start, len)| {
            // SAFETY: the range is a read-only, never-written mapping of our own
            // binary, so dropping its pages changes no memory contents.
            let r = unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_DONTNEED) };
            if r == 0 {
                len
            } else {
                0
            }
        })
        .sum()
}

// ---- The disk scan's directory calls (`crate::disk`): raw, so that a settled
// executor's scan runs no std helper from the cold part of the layout.

/// A directory descriptor, closed when dropped.
pub struct Dir(RawFd);

impl Drop for Dir {
    fn drop(&mut self) {
        // SAFETY: the descriptor is this `Dir`'s alone.
        unsafe { libc::close(self.0) };
    }
}

/// Whether `buf` holds a NUL at `from` or after it (a loop, not a slice by a range).
fn nul_from(buf: &[u8], from: usize) -> bool {
    let mut i = from;
    while i < buf.len() {
        if buf[i] == 0 {
            return true;
        }
        i += 1;
    }
    false
}

/// Opens the directory named by the NUL-terminated bytes of `buf` from `from`,
/// relative to `dir` (None: the current directory), without following a link.
pub fn open_dir(dir: Option<&Dir>, buf: &[u8], from: usize) -> Option<Dir> {
    if !nul_from(buf, from) {
        return None;
    }
    let at = dir.map_or(libc::AT_FDCWD, |d| d.0);
    // SAFETY: openat reads the name, NUL-terminated within `buf` (checked); the
    // descriptor it returns is ours alone.
    let fd = unsafe {
        libc::openat(
            at,
            buf.as_ptr().wrapping_add(from).cast(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    (fd >= 0).then_some(Dir(fd))
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)` (`AT_EMPTY_PATH` too, for `""`: `dir`
/// itself); the name is the NUL-terminated bytes of `buf` from `from`.
pub fn stat_at(dir: &Dir, buf: &[u8], from: usize) -> Option<libc::stat> {
    if !nul_from(buf, from) {
        return None;
    }
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstatat writes one `stat` into `st` and reads the name, NUL-terminated
    // within `buf` (checked).
    let r = unsafe {
        libc::fstatat(
            dir.0,
            buf.as_ptr().wrapping_add(from).cast(),
            st.as_mut_ptr(),
            libc::AT_SYMLINK_NOFOLLOW | libc::AT_EMPTY_PATH,
        )
    };
    // SAFETY: fstatat succeeded, so it filled `st`.
    (r == 0).then(|| unsafe { st.assume_init() })
}

/// `buf[from..=end]` (empty when out of bounds) without std's out-of-line range
/// indexing, which the layout places away from the settled code.
pub fn bytes_through(buf: &[u8], from: usize, end: usize) -> &[u8] {
    if from > end || end >= buf.len() {
        return &[];
    }
    // SAFETY: `from..=end` lies within `buf` (checked).
    unsafe { std::slice::from_raw_parts(buf.as_ptr().wrapping_add(from), end + 1 - from) }
}

/// `getdents64` of `dir` into `buf`: the bytes of records written, 0 at the end,
/// negative on an error.
pub fn getdents64(dir: &Dir, buf: &mut [u8]) -> isize {
    // SAFETY: getdents64 writes at most `buf.len()` bytes of records into `buf`.
    unsafe { libc::syscall(libc::SYS_getdents64, dir.0, buf.as_mut_ptr(), buf.len()) as isize }
}

// ---- Raw system calls (for `CLONE_VM` children) and clone3.

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
pub fn pidfd_alive(pidfd: BorrowedFd<'_>) -> bool {
    pidfd_send_signal(pidfd, 0).is_ok()
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
