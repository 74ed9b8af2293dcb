//! The one-host web page `serve` shows at `/`: the sources, the alerts, the GPUs and every
//! workload holding one with its verdict, evidence and advice, and small charts of the last
//! minutes. One self-contained document: no script, no external asset (it works offline and
//! under a strict Content-Security-Policy); it reloads itself every `refresh`. Built with a
//! template engine that escapes every value by default; tenants' strings are also bounded.
use super::escape::bounded;
use super::published::Published;
use super::recent::Series;
use super::table;
use crate::health::alerts::AlertState;
use crate::model::{SourceState, VerdictKind, Workload};
use maud::{html, Markup, DOCTYPE};
use std::time::Duration;

/// A table cell's characters at most (as the terminal table's).
const CELL_MAX_CHARS: usize = 160;
/// A line of evidence or advice at most (they quote names and labels).
const TEXT_MAX_CHARS: usize = 2000;
/// A chart's size in pixels.
const CHART_W: f64 = 180.0;
const CHART_H: f64 = 36.0;

const STYLE: &str = "body{font-family:sans-serif;max-width:1300px;margin:auto;padding:0 1em}\
table{border-collapse:collapse;margin:.5em 0;display:block;max-width:100%;overflow-x:auto}td,th{border:1px solid #ccc;padding:.25em .5em;\
text-align:left;vertical-align:top}th{background:#f3f3f3}.down{color:#b00}.up{color:#070}\
.workload{border:1px solid #ccc;border-radius:4px;margin:1em 0;padding:.2em 1em}\
.verdict{font-weight:bold;padding:.1em .4em;border-radius:3px}.ok{background:#d9f2d9}\
.problem{background:#ffe2b3}.neutral{background:#eee}.critical{color:#b00}\
svg.spark{background:#fafafa;border:1px solid #ddd}small{color:#555}";

/// An RFC 3339 time as a person reads it: to the second, in UTC (`2026-12-07 21:20:25 UTC`,
/// not `2026-12-07T21:20:25.663284123Z`); anything else as it is.
fn to_the_second(t: &str) -> String {
    match (t.get(..10), t.get(11..19), t.ends_with('Z')) {
        (Some(day), Some(time), true) if t.as_bytes().get(10) == Some(&b'T') => {
            format!("{day} {time} UTC")
        }
        _ => t.to_owned(),
    }
}

/// The page for `p`, reloading itself every `refresh`.
pub fn render(p: &Published, refresh: Duration) -> String {
    let s = &p.snapshot;
    let holders: Vec<&Workload> = s
        .workloads
        .iter()
        .filter(|w| !w.gpu.per_gpu.is_empty() || w.verdict.is_some())
        .collect();
    let page = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                meta http-equiv="refresh" content=(refresh.as_secs().max(1));
                title { "gpuwatch: " (cell(&s.host.hostname)) }
                style { (STYLE) }
            }
            body {
                h1 { "gpuwatch " (env!("CARGO_PKG_VERSION")) " on " (cell(&s.host.hostname)) }
                p {
                    "Last sample " (to_the_second(&s.taken_at)) "; this page reloads every "
                    (refresh.as_secs().max(1)) " s. " (sources(&s.sources))
                }
                (alerts(p))
                h2 { "GPUs" }
                (gpus(p))
                h2 { "Workloads holding a GPU (" (holders.len()) ")" }
                @if holders.is_empty() {
                    p { "None." }
                }
                @for w in &holders {
                    (workload(p, w))
                }
                @let others = s.workloads.len() - holders.len();
                @if others > 0 {
                    p { small { (others) " other workload(s) hold no GPU; "
                        a href="api/v1/containers" { "all of them" } " in the API." } }
                }
                h2 { "Data" }
                p {
                    a href="metrics" { "/metrics" } " (Prometheus) · "
                    a href="api/v1/snapshot" { "/api/v1/snapshot" } " · "
                    a href="api/v1/containers" { "/api/v1/containers" } " · "
                    a href="api/v1/gpus" { "/api/v1/gpus" } " · "
                    a href="api/v1/alerts" { "/api/v1/alerts" }
                }
            }
        }
    };
    page.into_string()
}

fn cell(s: &str) -> String {
    bounded(s, CELL_MAX_CHARS).into_owned()
}

fn text(s: &str) -> String {
    bounded(s, TEXT_MAX_CHARS).into_owned()
}

