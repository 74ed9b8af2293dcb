//! What the Docker source knows of a running container.
use super::gpu_claim::GpuClaim;
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

/// What the agent knows of one running container.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ContainerInfo {
    pub id: String,
    pub name: String,
    pub image: String,
    pub compose_project: Option<String>,
    pub compose_service: Option<String>,
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
