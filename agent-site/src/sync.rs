//! The power sync loop: every `power_sync_interval_ms` (±10 % jitter) each `sync_power` BMC's
//! power state is read, and what changed is queued for a `PowerReport`.
//!
//! # Design
//! One task per BMC, so a slow or dead BMC delays only itself: its read runs under the
//! operation timeout and holds only its own BMC's permit and one of the site's (the same
//! [`crate::limiter`] permits commands take). A supervisor restarts the pollers on every new
//! assignment; each poller reports its first reading unconditionally (so every BMC is reported
//! once after an assignment, a reconnect included) and afterwards whatever differs from what the
//! control plane was last told of the node — by this loop or by a power command's result
//! ([`Site::reported`]): power state, reachability or the error's kind (issue 31, rule 10: the
//! axis is compared with absolute readings, not only with the loop's own previous one). A
//! reading in transition (`PoweringOn`) is read again, up to [`SETTLE_READS`] times a second
//! apart, before it is reported. A BMC that stops answering is reported with `reachable:
//! false`, power `unknown` and the error. While the lease is not valid the pollers wait,
//! reading nothing; a renewal resumes them.

use std::sync::Arc;
use std::time::Duration;

use bc_protocol::commands::bmc::PowerState;
use bc_protocol::pb::PowerObservation;
use rand::Rng as _;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::site::{Assignment, ManagedBmc, PowerKey as Key, Site};

/// Reads of a power state in transition before the loop reports where it heads.
pub const SETTLE_READS: u32 = 5;
/// Between two such reads.
const SETTLE_PAUSE: Duration = Duration::from_secs(1);

/// `interval` ±10 %.
pub fn jittered(interval: Duration) -> Duration {
    interval.mul_f64(rand::rng().random_range(0.9..=1.1))
}

/// Reads one BMC's power state as an observation (never fails: a failure is the observation).
pub async fn observe(site: &Site, a: &Assignment, bmc: &ManagedBmc) -> (PowerObservation, Key) {
    let mut reads = 0;
    let r = loop {
        let r = site
            .with_bmc(a.epoch, &bmc.node_id, false, |b| b.power_state())
            .await;
        match r {
            Ok(p) if p.settling && reads < SETTLE_READS => {
                reads += 1;
                tokio::time::sleep(SETTLE_PAUSE).await;
            }
            r => break r.map(|p| p.power),
        }
    };
    let now = chrono::Utc::now().timestamp_millis();
    match r {
        Ok(p) => (
            PowerObservation {
                node_id: bmc.node_id.clone(),
                power: p.as_str().to_owned(),
                reachable: true,
                error: String::new(),
                observed_at_ms: now,
                error_code: String::new(),
            },
            (p, true, String::new()),
        ),
        Err(f) => {
            // Credentials refused or the answer unusable: the BMC did answer, but nothing it
            // said can be trusted as the power state.
            let code = f.code.as_str().to_owned();
            (
                PowerObservation {
                    node_id: bmc.node_id.clone(),
                    power: PowerState::Unknown.as_str().to_owned(),
                    reachable: false,
                    error: f.message,
                    observed_at_ms: now,
                    error_code: code.clone(),
                },
                (PowerState::Unknown, false, code),
            )
        }
    }
}

/// Polls one BMC until aborted.
async fn poll(site: Arc<Site>, a: Arc<Assignment>, bmc: Arc<ManagedBmc>) {
    let mut changes = site.subscribe();
    let mut first = true;
    let mut first_report = true;
    loop {
        if !first {
            tokio::time::sleep(jittered(a.sync_interval)).await;
        }
        first = false;
        while site.check_lease(a.epoch).is_err() {
            if changes.changed().await.is_err() {
                return;
            }
        }
        let (obs, key) = observe(&site, &a, &bmc).await;
        if key.2 == bc_protocol::commands::CommandErrorCode::LeaseLost.as_str() {
            // The lease went while this read waited; nothing was read.
            continue;
        }
        site.note_reachable(&bmc.node_id, obs.reachable);
        let fresh = first_report;
        first_report = false;
        if fresh || site.reported(&bmc.node_id).as_ref() != Some(&key) {
            if obs.reachable {
                tracing::debug!(node_id = %bmc.node_id, power = %obs.power, "power state");
            } else {
                tracing::warn!(node_id = %bmc.node_id, error = %obs.error, "BMC not answering");
            }
            site.reports.push(a.epoch, obs);
            site.note_power(&bmc.node_id, key);
        }
    }
}

/// Runs the sync loop until `stop` turns true: pollers for the assignment in force while the
/// lease is held, restarted on every new assignment.
pub async fn run(site: Arc<Site>, mut stop: watch::Receiver<bool>) {
    let mut changes = site.subscribe();
    loop {
        let a = site.assignment();
        let generation = a.as_ref().map_or(0, |a| a.generation);
        let mut pollers = JoinSet::new();
        if let Some(a) = a.filter(|a| a.held) {
            let n = a.bmcs.values().filter(|b| b.sync_power).count();
            tracing::info!(bmcs = n, interval = ?a.sync_interval, "power sync running");
            for b in a.bmcs.values().filter(|b| b.sync_power) {
                pollers.spawn(poll(Arc::clone(&site), Arc::clone(&a), Arc::clone(b)));
            }
        }
        let mut lapse_logged = false;
        loop {
            let expiry = site.lease_valid_until().filter(|_| !lapse_logged);
            let lapse = async move {
                match expiry {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                r = changes.changed() => {
                    if r.is_err() {
                        return;
                    }
                    if site.assignment().map_or(0, |a| a.generation) != generation {
                        break;
                    }
                    if site.lease_valid_until().is_some_and(|t| t > tokio::time::Instant::now()) {
                        lapse_logged = false;
                    }
                }
                () = lapse => {
                    if site.lease_valid_until().is_some_and(|t| t <= tokio::time::Instant::now()) {
                        tracing::warn!("site lease lapsed without a renewal: power sync stopped and BMC commands refused (LEASE_LOST) until it is renewed");
                        site.reports.clear();
                        lapse_logged = true;
                    }
                }
                () = bcd_core::session::stopped(&mut stop) => {
                    pollers.abort_all();
                    return;
                }
            }
        }
        pollers.abort_all();
    }
}

#[cfg(test)]
#[path = "sync_tests.rs"]
mod tests;
