//! Workload identities: what a cgroup belongs to (a container, a unit, a job, the host), and the
//! host's cgroup mode.
use serde::{Deserialize, Serialize};
use std::fmt;

/// What kind of workload a cgroup belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkloadKind {
    Docker,
    Podman,
    Kubernetes,
    Systemd,
    /// A non-root cgroup no runtime claims (batch schedulers, hand-made cgroups).
    Cgroup,
    Host,
}

impl WorkloadKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Docker => "docker",
            Self::Podman => "podman",
            Self::Kubernetes => "kubernetes",
            Self::Systemd => "systemd",
            Self::Cgroup => "cgroup",
            Self::Host => "host",
        }
    }

    /// Whether this kind is a container (has a container id).
    pub fn is_container(self) -> bool {
        matches!(self, Self::Docker | Self::Podman | Self::Kubernetes)
    }
}

/// A workload identity: its kind plus an id unique within the kind.
///
/// - Docker / Podman: the 64-hex container id.
/// - Kubernetes: `<pod uid>/<container id>`, or `<pod uid>` for pod-level cgroups.
/// - Systemd: the unit name (`nvidia-persistenced.service`).
/// - Cgroup: the cgroup path itself.
/// - Host: `host`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkloadId {
    pub kind: WorkloadKind,
    /// Shared: every GPU process of a round carries its workload's id (1,600 copies a round at
    /// 8 GPUs × 200 processes), and a clone is a reference count, not a 64-byte copy.
    pub id: std::sync::Arc<str>,
}

impl WorkloadId {
    pub fn host() -> Self {
        Self {
            kind: WorkloadKind::Host,
            id: "host".into(),
        }
    }

    pub(crate) fn new(kind: WorkloadKind, id: impl Into<std::sync::Arc<str>>) -> Self {
        Self {
            kind,
            id: id.into(),
        }
    }

    /// The container id, for container kinds (for Kubernetes, the container part of the id).
    pub fn container_id(&self) -> Option<&str> {
        match self.kind {
            WorkloadKind::Docker | WorkloadKind::Podman => Some(&self.id),
            WorkloadKind::Kubernetes => self.id.split_once('/').map(|(_, c)| c),
            _ => None,
        }
    }
}

impl fmt::Display for WorkloadId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.kind.as_str(), self.id)
    }
}

impl Serialize for WorkloadId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// `kind:id`, as it is written (a recording read back).
impl<'de> Deserialize<'de> for WorkloadId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        let (kind, id) = text
            .split_once(':')
            .ok_or_else(|| serde::de::Error::custom(format!("{text:?} is not kind:id")))?;
        let kind =
            WorkloadKind::deserialize(serde::de::value::StrDeserializer::<D::Error>::new(kind))?;
        Ok(Self::new(kind, id))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupMode {
    V1,
    Hybrid,
    V2,
    /// No cgroup filesystem is mounted (containers cannot be told apart).
    None,
}
