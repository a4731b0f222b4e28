//! validate(): each semantic rule, checked on a valid job with one thing broken.

#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

use drover_common::parse::parse_job;
use drover_common::spec::{HealthCheckType, JobSpec, Lifecycle, ProcessSpec};
use drover_common::units::{ByteSize, Duration};
use drover_common::validate::{quota_request, validate, MAX_DISK, MAX_PROCESSES, MAX_RAM};
use drover_common::wire::{QuotaResources, SetQuotaRequest};

fn base() -> JobSpec {
    parse_job(
        "job.yaml",
        r#"
role: www-data
environment: prod
name: hello
task:
  processes:
    - name: setup
      cmdline: ./install.sh {{instance}}
    - name: server
      cmdline: ./serve --port {{ports.http}} --admin {{ ports.admin }}
  order: [[setup, server]]
  resources: {cpu: 0.5, ram: 128MiB, disk: 1GiB, ports: [http, admin]}
  env: {DATA_DIR: "{{sandbox}}/data"}
health_check: {port: admin}
lifecycle: {http: {port: admin}}
constraints: {host: "limit:1", zone: "a|b", os: "!windows", dedicated: "www-data/hello"}
"#,
    )
    .unwrap()
}

fn process(name: &str) -> ProcessSpec {
    let mut p = base().task.processes[0].clone();
    p.name = name.to_string();
    p
}

/// The field paths of the errors `change` causes.
fn fields_after(change: impl FnOnce(&mut JobSpec)) -> Vec<String> {
    let mut job = base();
    change(&mut job);
    validate(&job).into_iter().map(|e| e.field).collect()
}

fn message_after(change: impl FnOnce(&mut JobSpec)) -> String {
    let mut job = base();
    change(&mut job);
    let errors = validate(&job);
    assert_eq!(errors.len(), 1, "{errors:?}");
    errors[0].message.clone()
}

#[test]
fn the_base_job_is_valid() {
    assert_eq!(validate(&base()), vec![]);
}

#[test]
fn names_must_be_safe_path_components() {
    assert_eq!(
        fields_after(|j| {
            j.role = "..".into();
            j.environment = "a/b".into();
            j.name = "x".repeat(65);
            j.task.processes[0].name = ".".into();
            j.task.user = Some("bad user".into());
        }),
        vec![
            "role",
            "environment",
            "name",
            "task.processes[0].name",
            "task.order[0][0]",
            "task.user"
        ]
    );
    assert_eq!(
        fields_after(|j| j.name = "a.b_c-1".into()),
        Vec::<String>::new()
    );
}

#[test]
fn the_pids_limit_is_bounded() {
    assert!(fields_after(|j| j.task.resources.pids = Some(256)).is_empty());
    for bad in [0, drover_common::spec::MAX_PIDS + 1] {
        assert_eq!(
            fields_after(|j| j.task.resources.pids = Some(bad)),
            vec!["task.resources.pids"]
        );
    }
    assert!(message_after(|j| j.task.resources.pids = Some(0)).contains("from 1 to"));
}

#[test]
fn instances_are_bounded() {
    assert_eq!(fields_after(|j| j.instances = 0), vec!["instances"]);
    assert_eq!(fields_after(|j| j.instances = 10_001), vec!["instances"]);
    assert!(fields_after(|j| j.instances = 10_000).is_empty());
}

#[test]
fn cpu_must_be_finite_positive_and_bounded() {
    for bad in [f64::NAN, f64::INFINITY, 0.0, -1.0, 1024.5, 1e18] {
        assert_eq!(
            fields_after(|j| j.task.resources.cpu = bad),
            vec!["task.resources.cpu"],
            "{bad}"
        );
    }
    assert!(fields_after(|j| j.task.resources.cpu = 1024.0).is_empty());
    assert!(fields_after(|j| j.task.resources.cpu = 0.01).is_empty());
}

