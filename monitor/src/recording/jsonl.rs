//! A JSON Lines recording (`record --format jsonl`): one snapshot a line, in the schema of
//! docs/snapshot-schema.md. Each is turned into the rows a CSV recording holds for it, so
//! `report` and `plot` read either form the same way. (Alert transitions are written to CSV
//! recordings only.)
use super::row::{Record, Row};
use crate::model::{UnknownVerdict, VerdictKind};
use serde_json::Value;

/// Why a line is not a snapshot.
#[derive(Debug, thiserror::Error)]
pub enum JsonlError {
    #[error("not a snapshot: {0}")]
    NotJson(#[from] serde_json::Error),
    #[error("a snapshot without taken_at_unix_ms")]
    NoTime,
    #[error(transparent)]
    Verdict(#[from] UnknownVerdict),
}

/// The rows of one line's snapshot: one per GPU, one per workload.
pub fn rows(line: &str) -> Result<Vec<Row>, JsonlError> {
    let s: Value = serde_json::from_str(line)?;
    let unix_ms = s["taken_at_unix_ms"].as_f64().ok_or(JsonlError::NoTime)?;
    let stamped = |record| Row {
        timestamp: text(&s["taken_at"]),
        unix_ms: Some(unix_ms),
        record: Some(record),
        ..Row::default()
    };
    let mut out = Vec::new();
    for g in s["gpus"].as_array().into_iter().flatten() {
        out.push(Row {
            gpu_index: g["index"].as_u64().map(|i| i as u32).into_iter().collect(),
            gpu_uuid: text(&g["uuid"]),
            gpu_name: text(&g["name"]),
            utilization_gpu_percent: g["utilization_gpu_percent"].as_f64(),
            memory_used_bytes: g["memory_used_bytes"].as_f64(),
            memory_total_bytes: g["memory_total_bytes"].as_f64(),
            temperature_celsius: g["temperature_celsius"].as_f64(),
            power_watts: g["power_watts"].as_f64(),
            power_limit_watts: g["power_limit_watts"].as_f64(),
            sm_clock_mhz: g["sm_clock_mhz"].as_f64(),
            gpu_busy_fraction: g["busy"]["fraction"].as_f64(),
            sm_activity_percent: g["sm_activity"]["sm_percent"].as_f64(),
            pcie_rx_bytes_per_second: g["pcie"]["rx_bytes_per_second"].as_f64(),
            pcie_tx_bytes_per_second: g["pcie"]["tx_bytes_per_second"].as_f64(),
            energy_joules: g["energy_joules"].as_f64(),
            ..stamped(Record::Gpu)
        });
    }
    for w in s["workloads"].as_array().into_iter().flatten() {
        let v = &w["verdict"];
        let verdict = match v["kind"].as_str() {
            Some(k) => Some(k.parse::<VerdictKind>()?),
            None => None,
        };
        out.push(Row {
            gpu_index: w["gpu"]["per_gpu"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|g| g["index"].as_u64().map(|i| i as u32))
                .collect(),
            workload_id: text(&w["id"]),
            workload_name: text(&w["name"]),
            image: text(&w["container"]["image"]),
            compose_service: text(&w["container"]["compose_service"]),
            gpu_memory_bytes: w["gpu"]["memory_bytes"].as_f64(),
            gpu_busy_fraction: w["gpu"]["busy_fraction"].as_f64(),
            sm_activity_percent: v["sm_activity_fraction"].as_f64().map(|f| f * 100.0),
            cpu_cores: w["cpu"]["cores"].as_f64(),
            memory_bytes: w["memory"]["usage_bytes"].as_f64(),
            verdict,
            input_bound_share: v["input_bound_share"].as_f64(),
            host_bound_share: v["host_bound_share"].as_f64(),
            oom_batch_scale: w["oom_headroom"]["batch_scale"].as_f64(),
            straggler_gpu: w["straggler"]["gpu"].as_f64(),
            advice: text(&v["advice"]),
            energy_joules: energy(w, |e| {
                Some(e["busy_joules"].as_f64()? + e["idle_joules"].as_f64()?)
            }),
            idle_energy_joules: energy(w, |e| e["idle_joules"].as_f64()),
            ..stamped(Record::Workload)
        });
    }
    Ok(out)
}

/// `part` of each of a workload's GPUs' energy, summed; `None` unless every GPU has it.
fn energy(w: &Value, part: impl Fn(&Value) -> Option<f64>) -> Option<f64> {
    let gpus = w["gpu"]["per_gpu"].as_array()?;
    let parts: Option<Vec<f64>> = gpus.iter().map(|g| part(&g["energy"])).collect();
    parts.filter(|p| !p.is_empty()).map(|p| p.iter().sum())
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_line_is_its_gpu_and_workload_rows() {
        let line = r#"{"taken_at":"t","taken_at_unix_ms":1000,
            "gpus":[{"index":0,"uuid":"GPU-a","name":"H100","temperature_celsius":45,
                     "busy":{"fraction":0.25},"sm_activity":{"sm_percent":19.4}}],
            "workloads":[{"id":"cgroup:/job","name":"/job","cpu":{"cores":1.0},
                          "memory":{"usage_bytes":4096},
                          "gpu":{"memory_bytes":1024,"busy_fraction":0.25,"per_gpu":[{"index":0}]},
                          "verdict":{"kind":"host-bound: CPU","sm_activity_fraction":0.95,
                                     "advice":"profile the loop"}},
                         {"id":"docker:b","name":"idle-box","gpu":{"memory_bytes":0,"per_gpu":[]},
                          "verdict":null}]}"#
            .replace('\n', " ");
        let got = rows(&line).unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].record, Some(Record::Gpu));
        assert_eq!(got[0].gpu_busy_fraction, Some(0.25));
        assert_eq!(got[0].temperature_celsius, Some(45.0));
        let w = &got[1];
        assert_eq!(
            (w.workload_id.as_str(), w.gpu_index.as_slice()),
            ("cgroup:/job", &[0][..])
        );
        assert_eq!(w.verdict, Some(VerdictKind::HostCpu));
        assert_eq!(w.sm_activity_percent, Some(95.0));
        assert_eq!(w.advice, "profile the loop");
        assert_eq!(got[2].verdict, None);
        let e = rows(r#"{"gpus":[]}"#).unwrap_err();
        assert!(e.to_string().contains("taken_at_unix_ms"), "{e}");
        let e = rows(r#"{"taken_at_unix_ms":1,"workloads":[{"verdict":{"kind":"sleepy"}}]}"#)
            .unwrap_err();
        assert!(e.to_string().contains("\"sleepy\" is not a verdict"), "{e}");
    }
}
