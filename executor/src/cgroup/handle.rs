//! The cgroups-rs handle of a task cgroup and what both layouts do through it: pick
//! and require our controllers, write the memory and pids limits, and the kill loop
//! with forks fenced off.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cgroups_rs::cpu::CpuController;
use cgroups_rs::memory::MemController;
use cgroups_rs::pid::PidController;
use cgroups_rs::{Cgroup, Controller, Subsystem};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::files::{above_i64_max, check, write_file, write_limit};
use super::{load, CgroupError, Version};

/// The cgroups-rs handle of a task cgroup and what both layouts do through it.
#[derive(Debug)]
pub struct Handle {
    version: Version,
    pub(super) root: PathBuf,
    /// `<parent>/<task_id>`.
    pub(super) rel: String,
    pub(super) cg: Cgroup,
}

impl Clone for Handle {
    fn clone(&self) -> Handle {
        Handle::new(self.version, &self.root, self.rel.clone())
    }
}

impl Handle {
    pub(super) fn new(version: Version, root: &Path, rel: String) -> Handle {
        Handle {
            version,
            root: root.to_path_buf(),
            cg: load(version, root, &rel),
            rel,
        }
    }

    /// Our controllers (cpu, memory, pids) among the cgroup's subsystems.
    ///
    /// Everything in cgroups-rs that goes through `Subsystem::to_controller`
    /// (`Cgroup::controller_of`, `procs`, v1 `create`, `load_with_specified_controllers`)
    /// instantiates the `dyn Controller` vtables of all fourteen controller types, which
    /// links regex (hugetlb) and 1.2 MiB more code into the executor. So we pick the
    /// four types we use here and call their `Controller` methods.
    pub(super) fn controllers(&self) -> Vec<&dyn Controller> {
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

    pub(super) fn cpu_controller(&self) -> Result<&CpuController, CgroupError> {
        self.require("cpu", |s| match s {
            Subsystem::Cpu(c) => Some(c),
            _ => None,
        })
    }

    pub(super) fn memory_controller(&self) -> Result<&MemController, CgroupError> {
        self.require("memory", |s| match s {
            Subsystem::Mem(c) => Some(c),
            _ => None,
        })
    }

    pub(super) fn pids_controller(&self) -> Result<&PidController, CgroupError> {
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
    /// `memory.limit_in_bytes` (v1) or `memory.max` (v2), written and read back as
    /// plain files (cgroups-rs reads it only within `memory_stat()`, which reads a
    /// dozen other files and, on v2, panics when one is missing).
    pub(super) fn set_memory(
        &self,
        mem: &MemController,
        name: &str,
        want: u64,
    ) -> Result<(), CgroupError> {
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

    pub(super) fn set_pids(&self, pids: &PidController, want: u64) -> Result<(), CgroupError> {
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

    /// SIGKILLs every process of the cgroup (`pids`) until none is left, with forks
    /// fenced off (`pids.max` 0) meanwhile; gives up after 10 s, naming `path`.
    pub(super) fn kill_until_empty(
        &self,
        pids: impl Fn() -> Result<Vec<i32>, CgroupError>,
        path: PathBuf,
    ) -> Result<(), CgroupError> {
        // No process in the cgroup can fork while the loop kills, so a fork bomb
        // cannot race it (v1 has no cgroup.kill). This needs no freezer hierarchy:
        // a freeze and thaw also flip a kernel static key each, which patches kernel
        // text with an IPI to every CPU.
        let fence = self.fence_forks();
        let started = Instant::now();
        let limit = Duration::from_secs(10);
        let result = loop {
            // An error ends the loop too, so that the limit is written back below.
            let pids = match pids() {
                Ok(pids) => pids,
                Err(e) => break Err(e),
            };
            if pids.is_empty() {
                break Ok(());
            }
            if started.elapsed() > limit {
                break Err(CgroupError::NotEmpty {
                    path,
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
}
