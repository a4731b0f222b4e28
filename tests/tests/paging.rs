//! Black-box: `drover job status` of a job of 10,000 instances (the spec's
//! maximum) against the real master binary, no agents (every instance PENDING).
//! It shows the whole job's summary and the first 100 instances, quickly; `--all`
//! pages through every instance; an instance set shows just those.

use std::time::{Duration, Instant};

use drover_tests::{command_job, Cluster, ClusterConfig};

const KEY: &str = "www-data/test/big";

fn stdout(out: &std::process::Output) -> String {
    assert!(
        out.status.success(),
        "drover failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The instance rows of a status table (lines that start with a number).
fn rows(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| {
            l.split_whitespace()
                .next()
                .is_some_and(|w| w.parse::<u32>().is_ok())
        })
        .collect()
}

#[test]
fn job_status_of_ten_thousand_instances_shows_the_summary_and_a_page_quickly() {
    let cluster = Cluster::start(ClusterConfig::agents(0)).unwrap();
    cluster
        .create_job(&command_job("big", 10_000, false, "sleep 1"))
        .unwrap();

    // The best of three runs: the machine is shared, one run may be descheduled.
    let mut best = Duration::MAX;
    let mut text = String::new();
    for _ in 0..3 {
        let started = Instant::now();
        let out = cluster.drover(&["job", "status", KEY]).unwrap();
        best = best.min(started.elapsed());
        text = stdout(&out);
    }
    eprintln!("drover job status of 10,000 instances: best of 3 {best:?}");
    assert!(
        text.starts_with(&format!("{KEY}: 10000 instance(s), batch; PENDING 10000")),
        "{text}"
    );
    assert!(
        text.contains("(10000 instance(s))"),
        "the config count: {text}"
    );
    assert_eq!(rows(&text).len(), 100, "{text}");
    assert!(
        text.contains("instances 0-99 shown of 10000: `drover job status www-data/test/big --all`"),
        "{text}"
    );
    // Generous for a debug build on a shared machine; the figure is printed above.
    assert!(best < Duration::from_secs(3), "job status took {best:?}");

    let started = Instant::now();
    let all = stdout(&cluster.drover(&["job", "status", KEY, "--all"]).unwrap());
    eprintln!("drover job status --all: {:?}", started.elapsed());
    assert_eq!(rows(&all).len(), 10_000);
    assert!(!all.contains("shown of"), "--all shows every one");

    let some = stdout(
        &cluster
            .drover(&["job", "status", &format!("{KEY}/0,5000-5001,9999")])
            .unwrap(),
    );
    let numbers: Vec<&str> = rows(&some)
        .iter()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(numbers, vec!["0", "5000", "5001", "9999"], "{some}");
}
