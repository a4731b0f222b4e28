//! Where the CLI finds its bearer token: `--token-file` (or `DROVER_TOKEN_FILE`),
//! then `DROVER_TOKEN`, then the `token` or `token_file` key of the user's config
//! file (`$DROVER_CONFIG`, else `$XDG_CONFIG_HOME/drover/config.toml`, else
//! `~/.config/drover/config.toml`). No token is not an error here: the master
//! answers 401 saying how to get one.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use drover_os::fs::{write_private, Durability};
use serde::Deserialize;

/// The user's config file; every key optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    token: Option<String>,
    token_file: Option<PathBuf>,
}

/// The config file's path from the environment (None: no home to look in).
pub fn config_path(env: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    if let Some(path) = env("DROVER_CONFIG").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(path));
    }
    let base = match env("XDG_CONFIG_HOME").filter(|p| !p.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env("HOME").filter(|p| !p.is_empty())?).join(".config"),
    };
    Some(base.join("drover").join("config.toml"))
}

fn read_token_file(path: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the token file {}", path.display()))?;
    let token = text.trim();
    anyhow::ensure!(
        !token.is_empty(),
        "the token file {} is empty; it should hold one drv_... token",
        path.display()
    );
    Ok(token.to_string())
}

/// The token to send, from the flag, the environment or the config file.
pub fn resolve(
    token_file: Option<&Path>,
    env: impl Fn(&str) -> Option<String>,
) -> anyhow::Result<Option<String>> {
    if let Some(path) = token_file {
        return read_token_file(path).map(Some);
    }
    if let Some(token) = env("DROVER_TOKEN").filter(|t| !t.trim().is_empty()) {
        return Ok(Some(token.trim().to_string()));
    }
    let Some(path) = config_path(&env) else {
        return Ok(None);
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let file: ConfigFile =
        toml::from_str(&text).with_context(|| format!("config file {}", path.display()))?;
    match (file.token, file.token_file) {
        (Some(token), _) => Ok(Some(token.trim().to_string())),
        (None, Some(path)) => read_token_file(&path).map(Some),
        (None, None) => Ok(None),
    }
}

/// Writes a token to `path`, readable by its owner only.
pub fn write_token_file(path: &Path, token: &str) -> std::io::Result<()> {
    write_private(path, format!("{token}\n").as_bytes(), Durability::Synced)
}

/// Reads the token in `path` (trimmed).
pub fn read_token(path: &Path) -> anyhow::Result<String> {
    read_token_file(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_wins_then_the_environment_then_the_config_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("t");
        std::fs::write(&file, "drv_file\n").unwrap();
        let config = dir.path().join("drover").join("config.toml");
        std::fs::create_dir_all(config.parent().unwrap()).unwrap();
        std::fs::write(&config, "token = \"drv_config\"\n").unwrap();
        let xdg = dir.path().to_str().unwrap().to_string();
        let env = |with_token: bool| {
            let xdg = xdg.clone();
            move |k: &str| match k {
                "DROVER_TOKEN" if with_token => Some("drv_env".to_string()),
                "XDG_CONFIG_HOME" => Some(xdg.clone()),
                _ => None,
            }
        };
        assert_eq!(
            resolve(Some(&file), env(true)).unwrap().as_deref(),
            Some("drv_file")
        );
        assert_eq!(
            resolve(None, env(true)).unwrap().as_deref(),
            Some("drv_env")
        );
        assert_eq!(
            resolve(None, env(false)).unwrap().as_deref(),
            Some("drv_config")
        );
        assert_eq!(resolve(None, |_| None).unwrap(), None);
        let missing = dir.path().join("missing");
        let err = resolve(Some(&missing), |_| None).unwrap_err().to_string();
        assert!(err.contains("cannot read the token file"), "{err}");
    }
}
