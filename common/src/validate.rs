//! Semantic checks of a job spec that serde cannot express: names, bounds, ports,
//! process ordering, templates, health checks and constraints. Pure: takes a parsed
//! [`JobSpec`] and returns every problem found, each at its field path, so a person
//! can fix them all in one go. Syntax, types and unknown fields are `parse`'s job.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};

use crate::spec::{is_valid_name, Constraint, HealthCheckType, JobSpec, ProcessSpec, TaskSpec};
use crate::suggest::closest;
use crate::template;
use crate::units::{ByteSize, Duration};
use crate::wire::{CreateTokenRequest, FieldError, Grant, QuotaResources, SetQuotaRequest};

/// The most instances one job may have.
pub const MAX_INSTANCES: u32 = 10_000;
/// The most CPU cores one task may request.
pub const MAX_CPU: f64 = 1024.0;
/// The most memory one task may request: 16 TiB.
pub const MAX_RAM: ByteSize = ByteSize(16 << 40);
/// The most disk one task may request: 1 PiB.
pub const MAX_DISK: ByteSize = ByteSize(1 << 50);
/// The most processes one task spec may declare. Each is tracked, supervised and
/// listed in every status of the task, so their number bounds what a task costs its
/// executor, its agent and the master (issue 27: 10,000 declared processes grew one
/// agent to 2 GB); a task that needs more workers forks them from one process.
pub const MAX_PROCESSES: usize = 100;
/// The host attribute whose constraint reserves hosts for one role's job.
pub const DEDICATED: &str = "dedicated";

const NAME_RULE: &str =
    "use 1 to 64 of the characters A-Z a-z 0-9 _ . - (not `.` or `..`, not starting with `-`), e.g. www-data";

/// Every semantic problem in `job`, in field order; empty when the job is valid.
pub fn validate(job: &JobSpec) -> Vec<FieldError> {
    validate_with(job, Unknown::default(), false)
}

/// The quota a `SetQuotaRequest` asks for (None: remove the role's quota), or the
/// first field at fault: `remove` goes alone, and `cpu` is a finite number of
/// cores, 0 or more. Absent resources are 0.
pub fn quota_request(req: &SetQuotaRequest) -> Result<Option<QuotaResources>, FieldError> {
    let bad = |field: &str, message: String| FieldError {
        field: field.to_string(),
        message,
    };
    if req.remove {
        if req.cpu.is_some() || req.ram_bytes.is_some() || req.disk_bytes.is_some() {
            return Err(bad(
                "remove",
                "remove goes alone; send either remove or cpu, ram_bytes and disk_bytes"
                    .to_string(),
            ));
        }
        return Ok(None);
    }
    let cpu = req.cpu.unwrap_or(0.0);
    if !cpu.is_finite() || cpu < 0.0 {
        return Err(bad(
            "cpu",
            format!("is {cpu}; use 0 or more cores, e.g. 4 or 0.5"),
        ));
    }
    Ok(Some(QuotaResources {
        cpu,
        ram_bytes: req.ram_bytes.unwrap_or(0),
        disk_bytes: req.disk_bytes.unwrap_or(0),
    }))
}

