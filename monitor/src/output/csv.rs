//! CSV recording: one row per sample per GPU and per workload, in one long table with a `record`
//! column, so a spreadsheet or pandas reads it directly (the seed had to bolt timestamps onto
//! `nvidia-smi -lms` output with awk). Empty cells are values that could not be measured.
use super::escape;
use crate::model::Snapshot;

/// The columns, in order.
pub const COLUMNS: [&str; 33] = [
    "timestamp",
    "unix_ms",
    "record",
    "gpu_index",
    "gpu_uuid",
    "gpu_name",
    "utilization_gpu_percent",
    "memory_used_bytes",
    "memory_total_bytes",
    "temperature_celsius",
    "power_watts",
    "power_limit_watts",
    "sm_clock_mhz",
    "clocks_event_reasons",
    "workload_id",
    "workload_name",
    "image",
    "compose_service",
    "pod",
    "gpu_memory_bytes",
    "gpu_busy_fraction",
    "busy_source",
    "busy_split",
    "sm_activity_percent",
    "tensor_activity_percent",
    "cpu_cores",
    "memory_bytes",
    "verdict",
    "input_bound_share",
    "oom_batch_scale",
    "alert_rule",
    "alert_state",
    "alert_summary",
];

/// The header line (without its newline).
pub fn header() -> String {
    COLUMNS.join(",")
}

/// Quotes a field when it needs it (RFC 4180).
fn field(out: &mut String, v: &str) {
    if v.contains([',', '"', '\n', '\r']) {
        out.push('"');
        out.push_str(&v.replace('"', "\"\""));
        out.push('"');
    } else {
        out.push_str(v);
    }
}

/// One row under construction: cells by column name, empty unless set.
struct Row([String; COLUMNS.len()]);

impl Row {
    fn new(timestamp: &str, unix_ms: u64, record: &str) -> Self {
        let mut r = Self(std::array::from_fn(|_| String::new()));
        r.set("timestamp", timestamp);
        r.set("unix_ms", unix_ms);
        r.set("record", record);
        r
    }

    fn set(&mut self, column: &str, value: impl std::fmt::Display) {
        let i = COLUMNS
            .iter()
            .position(|c| *c == column)
            .expect("a column of COLUMNS");
        self.0[i] = value.to_string();
    }

    /// A cell whose text tenants control (names, images, ids, summaries): neutralised for
    /// spreadsheets (see [`escape::spreadsheet`]; the recording reader undoes it).
    fn set_text(&mut self, column: &str, value: &str) {
        self.set(column, escape::spreadsheet(value));
    }

    fn set_opt<T: std::fmt::Display>(&mut self, column: &str, value: Option<T>) {
        if let Some(v) = value {
            self.set(column, v);
        }
    }

    fn write(&self, out: &mut String) {
        for (i, c) in self.0.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            field(out, c);
        }
        out.push('\n');
    }
}

