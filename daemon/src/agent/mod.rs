//! The node agent (`bcd agent`): join if there is no identity, then hold one session with the
//! gateway, reconnecting with exponential backoff and full jitter, until SIGTERM/SIGINT, when it
//! says Goodbye.

mod backoff;
mod commands;
mod join;
pub mod journal;
mod session;
pub mod status;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::state::{StateDir, StateError};
use crate::tls::{ChannelError, TlsError};
use bcd_probes::hostroot::HostRoot;

pub use backoff::Backoff;

/// Flags of `bcd agent`.
#[derive(Debug, Clone, clap::Args)]
pub struct AgentArgs {
    /// Control plane gateway URL, e.g. `https://cp.example:7443`.
    #[arg(long, env = "BCD_CONTROL_PLANE")]
    pub control_plane: Option<String>,
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
    /// A flag is missing or wrong.
    #[error("{0}")]
    Usage(String),
    /// TLS material or the URL is unusable.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The control plane could not be reached or failed the pin check.
    #[error("control plane: {0}")]
    Connect(#[from] ChannelError),
    /// The control plane's certificate chain does not hold the pinned CA: the token was not sent.
    #[error(
        "the control plane at {control_plane} does not present the CA pinned by --ca-pin {pin}; the join token was NOT sent. Check the pin (`bcctl tokens create` prints it) or that the URL points at your control plane"
    )]
    PinMismatch { control_plane: String, pin: String },
    /// The control plane refused the join (bad, expired or used-up token, ...).
    #[error("join refused: {}", .0.message())]
    JoinRefused(tonic::Status),
    /// Making the key or CSR failed.
    #[error("key generation: {0}")]
    Key(rcgen::Error),
    /// A blocking task failed.
    #[error("internal task failed: {0}")]
    Task(String),
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
    /// Whether retrying cannot help: a refused token, a pin mismatch, bad local material. A
    /// control plane that is down or overloaded (`UNAVAILABLE`) is worth retrying.
    pub fn is_fatal(&self) -> bool {
        match self {
            AgentError::JoinRefused(status) => !matches!(
                status.code(),
                tonic::Code::Unavailable
                    | tonic::Code::DeadlineExceeded
                    | tonic::Code::Unknown
                    | tonic::Code::Internal
                    | tonic::Code::ResourceExhausted
            ),
            AgentError::PinMismatch { .. }
            | AgentError::Tls(_)
            | AgentError::State(_)
            | AgentError::Usage(_)
            | AgentError::Key(_)
            | AgentError::Signals(_)
            | AgentError::Config(_)
            | AgentError::Metrics(_) => true,
            AgentError::Connect(_) | AgentError::Task(_) => false,
        }
    }
}

