//! The node agent (`bcd agent`): the host's [`machine::NodeMachine`] and the agent's
//! [`hooks::AgentHooks`] (converge, XID watch, `status.json`, metrics, systemd) plugged into the
//! session core's [`bcd_core::lifecycle::run`]: join if there is no identity, then hold one
//! session with the gateway, reconnecting with exponential backoff and full jitter, until
//! SIGTERM/SIGINT, when it says Goodbye.

pub mod hooks;
pub mod machine;

use std::path::PathBuf;
use std::sync::Arc;

use bc_sys::notify::Notifier;
use bcd_core::executor::Executor;
use bcd_core::lifecycle::Lifecycle;
use bcd_core::state::StateDir;
use bcd_core::status::StatusFile;
use bcd_probes::hostroot::HostRoot;
use bcd_probes::nvml::NvmlConfig;
use tokio::sync::{mpsc, watch};

use crate::process::{self, SessionArgs, SessionError};
use machine::NodeMachine;

/// Outbound messages a session queues at most.
const OUTBOUND_CAPACITY: usize = 64;

/// Flags of `bcd agent`.
#[derive(Debug, Clone, clap::Args)]
pub struct AgentArgs {
    #[command(flatten)]
    pub session: SessionArgs,
    /// Where the identity, journal and last spec live (default /var/lib/bcd).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Serve Prometheus metrics at `http://ADDR/metrics` (e.g. `127.0.0.1:9464`; port 0 picks
    /// one, written to status.json as `metricsUrl`). Also `metrics_listen` in bcd.toml and
    /// `BCD_METRICS_LISTEN`. Off unless set.
    #[arg(long)]
    pub metrics_listen: Option<std::net::SocketAddr>,
    #[command(flatten)]
    pub nvml: bcd_probes::nvml::cli::NvmlArgs,
    #[command(flatten)]
    pub ops: crate::ops::OpsArgs,
}

