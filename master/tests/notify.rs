//! systemd's notification protocol against a socket this test binds (NOTIFY_SOCKET):
//! the master binary says READY=1 only once it serves, pings the watchdog at the
//! pace WATCHDOG_USEC asks, and stops pinging when its timer loop cannot go through
//! the core (in process: a lock held by the test) or the process is stopped.

#![allow(clippy::unwrap_used)] // unwrap is how tests fail

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

/// A notify socket bound in `dir`.
fn bind(dir: &Path) -> (UnixDatagram, std::path::PathBuf) {
    let path = dir.join("notify.sock");
    let sock = UnixDatagram::bind(&path).unwrap();
    (sock, path)
}

/// The next datagram within `within`, if any.
fn recv(sock: &UnixDatagram, within: Duration) -> Option<String> {
    sock.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 4096];
    match sock.recv(&mut buf) {
        Ok(n) => Some(String::from_utf8_lossy(&buf[..n]).into_owned()),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            None
        }
        Err(e) => panic!("recv: {e}"),
    }
}

/// Waits (up to `within`) for a datagram holding `field` (e.g. "WATCHDOG=1").
fn wait_for(sock: &UnixDatagram, field: &str, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "no {field} within {within:?}");
        if let Some(msg) = recv(sock, left) {
            if msg.lines().any(|l| l == field) {
                return msg;
            }
        }
    }
}

/// Drops what is queued, then asserts nothing arrives for `quiet`.
fn assert_silent(sock: &UnixDatagram, quiet: Duration) {
    while recv(sock, Duration::from_millis(1)).is_some() {}
    if let Some(msg) = recv(sock, quiet) {
        panic!("expected no notification for {quiet:?}, got {msg:?}");
    }
}

#[test]
fn the_binary_is_ready_only_once_it_serves_and_a_stopped_one_stops_pinging() {
    let dir = tempfile::tempdir().unwrap();
    let (sock, path) = bind(dir.path());
    let data = dir.path().join("data");
    let mut child = Command::new(env!("CARGO_BIN_EXE_drover-master"))
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .env("NOTIFY_SOCKET", &path)
        .env("WATCHDOG_USEC", "400000")
        .env_remove("WATCHDOG_PID")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    // The checks in a closure: the master is killed whether they pass or not.
    let checks = std::panic::catch_unwind(|| {
        let ready = wait_for(&sock, "READY=1", Duration::from_secs(60));
        assert!(ready.contains("STATUS=serving on 127.0.0.1:"), "{ready}");
        // READY means serving: the address is written and the port answers.
        let addr = std::fs::read_to_string(data.join("master.addr")).unwrap();
        std::net::TcpStream::connect(addr.trim()).unwrap();

        let ping = wait_for(&sock, "WATCHDOG=1", Duration::from_secs(10));
        assert!(ping.contains("agents reachable"), "{ping}");
        wait_for(&sock, "WATCHDOG=1", Duration::from_secs(10));

        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        assert_silent(&sock, Duration::from_millis(1500));
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
        wait_for(&sock, "WATCHDOG=1", Duration::from_secs(10));
    });
    let _ = child.kill();
    let _ = child.wait();
    if let Err(panic) = checks {
        std::panic::resume_unwind(panic);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_stops_while_the_timer_loop_cannot_reach_the_core() {
    let dir = tempfile::tempdir().unwrap();
    let (sock, path) = bind(dir.path());
    // This test alone in this binary sets these; the other starts its own process.
    std::env::set_var("NOTIFY_SOCKET", &path);
    std::env::set_var("WATCHDOG_USEC", "200000");
    std::env::remove_var("WATCHDOG_PID");
    let data = dir.path().join("data");
    let handle = drover_master::start(common::config(&data)).await.unwrap();
    let sock = std::sync::Arc::new(sock);

    let s = sock.clone();
    tokio::task::spawn_blocking(move || {
        wait_for(&s, "WATCHDOG=1", Duration::from_secs(10));
        wait_for(&s, "WATCHDOG=1", Duration::from_secs(10));
    })
    .await
    .unwrap();

    // Hold the core's lock: the loop's next ping must wait for it.
    let (release, released) = std::sync::mpsc::channel::<()>();
    let (held_tx, held) = std::sync::mpsc::channel::<()>();
    let master = handle.master.clone();
    let holder = std::thread::spawn(move || {
        master.read(|_| {
            held_tx.send(()).unwrap();
            released.recv().unwrap();
        })
    });
    held.recv().unwrap();
    let s = sock.clone();
    tokio::task::spawn_blocking(move || {
        std::thread::sleep(Duration::from_millis(100));
        assert_silent(&s, Duration::from_millis(1500));
    })
    .await
    .unwrap();

    release.send(()).unwrap();
    holder.join().unwrap();
    let s = sock.clone();
    tokio::task::spawn_blocking(move || wait_for(&s, "WATCHDOG=1", Duration::from_secs(10)))
        .await
        .unwrap();
    handle.stop().await.unwrap();
}
