//! `gpuwatch snapshot`: one window, every container and GPU, as a table or JSON.
use super::SourceArgs;
use anyhow::{Context, Result};
use clap::Args;
use gpuwatch::config::Config;
use gpuwatch::output::table;
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
}

pub(crate) fn snapshot(args: &SnapshotArgs, config: &Config) -> Result<()> {
    let mut agent = args.sources.start_one_shot_agent(config)?;
    // The first round is the baseline; the second covers the window. The GPU series is
    // fetched once at the end: the driver keeps ~14 s of it. (The log line is the end-to-end
    // tests' signal that the baseline is taken.)
    agent.round();
    tracing::info!("baseline round taken; the window runs {:?}", args.window);
    let never = std::sync::atomic::AtomicBool::new(false);
    agent.wait_until(std::time::Instant::now() + args.window, &never);
    // The window's round: complete at once without a GPU series, else once flushed.
    let mut rounds = agent.round();
    rounds.extend(agent.flush());
    let snap = rounds.pop().context("the sampler returned no round")?;
    print(&snap, args.print.json())?;
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
            print(&snap, args.print.json())?;
        }
    }
}

/// One snapshot on stdout: pretty JSON, or the table.
fn print(snap: &gpuwatch::model::Snapshot, json: bool) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    if json {
        serde_json::to_writer_pretty(&mut stdout, snap).context("writing JSON")?;
        writeln!(stdout).context("writing JSON")?;
    } else {
        stdout
            .write_all(table::render_snapshot(snap).as_bytes())
            .context("writing the table")?;
    }
    stdout.flush().context("writing to stdout")
}
