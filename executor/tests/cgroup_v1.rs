//! The cgroup layer against the host's real cgroups (v1, and v2 where a cgroup2 is
//! mounted): limits are applied and read back, a process started through the executor's
//! pre_exec lands in the cgroup, and kill_all leaves nothing behind.

// Test helpers panic on failure on purpose.
#![allow(clippy::unwrap_used)]

mod support;

use std::path::Path;
use std::time::Duration;

use drover_executor::cgroup::{FsCgroup, Limits, TaskCgroup, Version};
use drover_executor::sandbox::TaskUser;
use drover_executor::spawn::{check_command, Isolation, TaskChild};

/// The test's own user (root), without switching.
fn root_user() -> TaskUser {
    TaskUser {
        name: "root".into(),
        uid: 0,
        gid: 0,
        groups: vec![0],
        switch: false,
    }
}

/// Starts `cmdline` (through `sh -c`, as root) in the cgroup, working in a new temp dir.
fn start_in(cg: &FsCgroup, cmdline: &str) -> (tempfile::TempDir, TaskChild) {
    let iso = Isolation::new(&cg.procs_files(), &root_user());
    let dir = tempfile::tempdir().unwrap();
    let child = check_command(cmdline, dir.path(), &[], &iso)
        .spawn()
        .unwrap();
    (dir, child)
}

#[tokio::test]
async fn real_cgroup_gets_limits_members_and_is_emptied_and_removed() {
    if !support::can_isolate("real_cgroup") {
        return;
    }
    let root = Path::new("/sys/fs/cgroup");
    let version = FsCgroup::detect(root).unwrap();
    let id = support::task_id("cgtest");
    let cg = FsCgroup::new(version, root, "drover", &id);
    cg.create(&Limits {
        cpu: 0.25,
        memory_bytes: 48 << 20,
        pids: 32,
    })
    .unwrap();
    match version {
        Version::V1 => {
            let read = |f: &str| {
                std::fs::read_to_string(cg.dir(f.split('.').next().unwrap()).join(f)).unwrap()
            };
            assert_eq!(read("cpu.cfs_quota_us").trim(), "25000");
            assert_eq!(
                read("memory.limit_in_bytes").trim(),
                (48u64 << 20).to_string()
            );
            assert_eq!(read("pids.max").trim(), "32");
        }
        Version::V2 => {
            let read = |f: &str| std::fs::read_to_string(cg.dir("").join(f)).unwrap();
            assert_eq!(read("pids.max").trim(), "32");
        }
    }
    // A parent that leaves a setsid'd, double-forked grandchild behind.
    let (_dir, mut child) = start_in(&cg, "setsid sh -c 'sleep 1000 &' ; exec sleep 1000");
    let pid = child.id().unwrap() as i32;
    support::eventually(Duration::from_secs(10), "3 processes in the cgroup", || {
        cg.pids().unwrap().len() >= 2
    });
    assert!(cg.pids().unwrap().contains(&pid));
    // The executor (this test process) is not in the task's cgroup.
    assert!(!cg.pids().unwrap().contains(&(std::process::id() as i32)));
    let members = cg.pids().unwrap();
    cg.kill_all().unwrap();
    assert!(cg.pids().unwrap().is_empty());
    let _ = child.wait().await;
    cg.remove().unwrap();
    assert!(!cg.dir("pids").exists());
    for p in members {
        support::eventually(Duration::from_secs(5), "members to die", || {
            !support::alive(p)
        });
    }
    // Idempotent.
    cg.kill_all().unwrap();
    cg.remove().unwrap();
}

/// An executor restarted for the same task finds the cgroup its predecessor left
/// (with a process in it): `create` kills that, replaces the cgroup and says it is new.
#[tokio::test]
async fn a_leftover_cgroup_of_the_same_task_is_emptied_and_created_anew() {
    if !support::can_isolate("leftover_cgroup") {
        return;
    }
    let root = Path::new("/sys/fs/cgroup");
    let version = FsCgroup::detect(root).unwrap();
    let id = support::task_id("cgleft");
    let limits = Limits {
        cpu: 0.0,
        memory_bytes: 0,
        pids: 16,
    };
    let first = FsCgroup::new(version, root, "drover", &id);
    assert!(first.create(&limits).unwrap(), "a new cgroup");
    let (_dir, mut child) = start_in(&first, "exec sleep 1000");
    let pid = child.id().unwrap() as i32;
    assert_eq!(first.pids().unwrap(), vec![pid]);
    let second = FsCgroup::new(version, root, "drover", &id);
    assert!(
        second.create(&Limits { pids: 8, ..limits }).unwrap(),
        "the leftover was replaced"
    );
    let _ = child.wait().await;
    assert!(second.pids().unwrap().is_empty());
    let pids_max = std::fs::read_to_string(second.dir("pids").join("pids.max")).unwrap();
    assert_eq!(pids_max.trim(), "8");
    second.remove().unwrap();
    assert!(!second.dir("pids").exists());
}