/// What stops the agent.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// What stops any mode: state dir, usage, TLS, join, signals, the config file.
    #[error(transparent)]
    Session(#[from] SessionError),
    /// The metrics listener could not be started.
    #[error(transparent)]
    Metrics(#[from] crate::metrics::MetricsError),
}

/// The effective configuration: defaults < file < BCD_* environment < flags.
pub fn resolve_config(args: &AgentArgs) -> Result<crate::config::Config, AgentError> {
    let mode = crate::config::ConfigOverrides {
        state_dir: args.state_dir.clone(),
        nvml_lib: args.nvml.nvml_lib.clone(),
        // The flag's default must not hide the file's value.
        nvidia_smi: (args.nvml.nvidia_smi != std::path::Path::new("nvidia-smi"))
            .then(|| args.nvml.nvidia_smi.clone()),
        metrics_listen: args.metrics_listen,
        ..args.ops.overrides()
    };
    Ok(args
        .session
        .resolve_config(mode)
        .map_err(SessionError::from)?)
}

/// Runs the agent until SIGTERM/SIGINT.
pub async fn run(args: AgentArgs) -> Result<(), AgentError> {
    let cfg = resolve_config(&args)?;
    let notifier = process::systemd();
    let stop = process::shutdown_signal()?;
    run_until(&args, &cfg, notifier, stop).await
}

/// Runs the agent with `cfg` until `stop` turns true.
async fn run_until(
    args: &AgentArgs,
    cfg: &crate::config::Config,
    notifier: Arc<Notifier>,
    stop: watch::Receiver<bool>,
) -> Result<(), AgentError> {
    let root = HostRoot::new(&cfg.root);
    let state = StateDir::open(&cfg.state_dir).map_err(SessionError::from)?;
    // One agent per state dir, for the process's life: taken before anything in it is written.
    let _lock = process::lock_state_dir(&state, &cfg.state_dir)?;
    let status = StatusFile::new(state.path());
    if let Some(addr) = cfg.metrics_listen {
        let bound = crate::metrics::serve(addr, crate::metrics::global().clone()).await?;
        status.update(|s| s.metrics_url = Some(crate::metrics::url(bound)));
    }
    let boot_id = root
        .read_trimmed("/proc/sys/kernel/random/boot_id")
        .unwrap_or_default();
    let journal = process::open_journal(state.path(), &boot_id).map_err(SessionError::from)?;
    let machine = Arc::new(NodeMachine {
        ops: args.ops.resolved(cfg, &cfg.state_dir, &root),
        nvml: NvmlConfig {
            lib_path: cfg.nvml_lib.clone(),
            nvidia_smi: cfg.nvidia_smi.clone(),
        },
        lldp: start_lldp(cfg.lldp, &root),
        root,
        state_dir: cfg.state_dir.clone(),
        boot_id,
    });
    let executor = Arc::new(
        Executor::new(Arc::clone(&machine), journal)
            .on_finished(|name, state| crate::metrics::global().command_finished(name, state)),
    );

    let (desired, statuses, _converge) = start_converge(&machine, &cfg.state_dir);
    let (xid_tx, xids) = mpsc::channel(256);
    let _xid_watch = start_xid_watch(&machine, xid_tx).await;
    let mut hooks = hooks::AgentHooks {
        status,
        notifier: Arc::clone(&notifier),
        state_dir: cfg.state_dir.clone(),
        desired,
        statuses,
        last_status: None,
        xids,
        heartbeat_in_flight: None,
    };
    let _ = notifier.ready();
    let config = args.session.lifecycle(cfg, OUTBOUND_CAPACITY);
    let tokens = args.session.tokens(cfg);
    let lifecycle = Lifecycle {
        config: &config,
        executor: &executor,
        store: &state,
        tokens: &tokens,
    };
    bcd_core::lifecycle::run(&lifecycle, &mut hooks, stop)
        .await
        .map_err(|e| SessionError::from_lifecycle(e, &cfg.state_dir).into())
}

/// Convergence runs from the start, connected or not: it re-applies the last spec and expires
/// break-glass keys on time. Returns its input, its output and the task.
fn start_converge(
    machine: &NodeMachine,
    state_dir: &std::path::Path,
) -> (
    watch::Sender<crate::converge::Desired>,
    mpsc::Receiver<bc_protocol::pb::SpecStatus>,
    tokio::task::JoinHandle<()>,
) {
    let (desired, desired_rx) = watch::channel::<crate::converge::Desired>(None);
    let (status_tx, statuses) = mpsc::channel(16);
    let probe: Arc<dyn crate::converge::devices::GpuProcessProbe> = Arc::new(
        crate::converge::devices::ProcfsProbe::new(machine.root.clone()),
    );
    let task = crate::converge::Applier::new(machine.root.clone(), state_dir.to_owned(), probe)
        .spawn(desired_rx, status_tx);
    (desired, statuses, task)
}

/// The LLDP listener (`lldp` in bcd.toml, on by default), on a live root only: its sockets are
/// this process's network namespace's. `None` (logged) when off or when its thread cannot start.
fn start_lldp(on: bool, root: &HostRoot) -> Option<Arc<bcd_probes::inventory::lldp::Watcher>> {
    if !on || !root.is_live() {
        tracing::info!(
            configured = on,
            "LLDP listener off (lldp = false, or a root prefix other than /)"
        );
        return None;
    }
    match bcd_probes::inventory::lldp::Watcher::spawn(root.clone()) {
        Ok(w) => Some(Arc::new(w)),
        Err(e) => {
            tracing::warn!(error = %e, "LLDP listener not running; inventories carry no neighbours");
            None
        }
    }
}

/// XIDs as they happen: NVML events, or the kernel log under the root prefix. `None` (logged)
/// when neither can be watched; the session then has no XIDs to forward.
async fn start_xid_watch(
    machine: &NodeMachine,
    tx: mpsc::Sender<bcd_probes::nvml::XidEvent>,
) -> Option<bcd_probes::nvml::XidWatch> {
    let (cfg, root) = (machine.nvml.clone(), machine.root.clone());
    match tokio::task::spawn_blocking(move || bcd_probes::nvml::spawn_xid_watch(&cfg, &root, tx))
        .await
    {
        Ok(Ok(w)) => Some(w),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "XID watch not running");
            None
        }
        Err(e) => {
            tracing::warn!(error = %e, "XID watch not running");
            None
        }
    }
}
