//! Unit tests of the master's configuration: file parsing, flag overrides and validation.

use super::*;

fn args() -> Args {
    Args::default()
}

#[test]
fn defaults_follow_aurora_and_grace_is_twice_the_agent_timeout() {
    let c = Config::merge(args(), FileConfig::default()).unwrap();
    assert_eq!(c.core.flapping_threshold_ms, 300_000);
    assert_eq!(c.core.throttle_initial_ms, 30_000);
    assert_eq!(c.core.restart_grace_ms, 2 * c.core.agent_timeout_ms);
    assert_eq!(c.listen.to_string(), DEFAULT_LISTEN);
}

#[test]
fn flags_override_file_keys() {
    let file: FileConfig =
        toml::from_str("agent_timeout = \"20s\"\nlisten = \"127.0.0.1:1\"").unwrap();
    let mut a = args();
    a.listen = Some("127.0.0.1:0".to_string());
    let c = Config::merge(a, file).unwrap();
    assert_eq!(c.listen.port(), 0);
    assert_eq!(c.core.agent_timeout_ms, 20_000);
}

#[test]
fn bad_values_name_their_field() {
    let mut a = args();
    a.agent_timeout = Some("soon".to_string());
    let e = Config::merge(a, FileConfig::default()).unwrap_err();
    assert_eq!(e.field(), Some("agent_timeout"));
    let mut a = args();
    a.listen = Some("nowhere".to_string());
    assert_eq!(
        Config::merge(a, FileConfig::default()).unwrap_err().field(),
        Some("listen")
    );
    let mut a = args();
    a.heartbeat_interval = Some("10s".to_string());
    a.agent_timeout = Some("5s".to_string());
    assert_eq!(
        Config::merge(a, FileConfig::default()).unwrap_err().field(),
        Some("agent_timeout")
    );
}

#[test]
fn max_heartbeat_rate_is_read_and_checked() {
    let c = Config::merge(args(), FileConfig::default()).unwrap();
    assert_eq!(c.core.max_heartbeat_rate, 100);
    let file: FileConfig = toml::from_str("max_heartbeat_rate = 40").unwrap();
    assert_eq!(
        Config::merge(args(), file).unwrap().core.max_heartbeat_rate,
        40
    );
    let mut a = args();
    a.max_heartbeat_rate = Some(0);
    assert_eq!(
        Config::merge(a, FileConfig::default()).unwrap_err().field(),
        Some("max_heartbeat_rate")
    );
}

#[test]
fn eviction_guard_keys_are_read_and_checked() {
    let file: FileConfig = toml::from_str(
        "eviction_guard_share = 0.6\neviction_guard_window = \"20s\"\nagent_loss_rate = 7",
    )
    .unwrap();
    let c = Config::merge(args(), file).unwrap();
    assert_eq!(c.core.eviction_guard_share_permille, 600);
    assert_eq!(c.core.eviction_guard_window_ms, 20_000);
    assert_eq!(c.core.agent_loss_rate, 7);
    let mut a = args();
    a.eviction_guard_share = Some(1.5);
    assert_eq!(
        Config::merge(a, FileConfig::default()).unwrap_err().field(),
        Some("eviction_guard_share")
    );
    let mut a = args();
    a.agent_loss_rate = Some(0);
    assert_eq!(
        Config::merge(a, FileConfig::default()).unwrap_err().field(),
        Some("agent_loss_rate")
    );
}

#[test]
fn a_non_loopback_listen_needs_insecure() {
    let mut a = args();
    a.listen = Some("0.0.0.0:7070".to_string());
    let e = Config::merge(a.clone(), FileConfig::default()).unwrap_err();
    assert_eq!(e.field(), Some("listen"));
    assert!(e.to_string().contains("--insecure"), "{e}");
    a.insecure = true;
    assert!(Config::merge(a, FileConfig::default()).unwrap().insecure);
    let file: FileConfig = toml::from_str("listen = \"10.0.0.1:7070\"\ninsecure = true").unwrap();
    assert!(Config::merge(args(), file).is_ok());
}

#[test]
fn dns_is_off_by_default_and_its_keys_are_checked() {
    let c = Config::merge(args(), FileConfig::default()).unwrap();
    assert_eq!(c.dns, None);
    let file: FileConfig = toml::from_str(
        "dns_listen = \"127.0.0.1:5353\"\ndns_domain = \"svc.example\"\ndns_ttl = \"3s\"",
    )
    .unwrap();
    let dns = Config::merge(args(), file).unwrap().dns.unwrap();
    assert_eq!(dns.listen.port(), 5353);
    assert_eq!(dns.zone.domain.to_string(), "svc.example.");
    assert_eq!(dns.zone.ttl, 3);
    let mut a = args();
    a.dns_listen = Some("127.0.0.1:0".into());
    let dns = Config::merge(a.clone(), FileConfig::default())
        .unwrap()
        .dns
        .unwrap();
    assert_eq!(dns.zone.domain.to_string(), DEFAULT_DNS_DOMAIN);
    assert_eq!(dns.zone.ttl, 2);
    for (field, value) in [
        ("dns_ttl", "1500ms"),
        ("dns_ttl", "2h"),
        ("dns_domain", "a..b"),
        ("dns_listen", "port 53"),
    ] {
        let mut a = a.clone();
        match field {
            "dns_ttl" => a.dns_ttl = Some(value.into()),
            "dns_domain" => a.dns_domain = Some(value.into()),
            _ => a.dns_listen = Some(value.into()),
        }
        let e = Config::merge(a, FileConfig::default()).unwrap_err();
        assert_eq!(e.field(), Some(field), "{value}: {e}");
    }
}

#[test]
fn unknown_file_keys_are_rejected() {
    assert!(toml::from_str::<FileConfig>("agent_timeuot = \"5s\"").is_err());
}
