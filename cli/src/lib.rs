//! The `drover` CLI as a library: the command line (args), the admin API client,
//! rendering, and `drover dev`. main.rs only parses arguments and runs `run`.

pub mod args;
pub mod client;
pub mod commands;
pub mod credentials;
pub mod dev;
pub mod devcontext;
pub mod exec;
pub mod follow;
pub mod hosts;
pub mod linediff;
pub mod open;
pub mod procs;
pub mod progress;
pub mod render;
pub mod roles;
pub mod services;
pub mod specfile;
pub mod sys;
pub mod table;
pub mod target;
pub mod tls;
pub mod update;

use args::{Cli, Command};

/// Where the admin API is and the token to send it.
#[derive(Clone, Debug)]
pub struct Endpoint {
    pub master: String,
    /// Every master given (several: masters sharing an etcd store; the client
    /// rides a failover between them).
    pub masters: Vec<String>,
    pub token: Option<String>,
    /// The cluster CA for an https:// master.
    pub ca: Option<std::path::PathBuf>,
    /// Printed on stderr when a client is made: the master is the default one.
    pub note: Option<String>,
    /// Reads accept a standby's copy during a failover (`--stale`).
    pub stale: bool,
}

impl Endpoint {
    /// A client of the master with the token.
    pub fn client(&self) -> Result<client::Client, client::ClientError> {
        if let Some(note) = &self.note {
            eprintln!("{note}");
        }
        Ok(
            client::Client::connect(&self.master, self.token.clone(), self.ca.as_deref())?
                .with_masters(self.masters.clone())
                .with_stale(self.stale),
        )
    }
}

/// Runs one command line; Ok(false) means the command failed after saying why.
pub async fn run(cli: Cli) -> anyhow::Result<bool> {
    match cli.command {
        Command::Dev(args) => return dev::run(args).await,
        Command::Tls(command) => return commands::tls(command),
        Command::Completions { shell } => {
            completions(shell, &mut std::io::stdout())?;
            return Ok(true);
        }
        _ => {}
    }
    let env = |k: &str| std::env::var(k).ok();
    let dev = devcontext::path(env).and_then(|path| {
        devcontext::read(&path, devcontext::drover_alive).map(|context| (path, context))
    });
    let has_token =
        cli.token_file.is_some() || env("DROVER_TOKEN").is_some_and(|t| !t.trim().is_empty());
    let chosen = devcontext::choose(cli.master, cli.ca, cli.token_file, has_token, dev);
    let masters = client::Client::master_list(&chosen.master);
    let master = client::Client::find_leader(&chosen.master, chosen.ca.as_deref()).await;
    let endpoint = Endpoint {
        masters,
        note: chosen.note,
        token: credentials::resolve(chosen.token_file.as_deref(), env)?,
        master,
        ca: chosen.ca,
        stale: cli.stale,
    };
    match cli.command {
        Command::Job(command) => commands::job(&endpoint, command).await,
        Command::Task(command) => commands::task(&endpoint, command).await,
        Command::Agent(command) => commands::agent(&endpoint, command).await,
        Command::Token(command) => commands::token(&endpoint, command).await,
        Command::Cluster(command) => commands::cluster(&endpoint, command).await,
        Command::Quota(command) => commands::quota(&endpoint, command).await,
        Command::Cron(command) => commands::cron(&endpoint, command).await,
        Command::Role(command) => roles::run(&endpoint, command).await,
        Command::Service(command) => services::run(&endpoint, command).await,
        Command::Host(command) => hosts::run(&endpoint, command).await,
        Command::Open { key } => {
            if let Some(note) = &endpoint.note {
                eprintln!("{note}");
            }
            open::run(&endpoint.master, key.as_deref())
        }
        Command::Dev(_) | Command::Tls(_) | Command::Completions { .. } => Ok(false),
    }
}

/// `drover completions SHELL`: the completion script clap_complete writes from the
/// command line's definition, so it cannot drift from it.
pub fn completions(shell: args::Shell, out: &mut dyn std::io::Write) -> std::io::Result<()> {
    use clap::CommandFactory as _;
    let generator = match shell {
        args::Shell::Bash => clap_complete::Shell::Bash,
        args::Shell::Zsh => clap_complete::Shell::Zsh,
        args::Shell::Fish => clap_complete::Shell::Fish,
    };
    let mut buffer = Vec::new();
    clap_complete::generate(generator, &mut Cli::command(), "drover", &mut buffer);
    out.write_all(&buffer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completions_name_the_subcommands_for_every_shell() {
        for shell in [args::Shell::Bash, args::Shell::Zsh, args::Shell::Fish] {
            let mut out = Vec::new();
            completions(shell, &mut out).unwrap();
            let text = String::from_utf8(out).unwrap();
            for word in ["drover", "job", "create", "--wait", "completions", "dev"] {
                assert!(text.contains(word), "{shell:?} lacks {word}");
            }
        }
    }
}
