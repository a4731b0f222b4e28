//! `drover task exec KEY/INSTANCE [--process P] [-i] [-t] -- CMD ARGS...`: runs a
//! command inside the instance's running task through the master (docs/cli.md),
//! relays stdin, stdout, stderr, window size changes and signals, and exits with the
//! command's status. With `-t` the local terminal is put in raw mode (the remote
//! PTY interprets keys, Ctrl-C included) and restored at the end.

use std::io::Write as _;
use std::os::fd::AsFd as _;

use anyhow::{anyhow, bail};
use drover_common::wire::ExecFrame;
use nix::sys::termios;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::signal::unix::{signal, SignalKind};

use crate::client::Client;
use crate::target::parse_instance_target;

/// What `drover task exec` was asked.
#[derive(Debug, Clone)]
pub struct ExecArgs {
    pub target: String,
    pub process: Option<String>,
    pub stdin: bool,
    pub tty: bool,
    pub command: Vec<String>,
}

/// Puts the terminal on stdin in raw mode until dropped.
struct RawMode(termios::Termios);

impl RawMode {
    fn enter() -> Option<RawMode> {
        let stdin = std::io::stdin();
        let saved = termios::tcgetattr(stdin.as_fd()).ok()?;
        let mut raw = saved.clone();
        termios::cfmakeraw(&mut raw);
        termios::tcsetattr(stdin.as_fd(), termios::SetArg::TCSANOW, &raw).ok()?;
        Some(RawMode(saved))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = termios::tcsetattr(std::io::stdin().as_fd(), termios::SetArg::TCSANOW, &self.0);
    }
}

/// Runs the command; returns its exit status (the CLI's).
pub async fn exec(client: &Client, args: ExecArgs) -> anyhow::Result<i32> {
    let (key, instance) = parse_instance_target(&args.target)?;
    if args.command.is_empty() {
        bail!(
            "no command given: write it after --, e.g. drover task exec {} -- id",
            args.target
        );
    }
    let mut query = vec![
        ("command", serde_json::to_string(&args.command)?),
        ("tty", args.tty.to_string()),
        ("stdin", args.stdin.to_string()),
    ];
    if let Some(p) = &args.process {
        query.push(("process", p.clone()));
    }
    let size = crate::sys::terminal_size(std::io::stdin().as_fd())
        .or_else(|| crate::sys::terminal_size(std::io::stdout().as_fd()));
    if let (true, Some((rows, cols))) = (args.tty, size) {
        query.push(("rows", rows.to_string()));
        query.push(("cols", cols.to_string()));
    }
    let path = format!(
        "/v1/jobs/{}/{}/{}/instances/{instance}/exec",
        key.role, key.environment, key.name
    );
    let stream = client.upgrade(&path, &query).await?;
    let raw = if args.tty && size.is_some() {
        RawMode::enter()
    } else {
        None
    };
    let code = relay(stream, &args).await;
    drop(raw);
    code
}

async fn relay<S>(stream: S, args: &ExecArgs) -> anyhow::Result<i32>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let (mut rd, wr) = tokio::io::split(stream);
    let (tx, mut rx) = tokio::sync::mpsc::channel::<ExecFrame>(64);
    let mut background = tokio::task::JoinSet::new();
    background.spawn(async move {
        let mut wr = wr;
        while let Some(frame) = rx.recv().await {
            if wr.write_all(&frame.encode()).await.is_err() {
                return;
            }
        }
    });
    if args.stdin {
        let tx = tx.clone();
        background.spawn(async move {
            let mut stdin = tokio::io::stdin();
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                match stdin.read(&mut buf).await {
                    Ok(0) | Err(_) => {
                        let _ = tx.send(ExecFrame::StdinEof).await;
                        return;
                    }
                    Ok(n) => {
                        if tx.send(ExecFrame::Stdin(buf[..n].to_vec())).await.is_err() {
                            return;
                        }
                    }
                }
            }
        });
    }
    if args.tty {
        let tx = tx.clone();
        let mut winch = signal(SignalKind::window_change())?;
        background.spawn(async move {
            while winch.recv().await.is_some() {
                if let Some((rows, cols)) = crate::sys::terminal_size(std::io::stdin().as_fd()) {
                    if tx.send(ExecFrame::Resize { rows, cols }).await.is_err() {
                        return;
                    }
                }
            }
        });
    }
    for kind in [
        SignalKind::interrupt(),
        SignalKind::terminate(),
        SignalKind::hangup(),
        SignalKind::quit(),
    ] {
        let tx = tx.clone();
        let mut sig = signal(kind)?;
        background.spawn(async move {
            while sig.recv().await.is_some() {
                if tx
                    .send(ExecFrame::Signal(kind.as_raw_value()))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        });
    }
    drop(tx);
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 32 * 1024];
    let result = 'outer: loop {
        let n = match rd.read(&mut chunk).await {
            Ok(0) => {
                break Err(anyhow!(
                    "the connection closed before the command's exit status arrived"
                ))
            }
            Ok(n) => n,
            Err(e) => break Err(anyhow!("the exec stream failed: {e}")),
        };
        buf.extend_from_slice(&chunk[..n]);
        loop {
            let (frame, used) = match ExecFrame::decode(&buf) {
                Ok(Some(pair)) => pair,
                Ok(None) => break,
                Err(e) => break 'outer Err(anyhow!("the exec stream is malformed: {e}")),
            };
            buf.drain(..used);
            match frame {
                ExecFrame::Stdout(data) => {
                    let mut out = std::io::stdout().lock();
                    let _ = out.write_all(&data);
                    let _ = out.flush();
                }
                ExecFrame::Stderr(data) => {
                    let mut err = std::io::stderr().lock();
                    let _ = err.write_all(&data);
                    let _ = err.flush();
                }
                ExecFrame::Error(message) => eprintln!("drover: {message}"),
                ExecFrame::Exit(code) => break 'outer Ok(code),
                _ => {}
            }
        }
    };
    background.abort_all();
    result
}
