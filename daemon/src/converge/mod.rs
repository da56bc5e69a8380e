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
//! - A failed apply is retried with jittered, capped backoff until it converges or a newer
//!   generation arrives (the `task` module): no new spec is needed after a busy GPU frees up or a full
//!   state dir gets space back.
//! - Break-glass expiry does not depend on `spec.json`: each key's expiry is written into the
//!   managed block ([`ssh_block`]), the users with a block are recorded apart ([`managed`], and
//!   found again by scanning local accounts when that record is lost), and the sweep reads the
//!   blocks themselves. The key-expiry timer lives in the same task, so it runs whether or not a
//!   session is up; it wakes at the next expiry (at least every [`EXPIRY_RECHECK`], in case the
//!   wall clock jumps).
//!
//! # Limitations
//! A sysfs write in progress is not interrupted by a newer generation; the check happens between
//! GPUs and before the SSH section.

pub mod devices;
pub mod managed;
pub mod ssh;
pub mod ssh_block;
mod state;
mod task;
#[cfg(test)]
mod test_utils;

pub use state::{AppliedState, STATE_FILE, observed_generation};

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bc_protocol::pb;
use bc_protocol::spec::{BreakGlassSsh, NodeSpec, valid_user_name};
use parking_lot::Mutex;

use bcd_probes::hostroot::HostRoot;
use devices::{DeviceBinder, GpuProcessProbe, PciBus, SysfsPci};
use managed::ManagedUsers;
use ssh::SshError;

/// Longest the expiry timer sleeps before it looks at the clock again.
pub const EXPIRY_RECHECK: Duration = Duration::from_secs(60);

/// `SpecStatus.reason` of a converged generation.
pub const REASON_CONVERGED: &str = "Converged";

/// First retry of a failed apply waits up to this long (full jitter); the ceiling doubles per
/// failure.
pub const RETRY_BASE: Duration = Duration::from_secs(1);

/// Longest wait between retries of a failed apply.
pub const RETRY_MAX: Duration = Duration::from_secs(60);

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
    retry_base: Duration,
    retry_max: Duration,
    /// The users with a managed block, opened on first use (a scan of local accounts when the
    /// record is lost).
    managed: Arc<Mutex<Option<ManagedUsers>>>,
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
            retry_base: RETRY_BASE,
            retry_max: RETRY_MAX,
            managed: Arc::default(),
        }
    }

    /// Replaces the sysfs access (tests).
    pub fn with_bus(mut self, bus: Arc<dyn PciBus>) -> Self {
        self.bus = bus;
        self
    }

    /// Replaces the retry backoff of a failed apply ([`RETRY_BASE`], [`RETRY_MAX`]; tests).
    pub fn with_retry(mut self, base: Duration, max: Duration) -> Self {
        self.retry_base = base;
        self.retry_max = max;
        self
    }

    /// Runs `f` on the managed-user record, opening it first if needed.
    fn with_managed<R>(&self, f: impl FnOnce(&mut ManagedUsers) -> R) -> R {
        let mut g = self.managed.lock();
        f(g.get_or_insert_with(|| ManagedUsers::open(&self.root, &self.state_dir)))
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

    /// Converges the break-glass section; returns the number of keys installed. Blocks of
    /// other users (from `spec.json` or the managed-user record) are removed first.
    fn apply_ssh(
        &self,
        state: &mut AppliedState,
        want: Option<&BreakGlassSsh>,
        failures: &mut Vec<(&'static str, String)>,
    ) -> usize {
        let now = (self.clock)();
        let applied_user = state.ssh_applied.as_ref().map(|s| s.user.clone());
        let mut old: BTreeSet<String> = self.with_managed(|m| m.users()).into_iter().collect();
        old.extend(applied_user.clone());
        if let Some(w) = want {
            old.remove(&w.user);
        }
        for user in old {
            let from_state = applied_user.as_deref() == Some(user.as_str());
            match ssh::converge(&self.root, &user, &[], now) {
                Ok(_) => {
                    self.with_managed(|m| m.remove(&user));
                    if from_state {
                        state.ssh_applied = None;
                    }
                }
                // A recorded user whose account or home is gone has no block left to remove.
                Err(SshError::UnknownUser(_) | SshError::NoHome(_)) if !from_state => {
                    self.with_managed(|m| m.remove(&user));
                }
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
        // Recorded before the block is written: a crash in between leaves a record, not an
        // unknown block.
        if want.keys.iter().any(|k| !k.expired_at(now)) {
            self.with_managed(|m| m.add(&want.user));
        }
        match ssh::converge(&self.root, &want.user, &want.keys, now) {
            Ok(out) => {
                state.ssh_applied = Some(want.clone());
                if out.installed == 0 {
                    self.with_managed(|m| m.remove(&want.user));
                }
                out.installed
            }
            Err(e) => {
                failures.push((e.reason(), e.to_string()));
                0
            }
        }
    }

    /// Removes keys whose expiry has passed: from `state` (the installed section of
    /// `spec.json`), and from the managed block of every managed user, reading each key's
    /// expiry from the block itself ([`ssh::sweep`]), so it works with `spec.json` lost.
    pub fn expire_keys(&self, state: &mut AppliedState) -> Expiry {
        let now = (self.clock)();
        let mut state_changed = false;
        if let Some(applied) = &mut state.ssh_applied {
            let before = applied.keys.len();
            applied.keys.retain(|k| !k.expired_at(now));
            state_changed = applied.keys.len() != before;
        }
        let mut next_expiry_ms = None::<i64>;
        for user in self.with_managed(|m| m.users()) {
            match ssh::sweep(&self.root, &user, now) {
                Ok(out) => {
                    if out.removed > 0 {
                        tracing::info!(
                            user = %user,
                            removed = out.removed,
                            remaining = out.remaining,
                            "break-glass keys expired and removed"
                        );
                    }
                    if out.remaining == 0 {
                        self.with_managed(|m| m.remove(&user));
                    }
                    if let Some(at) = out.next_expiry_ms {
                        next_expiry_ms = Some(next_expiry_ms.map_or(at, |n| n.min(at)));
                    }
                }
                Err(e @ (SshError::UnknownUser(_) | SshError::NoHome(_))) => {
                    tracing::debug!(user = %user, error = %e, "no break-glass block to sweep");
                }
                Err(e) => {
                    tracing::error!(user = %user, error = %e, "cannot remove expired break-glass keys");
                }
            }
        }
        Expiry {
            state_changed,
            next_expiry_ms,
        }
    }
}

/// What [`Applier::expire_keys`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Expiry {
    /// Whether keys left the installed section of the state (it needs saving).
    pub state_changed: bool,
    /// Earliest expiry still in a managed block on disk, ms since the Unix epoch.
    pub next_expiry_ms: Option<i64>,
}

#[cfg(test)]
#[path = "recovery_tests.rs"]
mod recovery_tests;
#[cfg(test)]
#[path = "converge_tests.rs"]
mod tests;
