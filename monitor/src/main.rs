//! The `gpuwatch` command line.
mod cli;

use anyhow::{Context, Result};
use clap::Parser;
use cli::{Cli, Command, LogFormat};
use gpuwatch::config::Config;

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // `gpuwatch … | head`: the reader had what it wanted. Not a failure, nothing to say.
        Err(e) if reader_went_away(&e) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // The whole chain on one line: what failed, and why.
            eprintln!("gpuwatch: error: {}", one_line(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// An error and its causes on one line, each cause once: a message that already ends with
/// its cause's words (`reading FILE: No such file or directory`) does not get them again.
fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.ends_with(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

/// Whether a command failed because whoever read its output closed the pipe (EPIPE, from
/// a write of its own or through the JSON and CSV writers).
fn reader_went_away(e: &anyhow::Error) -> bool {
    use std::io::ErrorKind::BrokenPipe;
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == BrokenPipe)
            || c.downcast_ref::<serde_json::Error>()
                .and_then(serde_json::Error::io_error_kind)
                == Some(BrokenPipe)
            || c.downcast_ref::<csv::Error>().is_some_and(
                |e| matches!(e.kind(), csv::ErrorKind::Io(io) if io.kind() == BrokenPipe),
            )
    })
}

/// The command line; `gpuwatch` without a command is `gpuwatch snapshot`, as bare `nvidia-smi`
/// prints its table: `gpuwatch`, `gpuwatch -l 1`, `gpuwatch --json`. A usage error exits
/// [`cli::EXIT_USAGE`], apart from doctor's "at risk" (2) and a failure (1).
fn parse() -> Cli {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let e = match Cli::try_parse_from(&args) {
        Ok(cli) => return cli,
        Err(e) => e,
    };
    if names_no_command(&e, &args) {
        let mut with = args.clone();
        with.insert(1.min(with.len()), "snapshot".into());
        if let Ok(cli) = Cli::try_parse_from(&with) {
            return cli;
        }
    }
    if e.use_stderr() {
        let _ = e.print();
        std::process::exit(cli::EXIT_USAGE.into());
    }
    e.exit()
}

/// Whether the arguments failed to parse for want of a command: none given, or flags that are
/// `snapshot`'s (`-l 1`) with no command before them.
fn names_no_command(e: &clap::Error, args: &[std::ffi::OsString]) -> bool {
    use clap::error::ErrorKind;
    let missing = matches!(
        e.kind(),
        ErrorKind::MissingSubcommand
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            | ErrorKind::UnknownArgument
    );
    use clap::CommandFactory;
    let command = Cli::command();
    let named = args.iter().skip(1).any(|a| {
        command
            .get_subcommands()
            .any(|c| a.to_str() == Some(c.get_name()))
    });
    missing && !named
}

fn run() -> Result<()> {
    let cli = parse();
    // The live view owns the terminal: log lines would tear it.
    let filter = if matches!(cli.command, Command::Top(_)) {
        "off"
    } else {
        &cli.log
    };
    init_logging(cli.log_format, filter)?;
    match &cli.command {
        Command::CheckConfig { file } => return cli::check_config::check_config(file),
        Command::Plot(args) => return cli::report::plot(args),
        Command::Compare(args) => return cli::report::compare(args),
        Command::Completions { shell } => {
            use clap::CommandFactory;
            use std::io::Write;
            // Into a buffer first: the generator panics on a failed write (a closed pipe).
            let mut script = Vec::new();
            clap_complete::generate(*shell, &mut Cli::command(), "gpuwatch", &mut script);
            return std::io::stdout()
                .lock()
                .write_all(&script)
                .context("writing the completions");
        }
        Command::Man { dir } => {
            use clap::CommandFactory;
            let Some(dir) = dir else {
                return clap_mangen::Man::new(Cli::command())
                    .render(&mut std::io::stdout())
                    .context("writing the man page");
            };
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            return clap_mangen::generate_to(Cli::command(), dir)
                .with_context(|| format!("writing the man pages into {}", dir.display()));
        }
        _ => {}
    }
    let config = match &cli.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    match cli.command {
        Command::Snapshot(args) => cli::snapshot::snapshot(&args, &config),
        Command::Why(args) => cli::snapshot::why(&args, &config),
        Command::Record(args) => cli::record::record(&args, &config),
        Command::Doctor(args) => cli::doctor::doctor(&args, &config),
        Command::Watch(args) => cli::watch::watch(&args, &config),
        Command::Serve(args) => cli::serve::serve(&args, &config),
        Command::Top(args) => cli::top::top(&args, &config),
        Command::Report(args) => cli::report::report(&args, &config.prices),
        Command::CheckConfig { .. }
        | Command::Completions { .. }
        | Command::Man { .. }
        | Command::Plot(_)
        | Command::Compare(_) => {
            unreachable!("handled above")
        }
    }
}

