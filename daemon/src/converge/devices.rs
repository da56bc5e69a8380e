//! GPU driver binding through sysfs: the `devices.gpus` section of the spec.
//!
//! # Background
//! A GPU serves CUDA on the host when bound to `nvidia` and goes to a virtual machine when bound
//! to `vfio-pci`. The kernel's recipe (Documentation/ABI/testing/sysfs-bus-pci, `driver_override`):
//! write the driver's name to `/sys/bus/pci/devices/<addr>/driver_override`, write `<addr>` to
//! the current driver's `unbind`, then write `<addr>` to `/sys/bus/pci/drivers_probe`; the kernel
//! then binds only the overriding driver. `driver_override` reads `(null)` when unset.
//!
//! # Design
//! - [`PciBus`] is the narrow sysfs surface (read the bound driver and override, write override,
//!   unbind, probe); [`SysfsPci`] implements it under a [`HostRoot`]. Tests wrap it in a fake
//!   kernel that performs the real writes on a copied tree and then moves the `driver` link.
//! - [`GpuProcessProbe`] says which processes use a GPU (NVML in production; [`ProcfsProbe`]
//!   reads `/proc` and works without NVML). A GPU in use is never rebound: unbinding a driver
//!   under a running CUDA job or VM kills it. A probe that fails counts as busy.
//! - Idempotent: a GPU already on its driver with the override in place gets no write at all.
//! - Only NVIDIA display-class functions (vendor `0x10de`, class `0x03xxxx`) are touched, so a
//!   mistyped bus id cannot unbind a NIC or an NVMe drive.
//!
//! # Limitations
//! Other functions in the GPU's IOMMU group (its audio function, a bridge) are not rebound; a VM
//! that needs the whole group needs them listed. Driver modules are not loaded: `vfio-pci` and
//! `nvidia` must be loaded (modules-load.d) before a binding to them can converge.

use std::collections::BTreeMap;
use std::path::PathBuf;

use bc_protocol::spec::{GpuBinding, GpuDriver, GpuMatch, normalize_pci_address};

use bcd_probes::hostroot::HostRoot;

/// PCI vendor id of NVIDIA (PCI-SIG registry), as sysfs `vendor` prints it.
pub const NVIDIA_VENDOR: &str = "0x10de";

/// Why one GPU binding did not converge.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// No `/sys/bus/pci/devices/<addr>`.
    #[error("{0}: no such PCI device")]
    NotFound(String),
    /// A uuid neither the probe nor an earlier resolution maps to a bus id.
    #[error("GPU {0}: unknown uuid (not seen by NVML or /proc/driver/nvidia)")]
    UnknownUuid(String),
    /// The device is not an NVIDIA display-class function.
    #[error("{addr}: not an NVIDIA GPU (vendor {vendor}, class {class})")]
    NotAGpu {
        addr: String,
        vendor: String,
        class: String,
    },
    /// Processes use the GPU; rebinding would kill them.
    #[error("{addr}: in use by pid {pids:?}; not rebinding from {from} to {to}")]
    Busy {
        addr: String,
        pids: Vec<u32>,
        from: String,
        to: GpuDriver,
    },
    /// The probe could not tell whether the GPU is in use.
    #[error("{addr}: cannot tell whether the GPU is in use: {reason}")]
    ProbeFailed { addr: String, reason: String },
    /// `/sys/bus/pci/drivers/<driver>` is missing: the module is not loaded.
    #[error("{addr}: driver {driver} is not loaded")]
    DriverNotLoaded { addr: String, driver: GpuDriver },
    /// After the probe the device is on another driver (or none).
    #[error("{addr}: asked for {want}, kernel bound {got}")]
    BindFailed {
        addr: String,
        want: GpuDriver,
        got: String,
    },
    /// A sysfs read or write failed.
    #[error("{addr}: {op} {path}: {source}")]
    Sysfs {
        addr: String,
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl DeviceError {
    /// CamelCase reason for `SpecStatus.reason` and the `SpecConverged` condition.
    pub fn reason(&self) -> &'static str {
        match self {
            DeviceError::NotFound(_) | DeviceError::UnknownUuid(_) => "DeviceNotFound",
            DeviceError::NotAGpu { .. } => "NotAGpu",
            DeviceError::Busy { .. } => "GpuBusy",
            DeviceError::ProbeFailed { .. } => "GpuProbeFailed",
            DeviceError::DriverNotLoaded { .. } => "DriverNotLoaded",
            DeviceError::BindFailed { .. } => "BindFailed",
            DeviceError::Sysfs { .. } => "SysfsError",
        }
    }
}

