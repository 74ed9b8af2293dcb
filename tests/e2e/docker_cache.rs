//! The Docker cache against a real dockerd: kept current by the event stream, marked down when
//! the daemon goes away, re-listed when it comes back. The daemon "goes away" by closing a
//! socket proxy in front of the real one.
mod support;

use gpuwatch::events::{EventCounters, InternalEvent};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follows_events_and_relists_after_the_daemon_returns() {
    require_root();
    ensure_image();
    let dir = tempfile::tempdir().unwrap();
    let sock: PathBuf = dir.path().join("docker.sock");
    let proxy = Proxy::start(&sock).await;

    let cache = Arc::new(DockerCache::default());
    let events = Arc::new(EventCounters::default());
    let (stop, stop_rx) = watch::channel(false);
    let config = DockerSourceConfig {
        socket: sock.clone(),
        timeout: Duration::from_secs(5),
        max_backoff: Duration::from_millis(500),
    };
    let task = tokio::spawn(run(config, cache.clone(), events.clone(), stop_rx));
    wait_for("the first list", Duration::from_secs(10), || {
        cache.status().up
    })
    .await;

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
    assert!(events.get(InternalEvent::DockerEventStreamLost) >= 1);

    // A container removed while the daemon is away must be gone after the re-list.
    let id = c.id.clone();
    tokio::task::spawn_blocking(move || drop(c)).await.unwrap();
    let proxy = Proxy::start(&sock).await;
    wait_for("the reconnect", Duration::from_secs(10), || {
        cache.status().up
    })
    .await;
    assert!(cache.get(&id).is_none(), "re-listed on reconnect");

    stop.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("stops on shutdown")
        .unwrap();
    drop(proxy);
}
