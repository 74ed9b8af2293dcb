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

/// Adds the round's Xid events to the per-GPU totals [`Published::xid_totals`] carries.
pub fn count_xids(totals: &mut BTreeMap<u32, u64>, s: &Snapshot) {
    for g in &s.gpus {
        *totals.entry(g.device.index).or_default() += g.device.xid_events.len() as u64;
    }
}
