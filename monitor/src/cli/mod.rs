//! The command line: the arguments every command shares, and one file per command.
pub(crate) mod check_config;
pub(crate) mod doctor;
pub(crate) mod logging;
pub(crate) mod record;
pub(crate) mod report;
pub(crate) mod serve;
pub(crate) mod snapshot;
pub(crate) mod top;
pub(crate) mod watch;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use doctor::DoctorArgs;
use gpuwatch::analysis::AnalysisConfig;
use gpuwatch::config::Config;
use gpuwatch::runtime::privileges::Identity;
use gpuwatch::runtime::socket_access::{try_connect_as, SocketAccess};
use gpuwatch::runtime::{Agent, AgentConfig};
use gpuwatch::sampler::SamplerConfig;
use gpuwatch::sources::docker::DockerSourceConfig;
use gpuwatch::sources::gpu::GpuSourceConfig;
use record::RecordArgs;
use report::{CompareArgs, PlotArgs, ReportArgs};
use serve::ServeArgs;
use snapshot::SnapshotArgs;
use std::path::PathBuf;
use std::time::Duration;
use top::TopArgs;
use watch::WatchArgs;

/// The heading of the flags every command takes: each command's own come first, under
/// "Options", as `docker run --help` and `kubectl` list theirs.
const GLOBAL: &str = "Global options";

#[derive(Parser)]
#[command(
    name = "gpuwatch",
    version = concat!(
        env!("CARGO_PKG_VERSION"),
        " (",
        env!("GPUWATCH_REVISION"),
        ", built ",
        env!("GPUWATCH_BUILD_DATE"),
        ")"
    ),
    about = "Which container uses which GPU, how much, and why it idles"
)]
pub(crate) struct Cli {
    /// Log format on stderr.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true, help_heading = GLOBAL)]
    pub(crate) log_format: LogFormat,
    /// Log filter (tracing-subscriber syntax), e.g. `info`, `gpuwatch=debug`. The Docker client
    /// and the HTTP libraries (bollard, hyper, ureq) log at most INFO whatever this asks: their
    /// debug events carry containers' environments and request bodies.
    #[arg(long, env = "GPUWATCH_LOG", default_value = "warn", global = true, help_heading = GLOBAL)]
    pub(crate) log: String,
    /// The YAML config file (docs/config.md); without one, the defaults.
    #[arg(long, short = 'c', env = "GPUWATCH_CONFIG", global = true, help_heading = GLOBAL)]
    pub(crate) config: Option<PathBuf>,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Sample the host over one window and print every running container and GPU.
    Snapshot(SnapshotArgs),
    /// Why each container's GPU idles, in words: its verdict, the evidence and the advice,
    /// over one window (default 3 s).
    Why(snapshot::WhyArgs),
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
    /// Draw charts from a CSV recording: per GPU temperature against memory use (the chart of
    /// the YOLO26 GPU temperature and memory article), per container GPU busy with the verdict shaded, GPU memory and the
    /// loader-stall share.
    Plot(PlotArgs),
    /// Summarise a CSV recording per container and per GPU: GPU-hours, memory, utilisation
    /// distribution, verdicts, alerts, OOM headroom, with the charts.
    Report(ReportArgs),
    /// Two recordings of the same jobs, before and after a change, side by side per container
    /// (matched by compose service, else name): GPU busy, the gain, idle time by cause, the
    /// main verdict.
    Compare(CompareArgs),
    /// A live view of GPUs and containers, refreshed every interval (q quits, ↑↓ select,
    /// Enter shows the selected one's verdict, evidence and advice, s sorts, r reverses, /
    /// filters, g shows GPU holders only). Logging is off while it runs: the header shows
    /// each source's state.
    Top(TopArgs),
    /// Print a shell completion script (e.g. `gpuwatch completions bash >
    /// /etc/bash_completion.d/gpuwatch`).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff) to stdout (e.g. `gpuwatch man > /usr/local/share/man/man1/gpuwatch.1`),
    /// or with --dir write one page for gpuwatch and one for each subcommand
    /// (gpuwatch-snapshot.1, …) into a directory.
    Man {
        /// The directory to write gpuwatch.1 and gpuwatch-<subcommand>.1 into (created if
        /// missing), e.g. /usr/local/share/man/man1.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Validate a config file without running anything.
    CheckConfig {
        /// The YAML file to check.
        file: PathBuf,
    },
}

/// How `snapshot`, `doctor` and `watch` print: `--format text|json`, `--json` for short. (Every
/// command that prints takes `--format`, and `--json` for its JSON form.)
#[derive(Args)]
pub(crate) struct PrintArgs {
    /// Output format: text for people (a table, or a line per alert), JSON for programs.
    #[arg(long, value_enum, default_value_t = PrintFormat::Text)]
    pub(crate) format: PrintFormat,
    /// Short for --format json.
    #[arg(long, conflicts_with = "format")]
    pub(crate) json: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum PrintFormat {
    Text,
    Json,
}

impl PrintArgs {
    pub(crate) fn json(&self) -> bool {
        self.json || self.format == PrintFormat::Json
    }
}

/// How long a continuous command runs, and how often it samples.
#[derive(Args)]
pub(crate) struct RunArgs {
    /// Time between samples, 100ms to 24h (default: the config's `interval`, 1 s; for `serve`,
    /// its `serve_interval`, 5 s).
    #[arg(long, value_parser = gpuwatch::units::seconds_or_duration)]
    pub(crate) interval: Option<Duration>,
    /// Stop after this long (default: until Ctrl-C or SIGTERM).
    #[arg(long, value_parser = gpuwatch::units::seconds_or_duration)]
    pub(crate) duration: Option<Duration>,
}

impl RunArgs {
    /// The interval: the flag, else the config's `interval`; 100 ms to 24 h.
    pub(crate) fn interval(&self, config: &Config) -> Result<Duration> {
        self.interval_or(config.interval)
    }

