//! The human table of `gpuwatch snapshot`: GPUs, then workloads, then what is degraded.
use super::escape;
use crate::model::Snapshot;
use std::fmt::Write;

/// The most characters a cell shows: a tenant's name, image or label can be a megabyte (Rust's
/// formatter refuses widths past 65,535, and every row would be as wide).
const CELL_MAX_CHARS: usize = 160;

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

fn gib(bytes: u64) -> String {
    format!("{:.2}", crate::units::gib(bytes as f64))
}

/// Left-aligned columns sized to their widest cell, each cell cut to [`CELL_MAX_CHARS`] and
/// escaped for the terminal (names and labels are the tenants').
fn render(header: &[&str], rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            r.iter()
                .map(|c| escape::terminal(&escape::bounded(c, CELL_MAX_CHARS)).into_owned())
                .collect()
        })
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut l = String::new();
        for (c, w) in cells.zip(&widths) {
            let _ = write!(l, "{c:<w$}  ");
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(&mut header.iter().copied());
    for r in &rows {
        line(&mut r.iter().map(String::as_str));
    }
    out
}

/// The GPU table's columns, [`gpu_row`]'s cells.
pub const GPU_COLUMNS: [&str; 10] = [
    "GPU", "NAME", "BUSY%", "SM%", "MEM GiB", "TEMP°C", "POWER W", "SM MHz", "PROCS", "THROTTLE",
];

/// The workload table's columns, [`workload_row`]'s cells.
pub const WORKLOAD_COLUMNS: [&str; 9] = [
    "KIND",
    "NAME",
    "IMAGE",
    "SERVICE",
    "GPU MEM GiB",
    "GPU:BUSY",
    "CPU",
    "MEM GiB",
    "VERDICT",
];

/// The `snapshot` table: GPUs (when NVML is up), then workloads, then what could not be
/// seen.
pub fn render_snapshot(s: &Snapshot) -> String {
    let mut out = String::new();
    if s.sources.nvml.up {
        let rows: Vec<Vec<String>> = s.gpus.iter().map(gpu_row).collect();
        out.push_str(&render(&GPU_COLUMNS, &rows));
        out.push('\n');
    }
    let rows: Vec<Vec<String>> = s.workloads.iter().map(workload_row).collect();
    out.push_str(&render(&WORKLOAD_COLUMNS, &rows));
    render_blind_spots(s, &mut out);
    out
}

/// One GPU's cells, unbounded and unescaped: each view bounds and escapes them its own way.
pub fn gpu_row(g: &crate::model::Gpu) -> Vec<String> {
    let d = &g.device;
    vec![
        d.index.to_string(),
        opt(d.name.clone()),
        if d.lost {
            "LOST".to_owned()
        } else {
            // The window's busy share from the series; `~` marks an instantaneous
            // reading (no series).
            match g.busy {
                Some(b) if b.source == crate::model::BusySource::UtilizationReading => {
                    format!("~{:.0}", b.fraction * 100.0)
                }
                Some(b) => format!("{:.0}", b.fraction * 100.0),
                None => opt(d.utilization_gpu_percent),
            }
        },
        g.sm_activity
            .and_then(|a| a.sm_percent)
            .map_or("-".to_owned(), |v| format!("{v:.0}")),
        match (d.memory_used_bytes, d.memory_total_bytes) {
            (Some(u), Some(t)) => format!("{}/{}", gib(u), gib(t)),
            _ => "-".to_owned(),
        },
        opt(d.temperature_celsius),
        match (d.power_watts, d.power_limit_watts) {
            (Some(p), Some(l)) => format!("{p:.0}/{l:.0}"),
            (Some(p), None) => format!("{p:.0}"),
            _ => "-".to_owned(),
        },
        opt(d.sm_clock_mhz),
        g.processes.len().to_string(),
        if d.clocks_event_reasons.is_empty() {
            "-".to_owned()
        } else {
            d.clocks_event_reasons.join(",")
        },
    ]
}

