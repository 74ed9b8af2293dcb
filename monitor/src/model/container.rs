//! What the container sources (Docker, containerd) know of a running container.
use super::gpu_claim::GpuClaim;
use super::workload::{WorkloadId, WorkloadKind};
use serde::Serialize;
use std::collections::HashMap;

/// A GPU request in a container's `HostConfig.DeviceRequests` (`--gpus`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GpuDeviceRequest {
    pub driver: Option<String>,
    /// Number of GPUs requested; -1 means all.
    pub count: Option<i64>,
    pub device_ids: Vec<String>,
    pub capabilities: Vec<Vec<String>>,
}

/// The Kubernetes pod a container belongs to, from the labels the kubelet puts on the containers
/// it starts through Docker (`io.kubernetes.pod.name`, `io.kubernetes.pod.namespace`,
/// `io.kubernetes.container.name`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct KubernetesPod {
    #[serde(serialize_with = "crate::model::bounded::json")]
    pub namespace: String,
    #[serde(serialize_with = "crate::model::bounded::json")]
    pub pod: String,
    /// The container's name in the pod spec; absent on the pod's sandbox (`POD`) container.
    #[serde(serialize_with = "crate::model::bounded::json_opt")]
    pub container: Option<String>,
    /// The pod's uid (`io.kubernetes.pod.uid`), which its cgroup path carries.
    #[serde(skip)]
    pub uid: Option<String>,
}

impl KubernetesPod {
    pub const NAME_LABEL: &str = "io.kubernetes.pod.name";
    pub const NAMESPACE_LABEL: &str = "io.kubernetes.pod.namespace";
    pub const CONTAINER_LABEL: &str = "io.kubernetes.container.name";
    pub const UID_LABEL: &str = "io.kubernetes.pod.uid";

    /// The pod named by a container's labels; `None` unless both pod name and namespace are set.
    pub fn from_labels(labels: &HashMap<String, String>) -> Option<Self> {
        let text = |key: &str| labels.get(key).filter(|v| !v.is_empty()).cloned();
        Some(Self {
            namespace: text(Self::NAMESPACE_LABEL)?,
            pod: text(Self::NAME_LABEL)?,
            container: text(Self::CONTAINER_LABEL),
            uid: text(Self::UID_LABEL),
        })
    }
}

impl std::fmt::Display for KubernetesPod {
    /// `namespace/pod`, as kubectl names a pod.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.pod)
    }
}

/// The engine that runs a container, behind the same Docker API.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    #[default]
    Docker,
    /// Podman's Docker-compatible service (`podman system service`).
    Podman,
    /// containerd's CRI plugin (Kubernetes nodes without Docker): named from its tasks' specs.
    Containerd,
}

impl Engine {
    /// The workload kind its containers' cgroups classify as (`docker-<id>` / `libpod-<id>`).
    pub fn workload_kind(self) -> WorkloadKind {
        match self {
            Self::Docker => WorkloadKind::Docker,
            Self::Podman => WorkloadKind::Podman,
            Self::Containerd => WorkloadKind::Kubernetes,
        }
    }
}

/// What the agent knows of one running container.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ContainerInfo {
    pub id: String,
    /// Docker, or Podman answering Docker's API.
    pub engine: Engine,
    /// The tenant's strings are cut to [`crate::model::bounded::JSON_MAX_CHARS`] in the JSON.
    #[serde(serialize_with = "crate::model::bounded::json")]
    pub name: String,
    #[serde(serialize_with = "crate::model::bounded::json")]
    pub image: String,
    #[serde(serialize_with = "crate::model::bounded::json_opt")]
    pub compose_project: Option<String>,
    #[serde(serialize_with = "crate::model::bounded::json_opt")]
    pub compose_service: Option<String>,
    /// Its Kubernetes pod, where the kubelet's labels name one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<KubernetesPod>,
    /// RFC 3339 start time.
    pub started_at: Option<String>,
    /// Host PID of the container's init process.
    #[serde(skip)]
    pub init_pid: Option<u32>,
    pub gpu_device_requests: Vec<GpuDeviceRequest>,
    /// Every declaration of GPUs for it (`--gpus`, `--device /dev/nvidiaN`,
    /// `NVIDIA_VISIBLE_DEVICES`), as read from the inspect response.
    pub gpu_claims: Vec<GpuClaim>,
    /// `HostConfig.IpcMode`: `private`, `shareable`, `host`, `container:<id>`.
    pub ipc_mode: Option<String>,
    /// `HostConfig.Runtime`: the OCI runtime it runs under (`runc`, `nvidia`).
    pub runtime: Option<String>,
    /// Its block I/O is throttled (`--device-read-bps` and the like): the kernel then issues its
    /// disk requests from the throttle's worker thread, where they cannot be told apart.
    pub blkio_throttled: bool,
    #[serde(skip)]
    pub labels: HashMap<String, String>,
}

impl ContainerInfo {
    /// A container known by its id, engine, name and image only (every other field empty).
    pub fn named(id: &str, engine: Engine, name: String, image: String) -> Self {
        Self {
            id: id.to_owned(),
            engine,
            name,
            image,
            compose_project: None,
            compose_service: None,
            kubernetes: None,
            started_at: None,
            init_pid: None,
            gpu_device_requests: Vec::new(),
            gpu_claims: Vec::new(),
            ipc_mode: None,
            runtime: None,
            blkio_throttled: false,
            labels: HashMap::new(),
        }
    }

    /// The workload its processes' cgroups name: a pod's container (the kubelet started it
    /// through Docker, and its cgroup sits under the pod's) is `kubernetes:<pod uid>/<id>`, any
    /// other container `docker:<id>` or `podman:<id>` by its engine.
    pub fn workload_id(&self) -> WorkloadId {
        match self.kubernetes.as_ref().and_then(|k| k.uid.as_deref()) {
            Some(uid) => WorkloadId::new(WorkloadKind::Kubernetes, format!("{uid}/{}", self.id)),
            None => self.engine_workload_id(),
        }
    }

    /// `docker:<id>` or `podman:<id>`: the workload by its engine alone.
    pub fn engine_workload_id(&self) -> WorkloadId {
        WorkloadId::new(self.engine.workload_kind(), self.id.as_str())
    }
}
