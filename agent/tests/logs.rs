//! The log server: bytes from an offset with the total size, clear 404s, and no way
//! out of a task directory (names, `..`, symlinks, FIFOs, a swap race).

#![allow(clippy::unwrap_used)]

use std::fs;
use std::os::unix::fs::symlink;

use drover_agent::logs::{open_log, router, LogError, LogSource, LOG_SIZE_HEADER};
use drover_common::layout::Layout;

fn sandbox_with_log() -> (tempfile::TempDir, Layout) {
    let dir = tempfile::tempdir().unwrap();
    let layout = Layout::new(dir.path().join("sandboxes"));
    fs::create_dir_all(layout.task("t1").logs()).unwrap();
    fs::write(layout.log_file("t1", "web", "stdout"), b"hello world\n").unwrap();
    (dir, layout)
}

#[test]
fn names_that_could_climb_out_are_rejected() {
    let (_dir, layout) = sandbox_with_log();
    for (task, process) in [
        ("..", "web"),
        ("t1", ".."),
        ("t1", "../../x"),
        ("a/b", "web"),
    ] {
        let err = open_log(&layout, task, process, "stdout").unwrap_err();
        assert!(
            matches!(err, LogError::InvalidName { .. }),
            "{task} {process}: {err}"
        );
    }
    assert!(matches!(
        open_log(&layout, "t1", "web", "passwd"),
        Err(LogError::InvalidStream(_))
    ));
}

#[test]
fn a_symlinked_log_fifo_or_directory_is_refused() {
    let (dir, layout) = sandbox_with_log();
    let secret = dir.path().join("secret");
    fs::write(&secret, b"secret").unwrap();
    symlink(&secret, layout.log_file("t1", "evil", "stdout")).unwrap();
    assert!(std::process::Command::new("mkfifo")
        .arg(layout.log_file("t1", "fifo", "stdout"))
        .status()
        .unwrap()
        .success());
    fs::create_dir(layout.log_file("t1", "dir", "stdout")).unwrap();
    for process in ["evil", "fifo", "dir"] {
        assert!(
            matches!(
                open_log(&layout, "t1", process, "stdout"),
                Err(LogError::NotRegularFile { .. })
            ),
            "{process}"
        );
    }
}

#[test]
fn a_symlinked_task_dir_or_logs_dir_is_not_followed() {
    let (dir, layout) = sandbox_with_log();
    let outside = dir.path().join("outside");
    fs::create_dir_all(outside.join("logs")).unwrap();
    fs::write(outside.join("logs/web.stdout"), b"x").unwrap();
    symlink(&outside, layout.task_dir("t2")).unwrap();
    assert!(matches!(
        open_log(&layout, "t2", "web", "stdout"),
        Err(LogError::UnknownTask(_))
    ));
    fs::create_dir(layout.task_dir("t3")).unwrap();
    symlink(outside.join("logs"), layout.task("t3").logs()).unwrap();
    assert!(matches!(
        open_log(&layout, "t3", "web", "stdout"),
        Err(LogError::NotRegularFile { .. })
    ));
}

#[test]
fn a_log_swapped_with_a_symlink_in_a_loop_never_serves_the_target() {
    use std::io::Read;
    let (dir, layout) = sandbox_with_log();
    let secret = dir.path().join("secret");
    fs::write(&secret, b"SECRET").unwrap();
    let log = layout.log_file("t1", "web", "stdout");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let swapper = {
        let (stop, log, secret) = (stop.clone(), log.clone(), secret.clone());
        let (file, link) = (log.with_extension("f"), log.with_extension("l"));
        std::thread::spawn(move || {
            let mut swaps = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = fs::write(&file, b"log line\n");
                let _ = fs::rename(&file, &log);
                let _ = symlink(&secret, &link);
                let _ = fs::rename(&link, &log);
                swaps += 1;
            }
            swaps
        })
    };
    // At least 3000 opens, and on until the regular file was served once: on a loaded
    // machine the swapper can hold the symlink in place through thousands of opens.
    let mut served = 0;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut opens = 0;
    while opens < 3000 || (served == 0 && std::time::Instant::now() < deadline) {
        opens += 1;
        if let Ok(LogSource::File(mut f)) = open_log(&layout, "t1", "web", "stdout") {
            let mut text = String::new();
            f.read_to_string(&mut text).unwrap();
            assert!(!text.contains("SECRET"), "served the symlink's target");
            served += 1;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(swapper.join().unwrap() > 0);
    assert!(served > 0, "the regular file was served some of the time");
}

#[test]
fn unknown_tasks_and_processes_are_not_found() {
    let (_dir, layout) = sandbox_with_log();
    assert!(matches!(
        open_log(&layout, "nope", "web", "stdout"),
        Err(LogError::UnknownTask(_))
    ));
    assert!(matches!(
        open_log(&layout, "t1", "db", "stdout"),
        Err(LogError::UnknownLog { .. })
    ));
    assert!(matches!(
        open_log(&layout, "t1", "web", "stdout"),
        Ok(LogSource::File(_))
    ));
}

#[tokio::test]
async fn logs_are_served_from_an_offset_with_their_size() {
    let (_dir, layout) = sandbox_with_log();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, router(layout)).await });
    let client = reqwest::Client::new();
    let base = format!("http://{addr}");

    let health = client.get(format!("{base}/health")).send().await.unwrap();
    assert_eq!(health.text().await.unwrap(), "ok");

    let resp = client
        .get(format!("{base}/v1/tasks/t1/logs/web/stdout?offset=6"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()[LOG_SIZE_HEADER], "12");
    assert_eq!(resp.text().await.unwrap(), "world\n");

    let past_end = client
        .get(format!("{base}/v1/tasks/t1/logs/web/stdout?offset=100"))
        .send()
        .await
        .unwrap();
    assert_eq!(past_end.status(), 200);
    assert_eq!(past_end.text().await.unwrap(), "");

    let missing = client
        .get(format!("{base}/v1/tasks/t1/logs/db/stderr"))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    let body: serde_json::Value = missing.json().await.unwrap();
    assert_eq!(body["error"]["code"], "not_found");
    assert_eq!(body["error"]["field"], "process");

    let traversal = client
        .get(format!("{base}/v1/tasks/t1/logs/..%2F..%2Fetc/stdout"))
        .send()
        .await
        .unwrap();
    assert_eq!(traversal.status(), 400);
    server.abort();
}
