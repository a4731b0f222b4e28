//! The `drover` CLI as a library: the command line (args), the admin API client,
//! rendering, and `drover dev`. main.rs only parses arguments and runs `run`.

pub mod args;
pub mod client;
pub mod commands;
pub mod credentials;
pub mod dev;
pub mod hosts;
pub mod procs;
pub mod progress;
pub mod render;
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
    pub token: Option<String>,
    /// The cluster CA for an https:// master.
    pub ca: Option<std::path::PathBuf>,
}

impl Endpoint {
    /// A client of the master with the token.
    pub fn client(&self) -> Result<client::Client, client::ClientError> {
        client::Client::connect(&self.master, self.token.clone(), self.ca.as_deref())
    }
}

/// Runs one command line; Ok(false) means the command failed after saying why.
pub async fn run(cli: Cli) -> anyhow::Result<bool> {
    match cli.command {
        Command::Dev(args) => return dev::run(args).await,
        Command::Tls(command) => return commands::tls(command),
        _ => {}
    }
    let endpoint = Endpoint {
        token: credentials::resolve(cli.token_file.as_deref(), |k| std::env::var(k).ok())?,
        master: cli.master,
        ca: cli.ca,
    };
    match cli.command {
        Command::Job(command) => commands::job(&endpoint, command).await,
        Command::Task(command) => commands::task(&endpoint, command).await,
        Command::Agent(command) => commands::agent(&endpoint, command).await,
        Command::Token(command) => commands::token(&endpoint, command).await,
        Command::Cluster(command) => commands::cluster(&endpoint, command).await,
        Command::Quota(command) => commands::quota(&endpoint, command).await,
        Command::Cron(command) => commands::cron(&endpoint, command).await,
        Command::Host(command) => hosts::run(&endpoint, command).await,
        Command::Dev(_) | Command::Tls(_) => Ok(false),
    }
}
