//! The alert lifecycle: a breached condition is *pending* until it has held for the rule's `for`,
//! then *firing*; when it clears (or its subject is gone) a firing alert is *resolved*. Each alert
//! is one key (rule + subject), so a condition seen every round notifies once when it fires and
//! once when it resolves. Notifications are rate-limited over all alerts; what the limit holds
//! back is reported, not silently lost.
use super::rule::{Evaluation, Outcome, Severity, Subject};
use super::rules::{Rules, RulesConfig};
use crate::model::bounded::bounded;
use crate::model::Snapshot;
use crate::units::rfc3339;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};

/// The most characters of an alert's summary and action.
const ALERT_TEXT_MAX_CHARS: usize = 1024;

/// The config file's `alerts:` section: the rules and how often they may notify.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AlertsConfig {
    /// Notifications (firing and resolved) sent per minute at most, over all alerts; the rest
    /// are counted (`notifications_rate_limited`) and logged, not sent.
    pub max_notifications_per_minute: u32,
    pub rules: RulesConfig,
}

impl Default for AlertsConfig {
    fn default() -> Self {
        Self {
            max_notifications_per_minute: 30,
            rules: RulesConfig::default(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AlertState {
    Pending,
    Firing,
    Resolved,
}

impl AlertState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Firing => "firing",
            Self::Resolved => "resolved",
        }
    }
}

impl std::fmt::Display for AlertState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A state name that names no state (in a recording, say).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an alert state (pending, firing, resolved)")]
pub struct UnknownAlertState(pub String);

impl std::str::FromStr for AlertState {
    type Err = UnknownAlertState;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [Self::Pending, Self::Firing, Self::Resolved]
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| UnknownAlertState(s.to_owned()))
    }
}

/// One alert, as notifications and the JSON API carry it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Alert {
    pub rule: &'static str,
    pub severity: Severity,
    pub state: AlertState,
    /// Stable across rounds: rule and subject.
    pub key: String,
    pub subject: Subject,
    /// The last measured value, in `unit`.
    pub value: f64,
    pub threshold: f64,
    pub unit: &'static str,
    pub summary: String,
    /// What to do about it.
    pub action: String,
    /// When the condition was first seen (RFC 3339).
    pub active_since: String,
    pub firing_since: Option<String>,
    pub resolved_at: Option<String>,
}

/// What one round of evaluation produced.
#[derive(Debug, Default)]
pub struct Transitions {
    /// Firing and resolved transitions to notify.
    pub notify: Vec<Alert>,
    /// Transitions the rate limit held back.
    pub rate_limited: Vec<Alert>,
}

struct Tracked {
    alert: Alert,
    since_ms: u64,
}

pub struct AlertEngine {
    max_per_minute: usize,
    rules: Rules,
    tracked: BTreeMap<String, Tracked>,
    /// Send times (ms) of the notifications of the last minute.
    sent: VecDeque<u64>,
}

impl AlertEngine {
    pub fn new(config: &AlertsConfig) -> Self {
        Self {
            max_per_minute: config.max_notifications_per_minute as usize,
            rules: Rules::new(&config.rules),
            tracked: BTreeMap::new(),
            sent: VecDeque::new(),
        }
    }

    /// Runs the rules on one snapshot and moves every alert along its lifecycle.
    pub fn evaluate(&mut self, snap: &Snapshot) -> Transitions {
        // Durations on the monotonic clock; the times shown are the wall clock's.
        let (now, wall) = (snap.monotonic_ms, snap.taken_at_unix_ms);
        let evaluations = self.rules.evaluate(snap);
        let mut transitions = Vec::new();
        let mut reported: Vec<String> = Vec::with_capacity(evaluations.len());
        for e in evaluations {
            reported.push(e.key.clone());
            match e.outcome {
                Outcome::Breached(ref f) => {
                    let t = self
                        .tracked
                        .entry(e.key.clone())
                        .or_insert_with(|| Tracked {
                            alert: new_alert(&e, wall),
                            since_ms: now,
                        });
                    t.alert.value = f.value;
                    // They quote tenants' names: bounded, as every sink repeats them. (The
                    // subject is an id, which Docker makes.)
                    t.alert.summary = bounded(&f.summary, ALERT_TEXT_MAX_CHARS).into_owned();
                    t.alert.action = bounded(&f.action, ALERT_TEXT_MAX_CHARS).into_owned();
                    t.alert.subject = e.subject;
                    let held = now.saturating_sub(t.since_ms);
                    if t.alert.state == AlertState::Pending && held >= e.for_.as_millis() as u64 {
                        t.alert.state = AlertState::Firing;
                        t.alert.firing_since = Some(rfc3339(wall));
                        transitions.push(t.alert.clone());
                    }
                }
                Outcome::Clear => {
                    if let Some(a) = self.resolve(&e.key, (now, wall), None) {
                        transitions.push(a);
                    }
                }
                Outcome::Unknown => {}
            }
        }
        // Alerts whose subject no longer appears (the container stopped, the process went away).
        let gone: Vec<String> = self
            .tracked
            .keys()
            .filter(|k| !reported.contains(k))
            .cloned()
            .collect();
        for key in gone {
            if let Some(a) = self.resolve(&key, (now, wall), Some("no longer present")) {
                transitions.push(a);
            }
        }
        let mut out = Transitions::default();
        while self
            .sent
            .front()
            .is_some_and(|t| now.saturating_sub(*t) >= 60_000)
        {
            self.sent.pop_front();
        }
        for a in transitions {
            if self.sent.len() < self.max_per_minute {
                self.sent.push_back(now);
                out.notify.push(a);
            } else {
                out.rate_limited.push(a);
            }
        }
        out
    }

