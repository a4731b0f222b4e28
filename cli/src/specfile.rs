//! Reading job spec files from disk through `drover_common::parse::parse_job`, and
//! `drover job validate`'s report (works offline).

use std::path::Path;

use drover_common::JobSpec;

/// A spec file that could not be read or is not a valid job: one line per problem,
/// each `FILE: field.path: message`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecFileErrors {
    pub lines: Vec<String>,
}

impl std::fmt::Display for SpecFileErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.lines.join("\n"))
    }
}

impl std::error::Error for SpecFileErrors {}

impl SpecFileErrors {
    /// The lines for a command that failed because of them (`job create`): each starts
    /// with `error: `, as every CLI error does. (`job validate` reports them bare: the
    /// problems are its output.)
    pub fn with_error_prefix(&self) -> String {
        self.lines
            .iter()
            .map(|l| format!("error: {l}"))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Reads and validates one spec file.
pub fn load(path: &Path) -> Result<JobSpec, SpecFileErrors> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| SpecFileErrors {
        lines: vec![format!("{name}: cannot read the file: {e}")],
    })?;
    parse(&name, &text)
}

/// Parses and validates spec text; `name` picks the format by its extension.
pub fn parse(name: &str, text: &str) -> Result<JobSpec, SpecFileErrors> {
    drover_common::parse::parse_job(name, text).map_err(|errors| SpecFileErrors {
        lines: errors
            .to_string()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| format!("{name}: {l}"))
            .collect(),
    })
}

/// `drover job validate`: the report for every file, and whether all were valid.
pub fn validate_files(paths: &[impl AsRef<Path>]) -> (String, bool) {
    let mut out = String::new();
    let mut all_ok = true;
    for path in paths {
        let path = path.as_ref();
        match load(path) {
            Ok(_) => {
                out.push_str(&format!("{}: OK\n", path.display()));
            }
            Err(errors) => {
                all_ok = false;
                out.push_str(&errors.to_string());
                out.push('\n');
            }
        }
    }
    (out, all_ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
role: www-data
environment: devel
name: hello
task:
  processes:
    - name: main
      cmdline: "echo hi"
  resources: {cpu: 0.1, ram: 64MiB, disk: 64MiB}
"#;

    #[test]
    fn valid_file_prints_ok() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("good.yaml");
        std::fs::write(&path, GOOD).unwrap();
        let (out, ok) = validate_files(&[&path]);
        assert!(ok);
        assert_eq!(out, format!("{}: OK\n", path.display()));
    }

    #[test]
    fn every_error_is_prefixed_with_the_file() {
        let bad = GOOD
            .replace("cpu: 0.1", "cpu: -1")
            .replace("name: main", "name: \"..\"");
        let err = parse("bad.yaml", &bad).unwrap_err();
        assert!(err.lines.len() >= 2, "{err}");
        assert!(
            err.lines.iter().all(|l| l.starts_with("bad.yaml: ")),
            "{err}"
        );
        assert!(err.to_string().contains("task.resources.cpu"), "{err}");
    }

    #[test]
    fn missing_file_is_reported_not_fatal() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good.yaml");
        std::fs::write(&good, GOOD).unwrap();
        let missing = dir.path().join("missing.yaml");
        let (out, ok) = validate_files(&[&missing, &good]);
        assert!(!ok);
        assert!(out.contains("missing.yaml: cannot read the file"), "{out}");
        assert!(out.contains("good.yaml: OK"), "{out}");
    }
}
