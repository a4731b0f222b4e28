//! Reading a job spec from YAML, TOML or JSON text with every problem reported at
//! once. The text is first read into a format-neutral tree (syntax errors keep their
//! line and column), the tree is checked against the known fields of every struct in
//! `spec` (unknown fields with the closest known name, wrong types, missing fields, all
//! with field paths such as `task.processes[1].cmdline`), then deserialized into a
//! [`JobSpec`] and checked by [`crate::validate::validate`]. The CLI calls [`parse_job`] for files and
//! the master calls [`parse_job_json`] for API requests.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, EnumAccess, MapAccess, SeqAccess, VariantAccess};
use serde_json::{Map, Value};

use crate::spec::JobSpec;
use crate::suggest::closest;
use crate::units::{ByteSize, Duration};
use crate::validate::{key_path, one_line, validate_with, Unknown};
use crate::wire::FieldError;

/// Every problem found in a job spec. `field` is a path such as
/// `task.processes[1].cmdline`; it is empty for problems with the whole document
/// (syntax errors, an unknown file extension).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecErrors {
    /// The problems, in document order as far as it is known.
    pub errors: Vec<FieldError>,
}

/// The text formats a job spec may be written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// `.yaml` or `.yml`.
    Yaml,
    /// `.toml`.
    Toml,
    /// `.json`; also what the API speaks.
    Json,
}

/// The file extensions [`parse_job`] accepts, for messages and docs.
pub const ACCEPTED_EXTENSIONS: &str = ".yaml, .yml, .toml or .json";

impl Format {
    /// The format named by `source_name`'s extension (case-insensitive), if known.
    pub fn from_source_name(source_name: &str) -> Option<Format> {
        let ext = source_name.rsplit_once('.')?.1.to_ascii_lowercase();
        match ext.as_str() {
            "yaml" | "yml" => Some(Format::Yaml),
            "toml" => Some(Format::Toml),
            "json" => Some(Format::Json),
            _ => None,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Format::Yaml => "YAML",
            Format::Toml => "TOML",
            Format::Json => "JSON",
        }
    }
}

impl SpecErrors {
    fn whole(message: String) -> SpecErrors {
        SpecErrors {
            errors: vec![FieldError {
                field: String::new(),
                message: one_line(&message),
            }],
        }
    }
}

impl fmt::Display for SpecErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.errors.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            if e.field.is_empty() {
                write!(f, "{}", e.message)?;
            } else {
                write!(f, "{}: {}", e.field, e.message)?;
            }
        }
        Ok(())
    }
}

impl std::error::Error for SpecErrors {}

/// Reads a job from `text`, choosing YAML, TOML or JSON by `source_name`'s extension,
/// and validates it. On failure every problem is returned, not only the first.
///
/// ```
/// use drover_common::parse::parse_job;
///
/// let text = "
/// role: www-data
/// environment: devel
/// name: hello
/// instances: 0
/// task:
///   processes: [{name: hello, cmdln: echo hi}]
///   resources: {cpu: 0.1, ram: 16MiB, disk: 16MiB}
/// ";
/// let errors = parse_job("hello.yaml", text).unwrap_err();
/// assert_eq!(
///     errors.to_string(),
///     "task.processes[0].cmdln: unknown field `cmdln`; did you mean `cmdline`?\n\
///      task.processes[0].cmdline: is missing; add it as text\n\
///      instances: is 0; use a number from 1 to 10000"
/// );
/// ```
pub fn parse_job(source_name: &str, text: &str) -> Result<JobSpec, SpecErrors> {
    match Format::from_source_name(source_name) {
        Some(format) => parse_job_as(format, text),
        None => Err(SpecErrors::whole(format!(
            "`{source_name}` has no job spec extension; name the file with {ACCEPTED_EXTENSIONS}"
        ))),
    }
}

/// Reads a job from JSON text (the admin API's body) and validates it.
pub fn parse_job_json(text: &str) -> Result<JobSpec, SpecErrors> {
    parse_job_as(Format::Json, text)
}

/// [`parse_job_json`] for a master whose `cron_seconds` test switch allows a
/// seconds field in `cron_schedule` when `cron_seconds`.
pub fn parse_job_json_with(text: &str, cron_seconds: bool) -> Result<JobSpec, SpecErrors> {
    parse_job_checked(Format::Json, text, cron_seconds)
}

