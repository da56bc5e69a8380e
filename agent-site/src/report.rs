//! What the power sync loop saw and has not sent yet: the newest observation per node, stamped
//! with the lease epoch it was made under.
//!
//! # Design
//! A map, not a queue: while the session is down the newest state of each BMC replaces the older
//! one (memory stays bounded by the number of BMCs, and the control plane learns where each
//! machine is now). Reports leave through `SessionHooks::next_report`, at most
//! [`MAX_OBSERVATIONS`] observations each; observations of an older epoch are dropped when a new
//! epoch's first one arrives.

use std::collections::BTreeMap;

use bc_protocol::pb::{PowerObservation, PowerReport};
use parking_lot::Mutex;
use tokio::sync::Notify;

/// Observations per `PowerReport` at most (a sweep of 1,000 BMCs goes out in two messages,
/// well under gRPC's 4 MiB message limit).
pub const MAX_OBSERVATIONS: usize = 500;

#[derive(Debug, Default)]
struct Pending {
    epoch: u64,
    by_node: BTreeMap<String, PowerObservation>,
}

/// The observations waiting to be reported.
#[derive(Debug, Default)]
pub struct Reports {
    pending: Mutex<Pending>,
    notify: Notify,
}

impl Reports {
    /// Queues `obs`, made under lease `epoch`, replacing an older one of the same node.
    pub fn push(&self, epoch: u64, obs: PowerObservation) {
        {
            let mut p = self.pending.lock();
            if p.epoch != epoch {
                p.by_node.clear();
                p.epoch = epoch;
            }
            p.by_node.insert(obs.node_id.clone(), obs);
        }
        self.notify.notify_one();
    }

    /// Drops everything queued (the lease was lost: these are no longer ours to report).
    pub fn clear(&self) {
        self.pending.lock().by_node.clear();
    }

    /// Takes up to [`MAX_OBSERVATIONS`] observations as one report, if any are queued.
    pub fn take(&self) -> Option<PowerReport> {
        let mut p = self.pending.lock();
        if p.by_node.is_empty() {
            return None;
        }
        let keys: Vec<String> = p.by_node.keys().take(MAX_OBSERVATIONS).cloned().collect();
        let observations = keys.iter().filter_map(|k| p.by_node.remove(k)).collect();
        if !p.by_node.is_empty() {
            // More is waiting: the next call finds it without another push.
            self.notify.notify_one();
        }
        Some(PowerReport {
            lease_epoch: p.epoch,
            observations,
        })
    }

    /// The next report; waits until there is one. Cancel-safe: nothing is taken before it
    /// resolves.
    pub async fn next(&self) -> PowerReport {
        loop {
            let notified = self.notify.notified();
            if let Some(r) = self.take() {
                return r;
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(node: &str, power: &str) -> PowerObservation {
        PowerObservation {
            node_id: node.to_owned(),
            power: power.to_owned(),
            reachable: true,
            error: String::new(),
            observed_at_ms: 1,
            error_code: String::new(),
        }
    }

    #[tokio::test]
    async fn newest_per_node_in_batches_and_a_new_epoch_drops_the_old() {
        let r = Reports::default();
        assert!(r.take().is_none());
        r.push(1, obs("a", "on"));
        r.push(1, obs("a", "off"));
        r.push(1, obs("b", "on"));
        let rep = r.next().await;
        assert_eq!(rep.lease_epoch, 1);
        let got: Vec<(&str, &str)> = rep
            .observations
            .iter()
            .map(|o| (o.node_id.as_str(), o.power.as_str()))
            .collect();
        assert_eq!(got, [("a", "off"), ("b", "on")]);
        r.push(1, obs("c", "on"));
        r.push(2, obs("d", "on"));
        let rep = r.next().await;
        assert_eq!(rep.lease_epoch, 2);
        assert_eq!(rep.observations.len(), 1);
        for i in 0..MAX_OBSERVATIONS + 3 {
            r.push(2, obs(&format!("n{i:04}"), "on"));
        }
        assert_eq!(r.next().await.observations.len(), MAX_OBSERVATIONS);
        assert_eq!(r.next().await.observations.len(), 3);
        r.push(2, obs("x", "on"));
        r.clear();
        assert!(r.take().is_none());
    }
}
