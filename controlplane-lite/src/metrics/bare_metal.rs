//! The bare-metal gauges of `bcctl serve`'s `/metrics`, read from the store at scrape time
//! ([`cpl_store::BareMetalCounts`]): BMCs that stopped answering, nodes a workflow failed, boots
//! that never reached the ramdisk, and how long the oldest node has been in each ramdisk state
//! (what the shipped alert rules page on: packaging/prometheus).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use cpl_store::BareMetalCounts;

use super::ProvisionStateLabel;

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReachableLabel {
    reachable: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct FailedFromLabel {
    failed_from: String,
}

/// The label values of `bcctl_bmcs`.
const REACHABLE: [&str; 3] = ["true", "false", "unknown"];

/// `bcctl_bmcs`, `bcctl_nodes_failed`, `bcctl_nodes_boot_failed`,
/// `bcctl_workflow_oldest_seconds`.
#[derive(Debug)]
pub(super) struct Gauges {
    bmcs: Family<ReachableLabel, Gauge>,
    nodes_failed: Family<FailedFromLabel, Gauge>,
    boot_failed: Gauge,
    workflow_oldest: Family<ProvisionStateLabel, Gauge>,
}

impl Gauges {
    /// Registers the four families in `registry`.
    pub(super) fn register(registry: &mut Registry) -> Self {
        let bmcs = Family::<ReachableLabel, Gauge>::default();
        registry.register(
            "bcctl_bmcs",
            "BMCs by whether they answered the last power sync or command (true, false; unknown: not asked yet)",
            bmcs.clone(),
        );
        let nodes_failed = Family::<FailedFromLabel, Gauge>::default();
        // Listed while no node has failed (bc_net::metrics).
        bc_net::metrics::register_described(
            registry,
            "bcctl_nodes_failed",
            "Nodes in provisionState failed, by failedFrom (the state they failed in)",
            None,
            nodes_failed.clone(),
        );
        let boot_failed = Gauge::default();
        registry.register(
            "bcctl_nodes_boot_failed",
            "Failed nodes whose machine never booted the ramdisk for the state they failed in (no ramdisk joined with the boot token)",
            boot_failed.clone(),
        );
        let workflow_oldest = Family::<ProvisionStateLabel, Gauge>::default();
        registry.register_with_unit(
            "bcctl_workflow_oldest",
            "Per ramdisk state (inspecting, commissioning, deploying, rescue, releasing, retiring): how long the node longest in it has been there; 0 when none is (a rescue whose SSH server is up is left out)",
            Unit::Seconds,
            workflow_oldest.clone(),
        );
        Self {
            bmcs,
            nodes_failed,
            boot_failed,
            workflow_oldest,
        }
    }

    /// Sets every gauge from `b`; ages are counted to `now_ms` (ms since the Unix epoch).
    pub(super) fn set(&self, b: &BareMetalCounts, now_ms: i64) {
        for r in REACHABLE {
            let n = b
                .bmcs_by_reachable
                .iter()
                .filter(|(k, _)| k == r)
                .map(|(_, n)| *n)
                .sum();
            self.bmcs
                .get_or_create(&ReachableLabel { reachable: r })
                .set(n);
        }
        // Only states that hold failed nodes have a series: one that emptied must not keep its
        // last count.
        self.nodes_failed.clear();
        for (from, n) in &b.failed_from {
            self.nodes_failed
                .get_or_create(&FailedFromLabel {
                    failed_from: from.clone(),
                })
                .set(*n);
        }
        self.boot_failed.set(b.boot_failed);
        for s in cpl_core::bare_metal::table::ramdisk_states() {
            let secs = b
                .workflow_oldest_started
                .iter()
                .find(|(k, _)| k == s.as_str())
                .map_or(0, |(_, since)| {
                    (now_ms.saturating_sub(*since) / 1000).max(0)
                });
            self.workflow_oldest
                .get_or_create(&ProvisionStateLabel {
                    provision_state: s.as_str().to_owned(),
                })
                .set(secs);
        }
    }
}

#[cfg(test)]
#[path = "bare_metal_tests.rs"]
mod tests;
