//! The `/metrics` listener, built so that no client can cost the daemon its descriptors or
//! its CPU: the daemon's inhibitor and bus connection need descriptors when it reconnects,
//! and it must never be the endpoint that used them up.
//!
//! - At most [`Limits::connections`] connections are open at once (16). At the cap, a new
//!   connection closes the oldest one still waiting for its request's head (once it has
//!   waited [`EVICTABLE_AFTER`]), so clients that
//!   send half a request and reconnect cannot keep a scrape in the kernel's queue; only when
//!   every open connection is being answered does the next one wait there (of [`BACKLOG`]).
//! - Every connection serves one request and is closed after [`Limits::connection`] (10 s)
//!   whatever it does (headers within [`Limits::header`], 5 s); no keep-alive.
//! - No connection is accepted while fewer than [`reserve`] descriptors are left below the
//!   soft `RLIMIT_NOFILE`: the daemon's own needs come first.
//! - `EMFILE`, `ENFILE`, `ENOBUFS` and `ENOMEM` on accept back off for [`ACCEPT_BACKOFF`];
//!   each kind of trouble is logged at most once per [`LOG_EVERY`], with how often it recurred.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, Ordering};
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
use tokio_util::sync::CancellationToken;

use super::Metrics;

const BACKLOG: u32 = 1024;
const ACCEPT_BACKOFF: Duration = Duration::from_secs(1);
/// A failed accept that is not about resources (a client that reset before it was
/// accepted) is retried after this, so that no error can make the loop spin.
const ERROR_PAUSE: Duration = Duration::from_millis(20);
const LOG_EVERY: Duration = Duration::from_secs(60);
/// How long a connection may wait for its request's head before a new one can take its
/// place at the cap: bounds how many connections a second reconnecting clients cost (640
/// with 16 places), while a scrape queued behind a few hundred of them is reached in well
/// under a second.
const EVICTABLE_AFTER: Duration = Duration::from_millis(25);
/// How long to wait before looking again when every place is being answered.
const BUSY_PAUSE: Duration = Duration::from_millis(20);
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

/// Where an open connection is: only a connection still waiting for its request's head
/// may be closed to make room.
struct Slot {
    state: AtomicU8,
    close: CancellationToken,
    accepted: Instant,
}

const WAITING: u8 = 0;
const ANSWERING: u8 = 1;
const ENDED: u8 = 2;

impl Slot {
    fn new() -> Arc<Slot> {
        Arc::new(Slot {
            state: AtomicU8::new(WAITING),
            close: CancellationToken::new(),
            accepted: Instant::now(),
        })
    }

    fn ended(&self) -> bool {
        self.state.load(Ordering::Acquire) == ENDED
    }

    /// Closes the connection if it has not started its answer; whether it did.
    fn evict(&self) -> bool {
        let evicted = self
            .state
            .compare_exchange(WAITING, ENDED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if evicted {
            self.close.cancel();
        }
        evicted
    }
}

/// Marks the slot ended however its task ends.
struct EndOnDrop(Arc<Slot>);

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        self.0.state.store(ENDED, Ordering::Release);
    }
}

/// Makes room for one more connection under the cap, or says how long until it may try
/// again: every open connection is being answered (each ends within its time limit), or
/// the oldest one waiting came in less than [`EVICTABLE_AFTER`] ago.
fn make_room(open: &mut VecDeque<Arc<Slot>>, cap: usize) -> Option<Duration> {
    open.retain(|slot| !slot.ended());
    if open.len() < cap {
        return None;
    }
    let Some(oldest) = open
        .iter()
        .position(|slot| slot.state.load(Ordering::Acquire) == WAITING)
    else {
        return Some(BUSY_PAUSE);
    };
    let waited = open[oldest].accepted.elapsed();
    if waited < EVICTABLE_AFTER {
        return Some(EVICTABLE_AFTER - waited);
    }
    if !open[oldest].evict() {
        return Some(BUSY_PAUSE);
    }
    open.remove(oldest);
    None
}

