//! The `gpuwatch` command line.
use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use gpuwatch::analysis::AnalysisConfig;
use gpuwatch::config::Config;
use gpuwatch::output::table;
use gpuwatch::runtime::{Agent, AgentConfig, Schedule};
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
    /// The YAML config file (docs/config.md); without one, the defaults.
    #[arg(long, short = 'c', env = "GPUWATCH_CONFIG", global = true)]
    config: Option<PathBuf>,
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
    /// Check the host and every GPU container against the health checklist; exits 2 when
    /// something is at risk, so it can gate a training launch.
    Doctor(DoctorArgs),
    /// Evaluate the alert rules every interval and send notifications (log, webhook, command),
    /// until --duration or Ctrl-C/SIGTERM; prints each alert as it fires and resolves.
    Watch(WatchArgs),
    /// Run the agent as a service: a Prometheus endpoint, a JSON API and the alert rules, until
    /// Ctrl-C/SIGTERM.
    Serve(ServeArgs),
    /// Draw charts from a CSV recording: per GPU temperature against memory use (the seed
    /// article's chart), per container GPU busy with the verdict shaded, GPU memory and the
    /// loader-stall share.
    Plot(PlotArgs),
    /// Summarise a CSV recording per container and per GPU: GPU-hours, memory, utilisation
    /// distribution, verdicts, alerts, OOM headroom, with the charts.
    Report(ReportArgs),
    /// A live view of GPUs and containers, refreshed every interval (q quits, s sorts, r
    /// reverses, / filters, g shows GPU holders only). Logging is off while it runs: the
    /// header shows each source's state.
    Top(TopArgs),
    /// Print a shell completion script (e.g. `gpuwatch completions bash >
    /// /etc/bash_completion.d/gpuwatch`).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff) to stdout (e.g. `gpuwatch man > /usr/local/share/man/man1/gpuwatch.1`).
    Man,
    /// Validate a config file without running anything.
    CheckConfig {
        /// The YAML file to check.
        file: PathBuf,
    },
}

#[derive(Args)]
struct DoctorArgs {
    #[command(flatten)]
    sources: SourceArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// How long to sample (default: the config's `doctor.window`, 5 s).
    #[arg(long, value_parser = humantime::parse_duration)]
    window: Option<Duration>,
}

#[derive(Args)]
struct PlotArgs {
    /// A CSV recording (`gpuwatch record -o gpu_log.csv`).
    recording: PathBuf,
    /// Where to write the charts (created if missing).
    #[arg(long, short, default_value = "plots")]
    output: PathBuf,
    /// Image formats.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [gpuwatch::output::plot::Format::Png, gpuwatch::output::plot::Format::Svg])]
    format: Vec<gpuwatch::output::plot::Format>,
}

#[derive(Clone, Copy, ValueEnum)]
enum ReportFormat {
    /// Markdown, with PNG charts written beside it (see --plots).
    Markdown,
    /// One self-contained HTML page, charts inlined as SVG.
    Html,
    Json,
}

#[derive(Args)]
struct ReportArgs {
    /// A CSV recording (`gpuwatch record -o gpu_log.csv`).
    recording: PathBuf,
    #[arg(long, value_enum, default_value_t = ReportFormat::Markdown)]
    format: ReportFormat,
    /// Where to write the report; `-` is standard output.
    #[arg(long, short, default_value = "-")]
    output: PathBuf,
    /// Where the Markdown report's PNG charts go (default: `<output>-plots`, or `report-plots`
    /// when writing to standard output).
    #[arg(long)]
    plots: Option<PathBuf>,
}

#[derive(Args)]
struct TopArgs {
    #[command(flatten)]
    sources: SourceArgs,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Args)]
struct ServeArgs {
    #[command(flatten)]
    sources: SourceArgs,
    /// Address to listen on (host:port; `0.0.0.0:9879` for every interface).
    #[arg(long = "web.listen-address", default_value = "127.0.0.1:9879")]
    listen_address: String,
    /// Exporter web-config file: TLS (`tls_server_config`) and basic auth
    /// (`basic_auth_users`, bcrypt), as Prometheus exporters read it.
    #[arg(long = "web.config.file")]
    web_config_file: Option<PathBuf>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Args)]
struct WatchArgs {
    #[command(flatten)]
    sources: SourceArgs,
    #[command(flatten)]
    run: RunArgs,
    /// Print each transition as a JSON line (the webhook's body) instead of text.
    #[arg(long)]
    json: bool,
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
    #[command(flatten)]
    run: RunArgs,
    /// Where to write; `-` is standard output.
    #[arg(long, short, default_value = "-")]
    output: PathBuf,
    #[arg(long, value_enum, default_value_t = RecordFormat::Csv)]
    format: RecordFormat,
}

