//! The log server: bytes from an offset with the total size, clear 404s, and no way
//! out of a sandbox (names, `..`, symlinks).

#![allow(clippy::unwrap_used)]

use std::fs;
use std::os::unix::fs::symlink;

use drover_agent::logs::{resolve_log_path, router, LogError, LOG_SIZE_HEADER};
use drover_agent::sandbox::Layout;

fn sandbox_with_log() -> (tempfile::TempDir, Layout) {
    let dir = tempfile::tempdir().unwrap();
    let layout = Layout::new(dir.path().join("sandboxes"));
    fs::create_dir_all(layout.drover_dir("t1").join("logs")).unwrap();
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
        let err = resolve_log_path(&layout, task, process, "stdout").unwrap_err();
        assert!(
            matches!(err, LogError::InvalidName { .. }),
            "{task} {process}: {err}"
        );
    }
    assert!(matches!(
        resolve_log_path(&layout, "t1", "web", "passwd"),
        Err(LogError::InvalidStream(_))
    ));
}

#[test]
fn a_symlinked_log_escaping_the_sandbox_is_refused() {
    let (dir, layout) = sandbox_with_log();
    let secret = dir.path().join("secret");
    fs::write(&secret, b"secret").unwrap();
    symlink(&secret, layout.log_file("t1", "evil", "stdout")).unwrap();
    assert!(matches!(
        resolve_log_path(&layout, "t1", "evil", "stdout"),
        Err(LogError::OutsideSandbox { .. })
    ));
}

#[test]
fn a_symlinked_sandbox_escaping_the_root_is_refused() {
    let (dir, layout) = sandbox_with_log();
    let outside = dir.path().join("outside");
    fs::create_dir_all(outside.join(".drover/logs")).unwrap();
    fs::write(outside.join(".drover/logs/web.stdout"), b"x").unwrap();
    symlink(&outside, layout.sandbox("t2")).unwrap();
    assert!(matches!(
        resolve_log_path(&layout, "t2", "web", "stdout"),
        Err(LogError::OutsideSandbox { .. })
    ));
}

#[test]
fn unknown_tasks_and_processes_are_not_found() {
    let (_dir, layout) = sandbox_with_log();
    assert!(matches!(
        resolve_log_path(&layout, "nope", "web", "stdout"),
        Err(LogError::UnknownTask(_))
    ));
    assert!(matches!(
        resolve_log_path(&layout, "t1", "db", "stdout"),
        Err(LogError::UnknownLog { .. })
    ));
    assert!(resolve_log_path(&layout, "t1", "web", "stdout").is_ok());
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
