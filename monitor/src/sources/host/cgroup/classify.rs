//! Turns a cgroup path into a workload identity.
//!
//! The classifier is pure (a path in, an identity out) so every runtime's and driver's path shape
//! is unit-tested without that runtime. Shapes covered:
//!
//! | runtime / driver            | path                                                                  |
//! |-----------------------------|-----------------------------------------------------------------------|
//! | Docker, cgroupfs            | `/docker/<64hex>`                                                     |
//! | Docker, systemd             | `/system.slice/docker-<64hex>.scope`                                  |
//! | Podman, systemd (root/user) | `…/libpod-<64hex>.scope` (`…/libpod-<id>.scope/container` on v2)      |
//! | Podman, cgroupfs            | `/libpod_parent/libpod-<64hex>`                                       |
//! | Kubernetes, cgroupfs        | `/kubepods/<qos>/pod<uid>/<64hex>`                                    |
//! | Kubernetes, systemd         | `/kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid_>.slice/cri-containerd-<64hex>.scope` (also `crio-`, `docker-`) |
//! | systemd service             | `…/<name>.service` (the innermost `.service` unit)                     |
//! | login session, init, root   | host                                                                  |
//! | anything else               | a workload of its own, named by its path (Slurm, hand-made cgroups)   |
use crate::model::{WorkloadId, WorkloadKind};

fn is_container_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Strips `prefix` and `suffix` from `segment` and returns the middle if it is a container id.
fn container_id_in<'a>(segment: &'a str, prefix: &str, suffix: &str) -> Option<&'a str> {
    segment
        .strip_prefix(prefix)?
        .strip_suffix(suffix)
        .filter(|id| is_container_id(id))
}

/// Container-runtime scope prefixes used by the systemd cgroup driver.
const SYSTEMD_SCOPE_RUNTIMES: [(&str, WorkloadKind); 4] = [
    ("docker-", WorkloadKind::Docker),
    ("libpod-", WorkloadKind::Podman),
    ("cri-containerd-", WorkloadKind::Kubernetes),
    ("crio-", WorkloadKind::Kubernetes),
];

/// Classifies a cgroup path (as found in `/proc/<pid>/cgroup`, relative to the hierarchy root).
/// A path that was not UTF-8 (`bytes:` and escapes, see `membership::path_text`) is classified
/// by its escaped form, and a `cgroup` workload of it keeps the `bytes:` mark, so it is never
/// taken for a cgroup whose real name is that text.
pub fn classify(path: &str) -> WorkloadId {
    if let Some(escaped) = path.strip_prefix(super::membership::NOT_UTF8) {
        let id = classify_text(escaped);
        return match id.kind {
            WorkloadKind::Cgroup => WorkloadId::new(
                WorkloadKind::Cgroup,
                format!("{}{}", super::membership::NOT_UTF8, id.id),
            ),
            _ => id,
        };
    }
    classify_text(path)
}

fn classify_text(path: &str) -> WorkloadId {
    let path = path.trim();
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    if segments.is_empty() {
        return WorkloadId::host();
    }
    if let Some(id) = classify_kubernetes(&segments) {
        return id;
    }
    // The outermost container wins: a container nested in another (Docker-in-Docker) belongs to
    // the outer one as far as this host is concerned.
    for (i, seg) in segments.iter().enumerate() {
        let parent = i.checked_sub(1).map(|p| segments[p]);
        // Docker cgroupfs driver: /docker/<id>, at the top of the hierarchy where dockerd makes
        // it (deeper, it is a directory anyone with a delegated cgroup could have named).
        if i == 1 && parent == Some("docker") && is_container_id(seg) {
            return WorkloadId::new(WorkloadKind::Docker, *seg);
        }
        // Podman cgroupfs driver: /libpod_parent/libpod-<id>
        if let Some(id) = container_id_in(seg, "libpod-", "") {
            return WorkloadId::new(WorkloadKind::Podman, id);
        }
        for (prefix, kind) in SYSTEMD_SCOPE_RUNTIMES {
            if let Some(id) = container_id_in(seg, prefix, ".scope") {
                return WorkloadId::new(kind, id);
            }
        }
    }
    // Login sessions (which logind makes under user.slice/user-<uid>.slice) and init are the
    // host; a session-looking scope elsewhere is someone's own cgroup.
    let last = segments[segments.len() - 1];
    let session = segments[0] == "user.slice"
        && segments.len() >= 3
        && segments[1].starts_with("user-")
        && segments[2].starts_with("session-")
        && segments[2].ends_with(".scope");
    if segments[0] == "init.scope" || session {
        return WorkloadId::host();
    }
    // The innermost systemd service (user services under user@UID.service count as their own).
    if let Some(unit) = segments
        .iter()
        .rev()
        .find(|s| s.ends_with(".service") && !s.starts_with("user@"))
    {
        return WorkloadId::new(WorkloadKind::Systemd, *unit);
    }
    if segments.len() == 1 && last.ends_with(".slice") {
        // A process sitting directly in a top-level slice (user.slice, system.slice).
        return WorkloadId::host();
    }
    WorkloadId::new(WorkloadKind::Cgroup, format!("/{}", segments.join("/")))
}

