//! CSV recordings (`gpuwatch record`): [`row`] is one row, for the writer and the reader alike;
//! [`writer`] writes snapshots as rows; [`read`] reads a recording back into series for `plot`
//! and `report`, CSV or JSON Lines ([`jsonl`] turns each snapshot into the same rows). Columns are found by name, so a recording from an older gpuwatch with fewer
//! columns still reads; a malformed cell is an error naming the file, line and column.
pub mod jsonl;
pub mod row;
mod row_bound;
pub mod summary;
pub mod writer;

pub use writer::Writer;

use crate::health::alerts::AlertState;
use crate::model::VerdictKind;
use row::{Record, Row};
use row_bound::RowBound;
pub use row_bound::ROW_MAX_BYTES;
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
    /// The line of a last row the writer never finished (the file does not end with a line
    /// break: a full disk, a killed recorder), left out.
    pub cut_off_line: Option<u64>,
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
    /// PCIe traffic, host to device and device to host.
    pub pcie_rx_bytes_per_second: Option<f64>,
    pub pcie_tx_bytes_per_second: Option<f64>,
    pub memory_used_bytes: Option<f64>,
    pub memory_total_bytes: Option<f64>,
    pub temperature_celsius: Option<f64>,
    pub power_watts: Option<f64>,
    /// Joules over the window (recordings before energy have none).
    pub energy_joules: Option<f64>,
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
    pub verdict: Option<VerdictKind>,
    pub input_bound_share: Option<f64>,
    /// The host-side verdict's share of the window (copying, synchronising, its own CPU).
    pub host_bound_share: Option<f64>,
    pub oom_batch_scale: Option<f64>,
    /// The GPU of the rank the others waited for (distributed jobs).
    pub straggler_gpu: Option<u32>,
    /// The verdict's advice, where the recording wrote it (when the verdict changed).
    pub advice: Option<String>,
    /// Its part of its GPUs' energy over the window (joules), and of that the idle part.
    pub energy_joules: Option<f64>,
    pub idle_energy_joules: Option<f64>,
}

/// An alert transition recorded with the samples.
#[derive(Clone, Debug)]
pub struct AlertRow {
    pub unix_ms: u64,
    pub rule: String,
    /// Firing or resolved.
    pub state: AlertState,
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
    #[error(
        "{path}: line {line}: a row longer than {} MiB: not a gpuwatch recording, or a damaged one",
        ROW_MAX_BYTES >> 20
    )]
    RowTooLong { path: PathBuf, line: u64 },
}