    /// The interval: the flag, else `configured` (the config's key for this command).
    pub(crate) fn interval_or(&self, configured: Duration) -> Result<Duration> {
        let interval = self.interval.unwrap_or(configured);
        gpuwatch::units::check_interval(interval)
            .map_err(|m| anyhow::anyhow!("--interval: {m}"))?;
        Ok(interval)
    }
}

/// The capabilities of a long-running agent.
#[derive(Args)]
pub(crate) struct PrivilegeArgs {
    /// Keep every capability gpuwatch started with. By default, once its probes are loaded and
    /// its sources open, it keeps only CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE and
    /// CAP_DAC_READ_SEARCH (those it has; CAP_SYS_ADMIN where it stood in for the first two).
    #[arg(long)]
    pub(crate) keep_capabilities: bool,
    /// Then also become this user (a name or a uid), with its groups, keeping only those
    /// capabilities. To reconnect to Docker it needs the socket's group (`docker`).
    #[arg(long, conflicts_with = "keep_capabilities")]
    pub(crate) user: Option<String>,
}

impl PrivilegeArgs {
    /// The `--user` to become, looked up before anything starts; refused when it could not
    /// connect to the Docker socket the agent is to use (every new connection after the switch
    /// is made as that user).
    pub(crate) fn identity(&self, agent: &AgentConfig) -> Result<Option<Identity>> {
        let Some(name) = self.user.as_deref() else {
            return Ok(None);
        };
        let user = Identity::lookup(name).context("--user")?;
        if let Some(docker) = &agent.docker {
            let socket = docker.socket_path();
            match try_connect_as(&user, socket).context("--user")? {
                SocketAccess::Connected | SocketAccess::Other(_) => {}
                SocketAccess::Denied => anyhow::bail!(
                    "--user {name}: that user may not connect to the Docker socket {} (see \
                     `ls -l` of it): add {name} to the socket's group (usually `docker`), or \
                     pass --no-docker",
                    socket.display()
                ),
            }
        }
        Ok(Some(user))
    }

