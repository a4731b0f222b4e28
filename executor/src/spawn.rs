//! Starting one process of the task: `/bin/sh -c <cmdline>` in the sandbox with the
//! `DROVER_*` environment, stdout and stderr piped to the executor (which writes the
//! rotated log files). Between fork and exec the child joins the task's cgroup (while
//! still root), starts its own session, drops to the task user and sets
//! `PR_SET_NO_NEW_PRIVS`.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::process::Command;

use crate::sandbox::TaskUser;

/// What the child does between fork and exec, prepared before forking so the child
/// only makes raw system calls (no allocation after fork).
#[derive(Clone, Debug)]
pub struct Isolation {
    /// `cgroup.procs` files to write `0` (this process) into.
    pub procs_files: Vec<CString>,
    /// The user to become, if we switch.
    pub user: Option<(u32, u32, Vec<u32>)>,
}

impl Isolation {
    /// Prepares joining `procs_files` and becoming `user`.
    pub fn new(procs_files: &[PathBuf], user: &TaskUser) -> Isolation {
        Isolation {
            procs_files: procs_files
                .iter()
                .filter_map(|p| CString::new(p.as_os_str().as_bytes()).ok())
                .collect(),
            user: user
                .switch
                .then(|| (user.uid, user.gid, user.groups.clone())),
        }
    }
}

/// A shell command prepared to run as a task process (or a shell health check).
pub fn command(
    cmdline: &str,
    cwd: &Path,
    env: &[(String, String)],
    isolation: &Isolation,
    piped: bool,
) -> Command {
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c").arg(cmdline).current_dir(cwd).env_clear();
    cmd.env(
        "PATH",
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    );
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.stdin(Stdio::null());
    if piped {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    }
    install_pre_exec(&mut cmd, isolation.clone());
    cmd
}

#[allow(unsafe_code)]
fn install_pre_exec(cmd: &mut Command, iso: Isolation) {
    // SAFETY: the closure runs in the forked child before exec. It only makes
    // async-signal-safe system calls (open, write, close, setsid, setgroups, setgid,
    // setuid, prctl) on data prepared before the fork, and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            // Join the cgroup first: after dropping root we could not.
            for path in &iso.procs_files {
                let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                let n = libc::write(fd, b"0".as_ptr().cast(), 1);
                let err = io::Error::last_os_error();
                libc::close(fd);
                if n != 1 {
                    return Err(err);
                }
            }
            // Own session and process group: signals to the group reach its children.
            if libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            if let Some((uid, gid, groups)) = &iso.user {
                if libc::setgroups(groups.len(), groups.as_ptr()) != 0
                    || libc::setgid(*gid) != 0
                    || libc::setuid(*uid) != 0
                {
                    return Err(io::Error::last_os_error());
                }
            }
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

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
/// not executable.
pub fn shell_start_error(code: i32, cmdline: &str) -> Option<String> {
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
}
