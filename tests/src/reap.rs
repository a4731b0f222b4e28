//! Killing everything a test cluster started, when it is dropped (also while a failed
//! test unwinds): the daemons are `Proc`s, killed on drop; what they started lives on
//! without them. Executors forked by an agent's fork server lead sessions of their own
//! and outlive the agent, and their tasks outlive the executor. [`sweep`] finds both:
//! the executors named in the sandboxes' checkpoints, every process whose working
//! directory is in the cluster's directory (an executor's is its task directory, a
//! task's its sandbox), and every process in the task cgroups of the cluster's tasks
//! (a task that left its sandbox is still in its cgroup); it kills them until none is
//! left and removes those cgroups.
//!
//! `scripts/leftovers.sh` checks after the whole run that nothing escaped this.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::{is_executor, process_alive, processes_under};

/// How long a sweep keeps killing before it gives up (and says so).
const SWEEP_FOR: Duration = Duration::from_secs(10);

/// Where the cgroup filesystem is mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The task directories under `roots` (each named by its task id).
fn sandboxes(roots: &[PathBuf]) -> Vec<PathBuf> {
    roots
        .iter()
        .filter_map(|root| std::fs::read_dir(root).ok())
        .flat_map(|entries| entries.flatten().map(|e| e.path()))
        .filter(|path| path.is_dir())
        .collect()
}

/// The cgroups of task `task_id` under parent `parent` (a path relative to each
/// hierarchy's root): `<root>/<parent>/<id>` on cgroup v2, one per controller
/// hierarchy (`<root>/<controller>/<parent>/<id>`) on v1.
pub fn task_cgroups(parent: &str, task_id: &str) -> Vec<PathBuf> {
    let parent = parent.trim_matches('/');
    cgroup_bases()
        .into_iter()
        .map(|base| base.join(parent).join(task_id))
        .filter(|path| path.join("cgroup.procs").is_file())
        .collect()
}

/// Where cgroup paths start: the mount (cgroup v2's root) and each directory in it
/// (v1's controller hierarchies).
fn cgroup_bases() -> Vec<PathBuf> {
    let mut bases = vec![PathBuf::from(CGROUP_ROOT)];
    if let Ok(entries) = std::fs::read_dir(CGROUP_ROOT) {
        bases.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
    }
    bases
}

/// The processes in cgroup `dir` and its children.
fn cgroup_pids(dir: &Path) -> Vec<u32> {
    let mut pids: Vec<u32> = std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    if let Ok(children) = std::fs::read_dir(dir) {
        for child in children.flatten().filter(|c| c.path().is_dir()) {
            pids.extend(cgroup_pids(&child.path()));
        }
    }
    pids
}

/// Removes cgroup `dir` and its children (each must be empty).
fn remove_cgroup(dir: &Path) -> bool {
    if let Ok(children) = std::fs::read_dir(dir) {
        for child in children.flatten().filter(|c| c.path().is_dir()) {
            remove_cgroup(&child.path());
        }
    }
    std::fs::remove_dir(dir).is_ok() || !dir.exists()
}

