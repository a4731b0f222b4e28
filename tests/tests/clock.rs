//! Wall clock steps (issue 15): Debian's libfaketime preloaded into the master or one
//! agent, its offset read from a file the test rewrites mid-run
//! (`FAKETIME_TIMESTAMP_FILE`, `FAKETIME_NO_CACHE`), the monotonic clock left alone
//! (`FAKETIME_DONT_FAKE_MONOTONIC`). A step of 10 minutes either way must lose no
//! task and replace none, and keep every agent reachable; an agent killed while the
//! master's clock is stepped back is still found within the agent timeout. Skips with
//! a message where libfaketime is not installed (scripts/setup.sh installs it).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use drover_common::state::{now_ms, TaskState};
use drover_tests::{command_job, Cluster, ClusterConfig, WAIT};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

const KEY: &str = "www-data/test/steady";

/// How long the tests watch after the step: three agent timeouts of the test config.
const WATCH: Duration = Duration::from_secs(15);

/// libfaketime's preload library, if installed.
fn libfaketime(test: &str) -> Option<PathBuf> {
    let found = std::fs::read_dir("/usr/lib")
        .ok()?
        .flatten()
        .map(|e| e.path().join("faketime/libfaketime.so.1"))
        .find(|p| p.exists());
    if found.is_none() {
        eprintln!("SKIP {test}: libfaketime is not installed (run scripts/setup.sh)");
    }
    found
}

