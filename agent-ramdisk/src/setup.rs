//! Early boot, before the ramdisk can join: load the drivers a server needs, wait for its
//! Ethernet interfaces, and get a DHCP lease on one of them.
//!
//! - Modules: `modprobe NAME` for each of [`DEFAULT_MODULES`] and the `bcd.modules` extras, in
//!   order. A module that fails to load (not in the image, no such hardware) is logged and
//!   skipped: a server needs only some of them.
//! - Interfaces: those in `/sys/class/net` with a `device` link (a real NIC, not a bridge or
//!   tunnel) and `type` 1 (`ARPHRD_ETHER`, `include/uapi/linux/if_arp.h`), waited for up to
//!   [`SetupConfig::link_wait`]; drivers probe their hardware asynchronously after `modprobe`.
//! - Each is brought up by setting `IFF_UP` (0x1, `include/uapi/linux/if.h`) in its sysfs
//!   `flags` file (the kernel's `netdev_store` → `dev_change_flags`; no `ip` binary needed), then
//!   `udhcpc -i IF -q -n -t 5 -T 1 -s SCRIPT` runs: 5 discovers a second apart, quit once leased
//!   (`-q`), exit 1 without a lease (`-n`). The script (`/etc/udhcpc.sh` in the image) sets the
//!   address, route and resolver. Rounds over the interfaces repeat until one gets a lease or
//!   [`SetupConfig::dhcp_timeout`] is spent; the error names every interface tried and what
//!   udhcpc said last.
//! - The order ([`crate::nics::order`]): the boot NIC (`BOOTIF`) first, then NICs with carrier
//!   (every NIC is brought up first, and up to [`SetupConfig::carrier_wait`] given for links to
//!   come up), then the rest. A lease is kept only when the control plane answers from it
//!   ([`SetupConfig::reach`], bounded); otherwise it is given back (the script's `deconfig`) and
//!   the next NIC is asked. When no lease reaches the control plane by the deadline, the boot
//!   NIC's (else the first) lease is taken again and the join retries from there: the network
//!   may be right and the control plane down. The order, each attempt and why it was left are
//!   logged and returned ([`Lease::summary`], a note of the ramdisk's inventory).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use bcd_probes::hostroot::HostRoot;
use tokio::time::Instant;

use crate::nics::ReachCheck;

mod dhcp;
pub use dhcp::{Lease, dhcp};

/// Drivers loaded at every boot, in this order: buses and storage first (the inventory lists
/// disks), then NICs, then the BMC's system interface. Virtio for VMs; Intel, Broadcom and Mellanox NICs and NVMe/AHCI/SCSI
/// disks for servers. `packaging/ramdisk/modules` lists the same, in the same order (a test
/// checks): the image carries exactly what is loaded.
pub const DEFAULT_MODULES: &[&str] = &[
    "virtio_pci",
    "virtio_blk",
    "virtio_scsi",
    // nvme's t10-pi needs the crc64-rocksoft crypto algorithm, which this module provides.
    "crc64_rocksoft_generic",
    "nvme",
    "ahci",
    "sd_mod",
    "virtio_net",
    "e1000",
    "e1000e",
    "igb",
    "ixgbe",
    "i40e",
    "ice",
    "bnxt_en",
    "mlx5_core",
    // In-band IPMI (/dev/ipmi0): the inventory's BMC firmware and LAN address, which the
    // control plane checks against the enrollment (BmcAddressMismatch). Last: on a machine
    // without a BMC the system-interface probe fails, and nothing waits on it.
    "ipmi_si",
    "ipmi_devintf",
];

/// `IFF_UP` (`include/uapi/linux/if.h`).
pub(crate) const IFF_UP: u64 = 0x1;
/// `ARPHRD_ETHER` (`include/uapi/linux/if_arp.h`): the `type` of an Ethernet interface.
const ARPHRD_ETHER: &str = "1";
/// How long one `modprobe` may take.
pub(crate) const MODPROBE_LIMIT: Duration = Duration::from_secs(30);
/// Characters of a tool's output kept for a log line or an error.
const OUTPUT_CHARS: usize = 240;

