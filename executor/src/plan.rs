//! The pure part of setting a task up: from the task file, the sandbox path, the task
//! user's name and the host's pids maximum, everything the runner needs that no I/O
//! decides: the cgroup limits, the processes' environment and rendered cmdlines, and
//! how a health check is made. Every refusal is a message naming the field and what to
//! do; the runner reports it as `sandbox_setup_failed`.

use std::path::Path;
use std::time::Duration;

use drover_common::spec::HealthCheckType;
use drover_common::template::TemplateContext;
use drover_common::wire::ExecutorTask;

use crate::cgroup::Limits;

/// How a due health check is made (its schedule and counting are the
/// [`crate::supervisor::Supervisor`]'s).
#[derive(Clone, Debug, PartialEq)]
pub struct HealthProbe {
    /// http, tcp or shell.
    pub kind: HealthCheckType,
    /// The assigned port (0 for a shell check).
    pub port: u16,
    /// The HTTP path.
    pub endpoint: String,
    /// The HTTP status that counts as healthy.
    pub expected_code: u16,
    /// The trimmed body that counts as healthy.
    pub expected_body: String,
    /// Each check's time limit.
    pub timeout: Duration,
    /// The rendered command of a shell check.
    pub command: Option<String>,
}

/// What setting the task up needs, decided.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// The task cgroup's limits.
    pub limits: Limits,
    /// Every process's environment (the `DROVER_*` variables, `HOME`, `USER`,
    /// `task.env` rendered).
    pub env: Vec<(String, String)>,
    /// The rendered cmdline of each process, by index.
    pub cmdlines: Vec<String>,
    /// The health check, if the task has one.
    pub health: Option<HealthProbe>,
}

/// Why a task cannot be planned; each names the field.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    #[error("task.resources.pids is {asked} but this host allows at most {max} per task (agent max_task_pids); ask for fewer")]
    TooManyPids { asked: u64, max: u64 },
    /// A template (`{{...}}`) that does not render; `field` names where it is.
    #[error("{field}: {error}")]
    Template { field: String, error: String },
    #[error("health_check.port `{0}` has no assigned port number; add it to task.resources.ports and the task's ports")]
    HealthPortUnassigned(String),
    #[error("health_check.type is shell but health_check.command is missing")]
    ShellCommandMissing,
    #[error("lifecycle.http.port `{0}` has no assigned port number")]
    LifecyclePortUnassigned(String),
}

/// Plans the task `task` in the sandbox `work` (the processes' working directory) for
/// the user `user`, on a host allowing at most `pids_max` pids per task.
pub fn plan(
    task: &ExecutorTask,
    work: &Path,
    user: &str,
    pids_max: u64,
) -> Result<Plan, PlanError> {
    let pids = task_pids_limit(task.task.resources.pids, pids_max)?;
    let limits = Limits {
        cpu: task.task.resources.cpu,
        memory_bytes: task.task.resources.ram.bytes(),
        pids,
    };
    let ctx = TemplateContext {
        role: task.role.clone(),
        environment: task.environment.clone(),
        name: task.name.clone(),
        instance: task.instance,
        task_id: task.task_id.clone(),
        sandbox: work.display().to_string(),
        ports: task.ports.clone(),
    };
    let render = |text: &str, field: String| {
        ctx.render(text).map_err(|e| PlanError::Template {
            field,
            error: e.to_string(),
        })
    };
    let mut env = ctx.environment();
    env.push(("HOME".into(), work.display().to_string()));
    env.push(("USER".into(), user.to_string()));
    for (k, v) in &task.task.env {
        env.push((k.clone(), render(v, format!("task.env.{k}"))?));
    }
    let cmdlines = task
        .task
        .processes
        .iter()
        .map(|p| render(&p.cmdline, format!("process `{}` cmdline", p.name)))
        .collect::<Result<Vec<_>, _>>()?;
    let health = match &task.health_check {
        None => None,
        Some(hc) => {
            let port = match hc.kind {
                HealthCheckType::Shell => 0,
                _ => *task
                    .ports
                    .get(&hc.port)
                    .ok_or_else(|| PlanError::HealthPortUnassigned(hc.port.clone()))?,
            };
            let command = match (&hc.kind, &hc.command) {
                (HealthCheckType::Shell, Some(c)) => {
                    Some(render(c, "health_check.command".into())?)
                }
                (HealthCheckType::Shell, None) => return Err(PlanError::ShellCommandMissing),
                _ => None,
            };
            Some(HealthProbe {
                kind: hc.kind,
                port,
                endpoint: hc.endpoint.clone(),
                expected_code: hc.expected_response_code,
                expected_body: hc.expected_response.clone(),
                timeout: hc.timeout.get(),
                command,
            })
        }
    };
    if let Some(http) = task.lifecycle.as_ref().and_then(|l| l.http.as_ref()) {
        if !task.ports.contains_key(&http.port) {
            return Err(PlanError::LifecyclePortUnassigned(http.port.clone()));
        }
    }
    Ok(Plan {
        limits,
        env,
        cmdlines,
        health,
    })
}

