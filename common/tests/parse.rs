//! parse_job and parse_job_json: formats by extension, syntax errors with line and
//! column, unknown fields with suggestions, wrong types and missing fields with field
//! paths, and every problem reported at once.

#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

use drover_common::parse::{known_field_paths, parse_job, parse_job_json, SpecErrors};
use drover_common::spec::{
    Affinity, CronCollisionPolicy, HealthCheck, HealthCheckType, HttpLifecycle, JobSpec, Lifecycle,
    PartitionPolicy, PlacementStrategy, ProcessSpec, Resources, SlaPolicy, Spread, TaskSpec, Tier,
    UpdateConfig,
};
use drover_common::units::{ByteSize, Duration};

const VALID_YAML: &str = r#"
role: www-data
environment: prod
name: hello
instances: 2
service: true
task:
  processes:
    - name: server
      cmdline: serve --port {{ports.http}}
  resources:
    cpu: 0.5
    ram: 128MiB
    disk: 1GiB
    ports: [http]
health_check:
  port: http
"#;

fn errors(source: &str, text: &str) -> SpecErrors {
    match parse_job(source, text) {
        Ok(job) => panic!("expected errors, got {job:#?}"),
        Err(e) => e,
    }
}

fn fields(e: &SpecErrors) -> Vec<&str> {
    e.errors.iter().map(|e| e.field.as_str()).collect()
}

/// Every field set to a value different from its default.
fn full_job() -> JobSpec {
    JobSpec {
        role: "www-data".into(),
        environment: "prod".into(),
        name: "full".into(),
        instances: 3,
        // A cron job (below), so not a service: the master refuses a cron service.
        service: false,
        tier: Tier::Preemptible,
        max_task_failures: 4,
        constraints: [("rack".to_string(), "limit:2".into())]
            .into_iter()
            .collect(),
        spread: Some(vec![Spread {
            attribute: "zone".into(),
            weight: 30,
        }]),
        affinity: Some(vec![Affinity {
            attribute: "disk".into(),
            value: "!hdd".into(),
            weight: -40,
        }]),
        placement: Some(PlacementStrategy::Binpack),
        task: TaskSpec {
            processes: vec![
                ProcessSpec {
                    name: "setup".into(),
                    cmdline: "echo {{instance}}".into(),
                    max_failures: 3,
                    daemon: false,
                    ephemeral: false,
                    min_duration: Duration::from_secs(2),
                    is_final: false,
                },
                ProcessSpec {
                    name: "server".into(),
                    cmdline: "serve {{ports.http}}".into(),
                    max_failures: 0,
                    daemon: true,
                    ephemeral: true,
                    min_duration: Duration::from_millis(1500),
                    is_final: false,
                },
            ],
            order: vec![vec!["setup".into(), "server".into()]],
            resources: Resources {
                cpu: 1.5,
                ram: ByteSize::mib(256),
                disk: ByteSize(1 << 30),
                ports: vec!["http".into(), "admin".into()],
                pids: Some(256),
            },
            max_failures: 2,
            max_concurrency: 1,
            finalization_wait: Duration::from_secs(10),
            user: Some("nobody".into()),
            allow_root: true,
            env: [("LOG".to_string(), "{{sandbox}}/log".to_string())]
                .into_iter()
                .collect(),
            artifacts: vec![drover_common::spec::Artifact {
                url: "https://h/app.tar.gz".into(),
                sha256: Some("0".repeat(64)),
                dest: Some("app".into()),
                extract: drover_common::spec::Extract::Auto,
                mode: None,
                executable: false,
            }],
            network: Default::default(),
        },
        health_check: Some(HealthCheck {
            kind: HealthCheckType::Http,
            port: "admin".into(),
            endpoint: "/ready".into(),
            expected_response: "yes".into(),
            expected_response_code: 204,
            command: Some("true".into()),
            initial_interval: Duration::from_secs(3),
            interval: Duration::from_secs(4),
            timeout: Duration::from_secs(2),
            max_consecutive_failures: 5,
            min_consecutive_successes: 2,
        }),
        lifecycle: Some(Lifecycle {
            http: Some(HttpLifecycle {
                port: "admin".into(),
                graceful_shutdown_endpoint: "/q".into(),
                shutdown_endpoint: "/a".into(),
                graceful_shutdown_wait: Duration::from_secs(1),
                shutdown_wait: Duration::from_secs(2),
            }),
        }),
        update: UpdateConfig {
            batch_size: 2,
            watch: Duration::from_secs(30),
            max_per_instance_failures: 1,
            max_total_failures: 2,
            rollback_on_failure: false,
        },
        partition_policy: PartitionPolicy {
            reschedule: false,
            delay: Duration::from_secs(60),
            exclusive: true,
        },
        priority: 7,
        cron_schedule: Some("*/5 * * * *".into()),
        cron_timezone: Some("Europe/Paris".into()),
        cron_collision_policy: CronCollisionPolicy::CancelNew,
        sla_policy: Some(SlaPolicy {
            min_healthy: Some(2),
            min_healthy_percent: None,
            min_time: Duration::from_secs(10),
            max_disrupted: None,
        }),
        announce: Some(drover_common::spec::Announce {
            primary_port: "http".into(),
            ports: vec!["admin".into()],
            name: Some("hello-web".into()),
            drain_delay: Duration::from_secs(3),
        }),
    }
}

