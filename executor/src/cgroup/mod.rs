//! The task's cgroup behind a narrow trait ([`TaskCgroup`]): create it with cpu, memory
//! and pids limits (read back after writing), tell where a child writes itself before
//! exec, count OOM kills, kill everything in it and remove it. As in youki's
//! libcgroups, each layout is its own type behind the trait: [`v1::V1Cgroup`] (one
//! hierarchy per controller) and [`v2::V2Cgroup`] (the unified tree); this module holds
//! the trait, detection ([`FsCgroup::detect`]), [`FsCgroup`] (either of them), the
//! hierarchy adapter, the creation and removal both layouts share, and the prewarm;
//! `handle` the cgroups-rs handle, its controllers and the kill loop ([`Handle`]);
//! `files` the plain-file helpers.
//!
//! The implementation goes through cgroups-rs ([`cgroups_rs::Cgroup`] and its cpu,
//! memory and pids controllers) with our own [`RootedHierarchy`] at an
//! injected mount root, for v1 and v2: cgroups-rs's `hierarchies::V2` hard-codes
//! `/sys/fs/cgroup` as the v2 root (so no fake tree in a temp dir, no `--cgroup-root`),
//! and its `hierarchies::V1` builds every mounted controller, hugetlb's with a regex.
//!
//! cgroups-rs has traps we guard against here: it leaves a controller that is not
//! available out of the cgroup without a word (every setter is then skipped), its
//! setters create a missing limit file instead of failing (harmless on a kernel, which
//! refuses, but wrong on a fake tree), it ignores errors creating v1 directories and
//! enabling v2 controllers, and it takes the v2 controller list from `/sys/fs/cgroup`.
//! So we require each controller we need, make the directories (`mkdir`, whose
//! `EEXIST` also reveals a leftover cgroup) and enable the v2 controllers ourselves,
//! write each limit as a plain file opened without `O_CREAT` (a missing file is an
//! error naming it, with no `stat` before: every path walk through cgroupfs costs
//! about as much as the write), and read every limit back through the descriptor
//! that wrote it. Plain files are also used where cgroups-rs has no knob or reader
//! (`memory.oom.group`, the OOM counters, `cgroup.subtree_control`), each with a
//! comment.
//!
//! No freezer: on v1 a kill stops forks with `pids.max` 0 instead (see
//! [`Handle::kill_until_empty`]), so a task costs three v1 cgroups, not four.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cgroups_rs::{Cgroup, Hierarchy, Subsystem};

mod files;
mod handle;
pub mod v1;
pub mod v2;

use files::write_file;
pub use files::{parse_oom_kills, parse_pids};
pub use handle::Handle;

/// v1 controllers we use, each its own hierarchy under the mount root.
pub const V1_CONTROLLERS: [&str; 3] = ["cpu", "memory", "pids"];

/// The CFS period we use for the cpu quota (100 ms).
pub const CPU_PERIOD_US: u64 = 100_000;

/// What the task may use.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limits {
    /// CPU cores (0.5 = half a core); 0 means no quota.
    pub cpu: f64,
    /// Memory limit in bytes; 0 means no limit.
    pub memory_bytes: u64,
    /// Maximum number of processes and threads; 0 means no limit.
    pub pids: u64,
}

/// A cgroup operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cannot create cgroup {path}: {source}; is the cgroup filesystem mounted and are we root? (or run with --no-isolation)")]
    Create { path: PathBuf, source: io::Error },
    #[error(
        "cannot write `{value}` to {path}: {source}; is the controller enabled for this cgroup?"
    )]
    Write {
        path: PathBuf,
        value: String,
        source: io::Error,
    },
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("{path} reads back `{read}` after we wrote `{wrote}`: the limit did not apply")]
    ReadBack {
        path: PathBuf,
        wrote: String,
        read: String,
    },
    #[error("the {controller} controller is not available under {root} (v2: not in cgroup.controllers; v1: not mounted there); enable it, point --cgroup-root at the right place, or run with --no-isolation")]
    MissingController {
        controller: &'static str,
        root: PathBuf,
    },
    #[error("cgroups-rs could not {what} {path}: {source}")]
    Lib {
        what: &'static str,
        path: PathBuf,
        source: cgroups_rs::error::Error,
    },
    #[error("cgroup {path} still has processes after {secs}s of SIGKILL: {pids:?}")]
    NotEmpty {
        path: PathBuf,
        secs: u64,
        pids: Vec<i32>,
    },
    #[error("cannot remove cgroup {path}: {source}")]
    Remove {
        path: PathBuf,
        source: cgroups_rs::error::Error,
    },
}