/// The task cgroup's pids limit (pure): what the spec asks for, refused above the
/// host's maximum `host_max`; without a request [`DEFAULT_PIDS`], cut to `host_max`.
///
/// [`DEFAULT_PIDS`]: drover_common::spec::DEFAULT_PIDS
fn task_pids_limit(requested: Option<u64>, host_max: u64) -> Result<u64, PlanError> {
    match requested {
        Some(n) if n > host_max => Err(PlanError::TooManyPids {
            asked: n,
            max: host_max,
        }),
        Some(n) => Ok(n),
        None => Ok(drover_common::spec::DEFAULT_PIDS.min(host_max)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The task of docs/executor.md's example, with `extra` merged into its top level.
    fn task(extra: serde_json::Value) -> ExecutorTask {
        let mut t = serde_json::json!({
            "task_id": "hello-0-abc", "role": "nobody", "environment": "devel",
            "name": "hello", "instance": 3, "ports": {"health": 8080},
            "task": {"processes": [{"name": "web", "cmdline": "exec ./server --port {{ports.health}}"}],
                     "env": {"GREETING": "hi from {{instance}}"},
                     "resources": {"cpu": 0.5, "ram": "128MiB", "disk": "1GiB", "ports": ["health"]}},
            "health_check": {"initial_interval": "5s", "interval": "1s"},
            "lifecycle": {"http": {}}
        });
        for (k, v) in extra.as_object().unwrap() {
            t[k] = v.clone();
        }
        serde_json::from_value(t).unwrap()
    }

    #[test]
    fn a_plan_renders_cmdlines_and_env_and_resolves_the_health_port() {
        let p = plan(
            &task(serde_json::json!({})),
            Path::new("/s/hello/sandbox"),
            "nobody",
            4096,
        )
        .unwrap();
        assert_eq!(p.cmdlines, vec!["exec ./server --port 8080".to_string()]);
        let env = |k: &str| p.env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(env("GREETING"), Some("hi from 3"));
        assert_eq!(env("HOME"), Some("/s/hello/sandbox"));
        assert_eq!(env("USER"), Some("nobody"));
        assert_eq!(p.limits.memory_bytes, 128 << 20);
        assert_eq!(p.limits.pids, drover_common::spec::DEFAULT_PIDS);
        let health = p.health.unwrap();
        assert_eq!((health.kind, health.port), (HealthCheckType::Http, 8080));
    }

    #[test]
    fn a_plan_refuses_naming_the_field() {
        let plain = serde_json::json!({"processes": [{"name": "web", "cmdline": "./server"}],
            "resources": {"cpu": 1, "ram": "1MiB", "disk": "1MiB"}});
        let cases = [
            (
                serde_json::json!({"ports": {}, "task": plain.clone()}),
                "health_check.port `health`",
            ),
            (
                serde_json::json!({"health_check": null, "ports": {}, "task": plain}),
                "lifecycle.http.port `health`",
            ),
            (
                serde_json::json!({"health_check": {"type": "shell"}}),
                "health_check.command is missing",
            ),
            (
                serde_json::json!({"health_check": {"type": "shell", "command": "check {{nope}}"}}),
                "health_check.command",
            ),
            (
                serde_json::json!({"task": {"processes": [{"name": "web", "cmdline": "run {{nope}}"}],
                    "resources": {"cpu": 1, "ram": "1MiB", "disk": "1MiB"}}}),
                "process `web` cmdline",
            ),
        ];
        for (extra, wanted) in cases {
            let err = plan(&task(extra.clone()), Path::new("/s"), "nobody", 4096)
                .unwrap_err()
                .to_string();
            assert!(err.contains(wanted), "{extra}: {err}");
        }
    }

    #[test]
    fn the_pids_limit_comes_from_the_spec_within_the_host_maximum() {
        assert_eq!(task_pids_limit(Some(64), 4096), Ok(64));
        assert_eq!(task_pids_limit(Some(4096), 4096), Ok(4096));
        assert!(task_pids_limit(Some(4097), 4096)
            .unwrap_err()
            .to_string()
            .contains("task.resources.pids is 4097"));
        assert_eq!(
            task_pids_limit(None, 4096),
            Ok(drover_common::spec::DEFAULT_PIDS)
        );
        assert_eq!(task_pids_limit(None, 100), Ok(100));
    }
}