#[test]
fn ram_and_disk_must_be_positive_and_bounded() {
    assert_eq!(
        fields_after(|j| {
            j.task.resources.ram = ByteSize(0);
            j.task.resources.disk = ByteSize(0);
        }),
        vec!["task.resources.ram", "task.resources.disk"]
    );
    assert_eq!(
        fields_after(|j| {
            j.task.resources.ram = ByteSize(MAX_RAM.bytes() + 1);
            j.task.resources.disk = ByteSize(MAX_DISK.bytes() + 1);
        }),
        vec!["task.resources.ram", "task.resources.disk"]
    );
    assert!(fields_after(|j| {
        j.task.resources.ram = MAX_RAM;
        j.task.resources.disk = MAX_DISK;
    })
    .is_empty());
}

#[test]
fn port_names_are_unique_and_valid() {
    assert_eq!(
        fields_after(|j| j.task.resources.ports.push("http".into())),
        vec!["task.resources.ports[2]"]
    );
    assert_eq!(
        fields_after(|j| j.task.resources.ports.push("a b".into())),
        vec!["task.resources.ports[2]"]
    );
}

#[test]
fn a_task_needs_a_process_and_unique_process_names() {
    assert_eq!(
        fields_after(|j| {
            j.task.processes.clear();
            j.task.order.clear();
        }),
        vec!["task.processes"]
    );
    let message = message_after(|j| j.task.processes.push(process("setup")));
    assert_eq!(
        message,
        "`setup` is already the name of task.processes[0]; process names must be unique"
    );
}

#[test]
fn a_task_declares_at_most_max_processes() {
    let add = |j: &mut JobSpec, total: usize| {
        let template = j.task.processes[0].clone();
        for i in j.task.processes.len()..total {
            let mut p = template.clone();
            p.name = format!("worker-{i}");
            j.task.processes.push(p);
        }
    };
    assert_eq!(
        fields_after(|j| add(j, MAX_PROCESSES)),
        Vec::<String>::new()
    );
    let message = message_after(|j| add(j, 10_000));
    assert_eq!(
        message,
        format!("declares 10000 processes, more than the maximum of {MAX_PROCESSES}; start the workers from one process (e.g. a shell loop) instead of declaring each")
    );
    let mut job = base();
    add(&mut job, MAX_PROCESSES + 1);
    assert_eq!(validate(&job)[0].field, "task.processes");
}

#[test]
fn cmdlines_must_not_be_empty_or_hold_nul() {
    assert_eq!(
        fields_after(|j| j.task.processes[0].cmdline = "  ".into()),
        vec!["task.processes[0].cmdline"]
    );
    assert_eq!(
        fields_after(|j| j.task.processes[0].cmdline = "echo a\0b".into()),
        vec!["task.processes[0].cmdline"]
    );
}

#[test]
fn order_names_must_exist() {
    assert_eq!(
        fields_after(|j| j.task.order = vec![vec!["setup".into(), "sever".into()]]),
        vec!["task.order[0][1]"]
    );
    assert_eq!(
        fields_after(|j| j.task.order = vec![vec![]]),
        vec!["task.order[0]"]
    );
}

#[test]
fn order_cycles_are_reported_with_the_cycle() {
    let message = message_after(|j| {
        j.task.order = vec![
            vec!["setup".into(), "server".into()],
            vec!["server".into(), "setup".into()],
        ]
    });
    assert_eq!(
        message,
        "has a cycle server -> setup -> server; remove one of these orderings"
    );
    let message = message_after(|j| j.task.order = vec![vec!["setup".into(), "setup".into()]]);
    assert!(message.contains("setup -> setup"), "{message}");
}

#[test]
fn a_long_cycle_is_found_once() {
    let mut job = base();
    job.task.processes = (0..5).map(|i| process(&format!("p{i}"))).collect();
    job.task.order = vec![
        vec!["p0".into(), "p1".into(), "p2".into()],
        vec!["p2".into(), "p3".into(), "p4".into(), "p0".into()],
    ];
    let errors = validate(&job);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0]
        .message
        .contains("p0 -> p1 -> p2 -> p3 -> p4 -> p0"));
}

