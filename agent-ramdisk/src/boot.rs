//! One boot of the ramdisk, start to end: the settings from the kernel command line
//! ([`crate::cmdline`]), early boot ([`crate::setup`]), the LLDP listener and its bounded wait
//! (`bcd.lldp_wait`), then the session core's lifecycle with
//! the [`RamdiskMachine`], an identity in memory and a journal in memory. Nothing is written to
//! disk: the key and certificate die with the boot.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bcd_core::executor::Executor;
use bcd_core::identity::MemoryIdentity;
use bcd_core::join::JoinError;
use bcd_core::journal::Journal;
use bcd_core::lifecycle::{Lifecycle, LifecycleConfig, LifecycleError};
use bcd_core::mode::TokenSource;
use bcd_core::ops::OpsConfig;
use bcd_core::ops::reboot::{RebootConfig, SYSCALL};
use bcd_probes::hostroot::HostRoot;
use bcd_probes::inventory::lldp::Watcher;
use bcd_probes::nvml::NvmlConfig;
use tokio::sync::watch;

use crate::cmdline::{BootParams, CmdlineError};
use crate::hooks::RamdiskHooks;
use crate::machine::RamdiskMachine;
use crate::rescue::{Rescue, RescueConfig};
use crate::setup::{SetupConfig, SetupError};

/// Outbound messages a session queues at most.
const OUTBOUND_CAPACITY: usize = 64;

/// Why the ramdisk stopped with an error (the init then powers the machine off).
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    /// The command line could not be read.
    #[error("cannot read the kernel command line {}: {source}", path.display())]
    ReadCmdline {
        /// The file (`/proc/cmdline`).
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The command line lacks or garbles a setting.
    #[error(transparent)]
    Cmdline(#[from] CmdlineError),
    /// No network.
    #[error("network setup failed: {0}")]
    Setup(#[from] SetupError),
    /// The control plane refused the boot token (replayed, expired, not for this machine).
    #[error(
        "the control plane refused this boot's token: {0}. The token is one-time: power the machine on again through the control plane for a new one"
    )]
    TokenRefused(JoinError),
    /// The session core stopped for another reason (a pin that does not match, a bad URL).
    #[error(transparent)]
    Lifecycle(LifecycleError),
    /// The identity was revoked or refused during the boot.
    #[error("this boot's identity ended: {0}")]
    Ended(String),
}

/// What a boot runs with.
#[derive(Debug, Clone)]
pub struct BootConfig {
    /// From the kernel command line.
    pub params: BootParams,
    /// Where `/sys`, `/proc`, `/dev` are.
    pub root: HostRoot,
    /// Early boot; `None` skips it (a test on a normal host).
    pub setup: Option<SetupConfig>,
    /// Where NVML and `nvidia-smi` are.
    pub nvml: NvmlConfig,
    /// rescue.start's SSH server (dropbear's paths, its port).
    pub rescue: RescueConfig,
    /// The agent's own log file, for logs.collect (`/run/bcd.log` in the image).
    pub log_file: Option<PathBuf>,
    /// First reconnect wait ceiling.
    pub reconnect_base: Duration,
    /// Largest reconnect wait.
    pub reconnect_max: Duration,
}

/// Reads and parses the command line at `path`.
pub fn read_params(path: &Path) -> Result<BootParams, BootError> {
    let text = std::fs::read_to_string(path).map_err(|source| BootError::ReadCmdline {
        path: path.to_owned(),
        source,
    })?;
    Ok(crate::cmdline::parse(&text)?)
}

/// The boot token, and never another. Its `Debug` shows only the token's public half.
struct BootToken(String);

impl std::fmt::Debug for BootToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let id = self.0.split_once('.').map_or("<malformed>", |(id, _)| id);
        write!(f, "BootToken({id}.<redacted>)")
    }
}

impl TokenSource for BootToken {
    fn token(&self) -> Option<String> {
        Some(self.0.clone())
    }

    fn can_wait(&self) -> bool {
        false
    }
}

