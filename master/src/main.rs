//! `drover-master`: tracing, config (exit 64 naming the field on bad config), run
//! until SIGTERM or SIGINT, then stop accepting, flush the store and exit 0; or
//! `drover-master migrate` (see `migrate`).

use std::process::ExitCode;

use clap::Parser;
use drover_master::{Args, Config};
use tokio::signal::unix::{signal, SignalKind};

/// RUST_LOG, else `info`; hickory's DNS server logs every question at info, so
/// it is held to warnings unless RUST_LOG names it.
fn log_filter() -> tracing_subscriber::EnvFilter {
    let given = std::env::var("RUST_LOG").unwrap_or_default();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    if given.contains("hickory") {
        return filter;
    }
    match "hickory_server=warn".parse() {
        Ok(quiet) => filter.add_directive(quiet),
        Err(_) => filter,
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(log_filter())
        .with_writer(std::io::stderr)
        .init();
    let mut args = Args::parse();
    if let Some(drover_master::config::MasterCommand::Migrate { from, to, force }) =
        args.command.take()
    {
        let tls = drover_master::migrate::EtcdTls {
            ca: args.etcd_ca,
            cert: args.etcd_cert,
            key: args.etcd_key,
        };
        return match drover_master::migrate::migrate(&from, &to, force, &tls) {
            Ok(m) => {
                println!(
                    "migrated {} jobs, {} tasks, {} agents (change index {}), {} tokens, {} audit records from {from} to {to}",
                    m.jobs, m.tasks, m.agents, m.index, m.tokens, m.audit
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("drover-master migrate: {e}");
                ExitCode::from(1)
            }
        };
    }
    let config = match Config::load(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("drover-master: bad config: {e}");
            return ExitCode::from(64);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("drover-master: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(async {
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let shutdown = async move {
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM: stopping"),
                _ = int.recv() => tracing::info!("SIGINT: stopping"),
            }
        };
        drover_master::run(config, shutdown)
            .await
            .map_err(std::io::Error::other)
    });
    match result {
        Ok(()) => {
            tracing::info!("stopped; the store is flushed");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("drover-master: {e}");
            ExitCode::from(1)
        }
    }
}
