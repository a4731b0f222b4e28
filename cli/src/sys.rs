//! Every `unsafe` of the CLI, each behind a safe function with its `// SAFETY:`:
//! restoring SIGPIPE's default action and asking the kernel to signal a started
//! child when the CLI dies. The rest of the crate denies `unsafe_code`.
#![allow(unsafe_code)]

use std::os::unix::process::CommandExt as _;
use std::process::Command;

use nix::sys::signal::{signal, SigHandler, Signal};

/// Restores SIGPIPE's default action (terminate), which Rust replaces with "ignore".
pub fn restore_default_sigpipe() -> nix::Result<()> {
    // SAFETY: SIG_DFL installs no Rust handler, so no code that is not
    // async-signal-safe can run in a handler; main calls this before any thread exists.
    unsafe { signal(Signal::SIGPIPE, SigHandler::SigDfl) }.map(|_| ())
}

/// Makes the child `command` starts receive `signal` when the thread that started it
/// (the CLI) dies.
pub fn set_parent_death_signal(command: &mut Command, signal: Signal) {
    // SAFETY: the closure runs in the forked child before exec and only calls
    // prctl(PR_SET_PDEATHSIG), which is async-signal-safe; it allocates nothing.
    unsafe {
        command
            .pre_exec(move || nix::sys::prctl::set_pdeathsig(signal).map_err(std::io::Error::from));
    }
}

/// The size (rows, columns) of the terminal on `fd`, if it is one.
pub fn terminal_size(fd: std::os::fd::BorrowedFd<'_>) -> Option<(u16, u16)> {
    use std::os::fd::AsRawFd as _;
    let mut size = nix::libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one winsize, which lives on this stack.
    let r = unsafe { nix::libc::ioctl(fd.as_raw_fd(), nix::libc::TIOCGWINSZ, &mut size) };
    (r == 0 && size.ws_row > 0 && size.ws_col > 0).then_some((size.ws_row, size.ws_col))
}