/// The v2 code path against a real cgroup2 mount: on hosts (and CI) with v1 for the
/// controllers, the empty cgroup2 at /sys/fs/cgroup/unified. Limits the tree cannot
/// give are refused by name; without limits, a process joins, `cgroup.kill` empties
/// the cgroup and it is removed.
#[tokio::test]
async fn real_v2_tree_without_controllers_refuses_limits_but_joins_kills_and_removes() {
    if !support::can_isolate("real_v2_tree") {
        return;
    }
    let root = Path::new("/sys/fs/cgroup/unified");
    let root = if FsCgroup::detect(Path::new("/sys/fs/cgroup")) == Some(Version::V2) {
        Path::new("/sys/fs/cgroup")
    } else if FsCgroup::detect(root) == Some(Version::V2) {
        root
    } else {
        eprintln!("SKIPPED real_v2_tree: no cgroup2 mount");
        return;
    };
    let listed = std::fs::read_to_string(root.join("cgroup.controllers")).unwrap();
    let id = support::task_id("cgv2");
    let cg = FsCgroup::new(Version::V2, root, "drover", &id);
    if !listed.split_whitespace().any(|c| c == "memory") {
        let err = cg
            .create(&Limits {
                cpu: 0.0,
                memory_bytes: 16 << 20,
                pids: 0,
            })
            .unwrap_err();
        assert!(err.to_string().contains("memory controller"), "{err}");
    }
    cg.create(&Limits {
        cpu: 0.0,
        memory_bytes: 0,
        pids: 0,
    })
    .unwrap();
    let (_dir, mut child) = start_in(&cg, "exec sleep 1000");
    let pid = child.id().unwrap() as i32;
    assert_eq!(cg.pids().unwrap(), vec![pid]);
    cg.kill_all().unwrap();
    assert!(cg.pids().unwrap().is_empty());
    let _ = child.wait().await;
    cg.remove().unwrap();
    assert!(!cg.dir("").exists());
    cg.kill_all().unwrap();
    cg.remove().unwrap();
}

/// On cgroup v2 a child is born in the task cgroup (`clone3` with
/// `CLONE_INTO_CGROUP`): with no `cgroup.procs` to write, it is there all the same.
#[tokio::test]
async fn on_v2_a_child_is_born_in_the_cgroup_without_writing_cgroup_procs() {
    if !support::can_isolate("born_in_v2") {
        return;
    }
    let root = if FsCgroup::detect(Path::new("/sys/fs/cgroup")) == Some(Version::V2) {
        Path::new("/sys/fs/cgroup")
    } else if FsCgroup::detect(Path::new("/sys/fs/cgroup/unified")) == Some(Version::V2) {
        Path::new("/sys/fs/cgroup/unified")
    } else {
        eprintln!("SKIPPED born_in_v2: no cgroup2 mount");
        return;
    };
    let cg = FsCgroup::new(Version::V2, root, "drover", &support::task_id("born"));
    cg.create(&Limits {
        cpu: 0.0,
        memory_bytes: 0,
        pids: 0,
    })
    .unwrap();
    let iso = Isolation::default().into_cgroup_dir(&cg.dir("")).unwrap();
    assert!(iso.procs_files.is_empty());
    let dir = tempfile::tempdir().unwrap();
    let mut child = check_command("exec sleep 1000", dir.path(), &[], &iso)
        .spawn()
        .unwrap();
    let pid = child.id().unwrap() as i32;
    assert_eq!(cg.pids().unwrap(), vec![pid]);
    cg.kill_all().unwrap();
    let _ = child.wait().await;
    cg.remove().unwrap();
}

/// A v1 cgroup on this host, with the given pids limit, or None (skipped) elsewhere.
fn real_v1(name: &str, pids: u64) -> Option<FsCgroup> {
    if !support::can_isolate(name) {
        return None;
    }
    let root = Path::new("/sys/fs/cgroup");
    if FsCgroup::detect(root) != Some(Version::V1) {
        eprintln!("SKIPPED {name}: the host's cgroups are not v1");
        return None;
    }
    let cg = FsCgroup::new(Version::V1, root, "drover", &support::task_id(name));
    cg.create(&Limits {
        cpu: 0.0,
        memory_bytes: 0,
        pids,
    })
    .unwrap();
    Some(cg)
}

/// Without a freezer, a kill stops forks with `pids.max` 0: a fork loop cannot outrun
/// it, and the task's limit is back afterwards.
#[tokio::test]
async fn a_fork_loop_is_killed_without_a_freezer_and_the_pids_limit_comes_back() {
    let Some(cg) = real_v1("fork_loop", 64) else {
        return;
    };
    let (_dir, mut child) = start_in(&cg, "while :; do sleep 1000 & done");
    support::eventually(
        Duration::from_secs(10),
        "the loop to fill the cgroup",
        || cg.pids().unwrap().len() >= 32,
    );
    cg.kill_all().unwrap();
    assert!(cg.pids().unwrap().is_empty());
    assert!(cg.is_empty().unwrap());
    let pids_max = std::fs::read_to_string(cg.dir("pids").join("pids.max")).unwrap();
    assert_eq!(pids_max.trim(), "64");
    let _ = child.wait().await;
    cg.remove().unwrap();
    assert!(!cg.dir("memory").exists());
}

/// A process that left the pids hierarchy (only root can) escapes the emptiness check,
/// which reads that hierarchy alone; `remove` finds it (rmdir fails busy), kills it and
/// removes every directory.
#[tokio::test]
async fn remove_kills_a_process_that_left_the_pids_hierarchy() {
    let Some(cg) = real_v1("left_pids", 16) else {
        return;
    };
    let (_dir, mut child) = start_in(&cg, "exec sleep 1000");
    let pid = child.id().unwrap() as i32;
    let parent_procs = cg.dir("pids").parent().unwrap().join("cgroup.procs");
    std::fs::write(&parent_procs, pid.to_string()).unwrap();
    assert!(cg.is_empty().unwrap(), "not in the pids hierarchy any more");
    assert_eq!(cg.pids().unwrap(), vec![pid], "still in cpu and memory");
    cg.remove().unwrap();
    let _ = child.wait().await;
    assert!(!support::alive(pid));
    for c in ["cpu", "memory", "pids"] {
        assert!(!cg.dir(c).exists(), "{c}");
    }
}
