//! Templating of cmdlines, env values and health commands: `{{instance}}`,
//! `{{ports.NAME}}`, `{{role}}`, `{{environment}}`, `{{name}}`, `{{task_id}}`,
//! `{{sandbox}}`. The same values reach processes as `DROVER_*` environment variables.

use std::collections::BTreeMap;

/// The values a template may name, known once a task is placed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TemplateContext {
    pub role: String,
    pub environment: String,
    pub name: String,
    pub instance: u32,
    pub task_id: String,
    pub sandbox: String,
    pub ports: BTreeMap<String, u16>,
}

/// A template that names something unknown or is not closed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    #[error("`{{{{{0}}}}}` is not a known template variable; use instance, role, environment, name, task_id, sandbox or ports.NAME")]
    UnknownVariable(String),
    #[error("`{{{{ports.{0}}}}}` names a port the task does not request; add `{0}` to task.resources.ports")]
    UndeclaredPort(String),
    #[error("`{{{{` at byte {0} is never closed with `}}}}`")]
    Unclosed(usize),
}

/// Every `{{...}}` variable named in `text`, in order.
pub fn variables(text: &str) -> Result<Vec<String>, TemplateError> {
    let mut out = Vec::new();
    let mut rest = text;
    let mut offset = 0;
    while let Some(start) = rest.find("{{") {
        let after = &rest[start + 2..];
        let end = after
            .find("}}")
            .ok_or(TemplateError::Unclosed(offset + start))?;
        out.push(after[..end].trim().to_string());
        let consumed = start + 2 + end + 2;
        offset += consumed;
        rest = &rest[consumed..];
    }
    Ok(out)
}

/// Checks that every variable in `text` is known, and every port is in `ports`.
pub fn check(text: &str, ports: &[String]) -> Vec<TemplateError> {
    match variables(text) {
        Err(e) => vec![e],
        Ok(vars) => vars
            .into_iter()
            .filter_map(|v| match v.strip_prefix("ports.") {
                Some(port) if ports.iter().any(|p| p == port) => None,
                Some(port) => Some(TemplateError::UndeclaredPort(port.to_string())),
                None if KNOWN.contains(&v.as_str()) => None,
                None => Some(TemplateError::UnknownVariable(v)),
            })
            .collect(),
    }
}

const KNOWN: [&str; 6] = [
    "instance",
    "role",
    "environment",
    "name",
    "task_id",
    "sandbox",
];

impl TemplateContext {
    fn lookup(&self, var: &str) -> Result<String, TemplateError> {
        Ok(match var {
            "instance" => self.instance.to_string(),
            "role" => self.role.clone(),
            "environment" => self.environment.clone(),
            "name" => self.name.clone(),
            "task_id" => self.task_id.clone(),
            "sandbox" => self.sandbox.clone(),
            other => match other.strip_prefix("ports.") {
                Some(port) => self
                    .ports
                    .get(port)
                    .map(u16::to_string)
                    .ok_or_else(|| TemplateError::UndeclaredPort(port.to_string()))?,
                None => return Err(TemplateError::UnknownVariable(other.to_string())),
            },
        })
    }

    /// Replaces every `{{...}}` in `text`.
    pub fn render(&self, text: &str) -> Result<String, TemplateError> {
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        let mut offset = 0;
        while let Some(start) = rest.find("{{") {
            out.push_str(&rest[..start]);
            let after = &rest[start + 2..];
            let end = after
                .find("}}")
                .ok_or(TemplateError::Unclosed(offset + start))?;
            out.push_str(&self.lookup(after[..end].trim())?);
            let consumed = start + 2 + end + 2;
            offset += consumed;
            rest = &rest[consumed..];
        }
        out.push_str(rest);
        Ok(out)
    }

    /// The `DROVER_*` variables: DROVER_ROLE, DROVER_ENVIRONMENT, DROVER_NAME,
    /// DROVER_INSTANCE, DROVER_TASK_ID, DROVER_SANDBOX and `DROVER_PORT_<NAME>` (upper
    /// case, `-` and `.` become `_`).
    pub fn environment(&self) -> Vec<(String, String)> {
        let mut env = vec![
            ("DROVER_ROLE".to_string(), self.role.clone()),
            ("DROVER_ENVIRONMENT".to_string(), self.environment.clone()),
            ("DROVER_NAME".to_string(), self.name.clone()),
            ("DROVER_INSTANCE".to_string(), self.instance.to_string()),
            ("DROVER_TASK_ID".to_string(), self.task_id.clone()),
            ("DROVER_SANDBOX".to_string(), self.sandbox.clone()),
        ];
        for (name, port) in &self.ports {
            let var: String = name
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() {
                        c.to_ascii_uppercase()
                    } else {
                        '_'
                    }
                })
                .collect();
            env.push((format!("DROVER_PORT_{var}"), port.to_string()));
        }
        env
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> TemplateContext {
        TemplateContext {
            role: "www-data".into(),
            environment: "prod".into(),
            name: "hello".into(),
            instance: 3,
            task_id: "t-1".into(),
            sandbox: "/sb".into(),
            ports: [("http".to_string(), 8080)].into_iter().collect(),
        }
    }

    #[test]
    fn renders_every_variable() {
        let out = ctx()
            .render("{{role}}/{{environment}}/{{name}} #{{instance}} {{task_id}} {{sandbox}} :{{ports.http}}")
            .unwrap();
        assert_eq!(out, "www-data/prod/hello #3 t-1 /sb :8080");
    }

    #[test]
    fn reports_unknown_and_undeclared() {
        assert_eq!(
            check("{{ports.admin}} {{bogus}}", &["http".into()]),
            vec![
                TemplateError::UndeclaredPort("admin".into()),
                TemplateError::UnknownVariable("bogus".into())
            ]
        );
        assert_eq!(check("{{instance", &[]), vec![TemplateError::Unclosed(0)]);
    }

    #[test]
    fn environment_names_ports() {
        let env = ctx().environment();
        assert!(env.contains(&("DROVER_PORT_HTTP".to_string(), "8080".to_string())));
        assert!(env.contains(&("DROVER_INSTANCE".to_string(), "3".to_string())));
    }
}