/// Reads a recording, CSV or JSON Lines (told by its first byte: a snapshot starts with `{`).
pub fn read(path: &Path) -> Result<Recording, RecordingError> {
    use std::io::BufRead;
    let io = |source| RecordingError::Read {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let mut input = std::io::BufReader::new(file);
    if input.fill_buf().map_err(io)?.first() == Some(&b'{') {
        parse_jsonl(input, path)
    } else {
        parse(input, path)
    }
}

/// Parses a JSON Lines recording. A last line without its line break was never finished: it is
/// left out and named in `cut_off_line`, as in a CSV recording.
pub fn parse_jsonl(input: impl std::io::Read, path: &Path) -> Result<Recording, RecordingError> {
    use std::io::BufRead;
    let malformed = |line: u64, message: String| RecordingError::Malformed {
        path: path.to_owned(),
        line,
        message,
    };
    let mut rec = Recording::default();
    let mut input = std::io::BufReader::new(RowBound::new(input));
    let mut buf = Vec::new();
    let mut line = 0u64;
    loop {
        buf.clear();
        input.get_mut().row_ended();
        let n = match input.read_until(b'\n', &mut buf) {
            Ok(n) => n,
            Err(_) if input.get_ref().over() => {
                return Err(RecordingError::RowTooLong {
                    path: path.to_owned(),
                    line: line + 1,
                })
            }
            Err(source) => {
                return Err(RecordingError::Read {
                    path: path.to_owned(),
                    source,
                })
            }
        };
        if n == 0 {
            break;
        }
        line += 1;
        if buf.last() != Some(&b'\n') {
            rec.cut_off_line = Some(line);
            break;
        }
        let text = String::from_utf8_lossy(&buf);
        if text.trim().is_empty() {
            continue;
        }
        for row in jsonl::rows(&text).map_err(|e| malformed(line, e.to_string()))? {
            rec.add(row).map_err(|m| malformed(line, m.to_string()))?;
        }
    }
    if rec.gpus.is_empty() && rec.workloads.is_empty() {
        return Err(RecordingError::Empty {
            path: path.to_owned(),
        });
    }
    Ok(rec)
}

/// Parses a CSV recording. A last row without its line break was never finished (the writer
/// writes a row and its break together): it is left out and named in `cut_off_line`, so a
/// recording interrupted by a full disk keeps every whole row. Any other bad row is an error.
pub fn parse(input: impl std::io::Read, path: &Path) -> Result<Recording, RecordingError> {
    let mut reader = csv::ReaderBuilder::new()
        .flexible(false)
        .from_reader(RowBound::new(input));
    let malformed = |line: u64, message: String| RecordingError::Malformed {
        path: path.to_owned(),
        line,
        message,
    };
    let too_long = |line: u64| RecordingError::RowTooLong {
        path: path.to_owned(),
        line,
    };
    let header = reader.headers().cloned();
    let header = match header {
        Ok(h) => h,
        Err(_) if reader.get_ref().over() => return Err(too_long(1)),
        Err(e) => return Err(malformed(1, e.to_string())),
    };
    for required in ["unix_ms", "record"] {
        if !header.iter().any(|h| h == required) {
            return Err(RecordingError::NotARecording {
                path: path.to_owned(),
                column: required,
            });
        }
    }
    let mut rec = Recording::default();
    // One row of lookahead: a row is added once the next one is read, so the last one can be
    // told apart.
    let mut held: Option<Result<(u64, Row), (u64, String)>> = None;
    let mut record = csv::StringRecord::new();
    let mut index = 0u64;
    loop {
        index += 1;
        let fallback_line = index + 1;
        reader.get_mut().row_ended();
        let read = reader.read_record(&mut record);
        if reader.get_ref().over() {
            return Err(too_long(reader.position().line()));
        }
        let next = match read {
            Ok(false) => None,
            Ok(true) => {
                let line = record.position().map_or(fallback_line, csv::Position::line);
                Some(
                    Row::from_cells(header.iter().zip(record.iter()))
                        .map(|row| (line, row))
                        .map_err(|bad| (line, bad.to_string())),
                )
            }
            Err(e) => Some(Err((
                e.position().map_or(fallback_line, csv::Position::line),
                e.to_string(),
            ))),
        };
        let Some(next) = next else { break };
        if let Some(row) = held.replace(next) {
            rec.add_parsed(row, &malformed)?;
        }
    }
    if let Some(row) = held {
        if reader.get_ref().last == Some(b'\n') {
            rec.add_parsed(row, &malformed)?;
        } else {
            rec.cut_off_line = Some(match row {
                Ok((line, _)) | Err((line, _)) => line,
            });
        }
    }
    if rec.gpus.is_empty() && rec.workloads.is_empty() {
        return Err(RecordingError::Empty {
            path: path.to_owned(),
        });
    }
    Ok(rec)
}

/// A row that lacks a column its record needs: which one.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct IncompleteRow(&'static str);

impl Recording {
    /// Adds a row read from line `line`, or the error that line gave.
    fn add_parsed(
        &mut self,
        row: Result<(u64, Row), (u64, String)>,
        malformed: &impl Fn(u64, String) -> RecordingError,
    ) -> Result<(), RecordingError> {
        let (line, row) = row.map_err(|(line, m)| malformed(line, m))?;
        self.add(row).map_err(|m| malformed(line, m.to_string()))
    }

    /// Adds one row to its series; what is wrong with it otherwise.
    fn add(&mut self, row: Row) -> Result<(), IncompleteRow> {
        let unix_ms = row
            .unix_ms
            .ok_or(IncompleteRow("column unix_ms is empty"))? as u64;
        if self.first_ms == 0 || unix_ms < self.first_ms {
            self.first_ms = unix_ms;
        }
        self.last_ms = self.last_ms.max(unix_ms);
        match row.record.ok_or(IncompleteRow("column record is empty"))? {
            Record::Gpu => {
                let index = *row
                    .gpu_index
                    .first()
                    .ok_or(IncompleteRow("a gpu row without gpu_index"))?;
                let series = self.gpus.entry(index).or_default();
                series.uuid = row.gpu_uuid;
                series.name = row.gpu_name;
                series.samples.push(GpuSample {
                    unix_ms,
                    utilization_percent: row
                        .gpu_busy_fraction
                        .map(|b| b * 100.0)
                        .or(row.utilization_gpu_percent),
                    sm_activity_percent: row.sm_activity_percent,
                    pcie_rx_bytes_per_second: row.pcie_rx_bytes_per_second,
                    pcie_tx_bytes_per_second: row.pcie_tx_bytes_per_second,
                    memory_used_bytes: row.memory_used_bytes,
                    memory_total_bytes: row.memory_total_bytes,
                    temperature_celsius: row.temperature_celsius,
                    power_watts: row.power_watts,
                    energy_joules: row.energy_joules,
                });
            }
            Record::Workload => {
                let series = self.workloads.entry(row.workload_id.clone()).or_default();
                series.id = row.workload_id;
                series.name = row.workload_name;
                series.image = row.image;
                series.compose_service = row.compose_service;
                series.pod = row.pod;
                series.samples.push(WorkloadSample {
                    unix_ms,
                    gpus: row.gpu_index,
                    gpu_memory_bytes: row.gpu_memory_bytes.unwrap_or(0.0),
                    gpu_busy_fraction: row.gpu_busy_fraction,
                    sm_activity_percent: row.sm_activity_percent,
                    cpu_cores: row.cpu_cores,
                    memory_bytes: row.memory_bytes,
                    verdict: row.verdict,
                    input_bound_share: row.input_bound_share,
                    host_bound_share: row.host_bound_share,
                    oom_batch_scale: row.oom_batch_scale,
                    straggler_gpu: row.straggler_gpu.map(|g| g as u32),
                    advice: (!row.advice.is_empty()).then_some(row.advice),
                    energy_joules: row.energy_joules,
                    idle_energy_joules: row.idle_energy_joules,
                });
            }
            Record::Alert => self.alerts.push(AlertRow {
                unix_ms,
                rule: row.alert_rule,
                state: row
                    .alert_state
                    .ok_or(IncompleteRow("an alert row without alert_state"))?,
                summary: row.alert_summary,
                gpu: row.gpu_index.first().copied(),
                workload_id: (!row.workload_id.is_empty()).then_some(row.workload_id),
            }),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_last_row_cut_off_by_a_full_disk_is_left_out_and_every_whole_row_kept() {
        let whole = "unix_ms,record,gpu_index,temperature_celsius\n\
                     1000,gpu,0,40\n\
                     2000,gpu,0,41\n";
        // The writer died mid-row: 18 fields of 20 written, no line break.
        for cut in ["3000,gpu,0", "3000,gpu,0,4", "3000,g"] {
            let text = format!("{whole}{cut}");
            let rec = parse(text.as_bytes(), Path::new("r.csv")).expect(cut);
            assert_eq!(rec.cut_off_line, Some(4), "{cut}");
            assert_eq!(rec.gpus[&0].samples.len(), 2, "{cut}");
            assert_eq!(rec.last_ms, 2000);
        }
        let rec = parse(whole.as_bytes(), Path::new("r.csv")).unwrap();
        assert_eq!((rec.cut_off_line, rec.gpus[&0].samples.len()), (None, 2));
        // A bad row that the writer finished is an error, last or not.
        let bad = format!("{whole}3000,gpu,0\n");
        let e = parse(bad.as_bytes(), Path::new("r.csv")).expect_err("short row");
        assert!(e.to_string().starts_with("r.csv: line 4:"), "{e}");
        let bad = whole.replace("1000,gpu,0,40\n", "1000,gpu,0\n");
        let e = parse(bad.as_bytes(), Path::new("r.csv")).expect_err("short row");
        assert!(e.to_string().starts_with("r.csv: line 2:"), "{e}");
    }

    #[test]
    fn a_row_past_the_bound_is_an_error_naming_its_line() {
        use std::io::Read;
        let endless = || std::io::repeat(b'x').take(2 * ROW_MAX_BYTES);
        let header = "unix_ms,record,gpu_index,temperature_celsius\n1000,gpu,0,40\n";
        // A CSV row, a header, a JSON Lines line, each without end.
        let row = parse(header.as_bytes().chain(endless()), Path::new("r.csv"));
        let head = parse(endless(), Path::new("r.csv"));
        let jsonl = "{\"taken_at_unix_ms\": 1000, \"gpus\": []}\n"
            .as_bytes()
            .chain(b"{".chain(endless()));
        let line = parse_jsonl(jsonl, Path::new("r.jsonl"));
        for (got, want) in [
            (row, "r.csv: line 3: a row longer than 32 MiB"),
            (head, "r.csv: line 1: a row longer than 32 MiB"),
            (line, "r.jsonl: line 2: a row longer than 32 MiB"),
        ] {
            let e = got.expect_err(want).to_string();
            assert!(e.starts_with(want), "{e}");
        }
        // Rows of a recording, each under the bound, read however many there are.
        let many = (0..100_000)
            .map(|i| format!("{},gpu,0,40\n", 1000 + i))
            .collect::<String>();
        let rec = parse(format!("{header}{many}").as_bytes(), Path::new("r.csv")).unwrap();
        assert_eq!(rec.gpus[&0].samples.len(), 100_001);
    }

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
        assert_eq!(w.samples[0].verdict, Some(VerdictKind::GpuBound));
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
        let bad = text.replace("docker:x,train,0.5,", "docker:x,train,-0.5,");
        let e = parse(bad.as_bytes(), Path::new("r.csv")).expect_err("negative");
        assert_eq!(
            e.to_string(),
            "r.csv: line 3: column gpu_busy_fraction: \"-0.5\" is negative"
        );
        let e = parse("a,b\n1,2\n".as_bytes(), Path::new("x.csv")).expect_err("foreign CSV");
        assert!(
            e.to_string().contains("not a gpuwatch CSV recording"),
            "{e}"
        );
    }
}