/// Kills every executor and task of a test cluster: the cluster's directory `dir`,
/// its agents' sandbox roots `roots` and the agents' cgroup parent `cgroup_parent`
/// (`drover` unless an agent was given another). Call it after the agents were
/// killed (an agent would start executors again). Returns what it could not kill
/// or remove, empty when everything is gone; a harness prints it (a drop cannot
/// fail) and `scripts/leftovers.sh` fails the run on it.
pub fn sweep(dir: &Path, roots: &[PathBuf], cgroup_parent: &str) -> Vec<String> {
    let boxes = sandboxes(roots);
    // The executors first, so that none starts a task process again meanwhile.
    for sandbox in &boxes {
        let status = std::fs::read(sandbox.join("status.json"))
            .ok()
            .and_then(|b| drover_common::wire::checkpointed_status(&b));
        if let Some(pid) = status.map(|s| s.executor_pid) {
            if is_executor(pid) {
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
            }
        }
    }
    let task_ids: Vec<String> = boxes
        .iter()
        .filter_map(|b| b.file_name()?.to_str().map(str::to_string))
        .collect();
    let cgroups_now = || -> Vec<PathBuf> {
        task_ids
            .iter()
            .flat_map(|id| task_cgroups(cgroup_parent, id))
            .collect()
    };
    let cgroups = cgroups_now();
    let deadline = Instant::now() + SWEEP_FOR;
    let mut left: Vec<u32>;
    loop {
        left = processes_under(dir);
        for cgroup in &cgroups {
            left.extend(cgroup_pids(cgroup));
        }
        left.retain(|pid| *pid != std::process::id() && process_alive(*pid));
        left.sort_unstable();
        left.dedup();
        if left.is_empty() || Instant::now() > deadline {
            break;
        }
        for pid in &left {
            let _ = kill(Pid::from_raw(*pid as i32), Signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut failures: Vec<String> = left
        .iter()
        .map(|pid| format!("process {pid} ({}) survived SIGKILL", describe_pid(*pid)))
        .collect();
    // The cgroups are empty now; the kernel may take a moment to let them go. They
    // are listed again: an executor killed while it set up may have made one more
    // after the first look.
    for cgroup in &cgroups_now() {
        let deadline = Instant::now() + Duration::from_secs(2);
        while !remove_cgroup(cgroup) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if cgroup.exists() {
            failures.push(format!("cgroup {} could not be removed", cgroup.display()));
        }
    }
    failures
}

/// `sweep`, printing what it could not kill or remove (for a `Drop`).
pub fn sweep_and_report(what: &str, dir: &Path, roots: &[PathBuf], cgroup_parent: &str) {
    for failure in sweep(dir, roots, cgroup_parent) {
        eprintln!("{what}: cleanup: {failure}");
    }
}

/// The cgroup parent a test cluster's agents put their tasks' cgroups under.
#[derive(Clone, Copy, Debug)]
pub enum Parent<'a> {
    /// Shared with other clusters (`drover`): only this cluster's task cgroups go.
    Shared(&'a str),
    /// The cluster's own (a net cluster's `drover-t<pid>-<n>`): it goes whole.
    Own(&'a str),
}

/// The sweep at a test cluster's end, after its daemons were killed:
/// [`sweep_and_report`], then the cluster's own cgroup parent removed with whatever
/// is still under it.
pub fn sweep_cluster(what: &str, dir: &Path, roots: &[PathBuf], parent: Parent<'_>) {
    let (Parent::Shared(name) | Parent::Own(name)) = parent;
    sweep_and_report(what, dir, roots, name);
    if let Parent::Own(name) = parent {
        let name = name.trim_matches('/');
        for base in cgroup_bases() {
            let dir = base.join(name);
            if dir.is_dir() {
                empty_and_remove(&dir, Duration::from_secs(5));
            }
        }
    }
}

/// Removes the cgroup parents of net clusters whose test process died without its
/// Drop (`drover-t<pid>-<n>` with `<pid>` gone): kills what is left in them, then
/// rmdirs.
pub fn sweep_stale_parents() {
    for base in cgroup_bases() {
        let Ok(parents) = std::fs::read_dir(base) else {
            continue;
        };
        for parent in parents.flatten() {
            let name = parent.file_name().to_string_lossy().to_string();
            let Some(owner) = name
                .strip_prefix("drover-t")
                .and_then(|rest| rest.split('-').next())
                .and_then(|pid| pid.parse::<u32>().ok())
            else {
                continue;
            };
            if process_alive(owner) {
                continue;
            }
            empty_and_remove(&parent.path(), Duration::from_secs(2));
        }
    }
}

/// SIGKILLs what runs in each child cgroup of `parent`, removes the children
/// (retrying for up to `wait` each while the kernel finishes the kills), then
/// `parent` itself.
fn empty_and_remove(parent: &Path, wait: Duration) {
    if let Ok(children) = std::fs::read_dir(parent) {
        for child in children.flatten().filter(|c| c.path().is_dir()) {
            let procs =
                std::fs::read_to_string(child.path().join("cgroup.procs")).unwrap_or_default();
            for pid in procs.split_whitespace().filter_map(|p| p.parse().ok()) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            let deadline = Instant::now() + wait;
            while std::fs::remove_dir(child.path()).is_err() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    let _ = std::fs::remove_dir(parent);
}

/// A process's command line, for messages.
pub fn describe_pid(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| {
            String::from_utf8_lossy(&c)
                .split('\0')
                .filter(|a| !a.is_empty())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|_| "gone".to_string())
}

/// The processes whose command line names a path in `dir` (daemons given their
/// data dir there).
fn processes_naming(dir: &Path) -> Vec<u32> {
    let needle = dir.display().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let names = String::from_utf8_lossy(&cmdline)
                .split('\0')
                .any(|arg| arg.starts_with(&needle));
            (names && pid != std::process::id()).then_some(pid)
        })
        .collect()
}

/// Kills, on drop, everything a test started in a directory of its own that no
/// cluster harness owns (e.g. `drover dev --data-dir DIR` run by a test): every
/// process whose command line names a path in the directory (the daemons) or that
/// works under it, and the executors and task cgroups of the sandboxes under
/// `DIR/sandboxes/*` (`drover dev`'s layout).
#[derive(Debug)]
pub struct SweepOnDrop {
    dir: PathBuf,
}

impl SweepOnDrop {
    /// A guard for `dir`.
    pub fn new(dir: &Path) -> SweepOnDrop {
        SweepOnDrop {
            dir: dir.to_path_buf(),
        }
    }
}

impl Drop for SweepOnDrop {
    fn drop(&mut self) {
        // The daemons first: an agent would start executors again.
        for pid in processes_naming(&self.dir) {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
        let roots: Vec<PathBuf> = std::fs::read_dir(self.dir.join("sandboxes"))
            .map(|e| e.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        sweep_and_report(&self.dir.display().to_string(), &self.dir, &roots, "drover");
    }
}

/// Marks a test cluster's directory as this checkout's (`.drover-checkout` holds the
/// workspace root), so that `scripts/leftovers.sh` run by another checkout on the
/// same machine leaves it alone.
pub fn mark_checkout(dir: &Path) -> std::io::Result<()> {
    let root = crate::workspace_root();
    let root = std::fs::canonicalize(&root).unwrap_or(root);
    std::fs::write(dir.join(".drover-checkout"), root.display().to_string())
}
