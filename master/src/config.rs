//! The master's configuration: a TOML file whose keys mirror the command-line flags,
//! flags overriding the file, defaults from Aurora and Mesos. Validation names the
//! field at fault so the main can exit 64 with a useful message.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::Parser;
use drover_common::units::{setting, Duration};
use serde::Deserialize;

use crate::core::CoreConfig;
use crate::dns::answer::Zone;
use crate::etcd_store::EtcdOptions;
use crate::tls::TlsFiles;

/// Command-line flags of `drover-master`; each overrides the TOML key of the same
/// name (with `_` for `-`).
#[derive(Clone, Debug, Default, Parser)]
#[command(
    name = "drover-master",
    version,
    about = "Drover's master: stores jobs, schedules tasks, serves the admin and agent APIs"
)]
pub struct Args {
    /// A command instead of serving.
    #[command(subcommand)]
    pub command: Option<MasterCommand>,
    /// TOML config file; flags override its keys.
    #[arg(long, value_name = "FILE.toml")]
    pub config: Option<PathBuf>,
    /// Address to listen on (`127.0.0.1:0` picks a free port; see <data_dir>/master.addr).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Where the store (drover.db), master.addr, admin.token and audit.log live.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Where the state is kept: `sqlite` (default: <data_dir>/drover.db, one
    /// master) or `etcd://host:port,host:port,...` (several masters, one leader).
    #[arg(long, value_name = "URL")]
    pub store: Option<String>,
    /// The etcd cluster's CA (PEM): turns TLS towards etcd on.
    #[arg(long, value_name = "FILE.pem")]
    pub etcd_ca: Option<PathBuf>,
    /// Client certificate (PEM) presented to etcd, with etcd_key.
    #[arg(long, value_name = "FILE.pem")]
    pub etcd_cert: Option<PathBuf>,
    /// The private key of etcd_cert (PEM).
    #[arg(long, value_name = "FILE.pem")]
    pub etcd_key: Option<PathBuf>,
    /// The etcd cluster's --max-txn-ops (default 128): larger commits are split
    /// safely through a redo log.
    #[arg(long, value_name = "N")]
    pub etcd_max_txn_ops: Option<usize>,
    /// The etcd cluster's --max-request-bytes (default 1572864).
    #[arg(long, value_name = "BYTES")]
    pub etcd_max_request_bytes: Option<usize>,
    /// TTL of the election lease on etcd: a dead leader is replaced this long
    /// after its last keep-alive (default 2s, at least 2s: etcd's minimum).
    #[arg(long, value_name = "DURATION")]
    pub lease_ttl: Option<String>,
    /// The URL agents and the CLI reach this master at, told to them by standbys
    /// (default: http://<listen>, https with TLS).
    #[arg(long, value_name = "URL")]
    pub advertise: Option<String>,
    /// Allow listening on a non-loopback address without TLS: bearer tokens then
    /// cross the network in clear text. Logged as a warning at every start.
    #[arg(long)]
    pub insecure: bool,
    /// The master's TLS certificate chain (PEM, from `drover tls issue master NAME`);
    /// with tls_key and tls_client_ca the API is served over TLS only.
    #[arg(long, value_name = "FILE.pem")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of tls_cert (PEM).
    #[arg(long, value_name = "FILE.pem")]
    pub tls_key: Option<PathBuf>,
    /// The cluster CA (PEM, from `drover tls init`): agents' client certificates
    /// must chain to it.
    #[arg(long, value_name = "FILE.pem")]
    pub tls_client_ca: Option<PathBuf>,
    /// A task that ran shorter than this is flapping and is replaced THROTTLED.
    #[arg(long, value_name = "DURATION")]
    pub flapping_threshold: Option<String>,
    /// First THROTTLED penalty; doubles per consecutive flap.
    #[arg(long, value_name = "DURATION")]
    pub throttle_initial: Option<String>,
    /// Largest THROTTLED penalty.
    #[arg(long, value_name = "DURATION")]
    pub throttle_max: Option<String>,
    /// ASSIGNED or STARTING longer than this becomes LOST and is replaced.
    #[arg(long, value_name = "DURATION")]
    pub transient_state_timeout: Option<String>,
    /// An agent silent this long is unreachable.
    #[arg(long, value_name = "DURATION")]
    pub agent_timeout: Option<String>,
    /// How often agents heartbeat, at least (told to them in every answer).
    #[arg(long, value_name = "DURATION")]
    pub heartbeat_interval: Option<String>,
    /// Heartbeats a second from the whole cell, at most: a larger cell is told a
    /// longer interval (default 100).
    #[arg(long, value_name = "N")]
    pub max_heartbeat_rate: Option<u32>,
    /// Terminal tasks kept per instance.
    #[arg(long, value_name = "N")]
    pub task_history_limit: Option<usize>,
    /// Period of implicit reconciliation with every agent.
    #[arg(long, value_name = "DURATION")]
    pub reconcile_interval: Option<String>,
    /// First retry delay of explicit reconciliation (doubles per round).
    #[arg(long, value_name = "DURATION")]
    pub reconcile_backoff_initial: Option<String>,
    /// Largest retry delay of explicit reconciliation.
    #[arg(long, value_name = "DURATION")]
    pub reconcile_backoff_max: Option<String>,
    /// After a master start, nothing is replaced because of an agent that has not
    /// come back until this passed (default: 2 x agent_timeout).
    #[arg(long, value_name = "DURATION")]
    pub restart_grace: Option<String>,
    /// How long an agent keeps exclusive tasks without the master (must match the
    /// agents' lease).
    #[arg(long, value_name = "DURATION")]
    pub exclusive_lease: Option<String>,
    /// How long a task may be missing from an agent's task set before it is LOST.
    #[arg(long, value_name = "DURATION")]
    pub missing_grace: Option<String>,
    /// The eviction guard engages when more than this share (0 to 1) of the agents
    /// go unreachable within eviction_guard_window.
    #[arg(long, value_name = "SHARE")]
    pub eviction_guard_share: Option<f64>,
    /// How close together agents must go unreachable to count as one storm.
    #[arg(long, value_name = "DURATION")]
    pub eviction_guard_window: Option<String>,
    /// Tasks made LOST by agent loss, at most, per second.
    #[arg(long, value_name = "N")]
    pub agent_loss_rate: Option<u32>,
    /// How long resources freed by preemption stay reserved for the preemptor.
    #[arg(long, value_name = "DURATION")]
    pub preemption_reservation: Option<String>,
    /// A cron firing missed while the master was down runs at start if at most
    /// this old.
    #[arg(long, value_name = "DURATION")]
    pub cron_grace: Option<String>,
    /// Test switch: accept cron schedules with a leading seconds field.
    #[arg(long)]
    pub cron_seconds: bool,
    /// Host-side task failures (sandbox setup, executor lost) within
    /// quarantine_window that quarantine a host; 0 turns quarantine off.
    #[arg(long, value_name = "N")]
    pub quarantine_failures: Option<u32>,
    /// The window of quarantine_failures.
    #[arg(long, value_name = "DURATION")]
    pub quarantine_window: Option<String>,
    /// How many different jobs those failures must come from.
    #[arg(long, value_name = "N")]
    pub quarantine_jobs: Option<u32>,
    /// Task configs a job keeps for history beyond those its instances run and its
    /// unfinished update may need (the newest N).
    #[arg(long, value_name = "N")]
    pub config_history: Option<usize>,
    /// Answer DNS for the announced services on this address, UDP and TCP (off
    /// unless set; port 0 picks a free one, see <data_dir>/dns.addr).
    #[arg(long, value_name = "ADDR")]
    pub dns_listen: Option<String>,
    /// The domain the DNS server answers for (default `drover.`); names outside
    /// it are refused.
    #[arg(long, value_name = "DOMAIN")]
    pub dns_domain: Option<String>,
    /// TTL of DNS answers, whole seconds (default 2s; keep it well below the jobs'
    /// announce.drain_delay).
    #[arg(long, value_name = "DURATION")]
    pub dns_ttl: Option<String>,
}