/// One workload's cells, unbounded and unescaped: each view bounds and escapes them its own way.
pub fn workload_row(w: &crate::model::Workload) -> Vec<String> {
    let c = w.container.as_ref();
    let gpus = if w.gpu.per_gpu.is_empty() {
        "-".to_owned()
    } else {
        w.gpu
            .per_gpu
            .iter()
            .map(|g| match (g.busy_fraction, g.split) {
                (Some(b), Some(m)) if !m.is_exact() => {
                    format!("{}:~{:.0}%", g.index, b * 100.0)
                }
                (Some(b), _) => format!("{}:{:.0}%", g.index, b * 100.0),
                (None, _) => format!("{}:?", g.index),
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    vec![
        w.kind.as_str().to_owned(),
        w.name.clone(),
        c.map_or("-".to_owned(), |c| c.image.clone()),
        c.and_then(|c| {
            c.compose_service
                .clone()
                .or_else(|| c.kubernetes.as_ref().map(|p| format!("pod {p}")))
        })
        .unwrap_or_else(|| "-".to_owned()),
        if w.gpu.processes == 0 {
            "-".to_owned()
        } else {
            gib(w.gpu.memory_bytes)
        },
        gpus,
        w.cpu
            .and_then(|c| c.cores)
            .map_or("-".to_owned(), |c| format!("{c:.2}")),
        w.memory.map_or("-".to_owned(), |m| gib(m.usage_bytes)),
        w.verdict
            .as_ref()
            .map_or("-".to_owned(), |v| match v.input_bound_share {
                Some(share) if share >= 0.005 => {
                    format!("{} ({:.0}% input-bound)", v.kind.label(), share * 100.0)
                }
                _ => v.kind.label().to_owned(),
            }),
    ]
}

/// GPU processes that could not be attributed, and each source that is down or has a note.
fn render_blind_spots(s: &Snapshot, out: &mut String) {
    let vanished = s
        .gpus
        .iter()
        .flat_map(|g| &g.processes)
        .filter(|p| p.vanished)
        .count();
    if vanished > 0 {
        let _ = writeln!(
            out,
            "\n{vanished} GPU process(es) exited before they could be attributed"
        );
    }
    for (name, st) in [
        ("nvml", &s.sources.nvml),
        ("docker", &s.sources.docker),
        ("ebpf", &s.sources.ebpf),
    ] {
        match (st.up, st.detail()) {
            (false, detail) => {
                let detail = detail.unwrap_or_else(|| "unknown".into());
                let _ = writeln!(out, "{name}: down ({})", escape::terminal(&detail));
            }
            (true, Some(d)) => {
                let _ = writeln!(out, "{name}: {}", escape::terminal(&d));
            }
            (true, None) => {}
        }
    }
}

/// The checklist of `gpuwatch doctor`, then the actions for what is not ok.
pub fn render_doctor(r: &crate::health::doctor::Report) -> String {
    let status = |s: crate::health::check::Status| s.as_str().to_uppercase();
    let rows: Vec<Vec<String>> = r
        .checks
        .iter()
        .map(|c| {
            vec![
                status(c.status),
                c.check.to_owned(),
                c.subject.clone(),
                c.value.clone(),
                c.threshold.clone(),
            ]
        })
        .collect();
    let mut out = render(&["STATUS", "CHECK", "SUBJECT", "VALUE", "THRESHOLD"], &rows);
    let todo: Vec<_> = r.checks.iter().filter(|c| !c.action.is_empty()).collect();
    if !todo.is_empty() {
        out.push_str("\nTo do:\n");
        for c in todo {
            let _ = writeln!(
                out,
                "- {} {} ({}): {}",
                status(c.status),
                c.check,
                escape::terminal(&c.subject),
                escape::terminal(&c.action)
            );
        }
    }
    let _ = writeln!(
        out,
        "\n{}: {} checks over {:.0} s ({} samples)",
        status(r.status),
        r.checks.len(),
        r.window_seconds,
        r.samples
    );
    out
}

/// One line per alert transition, for `gpuwatch watch`.
pub fn render_alert_line(a: &crate::health::alerts::Alert) -> String {
    use crate::health::alerts::AlertState;
    let when = match a.state {
        AlertState::Resolved => a.resolved_at.as_deref(),
        _ => a.firing_since.as_deref(),
    }
    .unwrap_or(&a.active_since);
    let mut subject = Vec::new();
    if let Some(g) = &a.subject.gpu {
        subject.push(format!("GPU {}", g.index));
    }
    if let Some(c) = &a.subject.container {
        let mut s = c.name.clone();
        if let Some(svc) = &c.compose_service {
            let _ = write!(s, " [{svc}]");
        }
        if let Some(pod) = &c.pod {
            let _ = write!(s, " [pod {pod}]");
        }
        if let Some(img) = &c.image {
            let _ = write!(s, " ({img})");
        }
        subject.push(s);
    }
    if let Some(pid) = a.subject.pid {
        subject.push(format!("PID {pid}"));
    }
    let state = a.state.as_str().to_uppercase();
    let mut line = format!(
        "{when} {state} {} {} {}: {}",
        a.severity,
        a.rule,
        subject.join(" / "),
        a.summary
    );
    if a.state == AlertState::Firing {
        let _ = write!(line, " — {}", a.action);
    }
    // One transition, one line: a name cannot end it early or forge the next.
    escape::terminal(&line).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::{container, snapshot};

    #[test]
    fn a_megabyte_label_is_cut_in_the_table_not_fatal() {
        // A 1 MiB compose service (any tenant can set one) crashed `snapshot` (a format width
        // past 65,535) and made every row 10,400 characters wide at 10 KiB.
        let mut w = container("trainer");
        let mut info = (**w.container.as_ref().unwrap()).clone();
        info.compose_service = Some("s".repeat(1 << 20));
        w.container = Some(std::sync::Arc::new(info));
        let text = render_snapshot(&snapshot(0, Vec::new(), vec![w]));
        let longest = text.lines().map(|l| l.chars().count()).max().unwrap();
        assert!(longest < 400, "a row of {longest} characters");
        assert!(text.contains(&format!("{}…", "s".repeat(CELL_MAX_CHARS - 1))));
    }
}
