//! `gpuwatch serve`'s HTTP side: the Prometheus endpoint, a JSON API and a landing page, all
//! read from the last published round ([`Published`]). Nothing here samples: a scrape costs a
//! render, never an NVML call.
//!
//! | path | what |
//! |---|---|
//! | `/` | the web page: sources, alerts, GPUs, each GPU holder's verdict, evidence, advice and charts ([`crate::output::web_page`]) |
//! | `/metrics` | OpenMetrics text ([`crate::output::prometheus`]) |
//! | `/api/v1/containers` | the workloads of the last snapshot (JSON) |
//! | `/api/v1/gpus` | the GPUs of the last snapshot (JSON) |
//! | `/api/v1/alerts` | pending and firing alerts (JSON) |
//! | `/api/v1/snapshot` | the whole last snapshot (JSON, `docs/snapshot-schema.md`) |
//! | `/-/healthy` | `200 OK` while the agent runs; `503` naming the step while a sampling round has hung (a source that does not answer) |
//!
//! Responses not yet written out hold at most 32 MiB together and 8 MiB per source network
//! ([`response_budget`]: past either a `503` asks the client to come back), and no tenant string in any of them is longer than
//! [`WHOLE_MAX_CHARS`].
//!
//! Slow or silent clients cannot hold the agent: headers must arrive within
//! [`HEADER_READ_TIMEOUT`], TLS handshakes within [`TLS_HANDSHAKE_TIMEOUT`], a response must be
//! read (writes stall at most `WRITE_STALL_TIMEOUT`, a response is written out within
//! `WRITE_BUDGET`: [`write_guard`]) into a send buffer of [`SEND_BUFFER_BYTES`], and past
//! [`connection_limit`] the connection waiting longest for its headers is closed to make room
//! (a newcomer is refused only while every connection is answering).
mod connections;
mod login_gate;
mod response_budget;
mod source;
pub mod web_config;
mod write_guard;

use crate::heartbeat::Heartbeat;
use crate::output::prometheus;
use crate::output::published::Published;
use bytes::Bytes;
use connections::{Admission, Connections, Slot};
use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue, AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use login_gate::Decision;
pub use login_gate::LoginGate;
use response_budget::{CountedBody, ResponseBudget};
use source::Network;
use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::watch;

/// The last published round, shared between the sampling loop and the HTTP tasks.
pub type LatestPublished = Arc<RwLock<Option<Arc<Published>>>>;

/// What every request handler needs.
pub struct Site {
    pub published: LatestPublished,
    pub auth: Option<LoginGate>,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// `/-/ready` turns false when the last published round is older than this (three
    /// intervals, plus twice the series interval rounds are held for).
    pub stale_after: Duration,
    /// The sampling thread's marks, once the agent has started: `/-/healthy` and `/-/ready`
    /// turn false while a round has run longer than `stall_limit` (a source that hangs).
    pub heartbeat: std::sync::OnceLock<Arc<Heartbeat>>,
    pub stall_limit: Duration,
    /// How often the page at `/` reloads itself: the sampling interval.
    pub page_refresh: Duration,
    /// The bytes all responses not yet written out may hold ([`response_budget`]).
    pub responses: ResponseBudget,
    /// Renders running, at most [`RENDERS_AT_ONCE`].
    pub renders: Arc<tokio::sync::Semaphore>,
}

/// The budget of responses' bytes a site starts with.
pub fn response_budget() -> ResponseBudget {
    ResponseBudget::new(response_budget::RESPONSES_MAX_BYTES)
}

impl Site {
    /// The round in progress, when it has run past the limit.
    fn stalled(&self) -> Option<crate::heartbeat::Stall> {
        self.heartbeat.get()?.stalled(self.stall_limit)
    }
}

