//! `gpuwatch check-config`: validates a config file and says what it enables.
use anyhow::{Context, Result};
use gpuwatch::config::Config;
use std::io::Write;

pub(crate) fn check_config(file: &std::path::Path) -> Result<()> {
    let c = Config::load(file)?;
    let r = &c.alerts.rules;
    let enabled: Vec<&str> = gpuwatch::health::rules::RULE_NAMES
        .iter()
        .copied()
        .filter(|name| r.is_enabled(name))
        .collect();
    writeln!(
        std::io::stdout().lock(),
        "{}: ok (interval {}, serve {}, {} of {} alert rules enabled: {}; notify: log{}{})",
        file.display(),
        humantime::format_duration(c.interval),
        humantime::format_duration(c.serve_interval),
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
    )
    .context("writing to stdout")
}
