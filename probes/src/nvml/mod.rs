//! NVML: GPU inventory, `diag.nvml`, the XID watch and `gpu.reset`.
//!
//! # Background
//!
//! NVIDIA's management library (`libnvidia-ml.so.1`, shipped with the driver) reports each GPU's
//! identity, health counters (ECC, retired pages, remapped rows, temperature, power, throttle
//! reasons, PCIe and NVLink state), the driver's recommended recovery action (field 230) and XID
//! error events. bcd loads it at run time through nvml-wrapper, so the daemon starts and runs on
//! hosts without a GPU or driver; there every entry point answers `NVML unavailable: <reason>`.
//!
//! # Design
//!
//! - [`open`] loads the library from [`NvmlConfig::lib_path`] (default `libnvidia-ml.so.1`) and
//!   maps init failures (driver not loaded, driver/library mismatch, no permission) to
//!   [`NvmlError`] variants.
//! - [`diag()`] runs every check per GPU and returns a [`DiagReport`] (serde camelCase) with a
//!   verdict and a [`RecommendedAction`] per GPU and for the node.
//! - [`spawn_xid_watch`] waits on an NVML event set for XID errors, falling back to following
//!   `/dev/kmsg` under the host root, and pushes [`XidEvent`]s into a tokio channel.
//! - [`reset()`] runs `nvidia-smi -r` for the requested GPUs (and their direct NVLink peers) with
//!   the preflight, persistence-mode handling and verification `gpu.reset` needs.
//! - [`cli`] exposes all of it as `bcd gpu {list,diag,reset,watch-xids}` and gives the agent its
//!   `--nvml-lib` / `--nvidia-smi` flags ([`cli::NvmlArgs`]).
//!
//! Everything here blocks (NVML calls, `nvidia-smi`); async callers use `spawn_blocking`. A reset
//! has NVML to itself: other users wait, and the XID watch shuts its NVML down meanwhile (an open
//! NVML handle would make `nvidia-smi -r` refuse the GPU).
//! Tests run against `tests/fake-nvml`, a fake library and `nvidia-smi` (see `docs/gpu.md`).
//!
//! # Limitations
//!
//! MIG devices are listed (inventory) but not examined one by one: `diag.nvml` checks the
//! parent GPU. vGPU and the NVSwitches' own health (their SXids) are not examined; each GPU's
//! registration with the NVLink fabric is ([`fabric`]). XIDs "since boot" are what the kernel
//! ring buffer still holds.

mod busid;
mod checks;
pub mod cli;
pub mod diag;
pub mod fabric;
pub mod kmsg;
mod lost;
pub mod nvlink;
pub mod reset;
mod tool;
pub mod watch;
pub mod xid;

use std::ffi::OsStr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError as WrapperError;
use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use serde::{Deserialize, Serialize};

pub use busid::PciAddr;
pub use diag::{
    Check, CheckStatus, DiagArgs, DiagReport, ExpectedGpus, GpuReport, diag, diag_args,
};
pub use reset::{ResetArgs, ResetError, ResetReport, ResetTarget, reset};
pub use watch::{XidEvent, XidSource, XidWatch, spawn_xid_watch};
pub use xid::{RecommendedAction, XidClass};

/// The library nvml-wrapper loads when no path is configured (the driver's versioned soname).
pub const DEFAULT_LIB: &str = "libnvidia-ml.so.1";

/// Where bcd finds NVML and `nvidia-smi` (`--nvml-lib PATH`, `--nvidia-smi PATH`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmlConfig {
    /// The NVML library; `None` loads [`DEFAULT_LIB`] through the dynamic linker's search path.
    pub lib_path: Option<PathBuf>,
    /// The `nvidia-smi` binary `gpu.reset` runs (a bare name is looked up in `PATH`).
    pub nvidia_smi: PathBuf,
}

impl Default for NvmlConfig {
    fn default() -> Self {
        Self {
            lib_path: None,
            nvidia_smi: PathBuf::from("nvidia-smi"),
        }
    }
}

/// NVML could not be used.
#[derive(Debug, thiserror::Error)]
pub enum NvmlError {
    /// The library could not be loaded (no driver installed, wrong path).
    #[error("cannot load {lib}: {reason}")]
    LibraryNotFound {
        /// The library path or name.
        lib: String,
        /// The loader's message.
        reason: String,
    },
    /// `nvmlInit` said `NVML_ERROR_DRIVER_NOT_LOADED`: the kernel module is not loaded.
    #[error("NVIDIA driver not loaded")]
    DriverNotLoaded,
    /// `nvmlInit` said `NVML_ERROR_LIB_RM_VERSION_MISMATCH`: the library and the loaded kernel
    /// module are different versions (typically a driver upgrade without a reboot).
    #[error("driver/library version mismatch")]
    LibRmVersionMismatch,
    /// `nvmlInit` said `NVML_ERROR_NO_PERMISSION`.
    #[error("no permission to talk to the NVIDIA driver")]
    NoPermission,
    /// `nvmlInit` failed otherwise.
    #[error("nvmlInit failed: {0}")]
    Init(WrapperError),
    /// An NVML call failed.
    #[error("{call}: {source}")]
    Call {
        /// The NVML function (wrapper method) that failed.
        call: &'static str,
        /// NVML's error.
        source: WrapperError,
    },
}