#[test]
fn final_processes_follow_thermos_rules() {
    let mut job = base();
    let mut cleanup = process("cleanup");
    cleanup.is_final = true;
    cleanup.daemon = true;
    cleanup.ephemeral = true;
    job.task.processes.push(cleanup);
    job.task.order.push(vec!["server".into(), "cleanup".into()]);
    let fields: Vec<String> = validate(&job).into_iter().map(|e| e.field).collect();
    assert_eq!(
        fields,
        vec![
            "task.processes[2].daemon",
            "task.processes[2].ephemeral",
            "task.order[1]"
        ]
    );

    let mut job = base();
    for name in ["flush", "report"] {
        let mut p = process(name);
        p.is_final = true;
        job.task.processes.push(p);
    }
    job.task.order.push(vec!["flush".into(), "report".into()]);
    assert_eq!(
        validate(&job),
        vec![],
        "finals may be ordered among themselves"
    );
}

#[test]
fn templates_name_known_variables_and_requested_ports() {
    assert_eq!(
        fields_after(|j| {
            j.task.processes[0].cmdline = "run {{ports.web}}".into();
            j.task.processes[1].cmdline = "run {{bogus}}".into();
            j.task.env.insert("X".into(), "{{unclosed".into());
        }),
        vec![
            "task.processes[0].cmdline",
            "task.processes[1].cmdline",
            "task.env.X"
        ]
    );
}

#[test]
fn env_keys_are_variable_names_and_drover_ones_are_reserved() {
    assert_eq!(
        fields_after(|j| {
            j.task.env.insert("1X".into(), "a".into());
            j.task.env.insert("A-B".into(), "a".into());
            j.task.env.insert("DROVER_ROLE".into(), "a".into());
        }),
        vec!["task.env.1X", "task.env.A-B", "task.env.DROVER_ROLE"]
    );
}

#[test]
fn http_and_tcp_checks_need_a_requested_port() {
    for kind in [HealthCheckType::Http, HealthCheckType::Tcp] {
        assert_eq!(
            fields_after(|j| {
                let hc = j.health_check.as_mut().unwrap();
                hc.kind = kind;
                hc.port = "health".into();
            }),
            vec!["health_check.port"]
        );
    }
}

#[test]
fn shell_checks_need_a_command_but_no_port() {
    assert_eq!(
        fields_after(|j| {
            let hc = j.health_check.as_mut().unwrap();
            hc.kind = HealthCheckType::Shell;
            hc.port = "nope".into();
        }),
        vec!["health_check.command"]
    );
    assert_eq!(
        fields_after(|j| {
            let hc = j.health_check.as_mut().unwrap();
            hc.kind = HealthCheckType::Shell;
            hc.command = Some("curl -fs localhost:{{ports.nope}}".into());
        }),
        vec!["health_check.command"]
    );
    assert!(fields_after(|j| {
        let hc = j.health_check.as_mut().unwrap();
        hc.kind = HealthCheckType::Shell;
        hc.command = Some("curl -fs localhost:{{ports.http}}/health".into());
    })
    .is_empty());
}

#[test]
fn health_check_counts_and_intervals_must_be_positive() {
    assert_eq!(
        fields_after(|j| {
            let hc = j.health_check.as_mut().unwrap();
            hc.min_consecutive_successes = 0;
            hc.interval = Duration::from_secs(0);
            hc.timeout = Duration::from_secs(0);
            hc.endpoint = "health".into();
            hc.expected_response_code = 42;
        }),
        vec![
            "health_check.endpoint",
            "health_check.expected_response_code",
            "health_check.min_consecutive_successes",
            "health_check.interval",
            "health_check.timeout"
        ]
    );
}

