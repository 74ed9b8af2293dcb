//! Where alert notifications go: the log, an HTTP webhook, a command. Sending never blocks
//! sampling: the webhook and the command each have a worker thread behind a bounded queue; a
//! full queue drops the notification and counts it (`notification_dropped`), a receiver that
//! stays down costs retries with back-off on the worker, then `notification_failed`.
mod alertmanager;

use crate::events::{EventCounters, NotificationDropped, NotificationFailed};
use crate::field_error::FieldError;
use crate::health::alerts::{Alert, AlertState};
use crate::units::duration;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The config file's `notify:` section.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NotifyConfig {
    /// Log every firing and resolved alert (at warning and info level).
    pub log: bool,
    pub webhook: Option<WebhookConfig>,
    pub command: Option<CommandConfig>,
}

impl Default for NotifyConfig {
    fn default() -> Self {
        Self {
            log: true,
            webhook: None,
            command: None,
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookConfig {
    /// `http://` or `https://` URL that receives a JSON POST per notification.
    pub url: String,
    /// Extra request headers (e.g. `Authorization`).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Timeout of one attempt.
    #[serde(default = "default_timeout", with = "duration")]
    pub timeout: Duration,
    /// Attempts after the first one fails.
    #[serde(default = "default_retries")]
    pub retries: u32,
    /// Wait before the first retry; doubles after each, up to a minute.
    #[serde(default = "default_backoff", with = "duration")]
    pub backoff: Duration,
    /// Notifications waiting to be sent at most; more are dropped and counted.
    #[serde(default = "default_queue")]
    pub queue: usize,
    /// The body: gpuwatch's own [`Notification`], or Alertmanager's webhook message (version
    /// 4), for receivers written for Alertmanager.
    #[serde(default)]
    pub format: WebhookFormat,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WebhookFormat {
    #[default]
    Gpuwatch,
    Alertmanager,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandConfig {
    /// The program and its arguments (no shell). It gets the notification as JSON on stdin and
    /// `GPUWATCH_ALERT_RULE`, `_STATE`, `_SEVERITY`, `_SUMMARY` in its environment.
    pub argv: Vec<String>,
    /// Killed when it runs longer.
    #[serde(default = "default_command_timeout", with = "duration")]
    pub timeout: Duration,
    #[serde(default = "default_queue")]
    pub queue: usize,
}

fn default_timeout() -> Duration {
    Duration::from_secs(5)
}
fn default_retries() -> u32 {
    5
}
fn default_backoff() -> Duration {
    Duration::from_secs(1)
}
fn default_queue() -> usize {
    256
}
fn default_command_timeout() -> Duration {
    Duration::from_secs(10)
}

impl NotifyConfig {
    pub fn validate(&self) -> Result<(), FieldError> {
        if let Some(w) = &self.webhook {
            if !(w.url.starts_with("http://") || w.url.starts_with("https://")) {
                return Err(FieldError::new(
                    "webhook.url",
                    format!("{:?} is not an http:// or https:// URL", w.url),
                ));
            }
            if w.queue == 0 {
                return Err(FieldError::new("webhook.queue", "must be at least 1"));
            }
        }
        if let Some(c) = &self.command {
            if c.argv.is_empty() || c.argv[0].is_empty() {
                return Err(FieldError::new("command.argv", "names no program"));
            }
            if c.queue == 0 {
                return Err(FieldError::new("command.queue", "must be at least 1"));
            }
        }
        Ok(())
    }
}

/// The JSON body a webhook receives and a command reads on stdin.
#[derive(Serialize)]
pub struct Notification<'a> {
    /// Bumped on an incompatible change.
    pub version: u32,
    /// `firing` or `resolved`.
    pub status: AlertState,
    pub host: &'a str,
    pub alert: &'a Alert,
}

/// The configured sinks, with their workers.
pub struct Notifier {
    log: bool,
    host: String,
    webhook_format: WebhookFormat,
    webhook: Option<Worker>,
    command: Option<Worker>,
    events: Arc<EventCounters>,
}

struct Worker {
    name: &'static str,
    queue: SyncSender<Vec<u8>>,
    handle: JoinHandle<()>,
}

impl Notifier {
    pub fn start(config: &NotifyConfig, host: &str, events: Arc<EventCounters>) -> Self {
        let webhook = config.webhook.clone().and_then(|c| {
            let events = events.clone();
            spawn("webhook", c.queue, move |rx| {
                webhook_worker(&c, &rx, &events)
            })
        });
        let command = config.command.clone().and_then(|c| {
            let events = events.clone();
            spawn("command", c.queue, move |rx| {
                command_worker(&c, &rx, &events)
            })
        });
        Self {
            log: config.log,
            host: host.to_owned(),
            webhook_format: config
                .webhook
                .as_ref()
                .map_or(WebhookFormat::Gpuwatch, |w| w.format),
            webhook,
            command,
            events,
        }
    }

    /// Hands `alert` to every sink; returns at once.
    pub fn send(&self, alert: &Alert) {
        if self.log {
            match alert.state {
                AlertState::Firing => tracing::warn!(
                    rule = alert.rule,
                    severity = ?alert.severity,
                    "FIRING {}: {} — {}",
                    alert.rule,
                    alert.summary,
                    alert.action
                ),
                // At the level of the firing, so whoever saw it fire (journald at the default
                // level) sees it end.
                _ => tracing::warn!(
                    rule = alert.rule,
                    "RESOLVED {}: {}",
                    alert.rule,
                    alert.summary
                ),
            }
        }
        if self.webhook.is_none() && self.command.is_none() {
            return;
        }
        let body = match serde_json::to_vec(&Notification {
            version: 1,
            status: alert.state,
            host: &self.host,
            alert,
        }) {
            Ok(b) => b,
            Err(e) => {
                self.events.emit(NotificationFailed {
                    notifier: "encoding".into(),
                    alert: alert.key.to_string(),
                    error: e.to_string(),
                });
                return;
            }
        };
        let webhook_body = match self.webhook_format {
            WebhookFormat::Gpuwatch => Ok(body.clone()),
            WebhookFormat::Alertmanager => {
                serde_json::to_vec(&alertmanager::message(alert, &self.host))
            }
        };
        let bodies = [
            (&self.webhook, webhook_body.map_err(|e| e.to_string())),
            (&self.command, Ok(body)),
        ];
        for (w, body) in bodies {
            let Some(w) = w else { continue };
            let body = match body {
                Ok(b) => b,
                Err(e) => {
                    self.events.emit(NotificationFailed {
                        notifier: format!("encoding for the {}", w.name),
                        alert: alert.key.to_string(),
                        error: e.to_string(),
                    });
                    continue;
                }
            };
            match w.queue.try_send(body) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) => self.events.emit(NotificationDropped {
                    notifier: w.name.to_string(),
                    what: format!("queue full; dropped {} {:?}", alert.key, alert.state),
                }),
                Err(TrySendError::Disconnected(_)) => self.events.emit(NotificationFailed {
                    notifier: w.name.to_string(),
                    alert: alert.key.to_string(),
                    error: "its worker is gone; not sent".into(),
                }),
            }
        }
    }

    /// Stops taking notifications and gives the workers until `deadline` to send what is
    /// queued; what is left then is counted as dropped.
    pub fn shutdown(self, deadline: Duration) {
        let until = Instant::now() + deadline;
        for w in [self.webhook, self.command].into_iter().flatten() {
            drop(w.queue);
            while !w.handle.is_finished() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(20));
            }
            if !w.handle.is_finished() {
                self.events.emit(NotificationDropped {
                    notifier: w.name.to_string(),
                    what: "still busy at shutdown; its queue is lost".into(),
                });
            }
        }
    }
}

