//! Desired-state convergence: applies the newest `Spec{generation, spec}` and reports
//! `SpecStatus{generation, converged, reason, message}`.
//!
//! # Background
//! Spec "Identity, ownership and generations": the node reports the `observedGeneration` it last
//! converged, and a node is schedulable only once that is at least 1. A generation counts as
//! observed only when *everything* in it converged; a failure is reported with a reason (the
//! control plane turns it into `SpecConverged=false`) and leaves `observedGeneration` where it was.
//!
//! # Design
//! - One task ([`Applier::spawn`]) owns the applied state. Specs arrive through a
//!   `watch::Receiver<Option<(generation, pb::NodeSpec)>>`, so a burst of updates collapses to
//!   the newest. The blocking apply runs on the blocking pool and checks between steps whether a
//!   newer generation arrived; if so it stops and reports nothing for the superseded one.
//! - Sections are independent: a GPU that cannot be rebound does not keep break-glass keys off
//!   the node (an operator may need them to fix that GPU).
//! - The state (`<state_dir>/spec.json`: observed generation, last spec, the installed
//!   break-glass section, uuid → bus id memo) is written atomically after each apply. On start
//!   the last spec is applied again before the control plane is reached: `driver_override` does
//!   not survive a reboot, and expired keys must go even if the node never reconnects.
//! - The key-expiry timer lives in the same task, so it runs whether or not a session is up; it
//!   wakes at the next `expiresAt` (at least every [`EXPIRY_RECHECK`], in case the wall clock
//!   jumps).
//!
//! # Limitations
//! A sysfs write in progress is not interrupted by a newer generation; the check happens between
//! GPUs and before the SSH section.

pub mod devices;
pub mod ssh;
pub mod ssh_block;
#[cfg(test)]
mod test_utils;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bc_protocol::pb;
use bc_protocol::spec::{BreakGlassSsh, NodeSpec, valid_user_name};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};

use bcd_probes::hostroot::HostRoot;
use devices::{DeviceBinder, GpuProcessProbe, PciBus, SysfsPci};

/// File in the state dir that holds [`AppliedState`].
pub const STATE_FILE: &str = "spec.json";

/// Longest the expiry timer sleeps before it looks at the clock again.
pub const EXPIRY_RECHECK: Duration = Duration::from_secs(60);

/// `SpecStatus.reason` of a converged generation.
pub const REASON_CONVERGED: &str = "Converged";

/// The newest desired state: `(generation, spec)`, `None` until the control plane sent one.
pub type Desired = Option<(u64, pb::NodeSpec)>;

/// Milliseconds since the Unix epoch; injectable so tests control expiry.
pub type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

/// Reading or writing the applied state failed.
#[derive(Debug, thiserror::Error)]
pub enum ConvergeError {
    /// `spec.json` could not be read or written.
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// `spec.json` could not be replaced.
    #[error(transparent)]
    Write(#[from] bc_sys::atomic::AtomicWriteError),
    /// `spec.json` is not valid JSON for [`AppliedState`].
    #[error("{path}: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// What the node last applied, persisted as `<state_dir>/spec.json` (camelCase JSON).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AppliedState {
    /// Highest generation that converged completely; 0 = none yet. Goes in `Hello`.
    pub observed_generation: u64,
    /// Generation of the last spec an apply was attempted for.
    pub last_generation: u64,
    /// That spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_spec: Option<NodeSpec>,
    /// The break-glass section as last written to `authorized_keys`: what the expiry timer
    /// enforces and what is cleaned up when the user changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_applied: Option<BreakGlassSsh>,
    /// NVML uuid (lowercase) → bus id, remembered for GPUs that moved to `vfio-pci`.
    #[serde(default)]
    pub gpu_uuids: BTreeMap<String, String>,
}

impl AppliedState {
    /// The state in `state_dir`; the default when there is none yet.
    pub fn load(state_dir: &Path) -> Result<Self, ConvergeError> {
        let path = state_dir.join(STATE_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|source| ConvergeError::Parse { path, source }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(source) => Err(ConvergeError::Io {
                op: "read",
                path,
                source,
            }),
        }
    }

