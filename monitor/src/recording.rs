//! Reading back a CSV recording (`gpuwatch record`, columns in `docs/snapshot-schema.md`) for
//! `plot` and `report`. Columns are found by name, so a recording from an older gpuwatch with
//! fewer columns still reads; a malformed cell is an error naming the file, line and column.
use crate::output::escape::unspreadsheet;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Debug, Default)]
pub struct Recording {
    /// Unix ms of the first and last row.
    pub first_ms: u64,
    pub last_ms: u64,
    pub gpus: BTreeMap<u32, GpuSeries>,
    /// By workload id (`docker:<id>`, `cgroup:/job`, ...).
    pub workloads: BTreeMap<String, WorkloadSeries>,
    pub alerts: Vec<AlertRow>,
}

#[derive(Debug, Default)]
pub struct GpuSeries {
    pub uuid: String,
    pub name: String,
    pub samples: Vec<GpuSample>,
}

#[derive(Clone, Debug, Default)]
pub struct GpuSample {
    pub unix_ms: u64,
    /// The window's busy share from the utilisation series (percent), or the instantaneous
    /// reading in a recording that has no series figure.
    pub utilization_percent: Option<f64>,
    /// GPM's SM activity (percent).
    pub sm_activity_percent: Option<f64>,
    pub memory_used_bytes: Option<f64>,
    pub memory_total_bytes: Option<f64>,
    pub temperature_celsius: Option<f64>,
    pub power_watts: Option<f64>,
}

impl GpuSample {
    pub fn memory_percent(&self) -> Option<f64> {
        match (self.memory_used_bytes, self.memory_total_bytes) {
            (Some(u), Some(t)) if t > 0.0 => Some(u * 100.0 / t),
            _ => None,
        }
    }
}

#[derive(Debug, Default)]
pub struct WorkloadSeries {
    pub id: String,
    pub name: String,
    pub image: String,
    pub compose_service: String,
    /// `namespace/pod` (empty unless a Kubernetes pod's; recordings before it have no column).
    pub pod: String,
    pub samples: Vec<WorkloadSample>,
}

#[derive(Clone, Debug, Default)]
pub struct WorkloadSample {
    pub unix_ms: u64,
    /// Indices of the GPUs it held in this sample.
    pub gpus: Vec<u32>,
    pub gpu_memory_bytes: f64,
    pub gpu_busy_fraction: Option<f64>,
    /// Of the SMs, the share busy while its kernels ran (percent; GPM, GPUs it held alone).
    pub sm_activity_percent: Option<f64>,
    pub cpu_cores: Option<f64>,
    pub memory_bytes: Option<f64>,
    pub verdict: Option<String>,
    pub input_bound_share: Option<f64>,
    pub oom_batch_scale: Option<f64>,
}