#[test]
fn a_valid_spec_parses_in_every_format_to_the_same_job() {
    let job = full_job();
    let json = serde_json::to_string_pretty(&job).unwrap();
    let yaml = serde_yaml::to_string(&job).unwrap();
    let toml = toml::to_string(&job).unwrap();
    assert_eq!(parse_job("job.json", &json).unwrap(), job);
    assert_eq!(parse_job_json(&json).unwrap(), job);
    assert_eq!(parse_job("job.yaml", &yaml).unwrap(), job);
    assert_eq!(parse_job("job.yml", &yaml).unwrap(), job);
    assert_eq!(parse_job("job.toml", &toml).unwrap(), job);
}

#[test]
fn the_schema_knows_exactly_the_fields_spec_rs_serializes() {
    fn collect(value: &serde_json::Value, prefix: &str, out: &mut Vec<String>) {
        let serde_json::Value::Object(map) = value else {
            return;
        };
        for (k, v) in map {
            // Map-valued fields hold user keys, not field names.
            let path = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            out.push(path.clone());
            if path == "constraints" || path == "task.env" {
                continue;
            }
            match v {
                serde_json::Value::Object(_) => collect(v, &path, out),
                serde_json::Value::Array(items) => {
                    if let Some(first @ serde_json::Value::Object(_)) = items.first() {
                        collect(first, &format!("{path}[]"), out);
                    }
                }
                _ => {}
            }
        }
    }
    let mut serialized = Vec::new();
    // Not the default, which is left out when serialized.
    let mut job = full_job();
    job.task.network = drover_common::spec::Network::Isolated;
    collect(&serde_json::to_value(job).unwrap(), "", &mut serialized);
    let mut known = known_field_paths();
    serialized.sort();
    known.sort();
    assert_eq!(known, serialized);
}

#[test]
fn defaults_follow_aurora() {
    let job = parse_job("job.yaml", VALID_YAML).unwrap();
    assert_eq!(job.max_task_failures, 1);
    assert_eq!(job.tier, Tier::Preferred);
    assert_eq!(job.task.max_failures, 1);
    assert_eq!(job.task.finalization_wait, Duration::from_secs(30));
    assert_eq!(job.task.processes[0].max_failures, 1);
    assert_eq!(job.task.processes[0].min_duration, Duration::from_secs(5));
    let hc = job.health_check.unwrap();
    assert_eq!(hc.initial_interval, Duration::from_secs(15));
    assert_eq!(hc.interval, Duration::from_secs(10));
    assert_eq!(hc.timeout, Duration::from_secs(1));
    assert_eq!(hc.endpoint, "/health");
    assert_eq!(hc.expected_response, "ok");
    assert_eq!(job.update.batch_size, 1);
    assert_eq!(job.update.watch, Duration::from_secs(45));
    assert!(job.update.rollback_on_failure);
    assert!(job.partition_policy.reschedule);
}