/// The rows of one snapshot, each ending in a newline.
pub fn rows(s: &Snapshot) -> String {
    let mut out = String::new();
    for g in &s.gpus {
        let d = &g.device;
        let mut r = Row::new(&s.taken_at, s.taken_at_unix_ms, "gpu");
        r.set("gpu_index", d.index);
        r.set_opt("gpu_uuid", d.uuid.as_deref());
        if let Some(v) = d.name.as_deref() {
            r.set_text("gpu_name", v);
        }
        r.set_opt("utilization_gpu_percent", d.utilization_gpu_percent);
        r.set_opt("memory_used_bytes", d.memory_used_bytes);
        r.set_opt("memory_total_bytes", d.memory_total_bytes);
        r.set_opt("temperature_celsius", d.temperature_celsius);
        r.set_opt("power_watts", d.power_watts);
        r.set_opt("power_limit_watts", d.power_limit_watts);
        r.set_opt("sm_clock_mhz", d.sm_clock_mhz);
        r.set("clocks_event_reasons", d.clocks_event_reasons.join("|"));
        if let Some(b) = g.busy {
            r.set("gpu_busy_fraction", b.fraction);
            r.set("busy_source", serde_label(&b.source));
            r.set("busy_split", serde_label(&b.split));
        }
        r.set_opt(
            "sm_activity_percent",
            g.sm_activity.and_then(|a| a.sm_percent),
        );
        r.set_opt(
            "tensor_activity_percent",
            g.sm_activity.and_then(|a| a.tensor_percent),
        );
        r.write(&mut out);
    }
    for w in &s.workloads {
        let c = w.container.as_ref();
        let mut r = Row::new(&s.taken_at, s.taken_at_unix_ms, "workload");
        let gpus: Vec<String> = w.gpu.per_gpu.iter().map(|g| g.index.to_string()).collect();
        r.set("gpu_index", gpus.join("|"));
        r.set_text("workload_id", &w.id.to_string());
        r.set_text("workload_name", &w.name);
        if let Some(v) = c.map(|c| c.image.as_str()) {
            r.set_text("image", v);
        }
        if let Some(v) = c.and_then(|c| c.compose_service.as_deref()) {
            r.set_text("compose_service", v);
        }
        if let Some(pod) = c.and_then(|c| c.kubernetes.as_ref()) {
            r.set_text("pod", &pod.to_string());
        }
        r.set("gpu_memory_bytes", w.gpu.memory_bytes);
        r.set_opt("gpu_busy_fraction", w.gpu.busy_fraction);
        // The least exact method among its GPUs: an estimate anywhere makes the row one.
        let split = w
            .gpu
            .per_gpu
            .iter()
            .filter_map(|g| g.split)
            .max_by_key(|m| !m.is_exact());
        r.set_opt("busy_split", split.map(|m| serde_label(&m)));
        r.set_opt(
            "sm_activity_percent",
            w.verdict
                .as_ref()
                .and_then(|v| v.sm_activity_fraction)
                .map(|f| f * 100.0),
        );
        r.set_opt("cpu_cores", w.cpu.and_then(|c| c.cores));
        r.set_opt("memory_bytes", w.memory.map(|m| m.usage_bytes));
        r.set_opt("verdict", w.verdict.as_ref().map(|v| v.kind.label()));
        r.set_opt(
            "input_bound_share",
            w.verdict.as_ref().and_then(|v| v.input_bound_share),
        );
        r.set_opt(
            "oom_batch_scale",
            w.oom_headroom.and_then(|h| h.batch_scale),
        );
        r.write(&mut out);
    }
    out
}

/// The snake_case name serde gives a unit variant (what the JSON says too).
fn serde_label<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// One row per alert transition (firing or resolved), stamped with the snapshot it came from.
pub fn alert_rows(s: &Snapshot, alerts: &[crate::health::alerts::Alert]) -> String {
    let mut out = String::new();
    for a in alerts {
        let mut r = Row::new(&s.taken_at, s.taken_at_unix_ms, "alert");
        r.set_opt("gpu_index", a.subject.gpu.as_ref().map(|g| g.index));
        r.set_opt(
            "gpu_uuid",
            a.subject.gpu.as_ref().and_then(|g| g.uuid.as_deref()),
        );
        if let Some(c) = &a.subject.container {
            r.set_text("workload_id", &c.workload.to_string());
            r.set_text("workload_name", &c.name);
            if let Some(v) = c.image.as_deref() {
                r.set_text("image", v);
            }
            if let Some(v) = c.compose_service.as_deref() {
                r.set_text("compose_service", v);
            }
            if let Some(v) = c.pod.as_deref() {
                r.set_text("pod", v);
            }
        }
        r.set("alert_rule", a.rule);
        r.set("alert_state", a.state);
        r.set_text("alert_summary", &a.summary);
        r.write(&mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_only_what_needs_it() {
        let mut s = String::new();
        field(&mut s, "plain");
        s.push(' ');
        field(&mut s, "a,b");
        s.push(' ');
        field(&mut s, "say \"hi\"");
        assert_eq!(s, "plain \"a,b\" \"say \"\"hi\"\"\"");
    }

    #[test]
    fn every_row_has_every_column() {
        let mut out = String::new();
        let mut r = Row::new("t", 1, "gpu");
        r.set("input_bound_share", 0.5);
        r.write(&mut out);
        assert_eq!(
            out.trim_end().split(',').count(),
            header().split(',').count()
        );
        assert!(out.trim_end().ends_with(",0.5,,,,"), "{out}");
    }
}
