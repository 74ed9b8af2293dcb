//! Judges a recording again with this build's analysis: each workload of each row of a JSON
//! Lines recording (`gpuwatch record --format jsonl`) gets the verdict this build gives for the
//! same measurements, so a change to the verdict can be scored on real recordings (those of
//! tests/gpu/real_loops.sh, with tests/gpu/score_real_loops.py) before it goes to a GPU host.
//!
//!     cargo run --example rejudge -- IN.jsonl > OUT.jsonl
use gpuwatch::analysis::verdict::{assess, HostFacts};
use gpuwatch::analysis::VerdictConfig;
use gpuwatch::model::{SourceState, Workload};
use std::io::{BufRead, Write};

fn main() -> anyhow::Result<()> {
    let path = std::env::args()
        .nth(1)
        .ok_or_else(|| anyhow::anyhow!("usage: rejudge IN.jsonl"))?;
    let file = std::fs::File::open(&path)?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let config = VerdictConfig::default();
    for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let mut row: serde_json::Value =
            serde_json::from_str(&line).map_err(|e| anyhow::anyhow!("{path}:{}: {e}", n + 1))?;
        let window = row["window_seconds"].as_f64();
        let ebpf = if row["sources"]["ebpf"]["up"] == true {
            SourceState::up()
        } else {
            SourceState::from_error(gpuwatch::model::SourceError::disabled(
                row["sources"]["ebpf"]["detail"]
                    .as_str()
                    .unwrap_or("eBPF off"),
            ))
        };
        let cpus = row["host"]["cpus"].as_u64().map(|c| c as u32);
        if let Some(workloads) = row["workloads"].as_array_mut() {
            for w in workloads.iter_mut() {
                let parsed: Workload = serde_json::from_value(w.clone())
                    .map_err(|e| anyhow::anyhow!("{path}:{}: workload: {e}", n + 1))?;
                let facts = HostFacts { ebpf: &ebpf, cpus };
                let v = assess(&parsed, window, facts, None, &config);
                w["verdict"] = serde_json::to_value(v)?;
            }
        }
        writeln!(out, "{row}")?;
    }
    Ok(())
}