/// What early boot runs with.
#[derive(Debug, Clone)]
pub struct SetupConfig {
    /// Where `/sys` is.
    pub root: HostRoot,
    /// The `modprobe` binary.
    pub modprobe: PathBuf,
    /// The `udhcpc` binary (busybox).
    pub udhcpc: PathBuf,
    /// udhcpc's event script (`-s`).
    pub udhcpc_script: PathBuf,
    /// Modules to load, in order.
    pub modules: Vec<String>,
    /// How long to wait for the first Ethernet interface.
    pub link_wait: Duration,
    /// How long DHCP may take in all, every interface and round together.
    pub dhcp_timeout: Duration,
    /// How long one udhcpc run may take before it is killed.
    pub attempt_timeout: Duration,
    /// How often `/sys/class/net` is looked at while waiting.
    pub poll: Duration,
    /// The boot NIC's MAC (`BOOTIF`): asked first.
    pub boot_mac: Option<String>,
    /// How long the NICs, brought up, get for a link before the first round (less when the
    /// boot NIC, or any NIC, has one sooner).
    pub carrier_wait: Duration,
    /// Whether a lease reaches the control plane; a lease that does not is given back.
    pub reach: ReachCheck,
}

impl SetupConfig {
    /// The defaults for a real ramdisk: the tools on `PATH`, [`DEFAULT_MODULES`] then `extra`,
    /// 20 s for a NIC to appear, 60 s for a lease.
    pub fn new(root: HostRoot, extra: &[String]) -> Self {
        let mut modules: Vec<String> = DEFAULT_MODULES.iter().map(|m| (*m).to_owned()).collect();
        for m in extra {
            if !modules.contains(m) {
                modules.push(m.clone());
            }
        }
        Self {
            root,
            modprobe: PathBuf::from("modprobe"),
            udhcpc: PathBuf::from("udhcpc"),
            udhcpc_script: PathBuf::from("/etc/udhcpc.sh"),
            modules,
            link_wait: Duration::from_secs(20),
            dhcp_timeout: Duration::from_secs(60),
            attempt_timeout: Duration::from_secs(20),
            poll: Duration::from_millis(100),
            boot_mac: None,
            carrier_wait: Duration::from_secs(3),
            reach: ReachCheck::always(),
        }
    }
}

/// Why the machine could not get on the network.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// No Ethernet NIC showed up.
    #[error(
        "no Ethernet interface with a device appeared in /sys/class/net within {waited:?} (present: {}): is the NIC's driver in the image? (bcd.modules=NAME loads more)",
        if seen.is_empty() { "none".to_owned() } else { seen.join(", ") }
    )]
    NoInterfaces {
        /// How long it waited.
        waited: Duration,
        /// What `/sys/class/net` held (loopback, bridges, ...).
        seen: Vec<String>,
    },
    /// Interfaces were there but none got a lease.
    #[error("no DHCP lease within {waited:?}; tried {}", describe(.tried))]
    NoLease {
        /// The total DHCP budget.
        waited: Duration,
        /// Each interface tried.
        tried: Vec<Attempt>,
    },
}

/// What happened on one interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// The interface.
    pub iface: String,
    /// udhcpc runs on it.
    pub runs: u32,
    /// How the last run ended and what udhcpc said.
    pub last: String,
}

pub(crate) fn describe(tried: &[Attempt]) -> String {
    tried
        .iter()
        .map(|a| format!("{} ({} runs; last: {})", a.iface, a.runs, a.last))
        .collect::<Vec<_>>()
        .join(", ")
}

/// One module's load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleLoad {
    /// The module.
    pub name: String,
    /// `Err`: how modprobe failed and what it said.
    pub result: Result<(), String>,
}

/// The last lines of a tool's output, on one line, at most [`OUTPUT_CHARS`] characters.
pub(crate) fn tail(out: &[u8]) -> String {
    let text = String::from_utf8_lossy(out);
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let joined = lines[lines.len().saturating_sub(3)..].join(" | ");
    let skip = joined.chars().count().saturating_sub(OUTPUT_CHARS);
    joined.chars().skip(skip).collect()
}

/// Runs `program args` for at most `limit`: `Ok(output)` when it exits 0, else `Err` saying how
/// it ended and what it printed (stdout and stderr together).
pub(crate) async fn run_tool(
    program: &std::path::Path,
    args: &[&str],
    limit: Duration,
) -> Result<String, String> {
    let child = tokio::process::Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", program.display()))?;
    let out = match tokio::time::timeout(limit, child.wait_with_output()).await {
        Ok(Ok(out)) => out,
        Ok(Err(e)) => return Err(format!("{}: {e}", program.display())),
        Err(_) => return Err(format!("killed after {limit:?} without an answer")),
    };
    let mut text = out.stdout;
    text.extend_from_slice(&out.stderr);
    let said = tail(&text);
    if out.status.success() {
        Ok(said)
    } else {
        Err(format!("{}: {said}", out.status))
    }
}

