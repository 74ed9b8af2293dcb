//! CSV recording: one row per sample per GPU and per workload, in one long table with a `record`
//! column, so a spreadsheet or pandas reads it directly (the seed had to bolt timestamps onto
//! `nvidia-smi -lms` output with awk). Empty cells are values that could not be measured.
use crate::snapshot::Snapshot;
use std::fmt::Write;

pub const HEADER: &str = "timestamp,unix_ms,record,gpu_index,gpu_uuid,gpu_name,\
utilization_gpu_percent,memory_used_bytes,memory_total_bytes,temperature_celsius,power_watts,\
power_limit_watts,sm_clock_mhz,clocks_event_reasons,workload_id,workload_name,image,\
compose_service,gpu_memory_bytes,gpu_busy_fraction,cpu_cores,memory_bytes,verdict,\
input_bound_share";

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

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(String::new, |v| v.to_string())
}

/// The rows of one snapshot, each ending in a newline.
pub fn rows(s: &Snapshot) -> String {
    let mut out = String::new();
    let mut row = |cells: &[String]| {
        for (i, c) in cells.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            field(&mut out, c);
        }
        out.push('\n');
    };
    let ts = s.taken_at.clone();
    let ms = s.taken_at_unix_ms.to_string();
    for g in &s.gpus {
        let d = &g.device;
        row(&[
            ts.clone(),
            ms.clone(),
            "gpu".into(),
            d.index.to_string(),
            opt(d.uuid.as_deref()),
            opt(d.name.as_deref()),
            opt(d.utilization_gpu_percent),
            opt(d.memory_used_bytes),
            opt(d.memory_total_bytes),
            opt(d.temperature_celsius),
            opt(d.power_watts),
            opt(d.power_limit_watts),
            opt(d.sm_clock_mhz),
            d.clocks_event_reasons.join("|"),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
        ]);
    }
    for w in &s.workloads {
        let c = w.container.as_ref();
        let mut gpu_index = String::new();
        for (i, g) in w.gpu.per_gpu.iter().enumerate() {
            if i > 0 {
                gpu_index.push('|');
            }
            let _ = write!(gpu_index, "{}", g.index);
        }
        row(&[
            ts.clone(),
            ms.clone(),
            "workload".into(),
            gpu_index,
            String::new(),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
            w.id.to_string(),
            w.name.clone(),
            opt(c.map(|c| c.image.as_str())),
            opt(c.and_then(|c| c.compose_service.as_deref())),
            w.gpu.memory_bytes.to_string(),
            opt(w.gpu.busy_fraction),
            opt(w.cpu.and_then(|c| c.cores)),
            opt(w.memory.map(|m| m.usage_bytes)),
            opt(w.verdict.as_ref().map(|v| v.kind.label())),
            opt(w.verdict.as_ref().and_then(|v| v.input_bound_share)),
        ]);
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
    fn header_and_rows_have_the_same_width() {
        assert_eq!(HEADER.split(',').count(), 24);
    }
}
