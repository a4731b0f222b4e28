//! Health checking: the pure counter that turns check results into "healthy" (the
//! task may be RUNNING) and "unhealthy" (kill it), and the checks themselves: a tiny
//! HTTP/1.1 client over a tokio TcpStream (also used for the lifecycle POSTs), TCP
//! connect, and a shell command.

use std::process::ExitStatus;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::machine::Millis;

/// The largest HTTP response we read; a health answer is a few bytes.
const MAX_RESPONSE: usize = 16 * 1024;

/// Why a check (or a lifecycle POST) failed; its text is the `last_error` a task's
/// status carries. `request` reads like `GET http://127.0.0.1:8080/health`.
#[derive(Debug, thiserror::Error)]
pub enum HealthError {
    #[error("{request}: {source}")]
    Http {
        request: String,
        source: std::io::Error,
    },
    #[error("{request} timed out after {timeout:?}")]
    HttpTimedOut { request: String, timeout: Duration },
    #[error("{request}: answer longer than {max} bytes", max = MAX_RESPONSE)]
    TooLong { request: String },
    #[error("{request}: malformed HTTP answer")]
    Malformed { request: String },
    #[error("{request} answered {code} (expected {expected})")]
    WrongCode {
        request: String,
        code: u16,
        expected: u16,
    },
    /// `body` is the trimmed answer, cut at 100 bytes.
    #[error("{request} answered `{body}` (expected `{expected}`)")]
    WrongBody {
        request: String,
        body: String,
        expected: String,
    },
    #[error("connect to 127.0.0.1:{port}: {source}")]
    Connect { port: u16, source: std::io::Error },
    #[error("connect to 127.0.0.1:{port} timed out after {timeout:?}")]
    ConnectTimedOut { port: u16, timeout: Duration },
    #[error("cannot run health command `{shown}`: {source}")]
    ShellSpawn {
        shown: String,
        source: std::io::Error,
    },
    #[error("health command `{shown}` exited with {status}")]
    ShellExited { shown: String, status: ExitStatus },
    #[error("health command `{shown}`: {source}")]
    ShellWait {
        shown: String,
        source: std::io::Error,
    },
    #[error("health command `{shown}` timed out after {timeout:?}")]
    ShellTimedOut { shown: String, timeout: Duration },
}

#[cfg(test)]
impl HealthError {
    /// A refused TCP check on `port`, as tests give a failure.
    pub(crate) fn refused(port: u16) -> HealthError {
        HealthError::Connect {
            port,
            source: std::io::ErrorKind::ConnectionRefused.into(),
        }
    }
}

/// What a check result changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing to report.
    Unchanged,
    /// Reached min_consecutive_successes for the first time: the task may be RUNNING.
    BecameHealthy,
    /// Failed past max_consecutive_failures: kill the task.
    Unhealthy { last_error: String },
}

/// Consecutive successes and failures (Aurora's health checker, pure).
#[derive(Clone, Debug)]
pub struct HealthTracker {
    started: Millis,
    initial_interval: Millis,
    max_consecutive_failures: u32,
    min_consecutive_successes: u32,
    successes: u32,
    failures: u32,
    healthy: bool,
}

impl HealthTracker {
    /// Starts counting at `now`; failures before `now + initial_interval` are ignored.
    pub fn new(
        now: Millis,
        initial_interval: Duration,
        max_consecutive_failures: u32,
        min_consecutive_successes: u32,
    ) -> Self {
        HealthTracker {
            started: now,
            initial_interval: initial_interval.as_millis() as Millis,
            max_consecutive_failures,
            min_consecutive_successes: min_consecutive_successes.max(1),
            successes: 0,
            failures: 0,
            healthy: false,
        }
    }

    /// Whether the liveness requirement was met.
    pub fn is_healthy(&self) -> bool {
        self.healthy
    }

    /// Counts one check result at `now`; a failure is kept as its text.
    pub fn record(&mut self, now: Millis, result: Result<(), HealthError>) -> Verdict {
        match result {
            Ok(()) => {
                self.failures = 0;
                self.successes = self.successes.saturating_add(1);
                if !self.healthy && self.successes >= self.min_consecutive_successes {
                    self.healthy = true;
                    return Verdict::BecameHealthy;
                }
                Verdict::Unchanged
            }
            Err(last_error) => {
                self.successes = 0;
                if now < self.started + self.initial_interval {
                    return Verdict::Unchanged;
                }
                self.failures = self.failures.saturating_add(1);
                if self.failures > self.max_consecutive_failures {
                    Verdict::Unhealthy {
                        last_error: last_error.to_string(),
                    }
                } else {
                    Verdict::Unchanged
                }
            }
        }
    }
}

/// An HTTP answer: status code and body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpResponse {
    pub code: u16,
    pub body: String,
}