/// How long a continuous command runs, and how often it samples.
#[derive(Args)]
struct RunArgs {
    /// Time between samples (default: the config's `interval`, 1 s).
    #[arg(long, value_parser = humantime::parse_duration)]
    interval: Option<Duration>,
    /// Stop after this long (default: until Ctrl-C or SIGTERM).
    #[arg(long, value_parser = humantime::parse_duration)]
    duration: Option<Duration>,
}

impl RunArgs {
    /// The interval: the flag, else the config's; never zero.
    fn interval(&self, config: &Config) -> Result<Duration> {
        let interval = self.interval.unwrap_or(config.interval);
        anyhow::ensure!(!interval.is_zero(), "--interval must be more than 0");
        Ok(interval)
    }
}

/// Where the agent gets its data; each flag overrides the config file's `sources:`.
#[derive(Args)]
struct SourceArgs {
    /// NVML library to load (default: libnvidia-ml.so.1 from the loader path).
    #[arg(long, env = "GPUWATCH_NVML_LIB")]
    nvml_lib: Option<PathBuf>,
    /// Do not use NVML.
    #[arg(long)]
    no_nvml: bool,
    /// Docker daemon socket (default: /var/run/docker.sock).
    #[arg(long, env = "GPUWATCH_DOCKER_SOCKET")]
    docker_socket: Option<PathBuf>,
    /// Do not use Docker (identities from cgroups only).
    #[arg(long)]
    no_docker: bool,
    /// Do not load the eBPF probes.
    #[arg(long)]
    no_ebpf: bool,
    /// The proc filesystem to read (for an agent in a container with the host's /proc mounted).
    #[arg(long)]
    proc_root: Option<PathBuf>,
}

