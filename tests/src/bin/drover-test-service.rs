//! A tiny HTTP service for executor and cluster tests: answers `GET /health` with
//! `ok`, records every request (`<unix_ms> <METHOD> <path>` per line) to `--record
//! FILE`, and on `POST /quitquitquit` exits when `--exit-on-quit` is given. With
//! `--ignore-term` it ignores SIGTERM (only SIGKILL stops it).
//!
//! Flags: `--port N` (0 picks one; the port is printed on stdout), `--ignore-term`,
//! `--exit-on-quit`, `--record FILE`, `--health-body TEXT` (what /health answers).

use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context};
use drover_common::state::now_ms;

struct Config {
    port: u16,
    ignore_term: bool,
    exit_on_quit: bool,
    record: Option<PathBuf>,
    health_body: String,
}

fn parse_args() -> anyhow::Result<Config> {
    let mut cfg = Config {
        port: 0,
        ignore_term: false,
        exit_on_quit: false,
        record: None,
        health_body: "ok".into(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--port" => {
                cfg.port = args
                    .next()
                    .context("--port needs a number")?
                    .parse()
                    .context("--port needs a number")?
            }
            "--ignore-term" => cfg.ignore_term = true,
            "--exit-on-quit" => cfg.exit_on_quit = true,
            "--record" => cfg.record = Some(args.next().context("--record needs a file")?.into()),
            "--health-body" => cfg.health_body = args.next().context("--health-body needs text")?,
            other => bail!("unknown flag `{other}`; use --port, --ignore-term, --exit-on-quit, --record, --health-body"),
        }
    }
    Ok(cfg)
}

#[allow(unsafe_code)]
fn ignore_sigterm() -> anyhow::Result<()> {
    use nix::sys::signal::{signal, SigHandler, Signal};
    // SAFETY: installs SIG_IGN, which runs no code in the handler; nothing else in
    // this process manages SIGTERM.
    unsafe { signal(Signal::SIGTERM, SigHandler::SigIgn) }.context("ignoring SIGTERM")?;
    Ok(())
}

fn handle(
    stream: TcpStream,
    cfg: &Config,
    record: &Mutex<Option<std::fs::File>>,
) -> anyhow::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    // Skip the headers.
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" || line == "\n" {
            break;
        }
    }
    let mut parts = request_line.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let path = parts.next().unwrap_or("").to_string();
    if let Ok(mut guard) = record.lock() {
        if let Some(f) = guard.as_mut() {
            writeln!(f, "{} {method} {path}", now_ms())?;
            f.flush()?;
        }
    }
    let (code, body) = match (method.as_str(), path.as_str()) {
        ("GET", "/health") => (200, cfg.health_body.clone()),
        ("POST", "/quitquitquit") | ("POST", "/abortabortabort") => (200, "bye".to_string()),
        _ => (404, "not found".to_string()),
    };
    let mut out = stream;
    write!(
        out,
        "HTTP/1.1 {code} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    out.flush()?;
    if cfg.exit_on_quit && path == "/quitquitquit" && method == "POST" {
        std::process::exit(0);
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let cfg = Arc::new(parse_args()?);
    if cfg.ignore_term {
        ignore_sigterm()?;
    }
    let record = match &cfg.record {
        Some(path) => Some(
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("opening --record {}", path.display()))?,
        ),
        None => None,
    };
    let record = Arc::new(Mutex::new(record));
    let listener = TcpListener::bind(("127.0.0.1", cfg.port))
        .with_context(|| format!("binding 127.0.0.1:{}", cfg.port))?;
    println!("{}", listener.local_addr()?.port());
    std::io::stdout().flush()?;
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        let (cfg, record) = (cfg.clone(), record.clone());
        std::thread::spawn(move || {
            if let Err(e) = handle(stream, &cfg, &record) {
                eprintln!("drover-test-service: {e:#}");
            }
        });
    }
    Ok(())
}
