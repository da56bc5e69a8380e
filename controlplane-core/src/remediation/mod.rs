//! Health remediation (issue 33): the controller beside Health. Health turns evidence (diag
//! verdicts, XIDs, `gpu.reset` results) into conditions; Remediation turns conditions into
//! steps, through the same verbs an operator has, under the pool's policy and a circuit
//! breaker, and gives up loudly when nothing helps. Besides a failing bare-metal workflow it is
//! the only automatic writer of `maintenance`.
//!
//! # Background
//! A sick GPU node is detected well (`GpuUnhealthy`, `XidCritical`, `P2pDrainRequired` in
//! `noScheduleReasons`), and every verb a fix needs exists (`gpu.reset`, `node.reboot`, the
//! BMC's power, re-inspection), but without this controller a person closes the loop. The
//! systems operators run beside their fleets (NVIDIA's NVSentinel, Metal3's reboot remediation)
//! do it automatically; a fleet-wide event must never turn into a fleet-wide reboot storm, and a
//! fault of the workload must not be "healed" on every node it ran on.
//!
//! # Design
//! - **Evidence in, steps out**: [`fault`] reads a node's fault from its conditions (the
//!   condition, its owner, its GPUs, the recovery action its reason carries) or its silence.
//! - **Ladders and limits are data** ([`policy`]): a built-in ladder per fault kind, replaced
//!   per pool (`pools.setRemediation`), with the pool's limits, drain grace and drain policy.
//! - **One remediation per node**, a row of the store with its steps ([`cpl_store::RemediationRecord`]):
//!   [`start`] opens it (or gives up at once on a flapping node, or trips the [`breaker`]);
//!   [`climb`] moves it through `draining → acting → verifying` per rung, in one transaction per
//!   pass and one per command that ended (the command router calls [`climb::on_final`]);
//!   [`finish`] ends it: a success clears what it set and uncordons only what it cordoned; a
//!   give-up turns maintenance on naming the fault and every step tried.
//! - **Workload faults** ([`workload`]): application-class XIDs on several nodes of one
//!   workload are the workload's (recorded on its allocations, no node is remediated for them);
//!   one node alone, again and again across allocations, is the node's (`RepeatedWorkloadXid`).
//! - **Operator view** ([`view`]): `remediations.list|get`, `pools.setRemediation`,
//!   `pools.resumeRemediation`, `nodes.setRemediation`; steps in the node's events.
//! - Transactions only record and queue; the pass ([`Remediation::pass`]) dispatches.
//!
//! # Limitations
//! A remediation's verification needs `diag.nvml` to say something: a node without NVML never
//! proves a GPU fixed, so it climbs to a give-up. `reinspect` applies to a `ready` bare-metal
//! machine; a `deployed` one would first need `nodes.release`, which erases its disks, so the
//! step is skipped there and the give-up's message says what is left to do. The pass runs on the
//! replica that holds the controller lease.

pub mod breaker;
pub mod climb;
pub mod fault;
pub mod finish;
pub mod policy;
pub mod start;
pub mod view;
pub mod workload;

#[cfg(test)]
mod limits_tests;
#[cfg(test)]
mod remediation_tests;
#[cfg(test)]
mod test_world;

use std::sync::Arc;
use std::time::Duration;

use cpl_store::{RemediationMode, Store, now_ms};

use crate::commands::Commands;
use crate::port::AgentSessions;

pub use climb::on_final;

/// The owner of the conditions the controller writes and the actor of its changes.
pub const OWNER: &str = "Remediation";
/// The node condition a remediation's end sets: `true`/`Healed`, or `false` with `Exhausted` or
/// `Flapping` when it gave up. Never NoSchedule (maintenance is).
pub const REMEDIATED: &str = "Remediated";

/// The controller's timings (`bcctl serve --remediation-*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemediationConfig {
    /// How often the pass runs (1 s).
    pub period: Duration,
    /// Deadline of a `gpu.reset` and of the verification's `diag.nvml` (10 min).
    pub reset_timeout: Duration,
    /// Deadline of a `node.reboot`: the machine must be back with a new boot id (20 min).
    pub reboot_timeout: Duration,
    /// Deadline of a `bmc.power reboot` on the site agent (2 min).
    pub bmc_timeout: Duration,
    /// How long a step may take to be verified after its command ended: the session back, the
    /// diag reported (15 min).
    pub verify_timeout: Duration,
}