/// Runs the boot until `stop` turns true (Ok) or it cannot go on (Err).
pub async fn run(cfg: BootConfig, stop: watch::Receiver<bool>) -> Result<(), BootError> {
    let p = &cfg.params;
    tracing::info!(
        node = p.node.as_deref().unwrap_or("-"),
        control_plane = ?p.urls,
        "bcd ramdisk starting"
    );
    if !p.unknown.is_empty() {
        tracing::warn!(keys = ?p.unknown, "unknown bcd.* keys on the kernel command line are ignored");
    }
    if let Some(why) = &p.boot_if_ignored {
        tracing::warn!(%why, "the boot NIC on the kernel command line is ignored; DHCP asks NICs with a link first");
    }
    let network = match &cfg.setup {
        Some(setup) => {
            let lease = crate::setup::run(setup, p.node.as_deref()).await?;
            tracing::info!(iface = %lease.iface, "network up");
            Some(lease.summary())
        }
        None => {
            tracing::info!("--no-setup: no modules loaded, no DHCP");
            None
        }
    };
    let boot_id = cfg
        .root
        .read_trimmed("/proc/sys/kernel/random/boot_id")
        .unwrap_or_default();
    let lldp = start_lldp(&cfg.root, p.lldp_wait, stop.clone()).await;
    let machine = Arc::new(RamdiskMachine {
        lldp,
        ops: OpsConfig {
            reboot: RebootConfig::from_command_line(SYSCALL),
            log_file: cfg.log_file.clone(),
            kmsg: cfg.root.path(bcd_core::ops::KMSG),
            ..OpsConfig::default()
        },
        root: cfg.root.clone(),
        boot_id,
        node_hint: p.node.clone(),
        nvml: cfg.nvml.clone(),
        rescue: Rescue::new(cfg.rescue.clone()),
        network,
    });
    let executor = Arc::new(Executor::new(machine, Journal::memory()));
    // The hooks stop the lifecycle when the identity ends; signals stop it from outside.
    let (stop_tx, lifecycle_stop) = watch::channel(false);
    let forward = tokio::spawn(forward_stop(stop, stop_tx.clone()));
    let mut hooks = RamdiskHooks::new(stop_tx);
    let config = LifecycleConfig {
        control_planes: p.urls.clone(),
        ca_pin: Some(p.pin.clone()),
        reconnect_base: cfg.reconnect_base,
        reconnect_max: cfg.reconnect_max,
        retry_refused_joins: false,
        outbound_capacity: OUTBOUND_CAPACITY,
    };
    let store = MemoryIdentity::default();
    let tokens = BootToken(p.token.clone());
    let lifecycle = Lifecycle {
        config: &config,
        executor: &executor,
        store: &store,
        tokens: &tokens,
    };
    let outcome = bcd_core::lifecycle::run(&lifecycle, &mut hooks, lifecycle_stop).await;
    forward.abort();
    match outcome {
        Ok(()) => match hooks.ended() {
            Some(why) => Err(BootError::Ended(why.to_owned())),
            None => Ok(()),
        },
        Err(LifecycleError::Join(e @ JoinError::Refused(_))) => Err(BootError::TokenRefused(e)),
        Err(e) => Err(BootError::Lifecycle(e)),
    }
}

/// The longest one blocking piece of the LLDP wait.
const LLDP_WAIT_SLICE: Duration = Duration::from_millis(500);

/// Starts the LLDP listener on a live root and waits up to `wait` (`bcd.lldp_wait`) for every
/// physical, up link to hear an LLDPDU, or for `stop`. The wait is before the join, so that the
/// first inventory has the neighbours and no session (heartbeats) waits on the wire; later
/// inventories carry what the listener holds then. `None` (logged) when the thread cannot start.
async fn start_lldp(
    root: &HostRoot,
    wait: Duration,
    mut stop: watch::Receiver<bool>,
) -> Option<Arc<Watcher>> {
    if !root.is_live() {
        return None;
    }
    let watcher = match Watcher::spawn(root.clone()) {
        Ok(w) => Arc::new(w),
        Err(e) => {
            tracing::warn!(error = %e, "LLDP listener not running; the inventory has no neighbours");
            return None;
        }
    };
    if wait.is_zero() {
        return Some(watcher);
    }
    let started = std::time::Instant::now();
    let deadline = started + wait;
    // In slices, so that a stop leaves no blocking wait behind for longer than one.
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() || watcher.heard_all() {
            break;
        }
        let w = Arc::clone(&watcher);
        let slice = left.min(LLDP_WAIT_SLICE);
        tokio::select! {
            r = tokio::task::spawn_blocking(move || w.wait_heard(slice)) => if let Err(e) = r {
                tracing::warn!(error = %e, "lldp: the wait failed; joining without it");
                break;
            },
            Ok(_) = stop.wait_for(|s| *s) => {
                tracing::info!("lldp: wait cut short by a stop");
                break;
            }
        }
    }
    let heard = watcher.neighbors();
    tracing::info!(
        links = heard.len(),
        neighbours = heard.values().map(Vec::len).sum::<usize>(),
        waited_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        "lldp: waited for neighbours before joining"
    );
    Some(watcher)
}

/// Turns `to` true once `from` does.
async fn forward_stop(mut from: watch::Receiver<bool>, to: watch::Sender<bool>) {
    if from.wait_for(|s| *s).await.is_ok() {
        let _ = to.send(true);
    }
}

#[cfg(test)]
#[path = "boot_tests.rs"]
mod tests;