/// Libraries whose debug and trace events carry tenant data, capped at INFO whatever `--log`
/// asks: bollard logs every inspect body (a container's environment: its secrets) at DEBUG, the
/// HTTP stacks headers and bodies. A filter of its own beside the directives, so that no more
/// specific directive (`bollard::docker=debug`) can raise them.
const CAPPED_AT_INFO: [&str; 5] = ["bollard", "hyper", "hyper_util", "ureq", "ureq_proto"];

/// Whether `target` is one of [`CAPPED_AT_INFO`] or a module of one.
fn capped(target: &str) -> bool {
    CAPPED_AT_INFO.iter().any(|c| {
        target
            .strip_prefix(c)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
    })
}

/// The log layer: `filter`'s directives, and the cap, over `writer`.
fn log_layer<S, W>(
    format: LogFormat,
    filter: &str,
    ansi: bool,
    writer: W,
) -> Result<Box<dyn tracing_subscriber::Layer<S> + Send + Sync>>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    use tracing_subscriber::filter::{filter_fn, FilterExt};
    use tracing_subscriber::Layer;
    let directives = tracing_subscriber::EnvFilter::try_new(filter)
        .with_context(|| format!("invalid --log filter {filter:?}"))?;
    let cap = filter_fn(|m| !capped(m.target()) || *m.level() <= tracing::Level::INFO);
    let layer = tracing_subscriber::fmt::layer()
        .with_ansi(ansi)
        .with_writer(writer);
    Ok(match format {
        LogFormat::Text => layer.with_filter(directives.and(cap)).boxed(),
        LogFormat::Json => layer.json().with_filter(directives.and(cap)).boxed(),
    })
}

fn init_logging(format: LogFormat, filter: &str) -> Result<()> {
    use std::io::IsTerminal;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    tracing_subscriber::registry()
        .with(log_layer(format, filter, ansi, std::io::stderr)?)
        .try_init()
        .context("starting the log")
}

#[cfg(test)]
mod tests {
    use super::{log_layer, one_line, LogFormat};
    use std::sync::{Arc, Mutex};

    /// What the log layer wrote, for the test to read.
    #[derive(Clone, Default)]
    struct Written(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Written {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// No directive raises the Docker and HTTP clients' events above INFO: not the general
    /// level, not their crate, not a more specific module of it (which beat the old cap).
    #[test]
    fn no_directive_lets_the_clients_debug_events_through() {
        use tracing_subscriber::layer::SubscriberExt;
        for directive in [
            "debug",
            "trace",
            "bollard=trace",
            "bollard::docker=debug",
            "bollard::docker=trace,hyper_util::client::legacy=trace",
            "info,bollard::docker=trace,ureq=debug",
        ] {
            for format in [LogFormat::Text, LogFormat::Json] {
                let out = Written::default();
                let writer = out.clone();
                let layer = log_layer(format, directive, false, move || writer.clone()).unwrap();
                let subscriber = tracing_subscriber::registry().with(layer);
                tracing::subscriber::with_default(subscriber, || {
                    tracing::debug!(target: "bollard::docker", "AWS_SECRET_ACCESS_KEY=AKIA1");
                    tracing::trace!(target: "hyper_util::client::legacy", "authorization: AKIA2");
                    tracing::debug!(target: "ureq", "AKIA3");
                    tracing::info!(target: "bollard::docker", "connected");
                    tracing::debug!(target: "bollardish", "not a client");
                });
                let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
                assert!(!text.contains("AKIA"), "{directive}: {text}");
                assert!(
                    text.contains("connected"),
                    "{directive}: INFO passes: {text}"
                );
                if directive == "debug" || directive == "trace" {
                    assert!(text.contains("not a client"), "{directive}: {text}");
                }
            }
        }
    }

    #[derive(Debug, thiserror::Error)]
    #[error("reading {path}: {source}")]
    struct Reading {
        path: String,
        source: std::io::Error,
    }

    /// A cause quoted by the message above it is printed once; other causes each in turn.
    #[test]
    fn each_cause_is_said_once() {
        let e = anyhow::Error::new(Reading {
            path: "/x.csv".into(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "No such file"),
        });
        assert_eq!(one_line(&e), "reading /x.csv: No such file");
        let e = e.context("plotting /x.csv");
        assert_eq!(
            one_line(&e),
            "plotting /x.csv: reading /x.csv: No such file"
        );
        let e = anyhow::anyhow!("the cause").context("what failed");
        assert_eq!(one_line(&e), "what failed: the cause");
    }
}
