//! Nothing panics on any input: property tests feed arbitrary text, mutated valid
//! specs and random trees shaped like specs to parse_job in all three formats (and so
//! to validate). A panic or stack overflow fails the test; errors are fine.

#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

use drover_common::parse::{known_field_paths, parse_job, parse_job_json};
use drover_common::validate::validate;
use proptest::prelude::*;
use serde_json::Value;

const SOURCES: [&str; 3] = ["job.yaml", "job.toml", "job.json"];

const VALID_YAML: &str = include_str!("../../examples/hello_world.yaml");
const VALID_MULTI: &str = include_str!("../../examples/multi_process.yaml");
const VALID_TOML: &str = include_str!("../../examples/spread.toml");

fn valid_json() -> String {
    let job = parse_job("job.yaml", VALID_MULTI).unwrap();
    serde_json::to_string_pretty(&job).unwrap()
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(400)
}

/// Parses `text` as every format; only a panic can fail.
fn parse_all(text: &str) {
    for source in SOURCES {
        let result = parse_job(source, text);
        if let Ok(job) = &result {
            assert_eq!(validate(job), vec![], "parse_job accepted an invalid job");
        }
        if let Err(e) = result {
            // Display must not panic either, and every error says something.
            assert!(e.errors.iter().all(|e| !e.message.is_empty()));
            assert_eq!(e.to_string().lines().count(), e.errors.len(), "{e}");
        }
    }
}

/// One edit of a text: delete, insert or duplicate a span.
#[derive(Clone, Debug)]
enum Edit {
    Delete { at: usize, len: usize },
    Insert { at: usize, text: String },
    Duplicate { at: usize, len: usize },
}

fn edit_strategy() -> impl Strategy<Value = Edit> {
    let syntax = prop::sample::select(vec![
        "{",
        "}",
        "[",
        "]",
        ":",
        ",",
        "\"",
        "'",
        "\n",
        "  ",
        "-",
        "!",
        "&a",
        "*a",
        "#",
        "|",
        ">",
        "=",
        "0",
        "-1",
        "1e999",
        "4294967296",
        ".nan",
        "null",
        "~",
        "true",
        "{{",
        "}}",
        "ports.",
        "\\",
        "\u{0}",
        "é",
        "limit:",
        "[[a]]",
        "\t",
        "<<: *a",
    ]);
    prop_oneof![
        (any::<usize>(), 0usize..40).prop_map(|(at, len)| Edit::Delete { at, len }),
        (any::<usize>(), syntax).prop_map(|(at, t)| Edit::Insert {
            at,
            text: t.to_string()
        }),
        (any::<usize>(), "\\PC{0,8}").prop_map(|(at, text)| Edit::Insert { at, text }),
        (any::<usize>(), 0usize..60).prop_map(|(at, len)| Edit::Duplicate { at, len }),
    ]
}

fn boundary(text: &str, at: usize) -> usize {
    let mut at = at % (text.len() + 1);
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

fn apply(text: &str, edits: &[Edit]) -> String {
    let mut out = text.to_string();
    for edit in edits {
        match edit {
            Edit::Delete { at, len } => {
                let start = boundary(&out, *at);
                let end = boundary(&out, (start + len).min(out.len()));
                out.replace_range(start..end.max(start), "");
            }
            Edit::Insert { at, text } => {
                let at = boundary(&out, *at);
                out.insert_str(at, text);
            }
            Edit::Duplicate { at, len } => {
                let start = boundary(&out, *at);
                let end = boundary(&out, (start + len).min(out.len())).max(start);
                let copy = out[start..end].to_string();
                out.insert_str(end, &copy);
            }
        }
    }
    out
}

/// Leaves that exercise the type checks and the validator's bounds.
fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        prop::sample::select(vec![
            0i64,
            1,
            -1,
            2,
            65_535,
            65_536,
            4_294_967_295,
            4_294_967_296,
            i64::MIN,
            i64::MAX
        ])
        .prop_map(Value::from),
        prop::sample::select(vec![0.0f64, 0.5, -0.5, 1024.0, 1024.5, 1e300]).prop_map(Value::from),
        prop::sample::select(vec![
            "",
            "a",
            ".",
            "..",
            "www-data",
            "http",
            "health",
            "server",
            "setup",
            "1s",
            "0s",
            "5m",
            "1MiB",
            "0B",
            "17TiB",
            "limit:1",
            "limit:0",
            "a|b",
            "!x",
            "www-data/hello",
            "{{ports.http}}",
            "{{bogus}}",
            "{{",
            "http",
            "shell",
            "tcp",
            "preemptible",
            "/health",
            "root",
            "DROVER_X",
        ])
        .prop_map(|s| Value::String(s.to_string())),
        "\\PC{0,12}".prop_map(Value::String),
    ]
}