/// The grant and description a `CreateTokenRequest` asks for, or the first field
/// at fault: a known kind, roles only with (and never empty for) kind `roles`, an
/// agent id only with kind `agent`, valid names, a description of at most 200
/// bytes.
pub fn token_request(req: CreateTokenRequest) -> Result<(Grant, String), FieldError> {
    let refuse = |message: String, field: &str| FieldError {
        field: field.to_string(),
        message,
    };
    if req.description.len() > 200 {
        return Err(refuse(
            "description is longer than 200 bytes".to_string(),
            "description",
        ));
    }
    if !req.roles.is_empty() && req.kind != "roles" {
        return Err(refuse(
            format!("roles go with kind \"roles\", not \"{}\"", req.kind),
            "roles",
        ));
    }
    if req.agent_id.is_some() && req.kind != "agent" {
        return Err(refuse(
            "agent_id goes with kind \"agent\"".to_string(),
            "agent_id",
        ));
    }
    let grant = match req.kind.as_str() {
        "admin" => Grant::Admin,
        "operator" => Grant::Operator,
        "discovery" => Grant::Discovery,
        "agent" => {
            if let Some(id) = req.agent_id.as_ref().filter(|id| !is_valid_name(id)) {
                return Err(refuse(format!("`{id}` is not an agent id"), "agent_id"));
            }
            Grant::Agent {
                agent_id: req.agent_id,
            }
        }
        "roles" => {
            if req.roles.is_empty() {
                return Err(refuse(
                    "roles is empty; name at least one role".to_string(),
                    "roles",
                ));
            }
            if let Some(bad) = req.roles.iter().find(|r| !is_valid_name(r)) {
                return Err(refuse(
                    format!("`{bad}` is not a role name (1-64 of A-Z a-z 0-9 _ . -)"),
                    "roles",
                ));
            }
            Grant::Roles { roles: req.roles }
        }
        other => {
            return Err(refuse(
                format!("kind `{other}` is not one of admin, operator, roles, agent, discovery"),
                "kind",
            ))
        }
    };
    Ok((grant, req.description))
}

/// Parts of a job that were written wrongly and replaced by placeholders while
/// parsing; checks that compare against them are skipped, as their errors would
/// only repeat the parse error.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Unknown {
    /// `task.resources.ports` was unusable.
    pub ports: bool,
    /// Some process name was unusable.
    pub process_names: bool,
    /// `role` was unusable.
    pub role: bool,
}

/// [`validate`], skipping the checks against `unknown` parts; `cron_seconds`: the
/// master's test switch that allows a seconds field in `cron_schedule`.
pub(crate) fn validate_with(
    job: &JobSpec,
    unknown: Unknown,
    cron_seconds: bool,
) -> Vec<FieldError> {
    let mut v = Errors {
        list: Vec::new(),
        unknown,
    };
    v.name("role", &job.role);
    v.name("environment", &job.environment);
    v.name("name", &job.name);
    if !(1..=MAX_INSTANCES).contains(&job.instances) {
        v.push(
            "instances",
            format!(
                "is {}; use a number from 1 to {MAX_INSTANCES}",
                job.instances
            ),
        );
    }
    constraints(&mut v, job);
    spread(&mut v, job);
    affinity(&mut v, job);
    task(&mut v, &job.task, job);
    health_check(&mut v, job);
    lifecycle(&mut v, job);
    if job.update.batch_size < 1 {
        v.push("update.batch_size", "is 0; use 1 or more".to_string());
    }
    sla_policy(&mut v, job);
    announce(&mut v, job);
    if let Err(e) = crate::cron::job_schedule(job, cron_seconds) {
        v.push(e.field, e.message);
    }
    v.list
}

/// `sla_policy`: exactly one kind of budget, each within what the job can meet.
fn sla_policy(v: &mut Errors, job: &JobSpec) {
    let Some(p) = &job.sla_policy else {
        return;
    };
    let set = [
        p.min_healthy.is_some(),
        p.min_healthy_percent.is_some(),
        p.max_disrupted.is_some(),
    ];
    match set.iter().filter(|s| **s).count() {
        0 => v.push(
            "sla_policy",
            "sets no budget; set one of min_healthy, min_healthy_percent or max_disrupted"
                .to_string(),
        ),
        1 => {}
        _ => v.push(
            "sla_policy",
            "sets more than one of min_healthy, min_healthy_percent and max_disrupted; keep one"
                .to_string(),
        ),
    }
    if let Some(n) = p.min_healthy {
        if n > job.instances {
            v.push(
                "sla_policy.min_healthy",
                format!(
                    "is {n} but the job has {} instances; use at most {}",
                    job.instances, job.instances
                ),
            );
        }
    }
    if let Some(pct) = p.min_healthy_percent {
        if pct > 100 {
            v.push(
                "sla_policy.min_healthy_percent",
                format!("is {pct}; use a percentage from 0 to 100"),
            );
        }
    }
    if p.max_disrupted == Some(0) {
        v.push(
            "sla_policy.max_disrupted",
            "is 0, which would block every drain; use 1 or more".to_string(),
        );
    }
    if p.max_disrupted.is_some() && !p.min_time.get().is_zero() {
        v.push(
            "sla_policy.min_time",
            "applies to min_healthy and min_healthy_percent only; remove it or use one of those"
                .to_string(),
        );
    }
}