/// How long a client may take to send a request's headers, or to send the next request on a
/// kept-alive connection: a connection that sends nothing is closed after it.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a TLS handshake may take.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections served at once: half of the open-file limit left after the agent's own files,
/// within [16, 16384]. One past it takes the place of the connection waiting longest for its
/// headers, or is answered `503` and closed when every connection is answering.
pub fn connection_limit() -> usize {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        lim.rlim_cur
    } else {
        1024
    };
    (soft.saturating_sub(64) / 2).clamp(16, 16_384) as usize
}

/// The kernel's send buffer of each connection, before Linux doubles it: a client that stops
/// reading holds at most twice this of kernel memory (autotuning let one hold 455 KB of
/// `/metrics` on loopback, and grows to `tcp_wmem`'s 4 MB), and the rest of its response waits
/// in the agent only until the write-stall timeout. A LAN scrape is not slowed: 256 KiB a
/// round trip.
pub const SEND_BUFFER_BYTES: libc::c_int = 128 << 10;

fn limit_send_buffer(stream: &tokio::net::TcpStream) {
    use std::os::fd::AsRawFd;
    // SAFETY: setsockopt on a socket this task owns, with an int option of its size.
    let r = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&SEND_BUFFER_BYTES as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        tracing::debug!(
            "setting a connection's send buffer: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Raises the soft open-file limit to the hard one (as exporters do), so many scrapers and
/// slow clients do not run the agent out of descriptors. Returns the soft limit in force.
pub fn raise_file_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write the struct they are given.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 0;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                return raised.rlim_cur;
            }
        }
    }
    lim.rlim_cur
}

/// Accepts connections on `listener` until `shutdown` turns true; each connection is served on
/// its own task (TLS first when `tls` is set), at most [`connection_limit`] at once
/// ([`connections`]: at the limit the one waiting longest for its headers makes room), each
/// with the header-read and handshake timeouts above.
pub async fn run(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    site: Arc<Site>,
    mut shutdown: watch::Receiver<bool>,
) {
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let limit = connection_limit();
    let open = Connections::new(limit);
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!("accepting a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => return,
        };
        let slot = match open.admit(Instant::now()) {
            Admission::Admitted { slot, evicted } => {
                if evicted {
                    tracing::debug!(
                        "{limit} connections open: closing the one waiting longest for its \
                         headers to serve {peer}"
                    );
                }
                Arc::new(slot)
            }
            Admission::Full => {
                tracing::warn!("refusing {peer}: {limit} connections answering already");
                tokio::spawn(refuse(stream, acceptor.is_some()));
                continue;
            }
        };
        limit_send_buffer(&stream);
        let stream = write_guard::WriteGuard::new(stream);
        let connection =
            serve_connection(stream, acceptor.clone(), site.clone(), slot.clone(), peer);
        tokio::spawn(async move {
            tokio::select! {
                () = connection => {}
                () = slot.evicted() => {
                    tracing::debug!("connection from {peer}: closed at the limit, no request yet");
                }
            }
        });
    }
}

/// Serves one connection (after its TLS handshake when `acceptor` is set), marking `slot`
/// answering while a request is handled and waiting in between.
async fn serve_connection(
    stream: write_guard::WriteGuard<tokio::net::TcpStream>,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    site: Arc<Site>,
    slot: Arc<Slot>,
    peer: std::net::SocketAddr,
) {
    let service = hyper::service::service_fn(move |req| {
        let site = site.clone();
        let slot = slot.clone();
        async move {
            slot.answering();
            let source = Network::of(peer.ip());
            let budget = &site.responses;
            let response = if budget.nearly_spent(&source) && !is_health(req.uri().path()) {
                counted(budget, busy(), &source)
            } else {
                counted(budget, handle(&site, &req, peer.ip()).await, &source)
            };
            slot.waiting(Instant::now());
            Ok::<_, Infallible>(response)
        }
    });
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let result = match acceptor {
        Some(a) => match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, a.accept(stream)).await {
            Ok(Ok(s)) => http.serve_connection(TokioIo::new(s), service).await,
            Ok(Err(e)) => {
                tracing::debug!("TLS handshake with {peer}: {e}");
                return;
            }
            Err(_) => {
                tracing::debug!("TLS handshake with {peer}: timed out");
                return;
            }
        },
        None => http.serve_connection(TokioIo::new(stream), service).await,
    };
    if let Err(e) = result {
        tracing::debug!("connection from {peer}: {e}");
    }
}

