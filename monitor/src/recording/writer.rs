//! Writing a CSV recording: the header once, then per snapshot one row per GPU and per
//! workload, and one per alert transition (firing or resolved) stamped with that snapshot.
use super::row::{Record, Row};
use crate::health::alerts::Alert;
use crate::model::bounded::bounded;
use crate::model::{Gpu, Snapshot, VerdictKind, Workload, WorkloadId};
use std::collections::HashMap;
use std::io::Write;

/// A recording being written to `W`.
pub struct Writer<W: Write> {
    csv: csv::Writer<W>,
    /// Each workload's verdict on its last row: the advice is written when it changes.
    verdicts: HashMap<WorkloadId, VerdictKind>,
}

impl<W: Write> Writer<W> {
    /// Starts a recording: writes the header.
    pub fn new(out: W) -> csv::Result<Self> {
        let mut csv = csv::WriterBuilder::new()
            .has_headers(false)
            .from_writer(out);
        csv.write_record(Row::columns())?;
        Ok(Self {
            csv,
            verdicts: Default::default(),
        })
    }

    /// The rows of one snapshot and the alert transitions it caused, then a flush, so a kill
    /// loses nothing written.
    pub fn write(&mut self, s: &Snapshot, transitions: &[Alert]) -> csv::Result<()> {
        for g in &s.gpus {
            self.csv.serialize(gpu_row(s, g))?;
        }
        for w in &s.workloads {
            let mut row = workload_row(s, w);
            if let Some(v) = &w.verdict {
                if self.verdicts.insert(w.id.clone(), v.kind) != Some(v.kind) {
                    row.advice = bounded(&v.advice, SUMMARY_MAX_CHARS).into_owned();
                }
            }
            self.csv.serialize(row)?;
        }
        self.verdicts
            .retain(|id, _| s.workloads.iter().any(|w| &w.id == id));
        for a in transitions {
            self.csv.serialize(alert_row(s, a))?;
        }
        self.csv.flush()?;
        Ok(())
    }
}

fn stamped(s: &Snapshot, record: Record) -> Row {
    Row {
        timestamp: s.taken_at.clone(),
        unix_ms: Some(s.taken_at_unix_ms as f64),
        record: Some(record),
        ..Row::default()
    }
}

fn gpu_row(s: &Snapshot, g: &Gpu) -> Row {
    let d = &g.device;
    let busy = g.busy;
    let activity = g.sm_activity;
    Row {
        gpu_index: vec![d.index],
        gpu_uuid: d.uuid.clone().unwrap_or_default(),
        gpu_name: d.name.clone().unwrap_or_default(),
        utilization_gpu_percent: d.utilization_gpu_percent.map(f64::from),
        memory_used_bytes: d.memory_used_bytes.map(|v| v as f64),
        memory_total_bytes: d.memory_total_bytes.map(|v| v as f64),
        temperature_celsius: d.temperature_celsius.map(f64::from),
        power_watts: d.power_watts,
        power_limit_watts: d.power_limit_watts,
        sm_clock_mhz: d.sm_clock_mhz.map(f64::from),
        clocks_event_reasons: d.clocks_event_reasons.join("|"),
        gpu_busy_fraction: busy.map(|b| b.fraction),
        busy_source: busy.map(|b| serde_label(&b.source)).unwrap_or_default(),
        busy_split: busy.map(|b| serde_label(&b.split)).unwrap_or_default(),
        sm_activity_percent: activity.and_then(|a| a.sm_percent),
        tensor_activity_percent: activity.and_then(|a| a.tensor_percent),
        pcie_rx_bytes_per_second: g.pcie.map(|p| p.rx_bytes_per_second),
        pcie_tx_bytes_per_second: g.pcie.map(|p| p.tx_bytes_per_second),
        energy_joules: g.energy_joules,
        ..stamped(s, Record::Gpu)
    }
}