#[test]
fn lifecycle_port_must_be_requested() {
    assert_eq!(
        fields_after(|j| {
            j.lifecycle.as_mut().unwrap().http.as_mut().unwrap().port = "health".into();
        }),
        vec!["lifecycle.http.port"]
    );
    assert!(fields_after(|j| j.lifecycle = Some(Lifecycle { http: None })).is_empty());
}

#[test]
fn constraints_must_parse() {
    assert_eq!(
        fields_after(|j| {
            j.constraints.insert("rack".into(), "limit:0".into());
            j.constraints.insert("zone".into(), "a||b".into());
            j.constraints.insert("bad key".into(), "x".into());
        }),
        vec![
            "constraints[\"bad key\"]",
            "constraints.rack",
            "constraints.zone"
        ]
    );
}

#[test]
fn dedicated_is_role_slash_name_of_this_role() {
    for bad in ["hello", "www-data/", "!www-data/hello", "limit:1", "a/b/c"] {
        assert_eq!(
            fields_after(|j| {
                j.constraints.insert("dedicated".into(), bad.into());
            }),
            vec!["constraints.dedicated"],
            "{bad}"
        );
    }
    let message = message_after(|j| {
        j.constraints
            .insert("dedicated".into(), "other/hello".into());
    });
    assert!(message.contains("role `other`"), "{message}");
    assert!(fields_after(|j| {
        j.constraints.insert("dedicated".into(), "*/hello".into());
    })
    .is_empty());
}

#[test]
fn update_batch_size_must_be_positive() {
    assert_eq!(
        fields_after(|j| j.update.batch_size = 0),
        vec!["update.batch_size"]
    );
}

#[test]
fn running_as_root_needs_allow_root() {
    assert_eq!(
        fields_after(|j| {
            j.role = "root".into();
            j.constraints.remove("dedicated");
        }),
        vec!["role"]
    );
    assert_eq!(
        fields_after(|j| j.task.user = Some("root".into())),
        vec!["task.user"]
    );
    assert!(fields_after(|j| {
        j.task.user = Some("root".into());
        j.task.allow_root = true;
    })
    .is_empty());
}

#[test]
fn every_message_says_what_to_do() {
    let mut job = base();
    job.instances = 0;
    job.task.resources.cpu = f64::NAN;
    job.update.batch_size = 0;
    job.task.order = vec![vec!["setup".into(), "setup".into()]];
    for e in validate(&job) {
        assert!(
            ["use ", "add ", "remove ", "write ", "set ", "choose "]
                .iter()
                .any(|verb| e.message.contains(verb)),
            "{}: {}",
            e.field,
            e.message
        );
    }
}

#[test]
fn a_misspelt_template_port_gets_the_closest_requested_one() {
    let message = message_after(|j| j.task.processes[1].cmdline = "serve {{ports.htp}}".into());
    assert!(
        message.ends_with("; or did you mean `{{ports.http}}`?"),
        "{message}"
    );
}

