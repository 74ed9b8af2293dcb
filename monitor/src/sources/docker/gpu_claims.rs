//! The GPUs a container's inspect response declares, in each of the three ways Docker hosts
//! give them: `--gpus` (device requests), `--device /dev/nvidiaN`, and `NVIDIA_VISIBLE_DEVICES`.
use crate::model::{
    parse_visible_devices, ClaimVia, ClaimedDevices, DeviceRef, GpuClaim, GpuDeviceRequest,
};
use bollard::models::DeviceMapping;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

/// The character-device major of NVIDIA GPUs (`/dev/nvidia0` is 195:0; `nvidiactl` 195:255 and
/// `nvidia-modeset` 195:254 are not GPUs).
const NVIDIA_MAJOR: u64 = 195;
const NVIDIA_CONTROL_MINORS: u64 = 254;

/// Every GPU claim of one container.
pub fn gpu_claims(
    requests: &[GpuDeviceRequest],
    devices: &[DeviceMapping],
    env: &[String],
    runtime: Option<&str>,
) -> Vec<GpuClaim> {
    let mut claims: Vec<GpuClaim> = requests.iter().map(from_request).collect();
    if let Some(nodes) = from_device_nodes(devices) {
        claims.push(nodes);
    }
    let value = env
        .iter()
        .rev() // the last assignment wins, as in the process environment
        .find_map(|e| e.strip_prefix("NVIDIA_VISIBLE_DEVICES="));
    if let Some(value) = value {
        let note = if !requests.is_empty() {
            Some("--gpus sets NVIDIA_VISIBLE_DEVICES itself and overrides this value".to_owned())
        } else if !runtime.is_some_and(|r| r.contains("nvidia")) {
            Some(format!(
                "the container runs under {}, and only the NVIDIA runtime reads this variable",
                runtime.unwrap_or("the default runtime")
            ))
        } else {
            None
        };
        claims.push(GpuClaim {
            via: ClaimVia::VisibleDevicesEnv,
            declared: format!("NVIDIA_VISIBLE_DEVICES={value}"),
            devices: parse_visible_devices(value),
            applied: note.is_none(),
            note,
        });
    }
    claims
}

/// `--gpus all` is count -1; `--gpus 2` is count 2, which Docker turns into indices 0 and 1;
/// `--gpus device=GPU-…,1` lists ids.
fn from_request(r: &GpuDeviceRequest) -> GpuClaim {
    let (declared, devices) = match (r.count, r.device_ids.as_slice()) {
        (_, ids) if !ids.is_empty() => {
            let joined = ids.join(",");
            (
                format!("--gpus device={joined}"),
                parse_visible_devices(&joined),
            )
        }
        (Some(-1), _) => ("--gpus all".to_owned(), ClaimedDevices::All),
        (Some(n), _) if n > 0 => (
            format!("--gpus {n}"),
            ClaimedDevices::List((0..n as u32).map(DeviceRef::Index).collect()),
        ),
        (count, _) => (
            format!("--gpus (count {count:?}, no device ids)"),
            ClaimedDevices::Void,
        ),
    };
    GpuClaim {
        via: ClaimVia::DockerGpus,
        declared,
        devices,
        applied: true,
        note: None,
    }
}

/// The `--device` mappings of NVIDIA GPU nodes, by the host node's minor number (or, where the
/// host path cannot be read, the `/dev/nvidiaN` name it is mapped to).
fn from_device_nodes(devices: &[DeviceMapping]) -> Option<GpuClaim> {
    let mut minors = Vec::new();
    let mut declared = Vec::new();
    for d in devices {
        let host = d.path_on_host.as_deref().unwrap_or_default();
        let inside = d.path_in_container.as_deref().unwrap_or(host);
        let minor = node_minor(Path::new(host)).or_else(|| gpu_node_name_minor(inside));
        if let Some(m) = minor {
            minors.push(DeviceRef::Minor(m));
            declared.push(if host == inside {
                format!("--device {host}")
            } else {
                format!("--device {host}:{inside}")
            });
        }
    }
    (!minors.is_empty()).then(|| GpuClaim {
        via: ClaimVia::DeviceNodes,
        declared: declared.join(" "),
        devices: ClaimedDevices::List(minors),
        applied: true,
        note: None,
    })
}