/// A connection past the limit: a plain `503` (nothing over TLS, which would need a handshake
/// the limit is there to avoid), then closed.
async fn refuse(mut stream: tokio::net::TcpStream, tls: bool) {
    use tokio::io::AsyncWriteExt;
    if !tls {
        let body = "too many connections\n";
        let msg = format!(
            "HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nRetry-After: 1\r\n\
             Content-Type: text/plain\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let _ =
            tokio::time::timeout(Duration::from_secs(1), stream.write_all(msg.as_bytes())).await;
    }
    let _ = stream.shutdown().await;
}

/// `r` with its body counted against the responses' budget; past it, a `503` that asks the
/// client to come back.
fn counted(budget: &ResponseBudget, r: Response<Bytes>, source: &Network) -> Response<CountedBody> {
    let (parts, body) = r.into_parts();
    let len = body.len();
    if let Some(body) = budget.body(body, source) {
        return Response::from_parts(parts, body);
    }
    tracing::debug!(
        "answering 503: responses not yet read hold {} of {} MiB, {len} bytes more asked by \
         {source:?}",
        budget.held() >> 20,
        response_budget::RESPONSES_MAX_BYTES >> 20
    );
    let (parts, body) = busy().into_parts();
    Response::from_parts(parts, budget.uncounted(body))
}

/// The answer while the responses' budget is spent: come back in a second.
fn busy() -> Response<Bytes> {
    let mut r = respond(
        StatusCode::SERVICE_UNAVAILABLE,
        "text/plain",
        "busy: slow readers hold the responses' memory; retry shortly\n",
    );
    r.headers_mut()
        .insert(hyper::header::RETRY_AFTER, HeaderValue::from_static("1"));
    r
}

/// The health endpoints, answered whatever the responses' budget.
fn is_health(path: &str) -> bool {
    matches!(path, "/-/healthy" | "/-/ready")
}

fn respond(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Bytes> {
    let mut r = Response::new(body.into());
    *r.status_mut() = status;
    if let Ok(v) = HeaderValue::from_str(content_type) {
        r.headers_mut().insert(CONTENT_TYPE, v);
    }
    r
}

fn json<T: serde::Serialize>(v: &T) -> Response<Bytes> {
    match serde_json::to_vec_pretty(v) {
        Ok(b) => respond(StatusCode::OK, "application/json", b),
        Err(e) => respond(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain",
            format!("encoding JSON: {e}\n"),
        ),
    }
}

async fn handle(site: &Arc<Site>, req: &Request<Incoming>, peer: IpAddr) -> Response<Bytes> {
    let decision = match &site.auth {
        None => Decision::Allowed,
        Some(gate) => {
            let header = req
                .headers()
                .get(AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            gate.check(peer, header).await
        }
    };
    let mut r = match decision {
        Decision::Allowed => route(site, Asked::of(req)).await,
        Decision::Denied => {
            let mut r = respond(StatusCode::UNAUTHORIZED, "text/plain", "Unauthorized\n");
            r.headers_mut().insert(
                WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"gpuwatch\""),
            );
            r
        }
        Decision::TooMany(retry_after) => {
            let mut r = respond(
                StatusCode::TOO_MANY_REQUESTS,
                "text/plain",
                "Too many failed logins from this address\n",
            );
            if let Ok(v) = HeaderValue::from_str(&retry_after.to_string()) {
                r.headers_mut().insert(hyper::header::RETRY_AFTER, v);
            }
            r
        }
    };
    for (k, v) in &site.headers {
        r.headers_mut().insert(k.clone(), v.clone());
    }
    r
}

/// What a request asks for, owned: it goes to the renderers' thread.
struct Asked {
    method: Method,
    path: String,
    accept: Option<String>,
}

impl Asked {
    fn of(req: &Request<Incoming>) -> Self {
        Self {
            method: req.method().clone(),
            path: req.uri().path().to_owned(),
            accept: req
                .headers()
                .get(hyper::header::ACCEPT)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
        }
    }
}

/// Answers `asked`: the health endpoints at once, everything else rendered on a blocking
/// thread, [`RENDERS_AT_ONCE`] at a time, so that a flood of large renders neither holds the
/// async workers (health answers meanwhile) nor more than two answers not yet counted.
async fn route(site: &Arc<Site>, asked: Asked) -> Response<Bytes> {
    if is_health(&asked.path) {
        return render(site, &asked);
    }
    let Ok(permit) = site.renders.clone().acquire_owned().await else {
        return busy(); // never closed
    };
    let site = site.clone();
    // The permit goes with the render: a client that hangs up does not free it while the
    // render it asked for still runs.
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        render(&site, &asked)
    })
    .await
    .unwrap_or_else(|e| {
        respond(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain",
            format!("rendering the answer: {e}\n"),
        )
    })
}