/// The cgroup of one task (youki's `CgroupManager`, narrowed to what we need).
pub trait TaskCgroup: Send + Sync {
    /// Creates the cgroup(s), writes the limits and reads them back. A cgroup of the
    /// same name left over (by an earlier executor of this task) is emptied and
    /// removed first. Returns whether the cgroup is new: false when a leftover could
    /// not be removed and is used as it is (its counters then do not start at 0).
    fn create(&self, limits: &Limits) -> Result<bool, CgroupError>;
    /// The `cgroup.procs` files a child writes `0` into (in pre_exec) to join.
    fn procs_files(&self) -> Vec<PathBuf>;
    /// Every pid in the cgroup.
    fn pids(&self) -> Result<Vec<i32>, CgroupError>;
    /// Whether the cgroup holds no process (cheaper than `pids` on v1).
    fn is_empty(&self) -> Result<bool, CgroupError>;
    /// How many times the kernel OOM-killed a process in the cgroup.
    fn oom_kills(&self) -> Result<u64, CgroupError>;
    /// SIGKILLs everything in the cgroup until it is empty.
    fn kill_all(&self) -> Result<(), CgroupError>;
    /// Removes the cgroup(s); missing ones count as removed.
    fn remove(&self) -> Result<(), CgroupError>;
    /// Human description, for messages.
    fn describe(&self) -> String;
}

/// Which cgroup layout a host has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    /// One hierarchy per controller: `<root>/<controller>/<path>`.
    V1,
    /// The unified tree: `<root>/<path>`.
    V2,
}

/// A cgroups-rs [`Hierarchy`] at an injected mount root.
///
/// v2: the controllers listed in `<root>/cgroup.controllers` among cpu, memory and
/// pids (what `hierarchies::V2::subsystems` does for `/sys/fs/cgroup`). v1: each of
/// cpu, memory and pids whose `<root>/<controller>` directory exists.
#[derive(Clone, Debug)]
pub struct RootedHierarchy {
    version: Version,
    root: PathBuf,
}

impl RootedHierarchy {
    /// The hierarchy of `version` mounted at `root`.
    pub fn new(version: Version, root: &Path) -> RootedHierarchy {
        RootedHierarchy {
            version,
            root: root.to_path_buf(),
        }
    }
}

impl Hierarchy for RootedHierarchy {
    fn subsystems(&self) -> Vec<Subsystem> {
        match self.version {
            Version::V1 => v1::subsystems(&self.root),
            Version::V2 => v2::subsystems(&self.root),
        }
    }

    fn root(&self) -> PathBuf {
        self.root.clone()
    }

    fn root_control_group(&self) -> Cgroup {
        Cgroup::load(Box::new(self.clone()), "")
    }

    fn parent_control_group(&self, path: &str) -> Cgroup {
        let parent = Path::new(path).parent().unwrap_or(Path::new(""));
        Cgroup::load(Box::new(self.clone()), parent)
    }

    fn v2(&self) -> bool {
        self.version == Version::V2
    }
}

/// The cgroups-rs handle of `<rel>` in the hierarchy of `version` at `root`.
///
/// Our own hierarchy on v1 too, not cgroups-rs's `hierarchies::V1`: that one builds
/// every mounted controller from /proc/self/mountinfo, and its hugetlb controller
/// compiles a regex on construction (+700 KiB of code and a regex build per cgroup
/// handle), for nothing we use. With `root` the v1 mount root the two give the same
/// directories.
fn load(version: Version, root: &Path, rel: &str) -> Cgroup {
    Cgroup::load(Box::new(RootedHierarchy::new(version, root)), rel)
}

