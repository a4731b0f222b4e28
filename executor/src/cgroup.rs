//! The task's cgroup behind a narrow trait: create it with cpu, memory and pids limits
//! (read back after writing), tell where a child writes itself before exec, count OOM
//! kills, kill everything in it and remove it.
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
//! No freezer: on v1 a kill stops forks with `pids.max` 0 instead (see `kill_all`),
//! so a task costs three v1 cgroups, not four.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cgroups_rs::cpu::CpuController;
use cgroups_rs::error::ErrorKind;
use cgroups_rs::memory::MemController;
use cgroups_rs::pid::PidController;
use cgroups_rs::{Cgroup, Controller, Hierarchy, Subsystem};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

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
        let root = || self.root.clone();
        match self.version {
            Version::V2 => {
                let listed =
                    fs::read_to_string(self.root.join("cgroup.controllers")).unwrap_or_default();
                listed
                    .split_whitespace()
                    .filter_map(|c| match c {
                        "cpu" => Some(Subsystem::Cpu(CpuController::new(root(), true))),
                        "memory" => Some(Subsystem::Mem(MemController::new(root(), true))),
                        "pids" => Some(Subsystem::Pid(PidController::new(root(), true))),
                        _ => None,
                    })
                    .collect()
            }
            Version::V1 => V1_CONTROLLERS
                .iter()
                .map(|c| (c, self.root.join(c)))
                .filter(|(_, dir)| dir.is_dir())
                .filter_map(|(c, dir)| match *c {
                    "cpu" => Some(Subsystem::Cpu(CpuController::new(dir, false))),
                    "memory" => Some(Subsystem::Mem(MemController::new(dir, false))),
                    "pids" => Some(Subsystem::Pid(PidController::new(dir, false))),
                    _ => None,
                })
                .collect(),
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

/// A task cgroup, managed through cgroups-rs, under an injected mount root.
#[derive(Debug)]
pub struct FsCgroup {
    version: Version,
    root: PathBuf,
    /// `<parent>/<task_id>`.
    rel: String,
    cg: Cgroup,
}

impl Clone for FsCgroup {
    fn clone(&self) -> FsCgroup {
        FsCgroup {
            version: self.version,
            root: self.root.clone(),
            rel: self.rel.clone(),
            cg: load(self.version, &self.root, &self.rel),
        }
    }
}

impl FsCgroup {
    /// The cgroup `<parent>/<task_id>` under `root` (e.g. `/sys/fs/cgroup`).
    pub fn new(version: Version, root: &Path, parent: &str, task_id: &str) -> FsCgroup {
        let rel = format!("{}/{task_id}", parent.trim_matches('/'));
        FsCgroup {
            version,
            root: root.to_path_buf(),
            cg: load(version, root, &rel),
            rel,
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
        self.version
    }

    /// The directory of the cgroup in one controller (v1) or the tree (v2).
    pub fn dir(&self, controller: &str) -> PathBuf {
        match self.version {
            Version::V1 => self.root.join(controller).join(&self.rel),
            Version::V2 => self.root.join(&self.rel),
        }
    }

    /// The cgroup's directories: one per v1 controller present, or the v2 one.
    fn dirs(&self) -> Vec<PathBuf> {
        match self.version {
            Version::V1 => self
                .controllers()
                .iter()
                .map(|c| c.path().to_path_buf())
                .collect(),
            Version::V2 => vec![self.root.join(&self.rel)],
        }
    }

    /// Our controllers (cpu, memory, pids) among the cgroup's subsystems.
    ///
    /// Everything in cgroups-rs that goes through `Subsystem::to_controller`
    /// (`Cgroup::controller_of`, `procs`, v1 `create`, `load_with_specified_controllers`)
    /// instantiates the `dyn Controller` vtables of all fourteen controller types, which
    /// links regex (hugetlb) and 1.2 MiB more code into the executor. So we pick the
    /// four types we use here and call their `Controller` methods.
    fn controllers(&self) -> Vec<&dyn Controller> {
        self.cg
            .subsystems()
            .iter()
            .filter_map(|s| match s {
                Subsystem::Cpu(c) => Some(c as &dyn Controller),
                Subsystem::Mem(c) => Some(c as &dyn Controller),
                Subsystem::Pid(c) => Some(c as &dyn Controller),
                _ => None,
            })
            .collect()
    }

    /// The subsystem `pick` selects, or an error naming the controller: cgroups-rs
    /// leaves an unavailable controller out of the cgroup, and its setters would then
    /// be skipped without a word.
    fn require<'a, T>(
        &'a self,
        name: &'static str,
        pick: impl Fn(&'a Subsystem) -> Option<&'a T>,
    ) -> Result<&'a T, CgroupError> {
        self.cg
            .subsystems()
            .iter()
            .find_map(pick)
            .ok_or_else(|| CgroupError::MissingController {
                controller: name,
                root: self.root.clone(),
            })
    }

    fn cpu_controller(&self) -> Result<&CpuController, CgroupError> {
        self.require("cpu", |s| match s {
            Subsystem::Cpu(c) => Some(c),
            _ => None,
        })
    }

    fn memory_controller(&self) -> Result<&MemController, CgroupError> {
        self.require("memory", |s| match s {
            Subsystem::Mem(c) => Some(c),
            _ => None,
        })
    }

    fn pids_controller(&self) -> Result<&PidController, CgroupError> {
        self.require("pids", |s| match s {
            Subsystem::Pid(c) => Some(c),
            _ => None,
        })
    }

    /// v2 only: creates each level down to ours, after enabling those of cpu, memory
    /// and pids that the root offers (`+cpu +memory +pids`) in the
    /// `cgroup.subtree_control` of the level above. Plain files, not `Cgroup::create`:
    /// that enables the controllers listed in the hard-coded
    /// `/sys/fs/cgroup/cgroup.controllers` and ignores write errors, and its v1 half
    /// goes through `Subsystem::to_controller` (see `controllers`). A controller the
    /// root lacks is an error only when a limit needs it.
    fn create_v2_dirs(&self) -> Result<bool, CgroupError> {
        let value = self
            .cg
            .subsystems()
            .iter()
            .filter_map(|s| match s {
                Subsystem::Cpu(_) => Some("+cpu"),
                Subsystem::Mem(_) => Some("+memory"),
                Subsystem::Pid(_) => Some("+pids"),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join(" ");
        let mut level = self.root.clone();
        let mut existed = false;
        for part in self.rel.split('/').filter(|p| !p.is_empty()) {
            if !value.is_empty() {
                write_file(&level.join("cgroup.subtree_control"), &value)?;
            }
            level = level.join(part);
            existed = make_dir(&level)?;
        }
        Ok(existed)
    }

    /// v1: makes each of our controllers' directories (`mkdir`, and the parent's when
    /// that is missing). Plain `mkdir`, not the controllers' `create`, which only logs
    /// its errors: so no `stat` of each directory afterwards, and no `stat` nor
    /// `cgroup.procs` read beforehand to find a leftover, which `EEXIST` tells.
    /// Returns whether one existed already.
    fn create_v1_dirs(&self) -> Result<bool, CgroupError> {
        let mut existed = false;
        for dir in self.dirs() {
            existed |= make_dir(&dir)?;
        }
        Ok(existed)
    }

    fn create_dirs(&self) -> Result<bool, CgroupError> {
        match self.version {
            Version::V1 => self.create_v1_dirs(),
            Version::V2 => self.create_v2_dirs(),
        }
    }

    fn create_v1_limits(&self, limits: &Limits) -> Result<(), CgroupError> {
        if limits.cpu > 0.0 {
            let cpu = self.cpu_controller()?;
            let dir = cpu.path();
            let quota = cpu_quota_us(limits.cpu);
            for (name, want) in [
                ("cpu.cfs_period_us", CPU_PERIOD_US),
                ("cpu.cfs_quota_us", quota),
            ] {
                let file = dir.join(name);
                let read = write_limit(&file, &want.to_string())?;
                check(&file, want, &read, read == want.to_string())?;
            }
        }
        if limits.memory_bytes > 0 {
            let mem = self.memory_controller()?;
            self.set_memory(mem, "memory.limit_in_bytes", limits.memory_bytes)?;
        }
        if limits.pids > 0 {
            let pids = self.pids_controller()?;
            self.set_pids(pids, limits.pids)?;
        }
        Ok(())
    }

    fn create_v2_limits(&self, limits: &Limits) -> Result<(), CgroupError> {
        if limits.cpu > 0.0 {
            let cpu = self.cpu_controller()?;
            let dir = cpu.path();
            let quota = cpu_quota_us(limits.cpu);
            let file = dir.join("cpu.max");
            let wrote = format!("{quota} {CPU_PERIOD_US}");
            let read = write_limit(&file, &wrote)?;
            check(&file, &wrote, &read, read == wrote)?;
        }
        if limits.memory_bytes > 0 {
            let mem = self.memory_controller()?;
            self.set_memory(mem, "memory.max", limits.memory_bytes)?;
            // Kill the whole task on OOM, not one random process of it. Plain file:
            // cgroups-rs has no memory.oom.group knob.
            let file = mem.path().join("memory.oom.group");
            let read = write_limit(&file, "1")?;
            check(&file, "1", &read, read == "1")?;
        }
        if limits.pids > 0 {
            let pids = self.pids_controller()?;
            self.set_pids(pids, limits.pids)?;
        }
        Ok(())
    }

    /// `memory.limit_in_bytes` (v1) or `memory.max` (v2), written and read back as
    /// plain files (cgroups-rs reads it only within `memory_stat()`, which reads a
    /// dozen other files and, on v2, panics when one is missing).
    fn set_memory(&self, mem: &MemController, name: &str, want: u64) -> Result<(), CgroupError> {
        let file = mem.path().join(name);
        if i64::try_from(want).is_err() {
            return Err(above_i64_max(file, want));
        }
        let read = write_limit(&file, &want.to_string())?;
        // The kernel rounds down to whole pages.
        let ok = read
            .parse::<u64>()
            .is_ok_and(|v| v <= want && want - v < 65536);
        check(&file, want, read, ok)
    }

    fn set_pids(&self, pids: &PidController, want: u64) -> Result<(), CgroupError> {
        let file = pids.path().join("pids.max");
        i64::try_from(want).map_err(|_| above_i64_max(file.clone(), want))?;
        let read = write_limit(&file, &want.to_string())?;
        check(&file, want, &read, read == want.to_string())
    }

    /// Sets the cgroup's `pids.max` to 0, so no process in it can fork, and returns the
    /// file and the limit it held, to restore. None without a pids controller.
    fn fence_forks(&self) -> Option<(PathBuf, String)> {
        let file = self.pids_controller().ok()?.path().join("pids.max");
        let limit = fs::read_to_string(&file).ok()?.trim().to_string();
        write_file(&file, "0").ok()?;
        Some((file, limit))
    }

    /// `cgroup.procs` of the v2 cgroup when cgroups-rs has no controller to read it
    /// through (it lists v2 processes via the first controller only).
    fn v2_procs_fallback(&self) -> Result<Vec<i32>, CgroupError> {
        let file = self.root.join(&self.rel).join("cgroup.procs");
        match fs::read_to_string(&file) {
            Ok(text) => Ok(parse_pids(&text)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(source) => Err(CgroupError::Read { path: file, source }),
        }
    }
}

/// `mkdir path` (and its parents when the parent is missing). Returns whether it
/// existed already.
fn make_dir(path: &Path) -> Result<bool, CgroupError> {
    let err = |source| CgroupError::Create {
        path: path.to_path_buf(),
        source,
    };
    match fs::create_dir(path) {
        Ok(()) => Ok(false),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            fs::create_dir_all(path).map_err(err)?;
            Ok(false)
        }
        Err(e) => Err(err(e)),
    }
}

/// The write error for a limit the cgroup files cannot hold (they are signed 64-bit).
fn above_i64_max(path: PathBuf, want: u64) -> CgroupError {
    CgroupError::Write {
        path,
        value: want.to_string(),
        source: io::Error::new(io::ErrorKind::InvalidInput, "above i64::MAX"),
    }
}

/// `Ok` if `ok`, else a read-back error for `path`.
fn check(
    path: &Path,
    wrote: impl ToString,
    read: impl ToString,
    ok: bool,
) -> Result<(), CgroupError> {
    if ok {
        Ok(())
    } else {
        Err(CgroupError::ReadBack {
            path: path.to_path_buf(),
            wrote: wrote.to_string(),
            read: read.to_string(),
        })
    }
}

/// Writes `value` to an existing file (never creates it: a missing file means a
/// missing controller, and the open's own `ENOENT` says so without a `stat` first).
fn write_file(path: &Path, value: &str) -> Result<(), CgroupError> {
    write_opened(path, value, fs::OpenOptions::new().write(true)).map(drop)
}

/// Writes a limit like [`write_file`] (truncating what a file in a test tree held
/// before) and reads it back, trimmed, through the same descriptor: one open of the
/// cgroupfs file, not two. A cgroup file read at offset 0 shows the current value.
///
/// Plain files rather than the cgroups-rs setters and getters: those open with
/// `O_CREAT`, which on a test tree would create a missing limit file, so each write
/// needed a `stat` of the file first (a path walk through cgroupfs, as costly as the
/// write), and they open the file again to read it.
fn write_limit(path: &Path, value: &str) -> Result<String, CgroupError> {
    use std::os::unix::fs::FileExt;
    let f = write_opened(
        path,
        value,
        fs::OpenOptions::new().read(true).write(true).truncate(true),
    )?;
    let mut buf = [0u8; 64];
    let n = f.read_at(&mut buf, 0).map_err(|source| CgroupError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(String::from_utf8_lossy(&buf[..n]).trim().to_string())
}

fn write_opened(path: &Path, value: &str, how: &fs::OpenOptions) -> Result<fs::File, CgroupError> {
    let err = |source: io::Error| CgroupError::Write {
        path: path.to_path_buf(),
        value: value.to_string(),
        source: if source.kind() == io::ErrorKind::NotFound {
            io::Error::new(
                io::ErrorKind::NotFound,
                "no such file (the controller is missing or not enabled)",
            )
        } else {
            source
        },
    };
    let mut f = how.open(path).map_err(err)?;
    f.write_all(value.as_bytes()).map_err(err)?;
    Ok(f)
}

/// The `oom_kill N` line of `memory.oom_control` (v1) or `memory.events` (v2).
pub fn parse_oom_kills(text: &str) -> u64 {
    text.lines()
        .filter_map(|l| l.strip_prefix("oom_kill "))
        .filter_map(|n| n.trim().parse().ok())
        .next()
        .unwrap_or(0)
}

/// The pids of a `cgroup.procs` file.
pub fn parse_pids(text: &str) -> Vec<i32> {
    text.lines().filter_map(|l| l.trim().parse().ok()).collect()
}

fn cpu_quota_us(cpu: f64) -> u64 {
    ((cpu * CPU_PERIOD_US as f64).round() as u64).max(1000)
}

impl TaskCgroup for FsCgroup {
    fn create(&self, limits: &Limits) -> Result<bool, CgroupError> {
        let mut fresh = !self.create_dirs()?;
        if !fresh {
            // A leftover of an earlier executor of this task: empty it, remove it and
            // start over (errors surface below if it stays).
            let _ = self.kill_all();
            let _ = self.remove();
            fresh = !self.create_dirs()?;
        }
        match self.version {
            Version::V1 => self.create_v1_limits(limits)?,
            Version::V2 => self.create_v2_limits(limits)?,
        }
        Ok(fresh)
    }

    fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs()
            .into_iter()
            .map(|d| d.join("cgroup.procs"))
            .collect()
    }

    fn pids(&self) -> Result<Vec<i32>, CgroupError> {
        let controllers = self.controllers();
        if self.version == Version::V2 && controllers.is_empty() {
            return self.v2_procs_fallback();
        }
        // cgroups-rs reads `cgroup.procs` of each controller (v1) or of the tree (v2,
        // where every controller has the same directory); a missing cgroup reads as
        // empty.
        let take = if self.version == Version::V2 {
            1
        } else {
            controllers.len()
        };
        let mut all: Vec<i32> = controllers
            .iter()
            .take(take)
            .flat_map(|c| c.procs())
            .filter_map(|p| i32::try_from(p.pid).ok())
            .filter(|&p| p > 0)
            .collect();
        all.sort_unstable();
        all.dedup();
        Ok(all)
    }

    fn oom_kills(&self) -> Result<u64, CgroupError> {
        // Plain files: cgroups-rs has no v2 memory.events reader, and its v1
        // `oom_control` parser takes the counter by position.
        let file = match self.version {
            Version::V1 => self.dir("memory").join("memory.oom_control"),
            Version::V2 => self.dir("").join("memory.events"),
        };
        match fs::read_to_string(&file) {
            Ok(text) => Ok(parse_oom_kills(&text)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
            Err(source) => Err(CgroupError::Read { path: file, source }),
        }
    }

    fn is_empty(&self) -> Result<bool, CgroupError> {
        match (self.version, self.pids_controller()) {
            // One hierarchy is enough: the task's processes are in all of ours, and
            // only root can move a process out of one (`cgroup.procs` is root's).
            // Should a task allowed to run as root have done so, `remove` finds the
            // process (rmdir fails busy) and kills it then.
            (Version::V1, Ok(pids)) => Ok(pids.procs().is_empty()),
            _ => Ok(self.pids()?.is_empty()),
        }
    }

    fn kill_all(&self) -> Result<(), CgroupError> {
        // Nothing left (the usual case once a task ended): nothing to fence or kill.
        // An empty cgroup cannot gain a process but by a migration, which only this
        // executor does.
        if self.pids()?.is_empty() {
            return Ok(());
        }
        if self.version == Version::V2 {
            match self.cg.kill() {
                Ok(()) => {}
                // No cgroup.kill (kernel before 5.14, or no cgroup): the loop below.
                Err(e) if matches!(e.kind(), ErrorKind::InvalidOperation) => {}
                Err(source) => {
                    return Err(CgroupError::Lib {
                        what: "write cgroup.kill in",
                        path: self.dir(""),
                        source,
                    })
                }
            }
        }
        // No process in the cgroup can fork while the loop kills, so a fork bomb
        // cannot race it (v1 has no cgroup.kill). This needs no freezer hierarchy:
        // a freeze and thaw also flip a kernel static key each, which patches kernel
        // text with an IPI to every CPU.
        let fence = self.fence_forks();
        let started = Instant::now();
        let limit = Duration::from_secs(10);
        let result = loop {
            // An error ends the loop too, so that the limit is written back below.
            let pids = match self.pids() {
                Ok(pids) => pids,
                Err(e) => break Err(e),
            };
            if pids.is_empty() {
                break Ok(());
            }
            if started.elapsed() > limit {
                break Err(CgroupError::NotEmpty {
                    path: self.dir("pids"),
                    secs: limit.as_secs(),
                    pids,
                });
            }
            for pid in pids {
                // ESRCH: already gone, which is what we want.
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        // The cgroup may be used again (final processes after a kill step).
        if let Some((file, limit)) = fence {
            let _ = write_file(&file, &limit);
        }
        result
    }

    fn remove(&self) -> Result<(), CgroupError> {
        // The usual case first: one rmdir per directory, a missing one counting as
        // removed (no `stat` before each).
        let mut left = false;
        for dir in self.dirs() {
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
        let _ = self.kill_all();
        let started = Instant::now();
        loop {
            if !self.dirs().iter().any(|d| d.exists()) {
                return Ok(());
            }
            // cgroups-rs removes each of our controllers' directories (v1, with a few
            // retries of its own) or the tree's (v2).
            let deleted = match self.version {
                Version::V1 => self.controllers().iter().try_for_each(|c| c.delete()),
                Version::V2 => self.cg.delete(),
            };
            match deleted {
                Ok(()) => return Ok(()),
                // Exiting processes may linger a moment (EBUSY).
                Err(_) if started.elapsed() < Duration::from_secs(2) => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(source) => {
                    return Err(CgroupError::Remove {
                        path: self.dir(""),
                        source,
                    })
                }
            }
        }
    }

    fn describe(&self) -> String {
        match self.version {
            Version::V1 => format!("cgroup v1 {} in {}", self.rel, V1_CONTROLLERS.join(",")),
            Version::V2 => format!("cgroup v2 {}", self.dir("").display()),
        }
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
    let rel = own.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let wanted = match version {
            Version::V1 => controllers.split(',').any(|c| c == "pids"),
            Version::V2 => controllers.is_empty(),
        };
        wanted.then(|| path.trim_start_matches('/').to_string())
    });
    let Some(rel) = rel else {
        return;
    };
    let procs = match version {
        Version::V1 => root.join("pids").join(rel).join("cgroup.procs"),
        Version::V2 => root.join(rel).join("cgroup.procs"),
    };
    let _ = std::thread::Builder::new()
        .name("cgroup-prewarm".into())
        .stack_size(64 * 1024)
        .spawn(move || {
            let _ = write_file(&procs, "0");
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake v2 tree: root and parent with the controller files a kernel would show.
    fn fake_v2(with_memory: bool) -> (tempfile::TempDir, FsCgroup) {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        fs::write(root.join("cgroup.controllers"), "cpu memory pids").unwrap();
        fs::write(root.join("cgroup.subtree_control"), "").unwrap();
        let cg = FsCgroup::new(Version::V2, root, "drover", "t1");
        fs::create_dir_all(root.join("drover/t1")).unwrap();
        fs::write(root.join("drover/cgroup.subtree_control"), "").unwrap();
        // What a kernel shows in a new cgroup.
        let mut files = vec![
            ("cpu.max", "max 100000\n"),
            ("pids.max", "max\n"),
            ("cgroup.procs", ""),
            ("cgroup.kill", ""),
        ];
        if with_memory {
            files.extend([
                ("memory.max", "max\n"),
                ("memory.oom.group", "0\n"),
                ("memory.events", "oom_kill 0\n"),
            ]);
        }
        for (f, text) in files {
            fs::write(root.join("drover/t1").join(f), text).unwrap();
        }
        (tmp, cg)
    }

    #[test]
    fn v2_limits_are_written_and_read_back_in_a_fake_tree() {
        let (tmp, cg) = fake_v2(true);
        let limits = Limits {
            cpu: 0.5,
            memory_bytes: 64 << 20,
            pids: 100,
        };
        cg.create(&limits).unwrap();
        let dir = tmp.path().join("drover/t1");
        assert_eq!(
            fs::read_to_string(dir.join("cpu.max")).unwrap(),
            "50000 100000"
        );
        assert_eq!(
            fs::read_to_string(dir.join("memory.max")).unwrap(),
            "67108864"
        );
        assert_eq!(
            // Our plain write does not truncate (a kernel file has no length).
            fs::read_to_string(dir.join("memory.oom.group"))
                .unwrap()
                .trim(),
            "1"
        );
        assert_eq!(fs::read_to_string(dir.join("pids.max")).unwrap(), "100");
        assert!(
            fs::read_to_string(tmp.path().join("cgroup.subtree_control"))
                .unwrap()
                .contains("+memory")
        );
        assert_eq!(cg.procs_files(), vec![dir.join("cgroup.procs")]);
    }

    #[test]
    fn v2_missing_memory_controller_is_an_error_not_ignored() {
        let (_tmp, cg) = fake_v2(false);
        let err = cg
            .create(&Limits {
                cpu: 1.0,
                memory_bytes: 1 << 20,
                pids: 0,
            })
            .unwrap_err();
        assert!(err.to_string().contains("memory.max"), "{err}");
    }

    #[test]
    fn v2_oom_counter_comes_from_memory_events() {
        let (tmp, cg) = fake_v2(true);
        fs::write(
            tmp.path().join("drover/t1/memory.events"),
            "low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n",
        )
        .unwrap();
        assert_eq!(cg.oom_kills().unwrap(), 2);
    }

    #[test]
    fn detect_tells_v2_from_v1_from_nothing() {
        let (tmp, _) = fake_v2(true);
        assert_eq!(FsCgroup::detect(tmp.path()), Some(Version::V2));
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(FsCgroup::detect(empty.path()), None);
    }

    #[test]
    fn v1_oom_control_is_parsed() {
        assert_eq!(
            parse_oom_kills("oom_kill_disable 0\nunder_oom 0\noom_kill 7\n"),
            7
        );
        assert_eq!(parse_oom_kills("oom_kill_disable 0\n"), 0);
    }

    #[test]
    fn v2_controller_not_in_cgroup_controllers_is_named_in_the_error() {
        let (tmp, _) = fake_v2(true);
        fs::write(tmp.path().join("cgroup.controllers"), "cpu pids").unwrap();
        let cg = FsCgroup::new(Version::V2, tmp.path(), "drover", "t1");
        let err = cg
            .create(&Limits {
                cpu: 0.0,
                memory_bytes: 1 << 20,
                pids: 0,
            })
            .unwrap_err();
        assert!(
            matches!(
                err,
                CgroupError::MissingController {
                    controller: "memory",
                    ..
                }
            ),
            "{err}"
        );
    }

    /// A fake v1 tree: one directory per controller with a kernel's default files.
    fn fake_v1() -> (tempfile::TempDir, FsCgroup) {
        let tmp = tempfile::tempdir().unwrap();
        let files: [(&str, &[(&str, &str)]); 3] = [
            (
                "cpu",
                &[
                    ("cpu.cfs_period_us", "100000\n"),
                    ("cpu.cfs_quota_us", "-1\n"),
                ],
            ),
            (
                "memory",
                &[
                    ("memory.limit_in_bytes", "9223372036854771712\n"),
                    (
                        "memory.oom_control",
                        "oom_kill_disable 0\nunder_oom 0\noom_kill 4\n",
                    ),
                ],
            ),
            ("pids", &[("pids.max", "max\n")]),
        ];
        for (controller, list) in files {
            let dir = tmp.path().join(controller).join("drover/t1");
            fs::create_dir_all(&dir).unwrap();
            fs::write(dir.join("cgroup.procs"), "").unwrap();
            for (f, text) in list {
                fs::write(dir.join(f), text).unwrap();
            }
        }
        let cg = FsCgroup::new(Version::V1, tmp.path(), "drover", "t1");
        (tmp, cg)
    }

    #[test]
    fn v1_limits_are_written_and_read_back_in_a_fake_tree_at_an_injected_root() {
        let (tmp, cg) = fake_v1();
        cg.create(&Limits {
            cpu: 1.5,
            memory_bytes: 32 << 20,
            pids: 64,
        })
        .unwrap();
        let read = |c: &str, f: &str| {
            fs::read_to_string(tmp.path().join(c).join("drover/t1").join(f))
                .unwrap()
                .trim()
                .to_string()
        };
        assert_eq!(read("cpu", "cpu.cfs_period_us"), "100000");
        assert_eq!(read("cpu", "cpu.cfs_quota_us"), "150000");
        assert_eq!(read("memory", "memory.limit_in_bytes"), "33554432");
        assert_eq!(read("pids", "pids.max"), "64");
        assert_eq!(cg.procs_files().len(), 3);
        assert_eq!(cg.oom_kills().unwrap(), 4);
        fs::write(tmp.path().join("pids/drover/t1/cgroup.procs"), "").unwrap();
        assert!(cg.pids().unwrap().is_empty());
        assert!(cg.is_empty().unwrap());
    }

    #[test]
    fn v1_emptiness_is_read_from_the_pids_hierarchy_alone() {
        let (tmp, cg) = fake_v1();
        let procs = |c: &str| tmp.path().join(c).join("drover/t1/cgroup.procs");
        fs::write(procs("memory"), "4242\n").unwrap();
        assert!(cg.is_empty().unwrap(), "only the pids hierarchy is read");
        assert_eq!(cg.pids().unwrap(), vec![4242], "pids reads every hierarchy");
        fs::write(procs("pids"), "4242\n").unwrap();
        assert!(!cg.is_empty().unwrap());
    }

    #[test]
    fn v1_missing_limit_file_is_an_error_and_is_not_created() {
        let (tmp, cg) = fake_v1();
        let file = tmp.path().join("pids/drover/t1/pids.max");
        fs::remove_file(&file).unwrap();
        let err = cg
            .create(&Limits {
                cpu: 0.0,
                memory_bytes: 0,
                pids: 10,
            })
            .unwrap_err();
        assert!(err.to_string().contains("pids.max"), "{err}");
        assert!(!file.exists());
    }

    #[test]
    fn v1_limit_that_does_not_stick_is_a_read_back_error() {
        let (tmp, cg) = fake_v1();
        // Writes succeed and reads come back empty, like a limit the kernel dropped.
        let file = tmp.path().join("memory/drover/t1/memory.limit_in_bytes");
        fs::remove_file(&file).unwrap();
        std::os::unix::fs::symlink("/dev/null", &file).unwrap();
        let err = cg
            .create(&Limits {
                cpu: 0.0,
                memory_bytes: 8 << 20,
                pids: 0,
            })
            .unwrap_err();
        assert!(matches!(err, CgroupError::ReadBack { .. }), "{err}");
        assert!(err.to_string().contains("memory.limit_in_bytes"), "{err}");
    }

    #[test]
    fn remove_of_a_missing_cgroup_succeeds() {
        let (tmp, _) = fake_v2(true);
        let cg = FsCgroup::new(Version::V2, tmp.path(), "drover", "gone");
        cg.remove().unwrap();
    }
}
