//! `gpuwatch compare`: two recordings of the same jobs, before and after a change (a cached
//! dataset, more workers, pinned copies), side by side per container: how busy it kept its
//! GPUs, what it held them idle on, and its main verdict.
//!
//! Containers are matched by compose service where they have one, else by name. The GPU busy
//! ratio is what the change bought in GPU work per second: for a job whose GPU work per step
//! stays the same, its gain in step rate.
use super::escape::markdown as md;
use crate::recording::summary::{ContainerSummary, Report};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write;

#[derive(Debug, Serialize)]
pub struct Comparison {
    pub before: String,
    pub after: String,
    /// Containers in both recordings, by key.
    pub containers: Vec<Pair>,
    /// Keys of the containers in only one of them.
    pub only_before: Vec<String>,
    pub only_after: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct Pair {
    /// The compose service, or the container name.
    pub key: String,
    pub before: Side,
    pub after: Side,
    /// After's mean GPU busy share over before's, when both are known and before's is not 0.
    pub gpu_busy_ratio: Option<f64>,
}

/// One container in one recording.
#[derive(Debug, Serialize)]
pub struct Side {
    pub name: String,
    pub duration_seconds: f64,
    pub main_verdict: Option<String>,
    /// Mean GPU busy share (0–1).
    pub gpu_busy: Option<f64>,
    /// Of the GPU time it held, the share idle under each verdict (0–1).
    pub idle_share_by_cause: BTreeMap<String, f64>,
}

fn key(c: &ContainerSummary) -> String {
    if c.compose_service.is_empty() {
        c.name.clone()
    } else {
        c.compose_service.clone()
    }
}

fn side(c: &ContainerSummary) -> Side {
    let held = c.busy_gpu_hours + c.idle_gpu_hours.values().sum::<f64>();
    Side {
        name: c.name.clone(),
        duration_seconds: c.duration_seconds,
        main_verdict: c.main_verdict.clone(),
        gpu_busy: c.gpu_busy.as_ref().map(|d| d.mean),
        idle_share_by_cause: c
            .idle_gpu_hours
            .iter()
            .filter(|_| held > 0.0)
            .map(|(k, h)| (k.clone(), h / held))
            .collect(),
    }
}

pub fn compare(before: &Report, after: &Report) -> Comparison {
    let by_key = |r: &Report| -> BTreeMap<String, Side> {
        // A key seen twice (a container restarted under the same name) keeps the longest span.
        let mut m: BTreeMap<String, &ContainerSummary> = BTreeMap::new();
        for c in &r.containers {
            let e = m.entry(key(c)).or_insert(c);
            if c.duration_seconds > e.duration_seconds {
                *e = c;
            }
        }
        m.into_iter().map(|(k, c)| (k, side(c))).collect()
    };
    let (mut a, mut b) = (by_key(before), by_key(after));
    let both: Vec<String> = a.keys().filter(|k| b.contains_key(*k)).cloned().collect();
    let containers = both
        .into_iter()
        .filter_map(|k| {
            let (x, y) = (a.remove(&k)?, b.remove(&k)?);
            let gpu_busy_ratio = x
                .gpu_busy
                .zip(y.gpu_busy)
                .filter(|(x, _)| *x > 0.0)
                .map(|(x, y)| y / x);
            Some(Pair {
                key: k,
                before: x,
                after: y,
                gpu_busy_ratio,
            })
        })
        .collect();
    Comparison {
        before: before.recording.clone(),
        after: after.recording.clone(),
        containers,
        only_before: a.into_keys().collect(),
        only_after: b.into_keys().collect(),
    }
}

fn pct(x: Option<f64>) -> String {
    x.map_or("–".to_owned(), |v| format!("{:.0}%", v * 100.0))
}

/// The idle causes of a side, largest first: "input-bound: I/O 62%, unknown 3%".
fn causes(s: &Side) -> String {
    let mut v: Vec<(&String, &f64)> = s
        .idle_share_by_cause
        .iter()
        .filter(|(_, x)| **x >= 0.005)
        .collect();
    v.sort_by(|a, b| b.1.total_cmp(a.1));
    if v.is_empty() {
        return "–".to_owned();
    }
    v.iter()
        .map(|(k, x)| format!("{} {:.0}%", md(k), **x * 100.0))
        .collect::<Vec<_>>()
        .join(", ")
}

pub fn markdown(c: &Comparison) -> String {
    let mut out = format!(
        "# {} → {}\n\n| container | GPU busy | gain | idle of the GPU time held, by cause | main verdict |\n|---|---|---|---|---|\n",
        md(&c.before),
        md(&c.after)
    );
    for p in &c.containers {
        let _ = writeln!(
            out,
            "| {} | {} → {} | {} | {} → {} | {} → {} |",
            md(&p.key),
            pct(p.before.gpu_busy),
            pct(p.after.gpu_busy),
            p.gpu_busy_ratio
                .map_or("–".to_owned(), |r| format!("{r:.2}×")),
            causes(&p.before),
            causes(&p.after),
            md(p.before.main_verdict.as_deref().unwrap_or("–")),
            md(p.after.main_verdict.as_deref().unwrap_or("–")),
        );
    }
    for (label, keys) in [
        ("Only before", &c.only_before),
        ("Only after", &c.only_after),
    ] {
        if !keys.is_empty() {
            let names: Vec<String> = keys.iter().map(|k| md(k)).collect();
            let _ = writeln!(out, "\n{label}: {}", names.join(", "));
        }
    }
    out.push_str(
        "\nGain: the mean GPU busy share after over before; for a job whose GPU work per step \
         stays the same, its gain in step rate.\n",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::VerdictKind;
    use crate::recording::summary::summarise;
    use crate::recording::{Recording, WorkloadSample, WorkloadSeries};

    /// A recording of `jobs` (name, compose service, busy, verdict), 100 one-second samples on
    /// one GPU each.
    fn recording(jobs: &[(&str, &str, f64, VerdictKind)]) -> Recording {
        let mut rec = Recording {
            first_ms: 0,
            last_ms: 99_000,
            ..Default::default()
        };
        for (name, service, busy, verdict) in jobs {
            let samples = (0..100u64)
                .map(|i| WorkloadSample {
                    unix_ms: i * 1000,
                    gpus: vec![0],
                    gpu_busy_fraction: Some(*busy),
                    verdict: Some(*verdict),
                    ..Default::default()
                })
                .collect();
            let id = format!("docker:{name}");
            rec.workloads.insert(
                id.clone(),
                WorkloadSeries {
                    id,
                    name: (*name).into(),
                    compose_service: (*service).into(),
                    samples,
                    ..Default::default()
                },
            );
        }
        rec
    }

    #[test]
    fn the_same_service_is_matched_across_runs_and_its_gain_is_the_busy_ratio() {
        // As on the H100 host: the loader job I/O-bound at about 2 % busy, then with its
        // samples in memory at 93 % (the job itself stepped 40.3× as fast).
        let before = summarise(
            &recording(&[
                ("proj-train-1", "train", 0.022, VerdictKind::InputBoundIo),
                ("old-eval", "", 0.5, VerdictKind::GpuBound),
            ]),
            "before.csv",
            &Default::default(),
        );
        let after = summarise(
            &recording(&[
                ("proj-train-2", "train", 0.93, VerdictKind::GpuBound),
                ("new-eval", "", 0.5, VerdictKind::GpuBound),
            ]),
            "after.csv",
            &Default::default(),
        );
        let c = compare(&before, &after);
        assert_eq!(c.containers.len(), 1, "{c:#?}");
        let p = &c.containers[0];
        assert_eq!(p.key, "train");
        assert_eq!(
            (p.before.name.as_str(), p.after.name.as_str()),
            ("proj-train-1", "proj-train-2")
        );
        assert!((p.gpu_busy_ratio.unwrap() - 0.93 / 0.022).abs() < 1e-9);
        // Before: 97.8 % of the GPU time it held idle, all input-bound.
        assert!(
            (p.before.idle_share_by_cause["input-bound: I/O"] - 0.978).abs() < 1e-9,
            "{p:#?}"
        );
        assert!(
            (p.after.idle_share_by_cause["GPU-bound"] - 0.07).abs() < 1e-9,
            "{p:#?}"
        );
        assert_eq!(c.only_before, vec!["old-eval".to_owned()]);
        assert_eq!(c.only_after, vec!["new-eval".to_owned()]);
        let text = markdown(&c);
        assert!(text.contains("| train | 2% → 93% | 42.27× | input-bound: I/O 98% → GPU-bound 7% | input-bound: I/O → GPU-bound |"), "{text}");
        assert!(text.contains("Only before: old-eval"), "{text}");
    }

    #[test]
    fn a_hostile_name_is_escaped_and_an_idle_before_has_no_ratio() {
        let before = summarise(
            &recording(&[("x|y", "", 0.0, VerdictKind::Idle)]),
            "a",
            &Default::default(),
        );
        let after = summarise(
            &recording(&[("x|y", "", 0.5, VerdictKind::GpuBound)]),
            "b",
            &Default::default(),
        );
        let c = compare(&before, &after);
        assert_eq!(c.containers[0].gpu_busy_ratio, None);
        let text = markdown(&c);
        assert!(text.contains("| x\\|y |"), "{text}");
    }
}