/// Random trees whose keys are drawn mostly from the spec's field names, so they
/// reach deep into the schema and the validator.
fn tree() -> impl Strategy<Value = Value> {
    let mut names: Vec<String> = known_field_paths()
        .iter()
        .map(|p| {
            p.rsplit('.')
                .next()
                .unwrap()
                .trim_end_matches("[]")
                .to_string()
        })
        .collect();
    names.sort();
    names.dedup();
    names.extend(["X".to_string(), "bogus".to_string(), "rack".to_string()]);
    let key = prop::sample::select(names);
    leaf().prop_recursive(5, 64, 8, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((key.clone(), inner), 0..8)
                .prop_map(|entries| Value::Object(entries.into_iter().collect())),
        ]
    })
}

/// A valid job with one subtree replaced by a random one at a random field.
fn mutated_job() -> impl Strategy<Value = Value> {
    let base: Value = serde_json::from_str(&valid_json()).unwrap();
    let paths = known_field_paths();
    (prop::sample::select(paths), tree()).prop_map(move |(path, sub)| {
        let mut job = base.clone();
        let mut node = &mut job;
        let parts: Vec<&str> = path.split('.').collect();
        for (i, part) in parts.iter().enumerate() {
            let (name, list) = match part.strip_suffix("[]") {
                Some(n) => (n, true),
                None => (*part, false),
            };
            let Value::Object(map) = node else { break };
            if i == parts.len() - 1 {
                map.insert(name.to_string(), sub.clone());
                break;
            }
            let Some(next) = map.get_mut(name) else { break };
            node = if list {
                match next {
                    Value::Array(items) if !items.is_empty() => &mut items[0],
                    _ => break,
                }
            } else {
                next
            };
        }
        job
    })
}

proptest! {
    // 400 cases each in CI; PROPTEST_CASES=20000 for a longer hunt.
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,200}") {
        parse_all(&text);
    }

    #[test]
    fn arbitrary_bytes_as_lossy_text_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        parse_all(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn mutated_valid_specs_never_panic(
        which in 0usize..4,
        edits in prop::collection::vec(edit_strategy(), 1..6),
    ) {
        let (source, text) = match which {
            0 => ("job.yaml", VALID_YAML.to_string()),
            1 => ("job.yaml", VALID_MULTI.to_string()),
            2 => ("job.toml", VALID_TOML.to_string()),
            _ => ("job.json", valid_json()),
        };
        let mutated = apply(&text, &edits);
        let _ = parse_job(source, &mutated);
        parse_all(&mutated);
    }

    #[test]
    fn random_spec_shaped_trees_never_panic_in_any_format(value in tree()) {
        let _ = parse_job_json(&value.to_string());
        if let Ok(yaml) = serde_yaml::to_string(&value) {
            let _ = parse_job("job.yaml", &yaml);
        }
        if let Ok(toml) = toml::to_string(&value) {
            let _ = parse_job("job.toml", &toml);
        }
    }

    #[test]
    fn valid_jobs_with_one_random_field_never_panic(value in mutated_job()) {
        if let Ok(job) = parse_job_json(&value.to_string()) {
            prop_assert_eq!(validate(&job), vec![]);
        }
        if let Ok(yaml) = serde_yaml::to_string(&value) {
            let _ = parse_job("job.yaml", &yaml);
        }
        if let Ok(toml) = toml::to_string(&value) {
            let _ = parse_job("job.toml", &toml);
        }
    }
}

#[test]
fn deep_nesting_is_an_error_not_a_stack_overflow() {
    let depth = 100_000;
    let json = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    assert!(parse_job_json(&json).is_err());
    let yaml = format!("a: {}{}", "[".repeat(depth), "]".repeat(depth));
    assert!(parse_job("job.yaml", &yaml).is_err());
    let toml = format!("a = {}{}", "[".repeat(depth), "]".repeat(depth));
    assert!(parse_job("job.toml", &toml).is_err());
    let yaml_maps = "a:\n".to_string()
        + &(1..2000)
            .map(|i| format!("{}a:\n", " ".repeat(i)))
            .collect::<String>();
    assert!(parse_job("job.yaml", &yaml_maps).is_err());
}

#[test]
fn alias_bombs_are_refused_quickly() {
    let bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n\
                b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n\
                c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\n\
                d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n\
                e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]\n\
                f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]\n\
                g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]\n\
                h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]\n\
                i: &i [*h, *h, *h, *h, *h, *h, *h, *h, *h]\n";
    let started = std::time::Instant::now();
    assert!(parse_job("job.yaml", bomb).is_err());
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
}