/// Sends one HTTP/1.1 request to `127.0.0.1:port` and reads the answer, all within
/// `timeout`. Errors name the request and its address.
pub async fn http_request(
    port: u16,
    method: &str,
    path: &str,
    timeout: Duration,
) -> Result<HttpResponse, HealthError> {
    let addr = format!("127.0.0.1:{port}");
    match tokio::time::timeout(timeout, http_exchange(&addr, method, path)).await {
        Ok(r) => r,
        Err(_) => Err(HealthError::HttpTimedOut {
            request: format!("{method} http://{addr}{path}"),
            timeout,
        }),
    }
}

async fn http_exchange(addr: &str, method: &str, path: &str) -> Result<HttpResponse, HealthError> {
    let shown = || format!("{method} http://{addr}{path}");
    let io_err = |source| HealthError::Http {
        request: shown(),
        source,
    };
    let mut stream = TcpStream::connect(addr).await.map_err(io_err)?;
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: drover-executor\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.map_err(io_err)?;
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream.read(&mut chunk).await.map_err(io_err)?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > MAX_RESPONSE {
            return Err(HealthError::TooLong { request: shown() });
        }
        if let Some(resp) = parse_response(&buf, true) {
            return Ok(resp);
        }
    }
    parse_response(&buf, false).ok_or_else(|| HealthError::Malformed { request: shown() })
}

/// Parses a status line, headers and body. With `need_complete`, returns None until
/// the body has its `Content-Length` (a closed connection ends it otherwise).
pub fn parse_response(buf: &[u8], need_complete: bool) -> Option<HttpResponse> {
    let head_end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&buf[..head_end]).ok()?;
    let mut lines = head.split("\r\n");
    let status = lines.next()?;
    let mut parts = status.splitn(3, ' ');
    if !parts.next()?.starts_with("HTTP/1.") {
        return None;
    }
    let code: u16 = parts.next()?.parse().ok()?;
    let length = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse::<usize>().ok());
    let body = &buf[head_end + 4..];
    let body = match length {
        Some(len) if body.len() >= len => &body[..len],
        Some(_) | None if need_complete => return None,
        _ => body,
    };
    Some(HttpResponse {
        code,
        body: String::from_utf8_lossy(body).into_owned(),
    })
}

/// An HTTP health check: GET `endpoint`, healthy when the code and the trimmed body
/// match.
pub async fn check_http(
    port: u16,
    endpoint: &str,
    expected_code: u16,
    expected_body: &str,
    timeout: Duration,
) -> Result<(), HealthError> {
    let resp = http_request(port, "GET", endpoint, timeout).await?;
    let request = || format!("GET http://127.0.0.1:{port}{endpoint}");
    if resp.code != expected_code {
        return Err(HealthError::WrongCode {
            request: request(),
            code: resp.code,
            expected: expected_code,
        });
    }
    if resp.body.trim() != expected_body.trim() {
        let mut body = resp.body.trim().to_string();
        body.truncate(100);
        return Err(HealthError::WrongBody {
            request: request(),
            body,
            expected: expected_body.to_string(),
        });
    }
    Ok(())
}

/// A TCP health check: connect within `timeout`.
pub async fn check_tcp(port: u16, timeout: Duration) -> Result<(), HealthError> {
    check_tcp_with(port, timeout, TcpStream::connect(("127.0.0.1", port))).await
}

/// A TCP health check of an isolated task: the connect is made inside its network
/// namespace (`prober`), since the forwarder on the host accepts whether or not the
/// task listens.
pub async fn check_tcp_inside(
    prober: crate::portfwd::Prober,
    port: u16,
    timeout: Duration,
) -> Result<(), HealthError> {
    check_tcp_with(port, timeout, prober.connect(port)).await
}

async fn check_tcp_with(
    port: u16,
    timeout: Duration,
    connect: impl std::future::Future<Output = std::io::Result<TcpStream>>,
) -> Result<(), HealthError> {
    match tokio::time::timeout(timeout, connect).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(source)) => Err(HealthError::Connect { port, source }),
        Err(_) => Err(HealthError::ConnectTimedOut { port, timeout }),
    }
}