fn sources(s: &crate::model::Sources) -> Markup {
    let all: [(&str, &SourceState); 4] = [
        ("NVML", &s.nvml),
        ("Docker", &s.docker),
        ("eBPF", &s.ebpf),
        ("CUDA probes", &s.cuda),
    ];
    html! {
        @for (i, (name, st)) in all.iter().enumerate() {
            @if i > 0 { ", " }
            @if st.up {
                span.up { (name) " up" }
            } @else {
                span.down title=(text(&st.detail().unwrap_or_else(|| "down".into()))) { (name) " down" }
            }
        }
        "."
    }
}

fn alerts(p: &Published) -> Markup {
    let active: Vec<_> = p
        .alerts
        .iter()
        .filter(|a| a.state != AlertState::Resolved)
        .collect();
    html! {
        h2 { "Alerts (" (active.len()) ")" }
        @if active.is_empty() {
            p { "None pending or firing." }
        } @else {
            table {
                tr { th { "state" } th { "severity" } th { "rule" } th { "summary" } th { "action" } }
                @for a in &active {
                    tr {
                        td { (a.state.as_str()) }
                        td.critical[a.severity == crate::health::rule::Severity::Critical] {
                            (a.severity.as_str())
                        }
                        td { (a.rule) }
                        td { (text(&a.summary)) }
                        td { (text(&a.action)) }
                    }
                }
            }
        }
    }
}

fn gpus(p: &Published) -> Markup {
    let s = &p.snapshot;
    html! {
        @if s.gpus.is_empty() {
            p { "No GPU seen." }
        } @else {
            table {
                tr {
                    @for c in table::GPU_COLUMNS { th { (c) } }
                    th { "busy, last minutes" }
                }
                @for g in &s.gpus {
                    tr {
                        @for c in table::gpu_row(g) { td { (cell(&c)) } }
                        td { (chart(p.recent.gpu_busy.get(&g.device.index))) }
                    }
                }
            }
        }
    }
}

fn workload(p: &Published, w: &Workload) -> Markup {
    let kind_class = |k: VerdictKind| match k {
        VerdictKind::GpuBound => "ok",
        VerdictKind::Unknown | VerdictKind::Idle => "neutral",
        _ => "problem",
    };
    html! {
        section.workload {
            h3 { (cell(&w.name)) }
            table {
                tr {
                    @for c in table::WORKLOAD_COLUMNS { th { (c) } }
                    th { "busy, last minutes" }
                }
                tr {
                    @for c in table::workload_row(w) { td { (cell(&c)) } }
                    td { (chart(p.recent.workload_busy.get(&w.id))) }
                }
            }
            @if let Some(v) = &w.verdict {
                p {
                    span class={ "verdict " (kind_class(v.kind)) } { (v.kind.label()) }
                    @if v.gpu_busy_fraction.is_finite() {
                        " GPU busy " (format!("{:.0}", v.gpu_busy_fraction * 100.0)) " %"
                    }
                }
                @if !v.evidence.is_empty() {
                    p { "Evidence:" }
                    ul { @for e in &v.evidence { li { (text(e)) } } }
                }
                p.advice { b { "Advice: " } (text(&v.advice)) }
            }
        }
    }
}

