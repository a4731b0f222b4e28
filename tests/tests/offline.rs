//! Black-box checks that need no cluster: `drover job validate` on the examples and
//! on a spec with five mistakes, the CLI's advice when no master answers, and that
//! drover-common stays free of tokio, hyper and nix.

use std::process::Command;

use drover_tests::{describe, drover, workspace_root};

#[test]
fn every_example_validates() {
    let examples = workspace_root().join("examples");
    let mut files: Vec<String> = std::fs::read_dir(&examples)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml" | "toml" | "json")
            )
        })
        .map(|p| p.display().to_string())
        .collect();
    files.sort();
    assert!(
        files.len() >= 3,
        "expected the examples in {}",
        examples.display()
    );
    let mut args = vec!["job", "validate"];
    args.extend(files.iter().map(String::as_str));
    let output = drover(None, &args).unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    for file in &files {
        assert!(
            stdout.contains(&format!("{file}: OK")),
            "{}",
            describe(&output)
        );
    }
}

#[test]
fn a_spec_with_five_mistakes_gets_five_errors_with_field_paths() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broken.yaml");
    std::fs::write(
        &path,
        r#"
role: www-data
environment: prod
name: hello
instances: 0
task:
  processes:
    - name: setup
      cmdline: ./install.sh
    - name: server
      cmdline: ./serve --port {{ports.htp}}
      daemn: true
  resources:
    cpu: 0.5
    ram: 128MiB
    disk: 1GiB
    ports: [http]
health_check:
  port: admin
constraints:
  rack: "limit:0"
"#,
    )
    .unwrap();
    let output = drover(None, &["job", "validate", path.to_str().unwrap()]).unwrap();
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 5, "{}", describe(&output));
    let prefix = format!("{}: ", path.display());
    for field in [
        "instances",
        "task.processes[1].cmdline",
        "task.processes[1].daemn",
        "health_check.port",
        "constraints.rack",
    ] {
        let wanted = format!("{prefix}{field}: ");
        assert!(
            lines.iter().any(|l| l.starts_with(&wanted)),
            "no error for {field}\n{}",
            describe(&output)
        );
    }
    assert!(
        stderr.contains("daemon"),
        "suggests the closest name: {stderr}"
    );
}

#[test]
fn cli_says_how_to_reach_the_master_when_none_answers() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let output = drover(Some(&url), &["job", "list"]).unwrap();
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!(
            "cannot reach the master at {url}: is it running? set --master or DROVER_MASTER"
        )),
        "{}",
        describe(&output)
    );
}

#[test]
fn drover_common_depends_on_no_tokio_hyper_or_nix() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let output = Command::new(cargo)
        .args(["tree", "-p", "drover-common", "--prefix", "none"])
        .current_dir(workspace_root())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    let tree = String::from_utf8_lossy(&output.stdout);
    for line in tree.lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        assert!(
            !matches!(name, "tokio" | "hyper" | "nix"),
            "drover-common depends on {name}:\n{tree}"
        );
    }
    assert!(tree.contains("drover-common"), "{tree}");
}
