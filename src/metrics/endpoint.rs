//! The `/metrics` listener, built so that no client can cost the daemon its descriptors or
//! its CPU: the daemon's inhibitor and bus connection need descriptors when it reconnects,
//! and it must never be the endpoint that used them up.
//!
//! - At most [`Limits::connections`] connections are open at once (16); the rest wait in the
//!   kernel's accept queue (of [`BACKLOG`]), costing the daemon nothing.
//! - Every connection serves one request and is closed after [`Limits::connection`] (10 s)
//!   whatever it does (headers within [`Limits::header`], 5 s); no keep-alive.
//! - No connection is accepted while fewer than [`reserve`] descriptors are left below the
//!   soft `RLIMIT_NOFILE`: the daemon's own needs come first.
//! - `EMFILE`, `ENFILE`, `ENOBUFS` and `ENOMEM` on accept back off for [`ACCEPT_BACKOFF`];
//!   each kind of trouble is logged at most once per [`LOG_EVERY`], with how often it recurred.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::Metrics;

const BACKLOG: u32 = 1024;
const ACCEPT_BACKOFF: Duration = Duration::from_secs(1);
/// A failed accept that is not about resources (a client that reset before it was
/// accepted) is retried after this, so that no error can make the loop spin.
const ERROR_PAUSE: Duration = Duration::from_millis(20);
const LOG_EVERY: Duration = Duration::from_secs(60);
/// hyper's smallest read buffer: a request's head must fit in it.
const MAX_HEAD_BYTES: usize = 8192;

#[derive(Debug, Clone, Copy)]
struct Limits {
    connections: usize,
    header: Duration,
    connection: Duration,
}

impl Limits {
    const SERVED: Limits = Limits {
        connections: 16,
        header: Duration::from_secs(5),
        connection: Duration::from_secs(10),
    };
}

/// Descriptors the endpoint leaves to the rest of the daemon: a quarter of the soft limit,
/// at least 256.
pub(crate) fn reserve(soft_limit: u64) -> u64 {
    (soft_limit / 4).max(256)
}

/// Binds `addr` and serves `/metrics` until `stop` is cancelled. Binding errors are returned
/// at once, naming `metrics.listen`.
pub(crate) async fn serve(
    addr: SocketAddr,
    metrics: Metrics,
    stop: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>> {
    serve_within(Limits::SERVED, addr, metrics, stop).await
}

async fn serve_within(
    limits: Limits,
    addr: SocketAddr,
    metrics: Metrics,
    stop: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>> {
    let listener = bind(addr).with_context(|| {
        format!("metrics.listen = \"{addr}\": cannot listen for Prometheus scrapes")
    })?;
    Ok(tokio::spawn(accept_loop(limits, listener, metrics, stop)))
}

fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

/// Whether the process may open another descriptor and still keep [`reserve`] free.
fn descriptors_to_spare() -> bool {
    let Ok((soft, _)) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
    else {
        return true;
    };
    let Ok(open) = std::fs::read_dir("/proc/self/fd").map(|d| d.count() as u64) else {
        return true;
    };
    open + reserve(soft) < soft
}

/// One warning per kind of trouble per [`LOG_EVERY`]; the next one says how many were not
/// logged in between.
struct Throttled {
    what: &'static str,
    last: Option<Instant>,
    unlogged: u64,
}

impl Throttled {
    fn new(what: &'static str) -> Self {
        Throttled {
            what,
            last: None,
            unlogged: 0,
        }
    }

    fn warn(&mut self, detail: &dyn std::fmt::Display) {
        let now = Instant::now();
        if self
            .last
            .is_some_and(|last| now.duration_since(last) < LOG_EVERY)
        {
            self.unlogged += 1;
            return;
        }
        tracing::warn!(
            error = %detail,
            unlogged_since_last = self.unlogged,
            "metrics endpoint: {}",
            self.what
        );
        self.last = Some(now);
        self.unlogged = 0;
    }
}

fn is_resource_exhaustion(err: &std::io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(nix::libc::EMFILE | nix::libc::ENFILE | nix::libc::ENOBUFS | nix::libc::ENOMEM)
    )
}

/// Sleeps `pause`; false when `stop` came first.
async fn pause_unless_stopped(stop: &CancellationToken, pause: Duration) -> bool {
    tokio::select! {
        _ = stop.cancelled() => false,
        _ = tokio::time::sleep(pause) => true,
    }
}

async fn accept_loop(
    limits: Limits,
    listener: TcpListener,
    metrics: Metrics,
    stop: CancellationToken,
) {
    let permits = Arc::new(Semaphore::new(limits.connections));
    let mut out_of_descriptors =
        Throttled::new("not accepting connections: too few file descriptors left for the daemon");
    let mut exhausted = Throttled::new("accept failed for lack of resources; backing off");
    let mut failed = Throttled::new("accept failed");
    loop {
        let permit = tokio::select! {
            _ = stop.cancelled() => return,
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => return,
            },
        };
        if !descriptors_to_spare() {
            out_of_descriptors.warn(&"the endpoint waits until descriptors are freed");
            if !pause_unless_stopped(&stop, ACCEPT_BACKOFF).await {
                return;
            }
            continue;
        }
        let accepted = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, _)) => {
                tokio::spawn(serve_connection(limits, stream, metrics.clone(), permit));
            }
            Err(err) => {
                let pause = if is_resource_exhaustion(&err) {
                    exhausted.warn(&err);
                    ACCEPT_BACKOFF
                } else {
                    failed.warn(&err);
                    ERROR_PAUSE
                };
                if !pause_unless_stopped(&stop, pause).await {
                    return;
                }
            }
        }
    }
}

