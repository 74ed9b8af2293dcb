//! The `gpuwatch` command line.
mod cli;

use anyhow::{Context, Result};
use clap::Parser;
use cli::{Cli, Command};
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
    cli::logging::init_logging(cli.log_format, filter)?;
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

#[cfg(test)]
mod tests {
    use super::one_line;

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