/// What `drover-master` does instead of serving.
#[derive(Clone, Debug, clap::Subcommand)]
pub enum MasterCommand {
    /// Copies a stopped master's state from one store to another (every master
    /// stopped): `--from sqlite:/var/lib/drover-master --to etcd://h:p,h:p`, or
    /// back. The etcd TLS flags (--etcd-ca, --etcd-cert, --etcd-key) go before
    /// `migrate`.
    Migrate {
        /// The store to read: `sqlite:PATH` (the data dir or its drover.db) or
        /// `etcd://host:port,...`.
        #[arg(long, value_name = "STORE")]
        from: String,
        /// The store to write (empty unless --force).
        #[arg(long, value_name = "STORE")]
        to: String,
        /// Write into a store that already holds state (row by row, over it).
        #[arg(long)]
        force: bool,
    },
}

/// The TOML file; every key optional.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    listen: Option<String>,
    data_dir: Option<PathBuf>,
    insecure: Option<bool>,
    store: Option<String>,
    etcd_ca: Option<PathBuf>,
    etcd_cert: Option<PathBuf>,
    etcd_key: Option<PathBuf>,
    etcd_max_txn_ops: Option<usize>,
    etcd_max_request_bytes: Option<usize>,
    lease_ttl: Option<String>,
    advertise: Option<String>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    tls_client_ca: Option<PathBuf>,
    flapping_threshold: Option<String>,
    throttle_initial: Option<String>,
    throttle_max: Option<String>,
    transient_state_timeout: Option<String>,
    agent_timeout: Option<String>,
    heartbeat_interval: Option<String>,
    max_heartbeat_rate: Option<u32>,
    task_history_limit: Option<usize>,
    reconcile_interval: Option<String>,
    reconcile_backoff_initial: Option<String>,
    reconcile_backoff_max: Option<String>,
    restart_grace: Option<String>,
    exclusive_lease: Option<String>,
    missing_grace: Option<String>,
    eviction_guard_share: Option<f64>,
    eviction_guard_window: Option<String>,
    agent_loss_rate: Option<u32>,
    preemption_reservation: Option<String>,
    cron_grace: Option<String>,
    cron_seconds: Option<bool>,
    quarantine_failures: Option<u32>,
    quarantine_window: Option<String>,
    quarantine_jobs: Option<u32>,
    config_history: Option<usize>,
    dns_listen: Option<String>,
    dns_domain: Option<String>,
    dns_ttl: Option<String>,
}