/// Reads a job from `text` in `format` and validates it.
pub fn parse_job_as(format: Format, text: &str) -> Result<JobSpec, SpecErrors> {
    parse_job_checked(format, text, false)
}

fn parse_job_checked(
    format: Format,
    text: &str,
    cron_seconds: bool,
) -> Result<JobSpec, SpecErrors> {
    let tree = read_tree(format, text).map_err(SpecErrors::whole)?;
    let mut walk = Walk::default();
    let value = walk.root(&tree);
    let job = match serde_json::from_value::<JobSpec>(value) {
        Ok(job) => Some(job),
        Err(e) => {
            // The walk mirrors spec.rs, so this only happens if they drift apart.
            walk.error("", format!("could not read the job: {e}"));
            None
        }
    };
    let mut errors = walk.errors;
    if let Some(job) = &job {
        let broken = &walk.broken;
        let is_broken = |path: &str| broken.iter().any(|b| covers(b, path));
        let unknown = Unknown {
            ports: is_broken("task.resources.ports"),
            process_names: job
                .task
                .processes
                .iter()
                .enumerate()
                .any(|(i, _)| is_broken(&format!("task.processes[{i}].name"))),
            role: is_broken("role"),
        };
        errors.extend(
            validate_with(job, unknown, cron_seconds)
                .into_iter()
                .filter(|e| !broken.iter().any(|b| covers(b, &e.field))),
        );
    }
    match job {
        Some(job) if errors.is_empty() => Ok(job),
        _ => Err(SpecErrors { errors }),
    }
}

/// Whether `field` is `broken` or inside it.
fn covers(broken: &str, field: &str) -> bool {
    broken.is_empty()
        || field
            .strip_prefix(broken)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('.') || rest.starts_with('['))
}

// ---------------------------------------------------------------------------------
// The format-neutral tree.