fn spawn(
    name: &'static str,
    capacity: usize,
    run: impl FnOnce(Receiver<Vec<u8>>) + Send + 'static,
) -> Option<Worker> {
    let (queue, rx) = mpsc::sync_channel(capacity);
    match std::thread::Builder::new()
        .name(format!("gpuwatch-{name}"))
        .spawn(move || run(rx))
    {
        Ok(handle) => Some(Worker {
            name,
            queue,
            handle,
        }),
        Err(e) => {
            tracing::error!("cannot start the {name} notifier thread: {e}; {name} disabled");
            None
        }
    }
}

fn webhook_worker(c: &WebhookConfig, rx: &Receiver<Vec<u8>>, events: &EventCounters) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(c.timeout))
        .http_status_as_error(true)
        .build()
        .into();
    while let Ok(body) = rx.recv() {
        let mut wait = c.backoff;
        for attempt in 0..=c.retries {
            let mut req = agent.post(&c.url).content_type("application/json");
            for (k, v) in &c.headers {
                req = req.header(k, v);
            }
            match req.send(&body[..]) {
                Ok(_) => break,
                Err(e) if attempt == c.retries => {
                    events.emit(NotificationFailed {
                        notifier: format!("webhook {}", c.url),
                        alert: String::new(),
                        error: format!("{e}; gave up after {} attempts", attempt + 1),
                    });
                }
                Err(e) => {
                    tracing::debug!("webhook {}: {e}; retrying in {wait:?}", c.url);
                    std::thread::sleep(wait);
                    wait = (wait * 2).min(Duration::from_secs(60));
                }
            }
        }
    }
}