/// The validated configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    /// Plain HTTP on a non-loopback address was explicitly allowed.
    pub insecure: bool,
    /// Serve TLS with these files (None: plain HTTP).
    pub tls: Option<TlsFiles>,
    pub core: CoreConfig,
    /// Where the state is kept.
    pub store: StoreChoice,
    /// Election settings (used on etcd only).
    pub ha: HaConfig,
    /// The DNS server, if one runs.
    pub dns: Option<DnsConfig>,
}

/// The DNS server's settings (`dns_listen`, `dns_domain`, `dns_ttl`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DnsConfig {
    /// UDP and TCP address.
    pub listen: SocketAddr,
    /// The domain answered for, with the answers' TTL.
    pub zone: Zone,
}

impl Config {
    /// What `dns::start_configured` takes: the DNS listener and zone, if any.
    pub fn dns_server(&self) -> Option<(SocketAddr, Zone)> {
        self.dns.as_ref().map(|d| (d.listen, d.zone.clone()))
    }
}

/// The default DNS domain.
pub const DEFAULT_DNS_DOMAIN: &str = "drover.";
/// The default TTL of DNS answers (ms).
pub const DEFAULT_DNS_TTL_MS: u64 = 2_000;

/// Where the master keeps its state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreChoice {
    /// `<data_dir>/drover.db`.
    Sqlite,
    /// An etcd cluster shared by several masters.
    Etcd(EtcdOptions),
}

