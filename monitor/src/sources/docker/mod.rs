//! The Docker source: a cache of running containers kept current by the event stream.
//!
//! On connect it subscribes to container events from the moment before listing (so nothing that
//! happens during the list is lost), lists and inspects the running containers, then applies
//! `start` / `die` / `destroy` / `rename` events. When the daemon goes away it marks itself down,
//! retries with back-off and re-lists on reconnect. Samplers only ever read the cache: Docker
//! metadata never costs a request per round.
//!
//! A container Docker lists as running but fails to inspect is kept as *unverified* (with the
//! error) and inspected again every [`RETRY_EVERY`]; the list is compared with the cache every
//! [`RESYNC_EVERY`], so an event the stream lost cannot leave a container out for good. A
//! process in an unverified container's cgroup is not a ghost: Docker runs it.
mod gpu_claims;

use crate::events::{DockerEventStreamLost, DockerRequestFailed, EventCounters, EventKind};
use crate::model::{ContainerInfo, Engine, GpuDeviceRequest, KubernetesPod};
use bollard::models::ContainerInspectResponse;
use bollard::query_parameters::{EventsOptions, InspectContainerOptions, ListContainersOptions};
use bollard::Docker;
use futures_util::StreamExt;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::watch;

pub const COMPOSE_PROJECT_LABEL: &str = "com.docker.compose.project";
pub const COMPOSE_SERVICE_LABEL: &str = "com.docker.compose.service";

#[derive(Clone, Debug)]
pub struct DockerSourceConfig {
    /// The daemon's socket (`unix://` prefix allowed).
    pub socket: PathBuf,
    /// Per-request timeout.
    pub timeout: Duration,
    /// Longest wait between reconnection attempts.
    pub max_backoff: Duration,
    /// How often the running containers are listed again, to mend what the event stream
    /// missed.
    pub resync_every: Duration,
}

impl Default for DockerSourceConfig {
    fn default() -> Self {
        Self {
            socket: PathBuf::from("/var/run/docker.sock"),
            timeout: Duration::from_secs(5),
            max_backoff: Duration::from_secs(30),
            resync_every: RESYNC_EVERY,
        }
    }
}

impl DockerSourceConfig {
    /// The socket's file, without a `unix://` prefix.
    pub fn socket_path(&self) -> &std::path::Path {
        self.socket
            .to_str()
            .and_then(|s| s.strip_prefix("unix://"))
            .map_or(&self.socket, std::path::Path::new)
    }
}

/// The source's health, as shown in snapshots.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DockerStatus {
    pub up: bool,
    /// Why the source is down (or was, most recently).
    pub error: Option<String>,
    /// Set once the first connection attempt has finished, successfully or not.
    pub attempted: bool,
    /// The engine that answered the last connection.
    pub engine: Option<Engine>,
}

/// How often the containers whose inspect failed are asked about again.
pub const RETRY_EVERY: Duration = Duration::from_secs(2);
/// How often the running containers are listed again and compared with the cache.
pub const RESYNC_EVERY: Duration = Duration::from_secs(300);

#[derive(Default)]
struct CacheState {
    status: DockerStatus,
    containers: HashMap<String, Arc<ContainerInfo>>,
    /// Running containers whose inspect failed, with the error.
    unverified: HashMap<String, String>,
}

/// The container cache, shared between the Docker task and the samplers.
#[derive(Default)]
pub struct DockerCache {
    state: RwLock<CacheState>,
}

impl DockerCache {
    pub fn status(&self) -> DockerStatus {
        self.read().status.clone()
    }

    pub fn containers(&self) -> Vec<Arc<ContainerInfo>> {
        self.read().containers.values().cloned().collect()
    }

    pub fn get(&self, id: &str) -> Option<Arc<ContainerInfo>> {
        self.read().containers.get(id).cloned()
    }

    /// Why container `id` is listed as running but not known: its inspect failed.
    pub fn unverified(&self, id: &str) -> Option<String> {
        self.read().unverified.get(id).cloned()
    }

    /// Records the outcome of inspecting `id`: known, not running, or failed (kept to retry).
    fn record_inspect(&self, id: &str, outcome: InspectOutcome) {
        let mut s = self.write();
        match outcome {
            InspectOutcome::Running(info) => {
                s.unverified.remove(id);
                s.containers.insert(id.to_owned(), Arc::new(*info));
            }
            InspectOutcome::NotRunning => {
                s.unverified.remove(id);
                s.containers.remove(id);
            }
            InspectOutcome::Failed(e) => {
                s.unverified.insert(id.to_owned(), e);
            }
        }
    }

