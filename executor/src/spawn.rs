//! Starting one process of the task: the cmdline's words executed directly when it has
//! no shell syntax (see [`direct_argv`]), `/bin/sh -c <cmdline>` otherwise, in the
//! sandbox with the `DROVER_*` environment, stdout and stderr piped to the executor (which writes the
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
/// executable) when the program cannot be started; see [`check_program`].
pub fn task_command(
    cmdline: &str,
    cwd: &Path,
    env: &[(String, String)],
    isolation: &Isolation,
) -> Result<Command, String> {
    check_program(cmdline, cwd)?;
    let mut cmd = match direct_argv(cmdline) {
        Some(words) if words[0].contains('/') => {
            let mut cmd = Command::new(words[0]);
            cmd.args(&words[1..]);
            cmd
        }
        Some(words) => {
            let mut cmd = Command::new(find_in_path(words[0])?);
            cmd.arg0(words[0]).args(&words[1..]);
            cmd
        }
        None => {
            let mut cmd = Command::new("/bin/sh");
            cmd.arg("-c").arg(cmdline);
            cmd
        }
    };
    prepare(&mut cmd, cwd, env, isolation, true);
    Ok(cmd)
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

/// A shell command prepared to run as a task process (or a shell health check).
pub fn command(
    cmdline: &str,
    cwd: &Path,
    env: &[(String, String)],
    isolation: &Isolation,
    piped: bool,
) -> Command {
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c").arg(cmdline);
    prepare(&mut cmd, cwd, env, isolation, piped);
    cmd
}

/// The working directory, environment, stdio and pre-exec isolation every process gets.
fn prepare(
    cmd: &mut Command,
    cwd: &Path,
    env: &[(String, String)],
    isolation: &Isolation,
    piped: bool,
) {
    cmd.current_dir(cwd).env_clear();
    cmd.env("PATH", DEFAULT_PATH);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.stdin(Stdio::null());
    if piped {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    }
    install_pre_exec(cmd, isolation.clone());
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
        let iso = Isolation {
            procs_files: Vec::new(),
            user: None,
        };
        let err = task_command("drover-no-such-program --x", dir.path(), &[], &iso).unwrap_err();
        assert!(err.contains("command not found"), "{err}");
        let err = task_command("./missing", dir.path(), &[], &iso).unwrap_err();
        assert!(err.contains("missing: binary not found"), "{err}");
    }

    #[tokio::test]
    async fn a_direct_command_gets_its_words_as_arguments() {
        let dir = tempfile::tempdir().unwrap();
        let iso = Isolation {
            procs_files: Vec::new(),
            user: None,
        };
        let out = task_command("printf %s-%s a b", dir.path(), &[], &iso)
            .unwrap()
            .output()
            .await
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "a-b");
    }
}
