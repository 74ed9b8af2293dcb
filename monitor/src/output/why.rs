//! The "why" of each workload in words: its verdict, the evidence behind it and the advice, as
//! `gpuwatch why` and `snapshot -v` print them. Names, evidence and advice carry tenants'
//! strings (container names, labels): each is bounded and escaped for the terminal.
use super::escape;
use crate::model::{Snapshot, Workload};
use std::fmt::Write;

/// Where text is wrapped, and how far a tenant's name may run.
const WIDTH: usize = 100;
const NAME_MAX_CHARS: usize = 160;
/// A line of evidence or advice is cut here: they quote names and labels.
const TEXT_MAX_CHARS: usize = 2000;

/// Why no workloads could be picked.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum PickError {
    /// A name that picks no workload, and the workloads holding a GPU (bounded and escaped).
    #[error("no workload named {name:?}; those holding a GPU: {}", list(running))]
    NoSuchWorkload { name: String, running: Vec<String> },
    /// NVML is down: which workloads hold a GPU cannot be told, so "none" would be wrong.
    #[error(
        "cannot tell which workloads hold a GPU: the GPU source (NVML) is down: {0}. \
         `gpuwatch doctor` checks the driver and its library"
    )]
    GpuSourceDown(String),
}

fn list(running: &[String]) -> String {
    if running.is_empty() {
        "none".to_owned()
    } else {
        running.join(", ")
    }
}

/// The workloads `names` picks: by name, by id (`docker:<id>` or the id alone, as long as it is
/// unambiguous: a prefix of 12 characters or more, as `docker ps` prints them) or by compose
/// service; all with a verdict when `names` is empty.
/// Fails when NVML is down: without it no workload holds a GPU as far as the agent can see, and
/// that is not the same as none holding one.
pub fn pick<'a>(snap: &'a Snapshot, names: &[String]) -> Result<Vec<&'a Workload>, PickError> {
    if !snap.sources.nvml.up {
        let why = match &snap.sources.nvml.error {
            Some(e) if e.is_disabled() => "turned off (--no-nvml or the configuration)".to_owned(),
            Some(e) => e.to_string(),
            None => "it did not answer".to_owned(),
        };
        return Err(PickError::GpuSourceDown(
            escape::terminal(&why).into_owned(),
        ));
    }
    let with_verdict: Vec<&Workload> = snap
        .workloads
        .iter()
        .filter(|w| w.verdict.is_some())
        .collect();
    if names.is_empty() {
        return Ok(with_verdict);
    }
    let mut out = Vec::new();
    for n in names {
        let found: Vec<&Workload> = snap.workloads.iter().filter(|w| matches(w, n)).collect();
        if found.is_empty() {
            let running: Vec<String> = with_verdict
                .iter()
                .map(|w| escape::terminal(&escape::bounded(&w.name, NAME_MAX_CHARS)).into_owned())
                .collect();
            return Err(PickError::NoSuchWorkload {
                name: escape::bounded(n, NAME_MAX_CHARS).into_owned(),
                running,
            });
        }
        for w in found {
            if !out.iter().any(|o: &&Workload| o.id == w.id) {
                out.push(w);
            }
        }
    }
    Ok(out)
}

fn matches(w: &Workload, n: &str) -> bool {
    let id = w.id.to_string();
    let service = w
        .container
        .as_ref()
        .and_then(|c| c.compose_service.as_deref());
    w.name == n || id == n || service == Some(n) || (n.len() >= 12 && w.id.id.starts_with(n))
}

/// The blocks of `workloads`, one after another.
pub fn render(workloads: &[&Workload]) -> String {
    let mut out = String::new();
    for w in workloads {
        block(w, &mut out);
    }
    out
}

fn block(w: &Workload, out: &mut String) {
    let name = escape::terminal(&escape::bounded(&w.name, NAME_MAX_CHARS)).into_owned();
    let Some(v) = &w.verdict else {
        let _ = writeln!(out, "{name}: no verdict (it holds no GPU)\n");
        return;
    };
    let service = w
        .container
        .as_ref()
        .and_then(|c| c.compose_service.as_deref())
        .map(|s| {
            format!(
                ", service {}",
                escape::terminal(&escape::bounded(s, NAME_MAX_CHARS))
            )
        })
        .unwrap_or_default();
    let gpus: Vec<String> = w.gpu.per_gpu.iter().map(|g| g.index.to_string()).collect();
    let busy = if v.gpu_busy_fraction.is_finite() {
        format!(", busy {:.0}%", v.gpu_busy_fraction * 100.0)
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "{name}{service}: {} (GPU {}{busy})",
        v.kind,
        gpus.join(", ")
    );
    out.push_str("  evidence:\n");
    for e in &v.evidence {
        wrap(&text(e), "    - ", "      ", out);
    }
    wrap(&text(&v.advice), "  advice: ", "    ", out);
    out.push('\n');
}

