//! Where the etcd cluster is and how to reach it: the `--store etcd://...` URL,
//! its TLS files and the cluster's transaction limits, with field errors.

use std::path::PathBuf;

use super::{DEFAULT_MAX_REQUEST_BYTES, DEFAULT_MAX_TXN_OPS};

/// Where the etcd cluster is and how to reach it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdOptions {
    /// Client URLs (`http://h:p`, or `https://h:p` with TLS).
    pub endpoints: Vec<String>,
    /// CA (PEM) the members' certificates must chain to; turns TLS on.
    pub ca: Option<PathBuf>,
    /// Client certificate and key (PEM) for clusters that require them.
    pub identity: Option<(PathBuf, PathBuf)>,
    /// The cluster's `--max-txn-ops`.
    pub max_txn_ops: usize,
    /// The cluster's `--max-request-bytes`.
    pub max_request_bytes: usize,
}

/// Why an `etcd://` store option is not usable.
#[derive(Debug, thiserror::Error)]
#[error("{field}: {message}")]
pub struct EtcdOptionError {
    /// The option at fault.
    pub field: &'static str,
    /// What is wrong and what to write.
    pub message: String,
}

impl EtcdOptions {
    /// Parses `etcd://host:port,host:port,...`; `ca` turns TLS on (https endpoints),
    /// `cert` and `key` come together.
    pub fn parse(
        url: &str,
        ca: Option<PathBuf>,
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
    ) -> Result<EtcdOptions, EtcdOptionError> {
        let bad = |message: String| EtcdOptionError {
            field: "store",
            message,
        };
        let Some(list) = url.strip_prefix("etcd://") else {
            return Err(bad(format!(
                "`{url}` is not an etcd store; write etcd://host:port,host:port"
            )));
        };
        let scheme = if ca.is_some() { "https" } else { "http" };
        let mut endpoints = Vec::new();
        for member in list.split(',').map(str::trim).filter(|m| !m.is_empty()) {
            let ok = member
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
            if !ok || member.contains('/') {
                return Err(bad(format!(
                    "`{member}` in `{url}` is not host:port; write etcd://10.0.0.1:2379,10.0.0.2:2379"
                )));
            }
            endpoints.push(format!("{scheme}://{member}"));
        }
        if endpoints.is_empty() {
            return Err(bad(format!(
                "`{url}` names no etcd member; write etcd://host:port,host:port"
            )));
        }
        let identity = match (cert, key) {
            (None, None) => None,
            (Some(c), Some(k)) => Some((c, k)),
            (c, _) => {
                return Err(EtcdOptionError {
                    field: if c.is_none() { "etcd_cert" } else { "etcd_key" },
                    message: "etcd_cert and etcd_key come together; set both or neither"
                        .to_string(),
                })
            }
        };
        if identity.is_some() && ca.is_none() {
            return Err(EtcdOptionError {
                field: "etcd_ca",
                message: "a client certificate needs TLS: set etcd_ca to the etcd cluster's CA"
                    .to_string(),
            });
        }
        Ok(EtcdOptions {
            endpoints,
            ca,
            identity,
            max_txn_ops: DEFAULT_MAX_TXN_OPS,
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
        })
    }
}