/// A task cgroup of either layout, under an injected mount root.
#[derive(Clone, Debug)]
pub enum FsCgroup {
    /// One hierarchy per controller.
    V1(v1::V1Cgroup),
    /// The unified tree.
    V2(v2::V2Cgroup),
}

impl FsCgroup {
    /// The cgroup `<parent>/<task_id>` under `root` (e.g. `/sys/fs/cgroup`).
    pub fn new(version: Version, root: &Path, parent: &str, task_id: &str) -> FsCgroup {
        let rel = format!("{}/{task_id}", parent.trim_matches('/'));
        let handle = Handle::new(version, root, rel);
        match version {
            Version::V1 => FsCgroup::V1(v1::V1Cgroup::new(handle)),
            Version::V2 => FsCgroup::V2(v2::V2Cgroup::new(handle)),
        }
    }

    /// Looks at `root` to decide: a `cgroup.controllers` file means v2; a `memory`
    /// directory with `memory.limit_in_bytes` means v1; otherwise no usable cgroups.
    pub fn detect(root: &Path) -> Option<Version> {
        if root.join("cgroup.controllers").is_file() {
            Some(Version::V2)
        } else if root.join("memory/memory.limit_in_bytes").is_file() && root.join("pids").is_dir()
        {
            Some(Version::V1)
        } else {
            None
        }
    }

    /// v1 or v2.
    pub fn version(&self) -> Version {
        match self {
            FsCgroup::V1(_) => Version::V1,
            FsCgroup::V2(_) => Version::V2,
        }
    }

    /// The directory of the cgroup in one controller (v1) or the tree (v2).
    pub fn dir(&self, controller: &str) -> PathBuf {
        match self {
            FsCgroup::V1(c) => c.dir(controller),
            FsCgroup::V2(c) => c.dir(),
        }
    }

    fn inner(&self) -> &dyn TaskCgroup {
        match self {
            FsCgroup::V1(c) => c,
            FsCgroup::V2(c) => c,
        }
    }
}

impl TaskCgroup for FsCgroup {
    fn create(&self, limits: &Limits) -> Result<bool, CgroupError> {
        self.inner().create(limits)
    }
    fn procs_files(&self) -> Vec<PathBuf> {
        self.inner().procs_files()
    }
    fn pids(&self) -> Result<Vec<i32>, CgroupError> {
        self.inner().pids()
    }
    fn is_empty(&self) -> Result<bool, CgroupError> {
        self.inner().is_empty()
    }
    fn oom_kills(&self) -> Result<u64, CgroupError> {
        self.inner().oom_kills()
    }
    fn kill_all(&self) -> Result<(), CgroupError> {
        self.inner().kill_all()
    }
    fn remove(&self) -> Result<(), CgroupError> {
        self.inner().remove()
    }
    fn describe(&self) -> String {
        self.inner().describe()
    }
}

/// Creates the cgroup of `cg` with `create_dirs` (which returns whether it existed);
/// a leftover of an earlier executor of this task is emptied, removed and made anew.
/// Returns whether the cgroup is new.
fn create_fresh(
    cg: &dyn TaskCgroup,
    create_dirs: impl Fn() -> Result<bool, CgroupError>,
) -> Result<bool, CgroupError> {
    let mut fresh = !create_dirs()?;
    if !fresh {
        // Errors surface when the limits are written if it stays.
        let _ = cg.kill_all();
        let _ = cg.remove();
        fresh = !create_dirs()?;
    }
    Ok(fresh)
}

/// Removes the cgroup's directories (`dirs`): one rmdir each, a missing one counting as
/// removed; when one is busy, kills what is left and retries `delete` (cgroups-rs) for
/// up to 2 s.
fn remove_dirs(
    cg: &dyn TaskCgroup,
    dirs: impl Fn() -> Vec<PathBuf>,
    delete: impl Fn() -> Result<(), cgroups_rs::error::Error>,
    path: PathBuf,
) -> Result<(), CgroupError> {
    // The usual case first: no `stat` before each rmdir.
    let mut left = false;
    for dir in dirs() {
        match fs::remove_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(_) => left = true,
        }
    }
    if !left {
        return Ok(());
    }
    // Busy: a process is left that the emptiness check did not see (`is_empty`).
    let _ = cg.kill_all();
    let started = Instant::now();
    loop {
        if !dirs().iter().any(|d| d.exists()) {
            return Ok(());
        }
        match delete() {
            Ok(()) => return Ok(()),
            // Exiting processes may linger a moment (EBUSY).
            Err(_) if started.elapsed() < Duration::from_secs(2) => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(source) => return Err(CgroupError::Remove { path, source }),
        }
    }
}

