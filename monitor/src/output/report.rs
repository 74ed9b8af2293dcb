//! `gpuwatch report`: a recording's summary ([`crate::recording::summary`]) rendered as
//! Markdown (with the PNG charts beside it) or one self-contained HTML page (charts inlined as
//! SVG); JSON is the summary itself.
use super::escape::markdown as md;
use crate::recording::summary::*;
use crate::units::GIB_F64 as GIB;
use std::collections::BTreeMap;
use std::fmt::Write;

/// The key the chart callbacks get for the chart of GPU-hours held by cause (a space: no
/// container or GPU key has one).
pub const HELD_CHART: &str = "GPU-hours by cause";

/// The host's totals in one sentence.
fn host_line(t: &HostTotals) -> String {
    let idle: f64 = t.idle_gpu_hours.values().sum();
    let worst = t
        .idle_gpu_hours
        .iter()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(k, h)| format!(", most under {k} ({h:.3} h)"))
        .unwrap_or_default();
    let energy = t
        .energy_kwh
        .map(|e| {
            let idle: f64 = t.idle_energy_kwh.values().sum();
            format!(" Energy {}, {} of it while idle.", energy(e), energy(idle))
        })
        .unwrap_or_default();
    let cost = t
        .cost
        .as_ref()
        .map(|k| {
            format!(
                " Cost {:.2} {}, {:.2} of it idle.",
                k.held, k.currency, k.idle
            )
        })
        .unwrap_or_default();
    format!(
        "All containers: {:.3} GPU-hours held, {:.3} busy, {idle:.3} idle{worst}.{energy}{cost}",
        t.gpu_hours, t.busy_gpu_hours
    )
}

fn energy_text(c: &ContainerSummary) -> String {
    let Some(total) = c.energy_kwh else {
        return String::new();
    };
    let idle: Vec<String> = c
        .idle_energy_kwh
        .iter()
        .map(|(k, e)| format!("{k} {}", energy(*e)))
        .collect();
    format!(
        "{}; idle: {}",
        energy(total),
        if idle.is_empty() {
            "none".to_owned()
        } else {
            idle.join(", ")
        }
    )
}

/// Energy in a unit that shows it: kWh from 0.1 kWh, Wh below (a short run's "0.000 kWh"
/// says nothing).
fn energy(kwh: f64) -> String {
    let wh = kwh * 1000.0;
    if kwh >= 0.1 {
        format!("{kwh:.3} kWh")
    } else if wh >= 10.0 {
        format!("{wh:.0} Wh")
    } else {
        format!("{wh:.1} Wh")
    }
}