    /// Drops what the started agent no longer uses, unless told to keep it, and becomes
    /// `user`. Not being able to drop is logged; not being able to become the user asked for is
    /// an error.
    pub(crate) fn apply(&self, agent: &Agent, user: Option<&Identity>) -> Result<()> {
        if self.keep_capabilities {
            return Ok(());
        }
        match agent.keep_only_needed_privileges(user) {
            Ok(_) => Ok(()),
            Err(e) if user.is_none() => {
                tracing::warn!("could not drop capabilities: {e}");
                Ok(())
            }
            Err(e) => Err(e).context("becoming the --user"),
        }
    }
}

/// Where the agent gets its data; each flag overrides the config file's `sources:`.
#[derive(Args)]
pub(crate) struct SourceArgs {
    /// NVML library to load (default: libnvidia-ml.so.1 from the loader path).
    #[arg(long, env = "GPUWATCH_NVML_LIB")]
    pub(crate) nvml_lib: Option<PathBuf>,
    /// Do not use NVML.
    #[arg(long)]
    pub(crate) no_nvml: bool,
    /// Docker daemon socket (default: DOCKER_HOST when it is a unix:// address, else the
    /// config's `sources.docker_socket`, /var/run/docker.sock).
    #[arg(long, env = "GPUWATCH_DOCKER_SOCKET")]
    pub(crate) docker_socket: Option<PathBuf>,
    /// Do not use Docker (identities from cgroups only).
    #[arg(long)]
    pub(crate) no_docker: bool,
    /// Do not load the eBPF probes.
    #[arg(long)]
    pub(crate) no_ebpf: bool,
    /// The proc filesystem to read (for an agent in a container with the host's /proc mounted).
    #[arg(long)]
    pub(crate) proc_root: Option<PathBuf>,
}

/// `--gpu LIST` (`-i`, as nvidia-smi): only these GPUs, by index or UUID, and the workloads
/// holding one of them.
#[derive(Args)]
pub(crate) struct GpuFilter {
    /// Only these GPUs (`0,1` or UUIDs, as `nvidia-smi -i`) and the workloads holding them.
    #[arg(long = "gpu", short = 'i', value_name = "LIST")]
    pub(crate) gpu: Option<String>,
}

impl GpuFilter {
    /// `snap` narrowed to the GPUs asked for; an entry that names no GPU is an error.
    pub(crate) fn apply(&self, snap: &mut gpuwatch::model::Snapshot) -> Result<()> {
        let Some(list) = &self.gpu else {
            return Ok(());
        };
        let (found, missing) = gpuwatch::model::parse_visible_devices(list).resolve(&snap.gpus);
        anyhow::ensure!(missing.is_empty(), "--gpu {list}: {}", missing.join("; "));
        snap.keep_gpus(&found);
        Ok(())
    }
}

impl SourceArgs {
    /// The agent of a one-shot command (`snapshot`, `doctor`): read tracing from the start
    /// unless it is off, since a single window has no earlier round to decide from.
    pub(crate) fn start_one_shot_agent(&self, config: &Config) -> Result<Agent> {
        let mut agent_config = self.agent_config(config);
        agent_config.sampler.io_tracing = agent_config.sampler.io_tracing.for_one_shot();
        agent_config.sampler.cuda_tracing = agent_config.sampler.cuda_tracing.for_one_shot();
        Agent::start(&agent_config, std::time::Duration::from_secs(3)).context("starting the agent")
    }

