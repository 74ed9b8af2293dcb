//! `gpuwatch record`: a CSV or JSON Lines row set every interval, until --duration or a signal.
use super::{stop_on_signals, PrivilegeArgs, RunArgs, SourceArgs};
use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use gpuwatch::config::Config;
use gpuwatch::runtime::{Agent, Schedule};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum RecordFormat {
    /// One row per sample per GPU and per workload (docs/snapshot-schema.md, "CSV").
    Csv,
    /// One snapshot JSON document per line.
    Jsonl,
}

/// Where the rows go, in the chosen format.
enum Sink<W: Write> {
    Csv(Box<gpuwatch::recording::Writer<W>>),
    Jsonl(W),
}

#[derive(Args)]
pub(crate) struct RecordArgs {
    #[command(flatten)]
    pub(crate) sources: SourceArgs,
    #[command(flatten)]
    pub(crate) run: RunArgs,
    #[command(flatten)]
    pub(crate) privileges: PrivilegeArgs,
    /// Where to write; `-` is standard output.
    #[arg(long, short, default_value = "-")]
    pub(crate) output: PathBuf,
    #[arg(long, value_enum, default_value_t = RecordFormat::Csv)]
    pub(crate) format: RecordFormat,
    /// Short for --format jsonl.
    #[arg(long, conflicts_with = "format")]
    pub(crate) json: bool,
    #[command(flatten)]
    pub(crate) gpus: super::GpuFilter,
}

pub(crate) fn record(args: &RecordArgs, config: &Config) -> Result<()> {
    use std::io::IsTerminal;
    use std::sync::atomic::Ordering;
    let interval = args.run.interval(config)?;
    let agent_config = args.sources.agent_config(config);
    let user = args.privileges.identity(&agent_config)?;
    let stop = stop_on_signals()?;
    let to_stdout = args.output.as_os_str() == "-";
    let name = if to_stdout {
        "standard output".to_owned()
    } else {
        args.output.display().to_string()
    };
    let sink: Box<dyn Write> = if to_stdout {
        Box::new(std::io::stdout().lock())
    } else {
        Box::new(std::fs::File::create(&args.output).with_context(|| format!("creating {name}"))?)
    };
    let out = std::io::BufWriter::new(sink);
    let progress = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();

    let mut agent =
        Agent::start(&agent_config, Duration::from_secs(3)).context("starting the agent")?;
    args.privileges.apply(&agent, user.as_ref())?;
    // The config's alert rules run over the recording; their transitions are recorded too
    // (CSV `alert` rows), for `gpuwatch report`. Nothing is notified.
    let mut alerts = gpuwatch::health::alerts::AlertEngine::new(&config.alerts);
    // The first round is the baseline: rates and the GPU series cover each interval from the
    // first row on.
    let format = if args.json {
        RecordFormat::Jsonl
    } else {
        args.format
    };
    let mut out = match format {
        RecordFormat::Csv => Sink::Csv(Box::new(
            gpuwatch::recording::Writer::new(out).with_context(|| format!("writing {name}"))?,
        )),
        RecordFormat::Jsonl => Sink::Jsonl(out),
    };
    let started = std::time::Instant::now();
    let mut samples = 0u64;
    let mut write = |snap: &gpuwatch::model::Snapshot, samples: &mut u64| -> Result<()> {
        let round = alerts.evaluate(snap);
        let transitions: Vec<_> = round.notify.into_iter().chain(round.rate_limited).collect();
        // Every sample reaches the file: a kill loses nothing written.
        match &mut out {
            Sink::Csv(w) => w.write(snap, &transitions).map_err(std::io::Error::from),
            Sink::Jsonl(out) => serde_json::to_writer(&mut *out, snap)
                .map_err(std::io::Error::from)
                .and_then(|()| out.write_all(b"\n"))
                .and_then(|()| out.flush()),
        }
        .with_context(|| format!("writing {name} (the {samples} samples before were written)"))?;
        *samples += 1;
        if progress {
            eprint!(
                "\rrecording: {samples} samples, {:.0?} elapsed -> {name}   ",
                started.elapsed()
            );
        }
        Ok(())
    };
    // Rows come out as the GPU series covers them (every `sources.nvml_series_interval`); the
    // rounds still held at the end are completed and written before the command returns.
    let schedule = Schedule {
        interval,
        duration: args.run.duration,
        first_round_out: false,
    };
    gpuwatch::runtime::rounds(&mut agent, schedule, &stop, |mut snap| {
        args.gpus.apply(&mut snap)?;
        write(&snap, &mut samples)
    })?;
    if progress {
        eprintln!();
    }
    if stop.load(Ordering::Relaxed) {
        tracing::info!("stopped by a signal after {samples} samples; {name} is complete");
    }
    Ok(())
}
