//! Contention: who else kept a workload's GPUs busy in the window. The GPU's busy share is one
//! measured quantity; the split (`sampler::busy_split`) divides it between the holders, so a
//! workload's part and the others' add up to the device's. When the others' parts take a good
//! share of the window, and more of it than the workload's own, its kernels wait their turn
//! behind theirs (the driver time-slices between processes): the verdict says so, with their
//! names and parts, instead of calling the wait the host's or nobody's.
use crate::model::{Contention, Gpu, IdleGpu, OtherHolder, SplitMethod, Workload, WorkloadId};
use std::collections::{BTreeMap, HashMap};

/// Each workload's name by its id, made once per round: a shared GPU's holders are looked up
/// in it for every workload on it.
pub type Names<'a> = HashMap<&'a WorkloadId, &'a str>;

/// The names of `workloads`.
pub fn names(workloads: &[Workload]) -> Names<'_> {
    workloads.iter().map(|w| (&w.id, w.name.as_str())).collect()
}

/// A GPU counts as busy with another holder's work from this part of the window.
const OTHER_ACTIVE_MIN: f64 = 0.01;

/// Who else kept `w`'s GPUs busy, or `None` when no other holder did (or the window's busy
/// shares are unknown).
pub fn contention(w: &Workload, names: &Names<'_>, gpus: &[Gpu]) -> Option<Contention> {
    let mut device = Vec::new();
    let mut own = Vec::new();
    let mut split: Option<SplitMethod> = None;
    let mut others: Vec<OtherHolder> = Vec::new();
    for share in &w.gpu.per_gpu {
        let (Some(d), Some(o), Some(method)) =
            (share.device_busy_fraction, share.busy_fraction, share.split)
        else {
            continue;
        };
        // An exact split: it had the GPU to itself, or the other holders did nothing.
        if method.is_exact() {
            continue;
        }
        let Some(g) = gpus.iter().find(|g| g.device.index == share.index) else {
            continue;
        };
        let holders = other_holders(&w.id, g, names);
        if holders.is_empty() {
            continue;
        }
        device.push(d);
        own.push(o);
        others.extend(holders);
        // The least exact method among the shared GPUs.
        if split.is_none() || method == SplitMethod::Partial {
            split = Some(method);
        }
    }
    let split = split?;
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (device, own) = (mean(&device), mean(&own));
    others.sort_by(|a, b| {
        b.busy_fraction
            .unwrap_or(f64::INFINITY)
            .total_cmp(&a.busy_fraction.unwrap_or(f64::INFINITY))
    });
    Some(Contention {
        device_busy_fraction: device,
        own_fraction: own,
        others_fraction: (device - own).max(0.0),
        others,
        split,
        idlest_gpu: idlest_gpu(w, gpus),
    })
}

/// The other holders of `g` that may have kept it busy: each other workload with its part
/// summed over its processes, and each process attributed to none.
fn other_holders(ours: &WorkloadId, g: &Gpu, names: &Names<'_>) -> Vec<OtherHolder> {
    let mut parts: BTreeMap<String, Option<f64>> = BTreeMap::new();
    for p in &g.processes {
        let name = match &p.workload {
            Some(id) if id == ours => continue,
            Some(id) => names
                .get(id)
                .map_or_else(|| id.to_string(), |n| (*n).to_owned()),
            None => format!("pid {}", p.reading.pid),
        };
        let part = parts.entry(name).or_insert(Some(0.0));
        *part = part.zip(p.busy_fraction).map(|(a, b)| a + b);
    }
    parts
        .into_iter()
        .filter(|(_, part)| part.is_none_or(|p| p >= OTHER_ACTIVE_MIN))
        .map(|(name, busy_fraction)| OtherHolder {
            name,
            gpu: g.device.index,
            busy_fraction,
        })
        .collect()
}