/// Which processes use a GPU. NVML's `nvmlDeviceGetComputeRunningProcesses` and
/// `…GraphicsRunningProcesses` in production; fakes in tests.
pub trait GpuProcessProbe: Send + Sync + std::fmt::Debug {
    /// PIDs using the GPU at `pci_address` (sysfs form `0000:3b:00.0`); empty when idle.
    fn running_pids(&self, pci_address: &str) -> Result<Vec<u32>, String>;

    /// Bus id (sysfs form) of the GPU with NVML UUID `uuid`, when the probe sees it. A GPU on
    /// `vfio-pci` is invisible to NVML; the caller remembers earlier answers.
    fn pci_address_for_uuid(&self, _uuid: &str) -> Result<Option<String>, String> {
        Ok(None)
    }
}

/// The sysfs operations a binding needs. Addresses are in sysfs form.
pub trait PciBus: Send + Sync + std::fmt::Debug {
    /// Whether `/sys/bus/pci/devices/<addr>` exists.
    fn exists(&self, addr: &str) -> bool;
    /// `vendor` and `class` files, e.g. `("0x10de", "0x030200")`.
    fn ids(&self, addr: &str) -> Result<(String, String), DeviceError>;
    /// Name of the bound driver (basename of the `driver` link); `None` when unbound.
    fn current_driver(&self, addr: &str) -> Result<Option<String>, DeviceError>;
    /// `driver_override`; `None` for `(null)` or empty.
    fn driver_override(&self, addr: &str) -> Result<Option<String>, DeviceError>;
    /// Whether `/sys/bus/pci/drivers/<driver>` exists.
    fn driver_loaded(&self, driver: GpuDriver) -> bool;
    /// Writes `driver` to `driver_override`.
    fn set_override(&self, addr: &str, driver: GpuDriver) -> Result<(), DeviceError>;
    /// Writes `addr` to `devices/<addr>/driver/unbind`.
    fn unbind(&self, addr: &str) -> Result<(), DeviceError>;
    /// Writes `addr` to `/sys/bus/pci/drivers_probe`.
    fn probe(&self, addr: &str) -> Result<(), DeviceError>;
}

/// [`PciBus`] on the real sysfs (or a copy of it) under a [`HostRoot`].
#[derive(Debug, Clone)]
pub struct SysfsPci {
    root: HostRoot,
}

impl SysfsPci {
    /// sysfs under `root`.
    pub fn new(root: HostRoot) -> Self {
        Self { root }
    }

    fn dev(&self, addr: &str) -> PathBuf {
        self.root.path("/sys/bus/pci/devices").join(addr)
    }

    fn read(&self, addr: &str, file: &str) -> Result<String, DeviceError> {
        let path = self.dev(addr).join(file);
        std::fs::read_to_string(&path)
            .map(|s| s.trim().to_owned())
            .map_err(|source| DeviceError::Sysfs {
                addr: addr.to_owned(),
                op: "read",
                path,
                source,
            })
    }

    fn write(&self, addr: &str, path: PathBuf, value: &str) -> Result<(), DeviceError> {
        tracing::info!(addr, path = %path.display(), value, "sysfs write");
        std::fs::write(&path, value).map_err(|source| DeviceError::Sysfs {
            addr: addr.to_owned(),
            op: "write",
            path,
            source,
        })
    }
}

impl PciBus for SysfsPci {
    fn exists(&self, addr: &str) -> bool {
        self.dev(addr).exists()
    }

    fn ids(&self, addr: &str) -> Result<(String, String), DeviceError> {
        Ok((self.read(addr, "vendor")?, self.read(addr, "class")?))
    }

