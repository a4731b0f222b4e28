//! The `drover-master` binary: exit 64 naming the field on bad config, master.addr
//! after binding port 0, and a clean exit 0 on SIGTERM with the store flushed.

#![allow(clippy::unwrap_used)] // unwrap is how tests fail

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn master() -> Command {
    Command::new(env!("CARGO_BIN_EXE_drover-master"))
}

#[test]
fn bad_config_exits_64_and_names_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let out = master()
        .args([
            "--data-dir",
            dir.path().to_str().unwrap(),
            "--agent-timeout",
            "soon",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("agent_timeout"), "{err}");

    let file = dir.path().join("master.toml");
    std::fs::write(
        &file,
        "listen = \"127.0.0.1:0\"\nflaping_threshold = \"1m\"\n",
    )
    .unwrap();
    let out = master()
        .args(["--config", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("flaping_threshold"));
}

#[test]
fn the_master_writes_its_address_serves_and_stops_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("master.toml");
    std::fs::write(
        &file,
        "agent_timeout = \"5s\"\nheartbeat_interval = \"1s\"\n",
    )
    .unwrap();
    let child = master()
        .args([
            "--config",
            file.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            dir.path().to_str().unwrap(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut child = KillOnDrop(child);
    let addr_file = dir.path().join("master.addr");
    let deadline = Instant::now() + Duration::from_secs(30);
    let addr = loop {
        if let Ok(a) = std::fs::read_to_string(&addr_file) {
            break a.trim().to_string();
        }
        assert!(Instant::now() < deadline, "no master.addr after 30 s");
        std::thread::sleep(Duration::from_millis(20));
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let body = rt.block_on(async {
        reqwest::get(format!("http://{addr}/health"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    });
    assert_eq!(body, "ok");
    let status = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    let code = loop {
        if let Some(s) = child.0.try_wait().unwrap() {
            break s.code();
        }
        assert!(
            Instant::now() < deadline,
            "master did not stop within 30 s of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(code, Some(0));
    assert!(dir.path().join("drover.db").exists());
}
