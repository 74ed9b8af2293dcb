//! `nvml`, `docker`, `stall_tracing`: a source that is down (not one turned off on purpose with
//! `--no-nvml`, `--no-docker`, `--no-ebpf`). Without NVML no GPU can be checked: a risk; the
//! others are warnings. Doctor.
use crate::health::check::{Checks, Status, Window};
use crate::model::SourceState;

pub const NVML: &str = "nvml";
pub const DOCKER: &str = "docker";
pub const STALL_TRACING: &str = "stall_tracing";

pub fn examine(window: &Window<'_>, out: &mut Checks) {
    let sources = &window.last().sources;
    // A source turned off on purpose is no finding.
    let down = |s: &SourceState| !s.up && !s.is_disabled();
    let detail = |s: &SourceState| s.detail().unwrap_or_else(|| "down".into());
    if down(&sources.nvml) {
        out.add(
            NVML,
            "host",
            Status::Risk,
            detail(&sources.nvml),
            "NVML loads",
            "No GPU can be checked: install or load the NVIDIA driver (libnvidia-ml.so.1).",
        );
    }
    if down(&sources.docker) {
        out.add(
            DOCKER,
            "host",
            Status::Warning,
            detail(&sources.docker),
            "up",
            "Containers are named by cgroup only: check that dockerd runs and the socket is \
             readable.",
        );
    }
    if down(&sources.ebpf) {
        out.add(
            STALL_TRACING,
            "host",
            Status::Warning,
            detail(&sources.ebpf),
            "up",
            "Loader stalls cannot be traced (verdicts fall back to GPU-side evidence): run as \
             root or with CAP_BPF and CAP_PERFMON.",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::conditions::testing::doctor_checks;
    use crate::model::test_support::snapshot;

    #[test]
    fn a_source_down_is_named_and_one_turned_off_is_not() {
        let mut s = snapshot(0, vec![], vec![]);
        assert!(doctor_checks(examine, &[s.clone()]).0.is_empty());
        s.sources.nvml = SourceState::disabled("disabled");
        s.sources.docker = SourceState::down("connecting to /var/run/docker.sock: refused");
        s.sources.ebpf = SourceState::down("CAP_BPF missing");
        let checks = doctor_checks(examine, &[s.clone()]).0;
        let named: Vec<_> = checks.iter().map(|c| (c.check, c.status)).collect();
        assert_eq!(
            named,
            [(DOCKER, Status::Warning), (STALL_TRACING, Status::Warning)]
        );
        assert_eq!(
            checks[0].value,
            "connecting to /var/run/docker.sock: refused"
        );
        s.sources.nvml = SourceState::down("libnvidia-ml.so.1: not found");
        assert_eq!(doctor_checks(examine, &[s]).0[0].status, Status::Risk);
    }
}
