//! Every `unsafe` of the agent, each behind a safe function with its `// SAFETY:`:
//! taking ownership of descriptors the kernel handed over, registering a pidfd with
//! the runtime, `openat` with `O_NOFOLLOW` and `openat2` confined below a directory.
//! The rest of the crate denies `unsafe_code`.
#![allow(unsafe_code)]

use std::os::fd::OwnedFd;

use tokio::io::unix::AsyncFd;

/// Takes ownership of descriptors received by SCM_RIGHTS.
pub fn received_fds(raw: Vec<std::os::fd::RawFd>) -> impl Iterator<Item = OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: the kernel just installed these descriptors in this process for the
    // message we received; nothing else owns them.
    raw.into_iter()
        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Registers a pidfd with the runtime, to learn when its process exits (readable).
pub fn watch_pidfd(pidfd: OwnedFd) -> std::io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: an OwnedFd is open for as long as it lives and always returns the same
    // descriptor, and the AsyncFd owns it from here on.
    unsafe { AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE) }
        .map_err(std::io::Error::from)
}

/// Opens `path` (relative to `dir` when given) with `flags`, never following a
/// symlink in its last component, closed on exec.
pub fn open_nofollow(
    dir: Option<&std::fs::File>,
    path: &std::path::Path,
    flags: libc::c_int,
) -> std::io::Result<std::fs::File> {
    use std::os::fd::{AsRawFd, FromRawFd};
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let at = dir.map_or(libc::AT_FDCWD, |d| d.as_raw_fd());
    // SAFETY: openat reads the NUL-terminated `c` and returns a new descriptor (or
    // -1), which only this function owns; `at` is open while `dir` is borrowed.
    let fd = unsafe { libc::openat(at, c.as_ptr(), flags | libc::O_NOFOLLOW | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nothing else owns.
    Ok(unsafe { std::fs::File::from_raw_fd(fd) })
}

/// Opens the directory `path` below `dir` with `openat2(2)`, resolved by the kernel
/// with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`: no `..` out
/// of `dir`, no absolute path, no symbolic link anywhere on the way (`ELOOP`,
/// `EXDEV` otherwise). Closed on exec.
pub fn open_dir_beneath(
    dir: &std::fs::File,
    path: &std::path::Path,
) -> std::io::Result<std::fs::File> {
    use std::os::fd::{AsRawFd, FromRawFd};
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let mut how: libc::open_how =
        // SAFETY: open_how is plain integers; all zero is a valid value.
        unsafe { std::mem::zeroed() };
    how.flags = (libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: openat2 reads the NUL-terminated `c` and `how` (its size given), both
    // alive for the call, and returns a new descriptor (or -1) only we own; the
    // directory's descriptor is open while `dir` is borrowed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            c.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(std::io::Error::other)?;
    // SAFETY: `fd` is a fresh descriptor nothing else owns.
    Ok(unsafe { std::fs::File::from_raw_fd(fd) })
}

/// Sets the window size of the terminal whose PTY master is `fd` (`TIOCSWINSZ`); the
/// kernel then sends SIGWINCH to its foreground process group.
pub fn set_window_size(
    fd: std::os::fd::BorrowedFd<'_>,
    rows: u16,
    cols: u16,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd as _;
    let size = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize, which lives on this stack.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ, &size) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Registers a non-blocking descriptor (a PTY master) with the runtime for reading
/// and writing.
pub fn async_fd(fd: OwnedFd) -> std::io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: an OwnedFd is open for as long as it lives and always returns the same
    // descriptor, and the AsyncFd owns it from here on.
    unsafe {
        AsyncFd::register_with_interest(
            fd,
            tokio::io::Interest::READABLE | tokio::io::Interest::WRITABLE,
        )
    }
    .map_err(std::io::Error::from)
}
