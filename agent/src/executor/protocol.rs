//! The executor's Unix socket protocol: a subscription to its statuses after a
//! sequence number, kill requests on a subscribed connection, one status line
//! parsed, and whether something listens on a socket.

use std::path::Path;

use drover_common::state::ExitReason;
use drover_common::wire::{ExecutorRequest, ExecutorStatus};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::UnixStream;

/// The status stream of one subscription. The whole stream is kept: closing our
/// write direction would end the subscription at the executor.
pub type StatusLines = Lines<BufReader<UnixStream>>;

async fn send_line(stream: &mut UnixStream, req: &ExecutorRequest) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(req).map_err(std::io::Error::other)?;
    line.push(b'\n');
    stream.write_all(&line).await
}

/// Subscribes to every status after `after_seq` on a connected stream: one from
/// [`subscribe`], or the connection a forked executor was started with
/// ([`Spawned::connection`]).
pub async fn subscribe_on(mut stream: UnixStream, after_seq: u64) -> std::io::Result<StatusLines> {
    send_line(&mut stream, &ExecutorRequest::Subscribe { after_seq }).await?;
    Ok(BufReader::new(stream).lines())
}

/// Asks an executor to start its kill escalation on a subscribed connection (the
/// executor takes requests on any connection).
pub async fn send_kill_on(lines: &mut StatusLines, reason: ExitReason) -> std::io::Result<()> {
    send_line(
        lines.get_mut().get_mut(),
        &ExecutorRequest::Kill {
            reason: Some(reason),
        },
    )
    .await
}

/// Parses one status line.
pub fn parse_status(line: &str) -> Option<ExecutorStatus> {
    serde_json::from_str(line).ok()
}

/// True if something accepts connections on the socket.
pub fn socket_is_live(socket: &Path) -> bool {
    connect_std(socket).is_ok()
}

/// Connects to an executor's socket. A Unix connect completes at once (or fails), so
/// the blocking std call is fine on the runtime.
pub(super) fn connect(socket: &Path) -> std::io::Result<UnixStream> {
    let stream = connect_std(socket)?;
    stream.set_nonblocking(true)?;
    UnixStream::from_std(stream)
}

/// Connects, through the task directory when the socket path is too
/// long for a Unix socket address (see `wire::socket_address`).
fn connect_std(socket: &Path) -> std::io::Result<std::os::unix::net::UnixStream> {
    let (address, _dir) =
        drover_common::wire::socket_address(socket, |dir| std::fs::File::open(dir))?;
    std::os::unix::net::UnixStream::connect(address)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_path_too_long_for_sun_path_is_still_reached() {
        let dir = tempfile::tempdir().unwrap();
        let area = dir.path().join("d".repeat(120)).join("t");
        std::fs::create_dir_all(&area).unwrap();
        let socket = area.join("executor.sock");
        assert!(socket.as_os_str().len() > drover_common::wire::SUN_PATH_MAX);
        assert!(!socket_is_live(&socket));
        let (address, _dir) =
            drover_common::wire::socket_address(&socket, |dir| std::fs::File::open(dir)).unwrap();
        let _listener = std::os::unix::net::UnixListener::bind(address).unwrap();
        assert!(socket.exists());
        assert!(socket_is_live(&socket));
    }

    #[test]
    fn a_missing_socket_is_not_live() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!socket_is_live(&dir.path().join("x.sock")));
        let _listener = std::os::unix::net::UnixListener::bind(dir.path().join("y.sock")).unwrap();
        assert!(socket_is_live(&dir.path().join("y.sock")));
    }
}