    /// Writes the state atomically (temp file, fsync, rename, fsync of the directory), 0600.
    pub fn save(&self, state_dir: &Path) -> Result<(), ConvergeError> {
        let path = state_dir.join(STATE_FILE);
        let bytes = serde_json::to_vec_pretty(self).map_err(|source| ConvergeError::Parse {
            path: path.clone(),
            source,
        })?;
        Ok(bc_sys::atomic::write(&path, &bytes, 0o600)?)
    }

    /// Earliest `expiresAt` (ms) after `now_ms` among the installed break-glass keys.
    pub fn next_expiry_ms(&self, now_ms: i64) -> Option<i64> {
        self.ssh_applied
            .iter()
            .flat_map(|s| &s.keys)
            .filter(|k| k.expires_at.is_some() && !k.expired_at(now_ms))
            .map(|k| k.expires_at_ms())
            .min()
    }
}

/// `observedGeneration` for `Hello`: from `<state_dir>/spec.json`, 0 when absent or unreadable.
pub fn observed_generation(state_dir: &Path) -> u64 {
    AppliedState::load(state_dir).map_or(0, |s| s.observed_generation)
}

/// How one apply ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApplyOutcome {
    /// Every section converged.
    Converged { message: String },
    /// Something did not; `reason` is the first failure's CamelCase reason, `message` lists all.
    Failed { reason: String, message: String },
    /// A newer generation arrived; nothing is reported for this one.
    Superseded,
}

/// Applies specs to the host. Cheap to clone.
#[derive(Clone)]
pub struct Applier {
    root: HostRoot,
    state_dir: PathBuf,
    bus: Arc<dyn PciBus>,
    probe: Arc<dyn GpuProcessProbe>,
    clock: Clock,
}

impl std::fmt::Debug for Applier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Applier")
            .field("root", &self.root)
            .field("state_dir", &self.state_dir)
            .field("bus", &self.bus)
            .field("probe", &self.probe)
            .finish_non_exhaustive()
    }
}

/// Wall-clock milliseconds since the Unix epoch.
pub fn system_clock() -> Clock {
    Arc::new(|| chrono::Utc::now().timestamp_millis())
}

impl Applier {
    /// An applier for the host under `root`, keeping its state in `state_dir`, asking `probe`
    /// whether a GPU is in use (NVML, or [`devices::ProcfsProbe`]).
    pub fn new(root: HostRoot, state_dir: PathBuf, probe: Arc<dyn GpuProcessProbe>) -> Self {
        Self {
            bus: Arc::new(SysfsPci::new(root.clone())),
            root,
            state_dir,
            probe,
            clock: system_clock(),
        }
    }

    /// Replaces the sysfs access (tests).
    pub fn with_bus(mut self, bus: Arc<dyn PciBus>) -> Self {
        self.bus = bus;
        self
    }

