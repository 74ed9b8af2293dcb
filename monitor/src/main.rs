//! The `gpuwatch` command line.
use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use gpuwatch::agent::{Agent, AgentConfig};
use gpuwatch::output::table;
use gpuwatch::sampler::SamplerConfig;
use gpuwatch::sources::docker::DockerSourceConfig;
use gpuwatch::sources::gpu::GpuSourceConfig;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "gpuwatch",
    version,
    about = "Which container uses which GPU, how much, and why it idles"
)]
struct Cli {
    /// Log format on stderr.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    /// Log filter (tracing-subscriber syntax), e.g. `info`, `gpuwatch=debug`.
    #[arg(long, env = "GPUWATCH_LOG", default_value = "warn", global = true)]
    log: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Sample the host over one window and print every running container and GPU.
    Snapshot(SnapshotArgs),
    /// Record a sample every interval to CSV or JSON Lines, until --duration or Ctrl-C/SIGTERM.
    Record(RecordArgs),
}

#[derive(Clone, Copy, ValueEnum)]
enum RecordFormat {
    /// One row per sample per GPU and per workload (docs/snapshot-schema.md, "CSV").
    Csv,
    /// One snapshot JSON document per line.
    Jsonl,
}

#[derive(Args)]
struct RecordArgs {
    #[command(flatten)]
    sources: SourceArgs,
    /// Time between samples.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    interval: Duration,
    /// Stop after this long (default: until Ctrl-C or SIGTERM).
    #[arg(long, value_parser = humantime::parse_duration)]
    duration: Option<Duration>,
    /// Where to write; `-` is standard output.
    #[arg(long, short, default_value = "-")]
    output: PathBuf,
    #[arg(long, value_enum, default_value_t = RecordFormat::Csv)]
    format: RecordFormat,
}

/// Where the agent gets its data.
#[derive(Args)]
struct SourceArgs {
    /// NVML library to load (default: libnvidia-ml.so from the loader path).
    #[arg(long, env = "GPUWATCH_NVML_LIB")]
    nvml_lib: Option<PathBuf>,
    /// Do not use NVML.
    #[arg(long)]
    no_nvml: bool,
    /// Docker daemon socket.
    #[arg(
        long,
        env = "GPUWATCH_DOCKER_SOCKET",
        default_value = "/var/run/docker.sock"
    )]
    docker_socket: PathBuf,
    /// Do not use Docker (identities from cgroups only).
    #[arg(long)]
    no_docker: bool,
    /// Do not load the eBPF probes.
    #[arg(long)]
    no_ebpf: bool,
    /// The proc filesystem to read (for an agent in a container with the host's /proc mounted).
    #[arg(long, default_value = "/proc")]
    proc_root: PathBuf,
}

impl SourceArgs {
    fn agent_config(&self) -> AgentConfig {
        AgentConfig {
            sampler: SamplerConfig {
                gpu: (!self.no_nvml).then(|| GpuSourceConfig {
                    lib_path: self.nvml_lib.clone(),
                }),
                probes: !self.no_ebpf,
                proc_root: self.proc_root.clone(),
                ..SamplerConfig::default()
            },
            docker: (!self.no_docker).then(|| DockerSourceConfig {
                socket: self.docker_socket.clone(),
                ..DockerSourceConfig::default()
            }),
        }
    }
}

#[derive(Args)]
struct SnapshotArgs {
    #[command(flatten)]
    sources: SourceArgs,
    /// Print JSON (schema: docs/snapshot-schema.md) instead of a table.
    #[arg(long)]
    json: bool,
    /// How long to sample: rates (CPU cores, SM utilisation, switches) cover this window.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration, overrides_with = "window")]
    window: Duration,
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // The whole chain on one line: what failed, and why.
            eprintln!("gpuwatch: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let cli = Cli::parse();
    init_logging(cli.log_format, &cli.log)?;
    match cli.command {
        Command::Snapshot(args) => snapshot(&args),
        Command::Record(args) => record(&args),
    }
}

fn init_logging(format: LogFormat, filter: &str) -> Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .with_context(|| format!("invalid --log filter {filter:?}"))?;
    use std::io::IsTerminal;
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    Ok(())
}

fn snapshot(args: &SnapshotArgs) -> Result<()> {
    let mut agent = Agent::start(&args.sources.agent_config(), Duration::from_secs(3))
        .context("starting the agent")?;
    // The first round is the baseline; the second covers the window.
    agent.sampler.round();
    // NVML's per-process samples are pulled every 500 ms meanwhile: the driver keeps only a
    // short history, and a long window read at its end alone would miss most of it.
    let never = std::sync::atomic::AtomicBool::new(false);
    wait_polling(&mut agent, std::time::Instant::now() + args.window, &never);
    let snap = agent.sampler.round();
    let mut stdout = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut stdout, &snap).context("writing JSON")?;
        writeln!(stdout).context("writing JSON")?;
    } else {
        stdout
            .write_all(table::render_snapshot(&snap).as_bytes())
            .context("writing the table")?;
    }
    Ok(())
}

/// Sleeps until `until`, pulling NVML's per-process samples every 500 ms meanwhile; returns
/// early (false) when `stop` is set.
fn wait_polling(
    agent: &mut Agent,
    until: std::time::Instant,
    stop: &std::sync::atomic::AtomicBool,
) -> bool {
    use std::sync::atomic::Ordering;
    loop {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        let now = std::time::Instant::now();
        if now >= until {
            return true;
        }
        std::thread::sleep((until - now).min(Duration::from_millis(500)));
        if std::time::Instant::now() < until {
            agent.sampler.poll();
        }
    }
}

fn record(args: &RecordArgs) -> Result<()> {
    use std::io::IsTerminal;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    anyhow::ensure!(!args.interval.is_zero(), "--interval must be more than 0");
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, stop.clone()).context("installing signal handlers")?;
    }
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
    let mut out = std::io::BufWriter::new(sink);
    let progress = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();

    let mut agent = Agent::start(&args.sources.agent_config(), Duration::from_secs(3))
        .context("starting the agent")?;
    agent.sampler.round(); // baseline: rates and samples cover each interval from the first row on
    if let RecordFormat::Csv = args.format {
        writeln!(out, "{}", gpuwatch::output::csv::header())
            .with_context(|| format!("writing {name}"))?;
    }
    let started = std::time::Instant::now();
    let mut next = started + args.interval;
    let mut samples = 0u64;
    while wait_polling(&mut agent, next, &stop) {
        let snap = agent.sampler.round();
        match args.format {
            RecordFormat::Csv => out.write_all(gpuwatch::output::csv::rows(&snap).as_bytes()),
            RecordFormat::Jsonl => serde_json::to_writer(&mut out, &snap)
                .map_err(std::io::Error::from)
                .and_then(|()| out.write_all(b"\n")),
        }
        .and_then(|()| out.flush()) // every sample reaches the file: a kill loses nothing written
        .with_context(|| format!("writing {name} (the {samples} samples before were written)"))?;
        samples += 1;
        if progress {
            eprint!(
                "\rrecording: {samples} samples, {:.0?} elapsed -> {name}   ",
                started.elapsed()
            );
        }
        if args.duration.is_some_and(|d| started.elapsed() >= d) {
            break;
        }
        next += args.interval;
    }
    out.flush().with_context(|| format!("writing {name}"))?;
    if progress {
        eprintln!();
    }
    if stop.load(Ordering::Relaxed) {
        tracing::info!("stopped by a signal after {samples} samples; {name} is complete");
    }
    Ok(())
}
