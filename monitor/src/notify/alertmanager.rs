//! The body an Alertmanager webhook receiver gets (`webhook.format: alertmanager`): version 4 of
//! Alertmanager's webhook message, one alert a message, so the receivers written for
//! Alertmanager (chat bridges, paging tools, ticketing) take gpuwatch's notifications as they
//! are. The fields and their spelling follow Alertmanager's `notify/webhook` message and
//! `template.Data`; the fingerprint is Prometheus's label-set fingerprint (FNV-1a 64 over the
//! sorted names and values, each followed by the byte 0xff).
use crate::health::alerts::{Alert, AlertState};
use serde::Serialize;
use std::collections::BTreeMap;

/// What Alertmanager writes for an alert that has not ended.
const NOT_ENDED: &str = "0001-01-01T00:00:00Z";

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Message {
    version: &'static str,
    group_key: String,
    truncated_alerts: u32,
    status: &'static str,
    receiver: &'static str,
    group_labels: BTreeMap<&'static str, String>,
    common_labels: BTreeMap<&'static str, String>,
    common_annotations: BTreeMap<&'static str, String>,
    #[serde(rename = "externalURL")]
    external_url: &'static str,
    alerts: [AlertBody; 1],
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct AlertBody {
    status: &'static str,
    labels: BTreeMap<&'static str, String>,
    annotations: BTreeMap<&'static str, String>,
    starts_at: String,
    ends_at: String,
    #[serde(rename = "generatorURL")]
    generator_url: &'static str,
    fingerprint: String,
}

/// The message for one alert's transition, from `host`.
pub fn message(alert: &Alert, host: &str) -> Message {
    let status = match alert.state {
        AlertState::Resolved => "resolved",
        AlertState::Firing | AlertState::Pending => "firing",
    };
    let labels = labels(alert, host);
    let mut annotations = BTreeMap::new();
    annotations.insert("summary", alert.summary.clone());
    annotations.insert("description", alert.action.clone());
    annotations.insert("value", format!("{} {}", alert.value, alert.unit));
    annotations.insert("threshold", format!("{} {}", alert.threshold, alert.unit));
    // One group per alert's label set: a group per rule made every holder's alert one
    // incident in receivers that key on `groupKey`, so one holder's `resolved` closed the
    // others'.
    let group_labels = labels.clone();
    Message {
        version: "4",
        group_key: group_key(&group_labels),
        truncated_alerts: 0,
        status,
        receiver: "gpuwatch",
        group_labels,
        common_labels: labels.clone(),
        common_annotations: annotations.clone(),
        external_url: "",
        alerts: [AlertBody {
            status,
            fingerprint: format!("{:016x}", fingerprint(&labels)),
            labels,
            annotations,
            starts_at: alert
                .firing_since
                .clone()
                .unwrap_or_else(|| alert.active_since.clone()),
            ends_at: alert
                .resolved_at
                .clone()
                .unwrap_or_else(|| NOT_ENDED.to_owned()),
            generator_url: "",
        }],
    }
}

/// Alertmanager's `groupKey` for a group of the root route: `{}:` and the group's labels as a
/// label set prints them, sorted, each value quoted and escaped.
fn group_key(labels: &BTreeMap<&'static str, String>) -> String {
    let set: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{k}={}", serde_json::Value::from(v.as_str())))
        .collect();
    format!("{{}}:{{{}}}", set.join(", "))
}

/// The alert's labels: its rule, severity and host, and what it is about.
fn labels(alert: &Alert, host: &str) -> BTreeMap<&'static str, String> {
    let mut l = BTreeMap::new();
    l.insert("alertname", alert.rule.to_owned());
    l.insert("severity", alert.severity.as_str().to_owned());
    l.insert("host", host.to_owned());
    let s = &alert.subject;
    if let Some(g) = &s.gpu {
        l.insert("gpu", g.index.to_string());
        if let Some(u) = &g.uuid {
            l.insert("gpu_uuid", u.clone());
        }
    }
    if let Some(c) = &s.container {
        l.insert("container_name", c.name.clone());
        l.insert("workload", c.workload.to_string());
        for (k, v) in [
            (
                "container_id",
                c.id.as_ref().map(|i| i.chars().take(12).collect()),
            ),
            ("image", c.image.clone()),
            ("compose_service", c.compose_service.clone()),
            ("pod", c.pod.clone()),
        ] {
            if let Some(v) = v {
                l.insert(k, v);
            }
        }
    }
    if let Some(pid) = s.pid {
        l.insert("pid", pid.to_string());
    }
    l
}