#[test]
fn a_spec_with_five_mistakes_gets_exactly_five_errors_with_paths() {
    let text = r#"
role: www-data
environment: prod
name: hello
instances: 0
task:
  processes:
    - name: setup
      cmdline: ./install.sh
    - name: server
      cmdline: ./serve --port {{ports.htp}}
      daemn: true
  resources:
    cpu: 0.5
    ram: 128MiB
    disk: 1GiB
    ports: [http]
health_check:
  port: admin
constraints:
  rack: "limit:0"
"#;
    let e = errors("job.yaml", text);
    let mut got = fields(&e);
    got.sort();
    assert_eq!(
        got,
        vec![
            "constraints.rack",
            "health_check.port",
            "instances",
            "task.processes[1].cmdline",
            "task.processes[1].daemn",
        ],
        "{e}"
    );
    assert_eq!(e.to_string().lines().count(), 5);
    assert!(
        e.to_string().contains("daemon"),
        "suggests the closest name: {e}"
    );
}

#[test]
fn a_missing_field_next_to_a_misspelt_one_is_reported_once_with_the_suggestion() {
    let text = VALID_YAML.replace("cmdline:", "cmdlin:");
    let e = errors("job.yaml", &text);
    assert_eq!(
        fields(&e),
        vec!["task.processes[0].cmdlin", "task.processes[0].cmdline"],
        "{e}"
    );
    assert!(
        e.errors[0].message.contains("did you mean `cmdline`?"),
        "{e}"
    );
    assert!(e.errors[1].message.contains("missing"), "{e}");
}

#[test]
fn unknown_fields_get_the_closest_known_name() {
    let text = VALID_YAML.replace("instances:", "instnaces:");
    let e = errors("job.yaml", &text);
    assert_eq!(fields(&e), vec!["instnaces"]);
    assert_eq!(
        e.errors[0].message,
        "unknown field `instnaces`; did you mean `instances`?"
    );
}

#[test]
fn an_unknown_field_that_lives_elsewhere_says_where() {
    let text = format!("{VALID_YAML}cpu: 2\n");
    let e = errors("job.yaml", &text);
    assert_eq!(fields(&e), vec!["cpu"]);
    assert!(
        e.errors[0].message.contains("`task.resources`"),
        "{}",
        e.errors[0].message
    );
}

#[test]
fn an_unknown_field_far_from_any_name_lists_the_known_ones() {
    let text = format!("{VALID_YAML}zzzzzz: 2\n");
    let e = errors("job.yaml", &text);
    assert!(
        e.errors[0].message.contains("known fields here: role"),
        "{e}"
    );
}

#[test]
fn yaml_syntax_errors_show_line_and_column() {
    let e = errors("job.yaml", "role: www-data\nname: [a, b\nenvironment: x\n");
    assert_eq!(e.errors.len(), 1);
    assert_eq!(e.errors[0].field, "");
    assert!(
        e.errors[0]
            .message
            .starts_with("YAML syntax error at line 3, column"),
        "{e}"
    );
}

#[test]
fn toml_syntax_errors_show_line_and_column() {
    let e = errors("job.toml", "role = \"www-data\"\nname = \n");
    assert_eq!(e.errors.len(), 1);
    assert_eq!(
        e.errors[0].message,
        "TOML syntax error at line 2, column 8: invalid string; expected `\"`, `'`"
    );
}

#[test]
fn json_syntax_errors_show_line_and_column() {
    let e = errors("job.json", "{\"role\": \"www-data\",\n \"name\": }");
    assert_eq!(
        e.errors[0].message,
        "JSON syntax error at line 2, column 10: expected value"
    );
    let e = parse_job_json("").unwrap_err();
    assert!(e.errors[0]
        .message
        .starts_with("JSON syntax error at line 1"));
}

#[test]
fn an_unknown_extension_names_the_accepted_ones() {
    let e = errors("job.txt", VALID_YAML);
    assert_eq!(
        e.to_string(),
        "`job.txt` has no job spec extension; name the file with .yaml, .yml, .toml or .json"
    );
}

