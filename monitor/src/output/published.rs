//! What the agent publishes after each round for everything that reads it between rounds: the
//! Prometheus endpoint, the JSON API, the web page, `top`. Readers never query a source.
use super::accounting::Accounting;
use super::recent::Recent;
use crate::health::alerts::Alert;
use crate::model::Snapshot;
use std::collections::BTreeMap;

/// One published round.
#[derive(Debug)]
pub struct Published {
    pub snapshot: Snapshot,
    /// Pending and firing alerts.
    pub alerts: Vec<Alert>,
    /// Xid errors per GPU index since the agent started.
    pub xid_totals: BTreeMap<u32, u64>,
    /// GPU-seconds busy and idle, loader seconds, since the agent started.
    pub accounting: Accounting,
    /// The last minutes of the busy shares, for the web page's charts.
    pub recent: Recent,
}

/// Builds each published round from a completed snapshot and the alerts then active, keeping
/// what runs across rounds: the Xid totals, and for `serve` the accounting and the recent
/// series (the web page's). `serve` and `top` publish through it alike.
#[derive(Debug, Default)]
pub struct Publisher {
    xid_totals: BTreeMap<u32, u64>,
    /// `None` where nothing reads them (`top`).
    history: Option<(Accounting, Recent)>,
}

impl Publisher {
    /// With `history`, each round also adds to the accounting and the recent series.
    pub fn new(history: bool) -> Self {
        Self {
            xid_totals: BTreeMap::new(),
            history: history.then(Default::default),
        }
    }

    pub fn publish(&mut self, snapshot: Snapshot, alerts: Vec<Alert>) -> Published {
        for g in &snapshot.gpus {
            *self.xid_totals.entry(g.device.index).or_default() += g.device.xid_events.len() as u64;
        }
        let (accounting, recent) = match &mut self.history {
            Some((accounting, recent)) => {
                accounting.add(&snapshot);
                recent.add(&snapshot);
                (accounting.clone(), recent.clone())
            }
            None => Default::default(),
        };
        Published {
            snapshot,
            alerts,
            xid_totals: self.xid_totals.clone(),
            accounting,
            recent,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::{container, gpu, snapshot};

    fn round(xids: Vec<u64>) -> Snapshot {
        let mut g = gpu(0);
        g.device.xid_events = xids;
        let mut s = snapshot(1_000, vec![g], vec![container("trainer")]);
        s.window_seconds = Some(1.0);
        s
    }

    #[test]
    fn xid_totals_run_across_rounds_and_history_is_kept_only_when_asked() {
        let mut serve = Publisher::new(true);
        serve.publish(round(vec![79]), Vec::new());
        let second = serve.publish(round(vec![79, 48]), Vec::new());
        assert_eq!(second.xid_totals, BTreeMap::from([(0, 3)]));
        assert!(
            !second.accounting.workloads.is_empty(),
            "serve keeps the accounting"
        );

        let mut top = Publisher::new(false);
        let shown = top.publish(round(vec![79]), Vec::new());
        assert_eq!(shown.xid_totals, BTreeMap::from([(0, 1)]));
        assert!(
            shown.accounting.workloads.is_empty(),
            "top keeps no history"
        );
    }
}