    /// Blocks until the first connection attempt finishes or `timeout` passes.
    pub fn wait_attempted(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.read().status.attempted {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, CacheState> {
        // A writer that panicked leaves consistent data (each write is one assignment).
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, CacheState> {
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }

    fn set_down(&self, error: String) {
        let mut s = self.write();
        s.status = DockerStatus {
            up: false,
            error: Some(error),
            attempted: true,
            engine: s.status.engine,
        };
        // Keep the last known containers: their identities are still right while the daemon is
        // away, and dropping them would lose names for running GPU jobs.
    }
}

/// An error and its causes, each once: the client's own text ("client error (Connect)") says
/// nothing of why; the cause beneath it does ("Permission denied (os error 13)").
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let t = c.to_string();
        if !text.contains(&t) {
            text.push_str(": ");
            text.push_str(&t);
        }
        cause = c.source();
    }
    text
}

/// Runs the Docker source until `shutdown` turns true.
pub async fn run(
    config: DockerSourceConfig,
    cache: Arc<DockerCache>,
    events: Arc<EventCounters>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut backoff = Duration::from_millis(500);
    while !*shutdown.borrow() {
        match connect_and_follow(&config, &cache, &events, &mut shutdown).await {
            Ok(()) => return, // shutdown requested
            Err(e) => {
                let text = with_causes(&e);
                let status = cache.status();
                let was_up = status.up;
                if was_up {
                    events.emit(DockerEventStreamLost {
                        error: text.clone(),
                    });
                } else if status.error.as_deref() == Some(text.as_str()) {
                    // The same failure again while retrying: count it, log it once.
                    events.add(EventKind::DockerRequestFailed, 1);
                } else {
                    events.emit(DockerRequestFailed {
                        error: text.clone(),
                    });
                }
                cache.set_down(text);
                if was_up {
                    backoff = Duration::from_millis(500);
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = shutdown.changed() => {}
        }
        backoff = (backoff * 2).min(config.max_backoff);
    }
}

#[derive(Debug, thiserror::Error)]
enum FollowError {
    #[error(
        "cannot connect to Docker at {socket}{}: {source}",
        access_hint(source)
    )]
    Connect {
        socket: String,
        source: bollard::errors::Error,
    },
    #[error("Docker at {socket}: {what}: {source}")]
    Request {
        socket: String,
        what: &'static str,
        source: bollard::errors::Error,
    },
    #[error("Docker at {socket}: the event stream ended")]
    StreamEnded { socket: String },
}

/// What to do when the socket refused this user: the kernel's EACCES, anywhere in the chain.
/// (bollard's I/O variant is transparent: its own io::Error is not in the source chain.)
fn access_hint(e: &bollard::errors::Error) -> &'static str {
    use std::io::ErrorKind::PermissionDenied;
    let mut refused =
        matches!(e, bollard::errors::Error::IOError { err } if err.kind() == PermissionDenied);
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause.filter(|_| !refused) {
        refused = c
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == PermissionDenied);
        cause = c.source();
    }
    if refused {
        " (this user may not use Docker's socket: run gpuwatch as root, or as a member of the \
         socket's group, usually docker)"
    } else {
        ""
    }
}

/// A connected engine: Docker's API, answered by Docker or by Podman's compatible service.
struct Daemon {
    docker: Docker,
    engine: Engine,
}

impl Daemon {
    /// Which engine answers, from `/version`: Podman names its own component.
    async fn identify(docker: Docker) -> Result<Self, bollard::errors::Error> {
        let version = docker.version().await?;
        let podman = version
            .components
            .unwrap_or_default()
            .iter()
            .any(|c| c.name.contains("Podman"));
        let engine = if podman {
            Engine::Podman
        } else {
            Engine::Docker
        };
        Ok(Self { docker, engine })
    }
}