/// An alert transition recorded with the samples.
#[derive(Clone, Debug)]
pub struct AlertRow {
    pub unix_ms: u64,
    pub rule: String,
    /// `firing` or `resolved`.
    pub state: String,
    pub summary: String,
    pub gpu: Option<u32>,
    pub workload_id: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum RecordingError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a gpuwatch CSV recording (no `{column}` column in the header)")]
    NotARecording { path: PathBuf, column: &'static str },
    #[error("{path}: line {line}: {message}")]
    Malformed {
        path: PathBuf,
        line: u64,
        message: String,
    },
    #[error("{path}: no samples")]
    Empty { path: PathBuf },
}

/// Reads a CSV recording.
pub fn read(path: &Path) -> Result<Recording, RecordingError> {
    let file = std::fs::File::open(path).map_err(|source| RecordingError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse(file, path)
}

pub fn parse(input: impl std::io::Read, path: &Path) -> Result<Recording, RecordingError> {
    let mut reader = csv::ReaderBuilder::new().flexible(false).from_reader(input);
    let malformed = |line: u64, message: String| RecordingError::Malformed {
        path: path.to_owned(),
        line,
        message,
    };
    let header = reader
        .headers()
        .map_err(|e| malformed(1, e.to_string()))?
        .clone();
    let col = |name: &'static str| header.iter().position(|h| h == name);
    for required in ["unix_ms", "record"] {
        if col(required).is_none() {
            return Err(RecordingError::NotARecording {
                path: path.to_owned(),
                column: required,
            });
        }
    }
    let mut rec = Recording::default();
    for (i, row) in reader.records().enumerate() {
        let line = i as u64 + 2;
        let row = row.map_err(|e| malformed(line, e.to_string()))?;
        // Text cells come back as written before their spreadsheet escape.
        let text = |name: &'static str| -> &str {
            unspreadsheet(col(name).and_then(|c| row.get(c)).unwrap_or(""))
        };
        let num = |name: &'static str| -> Result<Option<f64>, RecordingError> {
            let t = text(name);
            if t.is_empty() {
                return Ok(None);
            }
            match t.parse::<f64>() {
                Ok(v) if v.is_finite() => Ok(Some(v)),
                // `inf`, `NaN` and `1e309` parse, but no gauge is infinite, and a chart's axis
                // over one never ends.
                Ok(_) => Err(malformed(
                    line,
                    format!("column {name}: {t:?} is not a finite number"),
                )),
                Err(_) => Err(malformed(
                    line,
                    format!("column {name}: {t:?} is not a number"),
                )),
            }
        };
        let unix_ms = num("unix_ms")?
            .ok_or_else(|| malformed(line, "column unix_ms is empty".into()))?
            as u64;
        if rec.first_ms == 0 || unix_ms < rec.first_ms {
            rec.first_ms = unix_ms;
        }
        rec.last_ms = rec.last_ms.max(unix_ms);
        let gpu_list = || -> Result<Vec<u32>, RecordingError> {
            text("gpu_index")
                .split('|')
                .filter(|s| !s.is_empty())
                .map(|s| {
                    s.parse()
                        .map_err(|_| malformed(line, format!("column gpu_index: {s:?}")))
                })
                .collect()
        };
        match text("record") {
            "gpu" => {
                let index = *gpu_list()?
                    .first()
                    .ok_or_else(|| malformed(line, "a gpu row without gpu_index".into()))?;
                let series = rec.gpus.entry(index).or_default();
                series.uuid = text("gpu_uuid").to_owned();
                series.name = text("gpu_name").to_owned();
                let busy = num("gpu_busy_fraction")?.map(|b| b * 100.0);
                series.samples.push(GpuSample {
                    unix_ms,
                    utilization_percent: busy.or(num("utilization_gpu_percent")?),
                    sm_activity_percent: num("sm_activity_percent")?,
                    memory_used_bytes: num("memory_used_bytes")?,
                    memory_total_bytes: num("memory_total_bytes")?,
                    temperature_celsius: num("temperature_celsius")?,
                    power_watts: num("power_watts")?,
                });
            }
            "workload" => {
                let id = text("workload_id").to_owned();
                let series = rec.workloads.entry(id.clone()).or_default();
                series.id = id;
                series.name = text("workload_name").to_owned();
                series.image = text("image").to_owned();
                series.compose_service = text("compose_service").to_owned();
                series.pod = text("pod").to_owned();
                let verdict = text("verdict");
                series.samples.push(WorkloadSample {
                    unix_ms,
                    gpus: gpu_list()?,
                    gpu_memory_bytes: num("gpu_memory_bytes")?.unwrap_or(0.0),
                    gpu_busy_fraction: num("gpu_busy_fraction")?,
                    sm_activity_percent: num("sm_activity_percent")?,
                    cpu_cores: num("cpu_cores")?,
                    memory_bytes: num("memory_bytes")?,
                    verdict: (!verdict.is_empty()).then(|| verdict.to_owned()),
                    input_bound_share: num("input_bound_share")?,
                    oom_batch_scale: num("oom_batch_scale")?,
                });
            }
            "alert" => rec.alerts.push(AlertRow {
                unix_ms,
                rule: text("alert_rule").to_owned(),
                state: text("alert_state").to_owned(),
                summary: text("alert_summary").to_owned(),
                gpu: gpu_list()?.first().copied(),
                workload_id: Some(text("workload_id"))
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned),
            }),
            other => return Err(malformed(line, format!("unknown record type {other:?}"))),
        }
    }
    if rec.gpus.is_empty() && rec.workloads.is_empty() {
        return Err(RecordingError::Empty {
            path: path.to_owned(),
        });
    }
    Ok(rec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_rows_by_column_name_and_names_bad_cells() {
        let text = "unix_ms,record,gpu_index,gpu_uuid,temperature_celsius,workload_id,workload_name,gpu_busy_fraction,verdict,alert_rule,alert_state\n\
                    1000,gpu,0,GPU-a,40,,,,,,\n\
                    1000,workload,0|1,docker:x,train,0.5,GPU-bound,,\n\
                    2000,alert,0,,,docker:x,train,,,gpu_temperature_high,firing\n";
        let rec = parse(text.as_bytes(), Path::new("r.csv"));
        // The workload row has a missing cell: flexible(false) names the line.
        let e = rec.expect_err("short row");
        assert!(e.to_string().starts_with("r.csv: line 3:"), "{e}");
        let text = text.replace(
            "1000,workload,0|1,docker:x,train,0.5,GPU-bound,,",
            "1000,workload,0|1,,,docker:x,train,0.5,GPU-bound,,",
        );
        let rec = parse(text.as_bytes(), Path::new("r.csv")).expect("valid");
        assert_eq!(rec.gpus[&0].samples[0].temperature_celsius, Some(40.0));
        let w = &rec.workloads["docker:x"];
        assert_eq!(w.samples[0].gpus, vec![0, 1]);
        assert_eq!(w.samples[0].verdict.as_deref(), Some("GPU-bound"));
        assert_eq!(rec.alerts[0].rule, "gpu_temperature_high");
        assert_eq!((rec.first_ms, rec.last_ms), (1000, 2000));
        let bad = text.replace(",40,", ",hot,");
        let e = parse(bad.as_bytes(), Path::new("r.csv")).expect_err("bad number");
        assert_eq!(
            e.to_string(),
            "r.csv: line 2: column temperature_celsius: \"hot\" is not a number"
        );
        for (cell, shown) in [
            ("inf", "\"inf\""),
            ("1e309", "\"1e309\""),
            ("NaN", "\"NaN\""),
        ] {
            let bad = text.replace(",40,", &format!(",{cell},"));
            let e = parse(bad.as_bytes(), Path::new("r.csv")).expect_err("not finite");
            assert_eq!(
                e.to_string(),
                format!(
                    "r.csv: line 2: column temperature_celsius: {shown} is not a finite number"
                )
            );
        }
        let e = parse("a,b\n1,2\n".as_bytes(), Path::new("x.csv")).expect_err("foreign CSV");
        assert!(
            e.to_string().contains("not a gpuwatch CSV recording"),
            "{e}"
        );
    }
}
