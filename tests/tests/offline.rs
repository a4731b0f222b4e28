//! Black-box checks that need no cluster: `drover job validate` on the examples and
//! on an invalid spec, the CLI's advice when no master answers, `drover open`, and
//! that drover-common stays free of tokio, hyper and nix.

use std::process::Command;

use drover_tests::{bin, describe, drover, workspace_root};

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

/// `drover job validate` refuses the schedule the master refuses (one validator).
#[test]
fn validate_refuses_a_cron_schedule_the_master_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cron.yaml");
    let text = std::fs::read_to_string(workspace_root().join("examples/cron.yaml"))
        .unwrap()
        .replace(
            "cron_schedule: \"0 3 * * *\"",
            "cron_schedule: \"61 * * * *\"",
        );
    std::fs::write(&path, text).unwrap();
    let output = drover(None, &["job", "validate", path.to_str().unwrap()]).unwrap();
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert!(
        String::from_utf8_lossy(&output.stderr)
            .contains("cron_schedule: the minute field `61` is not valid"),
        "{}",
        describe(&output)
    );
}

/// Which errors a spec gets is the parser's business (common/tests/parse.rs has the
/// spec with five mistakes); here only what the binary adds: exit status 1 and one
/// stderr line per error, each starting with the file's path and the field.
#[test]
fn an_invalid_spec_exits_1_with_one_line_per_error_prefixed_by_the_file() {
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
    - name: server
      cmdline: ./serve
      daemn: true
  resources:
    cpu: 0.5
    ram: 128MiB
    disk: 1GiB
"#,
    )
    .unwrap();
    let output = drover(None, &["job", "validate", path.to_str().unwrap()]).unwrap();
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 2, "{}", describe(&output));
    let prefix = format!("{}: ", path.display());
    for field in ["instances", "task.processes[0].daemn"] {
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
fn a_missing_spec_file_is_an_error_line() {
    let output = drover(
        Some("http://127.0.0.1:9"),
        &["job", "create", "/nonexistent/nope.yaml"],
    )
    .unwrap();
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.starts_with("error: /nonexistent/nope.yaml: cannot read the file"),
        "{}",
        describe(&output)
    );
}

#[test]
fn the_cli_names_the_default_master_it_falls_back_to() {
    // Whatever listens on 7070 (maybe nothing, maybe someone's `drover dev`), the CLI
    // says which master it talks to.
    let output = drover(None, &["job", "list"]).unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.starts_with("note: talking to the default master http://127.0.0.1:7070"),
        "{}",
        describe(&output)
    );
    let output = drover(Some("http://127.0.0.1:9"), &["job", "list"]).unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("note:"), "{}", describe(&output));
}

#[test]
fn completions_are_printed_for_bash_zsh_and_fish() {
    for shell in ["bash", "zsh", "fish"] {
        let output = drover(None, &["completions", shell]).unwrap();
        assert!(output.status.success(), "{}", describe(&output));
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            stdout.contains("completions"),
            "{shell}: {}",
            describe(&output)
        );
        assert!(output.stderr.is_empty(), "{shell}: {}", describe(&output));
    }
    let output = drover(None, &["completions", "tcsh"]).unwrap();
    assert_eq!(output.status.code(), Some(2), "{}", describe(&output));
}

#[test]
fn drover_open_hands_the_page_to_the_browser_or_prints_it() {
    let dir = tempfile::tempdir().unwrap();
    let got = dir.path().join("opened");
    // A "browser" that writes what it was asked to open.
    let browser = dir.path().join("browser");
    // (Written whole, then renamed: the test never reads half of it.)
    std::fs::write(
        &browser,
        format!(
            "#!/bin/sh\necho \"$@\" > {got}.part && /bin/mv {got}.part {got}\n",
            got = got.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &browser,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let open = |args: &[&str], browser: Option<&std::path::Path>| {
        let mut command = Command::new(bin("drover").unwrap());
        command
            .args(["--master", "https://m.example:7070/", "open"])
            .args(args)
            .env("PATH", dir.path());
        match browser {
            Some(b) => command.env("BROWSER", b),
            None => command.env_remove("BROWSER"),
        };
        command.output().unwrap()
    };
    let url = "https://m.example:7070/ui/jobs/www-data/devel/hello";
    let output = open(&["www-data/devel/hello"], Some(&browser));
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), url);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !got.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(std::fs::read_to_string(&got).unwrap().trim(), url);
    // No browser (no $BROWSER, no xdg-open on PATH): the address only, and why.
    let output = open(&["www-data"], None);
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        "https://m.example:7070/ui/roles/www-data"
    );
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("no browser"),
        "{}",
        describe(&output)
    );
    // A key of two parts is refused with the forms.
    let output = open(&["www-data/devel"], None);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("error: KEY `www-data/devel`"),
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