/// One request, then the connection is closed; the whole exchange within
/// [`Limits::connection`]. The permit is the connection's place under the cap.
async fn serve_connection(
    limits: Limits,
    stream: TcpStream,
    metrics: Metrics,
    _permit: OwnedSemaphorePermit,
) {
    let service = service_fn(move |req| respond(req, metrics.clone()));
    let connection = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header)
        .keep_alive(false)
        .max_buf_size(MAX_HEAD_BYTES)
        .serve_connection(TokioIo::new(stream), service);
    match tokio::time::timeout(limits.connection, connection).await {
        Ok(Ok(())) => {}
        Ok(Err(err)) => tracing::debug!(error = %err, "metrics connection ended with an error"),
        Err(_) => tracing::debug!("metrics connection closed at its time limit"),
    }
}

async fn respond(
    req: Request<hyper::body::Incoming>,
    metrics: Metrics,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (status, content_type, body) = if req.uri().path() != "/metrics" {
        (
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found\n".to_string(),
        )
    } else {
        let openmetrics = req
            .headers()
            .get_all(http::header::ACCEPT)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| v.contains("application/openmetrics-text"));
        let rendered = if openmetrics {
            metrics.render().map(|text| {
                (
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    text,
                )
            })
        } else {
            metrics
                .render_text()
                .map(|text| ("text/plain; version=0.0.4; charset=utf-8", text))
        };
        match rendered {
            Ok((content_type, text)) => {
                metrics.scraped();
                (StatusCode::OK, content_type, text)
            }
            Err(err) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "text/plain",
                format!("{err:#}\n"),
            ),
        }
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = http::HeaderValue::from_str(content_type) {
        response
            .headers_mut()
            .insert(http::header::CONTENT_TYPE, value);
    }
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const QUICK: Limits = Limits {
        connections: 4,
        header: Duration::from_millis(300),
        connection: Duration::from_millis(600),
    };

    async fn started(
        limits: Limits,
        m: Metrics,
    ) -> (SocketAddr, CancellationToken, tokio::task::JoinHandle<()>) {
        let stop = CancellationToken::new();
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = probe.local_addr().unwrap();
        drop(probe);
        let task = serve_within(limits, addr, m, stop.clone()).await.unwrap();
        (addr, stop, task)
    }

    async fn scrape(addr: SocketAddr) -> String {
        scrape_with(addr, "").await
    }

    async fn scrape_with(addr: SocketAddr, headers: &str) -> String {
        let mut conn = TcpStream::connect(addr).await.unwrap();
        conn.write_all(format!("GET /metrics HTTP/1.1\r\nHost: x\r\n{headers}\r\n").as_bytes())
            .await
            .unwrap();
        let mut reply = String::new();
        conn.read_to_string(&mut reply).await.unwrap();
        reply
    }

    #[tokio::test]
    async fn serves_metrics_over_http_and_stops_on_cancel() {
        let m = Metrics::new();
        m.escalated();
        let (addr, stop, task) = started(Limits::SERVED, m).await;
        let reply = scrape(addr).await;
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
        assert!(reply.contains("nodegrace_escalations_total 1"), "{reply}");
        assert!(reply.contains("text/plain; version=0.0.4"), "{reply}");
        assert!(!reply.contains("# EOF"), "{reply}");
        // Prometheus asks for OpenMetrics and gets it.
        let open = scrape_with(
            addr,
            "Accept: application/openmetrics-text;version=1.0.0,text/plain;q=0.5\r\n",
        )
        .await;
        assert!(open.contains("application/openmetrics-text"), "{open}");
        assert!(open.trim_end().ends_with("# EOF"), "{open}");
        stop.cancel();
        task.await.unwrap();
        assert!(TcpStream::connect(addr).await.is_err());
    }

    #[tokio::test]
    async fn a_busy_address_is_an_error_naming_the_key() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let err = serve(addr, Metrics::new(), CancellationToken::new())
            .await
            .unwrap_err();
        let text = format!("{err:#}");
        assert!(
            text.contains(&format!("metrics.listen = \"{addr}\"")),
            "{text}"
        );
        assert!(text.contains("in use"), "{text}");
    }

    /// Whether the server closed `conn` (end of stream or reset) within `wait`.
    async fn closed_within(conn: &mut TcpStream, wait: Duration) -> bool {
        let mut buf = [0u8; 256];
        loop {
            match tokio::time::timeout(wait, conn.read(&mut buf)).await {
                Err(_) => return false,
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => continue,
            }
        }
    }

    #[tokio::test]
    async fn idle_and_half_sent_connections_are_closed_and_the_cap_holds_the_rest_back() {
        let (addr, _stop, _task) = started(QUICK, Metrics::new()).await;
        let mut held = Vec::new();
        for i in 0..QUICK.connections * 2 {
            let mut conn = TcpStream::connect(addr).await.unwrap();
            if i % 2 == 0 {
                conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
                    .await
                    .unwrap();
            }
            held.push(conn);
        }
        let started = Instant::now();
        // The first ones under the cap are accepted and closed at their header timeout;
        // the others wait in the queue until those go, then get the same.
        for conn in &mut held[..QUICK.connections] {
            assert!(closed_within(conn, Duration::from_secs(2)).await);
        }
        let first_batch = started.elapsed();
        assert!(first_batch >= QUICK.header / 2, "{first_batch:?}");
        for conn in &mut held[QUICK.connections..] {
            assert!(closed_within(conn, Duration::from_secs(2)).await);
        }
        assert!(
            started.elapsed() >= first_batch + QUICK.header / 2,
            "the queued connections were served before the first ones left: {:?}",
            started.elapsed()
        );
        let reply = scrape(addr).await;
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    }

    #[test]
    fn the_reserve_is_a_quarter_of_the_limit_and_at_least_256() {
        assert_eq!(reserve(1024), 256);
        assert_eq!(reserve(512), 256);
        assert_eq!(reserve(65536), 16384);
    }

    #[test]
    fn a_throttled_warning_counts_what_it_did_not_log() {
        let mut t = Throttled::new("test");
        t.warn(&"first");
        assert!(t.last.is_some());
        for _ in 0..1000 {
            t.warn(&"again");
        }
        assert_eq!(t.unlogged, 1000);
    }
}