/// A small line chart of a 0..1 series over its own time span, broken where a value is unknown.
fn chart(series: Option<&Series>) -> Markup {
    let Some(series) = series.filter(|s| s.len() >= 2) else {
        return html! { small { "after a few rounds" } };
    };
    let (first, last) = match (series.front(), series.back()) {
        (Some(f), Some(l)) if l.0 > f.0 => (f.0, l.0),
        _ => return html! { small { "after a few rounds" } },
    };
    let span = (last - first) as f64;
    let mut lines: Vec<String> = Vec::new();
    let mut current = String::new();
    for &(t, v) in series {
        match v {
            Some(v) => {
                let x = (t - first) as f64 / span * CHART_W;
                let y = (1.0 - v) * (CHART_H - 2.0) + 1.0;
                current.push_str(&format!("{x:.1},{y:.1} "));
            }
            None if !current.is_empty() => lines.push(std::mem::take(&mut current)),
            None => {}
        }
    }
    if !current.is_empty() {
        lines.push(current);
    }
    let latest = series.back().and_then(|p| p.1);
    let minutes = span / 60_000.0;
    html! {
        svg.spark xmlns="http://www.w3.org/2000/svg" width=(CHART_W) height=(CHART_H)
            viewBox={ "0 0 " (CHART_W) " " (CHART_H) } role="img" {
            title {
                "busy share over the last " (format!("{minutes:.1}")) " min"
                @if let Some(v) = latest { "; now " (format!("{:.0}", v * 100.0)) " %" }
            }
            @for l in &lines {
                polyline points=(l.trim_end()) fill="none" stroke="#2a6fdb" stroke-width="1.5";
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::{container, gpu, snapshot, verdict};
    use crate::model::WorkloadGpuShare;
    use crate::output::recent::Recent;

    fn published(w: Workload) -> Published {
        let mut recent = Recent::default();
        let mut snap = snapshot(0, vec![gpu(0)], vec![w.clone()]);
        for t in [1_000, 2_000, 3_000] {
            snap = snapshot(t, vec![gpu(0)], vec![w.clone()]);
            recent.add(&snap);
        }
        Published {
            snapshot: snap,
            alerts: Vec::new(),
            xid_totals: Default::default(),
            accounting: Default::default(),
            recent,
        }
    }

    fn holder(name: &str) -> Workload {
        let mut w = container(name);
        let mut share = WorkloadGpuShare::new(0, None);
        share.busy_fraction = Some(0.3);
        w.gpu.per_gpu = vec![share];
        let mut v = verdict(VerdictKind::InputBoundIo, "cache the dataset in RAM");
        v.evidence = vec!["loader blocked 70 % of the window".into()];
        v.gpu_busy_fraction = 0.3;
        w.verdict = Some(v);
        w
    }

    #[test]
    fn shows_the_verdict_evidence_advice_and_charts() {
        let page = render(&published(holder("train-a")), Duration::from_secs(5));
        assert!(page.starts_with("<!DOCTYPE html>"), "{page}");
        assert!(page.contains("content=\"5\""), "{page}");
        for want in [
            "train-a",
            "input-bound: I/O",
            "loader blocked 70 % of the window",
            "cache the dataset in RAM",
            "verdict problem",
        ] {
            assert!(page.contains(want), "{want} missing from {page}");
        }
        // One chart per GPU and per holder, each a line through the three rounds.
        assert_eq!(page.matches("<polyline").count(), 2, "{page}");
        assert!(page.contains("points=\"0.0,"), "{page}");
        assert!(!page.contains("<script"), "{page}");
    }

    /// A phone or a narrow window scales the page to its width, a wide table scrolls inside
    /// itself, and the time is to the second.
    #[test]
    fn fits_a_narrow_window_and_shows_the_time_to_the_second() {
        let mut p = published(holder("train-a"));
        p.snapshot.taken_at = "2026-12-07T21:20:25.663284123Z".into();
        let page = render(&p, Duration::from_secs(5));
        assert!(
            page.contains(
                r#"<meta name="viewport" content="width=device-width, initial-scale=1">"#
            ),
            "{page}"
        );
        assert!(page.contains("overflow-x:auto"), "{page}");
        assert!(
            page.contains("Last sample 2026-12-07 21:20:25 UTC;"),
            "{page}"
        );
        assert_eq!(to_the_second("now"), "now");
    }

    #[test]
    fn tenants_strings_are_escaped_and_bounded() {
        let mut w = holder("<script>alert(1)</script>\"'&");
        w.name.push_str(&"x".repeat(1 << 20));
        if let Some(v) = &mut w.verdict {
            v.advice = "<img src=x onerror=alert(1)>".into();
        }
        let page = render(&published(w), Duration::from_secs(5));
        assert!(!page.contains("<script>alert"), "a tenant's tag survived");
        assert!(!page.contains("<img"), "a tenant's tag survived");
        assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;&quot;'&amp;"));
        assert!(page.len() < 40_000, "{} bytes", page.len());
    }

    #[test]
    fn an_unknown_point_breaks_the_line() {
        let s: Series = [
            (0, Some(0.5)),
            (1000, None),
            (2000, Some(1.0)),
            (3000, Some(0.0)),
        ]
        .into_iter()
        .collect();
        let svg = chart(Some(&s)).into_string();
        assert_eq!(svg.matches("<polyline").count(), 2, "{svg}");
        assert!(svg.contains("points=\"0.0,18.0\""), "{svg}");
        assert!(svg.contains("points=\"120.0,1.0 180.0,35.0\""), "{svg}");
        assert!(svg.contains("now 0 %"), "{svg}");
    }
}