    /// Replaces the clock (tests).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Applies one generation to the host and updates `state` (not saved). `superseded` is
    /// asked between steps.
    pub fn apply(
        &self,
        state: &mut AppliedState,
        generation: u64,
        wire: &pb::NodeSpec,
        superseded: &dyn Fn() -> bool,
    ) -> ApplyOutcome {
        let spec = match NodeSpec::try_from(wire) {
            Ok(s) => s,
            Err(e) => {
                return ApplyOutcome::Failed {
                    reason: "InvalidSpec".to_owned(),
                    message: e.to_string(),
                };
            }
        };
        let mut failures: Vec<(&'static str, String)> = Vec::new();

        let mut binder = DeviceBinder::new(
            self.bus.as_ref(),
            self.probe.as_ref(),
            state.gpu_uuids.clone(),
        );
        for b in &spec.devices.gpus {
            if superseded() {
                return ApplyOutcome::Superseded;
            }
            match binder.apply(b) {
                Ok(outcome) => {
                    tracing::debug!(gpu = %b.match_, driver = %b.driver, ?outcome, "gpu binding")
                }
                Err(e) => failures.push((e.reason(), e.to_string())),
            }
        }
        state.gpu_uuids = binder.uuid_memo;

        if superseded() {
            return ApplyOutcome::Superseded;
        }
        let keys = self.apply_ssh(state, spec.break_glass_ssh.as_ref(), &mut failures);

        state.last_generation = generation;
        state.last_spec = Some(spec.clone());
        if failures.is_empty() {
            state.observed_generation = generation;
        }
        match failures.first() {
            None => ApplyOutcome::Converged {
                message: format!(
                    "{} GPU binding(s), {keys} break-glass key(s)",
                    spec.devices.gpus.len()
                ),
            },
            Some((reason, _)) => ApplyOutcome::Failed {
                reason: (*reason).to_owned(),
                message: failures
                    .iter()
                    .map(|(_, m)| m.as_str())
                    .collect::<Vec<_>>()
                    .join("; "),
            },
        }
    }

    /// Converges the break-glass section; returns the number of keys installed.
    fn apply_ssh(
        &self,
        state: &mut AppliedState,
        want: Option<&BreakGlassSsh>,
        failures: &mut Vec<(&'static str, String)>,
    ) -> usize {
        let now = (self.clock)();
        // A block left for a user the spec no longer names is removed first.
        if let Some(old) = &state.ssh_applied
            && want.is_none_or(|w| w.user != old.user)
        {
            match ssh::converge(&self.root, &old.user, &[], now) {
                Ok(_) => state.ssh_applied = None,
                Err(e) => failures.push((e.reason(), e.to_string())),
            }
        }
        let Some(want) = want else {
            return 0;
        };
        if !valid_user_name(&want.user) {
            failures.push(("InvalidSpec", format!("invalid user name {:?}", want.user)));
            return 0;
        }
        match ssh::converge(&self.root, &want.user, &want.keys, now) {
            Ok(out) => {
                state.ssh_applied = Some(want.clone());
                out.installed
            }
            Err(e) => {
                failures.push((e.reason(), e.to_string()));
                0
            }
        }
    }

    /// Removes keys whose `expiresAt` has passed from the installed block and from `state`.
    /// Returns whether `state` changed.
    pub fn expire_keys(&self, state: &mut AppliedState) -> Result<bool, ssh::SshError> {
        let now = (self.clock)();
        let Some(applied) = &mut state.ssh_applied else {
            return Ok(false);
        };
        if !applied.keys.iter().any(|k| k.expired_at(now)) {
            return Ok(false);
        }
        let out = ssh::converge(&self.root, &applied.user, &applied.keys, now)?;
        applied.keys.retain(|k| !k.expired_at(now));
        tracing::info!(
            user = %applied.user,
            remaining = out.installed,
            "break-glass keys expired and removed"
        );
        Ok(true)
    }

    /// Runs the converge task until `desired`'s sender is dropped. Statuses go to `status`.
    pub fn spawn(
        self,
        desired: watch::Receiver<Desired>,
        status: mpsc::Sender<pb::SpecStatus>,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(self.run(desired, status))
    }

    async fn run(
        self,
        mut desired: watch::Receiver<Desired>,
        status: mpsc::Sender<pb::SpecStatus>,
    ) {
        let mut state = match AppliedState::load(&self.state_dir) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "applied spec state unreadable; starting from none");
                AppliedState::default()
            }
        };
        // Before the control plane answers, the last spec is the best desired state we have.
        let mut pending: Desired = desired.borrow_and_update().clone().or_else(|| {
            state
                .last_spec
                .as_ref()
                .map(|s| (state.last_generation, pb::NodeSpec::from(s)))
        });
        loop {
            if let Some((generation, spec)) = pending.take() {
                state = self
                    .apply_and_report(state, generation, spec, &desired, &status)
                    .await;
            }
            let now = (self.clock)();
            let wait = state
                .next_expiry_ms(now)
                .map_or(EXPIRY_RECHECK, |at| {
                    Duration::from_millis(u64::try_from(at - now).unwrap_or(0))
                })
                .min(EXPIRY_RECHECK);
            tokio::select! {
                changed = desired.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    pending = desired.borrow_and_update().clone();
                }
                () = tokio::time::sleep(wait) => {
                    state = self.expire_and_save(state).await;
                }
            }
        }
    }

    async fn apply_and_report(
        &self,
        state: AppliedState,
        generation: u64,
        spec: pb::NodeSpec,
        desired: &watch::Receiver<Desired>,
        status: &mpsc::Sender<pb::SpecStatus>,
    ) -> AppliedState {
        let this = self.clone();
        let watch = desired.clone();
        let job = tokio::task::spawn_blocking(move || {
            let mut state = state;
            let superseded = || {
                watch
                    .borrow()
                    .as_ref()
                    .is_some_and(|(g, _)| *g > generation)
            };
            let outcome = this.apply(&mut state, generation, &spec, &superseded);
            (state, outcome)
        });
        let (mut state, outcome) = match job.await {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, generation, "spec apply panicked");
                let _ = status
                    .send(failed(generation, "InternalError", &e.to_string()))
                    .await;
                return AppliedState::load(&self.state_dir).unwrap_or_default();
            }
        };
        let report = match outcome {
            ApplyOutcome::Superseded => {
                tracing::info!(generation, "spec apply superseded by a newer generation");
                None
            }
            ApplyOutcome::Converged { message } => Some(pb::SpecStatus {
                generation,
                converged: true,
                reason: REASON_CONVERGED.to_owned(),
                message,
            }),
            ApplyOutcome::Failed { reason, message } => {
                tracing::warn!(generation, %reason, %message, "spec did not converge");
                Some(failed(generation, &reason, &message))
            }
        };
        let report = match state.save(&self.state_dir) {
            Ok(()) => report,
            Err(e) => {
                // Converged on the host but not remembered: a restart would report an older
                // observedGeneration, so this generation is not claimed either.
                tracing::error!(error = %e, "cannot persist applied spec");
                if report.as_ref().is_some_and(|r| r.converged) {
                    state.observed_generation =
                        AppliedState::load(&self.state_dir).map_or(0, |s| s.observed_generation);
                }
                report.map(|_| failed(generation, "StateWriteFailed", &e.to_string()))
            }
        };
        if let Some(r) = report {
            // A closed receiver means the agent is shutting down; the state is saved already.
            let _ = status.send(r).await;
        }
        state
    }

    async fn expire_and_save(&self, state: AppliedState) -> AppliedState {
        let this = self.clone();
        let job = tokio::task::spawn_blocking(move || {
            let mut state = state;
            match this.expire_keys(&mut state) {
                Ok(true) => {
                    if let Err(e) = state.save(&this.state_dir) {
                        tracing::error!(error = %e, "cannot persist key expiry");
                    }
                }
                Ok(false) => {}
                Err(e) => tracing::error!(error = %e, "cannot remove expired break-glass keys"),
            }
            state
        });
        match job.await {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "key expiry panicked");
                AppliedState::load(&self.state_dir).unwrap_or_default()
            }
        }
    }
}

fn failed(generation: u64, reason: &str, message: &str) -> pb::SpecStatus {
    pb::SpecStatus {
        generation,
        converged: false,
        reason: reason.to_owned(),
        message: message.to_owned(),
    }
}

#[cfg(test)]
#[path = "converge_tests.rs"]
mod tests;
