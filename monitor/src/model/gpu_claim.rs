//! The GPUs a container was given, as its configuration declares them: `docker run --gpus`
//! (`HostConfig.DeviceRequests`), `--device /dev/nvidiaN` (`HostConfig.Devices`), or the
//! `NVIDIA_VISIBLE_DEVICES` variable the NVIDIA container runtime reads.
use serde::Serialize;
use std::collections::BTreeSet;
use std::fmt;

/// How a claim was declared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ClaimVia {
    /// `docker run --gpus` (a device request for the `nvidia` driver or the `gpu` capability).
    DockerGpus,
    /// `docker run --device` of NVIDIA GPU nodes (character major 195).
    DeviceNodes,
    /// `NVIDIA_VISIBLE_DEVICES` in the container's environment.
    VisibleDevicesEnv,
}

/// One device in a claim.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceRef {
    /// A GPU by NVML index (`0`).
    Index(u32),
    /// A GPU by UUID (`GPU-…`).
    Uuid(String),
    /// A MIG instance by `<GPU index>:<MIG index>` (`0:1`).
    MigIndex(u32, u32),
    /// A MIG instance by UUID (`MIG-…`, or the older `MIG-GPU-<uuid>/<gi>/<ci>`).
    MigUuid(String),
    /// A GPU by the minor number of its `/dev/nvidiaN` node.
    Minor(u32),
}

impl fmt::Display for DeviceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Index(i) => write!(f, "{i}"),
            Self::Uuid(u) | Self::MigUuid(u) => f.write_str(u),
            Self::MigIndex(g, m) => write!(f, "{g}:{m}"),
            Self::Minor(m) => write!(f, "/dev/nvidia{m}"),
        }
    }
}

/// What a claim asks for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "devices")]
pub enum ClaimedDevices {
    /// Every GPU of the host (`all`, `--gpus all`).
    All,
    /// No GPU, but the driver's libraries and tools (`none`).
    None,
    /// Nothing at all, as if the variable were unset (`void`, or empty).
    Void,
    List(Vec<DeviceRef>),
    /// The declaration could not be read: the text and why.
    Unparsed {
        text: String,
        reason: String,
    },
}

/// One declaration of GPUs for a container.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GpuClaim {
    pub via: ClaimVia,
    /// The declaration as written (`--gpus all`, `NVIDIA_VISIBLE_DEVICES=0,1`, ...).
    pub declared: String,
    pub devices: ClaimedDevices,
    /// Whether the declaration gives the container GPUs: `NVIDIA_VISIBLE_DEVICES` does only
    /// under the NVIDIA runtime, and not beside `--gpus` (which sets it itself).
    pub applied: bool,
    /// Why a claim is not applied.
    pub note: Option<String>,
}

/// Reads an `NVIDIA_VISIBLE_DEVICES` value: `all`, `none`, `void`, empty, or a comma-separated
/// list of indices, UUIDs, `<gpu>:<mig>` pairs and MIG UUIDs. Anything else is
/// [`ClaimedDevices::Unparsed`], with the offending entry named.
impl ClaimedDevices {
    /// The NVML indices of the GPUs it names among `gpus`, and what names none.
    pub fn resolve(&self, gpus: &[super::Gpu]) -> (BTreeSet<u32>, Vec<String>) {
        match self {
            Self::All => (gpus.iter().map(|g| g.device.index).collect(), Vec::new()),
            Self::None | Self::Void => (BTreeSet::new(), Vec::new()),
            Self::Unparsed { reason, .. } => (BTreeSet::new(), vec![reason.clone()]),
            Self::List(refs) => {
                let mut found = BTreeSet::new();
                let mut missing = Vec::new();
                for r in refs {
                    match r.find(gpus) {
                        Ok(i) => {
                            found.insert(i);
                        }
                        Err(why) => missing.push(format!("{r}: {why}")),
                    }
                }
                (found, missing)
            }
        }
    }
}

impl DeviceRef {
    /// The NVML index of the GPU this names among `gpus`, or why none.
    pub fn find(&self, gpus: &[super::Gpu]) -> Result<u32, NoSuchGpu> {
        let by =
            |f: &dyn Fn(&super::Gpu) -> bool| gpus.iter().find(|g| f(g)).map(|g| g.device.index);
        let found = match self {
            DeviceRef::Index(i) => by(&|g| g.device.index == *i),
            DeviceRef::Uuid(u) => by(&|g| {
                g.device
                    .uuid
                    .as_deref()
                    .is_some_and(|v| v.eq_ignore_ascii_case(u))
            }),
            DeviceRef::Minor(m) => by(&|g| g.device.minor_number == Some(*m)),
            DeviceRef::MigIndex(..) | DeviceRef::MigUuid(_) => return Err(NoSuchGpu::Mig),
        };
        found.ok_or(match gpus.len() {
            0 => NoSuchGpu::NoneListed,
            n => NoSuchGpu::NotAmong(n),
        })
    }
}