    fn current_driver(&self, addr: &str) -> Result<Option<String>, DeviceError> {
        let path = self.dev(addr).join("driver");
        match std::fs::read_link(&path) {
            Ok(target) => Ok(target.file_name().map(|n| n.to_string_lossy().into_owned())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(DeviceError::Sysfs {
                addr: addr.to_owned(),
                op: "readlink",
                path,
                source,
            }),
        }
    }

    fn driver_override(&self, addr: &str) -> Result<Option<String>, DeviceError> {
        let v = self.read(addr, "driver_override")?;
        Ok((!v.is_empty() && v != "(null)").then_some(v))
    }

    fn driver_loaded(&self, driver: GpuDriver) -> bool {
        self.root
            .path("/sys/bus/pci/drivers")
            .join(driver.as_str())
            .is_dir()
    }

    fn set_override(&self, addr: &str, driver: GpuDriver) -> Result<(), DeviceError> {
        self.write(
            addr,
            self.dev(addr).join("driver_override"),
            driver.as_str(),
        )
    }

    fn unbind(&self, addr: &str) -> Result<(), DeviceError> {
        self.write(addr, self.dev(addr).join("driver/unbind"), addr)
    }

    fn probe(&self, addr: &str) -> Result<(), DeviceError> {
        self.write(addr, self.root.path("/sys/bus/pci/drivers_probe"), addr)
    }
}

/// What applying one binding did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindOutcome {
    /// Already on the driver with the override set: nothing written.
    Unchanged,
    /// Already on the driver; `driver_override` was written so a re-probe keeps it there.
    OverrideSet,
    /// Moved from `from` (`None` = unbound) to the wanted driver.
    Rebound { from: Option<String> },
}

/// Applies GPU bindings; remembers uuid → bus id answers so a GPU stays addressable by uuid
/// after it left NVML's sight for `vfio-pci`.
#[derive(Debug)]
pub struct DeviceBinder<'a> {
    bus: &'a dyn PciBus,
    probe: &'a dyn GpuProcessProbe,
    /// uuid (lowercase) → bus id; persisted by the caller.
    pub uuid_memo: BTreeMap<String, String>,
}

impl<'a> DeviceBinder<'a> {
    /// A binder over `bus`, asking `probe` about processes, starting from remembered uuids.
    pub fn new(
        bus: &'a dyn PciBus,
        probe: &'a dyn GpuProcessProbe,
        uuid_memo: BTreeMap<String, String>,
    ) -> Self {
        Self {
            bus,
            probe,
            uuid_memo,
        }
    }

    /// The bus id a binding names.
    pub fn resolve(&mut self, m: &GpuMatch) -> Result<String, DeviceError> {
        match m {
            GpuMatch::PciAddress(a) => {
                normalize_pci_address(a).ok_or_else(|| DeviceError::NotFound(a.clone()))
            }
            GpuMatch::Uuid(u) => {
                let key = u.trim().to_ascii_lowercase();
                let live = self
                    .probe
                    .pci_address_for_uuid(u.trim())
                    .ok()
                    .flatten()
                    .and_then(|a| normalize_pci_address(&a));
                if let Some(addr) = live {
                    self.uuid_memo.insert(key, addr.clone());
                    return Ok(addr);
                }
                self.uuid_memo
                    .get(&key)
                    .cloned()
                    .ok_or_else(|| DeviceError::UnknownUuid(u.clone()))
            }
        }
    }

    /// Converges one binding.
    pub fn apply(&mut self, binding: &GpuBinding) -> Result<BindOutcome, DeviceError> {
        let addr = self.resolve(&binding.match_)?;
        self.bind(&addr, binding.driver)
    }

    /// Puts the GPU at `addr` on `want`.
    pub fn bind(&self, addr: &str, want: GpuDriver) -> Result<BindOutcome, DeviceError> {
        if !self.bus.exists(addr) {
            return Err(DeviceError::NotFound(addr.to_owned()));
        }
        let (vendor, class) = self.bus.ids(addr)?;
        if !vendor.eq_ignore_ascii_case(NVIDIA_VENDOR) || !class.starts_with("0x03") {
            return Err(DeviceError::NotAGpu {
                addr: addr.to_owned(),
                vendor,
                class,
            });
        }
        let current = self.bus.current_driver(addr)?;
        let over = self.bus.driver_override(addr)?;
        if current.as_deref() == Some(want.as_str()) {
            if over.as_deref() == Some(want.as_str()) {
                return Ok(BindOutcome::Unchanged);
            }
            self.bus.set_override(addr, want)?;
            return Ok(BindOutcome::OverrideSet);
        }
        if !self.bus.driver_loaded(want) {
            return Err(DeviceError::DriverNotLoaded {
                addr: addr.to_owned(),
                driver: want,
            });
        }
        let pids = self
            .probe
            .running_pids(addr)
            .map_err(|reason| DeviceError::ProbeFailed {
                addr: addr.to_owned(),
                reason,
            })?;
        if !pids.is_empty() {
            return Err(DeviceError::Busy {
                addr: addr.to_owned(),
                pids,
                from: current.unwrap_or_else(|| "none".to_owned()),
                to: want,
            });
        }
        self.bus.set_override(addr, want)?;
        if current.is_some() {
            self.bus.unbind(addr)?;
        }
        self.bus.probe(addr)?;
        let got = self.bus.current_driver(addr)?;
        if got.as_deref() != Some(want.as_str()) {
            return Err(DeviceError::BindFailed {
                addr: addr.to_owned(),
                want,
                got: got.unwrap_or_else(|| "none".to_owned()),
            });
        }
        Ok(BindOutcome::Rebound { from: current })
    }
}