/// A shell health check: the prepared command ([`crate::spawn::check_command`]) must
/// exit 0 within `timeout`. It leads its own process group, which a timeout (or the
/// check being dropped, as when the executor ends) kills whole.
pub async fn check_shell(
    mut command: crate::spawn::TaskCommand,
    shown: &str,
    timeout: Duration,
) -> Result<(), HealthError> {
    let shown = || shown.to_string();
    let mut child = command.spawn().map_err(|source| HealthError::ShellSpawn {
        shown: shown(),
        source,
    })?;
    let mut group = KillGroupOnDrop(child.id());
    match tokio::time::timeout(timeout, child.wait()).await {
        Ok(waited) => {
            // Exited and reaped: its pid is no group's to kill any more.
            group.0 = None;
            match waited {
                Ok(status) if status.success() => Ok(()),
                Ok(status) => Err(HealthError::ShellExited {
                    shown: shown(),
                    status,
                }),
                Err(source) => Err(HealthError::ShellWait {
                    shown: shown(),
                    source,
                }),
            }
        }
        Err(_) => {
            drop(group);
            let _ = child.wait().await;
            Err(HealthError::ShellTimedOut {
                shown: shown(),
                timeout,
            })
        }
    }
}

/// SIGKILLs the process group led by the pid when dropped.
struct KillGroupOnDrop(Option<u32>);

impl Drop for KillGroupOnDrop {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_needs_min_consecutive_successes() {
        let mut t = HealthTracker::new(0, Duration::from_secs(10), 0, 2);
        assert_eq!(t.record(1, Ok(())), Verdict::Unchanged);
        assert_eq!(
            t.record(2, Err(HealthError::refused(1))),
            Verdict::Unchanged
        );
        assert_eq!(t.record(3, Ok(())), Verdict::Unchanged);
        assert_eq!(t.record(4, Ok(())), Verdict::BecameHealthy);
        assert!(t.is_healthy());
    }

    #[test]
    fn failures_during_initial_interval_do_not_count() {
        let mut t = HealthTracker::new(0, Duration::from_secs(10), 1, 1);
        for now in [1_000, 5_000, 9_999] {
            assert_eq!(
                t.record(now, Err(HealthError::refused(1))),
                Verdict::Unchanged
            );
        }
        assert_eq!(
            t.record(10_000, Err(HealthError::refused(1))),
            Verdict::Unchanged
        );
        assert_eq!(
            t.record(11_000, Err(HealthError::refused(2))),
            Verdict::Unhealthy {
                last_error: "connect to 127.0.0.1:2: connection refused".into()
            }
        );
    }

    #[test]
    fn a_success_resets_the_failure_count() {
        let mut t = HealthTracker::new(0, Duration::ZERO, 1, 1);
        assert_eq!(
            t.record(1, Err(HealthError::refused(1))),
            Verdict::Unchanged
        );
        assert_eq!(t.record(2, Ok(())), Verdict::BecameHealthy);
        assert_eq!(
            t.record(3, Err(HealthError::refused(2))),
            Verdict::Unchanged
        );
        assert!(matches!(
            t.record(4, Err(HealthError::refused(3))),
            Verdict::Unhealthy { .. }
        ));
    }

    #[test]
    fn http_responses_parse_with_and_without_length() {
        let full = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
        assert_eq!(
            parse_response(full, true),
            Some(HttpResponse {
                code: 200,
                body: "ok".into()
            })
        );
        let partial = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nok";
        assert_eq!(parse_response(partial, true), None);
        let no_length = b"HTTP/1.0 503 Busy\r\n\r\nnope";
        assert_eq!(parse_response(no_length, true), None);
        assert_eq!(parse_response(no_length, false).unwrap().code, 503);
        assert_eq!(parse_response(b"garbage\r\n\r\n", false), None);
    }

    #[tokio::test]
    async fn tcp_check_passes_on_a_listener_and_fails_on_a_closed_port() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        check_tcp(port, Duration::from_secs(5)).await.unwrap();
        // Bound but not listening: refused, and no other test can take the port.
        let closed = tokio::net::TcpSocket::new_v4().unwrap();
        closed.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let port = closed.local_addr().unwrap().port();
        let err = check_tcp(port, Duration::from_secs(5))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
    }

    #[tokio::test]
    async fn shell_check_passes_on_exit_zero_and_times_out() {
        let t = Duration::from_secs(5);
        let dir = tempfile::tempdir().unwrap();
        let iso = crate::spawn::Isolation::default();
        let cmd = |line: &str| crate::spawn::check_command(line, dir.path(), &[], &iso);
        check_shell(cmd("true"), "true", t).await.unwrap();
        let err = check_shell(cmd("false"), "false", t)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("`false` exited"), "{err}");
        let err = check_shell(cmd("sleep 10"), "sleep 10", Duration::from_millis(100))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("timed out"), "{err}");
    }

    #[tokio::test]
    async fn http_check_against_a_local_server() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            for body in ["ok", "sick"] {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await.unwrap();
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                s.write_all(resp.as_bytes()).await.unwrap();
            }
        });
        let t = Duration::from_secs(5);
        check_http(port, "/health", 200, "ok", t).await.unwrap();
        let err = check_http(port, "/health", 200, "ok", t)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("sick"), "{err}");
    }
}
