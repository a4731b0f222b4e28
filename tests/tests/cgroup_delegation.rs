//! Black-box: task cgroups inside the agent's delegated cgroup.
//!
//! cgroup v1 (this CI host): the agent starts inside a cgroup the test made in each
//! of the cpu, memory and pids hierarchies (what systemd's `Delegate=yes` gives a
//! unit), with `cgroup_delegate = "on"`; a task's cgroup is then
//! `<controller>/<that cgroup>/drover/<task>` with its limits applied, nothing is
//! made at the root; an agent restart re-adopts the executor and keeps the cgroup;
//! an executor killed is cleaned up there (its task killed, its cgroup removed).
//!
//! cgroup v2: this host's `/sys/fs/cgroup/unified` is a cgroup2 mount without
//! controllers, so the v2 preparation is tested there for what can be true: the
//! processes of the delegated cgroup move into its `agent` leaf, the delegated
//! cgroup is left empty (so controllers could be enabled for its children), the
//! task parent derived afterwards (as a restarted agent does) is the same, and a
//! second preparation changes nothing. Enabling controllers cannot be seen there.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use drover_agent::cgroup::{own_cgroup, plan, prepare_v2, Delegate, Facts, Version};
use drover_common::state::TaskState;
use drover_tests::{running_as_root, service_job, Cluster, ClusterConfig, WAIT};

const ROOT: &str = "/sys/fs/cgroup";

/// Cgroups the test made (one directory per hierarchy); on drop, whatever still
/// runs in them is killed and they are removed, deepest first.
struct TestCgroups(Vec<PathBuf>);

impl TestCgroups {
    fn make(dirs: Vec<PathBuf>) -> TestCgroups {
        for d in &dirs {
            std::fs::create_dir_all(d).expect("a test cgroup");
        }
        TestCgroups(dirs)
    }
}

impl Drop for TestCgroups {
    fn drop(&mut self) {
        for top in &self.0 {
            let mut dirs = Vec::new();
            collect_dirs(top, &mut dirs);
            // Deepest first.
            dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
            let deadline = Instant::now() + Duration::from_secs(10);
            for d in dirs {
                loop {
                    for pid in pids_in(&d) {
                        let _ = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(pid as i32),
                            nix::sys::signal::Signal::SIGKILL,
                        );
                    }
                    if std::fs::remove_dir(&d).is_ok() || !d.exists() || Instant::now() > deadline {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
    }
}

fn collect_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    out.push(dir.to_path_buf());
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                collect_dirs(&e.path(), out);
            }
        }
    }
}

fn pids_in(dir: &Path) -> Vec<u32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .to_string()
}

fn v1_host(test: &str) -> bool {
    let v1 = Path::new(ROOT)
        .join("memory/memory.limit_in_bytes")
        .is_file()
        && Path::new(ROOT).join("pids").is_dir()
        && !Path::new(ROOT).join("cgroup.controllers").exists();
    if !v1 {
        eprintln!("{test}: skipped: {ROOT} is not a cgroup v1 layout");
    }
    v1
}