/// Prometheus's fingerprint of a label set: FNV-1a 64 over each name and value in name order,
/// each followed by the separator byte 0xff.
fn fingerprint(labels: &BTreeMap<&'static str, String>) -> u64 {
    const OFFSET: u64 = 14_695_981_039_346_656_037;
    const PRIME: u64 = 1_099_511_628_211;
    let mut h = OFFSET;
    let mut add = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(PRIME);
        }
    };
    for (k, v) in labels {
        add(k.as_bytes());
        add(&[0xff]);
        add(v.as_bytes());
        add(&[0xff]);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::rule::{GpuRef, Severity, Subject};

    fn alert(state: AlertState) -> Alert {
        Alert {
            rule: "gpu_temperature_high",
            severity: Severity::Critical,
            state,
            key: "gpu_temperature_high/gpu0".into(),
            subject: Subject {
                gpu: Some(GpuRef {
                    index: 0,
                    uuid: Some("GPU-abc".into()),
                }),
                container: None,
                pid: None,
            },
            value: 91.0,
            threshold: 85.0,
            unit: "°C",
            summary: "GPU 0 at 91 °C".into(),
            action: "check the fans and airflow".into(),
            active_since: "2026-12-06T03:00:00Z".into(),
            firing_since: Some("2026-12-06T03:01:00Z".into()),
            resolved_at: None,
        }
    }

    #[test]
    fn a_firing_alert_reads_as_alertmanagers_version_4_message() {
        let v = serde_json::to_value(message(&alert(AlertState::Firing), "node-1")).unwrap();
        assert_eq!(v["version"], "4");
        assert_eq!(v["status"], "firing");
        assert_eq!(v["receiver"], "gpuwatch");
        assert_eq!(
            v["groupKey"],
            "{}:{alertname=\"gpu_temperature_high\", gpu=\"0\", gpu_uuid=\"GPU-abc\", \
             host=\"node-1\", severity=\"critical\"}"
        );
        assert_eq!(v["truncatedAlerts"], 0);
        assert_eq!(v["groupLabels"]["alertname"], "gpu_temperature_high");
        assert_eq!(v["groupLabels"]["gpu"], "0");
        assert_eq!(v["externalURL"], "");
        let a = &v["alerts"][0];
        assert_eq!(a["labels"]["alertname"], "gpu_temperature_high");
        assert_eq!(a["labels"]["severity"], "critical");
        assert_eq!(a["labels"]["host"], "node-1");
        assert_eq!(a["labels"]["gpu"], "0");
        assert_eq!(a["labels"]["gpu_uuid"], "GPU-abc");
        assert_eq!(a["annotations"]["summary"], "GPU 0 at 91 °C");
        assert_eq!(
            a["annotations"]["description"],
            "check the fans and airflow"
        );
        assert_eq!(a["startsAt"], "2026-12-06T03:01:00Z");
        assert_eq!(a["endsAt"], NOT_ENDED);
        assert_eq!(a["generatorURL"], "");
        assert_eq!(v["commonLabels"], a["labels"]);
        assert_eq!(v["commonAnnotations"], a["annotations"]);
        // The same labels give the same fingerprint, resolved or not; 16 hex digits.
        let resolved = {
            let mut r = alert(AlertState::Resolved);
            r.resolved_at = Some("2026-12-06T03:05:00Z".into());
            serde_json::to_value(message(&r, "node-1")).unwrap()
        };
        assert_eq!(resolved["status"], "resolved");
        assert_eq!(resolved["alerts"][0]["endsAt"], "2026-12-06T03:05:00Z");
        assert_eq!(resolved["alerts"][0]["fingerprint"], a["fingerprint"]);
        assert_eq!(a["fingerprint"].as_str().unwrap().len(), 16);
    }

    /// Two holders of one rule are two groups: the `resolved` of one cannot close the other's
    /// incident in a receiver that keys on `groupKey`.
    #[test]
    fn each_holder_of_a_rule_is_its_own_group() {
        let on = |index: u32| {
            let mut a = alert(AlertState::Firing);
            a.subject.gpu = Some(GpuRef {
                index,
                uuid: Some(format!("GPU-{index}")),
            });
            serde_json::to_value(message(&a, "node-1")).unwrap()
        };
        let (a, b) = (on(0), on(1));
        assert_ne!(a["groupKey"], b["groupKey"]);
        assert_ne!(a["groupLabels"], b["groupLabels"]);
        // A quote in a value cannot run into the next label.
        let mut odd = alert(AlertState::Firing);
        odd.subject.gpu = Some(GpuRef {
            index: 0,
            uuid: Some("x\", host=\"node-2".into()),
        });
        let key = message(&odd, "node-1").group_key;
        assert!(key.contains(r#"gpu_uuid="x\", host=\"node-2""#), "{key}");
    }

    #[test]
    fn the_fingerprint_is_fnv1a_over_sorted_names_and_values() {
        // FNV-1a 64 of the empty input is its offset basis; of "a\xffb\xff", computed by hand
        // with the same rule.
        assert_eq!(fingerprint(&BTreeMap::new()), 0xcbf2_9ce4_8422_2325);
        let one = BTreeMap::from([("a", "b".to_owned())]);
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in [b'a', 0xff, b'b', 0xff] {
            h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
        assert_eq!(fingerprint(&one), h);
        // Order of insertion does not matter: names are sorted.
        let ab = BTreeMap::from([("a", "1".to_owned()), ("b", "2".to_owned())]);
        let ba = BTreeMap::from([("b", "2".to_owned()), ("a", "1".to_owned())]);
        assert_eq!(fingerprint(&ab), fingerprint(&ba));
    }
}