impl Default for RemediationConfig {
    fn default() -> Self {
        Self {
            period: Duration::from_secs(1),
            reset_timeout: Duration::from_secs(600),
            reboot_timeout: Duration::from_secs(1200),
            bmc_timeout: Duration::from_secs(120),
            verify_timeout: Duration::from_secs(900),
        }
    }
}

/// What the transactions need besides the store: the live sessions (a site's lease holder) and
/// the timings.
#[derive(Debug, Clone)]
pub(crate) struct Ctx {
    pub sessions: Arc<dyn AgentSessions>,
    pub cfg: RemediationConfig,
}

/// What one pass did, for logs and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Remediations recorded (started, observed or given up at once).
    pub started: usize,
    /// Open remediations moved.
    pub advanced: usize,
    /// Pools whose breaker tripped in this pass.
    pub tripped: Vec<String>,
}

/// The controller. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Remediation {
    pub store: Store,
    pub commands: Commands,
    pub cfg: RemediationConfig,
}

impl Remediation {
    /// The controller over `commands` (its store and sessions).
    pub fn new(commands: Commands, cfg: RemediationConfig) -> Self {
        Self {
            store: commands.store.clone(),
            commands,
            cfg,
        }
    }

    fn ctx(&self) -> Ctx {
        Ctx {
            sessions: Arc::clone(&self.commands.sessions),
            cfg: self.cfg,
        }
    }

    /// Runs a pass every `cfg.period` until the task is dropped.
    pub async fn run(self) {
        let mut tick = tokio::time::interval(self.cfg.period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let r = self.pass(now_ms()).await;
            if r.started > 0 || !r.tripped.is_empty() {
                tracing::info!(started = r.started, advanced = r.advanced, tripped = ?r.tripped, "remediation pass");
            }
        }
    }

    /// One pass at `now` (ms): every open remediation moves as far as it can, then every pool
    /// that remediates starts what its breaker allows. Errors are logged per remediation and
    /// per node; the rest of the pass goes on.
    pub async fn pass(&self, now: i64) -> PassReport {
        let mut report = PassReport::default();
        let open = match self.store.read(|r| r.open_remediations()).await {
            Ok(o) => o,
            Err(e) => {
                tracing::error!(error = %e, "remediation: reading open remediations failed");
                return report;
            }
        };
        let busy: std::collections::BTreeSet<String> =
            open.iter().map(|r| r.node_id.clone()).collect();
        for rem in open {
            let (id, ctx) = (rem.id.clone(), self.ctx());
            let r = self
                .store
                .write(move |tx| climb::advance(tx, &id, &ctx, now))
                .await;
            report.advanced += 1;
            self.after(&rem.node_id, r).await;
        }
        let pools = match self.store.read(|r| r.pools()).await {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(error = %e, "remediation: reading pools failed");
                return report;
            }
        };
        for pool in pools {
            let mode = policy::Policy::of(Some(&pool.remediation)).mode;
            if mode == RemediationMode::Off {
                continue;
            }
            let pid = pool.id.clone();
            let candidates = match self
                .store
                .read(move |r| r.remediation_candidates(&pid))
                .await
            {
                Ok(c) => c,
                Err(e) => {
                    tracing::error!(error = %e, pool_id = %pool.id, "remediation: reading candidates failed");
                    continue;
                }
            };
            let mut paused = mode == RemediationMode::Auto && breaker::paused(&pool);
            for node in candidates.into_iter().filter(|n| !busy.contains(n)) {
                // An open breaker refuses every start in the pool until an operator resumes
                // it: the rest of its candidates wait.
                if paused {
                    break;
                }
                let (id, ctx) = (node.clone(), self.ctx());
                let r = self
                    .store
                    .write(move |tx| start::start(tx, &id, &ctx, now))
                    .await;
                match r {
                    Ok(start::Started::Recorded(d)) => {
                        report.started += 1;
                        self.after(&node, Ok(d)).await;
                    }
                    Ok(start::Started::Tripped) => {
                        report.tripped.push(pool.id.clone());
                        paused = true;
                    }
                    Ok(start::Started::Paused) => paused = true,
                    Ok(start::Started::Nothing) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, node_id = %node, "remediation: not started")
                    }
                }
            }
        }
        report
    }

    async fn after(&self, node_id: &str, r: Result<climb::Dispatch, crate::error::OpError>) {
        match r {
            Ok(Some(to)) => self.commands.dispatch(&to, false).await,
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, node_id, "remediation: step not taken"),
        }
    }
}
