//! `drover service list|show`: the announced services (jobs with `announce`) and
//! their endpoints, read from `GET /v1/services`. The rendering is pure and tested
//! here.

use anyhow::bail;
use drover_common::spec::is_valid_name;
use drover_common::wire::ServiceView;

use crate::args::ServiceCommand;
use crate::table::Table;
use crate::Endpoint;

/// Runs a `drover service ...` command.
pub async fn run(master: &Endpoint, command: ServiceCommand) -> anyhow::Result<bool> {
    let client = master.client()?;
    match command {
        ServiceCommand::List { json } => {
            let views: Vec<ServiceView> = client.get("/v1/services").await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&views)?);
            } else {
                print!("{}", service_list(&views));
            }
        }
        ServiceCommand::Show { service, json } => {
            let (role, env, name) = service_key(&service)?;
            let view: ServiceView = client
                .get(&format!("/v1/services/{role}/{env}/{name}"))
                .await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&view)?);
            } else {
                print!("{}", service_details(&view));
            }
        }
    }
    Ok(true)
}

/// `ROLE/ENV/NAME`, each part a name.
fn service_key(text: &str) -> anyhow::Result<(&str, &str, &str)> {
    let parts: Vec<&str> = text.split('/').collect();
    match parts[..] {
        [role, env, name] if [role, env, name].iter().all(|p| is_valid_name(p)) => {
            Ok((role, env, name))
        }
        _ => bail!(
            "`{text}` is not a service: give ROLE/ENV/NAME, e.g. www/prod/web (`drover service list` lists them)"
        ),
    }
}

/// `drover service list`: one line per service.
pub fn service_list(views: &[ServiceView]) -> String {
    if views.is_empty() {
        return "no announced services (a job announces with an `announce` section)\n".to_string();
    }
    let mut t = Table::new(&["SERVICE", "JOB", "PORT", "ENDPOINTS"]);
    for v in views {
        t.row(vec![
            format!("{}/{}/{}", v.role, v.environment, v.name),
            v.job.clone(),
            v.primary_port.clone(),
            v.endpoints.len().to_string(),
        ]);
    }
    t.render()
}

/// `drover service show`: the service and one line per announced instance.
pub fn service_details(v: &ServiceView) -> String {
    let mut out = format!(
        "Service: {}/{}/{}\nJob:     {}\nPrimary: {}\nIndex:   {}\n",
        v.role, v.environment, v.name, v.job, v.primary_port, v.index
    );
    if v.endpoints.is_empty() {
        out.push_str("No instance is announced (none RUNNING).\n");
        return out;
    }
    let mut t = Table::new(&["INSTANCE", "HOST", "IP", "PORTS", "TASK", "SINCE"]);
    for e in &v.endpoints {
        t.row(vec![
            e.instance.to_string(),
            e.host.clone(),
            if e.ip.is_empty() {
                "-".to_string()
            } else {
                e.ip.clone()
            },
            crate::render::ports(&e.ports),
            e.task_id.clone(),
            crate::render::timestamp(e.since),
        ]);
    }
    out.push('\n');
    out.push_str(&t.render());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_common::wire::ServiceEndpoint;

    fn view() -> ServiceView {
        ServiceView {
            role: "www".into(),
            environment: "prod".into(),
            name: "web".into(),
            job: "www/prod/web".into(),
            primary_port: "http".into(),
            index: 42,
            endpoints: vec![ServiceEndpoint {
                instance: 0,
                host: "h1.example".into(),
                ip: "10.0.0.1".into(),
                ports: [("http".to_string(), 31000), ("admin".to_string(), 31001)]
                    .into_iter()
                    .collect(),
                task_id: "web-0-0123456789ab".into(),
                since: 1_700_000_000_000,
            }],
        }
    }

    #[test]
    fn a_service_shows_its_endpoints() {
        let text = service_details(&view());
        assert!(text.contains("Service: www/prod/web"), "{text}");
        assert!(text.contains("10.0.0.1"), "{text}");
        assert!(text.contains("admin=31001 http=31000"), "{text}");
        let mut empty = view();
        empty.endpoints.clear();
        assert!(service_details(&empty).contains("No instance is announced"));
        let list = service_list(&[view()]);
        assert!(
            list.contains("www/prod/web") && list.contains("ENDPOINTS"),
            "{list}"
        );
        assert!(service_list(&[]).contains("no announced services"));
    }

    #[test]
    fn a_service_key_has_three_parts() {
        assert_eq!(service_key("www/prod/web").unwrap(), ("www", "prod", "web"));
        let e = service_key("www/web").unwrap_err().to_string();
        assert!(e.contains("ROLE/ENV/NAME"), "{e}");
        assert!(service_key("www/prod/../x").is_err());
    }
}