/// Why a reference names no GPU of this host.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NoSuchGpu {
    #[error("a MIG instance (gpuwatch does not enumerate MIG instances)")]
    Mig,
    #[error("NVML lists no GPU")]
    NoneListed,
    #[error("no such GPU among the {0} NVML lists")]
    NotAmong(usize),
}

pub fn parse_visible_devices(text: &str) -> ClaimedDevices {
    let t = text.trim();
    match t.to_ascii_lowercase().as_str() {
        "all" => return ClaimedDevices::All,
        "none" => return ClaimedDevices::None,
        "void" | "" => return ClaimedDevices::Void,
        _ => {}
    }
    let mut out = Vec::new();
    for (n, entry) in t.split(',').map(str::trim).enumerate() {
        match parse_entry(entry) {
            Some(r) => out.push(r),
            None => {
                return ClaimedDevices::Unparsed {
                    text: text.to_owned(),
                    reason: format!(
                        "entry {} ({entry:?}) is not a GPU index, a GPU-/MIG- UUID or <gpu>:<mig>",
                        n + 1
                    ),
                }
            }
        }
    }
    ClaimedDevices::List(out)
}

fn parse_entry(e: &str) -> Option<DeviceRef> {
    let is_uuid_body =
        |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_hexdigit() || "-/".contains(c));
    if let Ok(i) = e.parse::<u32>() {
        return Some(DeviceRef::Index(i));
    }
    if let Some((g, m)) = e.split_once(':') {
        return Some(DeviceRef::MigIndex(g.parse().ok()?, m.parse().ok()?));
    }
    if let Some(body) = e.strip_prefix("MIG-") {
        let body = body.strip_prefix("GPU-").unwrap_or(body);
        return is_uuid_body(body).then(|| DeviceRef::MigUuid(e.to_owned()));
    }
    let body = e.strip_prefix("GPU-")?;
    (is_uuid_body(body) && !body.contains('/')).then(|| DeviceRef::Uuid(e.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ClaimedDevices as C;
    use DeviceRef as D;

    #[test]
    fn every_form_of_the_variable() {
        assert_eq!(parse_visible_devices("all"), C::All);
        assert_eq!(parse_visible_devices(" ALL "), C::All);
        assert_eq!(parse_visible_devices("none"), C::None);
        assert_eq!(parse_visible_devices("void"), C::Void);
        assert_eq!(parse_visible_devices(""), C::Void);
        assert_eq!(
            parse_visible_devices("0,1, 3"),
            C::List(vec![D::Index(0), D::Index(1), D::Index(3)])
        );
        let uuid = "GPU-5a1b0c3e-8f7d-4c2a-9e6b-1d2c3b4a5f60";
        assert_eq!(
            parse_visible_devices(uuid),
            C::List(vec![D::Uuid(uuid.into())])
        );
        assert_eq!(
            parse_visible_devices("0:1,MIG-4b1c2d3e-0000-1111-2222-333344445555"),
            C::List(vec![
                D::MigIndex(0, 1),
                D::MigUuid("MIG-4b1c2d3e-0000-1111-2222-333344445555".into())
            ])
        );
        let old = "MIG-GPU-5a1b0c3e-8f7d-4c2a-9e6b-1d2c3b4a5f60/1/0";
        assert_eq!(
            parse_visible_devices(old),
            C::List(vec![D::MigUuid(old.into())])
        );
    }

    #[test]
    fn garbage_is_unparsed_with_the_entry_named() {
        for (text, entry) in [
            ("0,gpu1", "entry 2 (\"gpu1\")"),
            ("GPU-xyz", "entry 1 (\"GPU-xyz\")"),
            ("0,,1", "entry 2 (\"\")"),
            ("-1", "entry 1"),
            ("0:x", "entry 1"),
            ("GPU-ab/1", "entry 1"),
            ("\u{1b}[31m", "entry 1"),
        ] {
            match parse_visible_devices(text) {
                C::Unparsed { text: t, reason } => {
                    assert_eq!(t, text);
                    assert!(reason.contains(entry), "{text:?}: {reason}");
                }
                other => panic!("{text:?} parsed as {other:?}"),
            }
        }
    }
}
