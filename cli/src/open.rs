//! The web UI's addresses (`/ui/...` on the master, docs/ui.md) and `drover open
//! [KEY]`, which opens one in a browser ($BROWSER, else xdg-open) or prints it when
//! there is none (Aurora's `aurora open`).

use std::process::{Command, Stdio};

/// What `drover open` shows: the cluster, a role's jobs, or a job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Cluster,
    Role(String),
    Job(String),
}

impl Target {
    /// Reads `drover open`'s KEY: nothing, `ROLE` or `ROLE/ENV/NAME`.
    pub fn parse(key: Option<&str>) -> Result<Target, String> {
        let Some(key) = key.map(str::trim).filter(|k| !k.is_empty()) else {
            return Ok(Target::Cluster);
        };
        let parts: Vec<&str> = key.split('/').collect();
        if parts.iter().any(|p| p.is_empty()) {
            return Err(format!(
                "KEY `{key}` has an empty part; give a role (www-data) or a job key \
                 (www-data/prod/hello)"
            ));
        }
        match parts.len() {
            1 => Ok(Target::Role(key.to_string())),
            3 => Ok(Target::Job(key.to_string())),
            n => Err(format!(
                "KEY `{key}` has {n} parts; give a role (www-data) or a job key \
                 (www-data/prod/hello)"
            )),
        }
    }

    /// The page's path on the master.
    pub fn path(&self) -> String {
        match self {
            Target::Cluster => "/ui/".to_string(),
            Target::Role(role) => format!("/ui/roles/{}", encode(role)),
            Target::Job(key) => {
                let parts: Vec<String> = key.split('/').map(encode).collect();
                format!("/ui/jobs/{}", parts.join("/"))
            }
        }
    }
}

/// The page's full address on the master whose API is at `master`.
pub fn url(master: &str, target: &Target) -> String {
    format!("{}{}", master.trim_end_matches('/'), target.path())
}

/// A job's page, as `drover job create` prints it.
pub fn job_url(master: &str, key: &str) -> String {
    url(master, &Target::Job(key.to_string()))
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn encode(part: &str) -> String {
    let mut out = String::with_capacity(part.len());
    for b in part.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The browser command: $BROWSER (a command, run with the URL as its last
/// argument), else `xdg-open` when it is on PATH.
fn browser(env: impl Fn(&str) -> Option<String>, on_path: impl Fn(&str) -> bool) -> Option<String> {
    env("BROWSER")
        .map(|b| b.trim().to_string())
        .filter(|b| !b.is_empty())
        .or_else(|| on_path("xdg-open").then(|| "xdg-open".to_string()))
}

fn on_path(name: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(name).is_file()))
}

/// `drover open [KEY]`: prints the page's address and opens it in a browser when
/// there is one. Ok(false) for a KEY that is not a role or job key.
pub fn run(master: &str, key: Option<&str>) -> anyhow::Result<bool> {
    let target = match Target::parse(key) {
        Ok(target) => target,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(false);
        }
    };
    let url = url(master, &target);
    println!("{url}");
    let Some(command) = browser(|k| std::env::var(k).ok(), on_path) else {
        eprintln!("no browser to open it: set BROWSER or install xdg-utils; the address is above");
        return Ok(true);
    };
    let mut words = command.split_whitespace();
    let program = words.next().unwrap_or("xdg-open");
    let spawned = Command::new(program)
        .args(words)
        .arg(&url)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    if let Err(e) = spawned {
        eprintln!("could not start the browser `{command}` ({e}); the address is above");
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_give_the_cluster_role_and_job_pages() {
        let m = "https://127.0.0.1:7070/";
        assert_eq!(
            url(m, &Target::parse(None).unwrap()),
            "https://127.0.0.1:7070/ui/"
        );
        assert_eq!(
            url(m, &Target::parse(Some("www-data")).unwrap()),
            "https://127.0.0.1:7070/ui/roles/www-data"
        );
        assert_eq!(
            job_url("http://m:1", "www-data/prod/hello"),
            "http://m:1/ui/jobs/www-data/prod/hello"
        );
        assert_eq!(Target::Role("a b".into()).path(), "/ui/roles/a%20b");
    }

    #[test]
    fn a_key_of_two_parts_or_an_empty_part_is_refused_with_the_forms() {
        for bad in ["www/prod", "www//hello", "a/b/c/d"] {
            let e = Target::parse(Some(bad)).unwrap_err();
            assert!(e.contains(bad) && e.contains("www-data/prod/hello"), "{e}");
        }
    }

    #[test]
    fn browser_is_dollar_browser_then_xdg_open_then_none() {
        fn env(value: Option<&'static str>) -> impl Fn(&str) -> Option<String> {
            move |_| value.map(str::to_string)
        }
        assert_eq!(
            browser(env(Some("firefox --new-tab")), |_| true).as_deref(),
            Some("firefox --new-tab")
        );
        assert_eq!(
            browser(env(Some(" ")), |_| true).as_deref(),
            Some("xdg-open")
        );
        assert_eq!(browser(env(None), |_| false), None);
    }
}
