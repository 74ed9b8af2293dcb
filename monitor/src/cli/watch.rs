//! `gpuwatch watch`: the alert rules every interval, each transition printed and notified.
use super::{stop_on_signals, PrivilegeArgs, RunArgs, SourceArgs};
use anyhow::{Context, Result};
use clap::Args;
use gpuwatch::config::Config;
use gpuwatch::output::table;
use gpuwatch::runtime::Agent;
use std::io::Write;
use std::time::Duration;

#[derive(Args)]
pub(crate) struct WatchArgs {
    #[command(flatten)]
    pub(crate) sources: SourceArgs,
    #[command(flatten)]
    pub(crate) run: RunArgs,
    #[command(flatten)]
    pub(crate) privileges: PrivilegeArgs,
    /// `--format json` (`--json`): each transition as a JSON line, the webhook's body; text is
    /// a line per transition.
    #[command(flatten)]
    pub(crate) print: super::PrintArgs,
}

pub(crate) fn watch(args: &WatchArgs, config: &Config) -> Result<()> {
    use gpuwatch::notify::Notification;
    let interval = args.run.interval(config)?;
    let agent_config = args.sources.agent_config(config);
    let user = args.privileges.identity(&agent_config)?;
    let stop = stop_on_signals()?;
    let mut agent =
        Agent::start(&agent_config, Duration::from_secs(3)).context("starting the agent")?;
    args.privileges.apply(&agent, user.as_ref())?;
    let mut stdout = std::io::stdout().lock();
    let mut said = false;
    // Each transition is printed on stdout below: the log sink would say it a second time on
    // the same terminal.
    let mut config = config.clone();
    config.notify.log = false;
    gpuwatch::runtime::daemon::run_rounds(
        &mut agent,
        &config,
        interval,
        args.run.duration,
        &stop,
        |snap, round, _| -> Result<()> {
            if !std::mem::replace(&mut said, true) {
                // Once, on stderr (stdout stays the transitions): what is being watched.
                eprintln!("{}", watching(&snap, &config));
            }
            for a in &round.notify {
                if args.print.json() {
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

/// What `watch` watches, said once before the first transition: the GPUs, the workloads, the
/// rules that run and where alerts go.
fn watching(snap: &gpuwatch::model::Snapshot, config: &Config) -> String {
    use gpuwatch::health::rules::RULE_NAMES;
    let rules = &config.alerts.rules;
    let on: Vec<&str> = RULE_NAMES
        .iter()
        .copied()
        .filter(|r| rules.is_enabled(r))
        .collect();
    let holding = snap
        .workloads
        .iter()
        .filter(|w| w.gpu.processes > 0)
        .count();
    let mut to = Vec::new();
    if config.notify.log {
        to.push("the log");
    }
    if config.notify.webhook.is_some() {
        to.push("a webhook");
    }
    if config.notify.command.is_some() {
        to.push("a command");
    }
    format!(
        "gpuwatch watch on {}: {} GPUs, {} workloads ({holding} holding a GPU); {} of {} alert \
         rules on ({}); alerts go to {} and below as they fire and resolve",
        snap.host.hostname,
        snap.gpus.len(),
        snap.workloads.len(),
        on.len(),
        RULE_NAMES.len(),
        on.join(", "),
        if to.is_empty() {
            "nowhere else".to_owned()
        } else {
            to.join(", ")
        },
    )
}
