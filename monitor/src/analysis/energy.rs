//! Each GPU's energy over the window, and each holder's part of it.
//!
//! The GPU's energy is its power reading times the window's length. Measured on an H200
//! (driver 580.159.04, tests/gpu/energy_probe.py): `nvmlDeviceGetPowerUsage` costs 2.8 µs a call
//! and `nvmlDeviceGetTotalEnergyConsumption` 3,644 µs (the counter moves 10 times a second); each
//! second, the counter's increase and the power readings integrated over it agreed within 1 %
//! while steady (idle 80.5 J against 81.2–81.8; busy 688–691 J against 694), and at a step from
//! idle to busy the readings lag the counter by about a second. So the reading the round takes
//! anyway stands in for the counter.
//!
//! A holder is charged its busy part of the GPU's time (`busy_fraction`, a part of the GPU's
//! one measured busy time) and an equal part of the GPU's idle time among the workloads holding
//! it: memory held keeps the GPU theirs, as the idle-held GPU-hours are. Busy time no holder
//! accounts for (a process outside every workload) stays the GPU's own.
use crate::model::{ShareEnergy, Snapshot};

/// Sets each GPU's energy over the window and each holder's part of it.
pub fn charge(snap: &mut Snapshot) {
    let Some(window) = snap.window_seconds.filter(|w| *w > 0.0 && w.is_finite()) else {
        return;
    };
    for g in &mut snap.gpus {
        g.energy_joules = g
            .device
            .power_watts
            .filter(|p| p.is_finite() && *p >= 0.0)
            .map(|p| p * window);
    }
    for g in &snap.gpus {
        let (Some(energy), Some(busy)) = (g.energy_joules, g.busy.map(|b| b.fraction)) else {
            continue;
        };
        let index = g.device.index;
        let holders = snap
            .workloads
            .iter()
            .filter(|w| w.gpu.per_gpu.iter().any(|s| s.index == index))
            .count();
        let idle_each = (1.0 - busy.clamp(0.0, 1.0)) * energy / holders.max(1) as f64;
        for w in &mut snap.workloads {
            for s in w.gpu.per_gpu.iter_mut().filter(|s| s.index == index) {
                s.energy = s.busy_fraction.map(|part| ShareEnergy {
                    busy_joules: part.clamp(0.0, 1.0) * energy,
                    idle_joules: idle_each,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::{container, gpu, snapshot};
    use crate::model::{BusySource, GpuBusy, SplitMethod, WorkloadGpuShare};

    fn holder(name: &str, gpu: u32, part: Option<f64>) -> crate::model::Workload {
        let mut w = container(name);
        let mut s = WorkloadGpuShare::new(gpu, None);
        s.busy_fraction = part;
        w.gpu.per_gpu.push(s);
        w
    }

    fn busy_gpu(index: u32, watts: Option<f64>, busy: f64) -> crate::model::Gpu {
        let mut g = gpu(index);
        g.device.power_watts = watts;
        g.busy = Some(GpuBusy {
            fraction: busy,
            coverage: Some(1.0),
            source: BusySource::UtilizationSamples,
            split: SplitMethod::HostCpuEstimate,
        });
        g
    }

    #[test]
    fn holders_get_their_busy_part_and_share_the_idle_time() {
        // 400 W over 2 s: 800 J; busy 0.6 (0.45 + 0.15), idle 0.4 shared by the two.
        let mut s = snapshot(
            0,
            vec![busy_gpu(0, Some(400.0), 0.6), busy_gpu(1, None, 0.5)],
            vec![
                holder("a", 0, Some(0.45)),
                holder("b", 0, Some(0.15)),
                holder("c", 1, Some(0.5)),
            ],
        );
        s.window_seconds = Some(2.0);
        charge(&mut s);
        assert_eq!(s.gpus[0].energy_joules, Some(800.0));
        let e = |i: usize| s.workloads[i].gpu.per_gpu[0].energy.unwrap();
        assert!((e(0).busy_joules - 360.0).abs() < 1e-9, "{:?}", e(0));
        assert!((e(1).busy_joules - 120.0).abs() < 1e-9, "{:?}", e(1));
        assert!((e(0).idle_joules - 160.0).abs() < 1e-9, "{:?}", e(0));
        assert_eq!(e(0).idle_joules, e(1).idle_joules);
        // Every joule of the GPU is someone's when the parts cover its busy time.
        let sum: f64 = (0..2).map(|i| e(i).busy_joules + e(i).idle_joules).sum();
        assert!((sum - 800.0).abs() < 1e-9, "{sum}");
        // No power reading: no energy, for the GPU or its holder.
        assert_eq!(s.gpus[1].energy_joules, None);
        assert_eq!(s.workloads[2].gpu.per_gpu[0].energy, None);
    }

    #[test]
    fn an_unknown_part_or_the_first_round_charges_nothing() {
        let mut s = snapshot(
            0,
            vec![busy_gpu(0, Some(100.0), 0.5)],
            vec![holder("a", 0, None)],
        );
        s.window_seconds = None;
        charge(&mut s);
        assert_eq!(s.gpus[0].energy_joules, None);
        s.window_seconds = Some(1.0);
        charge(&mut s);
        assert_eq!(s.gpus[0].energy_joules, Some(100.0));
        assert_eq!(s.workloads[0].gpu.per_gpu[0].energy, None);
    }
}
