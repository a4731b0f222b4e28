//! The `drover` CLI as a library: the command line (args), the admin API client,
//! rendering, and `drover dev`. main.rs only parses arguments and runs `run`.

pub mod args;
pub mod client;
pub mod commands;
pub mod credentials;
pub mod dev;
pub mod procs;
pub mod progress;
pub mod render;
pub mod specfile;
pub mod table;
pub mod target;

use args::{Cli, Command};

/// Where the admin API is and the token to send it.
#[derive(Clone, Debug)]
pub struct Endpoint {
    pub master: String,
    pub token: Option<String>,
}

impl Endpoint {
    /// A client of the master with the token.
    pub fn client(&self) -> Result<client::Client, client::ClientError> {
        client::Client::with_token(&self.master, self.token.clone())
    }
}

/// Runs one command line; Ok(false) means the command failed after saying why.
pub async fn run(cli: Cli) -> anyhow::Result<bool> {
    if let Command::Dev(args) = cli.command {
        return dev::run(args).await;
    }
    let endpoint = Endpoint {
        token: credentials::resolve(cli.token_file.as_deref(), |k| std::env::var(k).ok())?,
        master: cli.master,
    };
    match cli.command {
        Command::Job(command) => commands::job(&endpoint, command).await,
        Command::Task(command) => commands::task(&endpoint, command).await,
        Command::Agent(command) => commands::agent(&endpoint, command).await,
        Command::Token(command) => commands::token(&endpoint, command).await,
        Command::Dev(_) => Ok(false),
    }
}