/// Kubernetes pods, both drivers; the pod uid is normalised to its dashed form.
fn classify_kubernetes(segments: &[&str]) -> Option<WorkloadId> {
    // `kubepods`, `kubepods.slice`, `kubepods-burstable.slice`, `kubelet-kubepods.slice`, ...:
    // the kubelet's root is at the top of the hierarchy, or in one top-level slice
    // (`kubelet.slice/kubelet-kubepods.slice`); deeper, it is someone's own directory.
    let kube = segments.iter().position(|s| s.contains("kubepods"))?;
    if kube > 1 || (kube == 1 && !segments[0].ends_with(".slice")) {
        return None;
    }
    let rest = &segments[kube..];
    let (pod_index, pod_uid) = rest.iter().enumerate().find_map(|(i, s)| {
        // cgroupfs: pod<uid>; systemd: kubepods-<qos>-pod<uid_with_underscores>.slice
        let s = s.strip_suffix(".slice").unwrap_or(s);
        let at = s.rfind("pod")?;
        let uid = &s[at + 3..];
        (uid.len() >= 32
            && uid
                .bytes()
                .all(|b| b.is_ascii_hexdigit() || b == b'-' || b == b'_'))
        .then(|| (i, uid.replace('_', "-")))
    })?;
    let container = rest.get(pod_index + 1).and_then(|s| {
        if is_container_id(s) {
            return Some(*s);
        }
        SYSTEMD_SCOPE_RUNTIMES
            .iter()
            .find_map(|(prefix, _)| container_id_in(s, prefix, ".scope"))
    });
    Some(match container {
        Some(c) => WorkloadId::new(WorkloadKind::Kubernetes, format!("{pod_uid}/{c}")),
        None => WorkloadId::new(WorkloadKind::Kubernetes, pod_uid),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f6d9a0b1c2e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f90";
    const ID2: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

    #[test]
    fn a_path_that_was_not_utf8_keeps_its_mark_and_its_container() {
        let escaped = r"bytes:/rt-bin\xff\xfe";
        assert_eq!(classify(escaped), id(WorkloadKind::Cgroup, escaped));
        // a directory whose real name is that text is another workload
        assert_eq!(
            classify(r"/bytes:/rt-bin\xff\xfe"),
            id(WorkloadKind::Cgroup, r"/bytes:/rt-bin\xff\xfe")
        );
        // under a container's own cgroup, the container still
        assert_eq!(
            classify(&format!(r"bytes:/docker/{ID}/job\xff")),
            id(WorkloadKind::Docker, ID)
        );
    }

    fn id(kind: WorkloadKind, id: &str) -> WorkloadId {
        WorkloadId::new(kind, id)
    }

    #[test]
    fn docker_cgroupfs_driver() {
        assert_eq!(
            classify(&format!("/docker/{ID}")),
            id(WorkloadKind::Docker, ID)
        );
        // v1 controllers show the same path; a nested cgroup inside the container still belongs to it.
        assert_eq!(
            classify(&format!("/docker/{ID}/sub")),
            id(WorkloadKind::Docker, ID)
        );
    }

    #[test]
    fn docker_systemd_driver() {
        let p = format!("/system.slice/docker-{ID}.scope");
        assert_eq!(classify(&p), id(WorkloadKind::Docker, ID));
    }

    #[test]
    fn docker_in_docker_is_the_outer_container() {
        let p = format!("/docker/{ID}/docker/{ID2}");
        assert_eq!(classify(&p), id(WorkloadKind::Docker, ID));
    }

    #[test]
    fn podman_shapes() {
        let rootful = format!("/machine.slice/libpod-{ID}.scope");
        assert_eq!(classify(&rootful), id(WorkloadKind::Podman, ID));
        let v2_inner = format!("/machine.slice/libpod-{ID}.scope/container");
        assert_eq!(classify(&v2_inner), id(WorkloadKind::Podman, ID));
        let rootless =
            format!("/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope");
        assert_eq!(classify(&rootless), id(WorkloadKind::Podman, ID));
        let cgroupfs = format!("/libpod_parent/libpod-{ID}");
        assert_eq!(classify(&cgroupfs), id(WorkloadKind::Podman, ID));
        // conmon is the runtime's monitor, not the container
        let conmon = format!("/machine.slice/libpod-conmon-{ID}.scope");
        assert_ne!(classify(&conmon).kind, WorkloadKind::Podman);
    }

    #[test]
    fn kubernetes_cgroupfs_driver() {
        let uid = "0a1b2c3d-4e5f-6789-abcd-ef0123456789";
        let p = format!("/kubepods/burstable/pod{uid}/{ID}");
        assert_eq!(
            classify(&p),
            id(WorkloadKind::Kubernetes, &format!("{uid}/{ID}"))
        );
        let guaranteed = format!("/kubepods/pod{uid}/{ID}");
        assert_eq!(
            classify(&guaranteed),
            id(WorkloadKind::Kubernetes, &format!("{uid}/{ID}"))
        );
        let pod_level = format!("/kubepods/besteffort/pod{uid}");
        assert_eq!(classify(&pod_level), id(WorkloadKind::Kubernetes, uid));
    }

    #[test]
    fn kubernetes_systemd_driver() {
        let uid = "0a1b2c3d-4e5f-6789-abcd-ef0123456789";
        let uscore = uid.replace('-', "_");
        for runtime in ["cri-containerd", "crio", "docker"] {
            let p = format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uscore}.slice/{runtime}-{ID}.scope"
            );
            assert_eq!(
                classify(&p),
                id(WorkloadKind::Kubernetes, &format!("{uid}/{ID}")),
                "{p}"
            );
        }
        let guaranteed =
            format!("/kubepods.slice/kubepods-pod{uscore}.slice/cri-containerd-{ID}.scope");
        assert_eq!(
            classify(&guaranteed),
            id(WorkloadKind::Kubernetes, &format!("{uid}/{ID}"))
        );
        // kubelet with a cgroup root (kind, k3s on v2)
        let nested = format!(
            "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{uscore}.slice/cri-containerd-{ID}.scope"
        );
        assert_eq!(
            classify(&nested),
            id(WorkloadKind::Kubernetes, &format!("{uid}/{ID}"))
        );
    }

    #[test]
    fn systemd_services() {
        assert_eq!(
            classify("/system.slice/nvidia-persistenced.service"),
            id(WorkloadKind::Systemd, "nvidia-persistenced.service")
        );
        assert_eq!(
            classify("/user.slice/user-1000.slice/user@1000.service/app.slice/trainer.service"),
            id(WorkloadKind::Systemd, "trainer.service")
        );
    }

    #[test]
    fn host_shapes() {
        for p in [
            "/",
            "",
            "/init.scope",
            "/user.slice/user-1000.slice/session-3.scope",
            "/user.slice",
            "/system.slice",
        ] {
            assert_eq!(classify(p), WorkloadId::host(), "{p:?}");
        }
    }

    /// Runtime shapes count only where the runtime makes them: a session scope outside
    /// user.slice, a kubepods tree below someone's cgroup, `docker/<id>` below the top are the
    /// directories of whoever made them.
    #[test]
    fn look_alike_shapes_in_the_wrong_place_are_their_own_cgroups() {
        for p in [
            "/tenant/session-1.scope".to_owned(),
            "/user.slice/user-1000.slice/user@1000.service/app.slice/session-9.scope".to_owned(),
            format!("/tenant/kubepods/besteffort/pod5d0f7f2e-1c2b-4c3d-9e8f-0a1b2c3d4e5f/{ID}"),
            format!("/tenant/docker/{ID}"),
        ] {
            let got = classify(&p);
            assert_eq!(got.kind, WorkloadKind::Cgroup, "{p}: {got}");
            assert_eq!(&*got.id, p.as_str());
        }
        // Where the kubelet puts them: the top, or one top-level slice.
        let pod = "pod5d0f7f2e-1c2b-4c3d-9e8f-0a1b2c3d4e5f";
        for p in [
            format!("/kubepods/besteffort/{pod}/{ID}"),
            format!("/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-{}.slice/cri-containerd-{ID}.scope", pod.replace('-', "_")),
        ] {
            assert_eq!(classify(&p).kind, WorkloadKind::Kubernetes, "{p}");
        }
    }

    #[test]
    fn other_cgroups_are_workloads_named_by_path() {
        assert_eq!(
            classify("/slurm/uid_1000/job_42/step_0"),
            id(WorkloadKind::Cgroup, "/slurm/uid_1000/job_42/step_0")
        );
        assert_eq!(
            classify("/gpuwatch-job"),
            id(WorkloadKind::Cgroup, "/gpuwatch-job")
        );
        // a short hex name under /docker is not a container id
        assert_eq!(
            classify("/docker/abc"),
            id(WorkloadKind::Cgroup, "/docker/abc")
        );
    }

    #[test]
    fn container_id_accessor() {
        assert_eq!(classify(&format!("/docker/{ID}")).container_id(), Some(ID));
        let uid = "0a1b2c3d-4e5f-6789-abcd-ef0123456789";
        let k = classify(&format!("/kubepods/pod{uid}/{ID}"));
        assert_eq!(k.container_id(), Some(ID));
        assert_eq!(WorkloadId::host().container_id(), None);
        assert_eq!(k.to_string(), format!("kubernetes:{uid}/{ID}"));
    }
}