fn workload_row(s: &Snapshot, w: &Workload) -> Row {
    let c = w.container.as_ref();
    let verdict = w.verdict.as_ref();
    let host = verdict.and_then(|v| v.host);
    // Rates only from a window the probes covered whole.
    let window = s.window_seconds.filter(|w| *w > 0.0).unwrap_or(1.0);
    let cuda = w.cuda.as_ref().filter(|c| c.traced);
    // Its part of its GPUs' energy, when every GPU's part is known.
    let energy = energy_of(w);
    // The least exact method among its GPUs: an estimate anywhere makes the row one.
    let split = w
        .gpu
        .per_gpu
        .iter()
        .filter_map(|g| g.split)
        .max_by_key(|m| !m.is_exact());
    Row {
        gpu_index: w.gpu.per_gpu.iter().map(|g| g.index).collect(),
        workload_id: w.id.to_string(),
        workload_name: cell(&w.name),
        image: c.map(|c| cell(&c.image)).unwrap_or_default(),
        compose_service: c
            .and_then(|c| c.compose_service.as_deref())
            .map(cell)
            .unwrap_or_default(),
        pod: c
            .and_then(|c| c.kubernetes.as_ref())
            .map(|k| cell(&k.to_string()))
            .unwrap_or_default(),
        gpu_memory_bytes: Some(w.gpu.memory_bytes as f64),
        gpu_busy_fraction: w.gpu.busy_fraction,
        busy_split: split.map(|m| serde_label(&m)).unwrap_or_default(),
        sm_activity_percent: verdict
            .and_then(|v| v.sm_activity_fraction)
            .map(|f| f * 100.0),
        cpu_cores: w.cpu.and_then(|c| c.cores),
        memory_bytes: w.memory.map(|m| m.usage_bytes as f64),
        verdict: verdict.map(|v| v.kind),
        input_bound_share: verdict.and_then(|v| v.input_bound_share),
        host_bound_share: verdict.and_then(|v| v.host_bound_share),
        cuda_launches_per_second: cuda.map(|c| c.total.launches as f64 / window),
        cuda_h2d_bytes_per_second: cuda.map(|c| c.total.h2d.bytes as f64 / window),
        cuda_d2h_bytes_per_second: cuda.map(|c| c.total.d2h.bytes as f64 / window),
        copy_share: host.and_then(|h| h.copy_share),
        sync_share: host.and_then(|h| h.sync_share),
        oom_batch_scale: w.oom_headroom.and_then(|h| h.batch_scale),
        straggler_gpu: w.straggler.as_ref().map(|s| f64::from(s.gpu)),
        energy_joules: energy.map(|e| e.busy_joules + e.idle_joules),
        idle_energy_joules: energy.map(|e| e.idle_joules),
        ..stamped(s, Record::Workload)
    }
}

/// A workload's part of its GPUs' energy over the window, summed over them; `None` unless every
/// GPU's part is known (a partial sum would read as less energy).
pub fn energy_of(w: &Workload) -> Option<crate::model::ShareEnergy> {
    let parts: Vec<_> = w
        .gpu
        .per_gpu
        .iter()
        .map(|g| g.energy)
        .collect::<Option<_>>()?;
    (!parts.is_empty()).then(|| crate::model::ShareEnergy {
        busy_joules: parts.iter().map(|e| e.busy_joules).sum(),
        idle_joules: parts.iter().map(|e| e.idle_joules).sum(),
    })
}

fn alert_row(s: &Snapshot, a: &Alert) -> Row {
    let gpu = a.subject.gpu.as_ref();
    let c = a.subject.container.as_ref();
    Row {
        gpu_index: gpu.map(|g| g.index).into_iter().collect(),
        gpu_uuid: gpu.and_then(|g| g.uuid.clone()).unwrap_or_default(),
        workload_id: c.map(|c| c.workload.to_string()).unwrap_or_default(),
        workload_name: c.map(|c| c.name.clone()).unwrap_or_default(),
        image: c.and_then(|c| c.image.clone()).unwrap_or_default(),
        compose_service: c
            .and_then(|c| c.compose_service.clone())
            .unwrap_or_default(),
        pod: c.and_then(|c| c.pod.clone()).unwrap_or_default(),
        alert_rule: a.rule.to_owned(),
        alert_state: Some(a.state),
        alert_summary: bounded(&a.summary, SUMMARY_MAX_CHARS).into_owned(),
        ..stamped(s, Record::Alert)
    }
}

/// The snake_case name serde gives a unit variant (what the JSON says too).
/// The most characters of a tenant's name, image, service or pod in a cell, and of an alert's
/// summary (which quotes them): every row repeats them.
const CELL_MAX_CHARS: usize = 256;
const SUMMARY_MAX_CHARS: usize = 1024;

fn cell(s: &str) -> String {
    bounded(s, CELL_MAX_CHARS).into_owned()
}

fn serde_label<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::{container, gpu, snapshot};

    fn written(s: &Snapshot) -> String {
        let mut w = Writer::new(Vec::new()).unwrap();
        w.write(s, &[]).unwrap();
        String::from_utf8(w.csv.into_inner().unwrap()).unwrap()
    }

    #[test]
    fn every_row_has_every_column_and_quotes_only_what_needs_it() {
        let mut c = container("a,b");
        c.name = "say \"hi\"".into();
        let text = written(&snapshot(1000, vec![gpu(0)], vec![c]));
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some(Row::columns().join(",").as_str()));
        let gpu_row = lines.next().unwrap();
        assert!(
            gpu_row.starts_with(
                ",1000,gpu,0,GPU-00000000,Test GPU,50,10737418240,85899345920,50,300,700,"
            ),
            "{gpu_row}"
        );
        let workload = lines.next().unwrap();
        assert!(workload.contains(",\"say \"\"hi\"\"\","), "{workload}");
        let mut reader = csv::Reader::from_reader(text.as_bytes());
        for r in reader.records() {
            assert_eq!(r.unwrap().len(), Row::columns().len());
        }
    }
}