/// [`GpuProcessProbe`] from `/proc`, without NVML: the GPU's device node comes from
/// `/proc/driver/nvidia/gpus/<addr>/information` (`Device Minor: N` → `/dev/nvidiaN`) or, on
/// `vfio-pci`, from its `iommu_group` link (→ `/dev/vfio/<group>`); a process uses the GPU when
/// one of its `/proc/<pid>/fd/*` links points at that node. Reading other processes' fds needs
/// root (`CAP_SYS_PTRACE`/`CAP_DAC_READ_SEARCH`); an unreadable fd dir is skipped, not fatal.
///
/// The agent's own pid is not excluded: if NVML is initialised in this process it holds
/// `/dev/nvidia*` open, and unbinding `nvidia` under an open handle blocks until it is closed,
/// so such a GPU is rightly reported busy. The NVML owner must shut NVML down around a rebind.
#[derive(Debug, Clone)]
pub struct ProcfsProbe {
    root: HostRoot,
}

impl ProcfsProbe {
    /// A probe reading `/proc` and `/sys` under `root`.
    pub fn new(root: HostRoot) -> Self {
        Self { root }
    }

    fn nvidia_info(&self, addr: &str) -> Option<String> {
        self.root
            .read_to_string(format!("/proc/driver/nvidia/gpus/{addr}/information"))
            .ok()
    }

    fn device_nodes(&self, addr: &str) -> Vec<String> {
        let mut nodes = Vec::new();
        if let Some(minor) = self
            .nvidia_info(addr)
            .as_deref()
            .and_then(|t| field(t, "Device Minor"))
        {
            nodes.push(format!("/dev/nvidia{minor}"));
        }
        let group = std::fs::read_link(
            self.root
                .path("/sys/bus/pci/devices")
                .join(addr)
                .join("iommu_group"),
        );
        if let Ok(g) = group
            && let Some(name) = g.file_name()
        {
            nodes.push(format!("/dev/vfio/{}", name.to_string_lossy()));
        }
        nodes
    }
}

fn field<'t>(text: &'t str, key: &str) -> Option<&'t str> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == key).then(|| v.trim())
    })
}

impl GpuProcessProbe for ProcfsProbe {
    fn running_pids(&self, pci_address: &str) -> Result<Vec<u32>, String> {
        let nodes = self.device_nodes(pci_address);
        if nodes.is_empty() {
            return Ok(Vec::new());
        }
        let proc_dir = self.root.path("/proc");
        let entries = std::fs::read_dir(&proc_dir)
            .map_err(|e| format!("read {}: {e}", proc_dir.display()))?;
        let mut pids = Vec::new();
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
                continue;
            };
            let uses = fds.flatten().any(|fd| {
                std::fs::read_link(fd.path())
                    .is_ok_and(|t| nodes.iter().any(|n| t.as_os_str() == n.as_str()))
            });
            if uses {
                pids.push(pid);
            }
        }
        pids.sort_unstable();
        Ok(pids)
    }

    fn pci_address_for_uuid(&self, uuid: &str) -> Result<Option<String>, String> {
        let dir = self.root.path("/proc/driver/nvidia/gpus");
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Ok(None);
        };
        for e in entries.flatten() {
            let addr = e.file_name().to_string_lossy().into_owned();
            if self
                .nvidia_info(&addr)
                .as_deref()
                .and_then(|t| field(t, "GPU UUID"))
                .is_some_and(|u| u.eq_ignore_ascii_case(uuid))
            {
                return Ok(normalize_pci_address(&addr));
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
#[path = "devices_tests.rs"]
mod tests;
