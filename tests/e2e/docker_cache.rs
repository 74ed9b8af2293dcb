//! The Docker cache against a real dockerd: kept current by the event stream, marked down when
//! the daemon goes away, re-listed when it comes back. The daemon "goes away" by closing a
//! socket proxy in front of the real one.

use gpuwatch::events::{EventCounters, EventKind};
use gpuwatch::sources::docker::{run, DockerCache, DockerSourceConfig};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::*;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// Forwards connections on `path` to the real Docker socket until dropped.
struct Proxy {
    /// Dropping the set aborts the accept loop, whose own set then aborts every connection.
    _tasks: JoinSet<()>,
}

impl Proxy {
    async fn start(path: &Path) -> Self {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path).unwrap();
        let mut tasks = JoinSet::new();
        tasks.spawn(async move {
            let mut conns = JoinSet::new();
            while let Ok((mut client, _)) = listener.accept().await {
                conns.spawn(async move {
                    if let Ok(mut daemon) = UnixStream::connect("/var/run/docker.sock").await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut daemon).await;
                    }
                });
            }
        });
        Self { _tasks: tasks }
    }
}

async fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The Docker source on `sock`, once its first list is in the cache.
async fn start_source(
    sock: &Path,
    resync_every: Duration,
) -> (
    Arc<DockerCache>,
    Arc<EventCounters>,
    watch::Sender<bool>,
    tokio::task::JoinHandle<()>,
) {
    let cache = Arc::new(DockerCache::default());
    let events = Arc::new(EventCounters::default());
    let (stop, stop_rx) = watch::channel(false);
    let config = DockerSourceConfig {
        socket: sock.to_owned(),
        timeout: Duration::from_secs(5),
        max_backoff: Duration::from_millis(500),
        resync_every,
    };
    let task = tokio::spawn(run(config, cache.clone(), events.clone(), stop_rx));
    wait_for("the first list", Duration::from_secs(10), || {
        cache.status().up
    })
    .await;
    (cache, events, stop, task)
}

