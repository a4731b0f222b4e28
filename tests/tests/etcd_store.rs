//! The etcd store against a real one-member etcd: fenced writes are refused once
//! the election key changed, a commit larger than etcd's transaction limits goes
//! through the redo log whole, and a redo log left behind is finished when
//! committed and dropped when not; a standby's reader reads at one revision and
//! writes nothing.

use std::sync::Arc;

use drover_master::core::{Change, Usage};
use drover_master::etcd_store::{EtcdConn, EtcdOptions, EtcdStore, Fence};
use drover_master::store::{Store, StoreError};
use drover_tests::etcd::EtcdCluster;

fn connect(cluster: &EtcdCluster, max_txn_ops: usize) -> anyhow::Result<Arc<EtcdConn>> {
    let mut options = EtcdOptions::parse(&cluster.store_url(), None, None, None)?;
    options.max_txn_ops = max_txn_ops;
    Ok(EtcdConn::connect(&options)?)
}

#[test]
fn a_fenced_write_is_refused_once_the_election_key_changed() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let cluster = EtcdCluster::start(dir.path(), 1)?;
    let mut etcd = cluster.client()?;
    etcd.put("/fence", "me")?;
    let revision = etcd.list("/fence")?[0].2;
    let conn = connect(&cluster, 128)?;
    let fence = Fence {
        key: b"/fence".to_vec(),
        revision,
    };
    let mut store = EtcdStore::with_prefix(conn.clone(), Some(fence), "/t/");
    store.load()?;
    store.commit(&[Change::Index(7)])?;
    // Another master was elected: the key was deleted and created again.
    etcd.run(async |c| c.delete("/fence", None).await)?;
    etcd.put("/fence", "other")?;
    let refused = store.commit(&[Change::Index(8), Change::PutQuota("r".into(), None)]);
    assert!(
        matches!(refused, Err(StoreError::Fenced)),
        "a write after the fence moved must be refused: {refused:?}"
    );
    let mut reader = EtcdStore::with_prefix(conn, None, "/t/");
    assert_eq!(reader.load()?.index, 7, "the refused write left nothing");
    Ok(())
}

#[test]
fn a_commit_beyond_the_transaction_limits_is_written_whole_through_the_redo_log(
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let cluster = EtcdCluster::start(dir.path(), 1)?;
    let conn = connect(&cluster, 4)?;
    let mut store = EtcdStore::with_prefix(conn.clone(), None, "/t/");
    store.load()?;
    let mut changes: Vec<Change> = (0..50)
        .map(|i| Change::PutQuota(format!("role{i:02}"), Some(Usage::default())))
        .collect();
    changes.push(Change::Index(3));
    store.commit(&changes)?;
    let snap = EtcdStore::with_prefix(conn, None, "/t/").load()?;
    assert_eq!(snap.quotas.len(), 50);
    assert_eq!(snap.index, 3);
    let mut etcd = cluster.client()?;
    assert!(etcd.list("/t/redo/")?.is_empty(), "the redo log is deleted");
    Ok(())
}

#[test]
fn a_committed_redo_log_is_finished_at_load_and_an_uncommitted_one_dropped() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let cluster = EtcdCluster::start(dir.path(), 1)?;
    let conn = connect(&cluster, 128)?;
    let mut etcd = cluster.client()?;
    let usage = serde_json::to_string(&Usage::default())?;
    let chunk = |key: &str| serde_json::json!([{"Put": {"key": key, "value": usage}}]).to_string();
    // A leader died after the commit point, before applying: finished at load.
    etcd.put("/a/redo/00000000", &chunk("/a/quotas/kept"))?;
    etcd.put("/a/redo/commit", "1")?;
    let snap = EtcdStore::with_prefix(conn.clone(), None, "/a/").load()?;
    assert_eq!(snap.quotas.len(), 1, "{:?}", snap.quotas);
    assert_eq!(snap.quotas[0].0, "kept");
    assert!(etcd.list("/a/redo/")?.is_empty());
    // A leader died before the commit point: the batch was never acknowledged.
    etcd.put("/b/redo/00000000", &chunk("/b/quotas/dropped"))?;
    let snap = EtcdStore::with_prefix(conn, None, "/b/").load()?;
    assert!(snap.quotas.is_empty(), "{:?}", snap.quotas);
    assert!(etcd.list("/b/redo/")?.is_empty());
    Ok(())
}

#[test]
fn user_grants_load_back_and_an_emptied_role_is_deleted() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let cluster = EtcdCluster::start(dir.path(), 1)?;
    let conn = connect(&cluster, 128)?;
    let mut store = EtcdStore::with_prefix(conn.clone(), None, "/g/");
    store.load()?;
    let users = |names: &[&str]| names.iter().map(|n| n.to_string()).collect();
    store.commit(&[
        Change::PutUserGrants("www".into(), users(&["backup", "daemon"])),
        Change::PutUserGrants("db".into(), users(&["postgres"])),
    ])?;
    store.commit(&[
        Change::PutUserGrants("www".into(), users(&["backup"])),
        Change::PutUserGrants("db".into(), users(&[])),
    ])?;
    let snap = EtcdStore::with_prefix(conn, None, "/g/").load()?;
    assert_eq!(snap.user_grants, vec![("www".into(), users(&["backup"]))]);
    let mut etcd = cluster.client()?;
    assert!(
        etcd.list("/g/user_grants/db")?.is_empty(),
        "the row is deleted"
    );
    Ok(())
}

#[test]
fn a_standbys_reader_reads_at_one_revision_and_writes_nothing() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let cluster = EtcdCluster::start(dir.path(), 1)?;
    let conn = connect(&cluster, 128)?;
    let mut store = EtcdStore::new(conn.clone(), None);
    store.load()?;
    store.commit(&[
        Change::PutQuota("web".into(), Some(Usage::default())),
        Change::Index(5),
    ])?;
    let mut reader = EtcdStore::reader(conn);
    let (snap, revision) = reader.read_snapshot()?.expect("no redo log: a snapshot");
    assert_eq!((snap.index, snap.quotas.len()), (5, 1));
    assert_eq!(reader.revision()?, revision, "nothing written since");
    let refused = reader.commit(&[Change::Index(6)]);
    assert!(
        matches!(refused, Err(StoreError::StandbyCopy)),
        "a reader must refuse writes: {refused:?}"
    );
    assert_eq!(
        reader.revision()?,
        revision,
        "the refused writes reached etcd"
    );
    // A large commit half applied: no snapshot until its redo log is gone.
    let mut etcd = cluster.client()?;
    etcd.put("/drover/redo/00000000", "[]")?;
    assert!(reader.read_snapshot()?.is_none());
    Ok(())
}
