//! `launch_gpus`: which GPUs the launch that `doctor` gates will use — `doctor --gpu 0,1`, else
//! `CUDA_VISIBLE_DEVICES`, else `NVIDIA_VISIBLE_DEVICES` in doctor's own environment (as
//! `gpuwatch doctor && python train.py` passes it on). The per-GPU checks then look at those
//! GPUs only, and the per-container checks at the containers holding them: on a shared host,
//! another team's busy GPU or small `/dev/shm` does not hold a launch on a free GPU.
//! Indices are NVML's (PCI bus order); CUDA numbers GPUs fastest first unless
//! `CUDA_DEVICE_ORDER=PCI_BUS_ID`, which on a host of identical GPUs is the same order. UUIDs
//! are unambiguous.
use crate::health::check::{Checks, Status};
use crate::model::{parse_visible_devices, ClaimedDevices, Gpu};
use std::collections::BTreeSet;

pub const NAME: &str = "launch_gpus";

/// The GPUs a launch will use, as declared.
#[derive(Clone, Debug, PartialEq)]
pub struct LaunchGpus {
    /// Where it came from, as the user wrote it (`--gpu 0,1`, `CUDA_VISIBLE_DEVICES=1`).
    pub declared: String,
    pub devices: ClaimedDevices,
}

impl LaunchGpus {
    /// From `--gpu`, else the environment variables CUDA reads, first set first; `None` when
    /// nothing is declared (every GPU is checked).
    pub fn declared(arg: Option<&str>, env: impl Fn(&str) -> Option<String>) -> Option<Self> {
        if let Some(a) = arg {
            return Some(Self {
                declared: format!("--gpu {a}"),
                devices: parse_visible_devices(a),
            });
        }
        ["CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"]
            .into_iter()
            .find_map(|var| {
                let v = env(var)?;
                Some(Self {
                    declared: format!("{var}={v}"),
                    devices: parse_visible_devices(&v),
                })
            })
    }

    /// The NVML indices of the GPUs it names among `gpus`, and what names none.
    pub fn resolve(&self, gpus: &[Gpu]) -> (BTreeSet<u32>, Vec<String>) {
        self.devices.resolve(gpus)
    }
}

/// The row saying which GPUs were checked: a risk when an entry names no GPU (the launch would
/// fail or run elsewhere), a warning when it names none at all.
pub fn examine(launch: &LaunchGpus, gpus: &[Gpu], out: &mut Checks) {
    let (found, missing) = launch.resolve(gpus);
    let listed: Vec<String> = found.iter().map(|i| format!("GPU {i}")).collect();
    let (status, action) = if !missing.is_empty() {
        (
            Status::Risk,
            format!(
                "{} names a GPU this host does not have ({}): list GPUs by an index or UUID that \
                 `nvidia-smi -L` shows.",
                launch.declared,
                missing.join("; ")
            ),
        )
    } else if found.is_empty() {
        (
            Status::Warning,
            format!(
                "{} gives the launch no GPU: it will run on the CPU.",
                launch.declared
            ),
        )
    } else {
        (Status::Ok, String::new())
    };
    out.add(
        NAME,
        "host",
        status,
        format!(
            "{} ({})",
            if listed.is_empty() {
                "no GPU".to_owned()
            } else {
                listed.join(", ")
            },
            launch.declared
        ),
        "every entry names a GPU of this host",
        &action,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::gpu;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn the_argument_then_cuda_then_nvidia_variables() {
        let both = [
            ("CUDA_VISIBLE_DEVICES", "1"),
            ("NVIDIA_VISIBLE_DEVICES", "0"),
        ];
        assert_eq!(
            LaunchGpus::declared(Some("0,1"), env(&both))
                .unwrap()
                .declared,
            "--gpu 0,1"
        );
        assert_eq!(
            LaunchGpus::declared(None, env(&both)).unwrap().declared,
            "CUDA_VISIBLE_DEVICES=1"
        );
        assert_eq!(
            LaunchGpus::declared(None, env(&both[1..]))
                .unwrap()
                .declared,
            "NVIDIA_VISIBLE_DEVICES=0"
        );
        assert_eq!(LaunchGpus::declared(None, env(&[])), None);
    }

    #[test]
    fn resolves_indices_and_uuids_and_names_what_is_missing() {
        let mut g1 = gpu(1);
        g1.device.uuid = Some("GPU-aaaa".into());
        let gpus = [gpu(0), g1];
        let launch = LaunchGpus::declared(Some("GPU-AAAA,7"), env(&[])).unwrap();
        let (found, missing) = launch.resolve(&gpus);
        assert_eq!(found, BTreeSet::from([1]));
        assert_eq!(missing.len(), 1);
        assert!(
            missing[0].contains("no such GPU among the 2"),
            "{missing:?}"
        );
        let mut out = Checks::default();
        examine(&launch, &gpus, &mut out);
        assert_eq!(out.0[0].status, Status::Risk);
        assert_eq!(out.0[0].value, "GPU 1 (--gpu GPU-AAAA,7)");
        let mut out = Checks::default();
        examine(
            &LaunchGpus::declared(None, env(&[("CUDA_VISIBLE_DEVICES", "")])).unwrap(),
            &gpus,
            &mut out,
        );
        assert_eq!(out.0[0].status, Status::Warning);
        let mut out = Checks::default();
        examine(
            &LaunchGpus::declared(Some("0"), env(&[])).unwrap(),
            &gpus,
            &mut out,
        );
        assert_eq!(out.0[0].status, Status::Ok);
    }
}