/// Leader election settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HaConfig {
    /// TTL of the election lease.
    pub lease_ttl_ms: u64,
    /// The URL clients reach this master at.
    pub advertise: String,
}

/// The default election lease TTL.
pub const DEFAULT_LEASE_TTL_MS: u64 = 2_000;

impl HaConfig {
    /// The defaults for a master listening on `listen`.
    pub fn for_listen(listen: SocketAddr, tls: bool) -> HaConfig {
        HaConfig {
            lease_ttl_ms: DEFAULT_LEASE_TTL_MS,
            advertise: format!("{}://{listen}", if tls { "https" } else { "http" }),
        }
    }
}

/// A configuration problem, naming the field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{field}: {message}")]
    Field {
        field: &'static str,
        message: String,
    },
}

impl ConfigError {
    /// The field at fault, if one.
    pub fn field(&self) -> Option<&'static str> {
        match self {
            ConfigError::Field { field, .. } => Some(field),
            _ => None,
        }
    }
}

/// Defaults.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7070";
/// Default data dir.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/drover-master";

fn duration(
    field: &'static str,
    text: Option<String>,
    default_ms: u64,
) -> Result<u64, ConfigError> {
    setting(field, text.as_deref(), Duration::from_millis(default_ms))
        .map(|d| d.get().as_millis() as u64)
        .map_err(|e| ConfigError::Field {
            field: e.field,
            message: e.message,
        })
}

impl Config {
    /// Reads the file named by `args.config` (if any) and applies the flags over it.
    pub fn load(args: Args) -> Result<Config, ConfigError> {
        let file = match &args.config {
            Some(path) => read_file(path)?,
            None => FileConfig::default(),
        };
        Config::merge(args, file)
    }

