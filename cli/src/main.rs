//! The `drover` binary: parse the command line, run it on a single-threaded runtime,
//! print any error, and exit 1 on failure.

use std::process::ExitCode;

use clap::Parser as _;

fn main() -> ExitCode {
    let cli = drover::args::Cli::parse();
    if !matches!(cli.command, drover::args::Command::Dev(_)) {
        die_quietly_on_broken_pipe();
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(drover::run(cli)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `drover job status KEY | head` must end quietly, as Unix tools do, instead of
/// panicking in `println!` on EPIPE. Rust ignores SIGPIPE by default; the default
/// action (terminate) is restored for every command except `dev`, which must always
/// get to stop the cluster it started.
fn die_quietly_on_broken_pipe() {
    if let Err(e) = drover::sys::restore_default_sigpipe() {
        eprintln!("warning: cannot restore SIGPIPE: {e}");
    }
}
