//! `drover-executor exec`: one command run inside a running task for
//! `drover task exec` (docs/cli.md). The agent starts it with the command's stdio
//! (pipes, or a PTY's terminal) and the pid of a task process; this helper, a
//! single-threaded process, takes on that process's identity and surroundings:
//!
//! - its cgroup (every hierarchy of `/proc/<pid>/cgroup`; the process must be in a
//!   cgroup named after the task, so the pid cannot be another process's),
//! - its pid, mount and network namespaces (`setns` through its pidfd; a pid
//!   namespace applies to children, so the command is forked after it),
//! - its uid, gid and supplementary groups and its environment (`/proc/<pid>`),
//!   and the task's working directory (`sandbox/`), with `no_new_privs`.
//!
//! It then forks the command, passes SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and
//! SIGUSR2 on to it, and exits with its status (its exit code, or 128 + the signal
//! that ended it). Being in the task's cgroup and pid namespace, the helper and the
//! command die with the task: the executor's kill empties the cgroup, and the end of
//! the namespace's init kills whatever is left in it. Exit codes of its own: 125 (it
//! could not enter the task), 126 (the command cannot be run), 127 (not found).

use std::ffi::CString;
use std::os::fd::AsFd as _;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use nix::sched::CloneFlags;

/// What `drover-executor exec` was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOptions {
    /// The task directory (`<sandbox_root>/<task_id>`).
    pub task_dir: PathBuf,
    /// A process of the task, whose identity the command takes.
    pub pid: u32,
    /// Stdin is a terminal to make the command's controlling terminal.
    pub tty: bool,
    /// Where the cgroup filesystem is mounted.
    pub cgroup_root: PathBuf,
    /// The command and its arguments.
    pub argv: Vec<String>,
}

/// Exit code: the helper could not enter the task.
pub const EXIT_CANNOT_ENTER: i32 = 125;
/// Exit code: the command was found but cannot be run.
pub const EXIT_CANNOT_RUN: i32 = 126;
/// Exit code: the command was not found.
pub const EXIT_NOT_FOUND: i32 = 127;

/// Who a task process runs as and with what, read from `/proc/<pid>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub env: Vec<(String, String)>,
}

/// The real uid, gid and groups in a `/proc/<pid>/status` text.
pub fn parse_status(text: &str) -> Option<(u32, u32, Vec<u32>)> {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
    };
    let first = |v: &str| v.split_whitespace().next()?.parse().ok();
    let uid = first(field("Uid:")?)?;
    let gid = first(field("Gid:")?)?;
    let groups = field("Groups:")
        .unwrap_or("")
        .split_whitespace()
        .filter_map(|g| g.parse().ok())
        .collect();
    Some((uid, gid, groups))
}

/// The `NAME=value` pairs of a `/proc/<pid>/environ`.
pub fn parse_environ(bytes: &[u8]) -> Vec<(String, String)> {
    bytes
        .split(|b| *b == 0)
        .filter_map(|kv| {
            let kv = String::from_utf8_lossy(kv);
            let (k, v) = kv.split_once('=')?;
            (!k.is_empty()).then(|| (k.to_string(), v.to_string()))
        })
        .collect()
}

/// The `cgroup.procs` files of the cgroups in a `/proc/<pid>/cgroup` text under
/// `root` (v2: `0::/path`; v1: `N:controllers:/path`, named hierarchies skipped),
/// or None unless one of them is named `task_id` (the process is the task's).
pub fn cgroup_procs(text: &str, root: &Path, task_id: &str) -> Option<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut in_task = false;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if controllers.starts_with("name=") || path.split('/').any(|p| p == "..") {
            continue;
        }
        in_task |= path.rsplit('/').next() == Some(task_id);
        let rel = path.trim_start_matches('/');
        let dir = if controllers.is_empty() {
            root.join(rel)
        } else {
            root.join(controllers).join(rel)
        };
        files.push(dir.join("cgroup.procs"));
    }
    in_task.then_some(files)
}

/// The program `name` would run: itself when it holds a `/`, else the first
/// executable file of that name in `path` (the task's `PATH`).
pub fn resolve(name: &str, path: Option<&str>) -> Option<PathBuf> {
    if name.contains('/') {
        return Some(PathBuf::from(name));
    }
    let path = path.unwrap_or("/usr/local/bin:/usr/bin:/bin");
    path.split(':')
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(name))
        .find(|p| {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Runs the command in the task; returns the exit code for the helper.
pub fn run(opts: &ExecOptions) -> i32 {
    match enter(opts) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("drover task exec: {e}");
            EXIT_CANNOT_ENTER
        }
    }
}