/// libfaketime's environment: the offset comes from `offset_file`, re-read on every
/// call; the monotonic clock is not faked.
fn faketime_env(lib: &Path, offset_file: &Path) -> Vec<(String, String)> {
    [
        ("LD_PRELOAD", lib.display().to_string()),
        ("FAKETIME_TIMESTAMP_FILE", offset_file.display().to_string()),
        ("FAKETIME_NO_CACHE", "1".to_string()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// (task id, agent id) of each instance.
type Tasks = Vec<(String, String)>;

/// Which process gets the fake clock.
#[derive(Clone, Copy, Debug)]
enum Faked {
    Master,
    Agent0,
}

/// Two agents running one instance each of a two-instance service, the fake clock
/// in `faked` at offset 0; returns the cluster, the offset file and the tasks.
fn cluster_with_fake_clock(lib: &Path, faked: Faked) -> anyhow::Result<(Cluster, Offset, Tasks)> {
    let dir = tempfile::Builder::new()
        .prefix("drover-faketime-")
        .tempdir()?;
    let offset_file = dir.path().join("offset");
    std::fs::write(&offset_file, "+0\n")?;
    let env = faketime_env(lib, &offset_file);
    let mut config = ClusterConfig::agents(2);
    match faked {
        Faked::Master => config.master_env = env,
        Faked::Agent0 => config.agent_env = vec![env],
    }
    let mut cluster = Cluster::start(config)?;
    cluster.create_job(&command_job("steady", 2, true, "exec sleep 100000"))?;
    let view = cluster.wait_for_all(KEY, TaskState::Running)?;
    let tasks = view
        .instances
        .iter()
        .filter_map(|i| i.current.as_ref())
        .map(|t| (t.task_id.clone(), t.agent_id.clone().unwrap_or_default()))
        .collect::<Vec<_>>();
    anyhow::ensure!(tasks.len() == 2, "{tasks:?}");
    Ok((
        cluster,
        Offset {
            file: offset_file,
            _dir: dir,
        },
        tasks,
    ))
}

/// The file libfaketime reads its offset from (e.g. `+600`, `-600` seconds).
struct Offset {
    file: PathBuf,
    _dir: tempfile::TempDir,
}

impl Offset {
    fn set(&self, offset: &str) -> std::io::Result<()> {
        std::fs::write(&self.file, format!("{offset}\n"))
    }
}

/// For `WATCH` after the step: every agent stays reachable, and then the same tasks
/// still run, none LOST, nothing replaced.
fn nothing_changes(cluster: &Cluster, tasks: &[(String, String)]) -> anyhow::Result<()> {
    let end = Instant::now() + WATCH;
    while Instant::now() < end {
        for a in cluster.agents()? {
            anyhow::ensure!(a.reachable, "agent {} became unreachable", a.agent_id);
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let view = cluster.job(KEY)?;
    for i in &view.instances {
        anyhow::ensure!(i.history.is_empty(), "instance {} was replaced", i.instance);
        let t = i
            .current
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("no task"))?;
        anyhow::ensure!(
            tasks.iter().any(|(id, _)| *id == t.task_id),
            "new task {}",
            t.task_id
        );
        anyhow::ensure!(
            t.state == TaskState::Running,
            "{} is {}",
            t.task_id,
            t.state
        );
    }
    Ok(())
}

fn step(faked: Faked, offset: &str, test: &str) {
    let Some(lib) = libfaketime(test) else {
        return;
    };
    let (mut cluster, clock, tasks) = match cluster_with_fake_clock(&lib, faked) {
        Ok(started) => started,
        Err(e) => panic!("{faked:?}: cannot start the cluster: {e}"),
    };
    if let Err(e) = step_and_watch(&mut cluster, &clock, &tasks, faked, offset) {
        panic!("{faked:?} {offset}: {e}\n{}", cluster.diagnostics());
    }
}

fn step_and_watch(
    cluster: &mut Cluster,
    clock: &Offset,
    tasks: &[(String, String)],
    faked: Faked,
    offset: &str,
) -> anyhow::Result<()> {
    clock.set(offset)?;
    if let Faked::Master = faked {
        // The step took: the master stamps heartbeats with its (stepped) wall clock.
        let want = now_ms() as i64 + offset.parse::<i64>()? * 1000;
        cluster.wait_for("the master's clock to step", WAIT, |c| {
            let agents = c.agents().ok()?;
            agents
                .iter()
                .all(|a| (a.last_heartbeat_ms as i64 - want).abs() < 30_000)
                .then_some(())
        })?;
    }
    nothing_changes(cluster, tasks)
}

#[test]
fn master_clock_ten_minutes_forward_loses_nothing() {
    step(Faked::Master, "+600", "master_clock_ten_minutes_forward");
}

#[test]
fn master_clock_ten_minutes_back_loses_nothing() {
    step(Faked::Master, "-600", "master_clock_ten_minutes_back");
}

#[test]
fn agent_clock_ten_minutes_forward_loses_nothing() {
    step(Faked::Agent0, "+600", "agent_clock_ten_minutes_forward");
}

#[test]
fn agent_clock_ten_minutes_back_loses_nothing() {
    step(Faked::Agent0, "-600", "agent_clock_ten_minutes_back");
}

#[test]
fn an_agent_killed_while_the_master_clock_is_stepped_back_is_found_within_the_timeout() {
    let Some(lib) = libfaketime("agent_killed_while_the_master_clock_is_stepped_back") else {
        return;
    };
    let (mut cluster, clock, tasks) = cluster_with_fake_clock(&lib, Faked::Master).unwrap();
    clock.set("-600").unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let victim_pid = cluster.agent_pids()[0];
    let agents = cluster.agents().unwrap();
    // Agent ids are random: agent 0 is the one whose sandbox root holds its task.
    let (task0, agent0) = tasks
        .iter()
        .find(|(id, _)| cluster.sandbox_roots[0].join(id).is_dir())
        .cloned()
        .unwrap();
    assert!(agents.iter().any(|a| a.agent_id == agent0));
    let killed_at = Instant::now();
    kill(Pid::from_raw(victim_pid as i32), Signal::SIGKILL).unwrap();
    let lost = cluster
        .wait_for("agent 0's task LOST", WAIT, |c| {
            let t = c.task(&task0).ok()?;
            (t.state == TaskState::Lost).then_some(())
        })
        .map(|()| killed_at.elapsed());
    let lost = match lost {
        Ok(d) => d,
        Err(e) => panic!("{e}\n{}", cluster.diagnostics()),
    };
    println!(
        "MEASURE agent kill -> task LOST with the master clock 10 min back (agent_timeout 5s): {:.2}s",
        lost.as_secs_f64()
    );
    // Agent timeout 5 s, a sweep (300 ms), the settle (600 ms), and slack for 2 busy
    // cores; a master blind for the step would take 10 minutes.
    assert!(lost < Duration::from_secs(12), "found after {lost:?}");
    let a = cluster
        .agents()
        .unwrap()
        .into_iter()
        .find(|a| a.agent_id == agent0)
        .unwrap();
    assert!(!a.reachable);
}