/// The OOM counter in `file`; a missing file reads 0.
fn read_oom_kills(file: PathBuf) -> Result<u64, CgroupError> {
    // Plain files: cgroups-rs has no v2 memory.events reader, and its v1
    // `oom_control` parser takes the counter by position.
    match fs::read_to_string(&file) {
        Ok(text) => Ok(parse_oom_kills(&text)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
        Err(source) => Err(CgroupError::Read { path: file, source }),
    }
}

/// Starts, on a helper thread, a no-op migration of the executor into the cgroup it
/// is already in (pids hierarchy on v1, the tree on v2).
///
/// Why: the first migration into a cgroup after a quiet period takes the kernel's
/// `cgroup_threadgroup_rwsem` for writing, which waits for an RCU grace period (about
/// 5 ms here). Doing that once in parallel with the sandbox setup lets the first
/// process's own join (in pre_exec) take the fast path. Errors are ignored: this only
/// saves time.
pub fn prewarm_migration(root: &Path, version: Version) {
    let Ok(own) = fs::read_to_string("/proc/self/cgroup") else {
        return;
    };
    let procs = match version {
        Version::V1 => v1::own_procs(root, &own),
        Version::V2 => v2::own_procs(root, &own),
    };
    let Some(procs) = procs else {
        return;
    };
    let _ = std::thread::Builder::new()
        .name("cgroup-prewarm".into())
        .stack_size(64 * 1024)
        .spawn(move || {
            let _ = write_file(&procs, "0");
        });
}

/// Checks a `--cgroup-parent`: a relative cgroup path (`drover`, or a path inside a
/// delegated subtree such as `system.slice/drover-agent.service/drover`) of
/// components that are not empty, `.` or `..`, at most 255 bytes each and without
/// control characters. A leading or trailing `/` is allowed and ignored.
pub fn check_parent(parent: &str) -> Result<(), ParentError> {
    let trimmed = parent.trim_matches('/');
    let parent = || parent.to_string();
    if trimmed.is_empty() {
        return Err(ParentError::Empty(parent()));
    }
    if trimmed.len() > 4096 {
        return Err(ParentError::TooLong(parent()));
    }
    for part in trimmed.split('/') {
        if part.is_empty() || part == "." || part == ".." {
            return Err(ParentError::NotPlain(parent()));
        }
        if part.len() > 255 || part.chars().any(char::is_control) {
            return Err(ParentError::BadComponent {
                parent: parent(),
                component: part.escape_default().to_string(),
            });
        }
    }
    Ok(())
}

/// What is wrong with a `--cgroup-parent` ([`check_parent`]); the text follows the
/// flag's name.
#[derive(Debug, thiserror::Error)]
pub enum ParentError {
    #[error("`{0}` is empty: give a relative cgroup path like `drover`")]
    Empty(String),
    #[error("`{0}` is longer than 4096 bytes")]
    TooLong(String),
    #[error("`{0}` has an empty, `.` or `..` component: give a plain relative path")]
    NotPlain(String),
    /// `component` escaped as Rust's `escape_default` does.
    #[error(
        "`{parent}`: component `{component}` is longer than 255 bytes or holds a control character"
    )]
    BadComponent { parent: String, component: String },
}

/// The path of the line of `/proc/self/cgroup` (`id:controllers:path`) whose
/// controllers `wanted` accepts, without its leading `/`.
fn own_cgroup(own: &str, wanted: impl Fn(&str) -> bool) -> Option<String> {
    own.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        wanted(controllers).then(|| path.trim_start_matches('/').to_string())
    })
}
