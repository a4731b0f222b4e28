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
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::Arc;

use crate::ns::TaskNamespaces;
use crate::sandbox::TaskUser;

/// Why a task's program cannot be started: the failed-to-start message, naming the
/// path that is missing or not executable.
#[derive(Debug, thiserror::Error)]
pub enum ProgramError {
    #[error("{path}: binary not found")]
    NotFound { path: PathBuf },
    #[error("{path}: {source}")]
    Unreadable { path: PathBuf, source: io::Error },
    #[error("{path}: is a directory")]
    Directory { path: PathBuf },
    #[error("{path}: permission denied (not executable)")]
    NotExecutable { path: PathBuf },
    #[error("`{program}`: command not found (PATH {path})", path = DEFAULT_PATH)]
    NotInPath { program: String },
}

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
) -> Result<TaskCommand, ProgramError> {
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
            match crate::sys::reap(self.pid)? {
                Some(status) => {
                    self.pidfd = None;
                    return Ok(status);
                }
                None => ready.clear_ready(),
            }
        }
    }
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
        let plan = crate::child::ChildPlan {
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
        let (pid, pidfd) = crate::child::clone_vfork(
            &plan,
            self.isolation.cgroup_dir.as_deref().map(|fd| fd.as_fd()),
            self.isolation
                .ns
                .as_deref()
                .map(|ns| ns as &dyn crate::child::PidNamespace),
        )?;
        // The child has exec'd (or exited) by now; its copies of the write ends are
        // what keeps the pipes open.
        drop((out_w, err_w));
        let error = plan.error.load(std::sync::atomic::Ordering::SeqCst);
        if error != 0 {
            // It exited without exec: reap it so that no zombie stays.
            drop(pidfd);
            crate::sys::reap_exited(pid);
            return Err(io::Error::from_raw_os_error(error));
        }
        let watched = (|| {
            Ok::<_, io::Error>((
                out_r.map(receiver).transpose()?,
                err_r.map(receiver).transpose()?,
                crate::sys::watch_readable(pidfd)?,
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
                crate::sys::reap_exited(pid);
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
        let (r, w) = crate::sys::pipe()?;
        crate::sys::set_nonblocking(r.as_fd())?;
        Ok((Some(r), Some(w)))
    }
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

fn receiver(fd: OwnedFd) -> io::Result<tokio::net::unix::pipe::Receiver> {
    // The read end is a pipe and non-blocking (`pipe`).
    tokio::net::unix::pipe::Receiver::from_owned_fd_unchecked(fd)
}

/// The first executable regular file named `program` in [`DEFAULT_PATH`], as
/// `execvp` would find it.
fn find_in_path(program: &str) -> Result<PathBuf, ProgramError> {
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
        Some(path) => ProgramError::NotExecutable { path },
        None => ProgramError::NotInPath {
            program: program.to_string(),
        },
    })
}

/// The `PATH` every task process gets.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Checks the program a cmdline runs before starting it, so that "not found" and
/// "permission denied" name the path instead of surfacing as exit code 127/126.
/// Only commands given as a path are checked; others are left to the shell.
pub fn check_program(cmdline: &str, cwd: &Path) -> Result<(), ProgramError> {
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
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(ProgramError::NotFound { path }),
        Err(source) => Err(ProgramError::Unreadable { path, source }),
        Ok(m) if m.is_dir() => Err(ProgramError::Directory { path }),
        Ok(m) if m.permissions().mode() & 0o111 == 0 => Err(ProgramError::NotExecutable { path }),
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
        let err = check_program("./nope --flag", dir.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains("nope: binary not found"), "{err}");
        let file = dir.path().join("script");
        std::fs::write(&file, "#!/bin/sh\n").unwrap();
        let err = check_program("exec ./script", dir.path())
            .unwrap_err()
            .to_string();
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
        let err = find_in_path("drover-no-such-program")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`drover-no-such-program`: command not found"),
            "{err}"
        );
        let iso = Isolation::default();
        let err = task_command("drover-no-such-program --x", dir.path(), &[], &iso)
            .unwrap_err()
            .to_string();
        assert!(err.contains("command not found"), "{err}");
        let err = task_command("./missing", dir.path(), &[], &iso)
            .unwrap_err()
            .to_string();
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