#[test]
fn artifacts_need_a_checksum_over_http_and_a_destination_inside_the_sandbox() {
    use drover_common::spec::{Artifact, Extract};
    let art = |url: &str| Artifact {
        url: url.into(),
        sha256: Some("a".repeat(64)),
        dest: None,
        extract: Extract::Auto,
        mode: None,
        executable: false,
    };
    let with = |a: Artifact| fields_after(move |j| j.task.artifacts.push(a));
    assert_eq!(with(art("https://h/app.tar.gz")), Vec::<String>::new());
    let mut local = art("file:///opt/tool");
    local.sha256 = None;
    local.executable = true;
    assert_eq!(with(local), Vec::<String>::new());
    let mut unsummed = art("https://h/app.tar.gz");
    unsummed.sha256 = None;
    assert_eq!(with(unsummed.clone()), ["task.artifacts[0].sha256"]);
    let msg = message_after(|j| j.task.artifacts.push(unsummed));
    assert!(msg.contains("required"), "{msg}");
    let mut bad_sum = art("https://h/a");
    bad_sum.sha256 = Some("xyz".into());
    assert_eq!(with(bad_sum), ["task.artifacts[0].sha256"]);
    assert_eq!(with(art("ftp://h/a")), ["task.artifacts[0].url"]);
    assert_eq!(with(art("https://h/a.zip")), Vec::<String>::new());
    assert_eq!(with(art("https://h/a.tar.zst")), Vec::<String>::new());
    assert_eq!(
        with(art("https://h/a.tar.xz")),
        ["task.artifacts[0].extract"]
    );
    let mut xz_copied = art("https://h/a.tar.xz");
    xz_copied.extract = Extract::None;
    assert_eq!(with(xz_copied), Vec::<String>::new());
    let mut zip_mode = art("https://h/a.zip");
    zip_mode.mode = Some("0755".into());
    assert_eq!(with(zip_mode), ["task.artifacts[0].mode"]);
    for dest in ["/etc/x", "../x", "a/../../b"] {
        let mut a = art("https://h/a");
        a.dest = Some(dest.into());
        assert_eq!(with(a), ["task.artifacts[0].dest"], "{dest}");
    }
    let mut setuid = art("https://h/a");
    setuid.mode = Some("4755".into());
    assert_eq!(with(setuid), ["task.artifacts[0].mode"]);
    let mut archive_mode = art("https://h/a.tar");
    archive_mode.executable = true;
    assert_eq!(with(archive_mode), ["task.artifacts[0].executable"]);
}

#[test]
fn artifacts_parse_from_yaml() {
    let job = parse_job(
        "job.yaml",
        r#"
role: www-data
environment: prod
name: hello
task:
  processes: [{name: main, cmdline: ./app/run}]
  resources: {cpu: 0.5, ram: 128MiB, disk: 1GiB}
  artifacts:
    - {url: "https://h/app.tar.gz", sha256: "0000000000000000000000000000000000000000000000000000000000000000", dest: app}
    - {url: "file:///opt/tool", extract: none, mode: "0700"}
"#,
    )
    .unwrap();
    assert_eq!(job.task.artifacts.len(), 2);
    assert_eq!(validate(&job), vec![]);
}

#[test]
fn an_isolated_network_is_accepted_with_named_ports_which_are_forwarded() {
    use drover_common::spec::Network;
    let with_ports = fields_after(|j| j.task.network = Network::Isolated);
    assert!(with_ports.is_empty(), "{with_ports:?}");
    let ok = fields_after(|j| {
        j.task.network = Network::Isolated;
        j.task.resources.ports.clear();
        j.task.processes.truncate(1);
        j.task.order.clear();
        j.health_check = None;
        j.lifecycle = None;
    });
    assert!(ok.is_empty(), "{ok:?}");
    let parsed = parse_job(
        "job.yaml",
        "role: www-data\nenvironment: prod\nname: b\ntask:\n  processes: [{name: a, cmdline: 'true'}]\n  resources: {cpu: 1, ram: 1MiB, disk: 1MiB}\n  network: isolated\n",
    )
    .unwrap();
    assert_eq!(parsed.task.network, Network::Isolated);
    assert!(parse_job(
        "job.yaml",
        "role: www-data\nenvironment: prod\nname: b\ntask:\n  processes: [{name: a, cmdline: 'true'}]\n  resources: {cpu: 1, ram: 1MiB, disk: 1MiB}\n  network: bridge\n",
    )
    .is_err());
}

