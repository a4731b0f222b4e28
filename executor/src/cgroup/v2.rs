//! cgroup v2: the unified tree, `<root>/<parent>/<task_id>`, with cpu, memory and
//! pids enabled in each ancestor's `cgroup.subtree_control`, `memory.oom.group` set,
//! and `cgroup.kill` for the kill.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use cgroups_rs::cpu::CpuController;
use cgroups_rs::error::ErrorKind;
use cgroups_rs::memory::MemController;
use cgroups_rs::pid::PidController;
use cgroups_rs::{Controller, Subsystem};

use super::files::{check, cpu_quota_us, make_dir, parse_pids, write_file, write_limit};
use super::{
    create_fresh, own_cgroup, read_oom_kills, remove_dirs, CgroupError, Handle, Limits, TaskCgroup,
    CPU_PERIOD_US,
};

/// The cgroups-rs subsystems of the tree at `root`: those of cpu, memory and pids
/// listed in `<root>/cgroup.controllers` (what `hierarchies::V2::subsystems` does
/// for `/sys/fs/cgroup`).
pub(super) fn subsystems(root: &Path) -> Vec<Subsystem> {
    let listed = fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
    listed
        .split_whitespace()
        .filter_map(|c| match c {
            "cpu" => Some(Subsystem::Cpu(CpuController::new(root.to_path_buf(), true))),
            "memory" => Some(Subsystem::Mem(MemController::new(root.to_path_buf(), true))),
            "pids" => Some(Subsystem::Pid(PidController::new(root.to_path_buf(), true))),
            _ => None,
        })
        .collect()
}

/// The executor's own `cgroup.procs` in the tree (for the prewarm).
pub(super) fn own_procs(root: &Path, own: &str) -> Option<PathBuf> {
    let rel = own_cgroup(own, str::is_empty)?;
    Some(root.join(rel).join("cgroup.procs"))
}

/// Writes `value` (`+cpu +memory +pids`) to a `cgroup.subtree_control`. A level
/// that refuses the write (an ancestor of a delegated subtree that is not ours to
/// write, e.g. a read-only mount in a container) is fine when it already enables
/// every one of them; the file is read only in that case.
fn enable(file: &Path, value: &str) -> Result<(), CgroupError> {
    let Err(e) = write_file(file, value) else {
        return Ok(());
    };
    let enabled = fs::read_to_string(file).unwrap_or_default();
    if lists_all(&enabled, value) {
        Ok(())
    } else {
        Err(e)
    }
}

/// Whether `enabled` (a `cgroup.subtree_control`: `cpu memory pids`) lists every
/// controller of `value` (`+cpu +memory`).
fn lists_all(enabled: &str, value: &str) -> bool {
    value.split_whitespace().all(|c| {
        enabled
            .split_whitespace()
            .any(|e| Some(e) == c.strip_prefix('+'))
    })
}

/// A task cgroup on v2.
#[derive(Clone, Debug)]
pub struct V2Cgroup {
    h: Handle,
}

impl V2Cgroup {
    pub(super) fn new(h: Handle) -> V2Cgroup {
        V2Cgroup { h }
    }

    /// The cgroup's directory.
    pub fn dir(&self) -> PathBuf {
        self.h.root.join(&self.h.rel)
    }

    /// Makes each level of the cgroup's path, enabling our controllers for it in its
    /// parent's `cgroup.subtree_control` first (cgroups-rs ignores errors doing so).
    fn create_dirs(&self) -> Result<bool, CgroupError> {
        let value = self
            .h
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
        let mut level = self.h.root.clone();
        let mut existed = false;
        for part in self.h.rel.split('/').filter(|p| !p.is_empty()) {
            if !value.is_empty() {
                enable(&level.join("cgroup.subtree_control"), &value)?;
            }
            level = level.join(part);
            existed = make_dir(&level)?;
        }
        Ok(existed)
    }

    fn create_limits(&self, limits: &Limits) -> Result<(), CgroupError> {
        if limits.cpu > 0.0 {
            let cpu = self.h.cpu_controller()?;
            let dir = cpu.path();
            let quota = cpu_quota_us(limits.cpu);
            let file = dir.join("cpu.max");
            let wrote = format!("{quota} {CPU_PERIOD_US}");
            let read = write_limit(&file, &wrote)?;
            check(&file, &wrote, &read, read == wrote)?;
        }
        if limits.memory_bytes > 0 {
            let mem = self.h.memory_controller()?;
            self.h.set_memory(mem, "memory.max", limits.memory_bytes)?;
            // The whole task dies on an OOM kill, not one process of it (cgroups-rs
            // has no knob for it).
            let file = mem.path().join("memory.oom.group");
            let read = write_limit(&file, "1")?;
            check(&file, "1", &read, read == "1")?;
        }
        if limits.pids > 0 {
            let pids = self.h.pids_controller()?;
            self.h.set_pids(pids, limits.pids)?;
        }
        Ok(())
    }

