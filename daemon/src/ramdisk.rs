//! The ramdisk agent (`bcd ramdisk`): `bcd-ramdisk`'s boot with the process around it — its
//! flags (the reconnect ones are [`crate::process::ReconnectArgs`]), signals, and the log
//! settings from the kernel command line (`bcd.log`), which `main` needs before the logger
//! starts.
//!
//! Run as the ramdisk's `/init` runs it: `bcd ramdisk --log-file /run/bcd.log`. On a normal host,
//! for tests: `bcd ramdisk --cmdline FILE --no-setup`.

use std::path::PathBuf;

use bcd_probes::hostroot::HostRoot;
use bcd_probes::nvml::NvmlConfig;
use bcd_ramdisk::rescue::RescueConfig;
use bcd_ramdisk::setup::SetupConfig;
use bcd_ramdisk::{BootConfig, BootError};

use crate::process::{self, ReconnectArgs, SessionError};

/// How long a lease may take to show the control plane answers (a TCP connection to a gateway
/// URL) before it is given up for the next NIC.
const REACH_LIMIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Flags of `bcd ramdisk`. The control plane, its pin and the boot token come from the kernel
/// command line, not from flags.
#[derive(Debug, Clone, clap::Args)]
#[command(mut_arg("reconnect_max", |a| a.default_value("30s")))]
pub struct RamdiskArgs {
    /// The kernel command line to read `bcd.url`, `bcd.pin`, `bcd.token`, `bcd.node` (and
    /// `bcd.log`, `bcd.modules`, `bcd.dhcp_timeout`) from.
    #[arg(long, default_value = "/proc/cmdline")]
    pub cmdline: PathBuf,
    /// Host root prefix for /sys, /proc, /dev.
    #[arg(long, default_value = "/")]
    pub root: PathBuf,
    /// Skip module loading and DHCP (a test on a host whose network is up).
    #[arg(long)]
    pub no_setup: bool,
    /// The modprobe binary.
    #[arg(long, default_value = "modprobe")]
    pub modprobe: PathBuf,
    /// The udhcpc binary (busybox).
    #[arg(long, default_value = "udhcpc")]
    pub udhcpc: PathBuf,
    /// udhcpc's event script (sets the address, route and resolv.conf).
    #[arg(long, default_value = "/etc/udhcpc.sh")]
    pub udhcpc_script: PathBuf,
    /// rescue.start's SSH server (package dropbear-bin; `dropbear(8)`).
    #[arg(long, default_value = "/usr/sbin/dropbear")]
    pub dropbear: PathBuf,
    /// Its host key generator (`dropbearkey(1)`).
    #[arg(long, default_value = "/usr/bin/dropbearkey")]
    pub dropbearkey: PathBuf,
    /// Also write the log to this file (logs.collect collects it as the agent's log).
    #[arg(long)]
    pub log_file: Option<PathBuf>,
    #[command(flatten)]
    pub reconnect: ReconnectArgs,
    #[command(flatten)]
    pub nvml: bcd_probes::nvml::cli::NvmlArgs,
}

/// What stops the ramdisk agent.
#[derive(Debug, thiserror::Error)]
pub enum RamdiskError {
    /// The boot could not go on (command line, network, token, identity).
    #[error(transparent)]
    Boot(#[from] BootError),
    /// Signal handling could not be set up.
    #[error(transparent)]
    Session(#[from] SessionError),
}

/// The log filter the kernel command line asks for (`bcd.log`), if it can be read: `main` uses it
/// instead of `--log`. A command line that cannot be read or parsed gives `None` here; [`run`]
/// reports why.
pub fn log_filter(args: &RamdiskArgs) -> Option<String> {
    bcd_ramdisk::read_params(&args.cmdline).ok()?.log
}

/// Runs the ramdisk agent until SIGTERM/SIGINT or the end of its boot.
pub async fn run(args: RamdiskArgs) -> Result<(), RamdiskError> {
    let params = bcd_ramdisk::read_params(&args.cmdline)?;
    let root = HostRoot::new(&args.root);
    let setup = (!args.no_setup).then(|| {
        let mut s = SetupConfig::new(root.clone(), &params.modules);
        s.modprobe = args.modprobe.clone();
        s.udhcpc = args.udhcpc.clone();
        s.udhcpc_script = args.udhcpc_script.clone();
        if let Some(t) = params.dhcp_timeout {
            s.dhcp_timeout = t;
        }
        s.boot_mac = params.boot_mac.clone();
        s.reach = bcd_ramdisk::nics::ReachCheck::control_plane(params.urls.clone(), REACH_LIMIT);
        s
    });
    let cfg = BootConfig {
        params,
        root,
        setup,
        nvml: NvmlConfig {
            lib_path: args.nvml.nvml_lib.clone(),
            nvidia_smi: args.nvml.nvidia_smi.clone(),
        },
        rescue: RescueConfig {
            dropbear: args.dropbear.clone(),
            dropbearkey: args.dropbearkey.clone(),
            ..RescueConfig::default()
        },
        log_file: args.log_file.clone(),
        reconnect_base: args.reconnect.reconnect_base,
        reconnect_max: args.reconnect.reconnect_max,
    };
    let stop = process::shutdown_signal()?;
    Ok(bcd_ramdisk::run(cfg, stop).await?)
}
