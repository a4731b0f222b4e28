//! Unit tests of the agent's configuration: file parsing, flag overrides and validation.

use super::*;

fn host() -> HostFacts {
    HostFacts {
        cpus: 4,
        mem_bytes: 8 << 30,
        hostname: "h1".into(),
        default_executor: "/x/drover-executor".into(),
    }
}

#[test]
fn defaults_come_from_the_host_minus_a_reserve() {
    let c = ConfigFile::default().resolve(&host()).unwrap();
    assert_eq!(c.cpu, 3.5);
    assert_eq!(c.ram_bytes, (8 << 30) - RAM_RESERVE);
    assert_eq!(c.attributes.get("host").unwrap(), "h1");
    assert_eq!(c.executor, PathBuf::from("/x/drover-executor"));
    assert_eq!(c.lease, Duration::from_secs(10));
    assert!(c.executor_fork_server, "executors are forked by default");
    let off: ConfigFile = toml::from_str("executor_fork_server = false").unwrap();
    assert!(!off.resolve(&host()).unwrap().executor_fork_server);
}

#[test]
fn task_users_take_names_uids_and_ranges_and_refuse_anything_else() {
    let c = ConfigFile::default().resolve(&host()).unwrap();
    assert_eq!(c.task_users, TaskUsers::default());
    let file: ConfigFile =
        toml::from_str(r#"task_users = ["www-data", "1000-60000", "7"]"#).unwrap();
    let users = file.resolve(&host()).unwrap().task_users;
    assert_eq!(users.names, vec!["www-data".to_string()]);
    assert_eq!(users.uids, vec![(1000, 60000), (7, 7)]);
    for bad in ["60000-1000", "a b", ""] {
        let file = ConfigFile {
            task_users: Some(vec![bad.to_string()]),
            ..ConfigFile::default()
        };
        let err = file.resolve(&host()).unwrap_err();
        assert_eq!(err.field(), Some("task_users"), "{bad}: {err}");
    }
}

#[test]
fn flags_override_the_file_and_attributes_merge() {
    let file: ConfigFile = toml::from_str(
        "master = \"http://m:1\"\nram = \"1GiB\"\nports = \"100-200\"\n[attributes]\nrack = \"r1\"\nhost = \"named\"\n",
    )
    .unwrap();
    let flags = ConfigFile {
        ram: Some("2GiB".into()),
        attributes: Some([("zone".to_string(), "z".to_string())].into()),
        ..Default::default()
    };
    let c = file.overlay(flags).resolve(&host()).unwrap();
    assert_eq!(c.master, "http://m:1");
    assert_eq!(c.ram_bytes, 2 << 30);
    assert_eq!(c.port_range, (100, 200));
    assert_eq!(c.attributes.get("host").unwrap(), "named");
    assert_eq!(c.attributes.get("rack").unwrap(), "r1");
    assert_eq!(c.attributes.get("zone").unwrap(), "z");
}

#[test]
fn bad_values_name_their_field() {
    let cases = [
        (
            ConfigFile {
                ram: Some("lots".into()),
                ..Default::default()
            },
            "ram",
        ),
        (
            ConfigFile {
                ports: Some("9-1".into()),
                ..Default::default()
            },
            "ports",
        ),
        (
            ConfigFile {
                listen: Some("nope".into()),
                ..Default::default()
            },
            "listen",
        ),
        (
            ConfigFile {
                master: Some("m:1".into()),
                ..Default::default()
            },
            "master",
        ),
        (
            ConfigFile {
                lease: Some("0s".into()),
                ..Default::default()
            },
            "lease",
        ),
        (
            ConfigFile {
                cpu: Some(-1.0),
                ..Default::default()
            },
            "cpu",
        ),
        (
            ConfigFile {
                tls_cert: Some("a.pem".into()),
                tls_key: Some("a.key".into()),
                ..Default::default()
            },
            "tls_ca",
        ),
        (
            ConfigFile {
                tls_ca: Some("ca.pem".into()),
                tls_cert: Some("a.pem".into()),
                tls_key: Some("a.key".into()),
                advertise: Some("http://h:7071".into()),
                ..Default::default()
            },
            "advertise",
        ),
    ];
    for (file, field) in cases {
        let err = file.resolve(&host()).unwrap_err();
        assert_eq!(err.field(), Some(field), "{err}");
    }
}

#[test]
fn unknown_keys_in_the_file_are_rejected() {
    assert!(toml::from_str::<ConfigFile>("mastr = \"x\"").is_err());
}

#[test]
fn artifact_limits_default_and_name_their_field() {
    let c = ConfigFile::default().resolve(&host()).unwrap();
    assert_eq!(c.artifacts.cache_size, 10 << 30);
    assert_eq!(c.artifacts.max_size, 1 << 30);
    assert_eq!(c.artifacts.task_max_size, 4 << 30);
    let file: ConfigFile =
        toml::from_str("artifact_cache_size = \"1KiB\"\nartifact_max_size = \"2MiB\"").unwrap();
    let c = file.resolve(&host()).unwrap();
    assert_eq!(
        (c.artifacts.cache_size, c.artifacts.max_size),
        (1024, 2 << 20)
    );
    for (text, field) in [
        ("artifact_max_size = \"0B\"", "artifact_max_size"),
        ("artifact_task_max_size = \"0B\"", "artifact_task_max_size"),
        ("artifact_cache_size = \"big\"", "artifact_cache_size"),
    ] {
        let file: ConfigFile = toml::from_str(text).unwrap();
        let err = file.resolve(&host()).unwrap_err();
        assert_eq!(err.field(), Some(field), "{err}");
    }
}

#[test]
fn mem_total_is_read_in_bytes() {
    assert_eq!(
        parse_mem_total("MemTotal:  1000 kB\nMemFree: 1 kB"),
        Some(1_024_000)
    );
}