/// Asks the source to stop; it must end within 5 s.
async fn stop_source(stop: watch::Sender<bool>, task: tokio::task::JoinHandle<()>) {
    stop.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("stops on shutdown")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follows_events_and_relists_after_the_daemon_returns() {
    require_root();
    ensure_image();
    let dir = tempfile::tempdir().unwrap();
    let sock: PathBuf = dir.path().join("docker.sock");
    let proxy = Proxy::start(&sock).await;

    let (cache, events, stop, task) =
        start_source(&sock, gpuwatch::sources::docker::RESYNC_EVERY).await;

    // A container started now reaches the cache through the event stream.
    let c = tokio::task::spawn_blocking(|| {
        Container::start(
            &unique("events"),
            &[("com.docker.compose.service", "ev")],
            "sleep 3600",
        )
    })
    .await
    .unwrap();
    wait_for("the start event", Duration::from_secs(10), || {
        cache.get(&c.id).is_some()
    })
    .await;
    let info = cache.get(&c.id).unwrap();
    assert_eq!(info.name, c.name);
    assert_eq!(info.compose_service.as_deref(), Some("ev"));
    assert_eq!(info.init_pid, Some(c.pid));

    // The daemon goes away: down, with the reason, and the last known containers kept.
    drop(proxy);
    let _ = std::fs::remove_file(&sock);
    wait_for("the source to go down", Duration::from_secs(10), || {
        !cache.status().up
    })
    .await;
    assert!(cache.status().error.is_some());
    assert!(
        cache.get(&c.id).is_some(),
        "names survive while Docker is away"
    );
    assert!(events.get(EventKind::DockerEventStreamLost) >= 1);

    // A container removed while the daemon is away must be gone after the re-list.
    let id = c.id.clone();
    tokio::task::spawn_blocking(move || drop(c)).await.unwrap();
    let proxy = Proxy::start(&sock).await;
    wait_for("the reconnect", Duration::from_secs(10), || {
        cache.status().up
    })
    .await;
    assert!(cache.get(&id).is_none(), "re-listed on reconnect");

    stop_source(stop, task).await;
    drop(proxy);
}

/// Forwards to the real Docker socket, but answers `500` to inspects of the container whose id
/// is in `fail` (while it is set): a daemon that lists a container and cannot describe it. With
/// `mute_events`, the event stream is answered and then never sends an event: a daemon whose
/// events are lost.
struct FaultyProxy {
    _tasks: JoinSet<()>,
    fail: Arc<std::sync::Mutex<Option<String>>>,
}

impl FaultyProxy {
    async fn start(path: &Path, fail: Option<String>, mute_events: bool) -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path).unwrap();
        let fail = Arc::new(std::sync::Mutex::new(fail));
        let mut tasks = JoinSet::new();
        let shared = fail.clone();
        tasks.spawn(async move {
            let mut conns = JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                let fail = shared.clone();
                conns.spawn(async move {
                    let Ok(daemon) = UnixStream::connect("/var/run/docker.sock").await else {
                        return;
                    };
                    let (mut client_rx, client_tx) = client.into_split();
                    let (mut daemon_rx, mut daemon_tx) = daemon.into_split();
                    let client_tx = Arc::new(tokio::sync::Mutex::new(client_tx));
                    let back = client_tx.clone();
                    // The daemon's answers go back as they come (one request at a time on a
                    // connection: the client waits for each answer before the next request).
                    let answers = tokio::spawn(async move {
                        let mut buf = vec![0u8; 64 * 1024];
                        while let Ok(n) = daemon_rx.read(&mut buf).await {
                            if n == 0 || back.lock().await.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    });
                    // Requests are GETs without bodies: each ends at its blank line.
                    let mut pending: Vec<u8> = Vec::new();
                    let mut buf = vec![0u8; 16 * 1024];
                    'conn: while let Ok(n) = client_rx.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        pending.extend_from_slice(&buf[..n]);
                        while let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head: Vec<u8> = pending.drain(..end + 4).collect();
                            let line = String::from_utf8_lossy(&head);
                            let line = line.lines().next().unwrap_or_default().to_owned();
                            let failing = fail.lock().unwrap().clone();
                            let refused = failing.is_some_and(|id| {
                                line.starts_with("GET ") && line.contains(&format!("/containers/{id}/json"))
                            });
                            if mute_events && line.starts_with("GET ") && line.contains("/events") {
                                let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
                                let _ = client_tx.lock().await.write_all(head.as_bytes()).await;
                                // Held open, silent, until the client goes.
                                let mut rest = vec![0u8; 1024];
                                while matches!(client_rx.read(&mut rest).await, Ok(n) if n > 0) {}
                                break 'conn;
                            } else if refused {
                                let body = r#"{"message":"injected failure"}"#;
                                let reply = format!(
                                    "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                                    body.len()
                                );
                                if client_tx.lock().await.write_all(reply.as_bytes()).await.is_err() {
                                    break 'conn;
                                }
                            } else if daemon_tx.write_all(&head).await.is_err() {
                                break 'conn;
                            }
                        }
                    }
                    answers.abort();
                });
            }
        });
        Self {
            _tasks: tasks,
            fail,
        }
    }

    fn stop_failing(&self) {
        *self.fail.lock().unwrap() = None;
    }
}