    fn merge(args: Args, file: FileConfig) -> Result<Config, ConfigError> {
        let d = CoreConfig::default();
        let listen_text = args
            .listen
            .or(file.listen)
            .unwrap_or_else(|| DEFAULT_LISTEN.to_string());
        let listen: SocketAddr = listen_text.parse().map_err(|_| ConfigError::Field {
            field: "listen",
            message: format!("`{listen_text}` is not an address; write host:port, e.g. 127.0.0.1:7070 (port 0 picks a free one)"),
        })?;
        let insecure = args.insecure || file.insecure.unwrap_or(false);
        let tls = match (
            args.tls_cert.or(file.tls_cert),
            args.tls_key.or(file.tls_key),
            args.tls_client_ca.or(file.tls_client_ca),
        ) {
            (None, None, None) => None,
            (Some(cert), Some(key), Some(client_ca)) => Some(TlsFiles {
                cert,
                key,
                client_ca,
            }),
            (cert, key, _) => {
                let field = if cert.is_none() {
                    "tls_cert"
                } else if key.is_none() {
                    "tls_key"
                } else {
                    "tls_client_ca"
                };
                return Err(ConfigError::Field {
                    field,
                    message: "is missing: TLS needs tls_cert, tls_key and tls_client_ca together (see docs/auth.md)".to_string(),
                });
            }
        };
        if !listen.ip().is_loopback() && !insecure && tls.is_none() {
            return Err(ConfigError::Field {
                field: "listen",
                message: format!(
                    "`{listen}` is not a loopback address, and this master serves plain HTTP: \
                     bearer tokens and agent traffic would cross the network in clear text. \
                     Listen on 127.0.0.1, set tls_cert, tls_key and tls_client_ca, or pass \
                     --insecure (insecure = true) to accept that"
                ),
            });
        }
        let data_dir = args
            .data_dir
            .or(file.data_dir)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR));
        if data_dir.as_os_str().is_empty() {
            return Err(ConfigError::Field {
                field: "data_dir",
                message: "is empty; give a directory, e.g. /var/lib/drover-master".to_string(),
            });
        }
        let agent_timeout_ms = duration(
            "agent_timeout",
            args.agent_timeout.or(file.agent_timeout),
            d.agent_timeout_ms,
        )?;
        let core = CoreConfig {
            flapping_threshold_ms: duration(
                "flapping_threshold",
                args.flapping_threshold.or(file.flapping_threshold),
                d.flapping_threshold_ms,
            )?,
            throttle_initial_ms: duration(
                "throttle_initial",
                args.throttle_initial.or(file.throttle_initial),
                d.throttle_initial_ms,
            )?,
            throttle_max_ms: duration(
                "throttle_max",
                args.throttle_max.or(file.throttle_max),
                d.throttle_max_ms,
            )?,
            transient_timeout_ms: duration(
                "transient_state_timeout",
                args.transient_state_timeout
                    .or(file.transient_state_timeout),
                d.transient_timeout_ms,
            )?,
            agent_timeout_ms,
            heartbeat_interval_ms: duration(
                "heartbeat_interval",
                args.heartbeat_interval.or(file.heartbeat_interval),
                d.heartbeat_interval_ms,
            )?,
            max_heartbeat_rate: args
                .max_heartbeat_rate
                .or(file.max_heartbeat_rate)
                .unwrap_or(d.max_heartbeat_rate),
            task_history_limit: args
                .task_history_limit
                .or(file.task_history_limit)
                .unwrap_or(d.task_history_limit),
            reconcile_interval_ms: duration(
                "reconcile_interval",
                args.reconcile_interval.or(file.reconcile_interval),
                d.reconcile_interval_ms,
            )?,
            reconcile_backoff_initial_ms: duration(
                "reconcile_backoff_initial",
                args.reconcile_backoff_initial
                    .or(file.reconcile_backoff_initial),
                d.reconcile_backoff_initial_ms,
            )?,
            reconcile_backoff_max_ms: duration(
                "reconcile_backoff_max",
                args.reconcile_backoff_max.or(file.reconcile_backoff_max),
                d.reconcile_backoff_max_ms,
            )?,
            restart_grace_ms: duration(
                "restart_grace",
                args.restart_grace.or(file.restart_grace),
                2 * agent_timeout_ms,
            )?,
            exclusive_lease_ms: duration(
                "exclusive_lease",
                args.exclusive_lease.or(file.exclusive_lease),
                d.exclusive_lease_ms,
            )?,
            missing_grace_ms: duration(
                "missing_grace",
                args.missing_grace.or(file.missing_grace),
                d.missing_grace_ms,
            )?,
            eviction_guard_share_permille: share_permille(
                args.eviction_guard_share.or(file.eviction_guard_share),
                d.eviction_guard_share_permille,
            )?,
            eviction_guard_window_ms: duration(
                "eviction_guard_window",
                args.eviction_guard_window.or(file.eviction_guard_window),
                d.eviction_guard_window_ms,
            )?,
            agent_loss_rate: args
                .agent_loss_rate
                .or(file.agent_loss_rate)
                .unwrap_or(d.agent_loss_rate),
            preemption_reservation_ms: duration(
                "preemption_reservation",
                args.preemption_reservation.or(file.preemption_reservation),
                d.preemption_reservation_ms,
            )?,
            cron_grace_ms: duration(
                "cron_grace",
                args.cron_grace.or(file.cron_grace),
                d.cron_grace_ms,
            )?,
            cron_seconds: args.cron_seconds || file.cron_seconds.unwrap_or(false),
            drain_round_interval_ms: d.drain_round_interval_ms,
            drain_round_max_tasks: d.drain_round_max_tasks,
            quarantine_failures: args
                .quarantine_failures
                .or(file.quarantine_failures)
                .unwrap_or(d.quarantine_failures),
            quarantine_window_ms: duration(
                "quarantine_window",
                args.quarantine_window.or(file.quarantine_window),
                d.quarantine_window_ms,
            )?,
            quarantine_jobs: args
                .quarantine_jobs
                .or(file.quarantine_jobs)
                .unwrap_or(d.quarantine_jobs),
            config_history: args
                .config_history
                .or(file.config_history)
                .unwrap_or(d.config_history),
        };
        validate(&core)?;
        let store = match args.store.or(file.store).as_deref() {
            None | Some("sqlite") => StoreChoice::Sqlite,
            Some(url) => {
                let mut options = EtcdOptions::parse(
                    url,
                    args.etcd_ca.or(file.etcd_ca),
                    args.etcd_cert.or(file.etcd_cert),
                    args.etcd_key.or(file.etcd_key),
                )
                .map_err(|e| ConfigError::Field {
                    field: e.field,
                    message: if e.field == "store" {
                        format!("{} (or `sqlite`, the default)", e.message)
                    } else {
                        e.message
                    },
                })?;
                if let Some(n) = args.etcd_max_txn_ops.or(file.etcd_max_txn_ops) {
                    options.max_txn_ops = n;
                }
                if let Some(n) = args.etcd_max_request_bytes.or(file.etcd_max_request_bytes) {
                    options.max_request_bytes = n;
                }
                if options.max_txn_ops < 4 {
                    return Err(ConfigError::Field {
                        field: "etcd_max_txn_ops",
                        message: "must be at least 4; give the etcd cluster's --max-txn-ops".into(),
                    });
                }
                if options.max_request_bytes < 256 * 1024 {
                    return Err(ConfigError::Field {
                        field: "etcd_max_request_bytes",
                        message:
                            "must be at least 262144; give the etcd cluster's --max-request-bytes"
                                .into(),
                    });
                }
                if listen.port() == 0 {
                    return Err(ConfigError::Field {
                        field: "listen",
                        message: "a master on etcd needs a fixed port (agents and the CLI list the masters' addresses); write e.g. 10.0.0.1:7070".into(),
                    });
                }
                StoreChoice::Etcd(options)
            }
        };
        let mut ha = HaConfig::for_listen(listen, tls.is_some());
        ha.lease_ttl_ms = duration(
            "lease_ttl",
            args.lease_ttl.or(file.lease_ttl),
            DEFAULT_LEASE_TTL_MS,
        )?;
        if ha.lease_ttl_ms < 2_000 {
            return Err(ConfigError::Field {
                field: "lease_ttl",
                message: "must be at least 2s (etcd's shortest lease with its default timing)"
                    .into(),
            });
        }
        if let Some(url) = args.advertise.or(file.advertise) {
            let url = url.trim_end_matches('/').to_string();
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(ConfigError::Field {
                    field: "advertise",
                    message: format!("`{url}` is not a URL; write e.g. https://10.0.0.1:7070"),
                });
            }
            ha.advertise = url;
        }
        let dns = dns_config(
            args.dns_listen.or(file.dns_listen),
            args.dns_domain.or(file.dns_domain),
            args.dns_ttl.or(file.dns_ttl),
        )?;
        Ok(Config {
            listen,
            data_dir,
            insecure,
            tls,
            core,
            store,
            ha,
            dns,
        })
    }
}