impl NvmlError {
    /// `call`'s failure, for `map_err`.
    pub(crate) fn call(call: &'static str) -> impl FnOnce(WrapperError) -> Self {
        move |source| Self::Call { call, source }
    }

    /// The action an init failure calls for: a mismatch is cured by a reboot (the new kernel
    /// module loads), the others need a person.
    pub fn action(&self) -> RecommendedAction {
        match self {
            Self::LibRmVersionMismatch => RecommendedAction::RebootNode,
            _ => RecommendedAction::Service,
        }
    }
}

/// Keeps NVML users out of `gpu.reset`'s way. An initialized NVML holds the GPUs' device files
/// open, and `nvidia-smi -r` refuses a GPU any process holds open, so while a reset runs nobody
/// else in bcd may have NVML initialized. Diag and inventory hold the gate shared for their run;
/// the XID watch holds it shared and lets go (shutting its NVML down) when a reset is pending;
/// the reset holds it exclusively.
static NVML_GATE: RwLock<()> = parking_lot::const_rwlock(());
/// Resets waiting for or holding [`NVML_GATE`].
static RESETS_PENDING: AtomicUsize = AtomicUsize::new(0);

/// Shared use of NVML (blocks while a reset runs or waits).
pub(crate) fn shared_access() -> RwLockReadGuard<'static, ()> {
    NVML_GATE.read()
}

/// Sole use of NVML, for a reset.
pub(crate) fn exclusive_access() -> RwLockWriteGuard<'static, ()> {
    RESETS_PENDING.fetch_add(1, Ordering::SeqCst);
    let guard = NVML_GATE.write();
    RESETS_PENDING.fetch_sub(1, Ordering::SeqCst);
    guard
}

/// A reset waits for long-lived NVML users to let go.
pub(crate) fn reset_pending() -> bool {
    RESETS_PENDING.load(Ordering::SeqCst) > 0 || NVML_GATE.is_locked_exclusive()
}

/// Loads and initializes NVML (`nvmlInit_v2`).
pub fn open(cfg: &NvmlConfig) -> Result<Nvml, NvmlError> {
    let lib = cfg
        .lib_path
        .as_deref()
        .map(|p| p.as_os_str())
        .unwrap_or(OsStr::new(DEFAULT_LIB));
    Nvml::builder().lib_path(lib).init().map_err(|e| match e {
        WrapperError::LibloadingError(err) => NvmlError::LibraryNotFound {
            lib: lib.to_string_lossy().into_owned(),
            reason: err.to_string(),
        },
        WrapperError::DriverNotLoaded => NvmlError::DriverNotLoaded,
        WrapperError::LibRmVersionMismatch => NvmlError::LibRmVersionMismatch,
        WrapperError::NoPermission => NvmlError::NoPermission,
        other => NvmlError::Init(other),
    })
}

/// One GPU for the node's inventory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuInfo {
    /// NVML index (`nvmlDeviceGetHandleByIndex_v2`).
    pub index: u32,
    /// `GPU-xxxxxxxx-...` (`nvmlDeviceGetUUID`).
    pub uuid: String,
    /// Product name (`nvmlDeviceGetName`), e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// PCI bus id, `0000:1a:00.0` (`nvmlDeviceGetPciInfo_v3`).
    pub pci_bus_id: String,
    /// PCI device id with the vendor in the low 16 bits, e.g. `0x233010de`.
    pub pci_device_id: String,
    /// Framebuffer size in bytes (`nvmlDeviceGetMemoryInfo_v2`).
    pub memory_bytes: u64,
    /// Board serial (`nvmlDeviceGetSerial`), when the board has an infoROM.
    pub serial: Option<String>,
    /// VBIOS version (`nvmlDeviceGetVbiosVersion`); `None` where NVML does not answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vbios_version: Option<String>,
    /// MIG mode is on (`nvmlDeviceGetMigMode`, current mode); `None` where MIG is not supported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_enabled: Option<bool>,
    /// The MIG devices of a GPU in MIG mode, in index order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig_devices: Vec<MigDeviceInfo>,
    /// Its NVLink fabric registration (state, clique, cluster UUID:
    /// `nvmlDeviceGetGpuFabricInfoV`); `None` where it has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<fabric::GpuFabric>,
}