#[test]
fn a_quota_request_sets_resources_absent_ones_zero_or_removes_alone() {
    let set = SetQuotaRequest {
        cpu: Some(4.0),
        ram_bytes: Some(1 << 30),
        ..SetQuotaRequest::default()
    };
    assert_eq!(
        quota_request(&set),
        Ok(Some(QuotaResources {
            cpu: 4.0,
            ram_bytes: 1 << 30,
            disk_bytes: 0,
        }))
    );
    let remove = SetQuotaRequest::from(None);
    assert_eq!(quota_request(&remove), Ok(None));
    let both = SetQuotaRequest {
        cpu: Some(1.0),
        remove: true,
        ..SetQuotaRequest::default()
    };
    assert_eq!(quota_request(&both).unwrap_err().field, "remove");
    for cpu in [-1.0, f64::NAN, f64::INFINITY] {
        let bad = SetQuotaRequest {
            cpu: Some(cpu),
            ..SetQuotaRequest::default()
        };
        let err = quota_request(&bad).unwrap_err();
        assert_eq!(err.field, "cpu");
        assert!(err.message.contains("0 or more cores"), "{}", err.message);
    }
}

fn announce(primary: &str, ports: &[&str]) -> drover_common::spec::Announce {
    drover_common::spec::Announce {
        primary_port: primary.to_string(),
        ports: ports.iter().map(|p| p.to_string()).collect(),
        name: None,
        drain_delay: Duration::from_secs(5),
    }
}

#[test]
fn announce_names_declared_ports_with_a_suggestion() {
    assert_eq!(
        fields_after(|j| j.announce = Some(announce("http", &["admin"]))),
        Vec::<String>::new()
    );
    let m = message_after(|j| j.announce = Some(announce("htp", &[])));
    assert!(
        m.contains("`htp` is not a port") && m.contains("did you mean `http`"),
        "{m}"
    );
    assert_eq!(
        fields_after(|j| j.announce = Some(announce("http", &["admni", "grpc"]))),
        vec!["announce.ports[0]", "announce.ports[1]"]
    );
    let m = message_after(|j| {
        j.task.resources.ports.clear();
        j.task.processes[1].cmdline = "./serve".to_string();
        j.health_check = None;
        j.lifecycle = None;
        j.announce = Some(announce("http", &[]));
    });
    assert!(m.contains("declares no ports"), "{m}");
}

#[test]
fn announced_names_are_dns_labels() {
    let m = message_after(|j| {
        let mut a = announce("http", &[]);
        a.name = Some("Web_API".to_string());
        j.announce = Some(a);
    });
    assert!(m.contains("not a DNS label"), "{m}");
    // Without announce.name the job's name is announced.
    assert_eq!(
        fields_after(|j| {
            j.name = "hello_world".to_string();
            j.announce = Some(announce("http", &[]));
        }),
        vec!["name"]
    );
    // Role and environment are part of the service's DNS name.
    assert_eq!(
        fields_after(|j| {
            j.role = "www_data".to_string();
            j.constraints.remove("dedicated");
            j.environment = "Prod".to_string();
            j.announce = Some(announce("http", &[]));
        }),
        vec!["role", "environment"]
    );
    // Not announced: the same names are fine.
    assert_eq!(
        fields_after(|j| j.name = "hello_world".to_string()),
        Vec::<String>::new()
    );
}

#[test]
fn the_drain_delay_is_bounded() {
    let m = message_after(|j| {
        let mut a = announce("http", &[]);
        a.drain_delay = Duration::from_secs(3600);
        j.announce = Some(a);
    });
    assert!(m.contains("at most 600s"), "{m}");
}

#[test]
fn announce_parses_with_its_default_drain_delay() {
    let mut text = serde_yaml::to_string(&base()).unwrap();
    text.push_str("announce: {primary_port: http, ports: [admin]}\n");
    let job = parse_job("job.yaml", &text).unwrap();
    let a = job.announce.unwrap();
    assert_eq!(a.drain_delay, Duration::from_secs(5));
    assert_eq!(a.ports, vec!["admin"]);
    let err = parse_job(
        "job.yaml",
        &format!(
            "{}announce: {{primary_port: http, prots: [admin]}}\n",
            serde_yaml::to_string(&base()).unwrap()
        ),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("prots"), "{err}");
}
