//! Black-box: `drover dev`, the README's main command, brings up a master and agents,
//! runs examples/hello_world.yaml until RUNNING, and cleans everything up.

use std::process::{Command, Stdio};

use drover_tests::reap::SweepOnDrop;
use drover_tests::{bin, describe, processes_under, running_as_root, workspace_root};

#[test]
fn drover_dev_runs_hello_world_until_running_and_cleans_up() {
    if !running_as_root("drover dev test") {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    // Whatever happens below, nothing it started outlives the test.
    let _sweep = SweepOnDrop::new(data.path());
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
        .env("XDG_CONFIG_HOME", data.path().join("config"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = describe(&output);
    assert!(output.status.success(), "{text}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("Drover dev cluster is up"), "{text}");
    assert!(stdout.contains("API:      https://127.0.0.1:"), "{text}");
    assert!(
        stdout.contains("DNS:      127.0.0.1:"),
        "drover dev serves DNS: {text}"
    );
    assert!(
        stdout.contains("RUNNING"),
        "prints the task's state changes: {text}"
    );
    assert!(stdout.contains("all 1 instance(s) RUNNING"), "{text}");
    // The suggested command names this very binary (it is not on PATH here), and the
    // web page is announced.
    let binary = bin("drover").unwrap();
    assert!(
        stdout.contains(&format!("{} job list", binary.display())),
        "{text}"
    );
    assert!(stdout.contains("web page: https://127.0.0.1:"), "{text}");
    // Every task ended through its executor: none is left for the sweep (whose
    // checkpoint reader once counted every sandbox).
    assert!(!stdout.contains("left behind"), "{text}");
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

#[test]
fn drover_dev_stops_everything_on_ctrl_c() {
    if !running_as_root("drover dev Ctrl-C test") {
        return;
    }
    use std::io::BufRead as _;
    let data = tempfile::tempdir().unwrap();
    // Whatever happens below, nothing it started outlives the test.
    let _sweep = SweepOnDrop::new(data.path());
    let config = tempfile::tempdir().unwrap();
    let mut child = Command::new(bin("drover").unwrap())
        .args(["dev", "--port", "0", "--data-dir"])
        .arg(data.path())
        .arg("--job")
        .arg(workspace_root().join("examples/hello_world.yaml"))
        .env_remove("DROVER_MASTER")
        .env("XDG_CONFIG_HOME", config.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (lines_tx, lines_rx) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    while !seen
        .iter()
        .any(|l: &String| l.contains("all 1 instance(s) RUNNING"))
    {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match lines_rx.recv_timeout(left) {
            Ok(line) => seen.push(line),
            Err(_) => {
                let _ = child.kill();
                panic!("hello world not RUNNING in time:\n{}", seen.join("\n"));
            }
        }
    }
    // The task's process runs in its sandbox until Ctrl-C.
    assert!(
        !processes_under(data.path()).is_empty(),
        "{}",
        seen.join("\n")
    );
    // Another shell finds the cluster without settings (the dev context) ...
    let dev_file = config.path().join("drover/dev.toml");
    assert!(dev_file.is_file(), "{}", seen.join("\n"));
    let cli = |args: &[&str]| {
        Command::new(bin("drover").unwrap())
            .args(args)
            .env("XDG_CONFIG_HOME", config.path())
            .env_remove("DROVER_MASTER")
            .env_remove("DROVER_CA")
            .env_remove("DROVER_TOKEN")
            .env_remove("DROVER_TOKEN_FILE")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let list = cli(&["job", "list"]);
    assert!(list.status.success(), "{}", describe(&list));
    assert!(
        String::from_utf8_lossy(&list.stdout).contains("www-data/devel/hello"),
        "{}",
        describe(&list)
    );
    assert!(
        String::from_utf8_lossy(&list.stderr).contains("talking to the `drover dev` cluster"),
        "{}",
        describe(&list)
    );
    // ... and an http:// address of its TLS port says what to use instead.
    let api = seen
        .iter()
        .find_map(|l| l.trim().strip_prefix("API:"))
        .map(|a| a.trim().to_string())
        .unwrap();
    let plain = api.replacen("https://", "http://", 1);
    let refused = cli(&["--master", &plain, "job", "list"]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("speaks TLS") && stderr.contains(&format!("--master {api} --ca")),
        "{}",
        describe(&refused)
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = child.wait().unwrap();
    reader.join().unwrap();
    seen.extend(lines_rx.try_iter());
    let text = seen.join("\n");
    assert!(status.success(), "{status:?}\n{text}");
    assert!(text.contains("KILLED"), "prints the task's end: {text}");
    assert_eq!(processes_under(data.path()), Vec::<u32>::new(), "{text}");
    assert!(!dev_file.exists(), "the dev context is removed at exit");
}