/// The idle GPU-hours by cause, largest first, leaving out the causes too small to show at
/// three decimals (a window of warm-up read "GPU-bound 0.000").
fn idle_by_cause(idle: &std::collections::BTreeMap<String, f64>) -> String {
    let mut parts: Vec<(&String, &f64)> = idle.iter().filter(|(_, h)| **h >= 0.0005).collect();
    parts.sort_by(|a, b| b.1.total_cmp(a.1));
    if parts.is_empty() {
        let total: f64 = idle.values().sum();
        return if total > 0.0 {
            "under 0.001".into()
        } else {
            "none".into()
        };
    }
    parts
        .iter()
        .map(|(k, h)| format!("{k} {h:.3}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn pct(v: Option<f64>) -> String {
    v.map_or("–".into(), |v| format!("{:.0}%", v * 100.0))
}

fn opt(v: Option<f64>, unit: &str, digits: usize) -> String {
    v.map_or("–".into(), |v| format!("{v:.digits$}{unit}"))
}

/// A GPU's mean PCIe traffic each way, GB/s (`-` when the recording has none).
fn pcie_text(g: &GpuSummary) -> String {
    match (
        g.mean_pcie_rx_bytes_per_second,
        g.mean_pcie_tx_bytes_per_second,
    ) {
        (Some(rx), Some(tx)) => format!("{:.2} / {:.2} GB/s", rx / 1e9, tx / 1e9),
        _ => "-".to_owned(),
    }
}

fn alerts_text(a: &BTreeMap<String, AlertCount>) -> String {
    if a.is_empty() {
        return "none".into();
    }
    a.iter()
        .map(|(rule, c)| format!("{rule} ×{} ({} resolved)", c.fired, c.resolved))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The rows of a container's table, in the order both renderings show them.
fn container_rows(c: &ContainerSummary) -> Vec<(&'static str, String)> {
    vec![
        ("image", c.image.clone()),
        ("compose service", c.compose_service.clone()),
        ("pod", c.pod.clone()),
        (
            "span",
            format!(
                "{} → {} ({:.0} s, {} samples)",
                c.first_seen, c.last_seen, c.duration_seconds, c.samples
            ),
        ),
        (
            "GPUs",
            c.gpus
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        ),
        ("GPU-hours", format!("{:.3}", c.gpu_hours)),
        (
            "GPU-hours busy / idle by cause",
            format!(
                "{:.3} busy; idle: {}",
                c.busy_gpu_hours,
                idle_by_cause(&c.idle_gpu_hours)
            ),
        ),
        ("energy (its part of its GPUs')", energy_text(c)),
        (
            "cost (held / of it idle)",
            c.cost.as_ref().map_or(String::new(), |k| {
                format!("{:.2} / {:.2} {}", k.held, k.idle, k.currency)
            }),
        ),
        (
            "GPU memory",
            format!(
                "mean {:.2} GiB, peak {:.2} GiB",
                c.mean_gpu_memory_bytes / GIB,
                c.peak_gpu_memory_bytes / GIB
            ),
        ),
        (
            "GPU busy",
            c.gpu_busy.as_ref().map_or("–".into(), |d| {
                format!(
                    "mean {}, p10 {}, p50 {}, p90 {}, max {}",
                    pct(Some(d.mean)),
                    pct(Some(d.p10)),
                    pct(Some(d.p50)),
                    pct(Some(d.p90)),
                    pct(Some(d.max))
                )
            }),
        ),
        (
            "time at GPU busy 0–20 / 20–40 / 40–60 / 60–80 / 80–100 %",
            c.gpu_busy_histogram
                .iter()
                .map(|h| format!("{:.0}%", h * 100.0))
                .collect::<Vec<_>>()
                .join(" / "),
        ),
        (
            "verdict",
            c.main_verdict.clone().map_or("–".into(), |v| {
                format!(
                    "{v} ({})",
                    c.verdicts
                        .iter()
                        .map(|(k, s)| format!("{k} {:.0}%", s * 100.0))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }),
        ),
        ("input-bound share (mean)", pct(c.mean_input_bound_share)),
        (
            "removing the main bottleneck would make steps",
            c.speedup.map_or(String::new(), |g| {
                format!("{:.1}× as fast ({:.1}–{:.1}×)", g.likely, g.low, g.high)
            }),
        ),
        (
            "SMs busy while its kernels ran (mean)",
            opt(c.mean_sm_activity_percent, "%", 0),
        ),
        ("CPU cores (mean)", opt(c.mean_cpu_cores, "", 2)),
        (
            "host memory (peak)",
            opt(c.peak_memory_bytes.map(|b| b / GIB), " GiB", 2),
        ),
        (
            "OOM headroom (batch can grow ×)",
            opt(c.min_oom_batch_scale, "", 2),
        ),
        (
            "straggler (the rank the others waited for)",
            c.straggler.as_ref().map_or("–".into(), |s| {
                format!(
                    "GPU {} in {:.0}% of samples",
                    s.gpu,
                    s.share_of_samples * 100.0
                )
            }),
        ),
        ("alerts", alerts_text(&c.alerts)),
        ("advice", c.advice.clone().unwrap_or_default()),
    ]
}

/// One line per finding: the container, its idle GPU-hours of those held, the main cause, and
/// the advice.
fn finding_lines(r: &Report) -> Vec<String> {
    r.findings
        .iter()
        .map(|f| {
            let cost = f
                .idle_cost
                .map(|c| format!(" The idle time cost {c:.2} {}.", r.currency))
                .unwrap_or_default();
            format!(
                "{}: {:.3} of {:.3} GPU-hours held idle ({:.0}%), most under {} ({:.3} h).{cost}{}",
                f.name,
                f.idle_gpu_hours,
                f.held_gpu_hours,
                f.idle_gpu_hours / f.held_gpu_hours * 100.0,
                f.cause,
                f.cause_gpu_hours,
                f.advice
                    .as_ref()
                    .map(|a| format!(" {a}"))
                    .unwrap_or_default()
            )
        })
        .collect()
}

/// Markdown, every name and value escaped (they are the tenants'); `chart` gives the chart file for a container name or GPU (`gpu0`), if drawn.
pub fn markdown(r: &Report, chart: &dyn Fn(&str) -> Option<String>) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "# gpuwatch report: {}\n", md(&r.recording));
    let _ = writeln!(
        o,
        "{} → {} ({:.0} s), {} GPU(s), {} container(s) on GPUs.\n",
        r.started_at,
        r.ended_at,
        r.duration_seconds,
        r.gpus.len(),
        r.containers.len()
    );
    let _ = writeln!(o, "## Findings\n");
    // The operator's currency is in it: escaped like the tenants' strings.
    let _ = writeln!(o, "{}\n", md(&host_line(&r.host)));
    let lines = finding_lines(r);
    if lines.is_empty() {
        let _ = writeln!(
            o,
            "No container held its GPUs idle a fifth of the time or more.\n"
        );
    }
    for l in &lines {
        let _ = writeln!(o, "- {}", md(l));
    }
    if !lines.is_empty() {
        o.push('\n');
    }
    if let Some(file) = chart(HELD_CHART) {
        let _ = writeln!(o, "![GPU-hours held, busy and idle by cause]({file})\n");
    }
    let _ = writeln!(o, "## Containers\n");
    for c in &r.containers {
        let _ = writeln!(o, "### {}\n", md(&c.name));
        let _ = writeln!(o, "| | |\n|---|---|");
        let rows = container_rows(c);
        for (k, v) in rows {
            if !v.is_empty() {
                let _ = writeln!(o, "| {k} | {} |", md(&v));
            }
        }
        if let Some(file) = chart(&c.name) {
            let _ = writeln!(o, "\n![{}]({file})", md(&c.name));
        }
        o.push('\n');
    }
    let _ = writeln!(o, "## GPUs\n");
    let _ = writeln!(
        o,
        "| GPU | name | mean busy | mean SM activity | mean PCIe in / out | mean / peak temperature | peak memory | energy | alerts |\n|---|---|---|---|---|---|---|---|---|"
    );
    for g in &r.gpus {
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} / {} | {} | {} | {} |",
            g.index,
            md(&g.name),
            opt(g.mean_utilization_percent, "%", 0),
            opt(g.mean_sm_activity_percent, "%", 0),
            pcie_text(g),
            opt(g.mean_temperature_celsius, " °C", 0),
            opt(g.peak_temperature_celsius, " °C", 0),
            opt(g.peak_memory_percent, "%", 1),
            g.energy_kwh.map_or("–".into(), energy),
            md(&alerts_text(&g.alerts))
        );
    }
    for g in &r.gpus {
        if let Some(file) = chart(&format!("gpu{}", g.index)) {
            let _ = writeln!(o, "\n![GPU {}]({file})", g.index);
        }
    }
    o
}