/// The DNS settings: None unless `dns_listen` is set; the domain and TTL are
/// checked even then, so a typo is found before the day it is turned on.
fn dns_config(
    listen: Option<String>,
    domain: Option<String>,
    ttl: Option<String>,
) -> Result<Option<DnsConfig>, ConfigError> {
    let ttl_ms = duration("dns_ttl", ttl, DEFAULT_DNS_TTL_MS)?;
    if ttl_ms % 1000 != 0 || ttl_ms > 3_600_000 {
        return Err(ConfigError::Field {
            field: "dns_ttl",
            message: "must be whole seconds from 0s to 1h (DNS TTLs are seconds), e.g. 2s"
                .to_string(),
        });
    }
    let domain = domain.unwrap_or_else(|| DEFAULT_DNS_DOMAIN.to_string());
    let zone = Zone::new(&domain, (ttl_ms / 1000) as u32).ok_or_else(|| ConfigError::Field {
        field: "dns_domain",
        message: format!("`{domain}` is not a domain name; write e.g. drover. or svc.example.com."),
    })?;
    let Some(text) = listen else {
        return Ok(None);
    };
    let listen: SocketAddr = text.parse().map_err(|_| ConfigError::Field {
        field: "dns_listen",
        message: format!(
            "`{text}` is not an address; write host:port, e.g. 127.0.0.1:5353 (port 0 picks a free one)"
        ),
    })?;
    Ok(Some(DnsConfig { listen, zone }))
}