/// A running container whose inspect fails is kept as unverified (with the error), retried,
/// and known once the daemon answers; meanwhile a snapshot names why it has no name, and the
/// ghost check does not call its GPU process a survivor of a dead container.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_whose_inspect_fails_is_unverified_then_retried() {
    require_root();
    ensure_image();
    let c =
        tokio::task::spawn_blocking(|| Container::start(&unique("unverified"), &[], "sleep 3600"))
            .await
            .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let sock: PathBuf = dir.path().join("docker.sock");
    let proxy = FaultyProxy::start(&sock, Some(c.id.clone()), false).await;

    // A one-shot snapshot through the proxy, the container's main process on a fake GPU.
    let scenario = dir.path().join("scenario.json");
    std::fs::write(
        &scenario,
        serde_json::json!({"devices": [{"uuid": "GPU-u", "processes": [
            {"pid": c.pid, "used_memory_bytes": 2 * GIB, "sm_util": 50}]}]})
        .to_string(),
    )
    .unwrap();
    let (scenario2, sock2, id) = (scenario.clone(), sock.clone(), c.id.clone());
    let (snap, doctor) = tokio::task::spawn_blocking(move || {
        let socket = format!("unix://{}", sock2.display());
        let run = |cmd: &str| {
            let out = gpuwatch_on(&scenario2)
                .args([
                    cmd,
                    "--json",
                    "--window",
                    "1s",
                    "--no-ebpf",
                    "--docker-socket",
                    &socket,
                ])
                .output()
                .unwrap();
            let json: serde_json::Value = serde_json::from_slice(&out.stdout)
                .unwrap_or_else(|e| panic!("{cmd}: {e}: {}", String::from_utf8_lossy(&out.stderr)));
            json
        };
        (run("snapshot"), run("doctor"))
    })
    .await
    .unwrap();
    let w = workload(&snap, &format!("docker:{id}"));
    assert_eq!(w["container"], serde_json::Value::Null, "{w:#}");
    let why = w["container_unverified"].as_str().unwrap_or_default();
    assert!(
        why.contains("inspecting") && why.contains("injected failure"),
        "{w:#}"
    );
    assert_eq!(snap["sources"]["docker"]["up"], true);
    let doctor_text = doctor.to_string();
    assert!(
        !doctor_text.contains("container Docker no longer runs"),
        "a running container is no ghost: {doctor_text}"
    );
    assert!(
        doctor_text.contains("unverified") && doctor_text.contains("injected failure"),
        "doctor says it cannot tell, and why: {doctor_text}"
    );

    // The cache keeps it as unverified, retries, and knows it once the daemon answers.
    let (cache, events, stop, task) =
        start_source(&sock, gpuwatch::sources::docker::RESYNC_EVERY).await;
    assert!(cache.get(&c.id).is_none());
    assert!(cache
        .unverified(&c.id)
        .is_some_and(|e| e.contains("injected failure")));
    // Retried every 2 s: still failing, counted each time, logged once.
    tokio::time::sleep(gpuwatch::sources::docker::RETRY_EVERY * 2 + Duration::from_millis(500))
        .await;
    assert!(events.get(EventKind::DockerRequestFailed) >= 2);
    assert!(cache.unverified(&c.id).is_some());
    proxy.stop_failing();
    wait_for("the retry", Duration::from_secs(10), || {
        cache.get(&c.id).is_some()
    })
    .await;
    assert_eq!(cache.get(&c.id).unwrap().name, c.name);
    assert!(cache.unverified(&c.id).is_none());
    stop_source(stop, task).await;
    drop(proxy);
    tokio::task::spawn_blocking(move || drop(c)).await.unwrap();
}

/// The periodic re-list mends what the event stream missed: with every event lost, a
/// container started after the first list is known at the next resync, and is dropped at the
/// one after it stops. (Every 5 minutes by default; every 2 s here.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_resync_finds_containers_the_event_stream_missed() {
    require_root();
    ensure_image();
    let dir = tempfile::tempdir().unwrap();
    let sock: PathBuf = dir.path().join("docker.sock");
    let _proxy = FaultyProxy::start(&sock, None, true).await;
    const RESYNC: Duration = Duration::from_secs(2);
    let (cache, _events, stop, task) = start_source(&sock, RESYNC).await;
    let c = tokio::task::spawn_blocking(|| Container::start(&unique("resync"), &[], "sleep 3600"))
        .await
        .unwrap();
    // No event will tell: the first resync after the start must.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    wait_for("the resync to add it", RESYNC * 3, || {
        cache.get(&c.id).is_some()
    })
    .await;
    assert_eq!(cache.get(&c.id).unwrap().name, c.name);
    eprintln!("known {:?} after the start", started.elapsed());
    let id = c.id.clone();
    tokio::task::spawn_blocking(move || drop(c)).await.unwrap();
    wait_for("the resync to drop it", RESYNC * 3, || {
        cache.get(&id).is_none()
    })
    .await;
    assert!(cache.status().up, "a silent stream is no failure");
    stop_source(stop, task).await;
}