    /// `cgroup.procs` when cgroups-rs has no controller to read it through (it lists
    /// v2 processes via the first controller only).
    fn procs_fallback(&self) -> Result<Vec<i32>, CgroupError> {
        let file = self.dir().join("cgroup.procs");
        match fs::read_to_string(&file) {
            Ok(text) => Ok(parse_pids(&text)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(source) => Err(CgroupError::Read { path: file, source }),
        }
    }
}

impl TaskCgroup for V2Cgroup {
    fn create(&self, limits: &Limits) -> Result<bool, CgroupError> {
        let fresh = create_fresh(self, || self.create_dirs())?;
        self.create_limits(limits)?;
        Ok(fresh)
    }

    fn procs_files(&self) -> Vec<PathBuf> {
        vec![self.dir().join("cgroup.procs")]
    }

    fn pids(&self) -> Result<Vec<i32>, CgroupError> {
        // Every controller has the same directory: the first one's `cgroup.procs`
        // (a missing cgroup reads as empty).
        let controllers = self.h.controllers();
        let Some(first) = controllers.first() else {
            return self.procs_fallback();
        };
        let mut all: Vec<i32> = first
            .procs()
            .into_iter()
            .filter_map(|p| i32::try_from(p.pid).ok())
            .filter(|&p| p > 0)
            .collect();
        all.sort_unstable();
        all.dedup();
        Ok(all)
    }

    fn is_empty(&self) -> Result<bool, CgroupError> {
        Ok(self.pids()?.is_empty())
    }

    fn oom_kills(&self) -> Result<u64, CgroupError> {
        read_oom_kills(self.dir().join("memory.events"))
    }

    fn kill_all(&self) -> Result<(), CgroupError> {
        // Nothing left (the usual case once a task ended): nothing to fence or kill.
        // An empty cgroup cannot gain a process but by a migration, which only this
        // executor does.
        if self.pids()?.is_empty() {
            return Ok(());
        }
        match self.h.cg.kill() {
            Ok(()) => {}
            // No cgroup.kill (kernel before 5.14, or no cgroup): the loop below.
            Err(e) if matches!(e.kind(), ErrorKind::InvalidOperation) => {}
            Err(source) => {
                return Err(CgroupError::Lib {
                    what: "write cgroup.kill in",
                    path: self.dir(),
                    source,
                })
            }
        }
        self.h.kill_until_empty(|| self.pids(), self.dir())
    }

    fn remove(&self) -> Result<(), CgroupError> {
        remove_dirs(self, || vec![self.dir()], || self.h.cg.delete(), self.dir())
    }

    fn describe(&self) -> String {
        format!("cgroup v2 {}", self.dir().display())
    }
}

#[cfg(test)]
mod tests {
    use crate::cgroup::*;
    use std::fs;

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

    #[test]
    fn detect_tells_v2_from_v1_from_nothing() {
        let (tmp, _) = fake_v2(true);
        assert_eq!(FsCgroup::detect(tmp.path()), Some(Version::V2));
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(FsCgroup::detect(empty.path()), None);
    }

    #[test]
    fn a_level_that_refuses_the_write_is_fine_only_when_it_enables_them_already() {
        assert!(super::lists_all(
            "cpu io memory pids\n",
            "+cpu +memory +pids"
        ));
        assert!(!super::lists_all("cpu io pids\n", "+cpu +memory +pids"));
        assert!(!super::lists_all("", "+pids"));
        // A level that can be neither written nor read is an error naming it.
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("cgroup.subtree_control");
        fs::create_dir(&file).unwrap();
        let err = super::enable(&file, "+cpu").unwrap_err();
        assert!(err.to_string().contains("cgroup.subtree_control"), "{err}");
    }

    #[test]
    fn a_nested_parent_makes_each_level_and_enables_the_controllers_at_each() {
        let (tmp, _) = fake_v2(true);
        let root = tmp.path();
        fs::create_dir_all(root.join("system.slice/a.service/drover")).unwrap();
        for level in [
            "system.slice",
            "system.slice/a.service",
            "system.slice/a.service/drover",
        ] {
            fs::write(root.join(level).join("cgroup.subtree_control"), "").unwrap();
        }
        let cg = FsCgroup::new(Version::V2, root, "/system.slice/a.service/drover", "t1");
        assert_eq!(cg.dir(""), root.join("system.slice/a.service/drover/t1"));
        cg.create(&Limits {
            cpu: 0.0,
            memory_bytes: 0,
            pids: 0,
        })
        .unwrap();
        assert!(root.join("system.slice/a.service/drover/t1").is_dir());
        for level in [
            "system.slice",
            "system.slice/a.service",
            "system.slice/a.service/drover",
        ] {
            let enabled =
                fs::read_to_string(root.join(level).join("cgroup.subtree_control")).unwrap();
            assert!(enabled.contains("+pids"), "{level}: {enabled}");
        }
    }

    #[test]
    fn parents_are_relative_paths_of_plain_components() {
        for ok in [
            "drover",
            "system.slice/drover-agent.service/drover",
            "/a/b/",
            "user@0.service/x",
        ] {
            check_parent(ok).unwrap();
        }
        for bad in ["", "/", "a/../b", "a//b", "./a", "a/\n"] {
            assert!(check_parent(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn remove_of_a_missing_cgroup_succeeds() {
        let (tmp, _) = fake_v2(true);
        let cg = FsCgroup::new(Version::V2, tmp.path(), "drover", "gone");
        cg.remove().unwrap();
    }
}
