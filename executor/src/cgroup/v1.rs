//! cgroup v1: one hierarchy per controller, `<root>/<controller>/<parent>/<task_id>`
//! for each of cpu, memory and pids (no freezer: a kill fences forks with
//! `pids.max` 0).

use std::path::{Path, PathBuf};

use cgroups_rs::cpu::CpuController;
use cgroups_rs::memory::MemController;
use cgroups_rs::pid::PidController;
use cgroups_rs::{Controller, Subsystem};

use super::files::{check, cpu_quota_us, make_dir, write_limit};
use super::{
    create_fresh, own_cgroup, read_oom_kills, remove_dirs, CgroupError, Handle, Limits, TaskCgroup,
    CPU_PERIOD_US, V1_CONTROLLERS,
};

/// The cgroups-rs subsystems of the v1 hierarchies at `root`: each of cpu, memory and
/// pids whose `<root>/<controller>` directory exists.
pub(super) fn subsystems(root: &Path) -> Vec<Subsystem> {
    V1_CONTROLLERS
        .iter()
        .map(|c| (c, root.join(c)))
        .filter(|(_, dir)| dir.is_dir())
        .filter_map(|(c, dir)| match *c {
            "cpu" => Some(Subsystem::Cpu(CpuController::new(dir, false))),
            "memory" => Some(Subsystem::Mem(MemController::new(dir, false))),
            "pids" => Some(Subsystem::Pid(PidController::new(dir, false))),
            _ => None,
        })
        .collect()
}

/// The executor's own `cgroup.procs` in the pids hierarchy (for the prewarm).
pub(super) fn own_procs(root: &Path, own: &str) -> Option<PathBuf> {
    let rel = own_cgroup(own, |controllers| {
        controllers.split(',').any(|c| c == "pids")
    })?;
    Some(root.join("pids").join(rel).join("cgroup.procs"))
}

/// A task cgroup on v1.
#[derive(Clone, Debug)]
pub struct V1Cgroup {
    h: Handle,
}

impl V1Cgroup {
    pub(super) fn new(h: Handle) -> V1Cgroup {
        V1Cgroup { h }
    }

    /// The cgroup's directory in the hierarchy of `controller`.
    pub fn dir(&self, controller: &str) -> PathBuf {
        self.h.root.join(controller).join(&self.h.rel)
    }

    /// One directory per controller present.
    fn dirs(&self) -> Vec<PathBuf> {
        self.h
            .controllers()
            .iter()
            .map(|c| c.path().to_path_buf())
            .collect()
    }

    fn create_dirs(&self) -> Result<bool, CgroupError> {
        let mut existed = false;
        for dir in self.dirs() {
            existed |= make_dir(&dir)?;
        }
        Ok(existed)
    }

    /// Writes the limits and reads each back. A new cgroup's CFS period is the kernel's
    /// default, [`CPU_PERIOD_US`], so only a leftover's (`fresh` false) is written:
    /// one cgroupfs open less per task.
    fn create_limits(&self, limits: &Limits, fresh: bool) -> Result<(), CgroupError> {
        if limits.cpu > 0.0 {
            let cpu = self.h.cpu_controller()?;
            let dir = cpu.path();
            let quota = cpu_quota_us(limits.cpu);
            let period = (!fresh).then_some(("cpu.cfs_period_us", CPU_PERIOD_US));
            for (name, want) in period.into_iter().chain([("cpu.cfs_quota_us", quota)]) {
                let file = dir.join(name);
                let read = write_limit(&file, &want.to_string())?;
                check(&file, want, &read, read == want.to_string())?;
            }
        }
        if limits.memory_bytes > 0 {
            let mem = self.h.memory_controller()?;
            self.h
                .set_memory(mem, "memory.limit_in_bytes", limits.memory_bytes)?;
        }
        if limits.pids > 0 {
            let pids = self.h.pids_controller()?;
            self.h.set_pids(pids, limits.pids)?;
        }
        Ok(())
    }
}

impl TaskCgroup for V1Cgroup {
    fn create(&self, limits: &Limits) -> Result<bool, CgroupError> {
        let fresh = create_fresh(self, || self.create_dirs())?;
        self.create_limits(limits, fresh)?;
        Ok(fresh)
    }

    fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs()
            .into_iter()
            .map(|d| d.join("cgroup.procs"))
            .collect()
    }

    fn pids(&self) -> Result<Vec<i32>, CgroupError> {
        // cgroups-rs reads `cgroup.procs` of each controller; a missing cgroup reads
        // as empty.
        let mut all: Vec<i32> = self
            .h
            .controllers()
            .iter()
            .flat_map(|c| c.procs())
            .filter_map(|p| i32::try_from(p.pid).ok())
            .filter(|&p| p > 0)
            .collect();
        all.sort_unstable();
        all.dedup();
        Ok(all)
    }

    fn is_empty(&self) -> Result<bool, CgroupError> {
        match self.h.pids_controller() {
            // One hierarchy is enough: the task's processes are in all of ours, and
            // only root can move a process out of one (`cgroup.procs` is root's).
            // Should a task allowed to run as root have done so, `remove` finds the
            // process (rmdir fails busy) and kills it then.
            Ok(pids) => Ok(pids.procs().is_empty()),
            Err(_) => Ok(self.pids()?.is_empty()),
        }
    }

    fn oom_kills(&self) -> Result<u64, CgroupError> {
        read_oom_kills(self.dir("memory").join("memory.oom_control"))
    }

    fn kill_all(&self) -> Result<(), CgroupError> {
        // Nothing left (the usual case once a task ended): nothing to fence or kill.
        // An empty cgroup cannot gain a process but by a migration, which only this
        // executor does.
        if self.pids()?.is_empty() {
            return Ok(());
        }
        self.h.kill_until_empty(|| self.pids(), self.dir("pids"))
    }

    fn remove(&self) -> Result<(), CgroupError> {
        // cgroups-rs removes each of our controllers' directories, with a few retries
        // of its own.
        remove_dirs(
            self,
            || self.dirs(),
            || self.h.controllers().iter().try_for_each(|c| c.delete()),
            self.dir(""),
        )
    }

    fn describe(&self) -> String {
        format!("cgroup v1 {} in {}", self.h.rel, V1_CONTROLLERS.join(","))
    }
}

#[cfg(test)]
mod tests {
    use crate::cgroup::*;
    use std::fs;

    #[test]
    fn v1_oom_control_is_parsed() {
        assert_eq!(
            parse_oom_kills("oom_kill_disable 0\nunder_oom 0\noom_kill 7\n"),
            7
        );
        assert_eq!(parse_oom_kills("oom_kill_disable 0\n"), 0);
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
}
