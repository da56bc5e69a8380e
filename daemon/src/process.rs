//! What the modes that hold a session (`bcd agent`, `bcd site`, `bcd ramdisk`) share around the
//! session core: their flags ([`SessionArgs`], with [`ReconnectArgs`] inside it, flattened into
//! each mode's own), the join token source, what stops a mode ([`SessionError`]), shutdown
//! signals, systemd's notifier and the command journal of a state dir.
//!
//! A mode keeps only what is its own: its flags beside these, its machine and hooks, its errors
//! beyond [`SessionError`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bc_sys::notify::Notifier;
use bcd_core::journal::Journal;
use bcd_core::lifecycle::{LifecycleConfig, LifecycleError};
use bcd_core::mode::TokenSource;
use bcd_core::state::StateError;
use bcd_core::tls::TlsError;
use tokio::sync::watch;

use crate::config::{Config, ConfigError, ConfigOverrides, DEFAULT_PATH};

/// How a mode reconnects: the backoff ceiling's first value and its cap. `bcd site` and
/// `bcd ramdisk` cap it at 30 s (`mut_arg` on their flags), `bcd agent` at 2 min.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct ReconnectArgs {
    /// First reconnect wait ceiling; doubles per failure up to --reconnect-max.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "500ms")]
    pub reconnect_base: Duration,
    /// Largest reconnect wait.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "2m")]
    pub reconnect_max: Duration,
}

/// How a mode finds, trusts and joins the control plane, where its config file and host root
/// are, and how it reconnects: the flags `bcd agent` and `bcd site` share. Each flag overrides
/// its key of `/etc/bcd/bcd.toml` and its `BCD_*` variable.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct SessionArgs {
    /// Control plane gateway URL, e.g. `https://cp.example:7443`; with several replicas, their
    /// URLs comma-separated or as repeated flags (tried in a shuffled order).
    #[arg(
        long,
        env = "BCD_CONTROL_PLANE",
        value_delimiter = ',',
        value_name = "URL"
    )]
    pub control_plane: Vec<String>,
    /// Join token `<id>.<secret>`; needed only until the machine has an identity.
    #[arg(long, env = "BCD_JOIN_TOKEN", hide_env_values = true)]
    pub join_token: Option<String>,
    /// Pin of the control plane's CA: `sha256:<hex of the CA's SubjectPublicKeyInfo>`.
    #[arg(long, env = "BCD_CA_PIN")]
    pub ca_pin: Option<String>,
    /// File holding the join token (read at every join attempt, so a new token can be dropped in
    /// after a revocation).
    #[arg(long, env = "BCD_JOIN_TOKEN_FILE")]
    pub join_token_file: Option<PathBuf>,
    /// Host root prefix for /sys, /proc, /dev, /etc (default /).
    #[arg(long)]
    pub root: Option<PathBuf>,
    /// Config file (default /etc/bcd/bcd.toml when it exists). Flags and BCD_* variables win.
    #[arg(long, env = "BCD_CONFIG")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub reconnect: ReconnectArgs,
}

impl SessionArgs {
    /// The effective configuration: defaults < file < `BCD_*` environment < flags, the flags
    /// being this group's and the mode's own (`mode`: its other keys).
    /// Errors: an unreadable or invalid file (`--config` given, or the default one present), an
    /// invalid `BCD_*` value.
    pub fn resolve_config(&self, mode: ConfigOverrides) -> Result<Config, ConfigError> {
        let flags = ConfigOverrides {
            control_plane: crate::config::flag_list(&self.control_plane),
            join_token_file: self.join_token_file.clone(),
            ca_pin: self.ca_pin.clone(),
            root: self.root.clone(),
            ..mode
        };
        let env = ConfigOverrides::from_process_env()?;
        let (path, explicit) = match &self.config {
            Some(p) => (p.clone(), true),
            None => (PathBuf::from(DEFAULT_PATH), false),
        };
        Config::resolve(&path, explicit, &env, &flags)
    }