/// One MIG device (a compute instance of a GPU instance), as NVML reports it through the MIG
/// device handle (`nvmlDeviceGetMigDeviceHandleByIndex`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigDeviceInfo {
    /// Index under the parent GPU.
    pub index: u32,
    /// `MIG-xxxxxxxx-...` (`nvmlDeviceGetUUID`).
    pub uuid: Option<String>,
    /// e.g. `NVIDIA H100 80GB HBM3 MIG 1g.10gb` (`nvmlDeviceGetName`).
    pub name: Option<String>,
    /// The instance's memory, bytes (`nvmlDeviceGetMemoryInfo_v2`).
    pub memory_bytes: Option<u64>,
}

impl GpuInfo {
    /// The inventory document's entry for this GPU (`source: "nvml"`).
    pub fn to_inventory(&self) -> bc_protocol::inventory::Gpu {
        bc_protocol::inventory::Gpu {
            uuid: Some(self.uuid.clone()),
            name: Some(self.name.clone()),
            pci_bus_id: self.pci_bus_id.clone(),
            memory_bytes: Some(self.memory_bytes),
            driver_version: None,
            vbios_version: self.vbios_version.clone(),
            source: "nvml".to_owned(),
            mig_enabled: self.mig_enabled,
            mig_devices: self
                .mig_devices
                .iter()
                .map(|m| bc_protocol::inventory::MigDevice {
                    index: m.index,
                    uuid: m.uuid.clone(),
                    name: m.name.clone(),
                    memory_bytes: m.memory_bytes,
                })
                .collect(),
            fabric: self.fabric.clone(),
        }
    }
}

/// The MIG devices of `dev` (empty when MIG is off or not supported). Indices without a MIG
/// device (`NVML_ERROR_NOT_FOUND`) are skipped: instances need not be numbered densely.
pub(crate) fn mig_devices(dev: &nvml_wrapper::Device<'_>) -> Vec<MigDeviceInfo> {
    let enabled = dev
        .mig_mode()
        .is_ok_and(|m| m.current == checks::MIG_ENABLE);
    if !enabled {
        return Vec::new();
    }
    let max = dev.mig_device_count().unwrap_or(0);
    (0..max)
        .filter_map(|index| {
            let m = dev.mig_device_by_index(index).ok()?;
            Some(MigDeviceInfo {
                index,
                uuid: m
                    .uuid()
                    .ok()
                    .and_then(|u| crate::hostroot::clean_identifier(&u)),
                name: m
                    .name()
                    .ok()
                    .and_then(|n| crate::hostroot::clean_identifier(&n)),
                memory_bytes: m.memory_info().ok().map(|i| i.total),
            })
        })
        .collect()
}

/// An NVML string through the one identifier normalisation
/// ([`crate::hostroot::clean_identifier`]); empty when nothing is left.
pub(crate) fn nvml_string(s: String) -> String {
    crate::hostroot::clean_identifier(&s).unwrap_or_default()
}

/// The GPUs NVML sees, in index order.
pub fn inventory_gpus(cfg: &NvmlConfig) -> Result<Vec<GpuInfo>, NvmlError> {
    let _gate = shared_access();
    let nvml = open(cfg)?;
    let count = nvml
        .device_count()
        .map_err(NvmlError::call("nvmlDeviceGetCount"))?;
    (0..count)
        .map(|index| {
            let dev = nvml
                .device_by_index(index)
                .map_err(NvmlError::call("nvmlDeviceGetHandleByIndex"))?;
            let pci = dev
                .pci_info()
                .map_err(NvmlError::call("nvmlDeviceGetPciInfo"))?;
            Ok(GpuInfo {
                index,
                uuid: nvml_string(dev.uuid().map_err(NvmlError::call("nvmlDeviceGetUUID"))?),
                name: nvml_string(dev.name().map_err(NvmlError::call("nvmlDeviceGetName"))?),
                pci_bus_id: PciAddr::parse(&pci.bus_id)
                    .map(PciAddr::to_bus_id)
                    .unwrap_or(pci.bus_id),
                pci_device_id: format!("{:#010x}", pci.pci_device_id),
                memory_bytes: dev
                    .memory_info()
                    .map_err(NvmlError::call("nvmlDeviceGetMemoryInfo"))?
                    .total,
                serial: dev
                    .serial()
                    .ok()
                    .and_then(|s| crate::hostroot::clean_identifier(&s)),
                vbios_version: dev
                    .vbios_version()
                    .ok()
                    .map(|v| v.trim().to_owned())
                    .filter(|v| !v.is_empty()),
                mig_enabled: dev.mig_mode().ok().map(|m| m.current == checks::MIG_ENABLE),
                mig_devices: mig_devices(&dev),
                fabric: fabric::fabric_info(&dev).ok().flatten(),
            })
        })
        .collect()
}
