//! OOM headroom, by the method of the YOLO26 GPU memory article: a training job's GPU memory is a fixed part (CUDA context,
//! weights, optimiser state: the *baseline*) plus a part proportional to the batch. With the
//! memory it uses now and the memory it could have on its GPU, the batch can grow by
//! `(available - baseline) / (used - baseline)` before it runs out — the article's
//! `max batch = 16 × (total - 2000 MiB) / (used - 2000 MiB)`, with the memory other processes
//! hold taken out of the total.
use crate::model::OomHeadroom;
use crate::model::{Gpu, Workload};
use crate::units::ByteSize;
use serde::Deserialize;

/// The config file's `headroom:` section.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HeadroomConfig {
    /// GPU memory a process holds whatever its batch size (the article's 2000 MiB).
    pub baseline: ByteSize,
}

impl Default for HeadroomConfig {
    fn default() -> Self {
        Self {
            baseline: ByteSize(2000 * ByteSize::MIB),
        }
    }
}

/// The headroom on the tightest GPU of `w`, or `None` when it holds no GPU memory.
pub fn oom_headroom(w: &Workload, gpus: &[Gpu], config: &HeadroomConfig) -> Option<OomHeadroom> {
    let baseline = config.baseline.0 as f64;
    w.gpu
        .per_gpu
        .iter()
        .filter(|share| share.memory_bytes > 0)
        .filter_map(|share| {
            let g = gpus.iter().find(|g| g.device.index == share.index)?;
            let total = g.device.memory_total_bytes?;
            let device_used = g.device.memory_used_bytes?;
            let others = device_used.saturating_sub(share.memory_bytes);
            let available = total.saturating_sub(others);
            let used = share.memory_bytes as f64;
            let batch_scale = (used > baseline)
                .then(|| ((available as f64 - baseline) / (used - baseline)).max(0.0));
            Some(OomHeadroom {
                gpu_index: share.index,
                used_bytes: share.memory_bytes,
                available_bytes: available,
                batch_scale,
            })
        })
        .min_by(|a, b| {
            let key = |h: &OomHeadroom| h.batch_scale.unwrap_or(f64::INFINITY);
            key(a).total_cmp(&key(b))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::{container, gpu};
    use crate::model::WorkloadGpuShare;

    const MIB: u64 = 1 << 20;

    fn share(index: u32, memory: u64) -> WorkloadGpuShare {
        WorkloadGpuShare {
            memory_bytes: memory,
            ..WorkloadGpuShare::new(index, None)
        }
    }

    #[test]
    fn the_articles_worked_example() {
        // The article: batch 16 uses 12500 MiB on a 40 GB card → max batch = 16 × (40960-2000)/(12500-2000).
        let mut g = gpu(0);
        g.device.memory_total_bytes = Some(40960 * MIB);
        g.device.memory_used_bytes = Some(12500 * MIB);
        let mut w = container("train");
        w.gpu.per_gpu = vec![share(0, 12500 * MIB)];
        let h = oom_headroom(&w, &[g], &HeadroomConfig::default()).expect("headroom");
        let scale = h.batch_scale.expect("scale");
        assert!((16.0 * scale - 59.36).abs() < 0.01, "{}", 16.0 * scale);
    }

    #[test]
    fn the_tightest_gpu_and_other_holders_count() {
        let mut g0 = gpu(0);
        g0.device.memory_total_bytes = Some(80_000 * MIB);
        g0.device.memory_used_bytes = Some(10_000 * MIB);
        let mut g1 = gpu(1);
        g1.device.memory_total_bytes = Some(80_000 * MIB);
        // Another job holds 60000 MiB beside ours on GPU 1.
        g1.device.memory_used_bytes = Some(70_000 * MIB);
        let mut w = container("ddp");
        w.gpu.per_gpu = vec![share(0, 10_000 * MIB), share(1, 10_000 * MIB)];
        let h = oom_headroom(&w, &[g0, g1], &HeadroomConfig::default()).expect("headroom");
        assert_eq!(h.gpu_index, 1);
        assert_eq!(h.available_bytes, 20_000 * MIB);
        assert!((h.batch_scale.expect("scale") - 2.25).abs() < 1e-9);
        // Below the baseline there is nothing to scale.
        w.gpu.per_gpu = vec![share(0, 1000 * MIB)];
        let h = oom_headroom(&w, &[gpu(0)], &HeadroomConfig::default()).expect("headroom");
        assert_eq!(h.batch_scale, None);
    }
}
