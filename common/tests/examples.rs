//! Every file in examples/ parses and validates, so the examples the README and docs
//! point at never rot.

#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

use std::path::PathBuf;

use drover_common::parse::parse_job;
use drover_common::spec::HealthCheckType;
use drover_common::JobSpec;

fn examples_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

fn example(name: &str) -> JobSpec {
    let path = examples_dir().join(name);
    let text = std::fs::read_to_string(&path).unwrap();
    parse_job(name, &text).unwrap_or_else(|e| panic!("{}:\n{e}", path.display()))
}

#[test]
fn every_example_parses_and_validates() {
    let mut checked = 0;
    for entry in std::fs::read_dir(examples_dir()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if !matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml" | "toml" | "json")
        ) {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        if let Err(e) = parse_job(&name, &text) {
            panic!("{} does not validate:\n{e}", path.display());
        }
        checked += 1;
    }
    assert!(
        checked >= 3,
        "expected at least three examples, found {checked}"
    );
}

#[test]
fn hello_world_is_a_one_instance_http_checked_service_run_as_www_data() {
    let job = example("hello_world.yaml");
    assert_eq!(job.key().to_string(), "www-data/devel/hello");
    assert!(job.service);
    assert_eq!(job.instances, 1);
    assert_eq!(job.run_as_user(), "www-data");
    assert_eq!(job.task.resources.ports, vec!["http".to_string()]);
    let hc = job.health_check.as_ref().unwrap();
    assert_eq!(hc.kind, HealthCheckType::Http);
    assert_eq!(hc.port, "http");
    assert_eq!(hc.endpoint, "/health");
    assert_eq!(hc.interval.get(), std::time::Duration::from_secs(1));
    let http = job.lifecycle.as_ref().unwrap().http.as_ref().unwrap();
    assert_eq!(http.port, "http");
    assert_eq!(http.graceful_shutdown_endpoint, "/quitquitquit");
    assert!(job.task.processes[0].cmdline.contains("{{ports.http}}"));
}

#[test]
fn multi_process_orders_processes_and_has_a_final_one() {
    let job = example("multi_process.yaml");
    assert_eq!(
        job.task.order,
        vec![vec!["prepare".to_string(), "serve".to_string()]]
    );
    assert!(job.task.processes.iter().any(|p| p.is_final));
}

#[test]
fn batch_is_not_a_service_and_has_several_instances() {
    let job = example("batch.yaml");
    assert!(!job.service);
    assert!(job.instances > 1);
}

#[test]
fn cron_is_a_batch_job_on_a_schedule_the_master_accepts() {
    let job = example("cron.yaml");
    assert!(!job.service);
    assert!(drover_common::cron::job_schedule(&job, false)
        .unwrap()
        .is_some());
}

#[test]
fn rolling_update_replaces_one_instance_at_a_time_and_rolls_back() {
    let job = example("rolling_update.yaml");
    assert!(job.service && job.instances > 1);
    assert_eq!(job.update.batch_size, 1);
    assert!(job.update.rollback_on_failure);
}

#[test]
fn drain_has_an_sla_policy_of_one_disrupted_instance() {
    let job = example("drain.yaml");
    assert_eq!(
        job.sla_policy.as_ref().and_then(|p| p.max_disrupted),
        Some(1)
    );
}
