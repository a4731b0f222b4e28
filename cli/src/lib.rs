//! The `drover` CLI as a library: the command line (args), the admin API client,
//! rendering, and `drover dev`. main.rs only parses arguments and runs `run`.

pub mod args;
pub mod client;
pub mod commands;
pub mod dev;
pub mod procs;
pub mod progress;
pub mod render;
pub mod specfile;
pub mod table;
pub mod target;
pub mod update;

use args::{Cli, Command};

/// Runs one command line; Ok(false) means the command failed after saying why.
pub async fn run(cli: Cli) -> anyhow::Result<bool> {
    match cli.command {
        Command::Job(command) => commands::job(&cli.master, command).await,
        Command::Task(command) => commands::task(&cli.master, command).await,
        Command::Agent(command) => commands::agent(&cli.master, command).await,
        Command::Dev(args) => dev::run(args).await,
    }
}
