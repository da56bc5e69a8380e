//! The site agent (`bcd site`): `bcd-site`'s machine and hooks on the session core, with the
//! process around them — flags, `/etc/bcd/bcd.toml` (the shared keys and `[site]`), signals,
//! systemd — and the power sync loop running beside the session.
//!
//! Join with a join token (mode SITE; the control plane decides the role and the site), then one
//! session with the gateway, reconnecting with backoff, until SIGTERM/SIGINT. BMC credentials
//! arrive in the session's `SiteAssignment` and stay in memory.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bc_sys::notify::Notifier;
use bcd_core::executor::Executor;
use bcd_core::lifecycle::{Lifecycle, LifecycleConfig};
use bcd_core::state::StateDir;
use bcd_core::status::StatusFile;
use bcd_probes::hostroot::HostRoot;
use bcd_site::bmc::RealConnector;
use bcd_site::config::{SiteConfig, SiteConfigError};
use bcd_site::hooks::{ProcessSignals, SiteHooks};
use bcd_site::machine::SiteMachine;
use bcd_site::site::Site;
use tokio::sync::watch;

use crate::agent::{AgentError, JoinTokens};

/// Outbound messages a session queues at most.
const OUTBOUND_CAPACITY: usize = 256;

/// Flags of `bcd site`.
#[derive(Debug, Clone, clap::Args)]
pub struct SiteArgs {
    /// Control plane gateway URL, e.g. `https://cp.example:7443`; with several replicas, their
    /// URLs comma-separated or as repeated flags (tried in a shuffled order).
    #[arg(
        long,
        env = "BCD_CONTROL_PLANE",
        value_delimiter = ',',
        value_name = "URL"
    )]
    pub control_plane: Vec<String>,
    /// Join token `<id>.<secret>` of the site; needed only until the appliance has an identity.
    #[arg(long, env = "BCD_JOIN_TOKEN", hide_env_values = true)]
    pub join_token: Option<String>,
    /// Pin of the control plane's CA: `sha256:<hex of the CA's SubjectPublicKeyInfo>`.
    #[arg(long, env = "BCD_CA_PIN")]
    pub ca_pin: Option<String>,
    /// File holding the join token (read at every join attempt).
    #[arg(long, env = "BCD_JOIN_TOKEN_FILE")]
    pub join_token_file: Option<PathBuf>,
    /// Where the identity, journal and status live (default `[site] state_dir`,
    /// /var/lib/bcd-site).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Host root prefix for /sys, /proc, /dev, /etc (default /).
    #[arg(long)]
    pub root: Option<PathBuf>,
    /// Config file (default /etc/bcd/bcd.toml when it exists). Flags and BCD_* variables win.
    #[arg(long, env = "BCD_CONFIG")]
    pub config: Option<PathBuf>,
    /// The ipmitool binary (default `[site] ipmitool`, `ipmitool` on PATH).
    #[arg(long)]
    pub ipmitool: Option<PathBuf>,
    /// First reconnect wait ceiling; doubles per failure up to --reconnect-max.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "500ms")]
    pub reconnect_base: Duration,
    /// Largest reconnect wait.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
    pub reconnect_max: Duration,
    /// Serve network boots (iPXE scripts, the ramdisk's kernel and initramfs) on this address
    /// (default `[site] boot_listen`; unset: no boot service).
    #[arg(long)]
    pub boot_listen: Option<std::net::SocketAddr>,
    /// The ramdisk's kernel (default `[site] boot_kernel`).
    #[arg(long)]
    pub boot_kernel: Option<PathBuf>,
    /// The ramdisk's initramfs (default `[site] boot_initrd`).
    #[arg(long)]
    pub boot_initrd: Option<PathBuf>,
    /// Seconds a booted ramdisk waits for LLDP on its links before joining
    /// (`bcd.lldp_wait`; default `[site] ramdisk_lldp_wait_s`, 30).
    #[arg(long, value_name = "SECONDS")]
    pub ramdisk_lldp_wait: Option<u32>,
    #[command(flatten)]
    pub ops: crate::ops::OpsArgs,
}