/// The host's least busy GPU among those `w` does not hold.
fn idlest_gpu(w: &Workload, gpus: &[Gpu]) -> Option<IdleGpu> {
    gpus.iter()
        .filter(|g| !w.gpu.per_gpu.iter().any(|s| s.index == g.device.index))
        .filter_map(|g| {
            Some(IdleGpu {
                index: g.device.index,
                busy_fraction: g.busy?.fraction,
            })
        })
        .min_by(|a, b| a.busy_fraction.total_cmp(&b.busy_fraction))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::{container, gpu, process};
    use crate::model::{GpuBusy, WorkloadGpuShare};

    /// GPU 0 busy 94 %, divided by host CPU time between three containers (the H100 mix at
    /// 50 %, 30 % and 10 % duty) and a process attributed to none; GPU 1 busy 3 %.
    fn three_way() -> (Vec<Workload>, Vec<Gpu>) {
        let parts = [("share-hi", 0.43), ("share-mid", 0.26), ("share-lo", 0.10)];
        let mut g0 = gpu(0);
        let split = SplitMethod::HostCpuEstimate;
        g0.busy = Some(GpuBusy {
            fraction: 0.94,
            coverage: Some(1.0),
            source: crate::model::BusySource::UtilizationSamples,
            split,
        });
        let mut workloads = Vec::new();
        for (i, (name, part)) in parts.iter().enumerate() {
            let mut w = container(name);
            let mut p = process(100 + i as u32, Some(&w.id), 1 << 30);
            p.busy_fraction = Some(*part);
            g0.processes.push(p);
            let mut s = WorkloadGpuShare::new(0, None);
            s.busy_fraction = Some(*part);
            s.device_busy_fraction = Some(0.94);
            s.split = Some(split);
            w.gpu.per_gpu.push(s);
            w.gpu.processes = 1;
            workloads.push(w);
        }
        let mut stray = process(200, None, 1 << 20);
        stray.busy_fraction = Some(0.15);
        g0.processes.push(stray);
        let mut g1 = gpu(1);
        g1.busy = Some(GpuBusy {
            fraction: 0.03,
            coverage: Some(1.0),
            source: crate::model::BusySource::UtilizationSamples,
            split: SplitMethod::NoProcesses,
        });
        (workloads, vec![g0, g1])
    }

    #[test]
    fn each_holder_sees_the_others_and_the_parts_add_up_to_the_device() {
        let (workloads, gpus) = three_way();
        let c = contention(&workloads[2], &names(&workloads), &gpus).expect("shared");
        assert_eq!(c.own_fraction, 0.10);
        assert!((c.others_fraction - 0.84).abs() < 1e-9);
        assert!((c.own_fraction + c.others_fraction - c.device_busy_fraction).abs() < 1e-9);
        let named: Vec<(&str, Option<f64>)> = c
            .others
            .iter()
            .map(|o| (o.name.as_str(), o.busy_fraction))
            .collect();
        assert_eq!(
            named,
            [
                ("share-hi", Some(0.43)),
                ("share-mid", Some(0.26)),
                ("pid 200", Some(0.15))
            ]
        );
        assert_eq!(c.split, SplitMethod::HostCpuEstimate);
        assert_eq!(
            c.idlest_gpu,
            Some(IdleGpu {
                index: 1,
                busy_fraction: 0.03
            })
        );
    }

    #[test]
    fn no_contention_on_a_gpu_held_alone_or_beside_idle_holders() {
        let (mut workloads, gpus) = three_way();
        for w in &mut workloads {
            w.gpu.per_gpu[0].split = Some(SplitMethod::SoleActiveHolder);
        }
        assert_eq!(contention(&workloads[0], &names(&workloads), &gpus), None);
        // Others holding memory and running nothing this window are not listed.
        let (workloads, mut gpus) = three_way();
        for p in &mut gpus[0].processes[1..] {
            p.busy_fraction = Some(0.0);
        }
        assert_eq!(contention(&workloads[0], &names(&workloads), &gpus), None);
        // An unknown part is listed as unknown, not left out.
        let (workloads, mut gpus) = three_way();
        gpus[0].processes[1].busy_fraction = None;
        let c = contention(&workloads[0], &names(&workloads), &gpus).unwrap();
        assert_eq!(c.others[0].name, "share-mid");
        assert_eq!(c.others[0].busy_fraction, None);
    }
}
