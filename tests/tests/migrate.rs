//! `drover-master migrate`: a single master's SQLite state moved into etcd is what
//! a master on etcd then serves (its tokens, revocations and audit records
//! included), moved back it loads the same, a non-empty target is refused unless
//! forced, and no migration writes under a running master.

use std::process::Command;
use std::time::Duration;

use drover_master::store::{SqliteStore, Store};
use drover_tests::etcd::{free_ports, EtcdCluster};
use drover_tests::{bin, command_job, describe, spawn_master, AdminApi, Proc, TEST_MASTER_CONFIG};

fn migrate(args: &[&str]) -> anyhow::Result<std::process::Output> {
    Ok(Command::new(bin("drover-master")?)
        .arg("migrate")
        .args(args)
        .output()?)
}

#[test]
fn sqlite_state_moves_into_etcd_and_back() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("master.toml"), TEST_MASTER_CONFIG)?;
    std::fs::create_dir_all(dir.path().join("logs"))?;
    let etcd = EtcdCluster::start(dir.path(), 1)?;
    // A single master on SQLite with two jobs (no agent: their tasks stay PENDING).
    let (mut master, addr) = spawn_master(dir.path(), "127.0.0.1:0")?;
    let mut api = AdminApi::new()?;
    api.url = format!("http://{}", addr.trim_start_matches("http://"));
    api.use_admin_token(&dir.path().join("master"))?;
    api.create_job(&command_job("one", 2, true, "sleep 60"))?;
    api.create_job(&command_job("two", 1, false, "true"))?;
    let revoked = api.create_token(&serde_json::json!({"kind": "operator"}))?;
    let revoked_id = revoked.split('_').nth(1).unwrap_or_default().to_string();
    let (status, body) = api.post(
        &format!("/v1/tokens/{revoked_id}/revoke"),
        &serde_json::json!({}),
    )?;
    assert_eq!(status, 200, "{body}");
    master.stop(Duration::from_secs(10));

    let sqlite = format!("sqlite:{}", dir.path().join("master").display());
    let out = migrate(&["--from", &sqlite, "--to", &etcd.store_url()])?;
    assert!(out.status.success(), "{}", describe(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("migrated 2 jobs, 3 tasks"), "{text}");
    // Again into the same etcd: refused, it is not empty.
    let out = migrate(&["--from", &sqlite, "--to", &etcd.store_url()])?;
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--force"),
        "{}",
        describe(&out)
    );

    // The audit records are in etcd.
    let audit = etcd.client()?.list("/drover-audit/")?;
    assert!(
        audit
            .iter()
            .filter(|(_, line, _)| line.contains("\"path\":\"/v1/jobs\""))
            .count()
            == 2,
        "{audit:?}"
    );

    // A master on etcd with a new data dir serves the jobs to the migrated
    // admin token (no new bootstrap token) and refuses the revoked one.
    let port = free_ports(1)?[0];
    let mut command = Command::new(bin("drover-master")?);
    command
        .arg("--config")
        .arg(dir.path().join("master.toml"))
        .arg("--store")
        .arg(etcd.store_url())
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--data-dir")
        .arg(dir.path().join("master-etcd"));
    let mut on_etcd = Proc::spawn(
        "master on etcd",
        command,
        &dir.path().join("logs/etcd-master.log"),
    )?;
    api.url = format!("http://127.0.0.1:{port}");
    let deadline = std::time::Instant::now() + drover_tests::WAIT;
    let keys = loop {
        if let Ok(keys) = api.job_keys() {
            break keys;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the master on etcd did not serve: {}",
            on_etcd.log_tail()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(keys, vec!["www-data/test/one", "www-data/test/two"]);
    assert!(!dir.path().join("master-etcd/admin.token").exists());
    let mut operator = AdminApi::new()?;
    operator.url = api.url.clone();
    operator.token = Some(revoked.clone());
    assert_eq!(operator.get_status("/v1/jobs")?.0, 401);
    // Not while it runs.
    let back = dir.path().join("back.db");
    let back_spec = format!("sqlite:{}", back.display());
    let out = migrate(&["--from", &etcd.store_url(), "--to", &etcd.store_url()])?;
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("a master is running"),
        "{}",
        describe(&out)
    );
    on_etcd.stop(Duration::from_secs(10));

    let out = migrate(&["--from", &etcd.store_url(), "--to", &back_spec])?;
    assert!(out.status.success(), "{}", describe(&out));
    let snap = SqliteStore::open(&back)?.load()?;
    assert_eq!(snap.jobs.len(), 2);
    assert_eq!(snap.tasks.len(), 3);
    let original = SqliteStore::open(&dir.path().join("master/drover.db"))?.load()?;
    assert!(snap.index >= original.index);
    let mut ids: Vec<&str> = snap.tasks.iter().map(|t| t.id.as_str()).collect();
    let mut want: Vec<&str> = original.tasks.iter().map(|t| t.id.as_str()).collect();
    ids.sort();
    want.sort();
    assert_eq!(ids, want, "the same tasks came back");
    // The tokens and the audit log came back too (audit.log beside back.db).
    let tokens = drover_master::tokens::Tokens::open(&back)?;
    let header = |t: &str| format!("Bearer {t}").into_bytes();
    let admin = api.token.clone().unwrap_or_default();
    assert!(tokens.authenticate(Some(&header(&admin))).is_ok());
    assert!(tokens.authenticate(Some(&header(&revoked))).is_err());
    let log = std::fs::read_to_string(dir.path().join("audit.log"))?;
    assert_eq!(log.matches("\"path\":\"/v1/jobs\"").count(), 2, "{log}");
    Ok(())
}