#[test]
fn wrong_types_name_the_path_and_what_was_expected() {
    let text = VALID_YAML
        .replace("instances: 2", "instances: two")
        .replace("service: true", "service: yes")
        .replace("cpu: 0.5", "cpu: \"0.5\"")
        .replace("ram: 128MiB", "ram: 128")
        .replace("ports: [http]", "ports: http");
    let e = errors("job.yaml", &text);
    assert_eq!(
        fields(&e),
        vec![
            "instances",
            "service",
            "task.resources.cpu",
            "task.resources.ram",
            "task.resources.ports",
        ],
        "{e}"
    );
    assert_eq!(
        e.errors[0].message,
        "expected a whole number from 0 to 4294967295, found the text \"two\""
    );
    assert_eq!(
        e.errors[1].message,
        "expected true or false, found the text \"yes\""
    );
}

#[test]
fn numbers_where_text_is_expected_suggest_quotes() {
    let text = VALID_YAML.replace("environment: prod", "environment: 2024");
    let e = errors("job.yaml", &text);
    assert_eq!(fields(&e), vec!["environment"]);
    assert!(e.errors[0].message.contains("quotes"), "{e}");
}

#[test]
fn missing_required_fields_are_reported_by_path() {
    let text = r#"{"role": "www-data", "task": {"processes": [{"name": "a"}]}}"#;
    let e = parse_job_json(text).unwrap_err();
    assert_eq!(
        fields(&e),
        vec![
            "task.processes[0].cmdline",
            "task.resources",
            "environment",
            "name",
        ],
        "{e}"
    );
}

#[test]
fn a_non_mapping_list_item_keeps_the_indices_of_the_others() {
    let text = VALID_YAML.replace(
        "    - name: server\n",
        "    - just a string\n    - name: server\n",
    );
    let e = errors("job.yaml", &text);
    assert_eq!(fields(&e), vec!["task.processes[0]"], "{e}");
}

#[test]
fn duplicate_keys_are_errors() {
    let text = r#"{"role": "a", "role": "b", "environment": "prod", "name": "n",
        "task": {"processes": [{"name": "p", "cmdline": "true"}],
                 "resources": {"cpu": 1, "ram": "1MiB", "disk": "1MiB"}}}"#;
    let e = parse_job_json(text).unwrap_err();
    assert_eq!(fields(&e), vec!["role"]);
}

#[test]
fn null_clears_optional_sections() {
    let text = format!("{VALID_YAML}lifecycle: null\n")
        .replace("health_check:\n  port: http\n", "health_check:\n");
    let job = parse_job("job.yaml", &text).unwrap();
    assert_eq!(job.health_check, None);
    assert_eq!(job.lifecycle, None);
}

#[test]
fn non_finite_cpu_is_refused_in_yaml() {
    let e = errors("job.yaml", &VALID_YAML.replace("cpu: 0.5", "cpu: .nan"));
    assert_eq!(fields(&e), vec!["task.resources.cpu"]);
    let e = errors("job.yaml", &VALID_YAML.replace("cpu: 0.5", "cpu: 1e18"));
    assert_eq!(fields(&e), vec!["task.resources.cpu"]);
}

#[test]
fn enum_values_get_suggestions() {
    let text = VALID_YAML.replace("  port: http", "  port: http\n  type: htp");
    let e = errors("job.yaml", &text);
    assert_eq!(fields(&e), vec!["health_check.type"]);
    assert!(e.errors[0].message.contains("did you mean `http`?"), "{e}");
}

#[test]
fn bad_durations_and_sizes_say_how_to_write_them() {
    let text = format!("{VALID_YAML}  interval: 10\n  timeout: 5y\n");
    let e = errors("job.yaml", &text);
    assert_eq!(
        fields(&e),
        vec!["health_check.interval", "health_check.timeout"],
        "{e}"
    );
    assert!(e.errors[0].message.contains("\"30s\""), "{e}");
    assert!(e.errors[1].message.contains("unknown unit `y`"), "{e}");
}

#[test]
fn display_prints_one_line_per_error_with_its_path() {
    let text = VALID_YAML
        .replace("instances: 2", "instances: 0")
        .replace("name: server", "name: \"a/b\"");
    let e = errors("job.yaml", &text);
    let shown = e.to_string();
    let lines: Vec<&str> = shown.lines().collect();
    assert_eq!(lines.len(), 2, "{shown}");
    assert!(lines[0].starts_with("instances: is 0; use a number from 1 to 10000"));
    assert!(lines[1].starts_with("task.processes[0].name: `a/b` is not a valid name"));
}