/// Any value any of the three formats can hold, keeping what serde_json's Value
/// would lose (non-finite floats, non-text keys, duplicate keys, YAML tags).
#[derive(Clone, Debug, PartialEq)]
enum Node {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    Map(Vec<(Node, Node)>),
    /// A YAML `!tag value`.
    Tagged(String),
    /// Something no spec field can hold (bytes, a TOML date-time), described.
    Other(&'static str),
}

const TOML_DATETIME_KEY: &str = "$__toml_private_datetime";

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Node, D::Error> {
        d.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> de::Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Node, E> {
        Ok(Node::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Node, E> {
        Ok(Node::Int(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Node, E> {
        Ok(Node::Int(v.into()))
    }
    fn visit_i128<E>(self, v: i128) -> Result<Node, E> {
        Ok(Node::Int(v))
    }
    fn visit_u128<E>(self, v: u128) -> Result<Node, E> {
        Ok(i128::try_from(v).map_or(Node::Float(v as f64), Node::Int))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Node, E> {
        Ok(Node::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Node, E> {
        Ok(Node::Str(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Node, E> {
        Ok(Node::Str(v))
    }
    fn visit_bytes<E>(self, _: &[u8]) -> Result<Node, E> {
        Ok(Node::Other("bytes"))
    }
    fn visit_none<E>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }
    fn visit_unit<E>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        Node::deserialize(d)
    }
    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        Node::deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Node::Seq(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut entries = Vec::new();
        while let Some((k, v)) = map.next_entry::<Node, Node>()? {
            entries.push((k, v));
        }
        if let [(Node::Str(k), _)] = entries.as_slice() {
            if k == TOML_DATETIME_KEY {
                return Ok(Node::Other("a TOML date-time"));
            }
        }
        Ok(Node::Map(entries))
    }
    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<Node, A::Error> {
        let (tag, variant): (String, _) = data.variant()?;
        let _inner: Node = variant.newtype_variant()?;
        Ok(Node::Tagged(tag))
    }
}

impl Node {
    /// How a value is named in "found ..." messages.
    fn describe(&self) -> String {
        match self {
            Node::Null => "nothing (null)".to_string(),
            Node::Bool(b) => format!("`{b}`"),
            Node::Int(i) => format!("the number {i}"),
            Node::Float(x) => format!("the number {x:?}"),
            Node::Str(s) => format!("the text {}", quote(s)),
            Node::Seq(_) => "a list".to_string(),
            Node::Map(_) => "a mapping".to_string(),
            Node::Tagged(tag) => format!("a value tagged `!{}`", short(tag)),
            Node::Other(what) => what.to_string(),
        }
    }
}

fn short(s: &str) -> String {
    const MAX: usize = 60;
    let escaped: String = s.escape_debug().collect();
    if escaped.chars().count() <= MAX {
        escaped
    } else {
        format!("{}...", escaped.chars().take(MAX).collect::<String>())
    }
}

fn quote(s: &str) -> String {
    format!("\"{}\"", short(s))
}

/// Parses `text` into a tree; the error is a one-line message with line and column.
fn read_tree(format: Format, text: &str) -> Result<Node, String> {
    let label = format.label();
    let at = |line: usize, column: usize, message: &str| {
        format!("{label} syntax error at line {line}, column {column}: {message}")
    };
    match format {
        Format::Json => serde_json::from_str::<Node>(text).map_err(|e| {
            let (line, column) = (e.line(), e.column());
            let full = e.to_string();
            let suffix = format!(" at line {line} column {column}");
            let message = full.strip_suffix(&suffix).unwrap_or(&full);
            at(line, column, message)
        }),
        Format::Yaml => {
            if let Some((line, column)) = flow_too_deep(text) {
                return Err(at(
                    line,
                    column,
                    &format!(
                        "lists and mappings nested more than {MAX_FLOW_DEPTH} deep; flatten the document"
                    ),
                ));
            }
            serde_yaml::from_str::<Node>(text).map_err(|e| {
                let full = e.to_string();
                match e.location() {
                    Some(loc) => {
                        let suffix = format!(" at line {} column {}", loc.line(), loc.column());
                        let message = match full.find(&suffix) {
                            Some(i) => format!("{}{}", &full[..i], &full[i + suffix.len()..]),
                            None => full.clone(),
                        };
                        at(loc.line(), loc.column(), &message)
                    }
                    None => format!("{label} error: {full}"),
                }
            })
        }
        Format::Toml => toml::from_str::<Node>(text).map_err(|e| {
            let message = e.message().trim().replace('\n', "; ");
            match e.span() {
                Some(span) => {
                    let (line, column) = line_column(text, span.start);
                    at(line, column, &message)
                }
                None => format!("{label} error: {message}"),
            }
        }),
    }
}

/// Deeper `[`/`{` nesting than any spec needs; serde_yaml refuses past 128 anyway.
const MAX_FLOW_DEPTH: usize = 1000;

/// Where YAML flow nesting first exceeds [`MAX_FLOW_DEPTH`], found by a rough scan
/// that skips quoted text and comments. The YAML parser takes time quadratic in that
/// depth before its own recursion limit applies, so deep input is refused up front.
fn flow_too_deep(text: &str) -> Option<(usize, usize)> {
    let mut depth = 0usize;
    let mut quote: Option<char> = None;
    let mut previous = '\n';
    let mut comment = false;
    for (offset, c) in text.char_indices() {
        match (quote, c) {
            _ if comment => comment = c != '\n',
            (Some(q), _) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '#') if previous.is_whitespace() => comment = true,
            (None, '[' | '{') => {
                depth += 1;
                if depth > MAX_FLOW_DEPTH {
                    return Some(line_column(text, offset));
                }
            }
            (None, ']' | '}') => depth = depth.saturating_sub(1),
            _ => {}
        }
        previous = c;
    }
    None
}

/// 1-based line and column (in characters) of byte `offset` in `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let mut end = offset.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let before = &text[..end];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[line_start..].chars().count() + 1)
}

// ---------------------------------------------------------------------------------
// The schema: the fields of every struct in spec.rs, as data.

#[derive(Clone, Copy, Debug)]
enum Kind {
    Str,
    Bool,
    U32,
    U16,
    /// A whole number, negative allowed.
    I32,
    F64,
    Duration,
    Size,
    Enum(&'static [&'static str]),
    /// A mapping from text to text.
    StrMap,
    /// A list of text.
    StrList,
    /// A list of lists of text.
    StrListList,
    Struct(&'static [Field]),
    StructList(&'static [Field]),
}

#[derive(Clone, Copy, Debug)]
struct Field {
    name: &'static str,
    kind: Kind,
    /// No serde default: the field must be written.
    required: bool,
    /// An `Option`: `null` is accepted and means absent.
    nullable: bool,
}

const fn req(name: &'static str, kind: Kind) -> Field {
    Field {
        name,
        kind,
        required: true,
        nullable: false,
    }
}

const fn opt(name: &'static str, kind: Kind) -> Field {
    Field {
        name,
        kind,
        required: false,
        nullable: false,
    }
}

const fn nullable(name: &'static str, kind: Kind) -> Field {
    Field {
        name,
        kind,
        required: false,
        nullable: true,
    }
}

const PROCESS: &[Field] = &[
    req("name", Kind::Str),
    req("cmdline", Kind::Str),
    opt("max_failures", Kind::U32),
    opt("daemon", Kind::Bool),
    opt("ephemeral", Kind::Bool),
    opt("min_duration", Kind::Duration),
    opt("final", Kind::Bool),
];

const RESOURCES: &[Field] = &[
    req("cpu", Kind::F64),
    req("ram", Kind::Size),
    req("disk", Kind::Size),
    opt("ports", Kind::StrList),
    opt("pids", Kind::U32),
];

const TASK: &[Field] = &[
    req("processes", Kind::StructList(PROCESS)),
    opt("order", Kind::StrListList),
    req("resources", Kind::Struct(RESOURCES)),
    opt("max_failures", Kind::U32),
    opt("max_concurrency", Kind::U32),
    opt("finalization_wait", Kind::Duration),
    nullable("user", Kind::Str),
    opt("allow_root", Kind::Bool),
    opt("env", Kind::StrMap),
    opt("artifacts", Kind::StructList(ARTIFACT)),
    opt("network", Kind::Enum(&["host", "isolated"])),
];

const ARTIFACT: &[Field] = &[
    req("url", Kind::Str),
    nullable("sha256", Kind::Str),
    nullable("dest", Kind::Str),
    opt("extract", Kind::Enum(&["auto", "none"])),
    nullable("mode", Kind::Str),
    opt("executable", Kind::Bool),
];

const HEALTH_CHECK: &[Field] = &[
    opt("type", Kind::Enum(&["http", "shell", "tcp"])),
    opt("port", Kind::Str),
    opt("endpoint", Kind::Str),
    opt("expected_response", Kind::Str),
    opt("expected_response_code", Kind::U16),
    nullable("command", Kind::Str),
    opt("initial_interval", Kind::Duration),
    opt("interval", Kind::Duration),
    opt("timeout", Kind::Duration),
    opt("max_consecutive_failures", Kind::U32),
    opt("min_consecutive_successes", Kind::U32),
];

const HTTP_LIFECYCLE: &[Field] = &[
    opt("port", Kind::Str),
    opt("graceful_shutdown_endpoint", Kind::Str),
    opt("shutdown_endpoint", Kind::Str),
    opt("graceful_shutdown_wait", Kind::Duration),
    opt("shutdown_wait", Kind::Duration),
];

const LIFECYCLE: &[Field] = &[nullable("http", Kind::Struct(HTTP_LIFECYCLE))];

const UPDATE: &[Field] = &[
    opt("batch_size", Kind::U32),
    opt("watch", Kind::Duration),
    opt("max_per_instance_failures", Kind::U32),
    opt("max_total_failures", Kind::U32),
    opt("rollback_on_failure", Kind::Bool),
];

const PARTITION_POLICY: &[Field] = &[
    opt("reschedule", Kind::Bool),
    opt("delay", Kind::Duration),
    opt("exclusive", Kind::Bool),
];

const SLA_POLICY: &[Field] = &[
    nullable("min_healthy", Kind::U32),
    nullable("min_healthy_percent", Kind::U32),
    opt("min_time", Kind::Duration),
    nullable("max_disrupted", Kind::U32),
];

const ANNOUNCE: &[Field] = &[
    req("primary_port", Kind::Str),
    opt("ports", Kind::StrList),
    nullable("name", Kind::Str),
    opt("drain_delay", Kind::Duration),
];

const JOB: &[Field] = &[
    req("role", Kind::Str),
    req("environment", Kind::Str),
    req("name", Kind::Str),
    opt("instances", Kind::U32),
    opt("service", Kind::Bool),
    opt("tier", Kind::Enum(&["preferred", "preemptible"])),
    opt("priority", Kind::U32),
    opt("max_task_failures", Kind::U32),
    opt("constraints", Kind::StrMap),
    req("task", Kind::Struct(TASK)),
    nullable("health_check", Kind::Struct(HEALTH_CHECK)),
    nullable("lifecycle", Kind::Struct(LIFECYCLE)),
    opt("update", Kind::Struct(UPDATE)),
    opt("partition_policy", Kind::Struct(PARTITION_POLICY)),
    nullable("cron_schedule", Kind::Str),
    nullable("cron_timezone", Kind::Str),
    opt(
        "cron_collision_policy",
        Kind::Enum(&["KILL_EXISTING", "CANCEL_NEW"]),
    ),
    nullable("sla_policy", Kind::Struct(SLA_POLICY)),
    nullable("announce", Kind::Struct(ANNOUNCE)),
    nullable("spread", Kind::StructList(SPREAD)),
    nullable("affinity", Kind::StructList(AFFINITY)),
    nullable("placement", Kind::Enum(&["binpack", "spread"])),
];

const SPREAD: &[Field] = &[req("attribute", Kind::Str), opt("weight", Kind::U32)];

const AFFINITY: &[Field] = &[
    req("attribute", Kind::Str),
    req("value", Kind::Str),
    req("weight", Kind::I32),
];

/// Every field path the schema knows, e.g. `task.processes[].cmdline`; for docs and
/// for tests that keep the schema and spec.rs in step.
pub fn known_field_paths() -> Vec<String> {
    fn collect(fields: &[Field], prefix: &str, out: &mut Vec<String>) {
        for f in fields {
            let path = if prefix.is_empty() {
                f.name.to_string()
            } else {
                format!("{prefix}.{}", f.name)
            };
            out.push(path.clone());
            match f.kind {
                Kind::Struct(inner) => collect(inner, &path, out),
                Kind::StructList(inner) => collect(inner, &format!("{path}[]"), out),
                _ => {}
            }
        }
    }
    let mut out = Vec::new();
    collect(JOB, "", &mut out);
    out
}

// ---------------------------------------------------------------------------------
// The walk: checks the tree against the schema and builds a clean JSON value.

#[derive(Default)]
struct Walk {
    errors: Vec<FieldError>,
    /// Paths whose written value was missing or unusable and was replaced by a
    /// placeholder or default; semantic errors inside them would only repeat it.
    broken: Vec<String>,
}

fn child(parent: &str, name: &str) -> String {
    key_path(parent, name)
}

impl Walk {
    fn error(&mut self, field: &str, message: String) {
        self.errors.push(FieldError {
            field: field.to_string(),
            message: one_line(&message),
        });
    }

    fn root(&mut self, tree: &Node) -> Value {
        if !matches!(tree, Node::Map(_)) {
            self.error(
                "",
                format!(
                    "a job spec is a mapping with the fields role, environment, name, task and more; found {}",
                    tree.describe()
                ),
            );
            self.broken.push(String::new());
            return placeholder(Kind::Struct(JOB), "");
        }
        self.structure(tree, JOB, "")
    }

    /// A struct: every entry checked, unknown and duplicate keys reported, missing
    /// required fields reported and given placeholders so validation can go on.
    fn structure(&mut self, node: &Node, fields: &'static [Field], path: &str) -> Value {
        let mut out = Map::new();
        let mut seen = std::collections::BTreeSet::new();
        let entries: &[(Node, Node)] = match node {
            Node::Map(entries) => entries,
            _ => &[],
        };
        for (key, value) in entries {
            let Node::Str(key) = key else {
                self.error(
                    path,
                    format!(
                        "{} a key that is {}; field names are text, e.g. {}",
                        if path.is_empty() {
                            "the job spec has"
                        } else {
                            "has"
                        },
                        key.describe(),
                        fields[0].name
                    ),
                );
                continue;
            };
            let field_path = child(path, key);
            let Some(field) = fields.iter().find(|f| f.name == key) else {
                self.error(&field_path, unknown_field_message(key, fields));
                continue;
            };
            if !seen.insert(key.as_str()) {
                self.error(&field_path, "is written twice; keep one".to_string());
                continue;
            }
            if field.nullable && *value == Node::Null {
                out.insert(key.clone(), Value::Null);
                continue;
            }
            match self.value(value, field.kind, &field_path) {
                Some(v) => {
                    out.insert(key.clone(), v);
                }
                None => {
                    self.broken.push(field_path.clone());
                    if field.required {
                        out.insert(key.clone(), placeholder(field.kind, &field_path));
                    }
                }
            }
        }
        for field in fields.iter().filter(|f| f.required) {
            if !out.contains_key(field.name) {
                let field_path = child(path, field.name);
                if !self.broken.contains(&field_path) {
                    self.error(
                        &field_path,
                        format!("is missing; add it as {}", missing_hint(field.kind)),
                    );
                    self.broken.push(field_path.clone());
                }
                out.insert(field.name.to_string(), placeholder(field.kind, &field_path));
            }
        }
        Value::Object(out)
    }

    /// One value of `kind`; None (after reporting why) when it is unusable.
    fn value(&mut self, node: &Node, kind: Kind, path: &str) -> Option<Value> {
        let wrong = |walk: &mut Walk, extra: &str| {
            walk.error(
                path,
                format!(
                    "expected {}, found {}{extra}",
                    expected(kind),
                    node.describe()
                ),
            );
            None
        };
        match (kind, node) {
            (Kind::Str, Node::Str(s)) => Some(Value::String(s.clone())),
            (Kind::Str, Node::Int(_) | Node::Float(_) | Node::Bool(_)) => {
                wrong(self, "; put it in quotes to make it text")
            }
            (Kind::Bool, Node::Bool(b)) => Some(Value::Bool(*b)),
            (Kind::U32, _) => self.whole(node, path, 0, u32::MAX.into()),
            (Kind::U16, _) => self.whole(node, path, 0, u16::MAX.into()),
            (Kind::I32, _) => self.whole(node, path, i32::MIN.into(), i32::MAX.into()),
            (Kind::F64, Node::Int(i)) => Some(Value::from(*i as f64)),
            (Kind::F64, Node::Float(x)) if x.is_finite() => Some(Value::from(*x)),
            (Kind::F64, Node::Float(x)) => {
                self.error(path, format!("is {x}; write a finite number, e.g. 0.5"));
                None
            }
            (Kind::Duration, Node::Str(s)) => match s.parse::<Duration>() {
                Ok(_) => Some(Value::String(s.clone())),
                Err(e) => {
                    self.error(path, e.to_string());
                    None
                }
            },
            (Kind::Size, Node::Str(s)) => match s.parse::<ByteSize>() {
                Ok(_) => Some(Value::String(s.clone())),
                Err(e) => {
                    self.error(path, e.to_string());
                    None
                }
            },
            (Kind::Duration | Kind::Size, Node::Int(_) | Node::Float(_)) => {
                wrong(self, "; numbers need a unit and quotes")
            }
            (Kind::Enum(values), Node::Str(s)) => {
                if values.contains(&s.as_str()) {
                    Some(Value::String(s.clone()))
                } else {
                    let hint = closest(s, values.iter().copied())
                        .map(|c| format!("; did you mean `{c}`?"))
                        .unwrap_or_default();
                    self.error(
                        path,
                        format!("{} is not one of {}{hint}", quote(s), values.join(", ")),
                    );
                    None
                }
            }
            (Kind::StrMap, Node::Map(entries)) => {
                let mut out = Map::new();
                let mut ok = true;
                for (k, v) in entries {
                    let Node::Str(k) = k else {
                        self.error(
                            path,
                            format!("has a key that is {}; keys are text", k.describe()),
                        );
                        ok = false;
                        continue;
                    };
                    let entry_path = child(path, k);
                    if out.contains_key(k.as_str()) {
                        self.error(&entry_path, "is written twice; keep one".to_string());
                        ok = false;
                        continue;
                    }
                    match self.value(v, Kind::Str, &entry_path) {
                        Some(v) => {
                            out.insert(k.clone(), v);
                        }
                        None => ok = false,
                    }
                }
                ok.then_some(Value::Object(out))
            }
            (Kind::StrList, Node::Seq(items)) => {
                let mut out = Vec::new();
                let mut ok = true;
                for (i, item) in items.iter().enumerate() {
                    match self.value(item, Kind::Str, &format!("{path}[{i}]")) {
                        Some(v) => out.push(v),
                        None => ok = false,
                    }
                }
                ok.then_some(Value::Array(out))
            }
            (Kind::StrListList, Node::Seq(items)) => {
                let mut out = Vec::new();
                let mut ok = true;
                for (i, item) in items.iter().enumerate() {
                    match self.value(item, Kind::StrList, &format!("{path}[{i}]")) {
                        Some(v) => out.push(v),
                        None => ok = false,
                    }
                }
                ok.then_some(Value::Array(out))
            }
            (Kind::Struct(fields), Node::Map(_)) => Some(self.structure(node, fields, path)),
            (Kind::StructList(fields), Node::Seq(items)) => {
                let mut out = Vec::new();
                for (i, item) in items.iter().enumerate() {
                    let item_path = format!("{path}[{i}]");
                    if !matches!(item, Node::Map(_)) {
                        self.error(
                            &item_path,
                            format!(
                                "expected a mapping with the fields {}, found {}",
                                field_names(fields),
                                item.describe()
                            ),
                        );
                        self.broken.push(item_path.clone());
                    }
                    // A non-mapping item becomes a placeholder so the indices of the
                    // items after it stay the ones the user wrote.
                    out.push(self.item_or_placeholder(item, fields, &item_path));
                }
                Some(Value::Array(out))
            }
            _ => wrong(self, ""),
        }
    }

    fn item_or_placeholder(&mut self, item: &Node, fields: &'static [Field], path: &str) -> Value {
        if matches!(item, Node::Map(_)) {
            self.structure(item, fields, path)
        } else {
            placeholder(Kind::Struct(fields), path)
        }
    }

    /// A whole number from `min` to `max`.
    fn whole(&mut self, node: &Node, path: &str, min: i128, max: i128) -> Option<Value> {
        let message = match node {
            Node::Int(i) if (min..=max).contains(i) => {
                return Some(match u64::try_from(*i) {
                    Ok(u) => Value::from(u),
                    Err(_) => Value::from(i64::try_from(*i).ok()?),
                });
            }
            Node::Int(i) => format!("is {i}; use a whole number from {min} to {max}"),
            Node::Float(x) => format!("is {x:?}; use a whole number from {min} to {max}"),
            other => format!(
                "expected a whole number from {min} to {max}, found {}",
                other.describe()
            ),
        };
        self.error(path, message);
        None
    }
}

/// A stand-in for a missing or unusable required value. Text placeholders hold a NUL
/// so they can never pass as a real name, and are unique per path.
fn placeholder(kind: Kind, path: &str) -> Value {
    match kind {
        Kind::Str | Kind::Enum(_) => Value::String(format!("\0{path}")),
        Kind::Bool => Value::Bool(false),
        Kind::U32 | Kind::U16 | Kind::I32 => Value::from(1u64),
        Kind::F64 => Value::from(1.0),
        Kind::Duration => Value::String("1s".to_string()),
        Kind::Size => Value::String("1MiB".to_string()),
        Kind::StrMap => Value::Object(Map::new()),
        Kind::StrList | Kind::StrListList | Kind::StructList(_) => Value::Array(Vec::new()),
        Kind::Struct(fields) => Value::Object(
            fields
                .iter()
                .filter(|f| f.required)
                .map(|f| {
                    (
                        f.name.to_string(),
                        placeholder(f.kind, &child(path, f.name)),
                    )
                })
                .collect(),
        ),
    }
}

/// What a value of `kind` looks like, for messages.
fn expected(kind: Kind) -> String {
    match kind {
        Kind::Str => "text".to_string(),
        Kind::Bool => "true or false".to_string(),
        Kind::U32 => "a whole number".to_string(),
        Kind::U16 => "a whole number up to 65535".to_string(),
        Kind::I32 => "a whole number, e.g. 20 or -20".to_string(),
        Kind::F64 => "a number, e.g. 0.5".to_string(),
        Kind::Duration => "a duration in quotes, e.g. \"30s\" or \"5m\"".to_string(),
        Kind::Size => "a size in quotes, e.g. \"512MiB\" or \"2GiB\"".to_string(),
        Kind::Enum(values) => format!("one of {}", values.join(", ")),
        Kind::StrMap => "a mapping from names to text".to_string(),
        Kind::StrList => "a list of text".to_string(),
        Kind::StrListList => "a list of lists of process names".to_string(),
        Kind::Struct(fields) => format!("a mapping with the fields {}", field_names(fields)),
        Kind::StructList(fields) => {
            format!("a list of mappings with the fields {}", field_names(fields))
        }
    }
}

/// Like [`expected`], but a missing struct names only the fields it needs.
fn missing_hint(kind: Kind) -> String {
    match kind {
        Kind::Struct(fields) => {
            let required: Vec<&str> = fields
                .iter()
                .filter(|f| f.required)
                .map(|f| f.name)
                .collect();
            format!("a mapping with at least {}", required.join(", "))
        }
        other => expected(other),
    }
}

fn field_names(fields: &[Field]) -> String {
    fields.iter().map(|f| f.name).collect::<Vec<_>>().join(", ")
}

fn unknown_field_message(key: &str, fields: &'static [Field]) -> String {
    if let Some(best) = closest(key, fields.iter().map(|f| f.name)) {
        return format!("unknown field `{}`; did you mean `{best}`?", short(key));
    }
    let homes = homes_of(key, fields);
    if !homes.is_empty() {
        return format!(
            "unknown field `{}` here; it belongs inside {}",
            short(key),
            homes.join(" or ")
        );
    }
    format!(
        "unknown field `{}`; known fields here: {}",
        short(key),
        field_names(fields)
    )
}

/// Relative paths under `fields` where a field called `key` exists.
fn homes_of(key: &str, fields: &'static [Field]) -> Vec<String> {
    fn search(key: &str, fields: &[Field], prefix: &str, depth: usize, out: &mut Vec<String>) {
        if depth > 4 {
            return;
        }
        for f in fields {
            let inner = match f.kind {
                Kind::Struct(inner) => (inner, format!("{prefix}{}", f.name)),
                Kind::StructList(inner) => (inner, format!("{prefix}{}[]", f.name)),
                _ => continue,
            };
            if inner.0.iter().any(|g| g.name == key) {
                out.push(format!("`{}`", inner.1));
            }
            search(key, inner.0, &format!("{}.", inner.1), depth + 1, out);
        }
    }
    let mut out = Vec::new();
    search(key, fields, "", 0, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_column_counts_from_one() {
        assert_eq!(line_column("ab\ncd", 0), (1, 1));
        assert_eq!(line_column("ab\ncd", 4), (2, 2));
        assert_eq!(line_column("é\nx", 1), (1, 1));
    }

    #[test]
    fn covers_matches_the_path_and_what_is_inside_it() {
        assert!(covers("task.processes", "task.processes"));
        assert!(covers("task.processes", "task.processes[0].name"));
        assert!(covers("task", "task.resources.cpu"));
        assert!(!covers("task.processes", "task.processes_x"));
        assert!(covers("", "anything"));
    }

    #[test]
    fn deep_yaml_flow_nesting_is_found_outside_quotes_and_comments() {
        let deep = "[".repeat(MAX_FLOW_DEPTH + 1);
        assert_eq!(
            flow_too_deep(&format!("a:\n  {deep}")),
            Some((2, MAX_FLOW_DEPTH + 3))
        );
        assert_eq!(flow_too_deep(&format!("a: \"{deep}\"")), None);
        assert_eq!(flow_too_deep(&format!("a: '{deep}'")), None);
        assert_eq!(flow_too_deep(&format!("a: 1 # {deep}\nb: [x]")), None);
        assert_eq!(flow_too_deep(&"[]".repeat(5000)), None);
    }

    #[test]
    fn extension_picks_the_format() {
        assert_eq!(Format::from_source_name("a/b.yml"), Some(Format::Yaml));
        assert_eq!(Format::from_source_name("JOB.YAML"), Some(Format::Yaml));
        assert_eq!(Format::from_source_name("x.toml"), Some(Format::Toml));
        assert_eq!(Format::from_source_name("x.json"), Some(Format::Json));
        assert_eq!(Format::from_source_name("x.txt"), None);
        assert_eq!(Format::from_source_name("yaml"), None);
    }
}
