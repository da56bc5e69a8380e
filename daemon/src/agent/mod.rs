//! The node agent (`bcd agent`): the host's [`machine::NodeMachine`] and the agent's
//! [`hooks::AgentHooks`] (converge, XID watch, `status.json`, metrics, systemd) plugged into the
//! session core's [`bcd_core::lifecycle::run`]: join if there is no identity, then hold one
//! session with the gateway, reconnecting with exponential backoff and full jitter, until
//! SIGTERM/SIGINT, when it says Goodbye.

pub mod hooks;
pub mod machine;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bc_sys::notify::Notifier;
use bcd_core::executor::Executor;
use bcd_core::journal::Journal;
use bcd_core::lifecycle::{Lifecycle, LifecycleConfig, LifecycleError};
use bcd_core::mode::TokenSource;
use bcd_core::state::{StateDir, StateError};
use bcd_core::status::StatusFile;
use bcd_core::tls::TlsError;
use bcd_probes::hostroot::HostRoot;
use bcd_probes::nvml::NvmlConfig;
use tokio::sync::{mpsc, watch};

use machine::NodeMachine;

/// Outbound messages a session queues at most.
const OUTBOUND_CAPACITY: usize = 64;

/// Flags of `bcd agent`.
#[derive(Debug, Clone, clap::Args)]
pub struct AgentArgs {
    /// Control plane gateway URL, e.g. `https://cp.example:7443`; with several replicas, their
    /// URLs comma-separated or as repeated flags (tried in a shuffled order).
    #[arg(
        long,
        env = "BCD_CONTROL_PLANE",
        value_delimiter = ',',
        value_name = "URL"
    )]
    pub control_plane: Vec<String>,
    /// Join token `<id>.<secret>`; needed only until the node has an identity.
    #[arg(long, env = "BCD_JOIN_TOKEN", hide_env_values = true)]
    pub join_token: Option<String>,
    /// Pin of the control plane's CA: `sha256:<hex of the CA's SubjectPublicKeyInfo>`.
    #[arg(long, env = "BCD_CA_PIN")]
    pub ca_pin: Option<String>,
    /// File holding the join token (read at every join attempt, so a new token can be dropped in
    /// after a revocation).
    #[arg(long, env = "BCD_JOIN_TOKEN_FILE")]
    pub join_token_file: Option<PathBuf>,
    /// Where the identity, journal and last spec live (default /var/lib/bcd).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Host root prefix for /sys, /proc, /dev, /etc (default /).
    #[arg(long)]
    pub root: Option<PathBuf>,
    /// Config file (default /etc/bcd/bcd.toml when it exists). Flags and BCD_* variables win.
    #[arg(long, env = "BCD_CONFIG")]
    pub config: Option<PathBuf>,
    /// First reconnect wait ceiling; doubles per failure up to --reconnect-max.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "500ms")]
    pub reconnect_base: Duration,
    /// Largest reconnect wait.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "2m")]
    pub reconnect_max: Duration,
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
    /// The state dir is unusable.
    #[error(transparent)]
    State(#[from] StateError),
    /// Another agent holds the state dir's lock.
    #[error(
        "another bcd agent ({}) already runs on the state dir {}: stop it first, or give this one its own --state-dir (lock file {})",
        holder.map_or_else(|| "pid unknown".to_owned(), |p| format!("pid {p}")),
        state_dir.display(),
        lock.display()
    )]
    Locked {
        /// The state dir.
        state_dir: PathBuf,
        /// Its lock file.
        lock: PathBuf,
        /// The running agent's pid, as it wrote it in the lock file.
        holder: Option<u32>,
    },
    /// A flag is missing or wrong.
    #[error("{0}")]
    Usage(String),
    /// TLS material or the URL is unusable.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The first join failed in a way retrying cannot mend (pin mismatch, refused token, ...).
    #[error(transparent)]
    Join(#[from] bcd_core::join::JoinError),
    /// Signal handling could not be set up.
    #[error("signals: {0}")]
    Signals(std::io::Error),
    /// The config file or environment is invalid.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// The metrics listener could not be started.
    #[error(transparent)]
    Metrics(#[from] crate::metrics::MetricsError),
}

impl AgentError {
    /// The agent's message for a lifecycle that stopped with `e`; `state_dir` for the usage hint.
    pub(crate) fn from_lifecycle(e: LifecycleError, state_dir: &std::path::Path) -> Self {
        match e {
            LifecycleError::State(e) => Self::State(e),
            LifecycleError::Tls(e) => Self::Tls(e),
            LifecycleError::Join(e) => Self::Join(e),
            LifecycleError::NoJoinTarget => Self::Usage(format!(
                "no identity in {}: pass --control-plane, --ca-pin and a join token (--join-token or --join-token-file) to join",
                state_dir.display()
            )),
            LifecycleError::NoToken => Self::Usage(
                "no identity and no join token: pass --join-token or --join-token-file".to_owned(),
            ),
        }
    }
}

/// Resolves when SIGTERM or SIGINT arrives, flipping `tx` to true.
pub(crate) async fn watch_signals(tx: watch::Sender<bool>) -> Result<(), AgentError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(AgentError::Signals)?;
    let mut int = signal(SignalKind::interrupt()).map_err(AgentError::Signals)?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::info!("shutdown signal received");
        let _ = tx.send(true);
    });
    Ok(())
}