/// Renders at once, off the async workers.
pub const RENDERS_AT_ONCE: usize = 2;

fn render(site: &Site, asked: &Asked) -> Response<Bytes> {
    if asked.method != Method::GET && asked.method != Method::HEAD {
        return respond(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "Method not allowed\n",
        );
    }
    let current = site.published.read().ok().and_then(|p| p.clone());
    let path = asked.path.as_str();
    match path {
        "/-/healthy" | "/-/ready" if site.stalled().is_some() => {
            let stall = site.stalled().map(|s| s.to_string()).unwrap_or_default();
            return respond(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                format!("unhealthy: {stall}\n"),
            );
        }
        "/-/healthy" => return respond(StatusCode::OK, "text/plain", "OK\n"),
        "/-/ready" => return ready(current.as_deref(), site.stale_after),
        _ => {}
    }
    let Some(e) = current else {
        return respond(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "no sample yet\n",
        );
    };
    match path {
        "/" => respond(
            StatusCode::OK,
            "text/html; charset=utf-8",
            crate::output::web_page::render(&e, site.page_refresh),
        ),
        "/metrics" => {
            match prometheus::render_live(&e, site.stalled().and_then(|s| s.step.source())) {
                Ok(text) => {
                    if prometheus::wants_openmetrics(asked.accept.as_deref()) {
                        respond(StatusCode::OK, prometheus::CONTENT_TYPE, text)
                    } else {
                        let text = prometheus::to_text_format(&text);
                        respond(StatusCode::OK, prometheus::TEXT_CONTENT_TYPE, text)
                    }
                }
                Err(err) => respond(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "text/plain",
                    format!("rendering metrics: {err}\n"),
                ),
            }
        }
        "/api/v1/containers" => json(&serde_json::json!({
            "taken_at": e.snapshot.taken_at,
            "containers": e.snapshot.workloads,
        })),
        "/api/v1/gpus" => json(&serde_json::json!({
            "taken_at": e.snapshot.taken_at,
            "gpus": e.snapshot.gpus,
        })),
        "/api/v1/alerts" => json(&serde_json::json!({
            "taken_at": e.snapshot.taken_at,
            "alerts": e.alerts,
        })),
        "/api/v1/snapshot" => json(&e.snapshot),
        _ => match path.strip_prefix("/api/v1/containers/") {
            Some(id) => one_container(&e.snapshot, id),
            None => respond(StatusCode::NOT_FOUND, "text/plain", "Not found\n"),
        },
    }
}

