//! Announcing into etcd (issue 28): while a master leads on etcd, every announced
//! instance is one key `/drover-announce/<role>/<env>/<name>/member_<instance>`
//! (the instance zero-padded to 10 digits) whose value is a ZooKeeper ServerSet
//! member (`{"serviceEndpoint": {"host", "port"}, "additionalEndpoints": {...},
//! "status": "ALIVE", "shard": N}`), attached to the leader's election lease, so
//! ServerSet-style clients can watch the prefix. The keys follow the master's
//! service views after every commit; a leader that stops leading loses its lease
//! and with it every key, and the next leader writes them again. docs/master.md
//! ("Service discovery in etcd") says what is and is not compatible with ZooKeeper.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use drover_common::wire::ServiceView;
use etcd_client::{Client, GetOptions, PutOptions};
use serde::Serialize;

use crate::runtime::Master;

/// The key prefix of the announced members (beside the store's `/drover/`, which a
/// loading master reads whole).
pub const ANNOUNCE_PREFIX: &str = "/drover-announce/";

/// One endpoint of a ServerSet member.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
struct Endpoint {
    host: String,
    port: u16,
}

/// A ServerSet member's JSON (the `ServiceInstance` of Twitter's serversets).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
struct Member {
    service_endpoint: Endpoint,
    additional_endpoints: BTreeMap<String, Endpoint>,
    status: &'static str,
    shard: u32,
}

/// The key of instance `instance` of a service.
pub fn member_key(role: &str, env: &str, name: &str, instance: u32) -> String {
    format!("{ANNOUNCE_PREFIX}{role}/{env}/{name}/member_{instance:010}")
}

/// Every member key and its JSON for `views` (pure). The endpoint's host is the
/// agent's IP, else its host name; every announced port (the primary one too) is an
/// additional endpoint by its name.
pub fn members(views: &[ServiceView]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for v in views {
        for e in &v.endpoints {
            let host = if e.ip.is_empty() {
                e.host.clone()
            } else {
                e.ip.clone()
            };
            let Some(&port) = e.ports.get(&v.primary_port) else {
                continue;
            };
            let member = Member {
                service_endpoint: Endpoint {
                    host: host.clone(),
                    port,
                },
                additional_endpoints: e
                    .ports
                    .iter()
                    .map(|(n, p)| {
                        (
                            n.clone(),
                            Endpoint {
                                host: host.clone(),
                                port: *p,
                            },
                        )
                    })
                    .collect(),
                status: "ALIVE",
                shard: e.instance,
            };
            if let Ok(json) = serde_json::to_string(&member) {
                out.insert(
                    member_key(&v.role, &v.environment, &v.name, e.instance),
                    json,
                );
            }
        }
    }
    out
}

/// Keeps the member keys equal to the master's service views, with `lease`, until
/// the commit stream ends (the master stops) or the task is aborted (leadership
/// ends). Starts by taking over the members a previous leader left (and removing
/// those no longer announced).
pub async fn publish(mut client: Client, master: Arc<Master>, lease: i64) {
    let mut commits = master.commit_state().subscribe();
    let mut published: Option<BTreeMap<String, String>> = None;
    loop {
        let want = master.read(|c| members(&c.service_views()));
        let synced = match &published {
            None => replace_all(&mut client, &want, lease).await,
            Some(had) => apply_diff(&mut client, had, &want, lease).await,
        };
        match synced {
            Ok(()) => published = Some(want),
            Err(e) => {
                tracing::warn!(error = %e, "cannot write the announced members to etcd; retrying");
                published = None;
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        }
        if commits.changed().await.is_err() {
            return;
        }
    }
}

/// Writes every wanted member under `lease` first, then deletes the members a
/// previous leader left that are not wanted: a member that stays never vanishes,
/// not even for a moment, at a change of leader.
async fn replace_all(
    client: &mut Client,
    want: &BTreeMap<String, String>,
    lease: i64,
) -> Result<(), etcd_client::Error> {
    for (key, value) in want {
        put(client, key, value, lease).await?;
    }
    let left = client
        .get(
            ANNOUNCE_PREFIX,
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
        .await?;
    let stale: Vec<Vec<u8>> = left
        .kvs()
        .iter()
        .filter(|kv| kv.key_str().is_ok_and(|k| !want.contains_key(k)))
        .map(|kv| kv.key().to_vec())
        .collect();
    for key in stale {
        client.delete(key, None).await?;
    }
    Ok(())
}

async fn apply_diff(
    client: &mut Client,
    had: &BTreeMap<String, String>,
    want: &BTreeMap<String, String>,
    lease: i64,
) -> Result<(), etcd_client::Error> {
    for key in had.keys().filter(|k| !want.contains_key(*k)) {
        client.delete(key.as_str(), None).await?;
    }
    for (key, value) in want {
        if had.get(key) != Some(value) {
            put(client, key, value, lease).await?;
        }
    }
    Ok(())
}

async fn put(
    client: &mut Client,
    key: &str,
    value: &str,
    lease: i64,
) -> Result<(), etcd_client::Error> {
    client
        .put(key, value, Some(PutOptions::new().with_lease(lease)))
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_common::wire::ServiceEndpoint;

    #[test]
    fn a_member_is_serverset_json() {
        let view = ServiceView {
            role: "www".into(),
            environment: "prod".into(),
            name: "web".into(),
            job: "www/prod/web".into(),
            primary_port: "http".into(),
            index: 3,
            endpoints: vec![ServiceEndpoint {
                instance: 2,
                host: "h1.example".into(),
                ip: "10.0.0.1".into(),
                ports: [("http".to_string(), 31000), ("admin".to_string(), 31001)]
                    .into_iter()
                    .collect(),
                task_id: "web-2-0123456789ab".into(),
                since: 1,
            }],
        };
        let m = members(&[view]);
        let (key, value) = m.iter().next().unwrap();
        assert_eq!(key, "/drover-announce/www/prod/web/member_0000000002");
        let v: serde_json::Value = serde_json::from_str(value).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "serviceEndpoint": {"host": "10.0.0.1", "port": 31000},
                "additionalEndpoints": {
                    "admin": {"host": "10.0.0.1", "port": 31001},
                    "http": {"host": "10.0.0.1", "port": 31000}
                },
                "status": "ALIVE",
                "shard": 2
            })
        );
    }
}
