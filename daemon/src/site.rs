//! The site agent (`bcd site`): `bcd-site`'s machine and hooks on the session core, with its own
//! flags and `/etc/bcd/bcd.toml`'s `[site]` section (the session flags, signals, systemd and the
//! journal are [`crate::process`]'s), and the power sync loop running beside the session.
//!
//! Join with a join token (mode SITE; the control plane decides the role and the site), then one
//! session with the gateway, reconnecting with backoff, until SIGTERM/SIGINT. BMC credentials
//! arrive in the session's `SiteAssignment` and stay in memory.

use std::path::PathBuf;
use std::sync::Arc;

use bc_sys::notify::Notifier;
use bcd_core::executor::Executor;
use bcd_core::lifecycle::Lifecycle;
use bcd_core::state::StateDir;
use bcd_core::status::StatusFile;
use bcd_probes::hostroot::HostRoot;
use bcd_site::bmc::RealConnector;
use bcd_site::config::{SiteConfig, SiteConfigError};
use bcd_site::hooks::{ProcessSignals, SiteHooks};
use bcd_site::machine::SiteMachine;
use bcd_site::site::Site;
use tokio::sync::watch;

use crate::process::{self, SessionArgs, SessionError};

/// Outbound messages a session queues at most.
const OUTBOUND_CAPACITY: usize = 256;
/// How long each BMC session's deletion may take when the site agent stops.
const CLOSE_LIMIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Flags of `bcd site`.
#[derive(Debug, Clone, clap::Args)]
#[command(mut_arg("reconnect_max", |a| a.default_value("30s")))]
pub struct SiteArgs {
    #[command(flatten)]
    pub session: SessionArgs,
    /// Where the identity, journal and status live (default `[site] state_dir`,
    /// /var/lib/bcd-site).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// The ipmitool binary (default `[site] ipmitool`, `ipmitool` on PATH).
    #[arg(long)]
    pub ipmitool: Option<PathBuf>,
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
    /// What stops any mode: state dir, usage, TLS, join, signals, the config file.
    #[error(transparent)]
    Session(#[from] SessionError),
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
    let cfg = args
        .session
        .resolve_config(args.ops.overrides())
        .map_err(SessionError::from)?;
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
    let notifier = process::systemd();
    let stop = process::shutdown_signal()?;
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
    let state = StateDir::open(&site_cfg.state_dir).map_err(SessionError::from)?;
    // One site agent per state dir, for the process's life, as `bcd agent`: taken before
    // anything in it is written (status.json, the journal).
    let _lock = process::lock_state_dir(&state, &site_cfg.state_dir)?;
    let status = StatusFile::new(state.path());
    let boot_id = root
        .read_trimmed("/proc/sys/kernel/random/boot_id")
        .unwrap_or_default();
    let journal = process::open_journal(state.path(), &boot_id).map_err(SessionError::from)?;
    let ops = args.ops.resolved(cfg, &site_cfg.state_dir, &root);
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
    let closing = Arc::clone(&site);
    let mut hooks = SiteHooks::new(site, status, Systemd(Arc::clone(&notifier)));
    let _ = notifier.ready();
    tracing::info!(state_dir = %site_cfg.state_dir.display(), "site agent starting");
    let config = args.session.lifecycle(cfg, OUTBOUND_CAPACITY);
    let tokens = args.session.tokens(cfg);
    let lifecycle = Lifecycle {
        config: &config,
        executor: &executor,
        store: &state,
        tokens: &tokens,
    };
    let outcome = bcd_core::lifecycle::run(&lifecycle, &mut hooks, stop)
        .await
        .map_err(|e| SessionError::from_lifecycle(e, &site_cfg.state_dir).into());
    sync.abort();
    // The BMC sessions end with the site agent (a BMC keeps a handful of session slots).
    closing.close(CLOSE_LIMIT).await;
    outcome
}
