//! `gpuwatch snapshot`: one window, every container and GPU, as a table or JSON; and
//! `gpuwatch why`: the verdicts of that window in words.
use super::SourceArgs;
use anyhow::{Context, Result};
use clap::Args;
use gpuwatch::config::Config;
use gpuwatch::model::Snapshot;
use gpuwatch::output::{table, why};
use gpuwatch::runtime::Agent;
use std::io::Write;
use std::time::Duration;

#[derive(Args)]
pub(crate) struct SnapshotArgs {
    #[command(flatten)]
    pub(crate) sources: SourceArgs,
    /// `--format json` (`--json`): the schema of docs/snapshot-schema.md; text is a table.
    #[command(flatten)]
    pub(crate) print: super::PrintArgs,
    /// How long to sample: rates (CPU cores, SM utilisation, switches) cover this window.
    #[arg(long, default_value = "1s", value_parser = gpuwatch::units::seconds_or_duration, overrides_with = "window")]
    pub(crate) window: Duration,
    /// Print again every SECONDS until Ctrl-C or SIGTERM, as `nvidia-smi -l` does; each print
    /// covers the time since the one before.
    #[arg(short = 'l', long = "loop", value_name = "SECONDS", value_parser = gpuwatch::units::seconds_or_duration)]
    pub(crate) every: Option<Duration>,
    /// Below the table, each workload's verdict with its evidence and advice (as `gpuwatch
    /// why` prints them).
    #[arg(short = 'v', long = "why")]
    pub(crate) why: bool,
    #[command(flatten)]
    pub(crate) gpus: super::GpuFilter,
}

#[derive(Args)]
pub(crate) struct WhyArgs {
    #[command(flatten)]
    pub(crate) sources: SourceArgs,
    /// How long to sample: the verdicts cover this window.
    #[arg(long, default_value = "3s", value_parser = gpuwatch::units::seconds_or_duration, overrides_with = "window")]
    pub(crate) window: Duration,
    /// Containers (or workloads) by name, id or compose service; default: every one holding a
    /// GPU.
    pub(crate) names: Vec<String>,
    /// `--format json` (`--json`): an array of the picked workloads' id, name, compose service
    /// and verdict (the snapshot schema's `verdict`).
    #[command(flatten)]
    pub(crate) print: super::PrintArgs,
}

/// A one-shot agent's first window: the baseline round, then the round `window` later.
fn first_window(
    sources: &SourceArgs,
    config: &Config,
    window: Duration,
) -> Result<(Agent, Snapshot)> {
    let mut agent = sources.start_one_shot_agent(config)?;
    // The first round is the baseline; the second covers the window. The GPU series is
    // fetched once at the end: the driver keeps ~14 s of it. (The log line is the end-to-end
    // tests' signal that the baseline is taken.)
    agent.round();
    tracing::info!("baseline round taken; the window runs {window:?}");
    let never = std::sync::atomic::AtomicBool::new(false);
    agent.wait_until(std::time::Instant::now() + window, &never);
    // The window's round: complete at once without a GPU series, else once flushed.
    let mut rounds = agent.round();
    rounds.extend(agent.flush());
    let snap = rounds.pop().context("the sampler returned no round")?;
    Ok((agent, snap))
}

/// `gpuwatch why`: the picked workloads' verdicts, evidence and advice.
pub(crate) fn why(args: &WhyArgs, config: &Config) -> Result<()> {
    let (_agent, snap) = first_window(&args.sources, config, args.window)?;
    let picked = why::pick(&snap, &args.names)?;
    let mut stdout = std::io::stdout().lock();
    if args.print.json() {
        let verdicts: Vec<serde_json::Value> = picked
            .iter()
            .map(|w| {
                serde_json::json!({
                    "id": w.id.to_string(),
                    "name": w.name,
                    "compose_service": w.container.as_ref().and_then(|c| c.compose_service.as_deref()),
                    "verdict": w.verdict,
                })
            })
            .collect();
        serde_json::to_writer_pretty(&mut stdout, &verdicts).context("writing JSON")?;
        writeln!(stdout).context("writing JSON")?;
        return stdout.flush().context("writing to stdout");
    }
    if picked.is_empty() {
        writeln!(stdout, "No workload holds a GPU.").context("writing to stdout")?;
    }
    stdout
        .write_all(why::render(&picked).as_bytes())
        .context("writing to stdout")?;
    stdout.flush().context("writing to stdout")
}

pub(crate) fn snapshot(args: &SnapshotArgs, config: &Config) -> Result<()> {
    let (mut agent, snap) = first_window(&args.sources, config, args.window)?;
    let looping = args.every.is_some_and(|e| !e.is_zero());
    let print = |mut snap: Snapshot| -> Result<()> {
        args.gpus.apply(&mut snap)?;
        print(&snap, args.print.json(), args.why, looping)
    };
    print(snap)?;
    let Some(every) = args.every.filter(|e| !e.is_zero()) else {
        return Ok(());
    };
    let stop = super::stop_on_signals()?;
    loop {
        agent.wait_until(std::time::Instant::now() + every, &stop);
        if stop.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(());
        }
        let mut rounds = agent.round();
        rounds.extend(agent.flush());
        if let Some(snap) = rounds.pop() {
            print(snap)?;
        }
    }
}

/// One snapshot on stdout: pretty JSON, or the table (and the verdicts in words with `why`).
/// Looping, JSON is one line per snapshot (JSON Lines) and each table starts with its time.
fn print(snap: &Snapshot, json: bool, why: bool, looping: bool) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    if json && looping {
        serde_json::to_writer(&mut stdout, snap).context("writing JSON")?;
        writeln!(stdout).context("writing JSON")?;
    } else if json {
        serde_json::to_writer_pretty(&mut stdout, snap).context("writing JSON")?;
        writeln!(stdout).context("writing JSON")?;
    } else {
        if looping {
            writeln!(stdout, "{}", snap.taken_at).context("writing the table")?;
        }
        stdout
            .write_all(table::render_snapshot(snap).as_bytes())
            .context("writing the table")?;
        if why {
            let all = why::pick(snap, &[]).unwrap_or_default();
            if !all.is_empty() {
                writeln!(stdout).context("writing the table")?;
                stdout
                    .write_all(why::render(&all).as_bytes())
                    .context("writing the table")?;
            }
        }
    }
    stdout.flush().context("writing to stdout")
}
