//! The node agent (`bcd agent`): join if there is no identity, then hold one session with the
//! gateway, reconnecting with exponential backoff and full jitter, until SIGTERM/SIGINT, when it
//! says Goodbye.

mod backoff;
mod commands;
mod join;
pub mod journal;
mod session;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::hostroot::HostRoot;
use crate::state::{StateDir, StateError};
use crate::tls::{ChannelError, TlsError};

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
    /// Where the identity, journal and last spec live.
    #[arg(long, env = "BCD_STATE_DIR", default_value = "/var/lib/bcd")]
    pub state_dir: PathBuf,
    /// Host root prefix for /sys, /proc, /dev, /etc.
    #[arg(long, env = "BCD_ROOT", default_value = "/")]
    pub root: PathBuf,
    /// First reconnect wait ceiling; doubles per failure up to --reconnect-max.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "500ms")]
    pub reconnect_base: Duration,
    /// Largest reconnect wait.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "2m")]
    pub reconnect_max: Duration,
    #[command(flatten)]
    pub nvml: crate::nvml::cli::NvmlArgs,
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
            | AgentError::Signals(_) => true,
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

/// Runs the agent until SIGTERM/SIGINT.
pub async fn run(args: AgentArgs) -> Result<(), AgentError> {
    let (stop_tx, mut stop) = watch::channel(false);
    watch_signals(stop_tx).await?;
    let root = HostRoot::new(&args.root);
    let state = StateDir::open(&args.state_dir)?;
    let mut backoff = Backoff::new(args.reconnect_base, args.reconnect_max);

    let identity = loop {
        if let Some(id) = state.load_identity()? {
            tracing::info!(node_id = %id.node.node_id, identity_generation = id.node.identity_generation, "using stored identity");
            break id;
        }
        let (Some(cp), Some(token), Some(pin)) =
            (&args.control_plane, &args.join_token, &args.ca_pin)
        else {
            return Err(AgentError::Usage(format!(
                "no identity in {}: pass --control-plane, --join-token and --ca-pin to join",
                args.state_dir.display()
            )));
        };
        let params = join::JoinParams {
            control_plane: cp,
            token,
            ca_pin: pin,
            root: &root,
        };
        match join::join(&state, &params).await {
            Ok(id) => break id,
            Err(e) if e.is_fatal() => return Err(e),
            Err(e) => {
                let wait = backoff.next_delay();
                tracing::warn!(error = %e, retry_in = ?wait, "join failed; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = stop.wait_for(|v| *v) => return Ok(()),
                }
            }
        }
    };
    backoff.reset();

    let cfg = crate::tls::session_config(&identity.ca_pem, &identity.cert_pem, &identity.key_pem)?;
    let journal = journal::Journal::open(state.path())?;
    let boot_id = root
        .read_trimmed("/proc/sys/kernel/random/boot_id")
        .unwrap_or_default();
    let now = chrono::Utc::now().timestamp_millis();
    for e in crate::reboot::complete_after_boot(&journal, &boot_id, now) {
        tracing::info!(command = %e.id, "node.reboot done: the machine came back with a new boot id");
    }
    let failed = journal.recover(now, |e| crate::reboot::keep_pending(e, &boot_id));
    for e in &failed {
        tracing::warn!(command = %e.id, name = %e.name, "command was interrupted by an agent restart; reported failed, not re-run");
    }
    let ctx = session::SessionContext {
        executor: Arc::new(
            commands::Executor::new(journal, root.clone(), boot_id, args.nvml.config()).with_ops(
                args.ops
                    .config(&args.state_dir)
                    .with_upload(identity.node.control_plane.clone(), Arc::clone(&cfg)),
            ),
        ),
        identity,
        root,
        tls: cfg,
    };
    loop {
        let end = session::run_once(&ctx, &mut stop, &mut backoff).await;
        match end {
            session::SessionEnd::Shutdown => return Ok(()),
            session::SessionEnd::Retry(reason) => {
                let wait = backoff.next_delay();
                tracing::warn!(reason = %reason, retry_in = ?wait, "session ended; reconnecting");
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = stop.wait_for(|v| *v) => return Ok(()),
                }
            }
        }
    }
}
