//! What an alert rule is: a condition looked at in each snapshot, with an outcome per subject —
//! a GPU, a container, a GPU process — that says whether it holds ([`Outcome::Breached`]), does
//! not ([`Outcome::Clear`]), or cannot be told this round ([`Outcome::Unknown`]: the data is
//! missing, and a missing reading must neither fire nor resolve an alert). How long a condition
//! must hold is the lifecycle's job ([`super::alerts`]); which rules exist, the registry's
//! ([`super::rules`]).
use crate::model::{Gpu, Snapshot, Workload, WorkloadId};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Warning,
    Critical,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Warning => "warning",
            Self::Critical => "critical",
        }
    }
}

impl std::fmt::Display for Severity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One rule's config: `enabled`, `for` and `severity`, then the rule's own thresholds, with
/// their defaults. Every key is optional; unknown keys are errors.
macro_rules! rule_config {
    ($(#[$meta:meta])* $name:ident { $($(#[$fmeta:meta])* $field:ident : $ty:ty = $default:expr,)* }
     for = $for:expr, severity = $sev:expr) => {
        $(#[$meta])*
        #[derive(Clone, Debug, serde::Deserialize)]
        #[serde(deny_unknown_fields, default)]
        pub struct $name {
            pub enabled: bool,
            /// How long the condition must hold before the alert fires.
            #[serde(rename = "for", with = "crate::units::duration")]
            pub for_: std::time::Duration,
            pub severity: $crate::health::rule::Severity,
            $($(#[$fmeta])* pub $field: $ty,)*
        }

        impl Default for $name {
            fn default() -> Self {
                Self {
                    enabled: true,
                    for_: $for,
                    severity: $sev,
                    $($field: $default,)*
                }
            }
        }
    };
}
pub(crate) use rule_config;

/// An alert rule. Each round it appends one [`Outcome`] per subject it applies to; a subject it
/// no longer reports resolves (its container stopped, its process went away).
pub trait Rule: Send {
    fn evaluate(&mut self, round: &SnapshotView<'_>, out: &mut Outcomes);
}

/// What one rule says about its subjects in one round: (key, subject, outcome), the key naming
/// the subject across rounds (a GPU's UUID, a workload id, ...).
pub type Outcomes = Vec<(String, Subject, Outcome)>;

/// One rule's outcome for one subject, as the lifecycle takes it.
#[derive(Clone, Debug)]
pub struct Evaluation {
    pub rule: &'static str,
    pub severity: Severity,
    pub for_: Duration,
    /// Identifies the alert across rounds: rule and subject.
    pub key: String,
    pub subject: Subject,
    pub outcome: Outcome,
}

/// What an alert is about.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Subject {
    pub gpu: Option<GpuRef>,
    pub container: Option<ContainerRef>,
    pub pid: Option<u32>,
}

/// A tenant's name, image or service as an alert carries it: every sink repeats it.
fn named(s: &str) -> String {
    crate::model::bounded::bounded(s, NAME_MAX_CHARS).into_owned()
}

/// The most characters of a name in an alert's subject.
const NAME_MAX_CHARS: usize = 256;

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GpuRef {
    pub index: u32,
    pub uuid: Option<String>,
}

impl GpuRef {
    pub fn of(g: &Gpu) -> Self {
        Self {
            index: g.device.index,
            uuid: g.device.uuid.clone(),
        }
    }
}

/// A workload as alerts name it: the container's name, image and compose service when it is
/// one.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ContainerRef {
    pub workload: WorkloadId,
    pub name: String,
    pub id: Option<String>,
    pub image: Option<String>,
    pub compose_service: Option<String>,
    /// `namespace/pod`, where the container is a Kubernetes pod's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
}

impl ContainerRef {
    pub fn of(w: &Workload) -> Self {
        Self {
            workload: w.id.clone(),
            name: named(&w.name),
            id: w.container.as_ref().map(|c| c.id.clone()),
            image: w.container.as_ref().map(|c| named(&c.image)),
            compose_service: w
                .container
                .as_ref()
                .and_then(|c| c.compose_service.as_deref())
                .map(named),
            pod: w
                .container
                .as_ref()
                .and_then(|c| c.kubernetes.as_ref())
                .map(|k| named(&k.to_string())),
        }
    }
}

/// A breached condition, with the words an alert carries.
#[derive(Clone, Debug, PartialEq)]
pub struct Finding {
    pub value: f64,
    pub threshold: f64,
    pub unit: &'static str,
    pub summary: String,
    pub action: String,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Breached(Finding),
    Clear,
    /// The data is missing this round: keep the alert as it is.
    Unknown,
}

/// One snapshot as the rules read it, with the lookups several rules share.
pub struct SnapshotView<'a> {
    pub snap: &'a Snapshot,
    workloads: HashMap<&'a WorkloadId, &'a Workload>,
}

impl<'a> SnapshotView<'a> {
    pub fn new(snap: &'a Snapshot) -> Self {
        Self {
            snap,
            workloads: snap.workloads.iter().map(|w| (&w.id, w)).collect(),
        }
    }

    /// The snapshot's time in seconds on the monotonic clock: trends and holds go by it, so a
    /// wall-clock step bends no line.
    pub fn seconds(&self) -> f64 {
        self.snap.monotonic_ms as f64 / 1000.0
    }

    /// The GPUs whose readings can be read: not those that fell off the bus.
    pub fn readable_gpus(&self) -> impl Iterator<Item = &'a Gpu> {
        self.snap.gpus.iter().filter(|g| !g.device.lost)
    }

    /// Running workloads holding a GPU.
    pub fn gpu_holders(&self) -> impl Iterator<Item = &'a Workload> {
        self.snap
            .workloads
            .iter()
            .filter(|w| w.gpu.processes > 0 && !w.exited)
    }

    pub fn workload(&self, id: &WorkloadId) -> Option<&'a Workload> {
        self.workloads.get(id).copied()
    }

    /// Whether `id` names a workload of this snapshot.
    pub fn has_workload(&self, id: &WorkloadId) -> bool {
        self.workloads.contains_key(id)
    }

    /// A GPU as a subject: the GPU, and the container using the most memory on it.
    pub fn gpu_subject(&self, g: &Gpu) -> Subject {
        Subject {
            gpu: Some(GpuRef::of(g)),
            container: self.top_user(g),
            pid: None,
        }
    }

    /// A workload as a subject.
    pub fn workload_subject(w: &Workload) -> Subject {
        Subject {
            gpu: None,
            container: Some(ContainerRef::of(w)),
            pid: None,
        }
    }

    /// The container using the most memory on `g`, to name in GPU-level alerts.
    fn top_user(&self, g: &Gpu) -> Option<ContainerRef> {
        let mut by: HashMap<&WorkloadId, u64> = HashMap::new();
        for p in &g.processes {
            if let Some(w) = &p.workload {
                *by.entry(w).or_default() += p.reading.used_memory_bytes.unwrap_or(0);
            }
        }
        let (id, _) = by.into_iter().max_by_key(|(_, m)| *m)?;
        self.workload(id).map(ContainerRef::of)
    }
}

/// A GPU's key across rounds: its UUID, else its index.
pub fn gpu_key(g: &Gpu) -> String {
    g.device
        .uuid
        .clone()
        .unwrap_or_else(|| format!("index-{}", g.device.index))
}

pub(crate) use crate::units::MIB_F64 as MIB;

/// `v` as a percentage, 0–100, or the error naming `field`.
pub fn percent(field: &str, v: f64) -> Result<(), crate::field_error::FieldError> {
    if (0.0..=100.0).contains(&v) {
        Ok(())
    } else {
        Err(crate::field_error::FieldError::new(
            field,
            format!("{v} is not a percentage (0–100)"),
        ))
    }
}