#[test]
fn odd_map_keys_are_quoted_in_paths() {
    let text = format!("{VALID_YAML}constraints:\n  \"a b\": x\n");
    let e = errors("job.yaml", &text);
    assert_eq!(fields(&e), vec!["constraints[\"a b\"]"], "{e}");
}

#[test]
fn toml_date_times_are_type_errors_not_crashes() {
    let toml = toml::to_string(&full_job())
        .unwrap()
        .replace("name = \"full\"", "name = 1979-05-27T07:32:00Z");
    let e = errors("job.toml", &toml);
    assert_eq!(fields(&e), vec!["name"]);
    assert!(e.errors[0].message.contains("date-time"));
}

#[test]
fn errors_print_one_line_each_even_when_values_hold_line_breaks() {
    let text = r#"{"role": "a\nb", "environment": "prod", "name": "n",
        "task": {"processes": [{"name": "p\r\nq", "cmdline": "{{x\ny}}"}],
                 "resources": {"cpu": 1, "ram": "1MiB", "disk": "1MiB"}},
        "tier": "pre\nferred"}"#;
    let e = parse_job_json(text).unwrap_err();
    assert_eq!(e.errors.len(), 4, "{e}");
    assert_eq!(e.to_string().lines().count(), 4, "{e}");
}

#[test]
fn sla_policy_mistakes_name_their_fields() {
    let with = |policy: &str| format!("{VALID_YAML}sla_policy:\n{policy}");
    let e = errors("job.yaml", &with("  min_healthy: 3\n  max_disrupted: 1\n"));
    assert_eq!(fields(&e), vec!["sla_policy", "sla_policy.min_healthy"]);
    assert!(e.errors[0].message.contains("keep one"), "{e}");
    let e = errors("job.yaml", &with("  min_time: 10s\n"));
    assert_eq!(fields(&e), vec!["sla_policy"]);
    let e = errors("job.yaml", &with("  min_healthy_percent: 120\n"));
    assert_eq!(fields(&e), vec!["sla_policy.min_healthy_percent"]);
    let e = errors("job.yaml", &with("  max_disrupted: 0\n"));
    assert_eq!(fields(&e), vec!["sla_policy.max_disrupted"]);
    let e = errors("job.yaml", &with("  max_disrupted: 1\n  min_time: 5s\n"));
    assert_eq!(fields(&e), vec!["sla_policy.min_time"]);
    let e = errors("job.yaml", &with("  min_healthy: two\n"));
    assert_eq!(fields(&e)[0], "sla_policy.min_healthy");
    let job = parse_job(
        "job.yaml",
        &with("  min_healthy_percent: 50\n  min_time: 30s\n"),
    )
    .expect("a valid policy parses");
    let p = job.sla_policy.expect("the policy is kept");
    assert_eq!(p.min_healthy_percent, Some(50));
    assert_eq!(p.min_time, Duration::from_secs(30));
}

#[test]
fn soft_placement_fields_are_read_from_files_and_bad_weights_named() {
    let text = format!(
        "{VALID_YAML}placement: binpack\nspread:\n  - attribute: rack\naffinity:\n  - {{attribute: disk, value: hdd, weight: -30}}\n"
    );
    let job = parse_job("job.yaml", &text).expect("soft placement fields parse");
    assert_eq!(job.placement, Some(PlacementStrategy::Binpack));
    assert_eq!(job.spread.as_ref().map(|s| s[0].weight), Some(50));
    assert_eq!(job.affinity.as_ref().map(|a| a[0].weight), Some(-30));

    let text = format!("{VALID_YAML}affinity:\n  - {{attribute: disk, value: hdd, weight: 2.5}}\n");
    let e = errors("job.yaml", &text);
    assert_eq!(fields(&e), vec!["affinity[0].weight"], "{e}");
    assert!(e.errors[0].message.contains("whole number"), "{e}");

    let text =
        format!("{VALID_YAML}affinity:\n  - {{attribute: disk, value: hdd, weight: -101}}\n");
    let e = errors("job.yaml", &text);
    assert_eq!(fields(&e), vec!["affinity[0].weight"], "{e}");
}