fn command_worker(c: &CommandConfig, rx: &Receiver<Vec<u8>>, events: &EventCounters) {
    while let Ok(body) = rx.recv() {
        if let Err(e) = run_command(c, &body) {
            events.emit(NotificationFailed {
                notifier: format!("command {:?}", c.argv[0]),
                alert: String::new(),
                error: e.to_string(),
            });
        }
    }
}

/// Why a command notifier's run failed.
#[derive(Debug, thiserror::Error)]
enum CommandError {
    #[error("the alert body is not JSON: {0}")]
    Body(serde_json::Error),
    #[error("cannot start: {0}")]
    Start(std::io::Error),
    #[error("exited with {0}")]
    Exited(std::process::ExitStatus),
    #[error("killed after {0:?}")]
    TimedOut(std::time::Duration),
    #[error("waiting for it: {0}")]
    Wait(std::io::Error),
}

fn run_command(c: &CommandConfig, body: &[u8]) -> Result<(), CommandError> {
    let alert: serde_json::Value = serde_json::from_slice(body).map_err(CommandError::Body)?;
    let field = |path: &[&str]| {
        let mut v = &alert;
        for p in path {
            v = &v[p];
        }
        // A workload named with escape bytes must not reach a script's terminal or log raw.
        crate::output::escape::terminal(v.as_str().unwrap_or_default()).into_owned()
    };
    let mut child = std::process::Command::new(&c.argv[0])
        .args(&c.argv[1..])
        .env("GPUWATCH_ALERT_RULE", field(&["alert", "rule"]))
        .env("GPUWATCH_ALERT_STATE", field(&["status"]))
        .env("GPUWATCH_ALERT_SEVERITY", field(&["alert", "severity"]))
        .env("GPUWATCH_ALERT_SUMMARY", field(&["alert", "summary"]))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .map_err(CommandError::Start)?;
    if let Some(mut stdin) = child.stdin.take() {
        // A command that ignores its input closes the pipe early; that is its business.
        let _ = stdin.write_all(body);
    }
    let until = Instant::now() + c.timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(()),
            Ok(Some(status)) => return Err(CommandError::Exited(status)),
            Ok(None) if Instant::now() >= until => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(CommandError::TimedOut(c.timeout));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(CommandError::Wait(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_commands_environment_carries_no_control_bytes() {
        // A workload named after a cgroup whose name holds an escape sequence.
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("summary");
        let c = CommandConfig {
            argv: vec![
                "/bin/sh".into(),
                "-c".into(),
                format!("printf %s \"$GPUWATCH_ALERT_SUMMARY\" > {}", out.display()),
            ],
            timeout: Duration::from_secs(5),
            queue: 1,
        };
        let body = serde_json::json!({"status": "firing",
            "alert": {"rule": "gpu_underutilized", "severity": "warning",
                      "summary": "/rt\u{1b}]0;owned\u{7}: GPU busy 3%"}});
        run_command(&c, body.to_string().as_bytes()).unwrap();
        let got = std::fs::read_to_string(&out).unwrap();
        assert!(!got.contains('\u{1b}') && !got.contains('\u{7}'), "{got:?}");
        assert_eq!(got, "/rt\\u{1b}]0;owned\\u{7}: GPU busy 3%");
    }
}