fn read_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    toml::from_str(&text).map_err(|e| ConfigError::Parse {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

fn share_permille(share: Option<f64>, default: u32) -> Result<u32, ConfigError> {
    match share {
        None => Ok(default),
        Some(s) if (0.0..=1.0).contains(&s) => Ok((s * 1000.0).round() as u32),
        Some(s) => Err(ConfigError::Field {
            field: "eviction_guard_share",
            message: format!(
                "{s} is not a share; write a number from 0 to 1, e.g. 0.5 (1 never engages)"
            ),
        }),
    }
}

fn positive(field: &'static str, ms: u64) -> Result<(), ConfigError> {
    if ms == 0 {
        Err(ConfigError::Field {
            field,
            message: "must be longer than 0, e.g. 5s".to_string(),
        })
    } else {
        Ok(())
    }
}

fn validate(c: &CoreConfig) -> Result<(), ConfigError> {
    positive("throttle_initial", c.throttle_initial_ms)?;
    positive("throttle_max", c.throttle_max_ms)?;
    positive("transient_state_timeout", c.transient_timeout_ms)?;
    positive("agent_timeout", c.agent_timeout_ms)?;
    positive("heartbeat_interval", c.heartbeat_interval_ms)?;
    positive("reconcile_interval", c.reconcile_interval_ms)?;
    positive("reconcile_backoff_initial", c.reconcile_backoff_initial_ms)?;
    positive("reconcile_backoff_max", c.reconcile_backoff_max_ms)?;
    positive("exclusive_lease", c.exclusive_lease_ms)?;
    positive("eviction_guard_window", c.eviction_guard_window_ms)?;
    positive("preemption_reservation", c.preemption_reservation_ms)?;
    if c.max_heartbeat_rate == 0 {
        return Err(ConfigError::Field {
            field: "max_heartbeat_rate",
            message: "must be at least 1 (heartbeats per second), e.g. 100".to_string(),
        });
    }
    if c.agent_loss_rate == 0 {
        return Err(ConfigError::Field {
            field: "agent_loss_rate",
            message: "must be at least 1 (tasks per second), e.g. 100".to_string(),
        });
    }
    if c.quarantine_failures > 0 {
        positive("quarantine_window", c.quarantine_window_ms)?;
        if c.quarantine_jobs < 1 || c.quarantine_jobs > c.quarantine_failures {
            return Err(ConfigError::Field {
                field: "quarantine_jobs",
                message: format!(
                    "is {}; use 1 to quarantine_failures ({})",
                    c.quarantine_jobs, c.quarantine_failures
                ),
            });
        }
    }
    if c.throttle_initial_ms > c.throttle_max_ms {
        return Err(ConfigError::Field {
            field: "throttle_initial",
            message: "is longer than throttle_max; make it shorter or raise throttle_max"
                .to_string(),
        });
    }
    if c.reconcile_backoff_initial_ms > c.reconcile_backoff_max_ms {
        return Err(ConfigError::Field {
            field: "reconcile_backoff_initial",
            message: "is longer than reconcile_backoff_max; make it shorter".to_string(),
        });
    }
    if c.heartbeat_interval_ms * 2 > c.agent_timeout_ms {
        return Err(ConfigError::Field {
            field: "agent_timeout",
            message: format!(
                "must be at least twice heartbeat_interval ({} ms) so one lost heartbeat does not mark an agent unreachable",
                c.heartbeat_interval_ms
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