async fn connect_and_follow(
    config: &DockerSourceConfig,
    cache: &DockerCache,
    events: &EventCounters,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<(), FollowError> {
    let socket = config.socket.display().to_string();
    let docker = Docker::connect_with_unix(
        &socket,
        config.timeout.as_secs().max(1),
        bollard::API_DEFAULT_VERSION,
    )
    .map_err(|source| FollowError::Connect {
        socket: socket.clone(),
        source,
    })?
    .negotiate_version()
    .await
    .map_err(|source| FollowError::Connect {
        socket: socket.clone(),
        source,
    })?;
    let daemon = Daemon::identify(docker)
        .await
        .map_err(|source| FollowError::Connect {
            socket: socket.clone(),
            source,
        })?;
    let docker = &daemon.docker;
    let request = |what| {
        let socket = socket.clone();
        move |source| FollowError::Request {
            socket,
            what,
            source,
        }
    };

    // Events from one second before the list: whatever happens while listing is replayed.
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs().saturating_sub(1));
    let filters = HashMap::from([("type".to_owned(), vec!["container".to_owned()])]);
    let mut stream = docker.events(Some(EventsOptions {
        since: Some(since.to_string()),
        until: None,
        filters: Some(filters),
    }));

    let listed = docker
        .list_containers(Some(ListContainersOptions {
            all: false,
            ..Default::default()
        }))
        .await
        .map_err(request("listing containers"))?;
    // Built apart and swapped in at once: readers keep the last known containers meanwhile.
    let (mut containers, mut unverified) = (HashMap::new(), HashMap::new());
    for id in listed.into_iter().filter_map(|c| c.id) {
        match inspect_outcome(&daemon, &id, events, None).await {
            InspectOutcome::Running(info) => {
                containers.insert(id, Arc::new(*info));
            }
            InspectOutcome::NotRunning => {}
            InspectOutcome::Failed(e) => {
                unverified.insert(id, e);
            }
        }
    }
    {
        let mut s = cache.write();
        s.containers = containers;
        s.unverified = unverified;
        s.status = DockerStatus {
            up: true,
            error: None,
            attempted: true,
            engine: Some(daemon.engine),
        };
    }
    tracing::info!(socket = %socket, engine = ?daemon.engine, containers = cache.read().containers.len(), "Docker source up");

    let mut retry = tokio::time::interval(RETRY_EVERY);
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut resync = tokio::time::interval(config.resync_every);
    resync.tick().await; // the first tick is now: the list above
    let mut unverified = false;
    loop {
        // The retry timer runs only while an inspect failed: otherwise it would wake the
        // thread every RETRY_EVERY for nothing. Re-armed, it first fires a period later.
        let failed = !cache.read().unverified.is_empty();
        if failed && !unverified {
            retry.reset();
        }
        unverified = failed;
        let item = tokio::select! {
            item = stream.next() => item,
            _ = retry.tick(), if unverified => {
                retry_unverified(&daemon, cache, events).await;
                continue;
            }
            _ = resync.tick() => {
                resync_list(&daemon, cache, events).await.map_err(request("listing containers"))?;
                continue;
            }
            _ = shutdown.changed() => return Ok(()),
        };
        let Some(item) = item else {
            return Err(FollowError::StreamEnded { socket });
        };
        let event = item.map_err(request("event stream"))?;
        let (Some(action), Some(id)) = (event.action.as_deref(), event.actor.and_then(|a| a.id))
        else {
            continue;
        };
        match action {
            "start" | "rename" | "unpause" => {
                let outcome = inspect_outcome(&daemon, &id, events, None).await;
                cache.record_inspect(&id, outcome);
            }
            "die" | "destroy" => cache.record_inspect(&id, InspectOutcome::NotRunning),
            _ => {}
        }
    }
}

/// What one inspect found.
enum InspectOutcome {
    Running(Box<ContainerInfo>),
    NotRunning,
    Failed(String),
}

/// Inspects `id`; a failure is logged and counted, or only counted when it repeats `before`
/// (the error of the last try).
async fn inspect_outcome(
    daemon: &Daemon,
    id: &str,
    events: &EventCounters,
    before: Option<&str>,
) -> InspectOutcome {
    match inspect(daemon, id).await {
        Ok(Some(info)) => InspectOutcome::Running(Box::new(info)),
        Ok(None) => InspectOutcome::NotRunning,
        Err(e) => {
            let text = format!("inspecting {id}: {}", with_causes(&e));
            if before == Some(text.as_str()) {
                events.add(EventKind::DockerRequestFailed, 1);
            } else {
                events.emit(DockerRequestFailed {
                    error: text.clone(),
                });
            }
            InspectOutcome::Failed(text)
        }
    }
}