    pub(crate) fn agent_config(&self, config: &Config) -> AgentConfig {
        let mut src = config.sources.clone();
        src.nvml &= !self.no_nvml;
        src.docker &= !self.no_docker;
        src.ebpf &= !self.no_ebpf;
        if let Some(p) = &self.nvml_lib {
            src.nvml_lib = Some(p.clone());
        }
        if let Some(p) = &self.docker_socket {
            src.docker_socket = p.clone();
        } else if let Ok(host) = std::env::var("DOCKER_HOST") {
            match docker_host_socket(&host) {
                Ok(p) => src.docker_socket = p,
                Err(why) => tracing::warn!(
                    "DOCKER_HOST={host:?}: {why}; using {}",
                    src.docker_socket.display()
                ),
            }
        }
        if let Some(p) = &self.proc_root {
            src.proc_root = p.clone();
        }
        AgentConfig {
            sampler: SamplerConfig {
                gpu: src.nvml.then(|| GpuSourceConfig {
                    lib_path: src.nvml_lib.clone(),
                    driver_list: src
                        .nvml_driver_list
                        .clone()
                        .unwrap_or_else(|| src.proc_root.join("driver/nvidia/gpus")),
                }),
                probes: src.ebpf,
                proc_root: src.proc_root.clone(),
                cri_tasks: src.containerd_tasks.clone(),
                series_interval: src.nvml_series_interval,
                io_tracing: src.read_tracing,
                cuda_tracing: src.cuda_tracing,
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

/// A flag set by SIGINT or SIGTERM.
/// The socket path of a `DOCKER_HOST` value: `unix:///run/user/1000/docker.sock` (rootless
/// Docker, Podman's Docker-compatible socket). TCP and SSH addresses are not supported.
fn docker_host_socket(host: &str) -> Result<PathBuf, DockerHostError> {
    match host.strip_prefix("unix://") {
        Some(path) if path.starts_with('/') => Ok(PathBuf::from(path)),
        Some(_) => Err(DockerHostError::RelativePath),
        None => Err(DockerHostError::NotUnix),
    }
}

/// Why a `DOCKER_HOST` value names no socket the agent can use.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
enum DockerHostError {
    #[error("a unix:// address needs an absolute path")]
    RelativePath,
    #[error("only unix:// sockets are supported")]
    NotUnix,
}

/// SIGINT and SIGTERM stop the loop cleanly. SIGHUP (what `systemctl reload` and many
/// supervisors send) does not reload the configuration: it is logged and otherwise ignored, so
/// it never kills the agent; a changed config takes a restart.
pub(crate) fn stop_on_signals() -> Result<std::sync::Arc<std::sync::atomic::AtomicBool>> {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, stop.clone()).context("installing signal handlers")?;
    }
    let mut hangups = signal_hook::iterator::Signals::new([signal_hook::consts::SIGHUP])
        .context("installing the SIGHUP handler")?;
    std::thread::Builder::new()
        .name("gpuwatch-sighup".into())
        .spawn(move || {
            for _ in hangups.forever() {
                tracing::warn!(
                    "SIGHUP: gpuwatch does not reload its configuration; restart it to apply a \
                     changed file (it keeps running as it is)"
                );
            }
        })
        .context("starting the SIGHUP thread")?;
    Ok(stop)
}

/// Exit status of `doctor` when a check is at risk (1 stays "the command failed").
pub(crate) const EXIT_AT_RISK: u8 = 2;
/// Exit status of a command line that does not parse (sysexits' EX_USAGE), so a script can
/// tell it from doctor's "at risk".
pub(crate) const EXIT_USAGE: u8 = 64;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_host_unix_sockets_only() {
        assert_eq!(
            docker_host_socket("unix:///run/user/1000/docker.sock"),
            Ok(PathBuf::from("/run/user/1000/docker.sock"))
        );
        assert!(docker_host_socket("tcp://10.0.0.1:2376")
            .unwrap_err()
            .to_string()
            .contains("unix://"));
        assert!(docker_host_socket("unix://relative.sock").is_err());
    }

    /// `serve` samples every `serve_interval` (5 s by default), the other commands every
    /// `interval` (1 s); `--interval` overrides either, and is checked like them.
    #[test]
    fn serve_has_its_own_interval_and_the_flag_beats_it() {
        let config = Config::default();
        let no_flag = RunArgs {
            interval: None,
            duration: None,
        };
        let serve = |a: &RunArgs| a.interval_or(config.serve_interval).ok();
        assert_eq!(serve(&no_flag), Some(Duration::from_secs(5)));
        assert_eq!(no_flag.interval(&config).ok(), Some(Duration::from_secs(1)));
        let flag = RunArgs {
            interval: Some(Duration::from_secs(2)),
            duration: None,
        };
        assert_eq!(serve(&flag), Some(Duration::from_secs(2)));
        assert_eq!(flag.interval(&config).ok(), Some(Duration::from_secs(2)));
        let tiny = RunArgs {
            interval: Some(Duration::from_millis(1)),
            duration: None,
        };
        assert!(serve(&tiny).is_none(), "1 ms is below the 100-ms floor");
    }
}