    /// Where the join token comes from: `--join-token`, else the configured token file.
    pub fn tokens(&self, cfg: &Config) -> JoinTokens {
        JoinTokens {
            flag: self.join_token.clone(),
            file: cfg.join_token_file.clone(),
        }
    }

    /// The session core's settings for `cfg`; `outbound_capacity` is the mode's queue of
    /// outbound messages (the site agent reports more than a node).
    pub fn lifecycle(&self, cfg: &Config, outbound_capacity: usize) -> LifecycleConfig {
        LifecycleConfig {
            control_planes: cfg.control_plane.clone(),
            ca_pin: cfg.ca_pin.clone(),
            reconnect_base: self.reconnect.reconnect_base,
            reconnect_max: self.reconnect.reconnect_max,
            retry_refused_joins: false,
            outbound_capacity,
        }
    }
}

/// Takes `state`'s exclusive lock (`agent.lock`) for the caller's life: one `bcd agent` or
/// `bcd site` per state dir (two would share one identity and command journal, and two site
/// agents would both act on the BMCs). `dir` names the state dir in the error. Errors:
/// [`SessionError::Locked`] naming the running process's pid, or the state dir's own.
pub fn lock_state_dir(
    state: &bcd_core::state::StateDir,
    dir: &std::path::Path,
) -> Result<bc_sys::lockfile::DirLock, SessionError> {
    state.lock().map_err(|e| match e {
        StateError::Lock(bc_sys::lockfile::LockError::Held { path, holder }) => {
            SessionError::Locked {
                state_dir: dir.to_path_buf(),
                lock: path,
                holder,
            }
        }
        other => SessionError::State(other),
    })
}

/// What stops any mode that holds a session: its state dir, its flags, TLS, the first join,
/// signals, the config file.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The state dir is unusable.
    #[error(transparent)]
    State(#[from] StateError),
    /// Another `bcd agent` or `bcd site` holds the state dir's lock.
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
    Config(#[from] ConfigError),
}

impl SessionError {
    /// The message for a lifecycle that stopped with `e`; `state_dir` for the usage hint.
    pub fn from_lifecycle(e: LifecycleError, state_dir: &Path) -> Self {
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

/// The join token: the flag/env value, else the token file (read at every attempt, so a new
/// token can be dropped in after a revocation).
#[derive(Debug)]
pub struct JoinTokens {
    flag: Option<String>,
    file: Option<PathBuf>,
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

/// A receiver that turns true when SIGTERM or SIGINT arrives (logged once).
/// Errors: [`SessionError::Signals`] when the handlers cannot be installed.
pub fn shutdown_signal() -> Result<watch::Receiver<bool>, SessionError> {
    use tokio::signal::unix::{SignalKind, signal};
    let (tx, rx) = watch::channel(false);
    let mut term = signal(SignalKind::terminate()).map_err(SessionError::Signals)?;
    let mut int = signal(SignalKind::interrupt()).map_err(SessionError::Signals)?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::info!("shutdown signal received");
        let _ = tx.send(true);
    });
    Ok(rx)
}

/// systemd's notifier (`NOTIFY_SOCKET`; a disabled one, logged, when it is unusable), with the
/// watchdog pinged when systemd asks for one (`WATCHDOG_USEC`).
pub fn systemd() -> Arc<Notifier> {
    let notifier = Arc::new(Notifier::from_env().unwrap_or_else(|e| {
        tracing::warn!(error = %e, "NOTIFY_SOCKET unusable; not talking to systemd");
        Notifier::disabled()
    }));
    if let Some(every) = bc_sys::notify::watchdog_interval_from_env() {
        bc_sys::notify::spawn_watchdog(Arc::clone(&notifier), every);
    }
    notifier
}

/// The command journal of `state_dir`, after the last run's leftovers are settled: a
/// node.reboot that came back under a new boot id succeeded; anything else that was running
/// when the agent stopped is reported failed, never re-run.
/// Errors: the journal's directory or files cannot be read or written.
pub fn open_journal(state_dir: &Path, boot_id: &str) -> Result<Journal, StateError> {
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