impl SourceArgs {
    fn agent_config(&self, config: &Config) -> AgentConfig {
        let mut src = config.sources.clone();
        src.nvml &= !self.no_nvml;
        src.docker &= !self.no_docker;
        src.ebpf &= !self.no_ebpf;
        if let Some(p) = &self.nvml_lib {
            src.nvml_lib = Some(p.clone());
        }
        if let Some(p) = &self.docker_socket {
            src.docker_socket = p.clone();
        }
        if let Some(p) = &self.proc_root {
            src.proc_root = p.clone();
        }
        AgentConfig {
            sampler: SamplerConfig {
                gpu: src.nvml.then(|| GpuSourceConfig {
                    lib_path: src.nvml_lib.clone(),
                }),
                probes: src.ebpf,
                proc_root: src.proc_root.clone(),
                series_interval: src.nvml_series_interval,
                ..SamplerConfig::default()
            },
            analysis: AnalysisConfig {
                verdict: config.verdict,
                headroom: config.headroom,
            },
            docker: src.docker.then(|| DockerSourceConfig {
                socket: src.docker_socket.clone(),
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
    // The live view owns the terminal: log lines would tear it.
    let filter = if matches!(cli.command, Command::Top(_)) {
        "off"
    } else {
        &cli.log
    };
    init_logging(cli.log_format, filter)?;
    match &cli.command {
        Command::CheckConfig { file } => return check_config(file),
        Command::Plot(args) => return plot(args),
        Command::Report(args) => return report(args),
        Command::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(
                *shell,
                &mut Cli::command(),
                "gpuwatch",
                &mut std::io::stdout(),
            );
            return Ok(());
        }
        Command::Man => {
            use clap::CommandFactory;
            return clap_mangen::Man::new(Cli::command())
                .render(&mut std::io::stdout())
                .context("writing the man page");
        }
        _ => {}
    }
    let config = match &cli.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    match cli.command {
        Command::Snapshot(args) => snapshot(&args, &config),
        Command::Record(args) => record(&args, &config),
        Command::Doctor(args) => doctor(&args, &config),
        Command::Watch(args) => watch(&args, &config),
        Command::Serve(args) => serve(&args, &config),
        Command::Top(args) => top(&args, &config),
        Command::CheckConfig { .. }
        | Command::Completions { .. }
        | Command::Man
        | Command::Plot(_)
        | Command::Report(_) => {
            unreachable!("handled above")
        }
    }
}

fn check_config(file: &std::path::Path) -> Result<()> {
    let c = Config::load(file)?;
    let r = &c.alerts.rules;
    let enabled: Vec<&str> = gpuwatch::health::rules::RULE_NAMES
        .iter()
        .copied()
        .filter(|name| r.is_enabled(name))
        .collect();
    println!(
        "{}: ok (interval {}, {} of {} alert rules enabled: {}; notify: log{}{})",
        file.display(),
        humantime::format_duration(c.interval),
        enabled.len(),
        gpuwatch::health::rules::RULE_NAMES.len(),
        enabled.join(", "),
        if c.notify.webhook.is_some() {
            ", webhook"
        } else {
            ""
        },
        if c.notify.command.is_some() {
            ", command"
        } else {
            ""
        },
    );
    Ok(())
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

fn snapshot(args: &SnapshotArgs, config: &Config) -> Result<()> {
    let mut agent = Agent::start(&args.sources.agent_config(config), Duration::from_secs(3))
        .context("starting the agent")?;
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

fn record(args: &RecordArgs, config: &Config) -> Result<()> {
    use std::io::IsTerminal;
    use std::sync::atomic::Ordering;
    let interval = args.run.interval(config)?;
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
    let mut out = std::io::BufWriter::new(sink);
    let progress = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();

    let mut agent = Agent::start(&args.sources.agent_config(config), Duration::from_secs(3))
        .context("starting the agent")?;
    // The config's alert rules run over the recording; their transitions are recorded too
    // (CSV `alert` rows), for `gpuwatch report`. Nothing is notified.
    let mut alerts = gpuwatch::health::alerts::AlertEngine::new(&config.alerts);
    // The first round is the baseline: rates and the GPU series cover each interval from the
    // first row on.
    if let RecordFormat::Csv = args.format {
        writeln!(out, "{}", gpuwatch::output::csv::header())
            .with_context(|| format!("writing {name}"))?;
    }
    let started = std::time::Instant::now();
    let mut samples = 0u64;
    let mut write = |snap: &gpuwatch::model::Snapshot, samples: &mut u64| -> Result<()> {
        let round = alerts.evaluate(snap);
        let transitions: Vec<_> = round.notify.into_iter().chain(round.rate_limited).collect();
        match args.format {
            RecordFormat::Csv => out
                .write_all(gpuwatch::output::csv::rows(snap).as_bytes())
                .and_then(|()| {
                    out.write_all(gpuwatch::output::csv::alert_rows(snap, &transitions).as_bytes())
                }),
            RecordFormat::Jsonl => serde_json::to_writer(&mut out, snap)
                .map_err(std::io::Error::from)
                .and_then(|()| out.write_all(b"\n")),
        }
        .and_then(|()| out.flush()) // every sample reaches the file: a kill loses nothing written
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
    gpuwatch::runtime::rounds(&mut agent, schedule, &stop, |snap| {
        write(&snap, &mut samples)
    })?;
    out.flush().with_context(|| format!("writing {name}"))?;
    if progress {
        eprintln!();
    }
    if stop.load(Ordering::Relaxed) {
        tracing::info!("stopped by a signal after {samples} samples; {name} is complete");
    }
    Ok(())
}

/// A flag set by SIGINT or SIGTERM.
fn stop_on_signals() -> Result<std::sync::Arc<std::sync::atomic::AtomicBool>> {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, stop.clone()).context("installing signal handlers")?;
    }
    Ok(stop)
}

/// Exit status of `doctor` when a check is at risk (1 stays "the command failed").
const EXIT_AT_RISK: u8 = 2;

fn doctor(args: &DoctorArgs, config: &Config) -> Result<()> {
    use gpuwatch::health::doctor::{self, Status};
    let window = args.window.unwrap_or(config.doctor.window);
    let stop = stop_on_signals()?;
    let mut agent = Agent::start(&args.sources.agent_config(config), Duration::from_secs(3))
        .context("starting the agent")?;
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
    let report = doctor::examine(&snaps, &config.doctor);
    let mut stdout = std::io::stdout().lock();
    if args.json {
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

fn watch(args: &WatchArgs, config: &Config) -> Result<()> {
    use gpuwatch::notify::Notification;
    let interval = args.run.interval(config)?;
    let stop = stop_on_signals()?;
    let mut agent = Agent::start(&args.sources.agent_config(config), Duration::from_secs(3))
        .context("starting the agent")?;
    let mut stdout = std::io::stdout().lock();
    gpuwatch::runtime::daemon::run_rounds(
        &mut agent,
        config,
        interval,
        args.run.duration,
        &stop,
        |snap, round, _| -> Result<()> {
            for a in &round.notify {
                if args.json {
                    let n = Notification {
                        version: 1,
                        status: a.state,
                        host: &snap.host.hostname,
                        alert: a,
                    };
                    serde_json::to_writer(&mut stdout, &n).context("writing to stdout")?;
                    writeln!(stdout).context("writing to stdout")?;
                } else {
                    writeln!(stdout, "{}", table::render_alert_line(a))
                        .context("writing to stdout")?;
                }
            }
            stdout.flush().context("writing to stdout")
        },
    )
}

fn serve(args: &ServeArgs, config: &Config) -> Result<()> {
    use gpuwatch::output::prometheus::Exported;
    use gpuwatch::serve::web_config::{BasicAuth, WebConfig};
    use gpuwatch::serve::{Published, Site};
    use std::collections::BTreeMap;
    use std::sync::{Arc, RwLock};
    let interval = args.run.interval(config)?;
    let web = match &args.web_config_file {
        Some(p) => WebConfig::load(p)?.0,
        None => WebConfig::default(),
    };
    let tls = web.tls()?;
    let mut headers = Vec::new();
    for (k, v) in web.http_server_config.iter().flat_map(|h| &h.headers) {
        let name = hyper::header::HeaderName::from_bytes(k.as_bytes())
            .with_context(|| format!("web config: header name {k:?}"))?;
        let value = hyper::header::HeaderValue::from_str(v)
            .with_context(|| format!("web config: value of header {k}"))?;
        headers.push((name, value));
    }
    let published: Published = Arc::new(RwLock::new(None));
    let site = Arc::new(Site {
        published: published.clone(),
        auth: BasicAuth::new(web.basic_auth_users.clone()),
        headers,
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("gpuwatch-http")
        .enable_all()
        .build()
        .context("starting the HTTP runtime")?;
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(&args.listen_address))
        .with_context(|| format!("listening on {}", args.listen_address))?;
    let bound = listener
        .local_addr()
        .context("reading the listening address")?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    eprintln!("gpuwatch serve: listening on {scheme}://{bound}");
    let (shutdown, shutdown_rx) = tokio::sync::watch::channel(false);
    runtime.spawn(gpuwatch::serve::run(listener, tls, site, shutdown_rx));

    let stop = stop_on_signals()?;
    let mut agent = Agent::start(&args.sources.agent_config(config), Duration::from_secs(3))
        .context("starting the agent")?;
    let mut xid_totals: BTreeMap<u32, u64> = BTreeMap::new();
    let result = gpuwatch::runtime::daemon::run_rounds(
        &mut agent,
        config,
        interval,
        args.run.duration,
        &stop,
        |snap, _, engine| -> Result<()> {
            gpuwatch::output::prometheus::count_xids(&mut xid_totals, &snap);
            let exported = Arc::new(Exported {
                snapshot: snap,
                alerts: engine.active(),
                xid_totals: xid_totals.clone(),
            });
            if let Ok(mut p) = published.write() {
                *p = Some(exported);
            }
            Ok(())
        },
    );
    let _ = shutdown.send(true);
    runtime.shutdown_timeout(Duration::from_secs(2));
    result
}

fn plot(args: &PlotArgs) -> Result<()> {
    let rec = gpuwatch::recording::read(&args.recording)?;
    let files = gpuwatch::output::plot::plot_all(&rec, &args.output, &args.format)?;
    for f in files {
        println!("{}", f.display());
    }
    Ok(())
}

fn report(args: &ReportArgs) -> Result<()> {
    use gpuwatch::output::plot::{self, Format};
    use gpuwatch::output::report;
    let rec = gpuwatch::recording::read(&args.recording)?;
    let name = args.recording.file_name().map_or_else(
        || args.recording.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let summary = report::summarise(&rec, &name);
    let to_stdout = args.output.as_os_str() == "-";
    let chart_key = |file: &std::path::Path| {
        file.file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    // `container-<name>` / `gpu<N>-temperature-memory` → the key the report asks for.
    let key_for = |k: &str| {
        if let Some(rest) = k.strip_prefix("gpu") {
            if rest.chars().all(|c| c.is_ascii_digit()) {
                return format!("{k}-temperature-memory");
            }
        }
        format!("container-{}", plot::file_name(k))
    };
    let text = match args.format {
        ReportFormat::Json => {
            serde_json::to_string_pretty(&summary).context("encoding the report")? + "\n"
        }
        ReportFormat::Markdown => {
            let plots = args.plots.clone().unwrap_or_else(|| {
                if to_stdout {
                    PathBuf::from("report-plots")
                } else {
                    let mut p = args.output.clone().into_os_string();
                    p.push("-plots");
                    PathBuf::from(p)
                }
            });
            let files = plot::plot_all(&rec, &plots, &[Format::Png])?;
            // Links relative to where the Markdown lands.
            let base = if to_stdout {
                PathBuf::from(".")
            } else {
                args.output
                    .parent()
                    .map(std::path::Path::to_owned)
                    .unwrap_or_default()
            };
            report::markdown(&summary, &|k| {
                let want = key_for(k);
                files
                    .iter()
                    .find(|f| chart_key(f) == want)
                    .map(|f| f.strip_prefix(&base).unwrap_or(f).display().to_string())
            })
        }
        ReportFormat::Html => {
            let dir = tempfile_dir()?;
            let files = plot::plot_all(&rec, &dir, &[Format::Svg])?;
            let page = report::html(&summary, &|k| {
                let want = key_for(k);
                let f = files.iter().find(|f| chart_key(f) == want)?;
                let svg = std::fs::read_to_string(f).ok()?;
                // Inline: drop the XML declaration, keep the <svg> element.
                Some(svg[svg.find("<svg").unwrap_or(0)..].to_owned())
            });
            let _ = std::fs::remove_dir_all(&dir);
            page
        }
    };
    if to_stdout {
        std::io::stdout()
            .write_all(text.as_bytes())
            .context("writing the report")?;
    } else {
        std::fs::write(&args.output, text)
            .with_context(|| format!("writing {}", args.output.display()))?;
    }
    Ok(())
}

/// A fresh private directory for intermediate files.
fn tempfile_dir() -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("gpuwatch-report-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

fn top(args: &TopArgs, config: &Config) -> Result<()> {
    use gpuwatch::health::alerts::AlertEngine;
    use gpuwatch::output::prometheus::Exported;
    use gpuwatch::top::View;
    use ratatui::crossterm::event::{self, Event, KeyEventKind};
    use std::collections::BTreeMap;
    use std::io::IsTerminal;
    use std::sync::atomic::Ordering;
    use std::time::Instant;
    let interval = args.run.interval(config)?;
    anyhow::ensure!(
        std::io::stdout().is_terminal(),
        "gpuwatch top needs a terminal; use `gpuwatch snapshot` or `record` in scripts"
    );
    let stop = stop_on_signals()?;
    // The live view fetches the GPU series every round (~2 ms a GPU per fetch): a published
    // round then lags by one interval, not by the series interval.
    let mut agent_config = args.sources.agent_config(config);
    agent_config.sampler.series_interval = interval;
    let mut agent =
        Agent::start(&agent_config, Duration::from_secs(3)).context("starting the agent")?;
    let mut engine = AlertEngine::new(&config.alerts);
    let mut xid_totals: BTreeMap<u32, u64> = BTreeMap::new();
    // Each round's completed snapshots through the rules; the newest is shown.
    let mut publish = |agent: &mut Agent, shown: Option<Exported>| -> Option<Exported> {
        let mut latest = shown;
        for snapshot in agent.round() {
            engine.evaluate(&snapshot);
            gpuwatch::output::prometheus::count_xids(&mut xid_totals, &snapshot);
            latest = Some(Exported {
                snapshot,
                alerts: engine.active(),
                xid_totals: xid_totals.clone(),
            });
        }
        latest
    };
    let mut view = View::new(std::env::var_os("NO_COLOR").is_none());
    let mut exported = publish(&mut agent, None).context("the first round did not complete")?;
    let mut terminal = ratatui::try_init().context("opening the terminal")?;
    let result = (|| -> Result<()> {
        let tick = Duration::from_millis(250);
        let started = Instant::now();
        let mut next = Instant::now() + interval;
        loop {
            terminal
                .draw(|f| view.draw(f, &exported))
                .context("drawing")?;
            loop {
                if stop.load(Ordering::Relaxed)
                    || args.run.duration.is_some_and(|d| started.elapsed() >= d)
                {
                    return Ok(());
                }
                // Wake for a key, the next round, or a signal check.
                let wake = next.min(Instant::now() + tick);
                if event::poll(wake.saturating_duration_since(Instant::now()))
                    .context("reading the keyboard")?
                {
                    if let Event::Key(k) = event::read().context("reading the keyboard")? {
                        if k.kind == KeyEventKind::Press && !view.key(k) {
                            return Ok(());
                        }
                    }
                    break; // redraw for the key (or a resize)
                }
                let now = Instant::now();
                if now >= next {
                    if let Some(e) = publish(&mut agent, None) {
                        exported = e;
                    }
                    next = (next + interval).max(now);
                    break;
                }
            }
        }
    })();
    ratatui::restore();
    result
}