    /// Ends an alert; returns it when it had fired (a pending one ends silently).
    /// `at`: (monotonic, wall clock) ms.
    fn resolve(&mut self, key: &str, at: (u64, u64), note: Option<&str>) -> Option<Alert> {
        let (now, wall) = at;
        let mut t = self.tracked.remove(key)?;
        if t.alert.state != AlertState::Firing {
            return None;
        }
        t.alert.state = AlertState::Resolved;
        t.alert.resolved_at = Some(rfc3339(wall));
        let held = std::time::Duration::from_secs(now.saturating_sub(t.since_ms) / 1000);
        t.alert.summary = format!(
            "cleared{} after {}; last seen: {}",
            note.map(|n| format!(" ({n})")).unwrap_or_default(),
            humantime::format_duration(held),
            t.alert.summary
        );
        Some(t.alert)
    }

    /// Pending and firing alerts, most severe first.
    pub fn active(&self) -> Vec<Alert> {
        let mut v: Vec<Alert> = self.tracked.values().map(|t| t.alert.clone()).collect();
        v.sort_by(|a, b| {
            (b.state == AlertState::Firing, b.severity, &a.key).cmp(&(
                a.state == AlertState::Firing,
                a.severity,
                &b.key,
            ))
        });
        v
    }
}

fn new_alert(e: &Evaluation, now: u64) -> Alert {
    let (value, threshold, unit) = match &e.outcome {
        Outcome::Breached(f) => (f.value, f.threshold, f.unit),
        _ => (0.0, 0.0, ""),
    };
    Alert {
        rule: e.rule,
        severity: e.severity,
        state: AlertState::Pending,
        key: e.key.clone(),
        subject: e.subject.clone(),
        value,
        threshold,
        unit,
        summary: String::new(),
        action: String::new(),
        active_since: rfc3339(now),
        firing_since: None,
        resolved_at: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::{gpu, snapshot};

    fn engine(edit: impl FnOnce(&mut AlertsConfig)) -> AlertEngine {
        let mut c = AlertsConfig::default();
        edit(&mut c);
        AlertEngine::new(&c)
    }

    #[test]
    fn pending_then_firing_then_resolved_once_each() {
        let mut e =
            engine(|c| c.rules.gpu_temperature_high.for_ = std::time::Duration::from_secs(3));
        let hot = |t_s: u64, temp: u32| {
            let mut g = gpu(0);
            g.device.temperature_celsius = Some(temp);
            snapshot(t_s * 1000, vec![g], vec![])
        };
        let mut fired = 0;
        let mut resolved = 0;
        for t in 0..10 {
            let temp = if (2..8).contains(&t) { 90 } else { 60 };
            let out = e.evaluate(&hot(t, temp));
            for a in &out.notify {
                assert_eq!(a.rule, "gpu_temperature_high");
                match a.state {
                    AlertState::Firing => {
                        assert_eq!(t, 5, "fires once the condition held 3 s");
                        fired += 1;
                    }
                    AlertState::Resolved => {
                        assert_eq!(t, 8);
                        assert!(a.resolved_at.is_some());
                        resolved += 1;
                    }
                    AlertState::Pending => panic!("pending is never notified"),
                }
            }
            if (2..5).contains(&t) {
                assert_eq!(e.active()[0].state, AlertState::Pending);
            }
        }
        assert_eq!((fired, resolved), (1, 1));
        assert!(e.active().is_empty());
    }

    #[test]
    fn a_short_breach_never_fires() {
        let mut e =
            engine(|c| c.rules.gpu_temperature_high.for_ = std::time::Duration::from_secs(5));
        for t in 0..10u64 {
            let mut g = gpu(0);
            g.device.temperature_celsius = Some(if t == 3 { 95 } else { 50 });
            assert!(e
                .evaluate(&snapshot(t * 1000, vec![g], vec![]))
                .notify
                .is_empty());
        }
    }

    #[test]
    fn missing_data_holds_the_alert() {
        let mut e = engine(|c| c.rules.gpu_temperature_high.for_ = std::time::Duration::ZERO);
        let mut g = gpu(0);
        g.device.temperature_celsius = Some(99);
        assert_eq!(
            e.evaluate(&snapshot(0, vec![g.clone()], vec![]))
                .notify
                .len(),
            1
        );
        g.device.temperature_celsius = None; // the sensor read failed this round
        assert!(e
            .evaluate(&snapshot(1000, vec![g.clone()], vec![]))
            .notify
            .is_empty());
        assert_eq!(e.active()[0].state, AlertState::Firing);
        // The GPU disappears from the snapshot: resolved, saying why.
        let out = e.evaluate(&snapshot(2000, vec![], vec![]));
        assert_eq!(out.notify[0].state, AlertState::Resolved);
        assert!(
            out.notify[0]
                .summary
                .starts_with("cleared (no longer present) after 2s; last seen: GPU 0 at 99"),
            "{}",
            out.notify[0].summary
        );
    }

    /// The wall clock steps back an hour (an NTP correction, an operator's `date -s`) while the
    /// monotonic clock goes on. With durations on the wall clock both checks below read 0 s
    /// for an hour: the pending alert would not fire, the rate limit's minute would not end.
    #[test]
    fn a_wall_clock_step_neither_holds_alerts_nor_wedges_the_rate_limit() {
        let hot = |i: u32, yes: bool| {
            let mut g = gpu(i);
            g.device.temperature_celsius = Some(if yes { 99 } else { 40 });
            g
        };
        let at = |mono: u64, wall: u64, gpus: Vec<crate::model::Gpu>| {
            let mut s = snapshot(wall, gpus, vec![]);
            s.monotonic_ms = mono;
            s
        };
        let (wall0, hour) = (10_000_000_000u64, 3_600_000u64);
        // A pending alert across the step fires after its 3 s.
        let mut e =
            engine(|c| c.rules.gpu_temperature_high.for_ = std::time::Duration::from_secs(3));
        let mut fired_at = None;
        for t in 0..5u64 {
            let wall = if t < 2 {
                wall0 + t * 1000
            } else {
                wall0 - hour + t * 1000
            };
            if !e
                .evaluate(&at(t * 1000, wall, vec![hot(0, true)]))
                .notify
                .is_empty()
            {
                fired_at.get_or_insert(t);
            }
        }
        assert_eq!(fired_at, Some(3));
        // A notification sent before the step still leaves the limit's minute after 60 s.
        let mut e = engine(|c| {
            c.max_notifications_per_minute = 1;
            c.rules.gpu_temperature_high.for_ = std::time::Duration::ZERO;
        });
        let out = e.evaluate(&at(0, wall0, vec![hot(0, true)]));
        assert_eq!(out.notify.len(), 1);
        let out = e.evaluate(&at(1000, wall0 - hour, vec![hot(0, true), hot(1, true)]));
        assert_eq!(out.rate_limited.len(), 1, "within the minute: held back");
        let gpus = vec![hot(0, true), hot(1, true), hot(2, true)];
        let out = e.evaluate(&at(62_000, wall0 - hour + 61_000, gpus));
        assert_eq!(out.notify.len(), 1, "the minute is over: {out:?}");
        assert!(out.notify[0].key.contains('2') || out.notify[0].summary.contains("GPU 2"));
    }

    #[test]
    fn rate_limit_holds_back_and_reports() {
        let mut e = engine(|c| {
            c.max_notifications_per_minute = 2;
            c.rules.gpu_temperature_high.for_ = std::time::Duration::ZERO;
        });
        let gpus: Vec<_> = (0..4)
            .map(|i| {
                let mut g = gpu(i);
                g.device.temperature_celsius = Some(99);
                g
            })
            .collect();
        let out = e.evaluate(&snapshot(0, gpus.clone(), vec![]));
        assert_eq!((out.notify.len(), out.rate_limited.len()), (2, 2));
        // A minute later the budget is back.
        let cool: Vec<_> = gpus
            .into_iter()
            .map(|mut g| {
                g.device.temperature_celsius = Some(40);
                g
            })
            .collect();
        let out = e.evaluate(&snapshot(61_000, cool, vec![]));
        assert_eq!(out.notify.len(), 2);
    }
}
