//! Black-box: `drover dev`, the README's main command, brings up a master and agents,
//! runs examples/hello_world.yaml until RUNNING, and cleans everything up.

use std::process::{Command, Stdio};

use drover_tests::{bin, describe, processes_under, running_as_root, workspace_root};

#[test]
fn drover_dev_runs_hello_world_until_running_and_cleans_up() {
    if !running_as_root("drover dev test") {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let output = Command::new(bin("drover").unwrap())
        .args([
            "dev",
            "--agents",
            "2",
            "--port",
            "0",
            "--exit-when-running",
            "--timeout",
            "90s",
        ])
        .arg("--job")
        .arg(workspace_root().join("examples/hello_world.yaml"))
        .arg("--data-dir")
        .arg(data.path())
        .env_remove("DROVER_MASTER")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = describe(&output);
    assert!(output.status.success(), "{text}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("Drover dev cluster is up"), "{text}");
    assert!(stdout.contains("API:      http://127.0.0.1:"), "{text}");
    assert!(
        stdout.contains("RUNNING"),
        "prints the task's state changes: {text}"
    );
    assert!(stdout.contains("all 1 instance(s) RUNNING"), "{text}");
    // Every task process is gone, and no daemon is left.
    assert_eq!(processes_under(data.path()), Vec::<u32>::new(), "{text}");
    assert!(data.path().join("logs/master.log").is_file());
}

#[test]
fn drover_dev_names_missing_binaries_and_how_to_build_them() {
    let dir = tempfile::tempdir().unwrap();
    let lonely = dir.path().join("drover");
    std::fs::copy(bin("drover").unwrap(), &lonely).unwrap();
    let output = Command::new(&lonely)
        .args(["dev", "--port", "0"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("drover-master"), "{}", describe(&output));
    assert!(
        stderr.contains("cargo build --workspace --bins"),
        "{}",
        describe(&output)
    );
}