fn same_ns(pid: u32, ns: &str) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    match (
        std::fs::metadata(format!("/proc/self/ns/{ns}")),
        std::fs::metadata(format!("/proc/{pid}/ns/{ns}")),
    ) {
        (Ok(a), Ok(b)) => a.ino() == b.ino() && a.dev() == b.dev(),
        _ => false,
    }
}

/// Why `drover task exec` could not run its command in the task.
#[derive(Debug, thiserror::Error)]
enum EnterError {
    #[error("{0} is not a task directory")]
    NotTaskDir(PathBuf),
    #[error("process {pid} of task {task_id} is gone")]
    Gone { pid: u32, task_id: String },
    #[error("process {pid} is not in task {task_id}'s cgroup")]
    NotInCgroup { pid: u32, task_id: String },
    #[error("cannot read the user of process {0}")]
    User(u32),
    #[error("cannot join the task's cgroup ({file}): {source}")]
    JoinCgroup {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot enter the namespaces of task {task_id}: {source}")]
    Namespaces {
        task_id: String,
        source: nix::errno::Errno,
    },
    #[error("fork: {0}")]
    Fork(std::io::Error),
    #[error("cannot pass signals on: {0}")]
    Signals(std::io::Error),
    #[error("waiting for the command: {0}")]
    Wait(nix::errno::Errno),
}

/// Enters the task, forks the command and waits for it (the parent's part); the
/// child never returns.
fn enter(opts: &ExecOptions) -> Result<i32, EnterError> {
    let task_id = opts
        .task_dir
        .file_name()
        .and_then(|n| n.to_str())
        .filter(|n| drover_common::spec::is_valid_name(n))
        .ok_or_else(|| EnterError::NotTaskDir(opts.task_dir.clone()))?
        .to_string();
    let pid = opts.pid;
    let gone = || EnterError::Gone {
        pid,
        task_id: task_id.clone(),
    };
    let pidfd = crate::sys::pidfd_open(pid as libc::pid_t).map_err(|_| gone())?;
    let read = |what: &str| std::fs::read(format!("/proc/{pid}/{what}")).map_err(|_| gone());
    let cgroups = String::from_utf8_lossy(&read("cgroup")?).into_owned();
    let procs = cgroup_procs(&cgroups, &opts.cgroup_root, &task_id).ok_or_else(|| {
        EnterError::NotInCgroup {
            pid,
            task_id: task_id.clone(),
        }
    })?;
    let (uid, gid, groups) =
        parse_status(&String::from_utf8_lossy(&read("status")?)).ok_or(EnterError::User(pid))?;
    let env = parse_environ(&read("environ")?);
    let mut flags = CloneFlags::empty();
    for (ns, flag) in [
        ("pid", CloneFlags::CLONE_NEWPID),
        ("mnt", CloneFlags::CLONE_NEWNS),
        ("net", CloneFlags::CLONE_NEWNET),
    ] {
        if !same_ns(pid, ns) {
            flags |= flag;
        }
    }
    // Everything read above was that process's if it still exists now.
    if !crate::sys::pidfd_alive(pidfd.as_fd()) {
        return Err(gone());
    }
    for file in &procs {
        std::fs::write(file, b"0").map_err(|source| EnterError::JoinCgroup {
            file: file.clone(),
            source,
        })?;
    }
    if !flags.is_empty() {
        nix::sched::setns(pidfd.as_fd(), flags).map_err(|source| EnterError::Namespaces {
            task_id: task_id.clone(),
            source,
        })?;
    }
    drop(pidfd);
    let sandbox = drover_common::layout::TaskDir::new(&opts.task_dir).sandbox();
    let child = crate::sys::fork_single_threaded().map_err(EnterError::Fork)?;
    let Some(child) = child else {
        let code = child_exec(opts, uid, gid, &groups, &env, &sandbox);
        std::process::exit(code);
    };
    crate::sys::forward_signals(
        child,
        &[
            libc::SIGINT,
            libc::SIGTERM,
            libc::SIGHUP,
            libc::SIGQUIT,
            libc::SIGUSR1,
            libc::SIGUSR2,
        ],
    )
    .map_err(EnterError::Signals)?;
    use nix::sys::wait::{waitpid, WaitStatus};
    loop {
        match waitpid(child, None) {
            Ok(WaitStatus::Exited(_, code)) => return Ok(code),
            Ok(WaitStatus::Signaled(_, sig, _)) => return Ok(128 + sig as i32),
            Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(EnterError::Wait(e)),
        }
    }
}

/// The forked child: becomes the task's user in its working directory and execs the
/// command; returns an exit code only when that failed.
fn child_exec(
    opts: &ExecOptions,
    uid: u32,
    gid: u32,
    groups: &[u32],
    env: &[(String, String)],
    sandbox: &Path,
) -> i32 {
    let fail = |what: String| {
        eprintln!("drover task exec: {what}");
        EXIT_CANNOT_ENTER
    };
    if let Err(e) = nix::unistd::setsid() {
        return fail(format!("setsid: {e}"));
    }
    if opts.tty {
        if let Err(e) = crate::sys::set_controlling_terminal(0) {
            return fail(format!("cannot take the terminal: {e}"));
        }
    }
    let gids: Vec<nix::unistd::Gid> = groups
        .iter()
        .map(|g| nix::unistd::Gid::from_raw(*g))
        .collect();
    if let Err(e) = nix::unistd::setgroups(&gids)
        .and_then(|_| nix::unistd::setgid(nix::unistd::Gid::from_raw(gid)))
        .and_then(|_| nix::unistd::setuid(nix::unistd::Uid::from_raw(uid)))
    {
        return fail(format!("cannot become uid {uid} gid {gid}: {e}"));
    }
    if let Err(e) = nix::sys::prctl::set_no_new_privs() {
        return fail(format!("no_new_privs: {e}"));
    }
    if let Err(e) = std::env::set_current_dir(sandbox) {
        return fail(format!("cannot enter {}: {e}", sandbox.display()));
    }
    crate::sys::default_sigpipe();
    let path = env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str());
    let Some(program) = resolve(&opts.argv[0], path) else {
        eprintln!("drover task exec: {}: command not found", opts.argv[0]);
        return EXIT_NOT_FOUND;
    };
    let cstr = |s: &[u8]| CString::new(s).unwrap_or_default();
    let argv: Vec<CString> = opts.argv.iter().map(|a| cstr(a.as_bytes())).collect();
    let envp: Vec<CString> = env
        .iter()
        .map(|(k, v)| cstr(format!("{k}={v}").as_bytes()))
        .collect();
    let e = nix::unistd::execve(&cstr(program.as_os_str().as_bytes()), &argv, &envp)
        .err()
        .unwrap_or(nix::errno::Errno::EIO);
    eprintln!("drover task exec: {}: {e}", program.display());
    if e == nix::errno::Errno::ENOENT {
        EXIT_NOT_FOUND
    } else {
        EXIT_CANNOT_RUN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_environ_and_cgroups_parse() {
        let status = "Name:\tsh\nUid:\t33\t33\t33\t33\nGid:\t34\t34\t34\t34\nGroups:\t34 100 \n";
        assert_eq!(parse_status(status), Some((33, 34, vec![34, 100])));
        assert_eq!(
            parse_environ(b"A=1\0B=x=y\0junk\0"),
            vec![("A".into(), "1".into()), ("B".into(), "x=y".into())]
        );
        let root = Path::new("/sys/fs/cgroup");
        assert_eq!(
            cgroup_procs("0::/drover/t-0-abc\n", root, "t-0-abc"),
            Some(vec![PathBuf::from(
                "/sys/fs/cgroup/drover/t-0-abc/cgroup.procs"
            )])
        );
        let v1 = "5:pids:/drover/t\n4:cpu,cpuacct:/drover/t\n1:name=systemd:/x\n";
        assert_eq!(cgroup_procs(v1, root, "t").map(|v| v.len()), Some(2));
        assert_eq!(cgroup_procs("0::/user.slice\n", root, "t"), None);
    }

    #[test]
    fn programs_resolve_on_the_tasks_path() {
        assert_eq!(resolve("/bin/x", None), Some(PathBuf::from("/bin/x")));
        assert!(resolve("sh", Some("/nonexistent:/bin:/usr/bin")).is_some());
        assert_eq!(resolve("no-such-program-here", Some("/bin")), None);
    }
}
