//! The `drover-agent` binary: exit 64 naming the field on bad configuration, the
//! bound address written to `<data_dir>/agent.addr`, a clean exit on SIGTERM.

#![allow(clippy::unwrap_used)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_drover-agent");

/// The agent under test, killed if the test fails before it stops.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

#[test]
fn bad_flags_and_config_exit_64_naming_the_field() {
    let out = Command::new(BIN).args(["--ram", "lots"]).output().unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("`ram`"));

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("agent.toml");
    let with_config = |text: &str| {
        std::fs::write(&file, text).unwrap();
        Command::new(BIN)
            .arg("--config")
            .arg(&file)
            .output()
            .unwrap()
    };
    let out = with_config("lease = \"soon\"\n");
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("`lease`"));

    let out = with_config("mastr = \"x\"\n");
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("mastr"));
}

#[test]
fn listening_on_port_0_writes_the_bound_address_and_sigterm_stops_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // Nothing listens on port 9 of 127.0.0.1: the agent keeps retrying to register.
    let child = Command::new(BIN)
        .args(["--master", "http://127.0.0.1:9", "--listen", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(&data)
        .arg("--sandbox-root")
        .arg(dir.path().join("sandboxes"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut child = KillOnDrop(child);
    let child = &mut child.0;
    let deadline = Instant::now() + Duration::from_secs(30);
    let addr = loop {
        if let Ok(a) = std::fs::read_to_string(data.join("agent.addr")) {
            break a;
        }
        assert!(Instant::now() < deadline, "agent.addr never written");
        std::thread::sleep(Duration::from_millis(20));
    };
    let port: u16 = addr.trim().rsplit(':').next().unwrap().parse().unwrap();
    assert_ne!(port, 0);
    let mut stream = std::net::TcpStream::connect(addr.trim()).unwrap();
    use std::io::{Read, Write};
    stream
        .write_all(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.ends_with("ok"), "{reply}");

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("agent did not stop on SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
    assert!(std::fs::read_to_string(data.join("agent-id")).is_ok());
}
