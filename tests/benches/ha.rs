//! Failover time of masters on etcd (issue 21): a real 3-member etcd, 3 masters
//! and an agent; the leader is killed with SIGKILL and the time until another
//! master acknowledges a job (a write committed to etcd) is measured, `BENCH_RUNS`
//! times (default 20); prints the median and the max. The killed master is
//! started again (as a standby) before the next run.
//!
//! Not run in CI: `cargo bench -p drover-tests --bench ha` (root: the agent's
//! tasks run as another user). The lease TTL is the master's default (2 s).

use std::time::{Duration, Instant};

use drover_tests::ha::{HaCluster, Outcome, Submitter};
use drover_tests::{command_job, WAIT};
use reqwest::Method;

fn main() -> anyhow::Result<()> {
    if std::env::args().any(|a| a == "--list") {
        return Ok(());
    }
    let runs = drover_tests::env_number("BENCH_RUNS", 20);
    let mut cluster = HaCluster::start(3)?;
    let mut submit = Submitter::new(&cluster)?;
    let mut times = Vec::new();
    for run in 0..runs {
        let leader = cluster.wait_leader(WAIT)?;
        let spec = command_job(&format!("before{run}"), 1, false, "true");
        if !matches!(
            submit.until_done(Method::POST, "/v1/jobs", Some(&spec), WAIT),
            Outcome::Ok(_)
        ) {
            anyhow::bail!("the leader does not take writes\n{}", cluster.diagnostics());
        }
        cluster.kill_master(leader);
        let killed = Instant::now();
        let spec = command_job(&format!("after{run}"), 1, false, "true");
        loop {
            if let Outcome::Ok(_) = submit.once(Method::POST, "/v1/jobs", Some(&spec)) {
                break;
            }
            if killed.elapsed() > WAIT {
                anyhow::bail!("no master took writes\n{}", cluster.diagnostics());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let took = killed.elapsed();
        println!("run {run}: master {leader} killed, writes served again after {took:.2?}");
        times.push(took);
        cluster.start_master(leader)?;
        std::thread::sleep(Duration::from_millis(500));
    }
    times.sort();
    println!(
        "failover (leader SIGKILL -> a job acknowledged by the new leader), {} runs: median {:.2?}, max {:.2?}, min {:.2?}",
        times.len(),
        times[times.len() / 2],
        times[times.len() - 1],
        times[0]
    );
    Ok(())
}