/// The longest `announce.drain_delay`: a kill waits this long before it starts.
pub const MAX_DRAIN_DELAY_SECS: u64 = 600;

/// `announce`: declared ports (with a hint for a misspelt one), a primary port among
/// them, and names that can be DNS labels (the service is `NAME.ENV.ROLE` in DNS).
fn announce(v: &mut Errors, job: &JobSpec) {
    let Some(a) = &job.announce else {
        return;
    };
    let declared = &job.task.resources.ports;
    let port = |v: &mut Errors, field: &str, name: &str| {
        if v.unknown.ports || declared.iter().any(|p| p == name) {
            return;
        }
        let hint = closest(name, declared.iter().map(String::as_str))
            .map(|near| format!("; did you mean `{near}`?"))
            .unwrap_or_default();
        let known = if declared.is_empty() {
            "the task declares no ports (task.resources.ports)".to_string()
        } else {
            format!("declared ports: {}", declared.join(", "))
        };
        v.push(
            field,
            format!(
                "`{}` is not a port of task.resources.ports ({known}){hint}",
                show(name)
            ),
        );
    };
    port(v, "announce.primary_port", &a.primary_port);
    for (i, p) in a.ports.iter().enumerate() {
        port(v, &format!("announce.ports[{i}]"), p);
    }
    match &a.name {
        Some(name) => v.dns_label("announce.name", name, ""),
        None => v.dns_label(
            "name",
            &job.name,
            "; it is the announced service's name (or set announce.name)",
        ),
    }
    if !v.unknown.role {
        v.dns_label("role", &job.role, "; announced services need one");
    }
    v.dns_label(
        "environment",
        &job.environment,
        "; announced services need one",
    );
    if a.drain_delay.get().as_secs() > MAX_DRAIN_DELAY_SECS {
        v.push(
            "announce.drain_delay",
            format!(
                "is {}; use at most {MAX_DRAIN_DELAY_SECS}s (every kill of the job waits this long)",
                a.drain_delay
            ),
        );
    }
}