/// The most characters of a tenant string in `/api/v1/containers/<id>`'s `whole` (everywhere
/// else they are cut to 1,024 or fewer): two 16-MB labels made a 33.5-MB answer.
pub const WHOLE_MAX_CHARS: usize = 64 << 10;

/// One workload by its container id (or a prefix of 12 characters or more, as `docker ps`
/// prints it) or its workload id, with its tenant strings as long as [`WHOLE_MAX_CHARS`]:
/// everywhere else they are cut shorter (see [`crate::model::bounded`]).
fn one_container(snap: &crate::model::Snapshot, id: &str) -> Response<Bytes> {
    let found = snap.workloads.iter().find(|w| {
        w.id.to_string() == id
            || w.container
                .as_ref()
                .is_some_and(|c| c.id == id || (id.len() >= 12 && c.id.starts_with(id)))
    });
    let Some(w) = found else {
        return respond(
            StatusCode::NOT_FOUND,
            "text/plain",
            "No such container in the last round\n",
        );
    };
    let c = w.container.as_deref();
    let long = |s: &str| crate::model::bounded::bounded(s, WHOLE_MAX_CHARS).into_owned();
    let long_opt = |s: Option<&String>| s.map(|s| long(s));
    json(&serde_json::json!({
        "taken_at": snap.taken_at,
        "container": w,
        "whole": {
            "name": long(&w.name),
            "image": c.map(|c| long(&c.image)),
            "compose_project": long_opt(c.and_then(|c| c.compose_project.as_ref())),
            "compose_service": long_opt(c.and_then(|c| c.compose_service.as_ref())),
            "pod": c.and_then(|c| c.kubernetes.as_ref()).map(|k| serde_json::json!({
                "namespace": long(&k.namespace),
                "pod": long(&k.pod),
                "container": long_opt(k.container.as_ref()),
            })),
        },
    }))
}

/// Ready once a round is published, and while the newest is younger than `stale_after`.
fn ready(current: Option<&Published>, stale_after: Duration) -> Response<Bytes> {
    let unavailable = |why: String| respond(StatusCode::SERVICE_UNAVAILABLE, "text/plain", why);
    let Some(e) = current else {
        return unavailable("not ready: no round published yet\n".into());
    };
    let now_ms = crate::model::monotonic_now_ms();
    let age = Duration::from_millis(now_ms.saturating_sub(e.snapshot.monotonic_ms));
    if age > stale_after {
        return unavailable(format!(
            "not ready: the last round is {:.0} s old (more than {:.0} s)\n",
            age.as_secs_f64(),
            stale_after.as_secs_f64()
        ));
    }
    respond(StatusCode::OK, "text/plain", "ready\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::snapshot;

    fn exported(age: Duration) -> Published {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let mut snap = snapshot(now - age.as_millis() as u64, Vec::new(), Vec::new());
        snap.monotonic_ms = crate::model::monotonic_now_ms() - age.as_millis() as u64;
        Published {
            snapshot: snap,
            alerts: Vec::new(),
            xid_totals: Default::default(),
            accounting: Default::default(),
            recent: Default::default(),
        }
    }

    #[test]
    fn ready_once_a_round_is_out_and_while_it_is_fresh() {
        let stale_after = Duration::from_secs(23);
        assert_eq!(
            ready(None, stale_after).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        let fresh = exported(Duration::from_secs(12));
        assert_eq!(ready(Some(&fresh), stale_after).status(), StatusCode::OK);
        let old = exported(Duration::from_secs(40));
        assert_eq!(
            ready(Some(&old), stale_after).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        // The wall clock stepped an hour either way since the round: its age is still 12 s.
        for step in [-3_600_000i64, 3_600_000] {
            let mut stepped = exported(Duration::from_secs(12));
            stepped.snapshot.taken_at_unix_ms = stepped
                .snapshot
                .taken_at_unix_ms
                .saturating_add_signed(step);
            assert_eq!(ready(Some(&stepped), stale_after).status(), StatusCode::OK);
        }
    }
}