async fn accept_loop(
    limits: Limits,
    listener: TcpListener,
    metrics: Metrics,
    stop: CancellationToken,
) {
    let mut open: VecDeque<Arc<Slot>> = VecDeque::with_capacity(limits.connections);
    let mut out_of_descriptors =
        Throttled::new("not accepting connections: too few file descriptors left for the daemon");
    let mut exhausted = Throttled::new("accept failed for lack of resources; backing off");
    let mut failed = Throttled::new("accept failed");
    loop {
        if let Some(pause) = make_room(&mut open, limits.connections) {
            if !pause_unless_stopped(&stop, pause).await {
                return;
            }
            continue;
        }
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
                let slot = Slot::new();
                open.push_back(slot.clone());
                tokio::spawn(serve_connection(limits, stream, metrics.clone(), slot));
                // The new connection reads the head it may already have before the next
                // accept can count it as waiting.
                tokio::task::yield_now().await;
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
/// [`Limits::connection`], and sooner if it is evicted while waiting for its head.
async fn serve_connection(limits: Limits, stream: TcpStream, metrics: Metrics, slot: Arc<Slot>) {
    let _ended = EndOnDrop(slot.clone());
    let answering = slot.clone();
    let service = service_fn(move |req| {
        // Fails only for a connection already evicted, which is being closed anyway.
        let _ = answering.state.compare_exchange(
            WAITING,
            ANSWERING,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        respond(req, metrics.clone())
    });
    let connection = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header)
        .keep_alive(false)
        .max_buf_size(MAX_HEAD_BYTES)
        .serve_connection(TokioIo::new(stream), service);
    tokio::select! {
        _ = slot.close.cancelled() => tracing::debug!("metrics connection closed for a newer one while waiting for its request"),
        ended = tokio::time::timeout(limits.connection, connection) => match ended {
            Ok(Ok(())) => {}
            Ok(Err(err)) => tracing::debug!(error = %err, "metrics connection ended with an error"),
            Err(_) => tracing::debug!("metrics connection closed at its time limit"),
        },
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
    async fn idle_and_half_sent_connections_are_closed_at_their_header_timeout() {
        let (addr, _stop, _task) = started(QUICK, Metrics::new()).await;
        let mut held = Vec::new();
        for i in 0..QUICK.connections {
            let mut conn = TcpStream::connect(addr).await.unwrap();
            if i % 2 == 0 {
                conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
                    .await
                    .unwrap();
            }
            held.push(conn);
        }
        let started = Instant::now();
        for conn in &mut held {
            assert!(closed_within(conn, Duration::from_secs(2)).await);
        }
        assert!(
            started.elapsed() >= QUICK.header / 2,
            "{:?}",
            started.elapsed()
        );
        let reply = scrape(addr).await;
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    }

    /// Sends half a request on `n` connections; each one closed is opened again, until
    /// `until`.
    async fn half_sent_clients(addr: SocketAddr, n: usize, until: Instant) {
        let mut clients = tokio::task::JoinSet::new();
        for _ in 0..n {
            clients.spawn(async move {
                while Instant::now() < until {
                    let Ok(mut conn) = TcpStream::connect(addr).await else {
                        continue;
                    };
                    let _ = conn
                        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
                        .await;
                    let left = until.saturating_duration_since(Instant::now());
                    closed_within(&mut conn, left).await;
                }
            });
        }
        while clients.join_next().await.is_some() {}
    }

    #[tokio::test]
    async fn scrapes_are_answered_while_many_clients_send_half_a_request_and_reconnect() {
        let m = Metrics::new();
        m.escalated();
        let (addr, _stop, _task) = started(Limits::SERVED, m).await;
        let until = Instant::now() + Duration::from_secs(4);
        let load = tokio::spawn(half_sent_clients(addr, 200, until));
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut times = Vec::new();
        for _ in 0..5 {
            let asked = Instant::now();
            let reply = tokio::time::timeout(Duration::from_secs(10), scrape(addr))
                .await
                .expect("a scrape is answered");
            assert!(reply.contains("nodegrace_escalations_total 1"), "{reply}");
            times.push(asked.elapsed());
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        println!("scrapes under 200 half-sent reconnecting clients answered in {times:?}");
        load.await.unwrap();
    }

    #[test]
    fn at_the_cap_the_oldest_connection_waiting_for_its_head_gives_way() {
        let mut open: VecDeque<Arc<Slot>> = (0..3).map(|_| Slot::new()).collect();
        open[0].state.store(ANSWERING, Ordering::Release);
        assert!(make_room(&mut open, 4).is_none(), "under the cap");
        let wait = make_room(&mut open, 3).expect("too young to give way");
        assert!(wait <= EVICTABLE_AFTER, "{wait:?}");
        std::thread::sleep(EVICTABLE_AFTER);
        let (answering, oldest_waiting) = (open[0].clone(), open[1].clone());
        assert!(make_room(&mut open, 3).is_none());
        assert!(oldest_waiting.close.is_cancelled() && !answering.close.is_cancelled());
        assert_eq!(open.len(), 2);
        for slot in &open {
            slot.state.store(ANSWERING, Ordering::Release);
        }
        assert_eq!(make_room(&mut open, 2), Some(BUSY_PAUSE), "all answering");
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
