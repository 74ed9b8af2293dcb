//! `gpuwatch top`: the live view.
use super::{stop_on_signals, RunArgs, SourceArgs};
use anyhow::{Context, Result};
use clap::Args;
use gpuwatch::config::Config;
use gpuwatch::runtime::Agent;
use std::time::Duration;

#[derive(Args)]
pub(crate) struct TopArgs {
    #[command(flatten)]
    pub(crate) sources: SourceArgs,
    #[command(flatten)]
    pub(crate) run: RunArgs,
    #[command(flatten)]
    pub(crate) gpus: super::GpuFilter,
}

pub(crate) fn top(args: &TopArgs, config: &Config) -> Result<()> {
    use gpuwatch::health::alerts::AlertEngine;
    use gpuwatch::output::published::Published;
    use gpuwatch::top::View;
    use ratatui::crossterm::event::{self, Event, KeyEventKind};
    use std::io::IsTerminal;
    use std::sync::atomic::Ordering;
    use std::time::Instant;
    let interval = args.run.interval(config)?;
    anyhow::ensure!(
        std::io::stdout().is_terminal() && std::io::stdin().is_terminal(),
        "gpuwatch top needs a terminal to draw on and read keys from; use `gpuwatch snapshot` \
         or `record` in scripts"
    );
    let stop = stop_on_signals()?;
    // A hangup here is the terminal going away (a closed SSH session, a killed tmux): the view
    // has nowhere to draw, so it ends, as every full-screen program does.
    signal_hook::flag::register(signal_hook::consts::SIGHUP, stop.clone())
        .context("installing the SIGHUP handler")?;
    // The live view fetches the GPU series every round (~2 ms a GPU per fetch): a published
    // round then lags by one interval, not by the series interval.
    let mut agent_config = args.sources.agent_config(config);
    agent_config.sampler.series_interval = interval;
    let mut agent =
        Agent::start(&agent_config, Duration::from_secs(3)).context("starting the agent")?;
    let mut engine = AlertEngine::new(&config.alerts);
    let mut publisher = gpuwatch::output::published::Publisher::new(false);
    // Each round's completed snapshots through the rules; the newest is shown.
    let mut publish = |agent: &mut Agent, shown: Option<Published>| -> Option<Published> {
        let mut latest = shown;
        for mut snapshot in agent.round() {
            // Checked against the first round before the terminal is taken; a GPU lost since
            // leaves the view to the others.
            let _ = args.gpus.apply(&mut snapshot);
            engine.evaluate(&snapshot);
            latest = Some(publisher.publish(snapshot, engine.active()));
        }
        latest
    };
    let mut view = View::new(std::env::var_os("NO_COLOR").is_none());
    let mut exported = publish(&mut agent, None).context("the first round did not complete")?;
    if let Some(list) = &args.gpus.gpu {
        let named = gpuwatch::model::parse_visible_devices(list);
        let (_, missing) = named.resolve(&exported.snapshot.gpus);
        // The first snapshot is already narrowed: an entry that named a GPU still does.
        anyhow::ensure!(
            missing.is_empty() || !exported.snapshot.gpus.is_empty(),
            "--gpu {list}: {}",
            missing.join("; ")
        );
    }
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
                if terminal_hung_up(wake.saturating_duration_since(Instant::now())) {
                    return Ok(());
                }
                let mut seen = false;
                while event::poll(Duration::ZERO).context("reading the keyboard")? {
                    seen = true;
                    if let Event::Key(k) = event::read().context("reading the keyboard")? {
                        if k.kind == KeyEventKind::Press && !view.key(k) {
                            return Ok(());
                        }
                    }
                }
                if seen {
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

/// Waits up to `timeout` for input on the terminal; true when the terminal is gone (hung up,
/// closed). crossterm's own wait cannot tell: on a hung-up terminal it spins in its read loop
/// and never returns, so signals and the clock would go unheeded.
fn terminal_hung_up(timeout: Duration) -> bool {
    let mut fd = libc::pollfd {
        fd: libc::STDIN_FILENO,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: one valid pollfd, for the duration of the call.
    let n = unsafe { libc::poll(&mut fd, 1, ms) };
    n > 0 && fd.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0
}