/// One self-contained HTML page: the Markdown's content, with each chart's SVG inlined. Built
/// with a template engine that escapes every value; the charts are plotters' SVG, whose text
/// (container names among it) plotters escapes itself.
pub fn html(r: &Report, svg: &dyn Fn(&str) -> Option<String>) -> String {
    use maud::{html, PreEscaped, DOCTYPE};
    let chart = |key: &str| {
        html! {
            @if let Some(s) = svg(key) {
                div.chart { (PreEscaped(s)) }
            }
        }
    };
    let lines = finding_lines(r);
    let page = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { "gpuwatch report" }
                style {
                    "body{font-family:sans-serif;max-width:1250px;margin:auto;padding:1em}\
                     table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;\
                     padding:.3em .6em;text-align:left}.chart svg{max-width:100%;height:auto}"
                }
            }
            body {
                h1 { "gpuwatch report: " (r.recording) }
                p {
                    (r.started_at) " → " (r.ended_at) " (" (format!("{:.0}", r.duration_seconds))
                    " s), " (r.gpus.len()) " GPU(s), " (r.containers.len()) " container(s) on GPUs."
                }
                h2 { "Findings" }
                p { (host_line(&r.host)) }
                @if lines.is_empty() {
                    p { "No container held its GPUs idle a fifth of the time or more." }
                } @else {
                    ul { @for l in &lines { li { (l) } } }
                }
                (chart(HELD_CHART))
                h2 { "Containers" }
                @for c in &r.containers {
                    h3 { (c.name) }
                    table {
                        @for (k, v) in container_rows(c) {
                            @if !v.is_empty() { tr { th { (k) } td { (v) } } }
                        }
                    }
                    (chart(&c.name))
                }
                h2 { "GPUs" }
                table {
                    tr {
                        th { "GPU" } th { "name" } th { "mean busy" } th { "mean SM activity" }
                        th { "mean PCIe in / out" } th { "peak temperature" } th { "peak memory" }
                        th { "energy" } th { "alerts" }
                    }
                    @for g in &r.gpus {
                        tr {
                            td { (g.index) }
                            td { (g.name) }
                            td { (opt(g.mean_utilization_percent, "%", 0)) }
                            td { (opt(g.mean_sm_activity_percent, "%", 0)) }
                            td { (pcie_text(g)) }
                            td { (opt(g.peak_temperature_celsius, " °C", 0)) }
                            td { (opt(g.peak_memory_percent, "%", 1)) }
                            td { (g.energy_kwh.map_or("–".into(), energy)) }
                            td { (alerts_text(&g.alerts)) }
                        }
                    }
                }
                @for g in &r.gpus {
                    (chart(&format!("gpu{}", g.index)))
                }
            }
        }
    };
    page.into_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::alerts::AlertState;
    use crate::model::VerdictKind;
    use crate::recording::summary::straggler;
    use crate::recording::{AlertRow, Recording, WorkloadSample, WorkloadSeries};

    #[test]
    fn the_straggler_is_the_gpu_named_in_most_samples() {
        let sample = |g: Option<u32>| WorkloadSample {
            straggler_gpu: g,
            ..Default::default()
        };
        let s = [
            sample(Some(1)),
            sample(Some(1)),
            sample(Some(0)),
            sample(None),
        ];
        assert_eq!(
            straggler(&s),
            Some(StragglerShare {
                gpu: 1,
                share_of_samples: 0.5
            })
        );
        assert_eq!(straggler(&[sample(None)]), None);
    }

    #[test]
    fn gpu_hours_distribution_and_verdict_shares() {
        let mut rec = Recording {
            first_ms: 0,
            last_ms: 9_000,
            ..Default::default()
        };
        let samples = (0..10u64)
            .map(|i| WorkloadSample {
                unix_ms: i * 1000,
                gpus: vec![0, 1],
                gpu_memory_bytes: (i as f64 + 1.0) * GIB,
                gpu_busy_fraction: Some(if i < 5 { 0.1 } else { 0.9 }),
                verdict: Some(if i < 5 {
                    VerdictKind::InputBoundIo
                } else {
                    VerdictKind::GpuBound
                }),
                input_bound_share: Some(if i < 5 { 0.8 } else { 0.0 }),
                ..Default::default()
            })
            .collect();
        rec.workloads.insert(
            "docker:x".into(),
            WorkloadSeries {
                id: "docker:x".into(),
                name: "train".into(),
                samples,
                ..Default::default()
            },
        );
        rec.alerts.push(AlertRow {
            unix_ms: 3000,
            rule: "gpu_underutilized".into(),
            state: AlertState::Firing,
            summary: String::new(),
            gpu: None,
            workload_id: Some("docker:x".into()),
        });
        let r = summarise(&rec, "run.csv", &Prices::default());
        let c = &r.containers[0];
        // 10 samples × 1 s × 2 GPUs = 20 GPU-seconds.
        assert!((c.gpu_hours - 20.0 / 3600.0).abs() < 1e-9);
        assert_eq!(c.peak_gpu_memory_bytes, 10.0 * GIB);
        assert_eq!(c.gpu_busy_histogram, [0.5, 0.0, 0.0, 0.0, 0.5]);
        assert!((c.verdicts["GPU-bound"] - 0.5).abs() < 1e-9);
        assert!((c.mean_input_bound_share.unwrap() - 0.4).abs() < 1e-9);
        assert_eq!(c.alerts["gpu_underutilized"].fired, 1);
        let md = markdown(&r, &|n| {
            (n == "train").then(|| "plots/container-train.png".into())
        });
        assert!(md.contains("| GPU-hours | 0.006 |"), "{md}");
        assert!(md.contains("![train](plots/container-train.png)"));
        let page = html(&r, &|_| Some("<svg></svg>".into()));
        assert!(page.contains("<h3>train</h3>") && page.contains("<svg></svg>"));
    }

    #[test]
    fn idle_gpu_hours_by_cause_and_the_findings_worst_first() {
        // An hour at 1 Hz on two GPUs: the first half input-bound at 10 % busy (the advice
        // written where the verdict changed), the second GPU-bound at 90 %.
        let mut rec = Recording::default();
        let job = |name: &str, input_bound: bool| {
            let samples: Vec<WorkloadSample> = (0..3600u64)
                .map(|i| {
                    let io = input_bound && i < 1800;
                    WorkloadSample {
                        unix_ms: i * 1000,
                        gpus: vec![0, 1],
                        gpu_busy_fraction: Some(if io { 0.1 } else { 0.9 }),
                        verdict: Some(if io {
                            VerdictKind::InputBoundIo
                        } else {
                            VerdictKind::GpuBound
                        }),
                        advice: (i == 0 || i == 1800).then(|| format!("advice {i}")),
                        ..Default::default()
                    }
                })
                .collect();
            WorkloadSeries {
                id: format!("docker:{name}"),
                name: name.into(),
                samples,
                ..Default::default()
            }
        };
        rec.workloads
            .insert("docker:a".into(), job("loader-bound", true));
        rec.workloads.insert("docker:b".into(), job("busy", false));
        let r = summarise(&rec, "run.csv", &Prices::default());
        let c = r
            .containers
            .iter()
            .find(|c| c.name == "loader-bound")
            .unwrap();
        // 2 GPUs × 0.5 h × 0.9 idle = 0.9 input-bound; 2 × 0.5 × 0.1 = 0.1 GPU-bound.
        assert!((c.idle_gpu_hours["input-bound: I/O"] - 0.9).abs() < 1e-9);
        assert!((c.idle_gpu_hours["GPU-bound"] - 0.1).abs() < 1e-9);
        assert!((c.busy_gpu_hours - 1.0).abs() < 1e-9);
        let sum: f64 = c.idle_gpu_hours.values().sum::<f64>() + c.busy_gpu_hours;
        assert!((sum - c.gpu_hours).abs() < 1e-9, "busy + idle = held");
        // The finding quotes the advice of its cause.
        assert_eq!(r.findings.len(), 1, "{:?}", r.findings);
        let f = &r.findings[0];
        assert_eq!(
            (f.name.as_str(), f.cause.as_str()),
            ("loader-bound", "input-bound: I/O")
        );
        assert_eq!(f.advice.as_deref(), Some("advice 0"));
        let md = markdown(&r, &|_| None);
        let at = md.find("## Findings").unwrap();
        assert!(at < md.find("## Containers").unwrap());
        assert!(
            md.contains("- loader-bound: 1.000 of 2.000 GPU-hours held idle (50%), most under input-bound: I/O (0.900 h)."),
            "{md}"
        );
        // The busy one idled 10 %: below the findings' fifth.
        assert!(!md[at..md.find("## Containers").unwrap()].contains("busy:"));
    }

    #[test]
    fn a_gpus_mean_pcie_traffic_is_in_the_report() {
        let mut rec = Recording::default();
        // The H100's pageable-copy step, one second at 5.07 GB/s in, then one idle
        rec.gpus.insert(
            0,
            crate::recording::GpuSeries {
                samples: [(5.07e9, 0.32e9), (0.001e9, 0.0)]
                    .map(|(rx, tx)| crate::recording::GpuSample {
                        pcie_rx_bytes_per_second: Some(rx),
                        pcie_tx_bytes_per_second: Some(tx),
                        ..Default::default()
                    })
                    .to_vec(),
                ..Default::default()
            },
        );
        let r = summarise(&rec, "run.csv", &Prices::default());
        let md = markdown(&r, &|_| None);
        assert!(md.contains("| 2.54 / 0.16 GB/s |"), "{md}");
        assert!(html(&r, &|_| None).contains("<td>2.54 / 0.16 GB/s</td>"));
    }

    #[test]
    fn energy_in_kwh_by_cause_and_its_cost_at_the_configs_prices() {
        // An hour at 1 Hz on one GPU drawing 360 W: 0.36 kWh. The job holds it alone; the first
        // half input-bound at 25 % busy, the second GPU-bound at 100 %.
        let mut rec = Recording::default();
        let samples: Vec<WorkloadSample> = (0..3600u64)
            .map(|i| {
                let io = i < 1800;
                let busy = if io { 0.25 } else { 1.0 };
                WorkloadSample {
                    unix_ms: i * 1000,
                    gpus: vec![0],
                    gpu_busy_fraction: Some(busy),
                    verdict: Some(if io {
                        VerdictKind::InputBoundIo
                    } else {
                        VerdictKind::GpuBound
                    }),
                    energy_joules: Some(360.0),
                    idle_energy_joules: Some(360.0 * (1.0 - busy)),
                    ..Default::default()
                }
            })
            .collect();
        rec.workloads.insert(
            "docker:t".into(),
            WorkloadSeries {
                id: "docker:t".into(),
                name: "t".into(),
                samples,
                ..Default::default()
            },
        );
        rec.gpus.insert(
            0,
            crate::recording::GpuSeries {
                samples: (0..3600u64)
                    .map(|i| crate::recording::GpuSample {
                        unix_ms: i * 1000,
                        energy_joules: Some(360.0),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            },
        );
        let prices = Prices {
            per_gpu_hour: Some(2.0),
            per_kwh: Some(0.5),
            currency: "EUR".into(),
        };
        let r = summarise(&rec, "run.csv", &prices);
        assert!((r.gpus[0].energy_kwh.unwrap() - 0.36).abs() < 1e-9);
        let c = &r.containers[0];
        assert!((c.energy_kwh.unwrap() - 0.36).abs() < 1e-9);
        // Idle: 1800 s × 0.75 × 360 W = 0.135 kWh, all input-bound.
        assert!((c.idle_energy_kwh["input-bound: I/O"] - 0.135).abs() < 1e-9);
        assert!(!c.idle_energy_kwh.contains_key("GPU-bound"));
        // Held: 1 GPU-hour × 2 + 0.36 kWh × 0.5; idle: 0.375 GPU-hours × 2 + 0.135 × 0.5.
        let cost = c.cost.as_ref().unwrap();
        assert!((cost.held - 2.18).abs() < 1e-9, "{cost:?}");
        assert!((cost.idle - 0.8175).abs() < 1e-9, "{cost:?}");
        let md = markdown(&r, &|_| None);
        assert!(md.contains("The idle time cost 0.82 EUR."), "{md}");
        assert!(
            md.contains("All containers: 1.000 GPU-hours held, 0.625 busy, 0.375 idle, most under input-bound: I/O (0.375 h). Energy 0.360 kWh, 0.135 kWh of it while idle. Cost 2.18 EUR, 0.82 of it idle."),
            "{md}"
        );
        assert!(
            md.contains("0.360 kWh; idle: input-bound: I/O 0.135 kWh"),
            "{md}"
        );
        // A short run's energy in Wh, not "0.000 kWh"; idle causes too small to show left out.
        assert_eq!(energy(0.0004), "0.4 Wh");
        assert_eq!(energy(0.027), "27 Wh");
        let idle = std::collections::BTreeMap::from([
            ("GPU-bound".to_owned(), 0.0001),
            ("input-bound: I/O".to_owned(), 0.002),
            ("unknown".to_owned(), 0.004),
        ]);
        assert_eq!(
            idle_by_cause(&idle),
            "unknown 0.004, input-bound: I/O 0.002"
        );
        let warm_up = std::collections::BTreeMap::from([("GPU-bound".to_owned(), 0.0001)]);
        assert_eq!(idle_by_cause(&warm_up), "under 0.001");
        // Without prices, no money anywhere.
        let r = summarise(&rec, "run.csv", &Prices::default());
        assert!(r.containers[0].cost.is_none());
        assert!(!markdown(&r, &|_| None).contains("cost"));
        // The currency is the operator's text: markup and control bytes in it are escaped in
        // every line that carries it.
        let hostile = Prices {
            currency: "<img src=x onerror=alert(1)>|\x1b]0;pwned\x07".into(),
            ..prices
        };
        let md = markdown(&summarise(&rec, "run.csv", &hostile), &|_| None);
        assert!(!md.contains('<') && !md.contains('\x1b'), "{md}");
        assert_eq!(
            md.matches("&lt;img src=x onerror=alert(1)&gt;").count(),
            3,
            "{md}"
        );
    }

    #[test]
    fn the_html_report_escapes_every_tenants_string() {
        let mut rec = Recording::default();
        let hostile = "<script>alert(1)</script>\"'&";
        rec.workloads.insert(
            "docker:h".into(),
            WorkloadSeries {
                id: "docker:h".into(),
                name: hostile.into(),
                image: "<img src=x onerror=alert(2)>".into(),
                samples: (0..10u64)
                    .map(|i| WorkloadSample {
                        unix_ms: i * 1000,
                        gpus: vec![0],
                        gpu_busy_fraction: Some(0.1),
                        verdict: Some(VerdictKind::InputBoundIo),
                        advice: (i == 0).then(|| "<b>cache</b> it".into()),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            },
        );
        let r = summarise(&rec, "<run>.csv", &Prices::default());
        let page = html(&r, &|_| None);
        for raw in ["<script>", "<img", "<b>cache", "<run>"] {
            assert!(!page.contains(raw), "{raw} unescaped in {page}");
        }
        assert!(
            page.contains("&lt;script&gt;alert(1)&lt;/script&gt;&quot;'&amp;"),
            "{page}"
        );
        assert!(page.contains("&lt;b&gt;cache&lt;/b&gt; it"), "{page}");
    }

    #[test]
    fn a_runs_speed_up_comes_from_its_time_weighted_shares() {
        // An I/O-bound job stepping every 2 s, sampled every second: its GPU time falls in
        // every other row (busy 0.04, then 0.0 where a single row would give no estimate).
        let mut rec = Recording::default();
        let samples = (0..20u64)
            .map(|i| WorkloadSample {
                unix_ms: i * 1000,
                gpus: vec![0],
                gpu_busy_fraction: Some(if i % 2 == 0 { 0.04 } else { 0.0 }),
                input_bound_share: Some(if i % 2 == 0 { 0.96 } else { 1.0 }),
                verdict: Some(VerdictKind::InputBoundIo),
                ..Default::default()
            })
            .collect();
        rec.workloads.insert(
            "docker:s".into(),
            WorkloadSeries {
                id: "docker:s".into(),
                name: "s".into(),
                samples,
                ..Default::default()
            },
        );
        let r = summarise(&rec, "run.csv", &Prices::default());
        let g = r.containers[0].speedup.expect("an estimate");
        // Mean busy 0.02, share 0.98: the cause explains the idle time, so 0.75–1 / 0.02.
        assert!((g.likely - 0.875 / 0.02).abs() < 1e-9, "{g:?}");
        assert!(
            (g.low - 37.5).abs() < 1e-9 && (g.high - 50.0).abs() < 1e-9,
            "{g:?}"
        );
        assert!(markdown(&r, &|_| None).contains("43.8× as fast (37.5–50.0×)"));
    }
}
