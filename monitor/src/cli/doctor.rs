//! `gpuwatch doctor`: the health checklist over a window; exits with [`super::EXIT_AT_RISK`]
//! when something is at risk.
use super::{stop_on_signals, SourceArgs, EXIT_AT_RISK};
use anyhow::{Context, Result};
use clap::Args;
use gpuwatch::config::Config;
use gpuwatch::output::table;
use gpuwatch::runtime::Schedule;
use std::io::Write;
use std::time::Duration;

#[derive(Args)]
pub(crate) struct DoctorArgs {
    #[command(flatten)]
    pub(crate) sources: SourceArgs,
    /// `--format json` (`--json`): the report as one document; text is a table.
    #[command(flatten)]
    pub(crate) print: super::PrintArgs,
    /// How long to sample (default: the config's `doctor.window`, 5 s).
    #[arg(long, value_parser = gpuwatch::units::seconds_or_duration)]
    pub(crate) window: Option<Duration>,
    /// The GPUs the launch will use (`0,1`, UUIDs), as CUDA_VISIBLE_DEVICES lists them: the
    /// per-GPU and per-container checks look at these and the containers holding them only.
    /// Default: CUDA_VISIBLE_DEVICES, else
    /// NVIDIA_VISIBLE_DEVICES, else every GPU. `-i`, as for snapshot, record and top.
    #[arg(long, short = 'i', value_name = "LIST")]
    pub(crate) gpu: Option<String>,
}

pub(crate) fn doctor(args: &DoctorArgs, config: &Config) -> Result<()> {
    use gpuwatch::health::{check::Status, doctor};
    let window = args.window.unwrap_or(config.doctor.window);
    let stop = stop_on_signals()?;
    let mut agent = args.sources.start_one_shot_agent(config)?;
    // One snapshot per second over the window: start values, peaks and trends.
    let schedule = Schedule {
        interval: Duration::from_secs(1),
        duration: Some(window),
        first_round_out: true,
    };
    let mut snaps = Vec::new();
    gpuwatch::runtime::rounds(&mut agent, schedule, &stop, |s| {
        snaps.push(s);
        Ok::<_, std::convert::Infallible>(())
    })
    .unwrap_or_else(|e| match e {});
    let launch = gpuwatch::health::conditions::launch_gpus::LaunchGpus::declared(
        args.gpu.as_deref(),
        |var| std::env::var(var).ok(),
    );
    let report = doctor::examine(&snaps, &config.doctor, launch.as_ref());
    let mut stdout = std::io::stdout().lock();
    if args.print.json() {
        serde_json::to_writer_pretty(&mut stdout, &report).context("writing JSON")?;
        writeln!(stdout).context("writing JSON")?;
    } else {
        stdout
            .write_all(table::render_doctor(&report).as_bytes())
            .context("writing the table")?;
    }
    stdout.flush().context("writing the report")?;
    if report.status == Status::Risk {
        std::process::exit(EXIT_AT_RISK.into());
    }
    Ok(())
}