fn text(s: &str) -> String {
    escape::terminal(&escape::bounded(s, TEXT_MAX_CHARS)).into_owned()
}

/// `s` word-wrapped at [`WIDTH`], its first line after `first`, the rest after `rest`.
fn wrap(s: &str, first: &str, rest: &str, out: &mut String) {
    let mut line = first.to_owned();
    let mut empty = true;
    for word in s.split_whitespace() {
        if !empty && line.chars().count() + 1 + word.chars().count() > WIDTH {
            out.push_str(&line);
            out.push('\n');
            line = rest.to_owned();
            empty = true;
        }
        if !empty {
            line.push(' ');
        }
        line.push_str(word);
        empty = false;
    }
    out.push_str(&line);
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::{container, snapshot};
    use crate::model::{VerdictKind, WorkloadGpuShare};

    fn judged(name: &str, kind: VerdictKind, advice: &str) -> Workload {
        let mut w = container(name);
        w.gpu.per_gpu.push(WorkloadGpuShare::new(0, None));
        let mut v = crate::health::conditions::testing::verdict(kind, advice);
        v.gpu_busy_fraction = 0.12;
        v.evidence = vec!["loader blocked on I/O 91% of its busy time".into()];
        w.verdict = Some(v);
        w
    }

    #[test]
    fn a_block_per_workload_with_its_evidence_and_advice_wrapped() {
        let w = judged(
            "yolo-train",
            VerdictKind::InputBoundIo,
            &"cache the dataset in RAM or on local NVMe ".repeat(4),
        );
        let text = render(&[&w]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "yolo-train, service train: input-bound: I/O (GPU 0, busy 12%)"
        );
        assert_eq!(lines[1], "  evidence:");
        assert_eq!(lines[2], "    - loader blocked on I/O 91% of its busy time");
        assert!(lines[3].starts_with("  advice: cache the dataset"));
        assert!(lines.iter().all(|l| l.chars().count() <= WIDTH), "{text}");
        assert!(lines[4].starts_with("    "), "{text}");
    }

    #[test]
    fn a_hostile_name_is_bounded_and_escaped() {
        let hostile = format!("\u{1b}]0;pwned\u{7}{}", "x".repeat(1 << 20));
        let w = judged(&hostile, VerdictKind::Idle, "stop it");
        let text = render(&[&w]);
        assert!(!text.contains('\u{1b}'), "{}", &text[..80]);
        assert!(text.lines().next().unwrap().chars().count() < 300);
    }

    #[test]
    fn workloads_are_picked_by_name_id_or_service_and_a_miss_says_what_runs() {
        let snap = snapshot(
            0,
            vec![],
            vec![
                judged("trainer", VerdictKind::GpuBound, "-"),
                judged("eval", VerdictKind::Idle, "-"),
            ],
        );
        let names = |p: Result<Vec<&Workload>, PickError>| -> Vec<String> {
            p.unwrap().iter().map(|w| w.name.clone()).collect()
        };
        assert_eq!(names(pick(&snap, &[])), ["trainer", "eval"]);
        assert_eq!(names(pick(&snap, &["eval".into()])), ["eval"]);
        let id = snap.workloads[0].id.to_string();
        assert_eq!(names(pick(&snap, &[id])), ["trainer"]);
        let err = pick(&snap, &["nope".into()]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "no workload named \"nope\"; those holding a GPU: trainer, eval"
        );
    }

    /// With NVML down no workload holds a GPU as far as the agent sees: that is "cannot tell",
    /// never "none", whether names were given or not.
    #[test]
    fn with_nvml_down_picking_fails_and_says_why_rather_than_finding_none() {
        let mut snap = snapshot(0, vec![], vec![container("trainer")]);
        snap.sources.nvml = crate::model::SourceState::from_error(
            crate::model::SourceError::failed("libnvidia-ml.so.1: not found\u{1b}[2J"),
        );
        for names in [vec![], vec!["trainer".to_owned()]] {
            let err = pick(&snap, &names).unwrap_err();
            let text = err.to_string();
            assert!(matches!(err, PickError::GpuSourceDown(_)), "{text}");
            assert!(text.contains("NVML) is down: "), "{text}");
            assert!(text.contains("libnvidia-ml.so.1: not found"), "{text}");
            assert!(!text.contains('\u{1b}'), "escaped: {text}");
        }
    }
}