/// Resolves when SIGTERM or SIGINT arrives, flipping `tx` to true.
async fn watch_signals(tx: watch::Sender<bool>) -> Result<(), AgentError> {
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
        control_plane: args.control_plane.clone(),
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

/// Where to find a join token: the flag/env value, else the token file.
fn join_token(args: &AgentArgs, cfg: &crate::config::Config) -> Option<String> {
    if let Some(t) = &args.join_token {
        return Some(t.trim().to_owned());
    }
    let path = cfg.join_token_file.as_ref()?;
    let t = std::fs::read_to_string(path).ok()?;
    let t = t.trim();
    (!t.is_empty()).then(|| t.to_owned())
}

/// When to renew: a random point between 70 % and 90 % of the certificate's life, counted from
/// when it was issued (notBefore is backdated 5 minutes for clock skew).
fn renew_at(cert_pem: &str) -> Option<tokio::time::Instant> {
    use rand::Rng;
    let v = crate::state::cert_validity(cert_pem)?;
    let issued = v.not_before_ms + 5 * 60 * 1000;
    let issued = issued.min(v.not_after_ms);
    let life = (v.not_after_ms - issued).max(1);
    let at_ms = issued + (life as f64 * rand::rng().random_range(0.7..0.9)) as i64;
    let wait = at_ms - chrono::Utc::now().timestamp_millis();
    Some(tokio::time::Instant::now() + Duration::from_millis(u64::try_from(wait).unwrap_or(0)))
}

/// Runs the agent until SIGTERM/SIGINT.
pub async fn run(args: AgentArgs) -> Result<(), AgentError> {
    let cfg = resolve_config(&args)?;
    let notifier = Arc::new(bc_sys::notify::Notifier::from_env().unwrap_or_else(|e| {
        tracing::warn!(error = %e, "NOTIFY_SOCKET unusable; not talking to systemd");
        bc_sys::notify::Notifier::disabled()
    }));
    if let Some(every) = bc_sys::notify::watchdog_interval_from_env() {
        bc_sys::notify::spawn_watchdog(Arc::clone(&notifier), every);
    }
    let (stop_tx, mut stop) = watch::channel(false);
    watch_signals(stop_tx).await?;
    let root = HostRoot::new(&cfg.root);
    let state = StateDir::open(&cfg.state_dir)?;
    let status = status::StatusFile::new(state.path());
    if let Some(addr) = cfg.metrics_listen {
        let bound = crate::metrics::serve(addr, crate::metrics::global().clone()).await?;
        status.update(|s| s.metrics_url = Some(crate::metrics::url(bound)));
    }
    let mut backoff = Backoff::new(args.reconnect_base, args.reconnect_max);

    let journal = journal::Journal::open(state.path())?;
    let boot_id = root
        .read_trimmed("/proc/sys/kernel/random/boot_id")
        .unwrap_or_default();
    let nvml = bcd_probes::nvml::NvmlConfig {
        lib_path: cfg.nvml_lib.clone(),
        nvidia_smi: cfg.nvidia_smi.clone(),
    };
    let now = chrono::Utc::now().timestamp_millis();
    for e in crate::reboot::complete_after_boot(&journal, &boot_id, now) {
        tracing::info!(command = %e.id, "node.reboot done: the machine came back with a new boot id");
    }
    let failed = journal.recover(now, |e| crate::reboot::keep_pending(e, &boot_id));
    for e in &failed {
        tracing::warn!(command = %e.id, name = %e.name, "command was interrupted by an agent restart; reported failed, not re-run");
    }
    // node.reboot and logs.collect: the file's reboot_command and journalctl, the flags' others.
    let mut ops = args.ops.config(&cfg.state_dir);
    ops.reboot = crate::reboot::RebootConfig::from_command_line(&cfg.reboot_command.join(" "));
    ops.journalctl = cfg.journalctl.clone();
    let executor =
        Arc::new(commands::Executor::new(journal, root.clone(), boot_id, nvml).with_ops(ops));

    // Convergence runs from the start, connected or not: it re-applies the last spec and expires
    // break-glass keys on time.
    let (desired_tx, desired_rx) = watch::channel::<crate::converge::Desired>(None);
    let (status_tx, mut statuses) = tokio::sync::mpsc::channel(16);
    let probe: Arc<dyn crate::converge::devices::GpuProcessProbe> =
        Arc::new(crate::converge::devices::ProcfsProbe::new(root.clone()));
    let _converge = crate::converge::Applier::new(root.clone(), cfg.state_dir.clone(), probe)
        .spawn(desired_rx, status_tx);
    let mut last_status = None;

    // XIDs as they happen: NVML events, or the kernel log under the root prefix.
    let (xid_tx, mut xids) = tokio::sync::mpsc::channel(256);
    let (watch_cfg, watch_root) = (executor.nvml.clone(), root.clone());
    let _xid_watch = tokio::task::spawn_blocking(move || {
        bcd_probes::nvml::spawn_xid_watch(&watch_cfg, &watch_root, xid_tx)
    })
    .await
    .map_err(|e| AgentError::Task(e.to_string()))?
    .map_err(|e| tracing::warn!(error = %e, "XID watch not running"))
    .ok();

    let _ = notifier.ready();
    let mut joined_once = false;
    // A token in use when the identity died is never tried again: only a new one re-joins.
    let mut stale_token: Option<String> = None;
    let outcome: Result<(), AgentError> = 'outer: loop {
        // 1. An identity: the stored one, or a join with a token.
        let identity = match state.load_identity()? {
            Some(id) => {
                tracing::info!(node_id = %id.node.node_id, identity_generation = id.node.identity_generation, "using stored identity");
                id
            }
            None => {
                let (Some(cp), Some(pin)) = (cfg.control_plane.clone(), cfg.ca_pin.clone()) else {
                    break 'outer Err(AgentError::Usage(format!(
                        "no identity in {}: pass --control-plane, --ca-pin and a join token (--join-token or --join-token-file) to join",
                        cfg.state_dir.display()
                    )));
                };
                let Some(token) =
                    join_token(&args, &cfg).filter(|t| stale_token.as_ref() != Some(t))
                else {
                    if !joined_once && stale_token.is_none() && cfg.join_token_file.is_none() {
                        break 'outer Err(AgentError::Usage(
                            "no identity and no join token: pass --join-token or --join-token-file"
                                .to_owned(),
                        ));
                    }
                    status.update(|s| {
                        s.state = "revoked".into();
                        s.message = "waiting for a new join token".into();
                    });
                    tracing::error!(
                        "no identity and no new join token: waiting for one (join_token_file is re-read every 30 s)"
                    );
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(30)) => continue 'outer,
                        _ = stop.wait_for(|v| *v) => break 'outer Ok(()),
                    }
                };
                let params = join::JoinParams {
                    control_plane: &cp,
                    token: &token,
                    ca_pin: &pin,
                    root: &root,
                };
                status.update(|s| {
                    s.state = "joining".into();
                    s.control_plane = Some(cp.clone());
                });
                match join::join(&state, &params).await {
                    Ok(id) => id,
                    Err(e) if e.is_fatal() && !joined_once => break 'outer Err(e),
                    Err(e) if e.is_fatal() => {
                        // After a revocation: never retry the same token; wait for a new one.
                        tracing::error!(error = %e, "re-join refused; waiting for a new join token (never retrying the same one)");
                        status.update(|s| {
                            s.state = "revoked".into();
                            s.message = format!("re-join refused: {e}");
                        });
                        stale_token = Some(token.clone());
                        continue 'outer;
                    }
                    Err(e) => {
                        let wait = backoff.next_delay();
                        tracing::warn!(error = %e, retry_in = ?wait, "join failed; retrying");
                        tokio::select! {
                            _ = tokio::time::sleep(wait) => continue 'outer,
                            _ = stop.wait_for(|v| *v) => break 'outer Ok(()),
                        }
                    }
                }
            }
        };
        joined_once = true;
        backoff.reset();
        status.update(|s| {
            s.node_id = Some(identity.node.node_id.clone());
            s.identity_generation = Some(identity.node.identity_generation);
            s.control_plane = Some(identity.node.control_plane.clone());
            s.certificate_not_after = crate::state::cert_validity(&identity.cert_pem)
                .and_then(|v| chrono::DateTime::from_timestamp_millis(v.not_after_ms))
                .map(|t| t.to_rfc3339());
            s.observed_generation = Some(crate::converge::observed_generation(state.path()));
            s.state = "connecting".into();
        });
        if crate::state::cert_validity(&identity.cert_pem)
            .is_some_and(|v| v.not_after_ms < chrono::Utc::now().timestamp_millis())
        {
            let why = "the node certificate expired while the agent was off: join again with a new token (see the operator guide)";
            tracing::error!("{why}");
            state.retire_identity(why)?;
            continue 'outer;
        }

        // 2. Sessions with this identity until it dies or we stop.
        let mut current = identity;
        let mut pending: Option<(String, String)> = None;
        loop {
            let (key, cert) = match &pending {
                Some((k, c)) => (k.clone(), c.clone()),
                None => (current.key_pem.clone(), current.cert_pem.clone()),
            };
            let tls = match crate::tls::session_config(&current.ca_pem, &cert, &key) {
                Ok(t) => t,
                Err(e) => break 'outer Err(e.into()),
            };
            executor.set_upload(current.node.control_plane.clone(), Arc::clone(&tls));
            let ctx = session::SessionContext {
                executor: Arc::clone(&executor),
                state_dir: cfg.state_dir.clone(),
                identity: current.clone(),
                root: root.clone(),
                tls,
            };
            let _ = notifier.status(&format!("connecting to {}", current.node.control_plane));
            let mut welcomed = false;
            let end = session::run_once(
                &ctx,
                session::Shared {
                    stop: &mut stop,
                    backoff: &mut backoff,
                    desired: &desired_tx,
                    statuses: &mut statuses,
                    last_status: &mut last_status,
                    status: &status,
                    xids: &mut xids,
                    renew_at: renew_at(&cert),
                    promote: pending
                        .as_ref()
                        .map(|(k, c)| (&state, k.as_str(), c.as_str())),
                    welcomed: &mut welcomed,
                },
            )
            .await;
            crate::metrics::global().set_connected(false);
            // A renewed certificate that opened a session is now the one; one that did not is
            // dropped and the old one (still valid) is used again.
            if let Some((k, c)) = pending.take() {
                if welcomed {
                    current.key_pem = k;
                    current.cert_pem = c;
                    tracing::info!("renewed certificate in use and stored");
                } else {
                    tracing::warn!(
                        "the renewed certificate did not open a session; keeping the old one"
                    );
                }
            }
            match end {
                session::SessionEnd::Shutdown => break 'outer Ok(()),
                session::SessionEnd::Revoked(why) => {
                    // Retire first: once the log says so, the identity files are already gone.
                    state.retire_identity(&why)?;
                    status.update(|s| {
                        s.state = "revoked".into();
                        s.message = why.clone();
                    });
                    let _ = notifier.status("identity revoked: waiting for a new join token");
                    tracing::error!(reason = %why, node_id = %current.node.node_id, "this node's identity was revoked: it is retired and never used again; a new join token is needed");
                    stale_token = join_token(&args, &cfg);
                    continue 'outer;
                }
                session::SessionEnd::Rotate { key_pem, cert_pem } => {
                    tracing::info!("certificate renewed; reconnecting with it");
                    pending = Some((key_pem, cert_pem));
                }
                session::SessionEnd::Retry(reason) => {
                    crate::metrics::global().reconnect();
                    status.update(|s| {
                        s.state = "disconnected".into();
                        s.message = reason.clone();
                    });
                    let _ = notifier.status(&format!("disconnected: {reason}"));
                    let wait = backoff.next_delay();
                    tracing::warn!(reason = %reason, retry_in = ?wait, "session ended; reconnecting");
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = stop.wait_for(|v| *v) => break 'outer Ok(()),
                    }
                }
            }
        }
    };
    let _ = notifier.stopping();
    status.update(|s| {
        s.state = "stopped".into();
    });
    outcome
}