/// Whether `s` is a DNS label as service discovery publishes it (RFC 1123, lower
/// case): 1 to 63 of a-z 0-9 and `-`, not starting or ending with `-`.
pub fn is_dns_label(s: &str) -> bool {
    (1..=63).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Collects errors.
struct Errors {
    list: Vec<FieldError>,
    unknown: Unknown,
}

impl Errors {
    fn push(&mut self, field: impl Into<String>, message: String) {
        self.list.push(FieldError {
            field: field.into(),
            message: one_line(&message),
        });
    }

    fn name(&mut self, field: &str, value: &str) {
        if !is_valid_name(value) {
            self.push(
                field,
                format!("`{}` is not a valid name; {NAME_RULE}", show(value)),
            );
        }
    }

    /// A DNS label (see [`is_dns_label`]); `why` ends the message.
    fn dns_label(&mut self, field: &str, value: &str, why: &str) {
        if !is_dns_label(value) {
            self.push(
                field,
                format!(
                    "`{}` is not a DNS label{why}: use 1 to 63 of a-z 0-9 and `-`, not starting or ending with `-`, e.g. web-api",
                    show(value)
                ),
            );
        }
    }

    /// A templated text: closed `{{ }}`, known variables, declared ports, no NUL.
    fn templated(&mut self, field: &str, text: &str, ports: &[String]) {
        if text.contains('\0') {
            self.push(field, "contains a NUL character; remove it".to_string());
        }
        for e in template::check(text, ports) {
            if self.unknown.ports && matches!(e, template::TemplateError::UndeclaredPort(_)) {
                continue;
            }
            let hint = match &e {
                template::TemplateError::UndeclaredPort(port) => {
                    closest(port, ports.iter().map(String::as_str))
                        .map(|near| format!("; or did you mean `{{{{ports.{near}}}}}`?"))
                        .unwrap_or_default()
                }
                _ => String::new(),
            };
            self.push(field, format!("{e}{hint}"));
        }
    }

    fn positive_duration(&mut self, field: &str, value: Duration) {
        if value.get().is_zero() {
            self.push(field, "is 0; use a positive duration, e.g. 1s".to_string());
        }
    }

    fn endpoint(&mut self, field: &str, value: &str) {
        if !value.starts_with('/') || value.chars().any(|c| c.is_whitespace() || c.is_control()) {
            self.push(
                field,
                format!(
                    "`{}` is not an HTTP path; write one starting with `/` and without spaces, e.g. /health",
                    show(value)
                ),
            );
        }
    }
}

/// `message` with line breaks and other control characters escaped, so that every
/// error prints as one line whatever the user wrote.
pub(crate) fn one_line(message: &str) -> String {
    if !message.chars().any(char::is_control) {
        return message.to_string();
    }
    message
        .chars()
        .map(|c| {
            if c.is_control() {
                c.escape_debug().collect()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// A value quoted in a message, cut short so one bad field cannot flood the output.
fn show(value: &str) -> String {
    const MAX: usize = 80;
    let escaped: String = value.escape_debug().collect();
    if escaped.chars().count() <= MAX {
        escaped
    } else {
        let cut: String = escaped.chars().take(MAX).collect();
        format!("{cut}...")
    }
}

/// Field path of a map key: `.key` when it is a plain name, `["key"]` otherwise.
pub(crate) fn key_path(parent: &str, key: &str) -> String {
    let plain = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'));
    let child = if plain {
        key.to_string()
    } else {
        format!("[{:?}]", key)
    };
    match (parent.is_empty(), plain) {
        (true, _) => child,
        (false, true) => format!("{parent}.{child}"),
        (false, false) => format!("{parent}{child}"),
    }
}

fn constraints(v: &mut Errors, job: &JobSpec) {
    for (attribute, expr) in &job.constraints {
        let field = key_path("constraints", attribute);
        if !is_valid_name(attribute) {
            v.push(
                &field,
                format!(
                    "`{}` is not a valid host attribute name; {NAME_RULE}",
                    show(attribute)
                ),
            );
        }
        // Parsed when the spec was read; its error is reported here, at its field.
        let parsed = match expr.parsed() {
            Ok(c) => c,
            Err(e) => {
                v.push(&field, e.to_string());
                continue;
            }
        };
        if attribute == DEDICATED {
            dedicated(v, &field, expr.text(), parsed, &job.role);
        }
    }
}

/// A host attribute named by `field`: a valid name, not named twice in its list.
fn soft_attribute(v: &mut Errors, field: &str, attribute: &str, seen: &mut BTreeSet<String>) {
    if !is_valid_name(attribute) {
        v.push(
            field,
            format!(
                "`{}` is not a valid host attribute name; {NAME_RULE}",
                show(attribute)
            ),
        );
    } else if !seen.insert(attribute.to_string()) {
        v.push(
            field,
            format!(
                "`{}` is named twice; merge the entries into one",
                show(attribute)
            ),
        );
    }
}

/// `spread`: a non-empty list of distinct attributes, each weighted 1..=100.
fn spread(v: &mut Errors, job: &JobSpec) {
    let Some(list) = &job.spread else {
        return;
    };
    if list.is_empty() {
        v.push(
            "spread",
            "is empty; remove `spread` or add an entry like {attribute: rack, weight: 50}"
                .to_string(),
        );
    }
    let mut seen = BTreeSet::new();
    for (i, s) in list.iter().enumerate() {
        soft_attribute(
            v,
            &format!("spread[{i}].attribute"),
            &s.attribute,
            &mut seen,
        );
        if !(1..=100).contains(&s.weight) {
            v.push(
                format!("spread[{i}].weight"),
                format!("is {}; use a weight from 1 to 100", s.weight),
            );
        }
    }
}

/// `affinity`: a non-empty list of distinct attributes, each with a value
/// expression (not a limit) and a weight in -100..=100, not 0.
fn affinity(v: &mut Errors, job: &JobSpec) {
    let Some(list) = &job.affinity else {
        return;
    };
    if list.is_empty() {
        v.push(
            "affinity",
            "is empty; remove `affinity` or add an entry like {attribute: zone, value: a, weight: 50}"
                .to_string(),
        );
    }
    let mut seen = BTreeSet::new();
    for (i, a) in list.iter().enumerate() {
        soft_attribute(
            v,
            &format!("affinity[{i}].attribute"),
            &a.attribute,
            &mut seen,
        );
        match a.value.parsed() {
            Err(e) => v.push(format!("affinity[{i}].value"), e.to_string()),
            Ok(Constraint::Limit(_)) => v.push(
                format!("affinity[{i}].value"),
                format!(
                    "`{}` is a limit; an affinity compares values: write `a`, `a|b` or `!a`",
                    show(a.value.text())
                ),
            ),
            Ok(Constraint::Value { .. }) => {}
        }
        if a.weight == 0 || !(-100..=100).contains(&a.weight) {
            v.push(
                format!("affinity[{i}].weight"),
                format!(
                    "is {}; use a weight from -100 to 100 other than 0 (negative: avoid)",
                    a.weight
                ),
            );
        }
    }
}

/// `dedicated: role/name`, where role is the job's role or `*`.
fn dedicated(v: &mut Errors, field: &str, expr: &str, parsed: &Constraint, job_role: &str) {
    let shaped = match parsed {
        Constraint::Value {
            values,
            negated: false,
        } if values.len() == 1 => values[0]
            .split_once('/')
            .filter(|(role, name)| (*role == "*" || is_valid_name(role)) && is_valid_name(name)),
        _ => None,
    };
    match shaped {
        None => v.push(
            field,
            format!(
                "`{}` is not a dedicated group; write role/name, e.g. {job_role}/hello",
                show(expr)
            ),
        ),
        Some((role, _)) if role != "*"
            && role != job_role
            && is_valid_name(job_role)
            && !v.unknown.role => v.push(
            field,
            format!(
                "dedicated hosts of role `{}` are not this job's (role `{}`); use {}/NAME or */NAME",
                show(role),
                show(job_role),
                show(job_role)
            ),
        ),
        Some(_) => {}
    }
}

fn task(v: &mut Errors, task: &TaskSpec, job: &JobSpec) {
    resources(v, task);
    let ports = &task.resources.ports;
    if task.processes.is_empty() {
        v.push(
            "task.processes",
            "is empty; add at least one process with a name and a cmdline".to_string(),
        );
    }
    if task.processes.len() > MAX_PROCESSES {
        v.push(
            "task.processes",
            format!(
                "declares {} processes, more than the maximum of {MAX_PROCESSES}; start the workers from one process (e.g. a shell loop) instead of declaring each",
                task.processes.len()
            ),
        );
    }
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, p) in task.processes.iter().enumerate() {
        let base = format!("task.processes[{i}]");
        v.name(&format!("{base}.name"), &p.name);
        match seen.entry(&p.name) {
            Entry::Occupied(first) => v.push(
                format!("{base}.name"),
                format!(
                    "`{}` is already the name of task.processes[{}]; process names must be unique",
                    show(&p.name),
                    first.get()
                ),
            ),
            Entry::Vacant(slot) => {
                slot.insert(i);
            }
        }
        if p.cmdline.trim().is_empty() {
            v.push(
                format!("{base}.cmdline"),
                "is empty; write the shell command to run".to_string(),
            );
        }
        v.templated(&format!("{base}.cmdline"), &p.cmdline, ports);
        if p.is_final && p.daemon {
            v.push(
                format!("{base}.daemon"),
                "a final process cannot be a daemon (it runs once, during finalization); set daemon: false or final: false".to_string(),
            );
        }
        if p.is_final && p.ephemeral {
            v.push(
                format!("{base}.ephemeral"),
                "a final process cannot be ephemeral (finalization waits for it); set ephemeral: false or final: false".to_string(),
            );
        }
    }
    order(v, task);
    if let Some(user) = &task.user {
        v.name("task.user", user);
    }
    if job.run_as_user() == "root" && !task.allow_root {
        let field = if task.user.is_some() {
            "task.user"
        } else {
            "role"
        };
        v.push(
            field,
            "the task would run as root; set task.user to an unprivileged user, or task.allow_root: true if you mean it".to_string(),
        );
    }
    for (key, value) in &task.env {
        let field = key_path("task.env", key);
        if !is_env_name(key) {
            v.push(
                &field,
                format!(
                    "`{}` is not an environment variable name; start with a letter or `_` and use only A-Z a-z 0-9 _ (at most 128), e.g. LOG_LEVEL",
                    show(key)
                ),
            );
        } else if key.starts_with("DROVER_") {
            v.push(
                &field,
                "DROVER_* variables are set by Drover; choose another name".to_string(),
            );
        }
        v.templated(&field, value, ports);
    }
    artifacts(v, task);
}

/// `task.artifacts`: accepted URLs, a sha256 for http(s), a destination inside the
/// sandbox, an archive format the agent can unpack, modes for copied files only.
fn artifacts(v: &mut Errors, task: &TaskSpec) {
    use crate::artifact::{self as a, Scheme, Unpack};
    for (i, art) in task.artifacts.iter().enumerate() {
        let base = format!("task.artifacts[{i}]");
        let scheme = match a::scheme(&art.url) {
            Ok(s) => Some(s),
            Err(e) => {
                v.push(format!("{base}.url"), e.to_string());
                None
            }
        };
        if art.url.chars().any(|c| c.is_whitespace() || c.is_control()) {
            v.push(
                format!("{base}.url"),
                "contains whitespace or control characters; percent-encode them".to_string(),
            );
        }
        match &art.sha256 {
            Some(sum) if !a::is_sha256(sum) => v.push(
                format!("{base}.sha256"),
                format!(
                    "`{}` is not a SHA-256; write the 64 hex digits `sha256sum FILE` prints",
                    show(sum)
                ),
            ),
            None if scheme == Some(Scheme::Http) => v.push(
                format!("{base}.sha256"),
                "is required for an http(s) artifact; add the 64 hex digits `sha256sum FILE` prints".to_string(),
            ),
            _ => {}
        }
        let unpack = match a::unpack_of(art) {
            Ok(u) => Some(u),
            Err(e) => {
                v.push(format!("{base}.extract"), e.to_string());
                None
            }
        };
        if let Some(unpack) = unpack {
            if let Err(e) = a::dest_of(art, unpack) {
                v.push(format!("{base}.dest"), e.to_string());
            }
            if unpack != Unpack::File && (art.mode.is_some() || art.executable) {
                let field = if art.mode.is_some() {
                    "mode"
                } else {
                    "executable"
                };
                v.push(
                    format!("{base}.{field}"),
                    "applies to a copied file; an unpacked archive's members keep their own modes (set extract: none to copy the archive)".to_string(),
                );
            }
        }
        if let Some(mode) = &art.mode {
            if a::parse_mode(mode).is_none() {
                v.push(
                    format!("{base}.mode"),
                    format!(
                        "`{}` is not a mode; write octal permission bits up to 0777, e.g. \"0755\" (no setuid, setgid or sticky bits)",
                        show(mode)
                    ),
                );
            }
        }
    }
}

fn is_env_name(key: &str) -> bool {
    let mut bytes = key.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && key.len() <= 128
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

fn resources(v: &mut Errors, task: &TaskSpec) {
    let r = &task.resources;
    if !(r.cpu.is_finite() && r.cpu > 0.0 && r.cpu <= MAX_CPU) {
        v.push(
            "task.resources.cpu",
            format!(
                "is {}; use a number of cores above 0 and at most {MAX_CPU}, e.g. 0.5",
                r.cpu
            ),
        );
    }
    for (field, size, max) in [
        ("task.resources.ram", r.ram, MAX_RAM),
        ("task.resources.disk", r.disk, MAX_DISK),
    ] {
        if size.bytes() == 0 || size > max {
            v.push(
                field,
                format!("is {size}; use a size above 0B and at most {max}, e.g. 512MiB"),
            );
        }
    }
    if let Some(pids) = r.pids {
        if !(1..=crate::spec::MAX_PIDS).contains(&pids) {
            v.push(
                "task.resources.pids",
                format!(
                    "is {pids}; use a number of processes from 1 to {}, e.g. 256",
                    crate::spec::MAX_PIDS
                ),
            );
        }
    }
    let mut seen = BTreeSet::new();
    for (i, port) in r.ports.iter().enumerate() {
        let field = format!("task.resources.ports[{i}]");
        v.name(&field, port);
        if !seen.insert(port.as_str()) {
            v.push(
                field,
                format!(
                    "`{}` is requested twice; port names must be unique",
                    show(port)
                ),
            );
        }
    }
}

/// Ordering: known names, no mixing of final and non-final processes, no cycles.
fn order(v: &mut Errors, task: &TaskSpec) {
    let by_name: BTreeMap<&str, &ProcessSpec> = task
        .processes
        .iter()
        .map(|p| (p.name.as_str(), p))
        .collect();
    let mut edges: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (i, chain) in task.order.iter().enumerate() {
        let field = format!("task.order[{i}]");
        if chain.is_empty() {
            v.push(
                &field,
                "is empty; list process names in the order they run".to_string(),
            );
        }
        let mut finals = Vec::new();
        let mut others = Vec::new();
        for (j, name) in chain.iter().enumerate() {
            match by_name.get(name.as_str()) {
                None if v.unknown.process_names => {}
                None => v.push(
                    format!("{field}[{j}]"),
                    format!(
                        "`{}` is not a process of this task; use one of the names in task.processes",
                        show(name)
                    ),
                ),
                Some(p) if p.is_final => finals.push(name.as_str()),
                Some(_) => others.push(name.as_str()),
            }
        }
        if !finals.is_empty() && !others.is_empty() {
            v.push(
                &field,
                format!(
                    "orders final process(es) {} with non-final process(es) {}; final processes always run after the others, so order them only among themselves",
                    finals.join(", "),
                    others.join(", ")
                ),
            );
        }
        for pair in chain.windows(2) {
            edges
                .entry(pair[0].as_str())
                .or_default()
                .insert(pair[1].as_str());
        }
    }
    for cycle in cycles(&edges) {
        v.push(
            "task.order",
            format!(
                "has a cycle {}; remove one of these orderings",
                cycle.join(" -> ")
            ),
        );
    }
}

/// Each distinct cycle found by a depth-first search, as `a -> b -> a`.
fn cycles<'a>(edges: &BTreeMap<&'a str, BTreeSet<&'a str>>) -> Vec<Vec<&'a str>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Active,
        Done,
    }
    let mut marks: BTreeMap<&str, Mark> = BTreeMap::new();
    let mut found: Vec<Vec<&str>> = Vec::new();
    let mut seen_sets: BTreeSet<Vec<&str>> = BTreeSet::new();
    for &start in edges.keys() {
        if marks.contains_key(start) {
            continue;
        }
        // Iterative DFS: (node, its successors not yet visited).
        let mut path: Vec<&str> = vec![start];
        let mut stack: Vec<Vec<&str>> = vec![succ(edges, start)];
        marks.insert(start, Mark::Active);
        while let Some(next) = stack.last_mut() {
            match next.pop() {
                Some(n) => match marks.get(n) {
                    Some(Mark::Active) => {
                        let at = path.iter().position(|&p| p == n).unwrap_or(0);
                        let mut cycle: Vec<&str> = path[at..].to_vec();
                        let mut key = cycle.clone();
                        key.sort_unstable();
                        if seen_sets.insert(key) {
                            cycle.push(n);
                            found.push(cycle);
                        }
                    }
                    Some(Mark::Done) => {}
                    None => {
                        marks.insert(n, Mark::Active);
                        path.push(n);
                        stack.push(succ(edges, n));
                    }
                },
                None => {
                    stack.pop();
                    if let Some(done) = path.pop() {
                        marks.insert(done, Mark::Done);
                    }
                }
            }
        }
    }
    found
}

fn succ<'a>(edges: &BTreeMap<&'a str, BTreeSet<&'a str>>, node: &str) -> Vec<&'a str> {
    // Reversed so that pop() visits successors in name order.
    edges
        .get(node)
        .map(|s| s.iter().rev().copied().collect())
        .unwrap_or_default()
}

fn health_check(v: &mut Errors, job: &JobSpec) {
    let Some(hc) = &job.health_check else {
        return;
    };
    let ports = &job.task.resources.ports;
    match hc.kind {
        HealthCheckType::Http | HealthCheckType::Tcp => {
            if !ports.contains(&hc.port) && !v.unknown.ports {
                v.push(
                    "health_check.port",
                    unrequested_port(&hc.port, ports),
                );
            }
            if hc.kind == HealthCheckType::Http {
                v.endpoint("health_check.endpoint", &hc.endpoint);
                if !(100..=599).contains(&hc.expected_response_code) {
                    v.push(
                        "health_check.expected_response_code",
                        format!(
                            "is {}; use an HTTP status code from 100 to 599, e.g. 200",
                            hc.expected_response_code
                        ),
                    );
                }
            }
        }
        HealthCheckType::Shell => match &hc.command {
            Some(command) if !command.trim().is_empty() => {
                v.templated("health_check.command", command, ports);
            }
            _ => v.push(
                "health_check.command",
                "a shell check needs a command; write one that exits 0 when healthy, e.g. curl -fs localhost:{{ports.http}}/health".to_string(),
            ),
        },
    }
    if hc.min_consecutive_successes < 1 {
        v.push(
            "health_check.min_consecutive_successes",
            "is 0; use 1 or more".to_string(),
        );
    }
    v.positive_duration("health_check.interval", hc.interval);
    v.positive_duration("health_check.timeout", hc.timeout);
}

fn unrequested_port(port: &str, ports: &[String]) -> String {
    if ports.is_empty() {
        format!(
            "`{}` is not a port the task requests (it requests none); add it to task.resources.ports",
            show(port)
        )
    } else {
        format!(
            "`{}` is not a port the task requests; add it to task.resources.ports or use one of {}",
            show(port),
            ports.join(", ")
        )
    }
}

fn lifecycle(v: &mut Errors, job: &JobSpec) {
    let Some(http) = job.lifecycle.as_ref().and_then(|l| l.http.as_ref()) else {
        return;
    };
    let ports = &job.task.resources.ports;
    if !ports.contains(&http.port) && !v.unknown.ports {
        v.push("lifecycle.http.port", unrequested_port(&http.port, ports));
    }
    v.endpoint(
        "lifecycle.http.graceful_shutdown_endpoint",
        &http.graceful_shutdown_endpoint,
    );
    v.endpoint("lifecycle.http.shutdown_endpoint", &http.shutdown_endpoint);
}
