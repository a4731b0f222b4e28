//! The jobs simulated operators submit: random specs written as the JSON a client
//! sends and read through the same parser and validation as `POST /v1/jobs`. A
//! task's behaviour on its simulated executor is its command line (see
//! [`Behaviour`]), so an update can change how instances behave.

use drover_common::parse::parse_job_json_with;
use drover_common::spec::JobSpec;

use crate::rng::Rng;

/// How a simulated task behaves, read from its first process's command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behaviour {
    /// `sim service`: runs until killed (and, rarely, crashes).
    Service,
    /// `sim batch MS`: finishes after MS.
    Batch(u64),
    /// `sim crash MS`: fails after MS (a crash loop when it is a service).
    Crash(u64),
    /// `sim unhealthy MS`: its health check fails after MS.
    Unhealthy(u64),
}

impl Behaviour {
    /// The behaviour a command line names (a service when it names none).
    pub fn of(cmdline: &str) -> Behaviour {
        let mut words = cmdline.split_whitespace().skip(1);
        let kind = words.next().unwrap_or("service");
        let ms = words.next().and_then(|w| w.parse().ok()).unwrap_or(1_000);
        match kind {
            "batch" => Behaviour::Batch(ms),
            "crash" => Behaviour::Crash(ms),
            "unhealthy" => Behaviour::Unhealthy(ms),
            _ => Behaviour::Service,
        }
    }
}

/// A job an operator created, as the simulator remembers it.
#[derive(Clone, Debug)]
pub struct SimJob {
    pub key: String,
    pub spec: JobSpec,
    pub cron: bool,
}

fn behaviour_line(rng: &mut Rng, service: bool, cron: bool) -> String {
    if cron || !service {
        return match rng.below(10) {
            0 => format!("sim crash {}", rng.range(100, 3_000)),
            _ => format!("sim batch {}", rng.range(200, 20_000)),
        };
    }
    match rng.below(12) {
        0 => format!("sim crash {}", rng.range(50, 2_000)),
        1 => format!("sim unhealthy {}", rng.range(500, 8_000)),
        _ => "sim service".to_string(),
    }
}

/// The JSON of a new job number `n`.
fn job_json(rng: &mut Rng, n: u64) -> (String, bool) {
    let cron = rng.chance(100);
    let service = !cron && rng.chance(650);
    let instances = if cron { 1 } else { rng.range(1, 4) };
    let role = ["web", "batch"][rng.pick(2)];
    let preemptible = rng.chance(300);
    let exclusive = service && rng.chance(350);
    let cpu = [0.25, 0.5, 0.75, 1.0, 1.5][rng.pick(5)];
    let ram = [128, 256, 512, 1024][rng.pick(4)];
    let mut extra = String::new();
    if rng.chance(250) {
        extra.push_str(r#","constraints":{"rack":"limit:1"}"#);
    }
    if cron {
        let every = [10, 15, 20, 30][rng.pick(4)];
        let policy = ["KILL_EXISTING", "CANCEL_NEW"][rng.pick(2)];
        extra.push_str(&format!(
            r#","cron_schedule":"*/{every} * * * * *","cron_collision_policy":"{policy}""#
        ));
    }
    if service && rng.chance(300) {
        extra.push_str(r#","sla_policy":{"max_disrupted":1}"#);
    }
    if service && rng.chance(400) {
        extra.push_str(r#","announce":{"primary_port":"http","drain_delay":"1s"}"#);
    }
    let reschedule = !rng.chance(100);
    let delay = if rng.chance(200) { "3s" } else { "0s" };
    let text = format!(
        r#"{{"role":"{role}","environment":"prod","name":"j{n}","instances":{instances},
        "service":{service},"tier":"{tier}","priority":{priority},"max_task_failures":{mtf},
        "task":{{"processes":[{{"name":"main","cmdline":"{cmd}"}}],
                "resources":{{"cpu":{cpu},"ram":"{ram}MiB","disk":"1GiB","ports":["http"]}},
                "finalization_wait":"{fin}s"}},
        "partition_policy":{{"reschedule":{reschedule},"delay":"{delay}","exclusive":{exclusive}}},
        "update":{{"batch_size":{batch},"watch":"{watch}s","max_per_instance_failures":{mpf},
                   "max_total_failures":{mtot},"rollback_on_failure":{rollback}}}
        {extra}}}"#,
        tier = if preemptible {
            "preemptible"
        } else {
            "preferred"
        },
        priority = rng.below(3),
        mtf = rng.range(1, 3),
        cmd = behaviour_line(rng, service, cron),
        fin = rng.range(1, 3),
        batch = rng.range(1, 2),
        watch = rng.range(1, 4),
        mpf = rng.below(2),
        mtot = rng.below(2),
        rollback = !rng.chance(200),
    );
    (text, cron)
}

/// A new random job number `n`, or why the parser refused it (a simulator bug).
pub fn new_job(rng: &mut Rng, n: u64) -> Result<SimJob, String> {
    let (text, cron) = job_json(rng, n);
    let spec = parse_job_json_with(&text, true)
        .map_err(|e| format!("generated spec refused: {e:?}\n{text}"))?;
    Ok(SimJob {
        key: format!("{}/{}/{}", spec.role, spec.environment, spec.name),
        spec,
        cron,
    })
}

/// An updated spec of `job`: another behaviour, maybe another size and count.
pub fn updated(rng: &mut Rng, job: &SimJob) -> JobSpec {
    let mut spec = job.spec.clone();
    if let Some(p) = spec.task.processes.first_mut() {
        p.cmdline = behaviour_line(rng, spec.service, job.cron);
        // A different line even when the behaviour is the same.
        p.cmdline.push_str(&format!(" v{}", rng.below(1_000)));
    }
    if rng.chance(300) {
        spec.task.resources.cpu = [0.25, 0.5, 1.0, 2.0][rng.pick(4)];
    }
    if rng.chance(300) && !job.cron {
        spec.instances = rng.range(1, 5) as u32;
    }
    spec
}