/// The effective configuration: defaults < file < BCD_* environment < flags.
pub fn resolve_config(args: &AgentArgs) -> Result<crate::config::Config, AgentError> {
    use crate::config::{Config, ConfigOverrides, DEFAULT_PATH};
    let flags = ConfigOverrides {
        control_plane: crate::config::flag_list(&args.control_plane),
        join_token_file: args.join_token_file.clone(),
        ca_pin: args.ca_pin.clone(),
        state_dir: args.state_dir.clone(),
        root: args.root.clone(),
        nvml_lib: args.nvml.nvml_lib.clone(),
        // The flag's default must not hide the file's value.
        nvidia_smi: (args.nvml.nvidia_smi != std::path::Path::new("nvidia-smi"))
            .then(|| args.nvml.nvidia_smi.clone()),
        reboot_command: (args.ops.reboot_command != "systemctl reboot").then(|| {
            args.ops
                .reboot_command
                .split_whitespace()
                .map(str::to_owned)
                .collect()
        }),
        journalctl: (args.ops.journalctl != std::path::Path::new("journalctl"))
            .then(|| args.ops.journalctl.clone()),
        metrics_listen: args.metrics_listen,
        ..Default::default()
    };
    let env = ConfigOverrides::from_process_env()?;
    let (path, explicit) = match &args.config {
        Some(p) => (p.clone(), true),
        None => (PathBuf::from(DEFAULT_PATH), false),
    };
    Ok(Config::resolve(&path, explicit, &env, &flags)?)
}

/// The join token: the flag/env value, else the token file (read at every attempt, so a new
/// token can be dropped in after a revocation).
#[derive(Debug)]
pub(crate) struct JoinTokens {
    pub(crate) flag: Option<String>,
    pub(crate) file: Option<PathBuf>,
}

impl TokenSource for JoinTokens {
    fn token(&self) -> Option<String> {
        if let Some(t) = &self.flag {
            return Some(t.trim().to_owned());
        }
        let t = std::fs::read_to_string(self.file.as_ref()?).ok()?;
        let t = t.trim();
        (!t.is_empty()).then(|| t.to_owned())
    }

    fn can_wait(&self) -> bool {
        self.file.is_some()
    }
}

/// Runs the agent until SIGTERM/SIGINT.
pub async fn run(args: AgentArgs) -> Result<(), AgentError> {
    let cfg = resolve_config(&args)?;
    let notifier = Arc::new(Notifier::from_env().unwrap_or_else(|e| {
        tracing::warn!(error = %e, "NOTIFY_SOCKET unusable; not talking to systemd");
        Notifier::disabled()
    }));
    if let Some(every) = bc_sys::notify::watchdog_interval_from_env() {
        bc_sys::notify::spawn_watchdog(Arc::clone(&notifier), every);
    }
    let (stop_tx, stop) = watch::channel(false);
    watch_signals(stop_tx).await?;
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
    let state = StateDir::open(&cfg.state_dir)?;
    // One agent per state dir, for the process's life: taken before anything in it is written.
    let _lock = state.lock().map_err(|e| match e {
        StateError::Lock(bc_sys::lockfile::LockError::Held { path, holder }) => {
            AgentError::Locked {
                state_dir: cfg.state_dir.clone(),
                lock: path,
                holder,
            }
        }
        other => AgentError::State(other),
    })?;
    let status = StatusFile::new(state.path());
    if let Some(addr) = cfg.metrics_listen {
        let bound = crate::metrics::serve(addr, crate::metrics::global().clone()).await?;
        status.update(|s| s.metrics_url = Some(crate::metrics::url(bound)));
    }
    let boot_id = root
        .read_trimmed("/proc/sys/kernel/random/boot_id")
        .unwrap_or_default();
    let journal = open_journal(state.path(), &boot_id)?;
    let machine = Arc::new(NodeMachine {
        ops: ops_config(args, cfg, &root),
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
    let config = LifecycleConfig {
        control_planes: cfg.control_plane.clone(),
        ca_pin: cfg.ca_pin.clone(),
        reconnect_base: args.reconnect_base,
        reconnect_max: args.reconnect_max,
        retry_refused_joins: false,
        outbound_capacity: OUTBOUND_CAPACITY,
    };
    let tokens = JoinTokens {
        flag: args.join_token.clone(),
        file: cfg.join_token_file.clone(),
    };
    let lifecycle = Lifecycle {
        config: &config,
        executor: &executor,
        store: &state,
        tokens: &tokens,
    };
    bcd_core::lifecycle::run(&lifecycle, &mut hooks, stop)
        .await
        .map_err(|e| AgentError::from_lifecycle(e, &cfg.state_dir))
}

/// The command journal of the state dir, after the last run's leftovers are settled: a
/// node.reboot that came back under a new boot id succeeded; anything else that was running
/// when the agent stopped is reported failed, never re-run.
pub(crate) fn open_journal(
    state_dir: &std::path::Path,
    boot_id: &str,
) -> Result<Journal, StateError> {
    let journal = Journal::open(state_dir)?;
    let now = chrono::Utc::now().timestamp_millis();
    let reboot = bcd_core::ops::reboot::complete_after_boot(&journal, boot_id, now);
    for e in reboot {
        tracing::info!(command_id = %e.id, "node.reboot done: the machine came back with a new boot id");
    }
    let failed = journal.recover(now, |e| bcd_core::ops::reboot::keep_pending(e, boot_id));
    for e in &failed {
        tracing::warn!(command_id = %e.id, name = %e.name, "command was interrupted by an agent restart; reported failed, not re-run");
    }
    Ok(journal)
}

/// node.reboot and logs.collect settings: the file's reboot_command and journalctl, the flags'
/// others.
fn ops_config(
    args: &AgentArgs,
    cfg: &crate::config::Config,
    root: &HostRoot,
) -> bcd_core::ops::OpsConfig {
    let mut ops = args.ops.config(&cfg.state_dir, root);
    ops.reboot =
        bcd_core::ops::reboot::RebootConfig::from_command_line(&cfg.reboot_command.join(" "));
    ops.journalctl = cfg.journalctl.clone();
    ops
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