#[test]
fn v1_task_cgroups_go_inside_the_agents_cgroup_with_limits_and_survive_an_agent_restart() {
    let test = "v1_task_cgroups_go_inside_the_agents_cgroup";
    if !running_as_root(test) || !v1_host(test) {
        return;
    }
    let name = format!("drover-deleg-{}", std::process::id());
    let controllers = ["cpu", "memory", "pids"];
    let delegated = TestCgroups::make(
        controllers
            .iter()
            .map(|c| Path::new(ROOT).join(c).join(&name))
            .collect(),
    );
    let mut config = ClusterConfig::agents(1);
    config.agent_config = "cgroup_delegate = \"on\"\n".into();
    config.agent_cgroup = delegated.0.iter().map(|d| d.join("cgroup.procs")).collect();
    let mut cluster = Cluster::start(config).expect("a cluster");
    let agent = cluster.agent_pids()[0];
    for d in &delegated.0 {
        assert!(
            pids_in(d).contains(&agent),
            "the agent runs in {}",
            d.display()
        );
    }

    cluster
        .api
        .create_job(&service_job("web", 1))
        .expect("the service created");
    let view = cluster
        .wait_for_all("www-data/test/web", TaskState::Running)
        .expect("the service running");
    let task = view.instances[0]
        .current
        .as_ref()
        .map(|t| t.task_id.clone())
        .expect("a task");
    let dir = |c: &str| {
        Path::new(ROOT)
            .join(c)
            .join(&name)
            .join("drover")
            .join(&task)
    };
    // Limits of service_job: cpu 0.1, ram 64MiB; pids: the default 1024.
    assert_eq!(read(&dir("cpu").join("cpu.cfs_quota_us")), "10000");
    assert_eq!(
        read(&dir("memory").join("memory.limit_in_bytes")),
        "67108864"
    );
    assert_eq!(read(&dir("pids").join("pids.max")), "1024");
    let task_pids = pids_in(&dir("pids"));
    assert!(
        !task_pids.is_empty(),
        "the task's processes are in its cgroup"
    );
    for c in controllers {
        assert_eq!(pids_in(&dir(c)), task_pids, "{c}: the same processes");
        assert!(
            !Path::new(ROOT).join(c).join("drover").join(&task).exists(),
            "{c}: nothing made at the hierarchy's root"
        );
    }

    // A crash and a restart: the executor is re-adopted and the cgroup kept.
    cluster.kill_agent(0);
    cluster
        .start_agent_again(0)
        .expect("the agent started again");
    cluster
        .wait_for("the agent to come back", WAIT, |c| {
            c.agents().ok()?.iter().any(|a| a.reachable).then_some(())
        })
        .expect("the agent back");
    std::thread::sleep(Duration::from_secs(1));
    let view = cluster.api.job("www-data/test/web").expect("the job");
    let now = view.instances[0].current.as_ref().expect("a task");
    assert_eq!(now.task_id, task, "the same task");
    assert_eq!(now.state, TaskState::Running);
    assert_eq!(pids_in(&dir("pids")), task_pids, "the same task processes");
    assert_eq!(
        read(&dir("memory").join("memory.limit_in_bytes")),
        "67108864"
    );

    // The executor dies: the restarted agent cleans up inside the delegated cgroup.
    let status = std::fs::read(
        cluster
            .sandbox_of(&task)
            .expect("a sandbox")
            .join("status.json"),
    )
    .expect("the executor's checkpoint");
    let executor = drover_common::wire::checkpointed_status(&status)
        .expect("a checkpoint")
        .executor_pid;
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(executor as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    cluster
        .wait_for("the lost task's cgroup to be removed", WAIT, |_| {
            controllers.iter().all(|c| !dir(c).exists()).then_some(())
        })
        .expect("the cgroup removed");
    for pid in task_pids {
        assert!(
            !drover_tests::process_alive(pid),
            "task process {pid} was killed"
        );
    }
    drop(cluster);
    drop(delegated);
}

/// The unified mount of a hybrid host, if it is a cgroup2 mount we can write.
fn unified(test: &str) -> Option<PathBuf> {
    let root = Path::new(ROOT).join("unified");
    if !root.join("cgroup.procs").is_file() {
        eprintln!("{test}: skipped: no cgroup2 mount at {}", root.display());
        return None;
    }
    Some(root)
}

/// The test process's own `0::` cgroup.
fn own_v2() -> String {
    let text = std::fs::read_to_string("/proc/self/cgroup").expect("/proc/self/cgroup");
    own_cgroup(&text, Version::V2).expect("a 0:: line")
}

#[test]
fn v2_the_delegated_cgroup_is_emptied_into_the_agent_leaf_and_the_parent_is_stable() {
    let test = "v2_the_delegated_cgroup_is_emptied_into_the_agent_leaf";
    if !running_as_root(test) {
        return;
    }
    let Some(root) = unified(test) else {
        return;
    };
    let name = format!("drover-deleg-v2-{}", std::process::id());
    let cgroups = TestCgroups::make(vec![root.join(&name)]);
    let base = &cgroups.0[0];
    let before = own_v2();
    // This test process and a child of it are in the "delegated" cgroup.
    let mut child = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .expect("sleep");
    std::fs::write(base.join("cgroup.procs"), child.id().to_string()).expect("move the child");
    std::fs::write(base.join("cgroup.procs"), "0").expect("move this process");
    let started_in = own_v2();
    assert_eq!(started_in, format!("/{name}"));
    let facts = |text: &str| {
        plan(&Facts {
            delegate: Delegate::On,
            parent: None,
            version: Some(Version::V2),
            proc_self_cgroup: text,
            under_systemd: false,
        })
        .expect("a plan")
    };
    let first = facts(&format!("0::{started_in}\n"));
    assert_eq!(first.prepare_v2.as_deref(), Some(name.as_str()));
    assert_eq!(
        first.parent.as_deref(),
        Some(format!("{name}/drover").as_str())
    );

    let enabled = prepare_v2(&root, &name).expect("prepared");
    assert!(enabled.is_empty(), "this mount offers no controllers");
    assert!(
        pids_in(base).is_empty(),
        "nothing is left in the delegated cgroup"
    );
    let leaf = pids_in(&base.join("agent"));
    assert!(
        leaf.contains(&std::process::id()),
        "this process moved: {leaf:?}"
    );
    assert!(leaf.contains(&child.id()), "the child moved: {leaf:?}");
    assert_eq!(own_v2(), format!("/{name}/agent"));

    // A restarted agent starts in the leaf: the same parent, nothing to move.
    let again = facts(&format!("0::{}\n", own_v2()));
    assert_eq!(again.parent, first.parent);
    prepare_v2(&root, &name).expect("prepared again");
    assert_eq!(pids_in(&base.join("agent")).len(), leaf.len());
    // Task cgroups are made beside the leaf.
    std::fs::create_dir_all(base.join("drover/t1")).expect("a task cgroup");

    let _ = child.kill();
    let _ = child.wait();
    std::fs::write(
        root.join(before.trim_start_matches('/'))
            .join("cgroup.procs"),
        "0",
    )
    .expect("this process back where it was");
    drop(cgroups);
}
