//! The agent's alerts, as Prometheus's own ALERTS series: one per pending or firing alert.
use super::{family, Labels};
use crate::health::alerts::Alert;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType::Gauge;

pub(super) fn encode(
    enc: &mut DescriptorEncoder<'_>,
    alerts: &[Alert],
) -> Result<(), std::fmt::Error> {
    family(
        enc,
        "gpuwatch_alert",
        "1 per pending or firing alert of the agent's rules.",
        None,
        Gauge,
        alerts.iter().map(|a| {
            let mut l: Labels = vec![
                ("rule", a.rule.to_owned()),
                ("severity", a.severity.as_str().to_owned()),
                ("state", a.state.as_str().to_owned()),
            ];
            if let Some(g) = &a.subject.gpu {
                l.push(("gpu", g.index.to_string()));
            }
            if let Some(c) = &a.subject.container {
                l.push(("container_name", c.name.clone()));
            }
            (l, 1.0)
        }),
    )
}
