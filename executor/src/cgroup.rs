//! The task's cgroup behind a narrow trait: create it with cpu, memory and pids limits
//! (read back after writing), tell where a child writes itself before exec, count OOM
//! kills, kill everything in it and remove it.
//!
//! The implementation writes the cgroup files itself instead of going through
//! cgroups-rs: cgroups-rs hard-codes `/sys/fs/cgroup` as the v2 root (so it cannot be
//! pointed at a fake tree in a test) and silently skips a missing v2 controller, both
//! of which we must not do. The mount root is injected, so v1 runs for real and v2 is
//! tested against a directory tree in a temp dir.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// v1 controllers we use, each its own hierarchy under the mount root.
pub const V1_CONTROLLERS: [&str; 4] = ["cpu", "memory", "pids", "freezer"];

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
    #[error("cgroup {path} still has processes after {secs}s of SIGKILL: {pids:?}")]
    NotEmpty {
        path: PathBuf,
        secs: u64,
        pids: Vec<i32>,
    },
    #[error("cannot remove cgroup {path}: {source}")]
    Remove { path: PathBuf, source: io::Error },
}

/// The cgroup of one task (youki's `CgroupManager`, narrowed to what we need).
pub trait TaskCgroup: Send + Sync {
    /// Creates the cgroup(s), writes the limits and reads them back.
    fn create(&self, limits: &Limits) -> Result<(), CgroupError>;
    /// The `cgroup.procs` files a child writes `0` into (in pre_exec) to join.
    fn procs_files(&self) -> Vec<PathBuf>;
    /// Every pid in the cgroup.
    fn pids(&self) -> Result<Vec<i32>, CgroupError>;
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

/// A task cgroup made of plain files under an injected mount root.
#[derive(Clone, Debug)]
pub struct FsCgroup {
    version: Version,
    root: PathBuf,
    /// `<parent>/<task_id>`.
    rel: PathBuf,
}

impl FsCgroup {
    /// The cgroup `<parent>/<task_id>` under `root` (e.g. `/sys/fs/cgroup`).
    pub fn new(version: Version, root: &Path, parent: &str, task_id: &str) -> FsCgroup {
        FsCgroup {
            version,
            root: root.to_path_buf(),
            rel: Path::new(parent).join(task_id),
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

    fn dirs(&self) -> Vec<PathBuf> {
        match self.version {
            Version::V1 => V1_CONTROLLERS
                .iter()
                .map(|c| self.root.join(c))
                .filter(|h| h.is_dir())
                .map(|h| h.join(&self.rel))
                .collect(),
            Version::V2 => vec![self.root.join(&self.rel)],
        }
    }

    fn freezer(&self) -> Option<PathBuf> {
        let dir = self.dir("freezer");
        (self.version == Version::V1 && dir.join("freezer.state").is_file()).then_some(dir)
    }
}

/// Writes `value` to an existing file (never creates it: a missing file means a
/// missing controller).
fn write_file(path: &Path, value: &str) -> Result<(), CgroupError> {
    let err = |source| CgroupError::Write {
        path: path.to_path_buf(),
        value: value.to_string(),
        source,
    };
    let mut f = fs::OpenOptions::new().write(true).open(path).map_err(err)?;
    f.write_all(value.as_bytes()).map_err(err)
}

fn read_file(path: &Path) -> Result<String, CgroupError> {
    fs::read_to_string(path).map_err(|source| CgroupError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Writes a limit and checks that the file reads back as `expect(read)`.
fn write_checked(
    path: &Path,
    value: &str,
    matches: impl Fn(&str) -> bool,
) -> Result<(), CgroupError> {
    write_file(path, value)?;
    let read = read_file(path)?;
    if matches(read.trim()) {
        Ok(())
    } else {
        Err(CgroupError::ReadBack {
            path: path.to_path_buf(),
            wrote: value.to_string(),
            read: read.trim().to_string(),
        })
    }
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
    fn create(&self, limits: &Limits) -> Result<(), CgroupError> {
        if self.version == Version::V2 {
            // Enable the controllers for the children of every level down to ours.
            let mut level = self.root.clone();
            for part in self.rel.iter() {
                write_file(&level.join("cgroup.subtree_control"), "+cpu +memory +pids")?;
                level = level.join(part);
                if !level.is_dir() {
                    fs::create_dir(&level).map_err(|source| CgroupError::Create {
                        path: level.clone(),
                        source,
                    })?;
                }
            }
        } else {
            for dir in self.dirs() {
                fs::create_dir_all(&dir)
                    .map_err(|source| CgroupError::Create { path: dir, source })?;
            }
        }
        match self.version {
            Version::V1 => {
                if limits.cpu > 0.0 {
                    let cpu = self.dir("cpu");
                    let period = CPU_PERIOD_US.to_string();
                    write_checked(&cpu.join("cpu.cfs_period_us"), &period, |r| r == period)?;
                    let quota = cpu_quota_us(limits.cpu).to_string();
                    write_checked(&cpu.join("cpu.cfs_quota_us"), &quota, |r| r == quota)?;
                }
                if limits.memory_bytes > 0 {
                    let want = limits.memory_bytes;
                    write_checked(
                        &self.dir("memory").join("memory.limit_in_bytes"),
                        &want.to_string(),
                        // The kernel rounds down to whole pages.
                        |r| {
                            r.parse::<u64>()
                                .is_ok_and(|v| v <= want && want - v < 65536)
                        },
                    )?;
                }
                if limits.pids > 0 {
                    let pids = limits.pids.to_string();
                    write_checked(&self.dir("pids").join("pids.max"), &pids, |r| r == pids)?;
                }
            }
            Version::V2 => {
                let dir = self.dir("");
                if limits.cpu > 0.0 {
                    let value = format!("{} {}", cpu_quota_us(limits.cpu), CPU_PERIOD_US);
                    write_checked(&dir.join("cpu.max"), &value, |r| r == value)?;
                }
                if limits.memory_bytes > 0 {
                    let want = limits.memory_bytes;
                    write_checked(&dir.join("memory.max"), &want.to_string(), |r| {
                        r.parse::<u64>()
                            .is_ok_and(|v| v <= want && want - v < 65536)
                    })?;
                    // Kill the whole task on OOM, not one random process of it.
                    write_checked(&dir.join("memory.oom.group"), "1", |r| r == "1")?;
                }
                if limits.pids > 0 {
                    let pids = limits.pids.to_string();
                    write_checked(&dir.join("pids.max"), &pids, |r| r == pids)?;
                }
            }
        }
        Ok(())
    }

    fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs()
            .into_iter()
            .map(|d| d.join("cgroup.procs"))
            .collect()
    }

    fn pids(&self) -> Result<Vec<i32>, CgroupError> {
        let mut all = Vec::new();
        for file in self.procs_files() {
            match fs::read_to_string(&file) {
                Ok(text) => all.extend(parse_pids(&text)),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(source) => return Err(CgroupError::Read { path: file, source }),
            }
        }
        all.sort_unstable();
        all.dedup();
        Ok(all)
    }

    fn oom_kills(&self) -> Result<u64, CgroupError> {
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

    fn kill_all(&self) -> Result<(), CgroupError> {
        if self.version == Version::V2 {
            let kill_file = self.dir("").join("cgroup.kill");
            if kill_file.exists() {
                write_file(&kill_file, "1")?;
            }
        }
        // Freezing first stops a fork bomb from racing the kill loop.
        let freezer = self.freezer();
        if let Some(dir) = &freezer {
            let _ = write_file(&dir.join("freezer.state"), "FROZEN");
        }
        let started = Instant::now();
        let limit = Duration::from_secs(10);
        loop {
            let pids = self.pids()?;
            if pids.is_empty() {
                break;
            }
            if started.elapsed() > limit {
                return Err(CgroupError::NotEmpty {
                    path: self.dir("pids"),
                    secs: limit.as_secs(),
                    pids,
                });
            }
            for pid in pids {
                // ESRCH: already gone, which is what we want.
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            if let Some(dir) = &freezer {
                // Frozen processes die only once thawed.
                let _ = write_file(&dir.join("freezer.state"), "THAWED");
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        if let Some(dir) = &freezer {
            let _ = write_file(&dir.join("freezer.state"), "THAWED");
        }
        Ok(())
    }

    fn remove(&self) -> Result<(), CgroupError> {
        for dir in self.dirs() {
            let started = Instant::now();
            loop {
                match fs::remove_dir(&dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    // Exiting processes may linger a moment (EBUSY).
                    Err(_) if started.elapsed() < Duration::from_secs(2) => {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(source) => return Err(CgroupError::Remove { path: dir, source }),
                }
            }
        }
        Ok(())
    }

    fn describe(&self) -> String {
        match self.version {
            Version::V1 => format!(
                "cgroup v1 {} in {}",
                self.rel.display(),
                V1_CONTROLLERS.join(",")
            ),
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
        let mut files = vec!["cpu.max", "pids.max", "cgroup.procs", "cgroup.kill"];
        if with_memory {
            files.extend(["memory.max", "memory.oom.group", "memory.events"]);
        }
        for f in files {
            fs::write(root.join("drover/t1").join(f), "").unwrap();
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
            fs::read_to_string(dir.join("memory.oom.group")).unwrap(),
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
    fn remove_of_a_missing_cgroup_succeeds() {
        let (tmp, _) = fake_v2(true);
        let cg = FsCgroup::new(Version::V2, tmp.path(), "drover", "gone");
        cg.remove().unwrap();
    }
}