/// What stops the site agent.
#[derive(Debug, thiserror::Error)]
pub enum SiteError {
    /// What stops any agent: state dir, usage, TLS, join, signals, the config file.
    #[error(transparent)]
    Agent(#[from] AgentError),
    /// The `[site]` section or a `BCD_SITE_*` variable is invalid.
    #[error(transparent)]
    Site(#[from] SiteConfigError),
    /// The boot service cannot start (its files, its address).
    #[error(transparent)]
    Boot(#[from] bcd_site::boot::BootError),
}

/// systemd's view of the site agent.
#[derive(Debug)]
struct Systemd(Arc<Notifier>);

impl ProcessSignals for Systemd {
    fn status(&self, text: &str) {
        let _ = self.0.status(text);
    }

    fn stopping(&self) {
        let _ = self.0.stopping();
    }
}

/// The effective configuration: defaults < file < BCD_* environment < flags, for the shared
/// keys and for `[site]`.
pub fn resolve_config(args: &SiteArgs) -> Result<(crate::config::Config, SiteConfig), SiteError> {
    use crate::config::{Config, ConfigError, ConfigOverrides, DEFAULT_PATH};
    let flags = ConfigOverrides {
        control_plane: crate::config::flag_list(&args.control_plane),
        join_token_file: args.join_token_file.clone(),
        ca_pin: args.ca_pin.clone(),
        root: args.root.clone(),
        journalctl: (args.ops.journalctl != std::path::Path::new("journalctl"))
            .then(|| args.ops.journalctl.clone()),
        reboot_command: (args.ops.reboot_command != "systemctl reboot").then(|| {
            args.ops
                .reboot_command
                .split_whitespace()
                .map(str::to_owned)
                .collect()
        }),
        ..Default::default()
    };
    let env = ConfigOverrides::from_process_env().map_err(AgentError::from)?;
    let (path, explicit) = match &args.config {
        Some(p) => (p.clone(), true),
        None => (PathBuf::from(DEFAULT_PATH), false),
    };
    let cfg = Config::resolve(&path, explicit, &env, &flags)
        .map_err(|e: ConfigError| AgentError::from(e))?;
    let mut site = cfg.site.clone();
    site.apply_env(|name| std::env::var(name).ok())?;
    if let Some(d) = &args.state_dir {
        site.state_dir = d.clone();
    }
    if let Some(t) = &args.ipmitool {
        site.ipmitool = t.clone();
    }
    if let Some(a) = args.boot_listen {
        site.boot_listen = Some(a);
    }
    if let Some(k) = &args.boot_kernel {
        site.boot_kernel = Some(k.clone());
    }
    if let Some(i) = &args.boot_initrd {
        site.boot_initrd = Some(i.clone());
    }
    if let Some(w) = args.ramdisk_lldp_wait {
        site.ramdisk_lldp_wait_s = w;
    }
    site.validate()?;
    Ok((cfg, site))
}

/// Runs the site agent until SIGTERM/SIGINT.
pub async fn run(args: SiteArgs) -> Result<(), SiteError> {
    let (cfg, site_cfg) = resolve_config(&args)?;
    let notifier = Arc::new(Notifier::from_env().unwrap_or_else(|e| {
        tracing::warn!(error = %e, "NOTIFY_SOCKET unusable; not talking to systemd");
        Notifier::disabled()
    }));
    if let Some(every) = bc_sys::notify::watchdog_interval_from_env() {
        bc_sys::notify::spawn_watchdog(Arc::clone(&notifier), every);
    }
    let (stop_tx, stop) = watch::channel(false);
    crate::agent::watch_signals(stop_tx).await?;
    run_until(&args, &cfg, site_cfg, notifier, stop).await
}

async fn run_until(
    args: &SiteArgs,
    cfg: &crate::config::Config,
    site_cfg: SiteConfig,
    notifier: Arc<Notifier>,
    stop: watch::Receiver<bool>,
) -> Result<(), SiteError> {
    let root = HostRoot::new(&cfg.root);
    let state = StateDir::open(&site_cfg.state_dir).map_err(AgentError::from)?;
    let status = StatusFile::new(state.path());
    let boot_id = root
        .read_trimmed("/proc/sys/kernel/random/boot_id")
        .unwrap_or_default();
    let journal = crate::agent::open_journal(state.path(), &boot_id).map_err(AgentError::from)?;
    let mut ops = args.ops.config(&site_cfg.state_dir, &root);
    ops.reboot =
        bcd_core::ops::reboot::RebootConfig::from_command_line(&cfg.reboot_command.join(" "));
    ops.journalctl = cfg.journalctl.clone();
    let site = Arc::new(Site::new(
        site_cfg.clone(),
        Arc::new(RealConnector::new(site_cfg.clone())),
    ));
    let machine = Arc::new(SiteMachine {
        root,
        boot_id,
        ops,
        site: Arc::clone(&site),
    });
    let executor = Arc::new(Executor::new(machine, journal));
    if let (Some(addr), Some(kernel), Some(initrd)) = (
        site_cfg.boot_listen,
        site_cfg.boot_kernel.clone(),
        site_cfg.boot_initrd.clone(),
    ) {
        let service = bcd_site::boot::BootService {
            site: Arc::clone(&site),
            files: Arc::new(bcd_site::boot::BootFiles {
                kernel,
                initrd,
                kernel_args: site_cfg.boot_kernel_args.clone(),
                lldp_wait_s: site_cfg.ramdisk_lldp_wait_s,
            }),
            metrics: bcd_site::boot::BootMetrics::default(),
        };
        bcd_site::boot::serve(addr, service).await?;
    }
    let sync = tokio::spawn(bcd_site::sync::run(Arc::clone(&site), stop.clone()));
    let mut hooks = SiteHooks::new(site, status, Systemd(Arc::clone(&notifier)));
    let _ = notifier.ready();
    tracing::info!(state_dir = %site_cfg.state_dir.display(), "site agent starting");
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
    let outcome = bcd_core::lifecycle::run(&lifecycle, &mut hooks, stop)
        .await
        .map_err(|e| AgentError::from_lifecycle(e, &site_cfg.state_dir).into());
    sync.abort();
    outcome
}