/// The minor number of an NVIDIA GPU character device at `path`.
fn node_minor(path: &Path) -> Option<u32> {
    let meta = std::fs::metadata(path).ok()?;
    if !meta.file_type().is_char_device() {
        return None;
    }
    let dev = meta.rdev();
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    (major == NVIDIA_MAJOR && minor < NVIDIA_CONTROL_MINORS).then_some(minor as u32)
}

/// `N` of a `/dev/nvidiaN` path.
fn gpu_node_name_minor(path: &str) -> Option<u32> {
    path.strip_prefix("/dev/nvidia")?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(count: Option<i64>, ids: &[&str]) -> GpuDeviceRequest {
        GpuDeviceRequest {
            driver: Some("nvidia".into()),
            count,
            device_ids: ids.iter().map(|s| s.to_string()).collect(),
            capabilities: vec![vec!["gpu".into()]],
        }
    }

    fn mapping(host: &str, inside: &str) -> DeviceMapping {
        DeviceMapping {
            path_on_host: Some(host.into()),
            path_in_container: Some(inside.into()),
            cgroup_permissions: Some("rwm".into()),
        }
    }

    #[test]
    fn every_device_request_form() {
        let all = gpu_claims(&[request(Some(-1), &[])], &[], &[], Some("runc"));
        assert_eq!(all[0].devices, ClaimedDevices::All);
        assert_eq!(all[0].declared, "--gpus all");
        let two = gpu_claims(&[request(Some(2), &[])], &[], &[], Some("runc"));
        assert_eq!(
            two[0].devices,
            ClaimedDevices::List(vec![DeviceRef::Index(0), DeviceRef::Index(1)])
        );
        let ids = gpu_claims(&[request(None, &["GPU-abc123", "1"])], &[], &[], None);
        assert_eq!(
            ids[0].devices,
            ClaimedDevices::List(vec![
                DeviceRef::Uuid("GPU-abc123".into()),
                DeviceRef::Index(1)
            ])
        );
        assert!(ids
            .iter()
            .all(|c| c.applied && c.via == ClaimVia::DockerGpus));
    }

    #[test]
    fn the_variable_applies_only_under_the_nvidia_runtime_and_without_gpus() {
        let env = vec![
            "PATH=/bin".to_owned(),
            "NVIDIA_VISIBLE_DEVICES=0,1".to_owned(),
        ];
        let nvidia = gpu_claims(&[], &[], &env, Some("nvidia"));
        assert!(nvidia[0].applied, "{nvidia:?}");
        assert_eq!(nvidia[0].declared, "NVIDIA_VISIBLE_DEVICES=0,1");
        let runc = gpu_claims(&[], &[], &env, Some("runc"));
        assert!(!runc[0].applied);
        assert!(runc[0].note.as_deref().unwrap().contains("runc"));
        let beside = gpu_claims(&[request(Some(-1), &[])], &[], &env, Some("nvidia"));
        assert_eq!(beside.len(), 2);
        assert!(!beside[1].applied, "{beside:?}");
        let garbage = gpu_claims(&[], &[], &["NVIDIA_VISIBLE_DEVICES=gpu0".into()], None);
        assert!(matches!(
            garbage[0].devices,
            ClaimedDevices::Unparsed { .. }
        ));
    }

    #[test]
    fn device_nodes_by_name_when_the_host_node_is_not_a_gpu_node() {
        let claims = gpu_claims(
            &[],
            &[
                mapping("/nonexistent/nvidia3", "/dev/nvidia3"),
                mapping("/dev/nvidiactl", "/dev/nvidiactl"),
                mapping("/dev/null", "/dev/null"),
            ],
            &[],
            None,
        );
        assert_eq!(claims.len(), 1, "{claims:?}");
        assert_eq!(
            claims[0].devices,
            ClaimedDevices::List(vec![DeviceRef::Minor(3)])
        );
        assert_eq!(
            claims[0].declared,
            "--device /nonexistent/nvidia3:/dev/nvidia3"
        );
    }
}