/// Asks again about the containers whose inspect failed.
async fn retry_unverified(daemon: &Daemon, cache: &DockerCache, events: &EventCounters) {
    let pending: Vec<(String, String)> = cache
        .read()
        .unverified
        .iter()
        .map(|(id, e)| (id.clone(), e.clone()))
        .collect();
    for (id, before) in pending {
        let outcome = inspect_outcome(daemon, &id, events, Some(&before)).await;
        if let InspectOutcome::Running(_) = &outcome {
            tracing::info!("container {id} inspected after an earlier failure");
        }
        cache.record_inspect(&id, outcome);
    }
}

/// Lists the running containers and mends the cache where the event stream left it behind:
/// one it holds that no longer runs is dropped, one it lacks is inspected.
async fn resync_list(
    daemon: &Daemon,
    cache: &DockerCache,
    events: &EventCounters,
) -> Result<(), bollard::errors::Error> {
    let listed: std::collections::HashSet<String> = daemon
        .docker
        .list_containers(Some(ListContainersOptions {
            all: false,
            ..Default::default()
        }))
        .await?
        .into_iter()
        .filter_map(|c| c.id)
        .collect();
    let (stale, missing): (Vec<String>, Vec<String>) = {
        let s = cache.read();
        let stale = s
            .containers
            .keys()
            .chain(s.unverified.keys())
            .filter(|id| !listed.contains(*id))
            .cloned()
            .collect();
        let missing = listed
            .iter()
            .filter(|id| !s.containers.contains_key(*id) && !s.unverified.contains_key(*id))
            .cloned()
            .collect();
        (stale, missing)
    };
    for id in stale {
        cache.record_inspect(&id, InspectOutcome::NotRunning);
    }
    for id in missing {
        let outcome = inspect_outcome(daemon, &id, events, None).await;
        cache.record_inspect(&id, outcome);
    }
    Ok(())
}

