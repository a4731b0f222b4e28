//! The leftover check that ends `scripts/test.sh` (scripts/leftovers.sh), on a
//! checkout, /tmp and cgroup tree of its own: it fails naming a process started from
//! the checkout's target/, a test cluster's task whose directory is deleted, a
//! leftover /tmp/drover-* directory and task cgroup, kills the processes it named,
//! and leaves alone what was there before the run and what another checkout marked.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use drover_tests::{describe, workspace_root};

/// Runs `scripts/leftovers.sh MODE FILE` looking only at the given places.
fn leftovers(mode: &str, file: &Path, root: &Path, tmp: &Path, cgroup: &Path) -> Output {
    Command::new(workspace_root().join("scripts/leftovers.sh"))
        .arg(mode)
        .arg(file)
        .env("LEFTOVERS_ROOT", root)
        .env("LEFTOVERS_TMP", tmp)
        .env("LEFTOVERS_CGROUP", cgroup)
        .env("LEFTOVERS_NETNS", tmp.join("no-netns"))
        .env("LEFTOVERS_LINKS", "no-such-link-prefix")
        .stdin(Stdio::null())
        .output()
        .expect("run scripts/leftovers.sh")
}

/// `program 600` working in `cwd`.
fn sleeper(program: &Path, cwd: &Path) -> Child {
    Command::new(program)
        .arg("600")
        .current_dir(cwd)
        .stdin(Stdio::null())
        .spawn()
        .expect("start a sleeper")
}

/// Whether `child` was killed by a signal within 10 s.
fn killed(child: &mut Child) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return status.code().is_none();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// Kills the sleepers still running when the test ends, pass or fail.
struct Sleepers(Vec<Child>);

impl Drop for Sleepers {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[test]
fn the_leftover_check_names_what_a_run_left_and_nothing_else() {
    let checkout = tempfile::tempdir().unwrap();
    let checkout_root = std::fs::canonicalize(checkout.path()).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let cgroup = tempfile::tempdir().unwrap();
    let baseline = tmp.path().join("baseline");
    let bin_dir = checkout_root.join("target/debug");
    std::fs::create_dir_all(&bin_dir).unwrap();
    let daemon = bin_dir.join("drover-sleeper");
    let sleep = ["/usr/bin/sleep", "/bin/sleep"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.is_file())
        .expect("sleep(1)");
    std::fs::copy(sleep, &daemon).unwrap();
    std::fs::set_permissions(&daemon, std::fs::Permissions::from_mode(0o755)).unwrap();

    // Before the run: the user's own cluster, working in its directory.
    let own = tmp.path().join("drover-dev-mine");
    std::fs::create_dir_all(&own).unwrap();
    let mut sleepers = Sleepers(vec![sleeper(sleep, &own)]);
    let run = |mode: &str| leftovers(mode, &baseline, &checkout_root, tmp.path(), cgroup.path());
    let output = run("baseline");
    assert!(output.status.success(), "{}", describe(&output));
    let output = run("check");
    assert!(
        output.status.success(),
        "a clean run: {}",
        describe(&output)
    );

    // The run: a daemon from target/, a task whose cluster directory was deleted, a
    // cluster directory and a task cgroup left, another checkout's task; and a task
    // of the user's cluster started meanwhile.
    sleepers.0.push(sleeper(&daemon, Path::new("/")));
    let daemon_pid = sleepers.0[1].id();
    let cluster = tmp.path().join("drover-ha-gone");
    std::fs::create_dir_all(cluster.join("sandbox")).unwrap();
    sleepers.0.push(sleeper(sleep, &cluster.join("sandbox")));
    let task_pid = sleepers.0[2].id();
    std::fs::remove_dir_all(&cluster).unwrap();
    let left = tmp.path().join("drover-bb-left");
    std::fs::create_dir_all(&left).unwrap();
    std::fs::write(
        left.join(".drover-checkout"),
        checkout_root.display().to_string(),
    )
    .unwrap();
    let theirs = tmp.path().join("drover-bb-theirs");
    std::fs::create_dir_all(&theirs).unwrap();
    std::fs::write(theirs.join(".drover-checkout"), "/another/checkout").unwrap();
    sleepers.0.push(sleeper(sleep, &theirs));
    let their_pid = sleepers.0[3].id();
    sleepers.0.push(sleeper(sleep, &own));
    let task_cgroup = cgroup.path().join("pids/drover/task-1");
    std::fs::create_dir_all(&task_cgroup).unwrap();
    std::fs::write(task_cgroup.join("cgroup.procs"), "").unwrap();

    let output = run("check");
    let text = describe(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!(
            "process {daemon_pid}, runs target/debug/drover-sleeper: {}",
            daemon.display()
        )),
        "names the daemon from target/: {text}"
    );
    assert!(
        stderr.contains(&format!(
            "process {task_pid}, a test cluster's task (working in {} (deleted))",
            cluster.join("sandbox").display()
        )),
        "names the orphaned task: {text}"
    );
    assert!(
        stderr.contains(&format!("directory {}", left.display())),
        "{text}"
    );
    assert!(
        stderr.contains(&format!("cgroup {}", task_cgroup.display())),
        "{text}"
    );
    assert!(
        !stderr.contains(&their_pid.to_string()) && !stderr.contains("drover-bb-theirs"),
        "another checkout's cluster is not this run's: {text}"
    );
    assert!(!stderr.contains("drover-dev-mine"), "{text}");
    assert!(stderr.contains("killed the processes above"), "{text}");
    // The processes it named are gone; the others run on.
    assert!(killed(&mut sleepers.0[1]), "the daemon was killed");
    assert!(killed(&mut sleepers.0[2]), "the task was killed");
    for k in [0, 3, 4] {
        assert!(
            matches!(sleepers.0[k].try_wait(), Ok(None)),
            "sleeper {k} was left alone"
        );
    }

    // Once the rest is removed, the check passes again.
    std::fs::remove_dir_all(&left).unwrap();
    std::fs::remove_dir_all(cgroup.path().join("pids")).unwrap();
    let output = run("check");
    assert!(output.status.success(), "{}", describe(&output));
}