/// Loads `cfg.modules` one by one; every failure is logged and returned, never fatal.
pub async fn load_modules(cfg: &SetupConfig) -> Vec<ModuleLoad> {
    let mut loads = Vec::with_capacity(cfg.modules.len());
    for name in &cfg.modules {
        let result = run_tool(&cfg.modprobe, &[name], MODPROBE_LIMIT)
            .await
            .map(|_| ());
        if let Err(why) = &result {
            tracing::warn!(module = %name, error = %why, "module not loaded (harmless when the machine has no such hardware)");
        }
        loads.push(ModuleLoad {
            name: name.clone(),
            result,
        });
    }
    let loaded: Vec<&str> = loads
        .iter()
        .filter(|l| l.result.is_ok())
        .map(|l| l.name.as_str())
        .collect();
    tracing::info!(loaded = ?loaded, failed = loads.len() - loaded.len(), "modules loaded");
    loads
}

/// Ethernet interfaces backed by a device, sorted by name.
pub fn ethernet_interfaces(root: &HostRoot) -> Vec<String> {
    root.list_dir("/sys/class/net")
        .unwrap_or_default()
        .into_iter()
        .filter(|i| {
            let dir = format!("/sys/class/net/{i}");
            root.exists(format!("{dir}/device"))
                && root.read_trimmed(format!("{dir}/type")).as_deref() == Some(ARPHRD_ETHER)
        })
        .collect()
}

/// Waits up to `cfg.link_wait` for at least one Ethernet interface.
pub async fn wait_for_interfaces(cfg: &SetupConfig) -> Result<Vec<String>, SetupError> {
    let deadline = Instant::now() + cfg.link_wait;
    loop {
        let found = ethernet_interfaces(&cfg.root);
        if !found.is_empty() {
            return Ok(found);
        }
        if Instant::now() >= deadline {
            return Err(SetupError::NoInterfaces {
                waited: cfg.link_wait,
                seen: cfg.root.list_dir("/sys/class/net").unwrap_or_default(),
            });
        }
        tokio::time::sleep(cfg.poll).await;
    }
}

/// Sets `IFF_UP` in `/sys/class/net/<iface>/flags`.
pub fn link_up(root: &HostRoot, iface: &str) -> Result<(), String> {
    let path = root.path(format!("/sys/class/net/{iface}/flags"));
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let text = text.trim();
    let flags = u64::from_str_radix(text.trim_start_matches("0x"), 16)
        .map_err(|_| format!("{}: unexpected flags {text:?}", path.display()))?;
    if flags & IFF_UP != 0 {
        return Ok(());
    }
    std::fs::write(&path, format!("{:#x}\n", flags | IFF_UP))
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Kernel hostnames that mean "none set": the kernel's default (`(none)`, `UTS_NODENAME`) and
/// the usual placeholder.
pub const NO_HOSTNAME: [&str; 3] = ["", "(none)", "localhost"];

/// Names the machine `name` (`/proc/sys/kernel/hostname`, proc(5)) unless the kernel already has
/// a real name (the udhcpc script sets DHCP's). The inventory and the join then carry it.
pub fn name_host(root: &HostRoot, name: &str) -> Result<(), String> {
    let file = "/proc/sys/kernel/hostname";
    let current = root.read_trimmed(file).unwrap_or_default();
    if !NO_HOSTNAME.contains(&current.as_str()) || name.is_empty() {
        return Ok(());
    }
    let path = root.path(file);
    std::fs::write(&path, name).map_err(|e| format!("{}: {e}", path.display()))
}

/// All of early boot: modules, loopback up, the NICs, a lease, and the hostname `name` when
/// DHCP gave none.
pub async fn run(cfg: &SetupConfig, name: Option<&str>) -> Result<Lease, SetupError> {
    load_modules(cfg).await;
    if let Err(e) = link_up(&cfg.root, "lo") {
        tracing::warn!(error = %e, "could not bring the loopback interface up");
    }
    let found = wait_for_interfaces(cfg).await?;
    tracing::info!(interfaces = ?found, "Ethernet interfaces found");
    let lease = dhcp(cfg).await?;
    tracing::info!(summary = %lease.summary(), "network");
    if let Some(name) = name
        && let Err(e) = name_host(&cfg.root, name)
    {
        tracing::warn!(error = %e, "could not set the hostname");
    }
    Ok(lease)
}

#[cfg(test)]
#[path = "setup_tests.rs"]
mod tests;