/// Inspects one container; `None` if it is not running (or no longer exists).
async fn inspect(
    daemon: &Daemon,
    id: &str,
) -> Result<Option<ContainerInfo>, bollard::errors::Error> {
    match daemon
        .docker
        .inspect_container(id, None::<InspectContainerOptions>)
        .await
    {
        Ok(r) => Ok(container_info(r, id, daemon.engine)),
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// What the agent keeps of an inspect response; `None` unless the container is running.
pub fn container_info(
    r: ContainerInspectResponse,
    id: &str,
    engine: Engine,
) -> Option<ContainerInfo> {
    let state = r.state.unwrap_or_default();
    if state.running != Some(true) {
        return None;
    }
    let config = r.config.unwrap_or_default();
    let labels = config.labels.unwrap_or_default();
    let host = r.host_config.unwrap_or_default();
    let gpu_device_requests: Vec<GpuDeviceRequest> = host
        .device_requests
        .unwrap_or_default()
        .into_iter()
        .filter(|d| {
            d.driver.as_deref() == Some("nvidia")
                || d.capabilities
                    .iter()
                    .flatten()
                    .any(|caps| caps.iter().any(|c| c == "gpu"))
        })
        .map(|d| GpuDeviceRequest {
            driver: d.driver,
            count: d.count,
            device_ids: d.device_ids.unwrap_or_default(),
            capabilities: d.capabilities.unwrap_or_default(),
        })
        .collect();
    let gpu_claims = gpu_claims::gpu_claims(
        &gpu_device_requests,
        host.devices.as_deref().unwrap_or_default(),
        config.env.as_deref().unwrap_or_default(),
        host.runtime.as_deref(),
    );
    let blkio_throttled = [
        &host.blkio_device_read_bps,
        &host.blkio_device_write_bps,
        &host.blkio_device_read_iops,
        &host.blkio_device_write_iops,
    ]
    .iter()
    .any(|t| t.as_ref().is_some_and(|v| !v.is_empty()));
    Some(ContainerInfo {
        id: r.id.unwrap_or_else(|| id.to_owned()),
        engine,
        name: r
            .name
            .unwrap_or_default()
            .trim_start_matches('/')
            .to_owned(),
        image: config.image.or(r.image).unwrap_or_default(),
        compose_project: labels.get(COMPOSE_PROJECT_LABEL).cloned(),
        compose_service: labels.get(COMPOSE_SERVICE_LABEL).cloned(),
        kubernetes: KubernetesPod::from_labels(&labels),
        started_at: state.started_at,
        init_pid: state
            .pid
            .and_then(|p| u32::try_from(p).ok())
            .filter(|p| *p > 0),
        gpu_device_requests,
        gpu_claims,
        ipc_mode: host.ipc_mode,
        runtime: host.runtime,
        blkio_throttled,
        labels,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A socket this user may not open says what to do about it; another failure does not.
    #[test]
    fn a_socket_refused_to_this_user_names_the_fix() {
        let refused = FollowError::Connect {
            socket: "/var/run/docker.sock".into(),
            source: bollard::errors::Error::IOError {
                err: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
            },
        };
        let text = refused.to_string();
        assert!(
            text.contains("run gpuwatch as root, or as a member"),
            "{text}"
        );
        let missing = FollowError::Connect {
            socket: "/var/run/docker.sock".into(),
            source: bollard::errors::Error::IOError {
                err: std::io::Error::from(std::io::ErrorKind::NotFound),
            },
        };
        assert!(!missing.to_string().contains("member"), "{missing}");
    }

    #[test]
    fn a_request_error_says_why_beneath_the_client_text() {
        #[derive(Debug, thiserror::Error)]
        #[error("client error (Connect)")]
        struct Client(#[source] std::io::Error);
        let e = Client(std::io::Error::from_raw_os_error(libc::EACCES));
        assert_eq!(
            with_causes(&e),
            "client error (Connect): Permission denied (os error 13)"
        );
        let config = DockerSourceConfig {
            socket: "unix:///run/docker.sock".into(),
            ..Default::default()
        };
        assert_eq!(
            config.socket_path(),
            std::path::Path::new("/run/docker.sock")
        );
    }
    use bollard::models::{ContainerConfig, ContainerState, DeviceRequest, HostConfig};

    fn response(running: bool, requests: Vec<DeviceRequest>) -> ContainerInspectResponse {
        ContainerInspectResponse {
            id: Some("abc".into()),
            name: Some("/trainer".into()),
            image: Some("sha256:1234".into()),
            state: Some(ContainerState {
                running: Some(running),
                pid: Some(4242),
                started_at: Some("2026-11-29T10:00:00Z".into()),
                ..Default::default()
            }),
            config: Some(ContainerConfig {
                image: Some("ultralytics/yolo:latest".into()),
                labels: Some(HashMap::from([
                    (COMPOSE_PROJECT_LABEL.to_owned(), "vision".to_owned()),
                    (COMPOSE_SERVICE_LABEL.to_owned(), "train".to_owned()),
                ])),
                ..Default::default()
            }),
            host_config: Some(HostConfig {
                device_requests: Some(requests),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn keeps_identity_compose_labels_and_gpu_requests() {
        let gpus = DeviceRequest {
            driver: Some("nvidia".into()),
            count: Some(-1),
            device_ids: None,
            capabilities: Some(vec![vec!["gpu".into()]]),
            options: None,
        };
        let by_id = DeviceRequest {
            driver: None,
            count: None,
            device_ids: Some(vec!["GPU-1".into()]),
            capabilities: Some(vec![vec!["gpu".into(), "utility".into()]]),
            options: None,
        };
        let other = DeviceRequest {
            driver: Some("fpga".into()),
            ..Default::default()
        };
        let info = container_info(
            response(true, vec![gpus, by_id, other]),
            "abc",
            Engine::Docker,
        )
        .unwrap();
        assert_eq!(info.name, "trainer");
        assert_eq!(info.image, "ultralytics/yolo:latest");
        assert_eq!(info.compose_project.as_deref(), Some("vision"));
        assert_eq!(info.compose_service.as_deref(), Some("train"));
        assert_eq!(info.init_pid, Some(4242));
        assert_eq!(
            info.gpu_device_requests.len(),
            2,
            "the fpga request is not a GPU"
        );
        assert_eq!(info.gpu_device_requests[0].count, Some(-1));
        assert_eq!(
            info.gpu_device_requests[1].device_ids,
            vec!["GPU-1".to_owned()]
        );
    }

    #[test]
    fn a_throttled_container_is_marked() {
        use bollard::models::ThrottleDevice;
        let mut r = response(true, vec![]);
        assert!(
            !container_info(r.clone(), "abc", Engine::Docker)
                .unwrap()
                .blkio_throttled
        );
        r.host_config.as_mut().unwrap().blkio_device_read_bps = Some(vec![ThrottleDevice {
            path: Some("/dev/loop0".into()),
            rate: Some(1 << 20),
        }]);
        assert!(
            container_info(r, "abc", Engine::Docker)
                .unwrap()
                .blkio_throttled
        );
    }

    #[test]
    fn stopped_containers_are_not_kept() {
        assert!(container_info(response(false, vec![]), "abc", Engine::Docker).is_none());
    }
}
