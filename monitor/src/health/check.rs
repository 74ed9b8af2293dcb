//! What a doctor check is: a condition looked at over a window of snapshots (start values,
//! peaks, trends), with a status per subject — ok, warning or risk — the measured value, the
//! threshold and what to do. Which checks exist is the registry's ([`super::doctor`]).
use super::doctor_config::DoctorConfig;
use crate::model::{Gpu, Snapshot, Workload};
use serde::Serialize;
use std::collections::BTreeSet;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Warning,
    Risk,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Warning => "warning",
            Self::Risk => "risk",
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `ok` up to `ok`, `warning` up to `risk`, `risk` above.
pub fn level<T: PartialOrd>(v: T, ok: T, risk: T) -> Status {
    if v <= ok {
        Status::Ok
    } else if v <= risk {
        Status::Warning
    } else {
        Status::Risk
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Check {
    pub check: &'static str,
    /// `GPU 0`, a container name, `host`.
    pub subject: String,
    pub status: Status,
    pub value: String,
    pub threshold: String,
    /// What to do; empty when all is well.
    pub action: String,
}

/// A doctor check: appends its findings over `window` to `out`.
pub type Examine = fn(window: &Window<'_>, out: &mut Checks);

/// The checks found so far.
#[derive(Debug, Default)]
pub struct Checks(pub Vec<Check>);

impl Checks {
    /// Adds a check; an `ok` one carries no action.
    pub fn add(
        &mut self,
        check: &'static str,
        subject: impl Into<String>,
        status: Status,
        value: impl Into<String>,
        threshold: impl Into<String>,
        action: &str,
    ) {
        self.0.push(Check {
            check,
            subject: subject.into(),
            status,
            value: value.into(),
            threshold: threshold.into(),
            action: if status == Status::Ok {
                String::new()
            } else {
                action.to_owned()
            },
        });
    }
}

/// The snapshots of one doctor run, oldest first (at least one), and its thresholds.
pub struct Window<'a> {
    pub snaps: &'a [Snapshot],
    last: &'a Snapshot,
    pub config: &'a DoctorConfig,
    /// The GPUs the launch will use; `None`: all of them.
    launch: Option<BTreeSet<u32>>,
}

impl<'a> Window<'a> {
    /// `None` without snapshots.
    pub fn new(snaps: &'a [Snapshot], config: &'a DoctorConfig) -> Option<Self> {
        Some(Self {
            snaps,
            last: snaps.last()?,
            config,
            launch: None,
        })
    }

    /// The per-GPU checks look at these GPUs only, the per-container ones at the workloads
    /// holding one of them.
    pub fn for_launch_on(mut self, gpus: BTreeSet<u32>) -> Self {
        self.launch = Some(gpus);
        self
    }

    /// The latest snapshot.
    pub fn last(&self) -> &'a Snapshot {
        self.last
    }

    /// The GPUs of the latest snapshot the launch will use (all without a selection).
    pub fn gpus(&self) -> impl Iterator<Item = &'a Gpu> + '_ {
        self.last().gpus.iter().filter(|g| {
            self.launch
                .as_ref()
                .is_none_or(|l| l.contains(&g.device.index))
        })
    }

    /// Those of them whose readings can be read (not lost).
    pub fn readable_gpus(&self) -> impl Iterator<Item = &'a Gpu> + '_ {
        self.gpus().filter(|g| !g.device.lost)
    }

    /// The workloads of `snap` the checks look at: with a launch's GPUs, those holding one of
    /// them (a container on another GPU is another tenant's, not this launch's); else all.
    pub fn workloads(&self, snap: &'a Snapshot) -> impl Iterator<Item = &'a Workload> + '_ {
        snap.workloads.iter().filter(|w| {
            self.launch
                .as_ref()
                .is_none_or(|l| w.gpu.per_gpu.iter().any(|s| l.contains(&s.index)))
        })
    }

    /// GPU `index` in every snapshot that has it, oldest first.
    pub fn series(&self, index: u32) -> impl Iterator<Item = &'a Gpu> {
        self.snaps
            .iter()
            .filter_map(move |s| s.gpus.iter().find(|g| g.device.index == index))
    }
}

/// A GPU as a doctor subject.
pub fn gpu_subject(g: &Gpu) -> String {
    format!("GPU {}", g.device.index)
}
