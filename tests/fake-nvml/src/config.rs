//! The fake's JSON description of a node's GPUs (the file `FAKE_NVML_CONFIG` names, or
//! `fake-nvml.json` beside the loaded library). It is both the configuration and the live
//! state: the library and the fake `nvidia-smi` re-read it on every call and write their changes
//! back (atomically), so a reset done by one process is seen by the next NVML call of another.

use serde::{Deserialize, Serialize};

/// Why `nvmlInit_v2` fails, when the config says it should.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum InitError {
    /// `NVML_ERROR_DRIVER_NOT_LOADED` (9): the kernel module is not loaded.
    DriverNotLoaded,
    /// `NVML_ERROR_LIB_RM_VERSION_MISMATCH` (18): user-space library and kernel module differ,
    /// typically after a driver upgrade without a reboot.
    LibRmVersionMismatch,
    /// `NVML_ERROR_NO_PERMISSION` (4): the caller may not open `/dev/nvidiactl`.
    NoPermission,
}

/// The whole node as NVML sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct FakeConfig {
    /// `nvmlSystemGetDriverVersion`, e.g. `550.163.01`.
    pub driver_version: String,
    /// `nvmlSystemGetNVMLVersion`, e.g. `12.550.163.01`.
    pub nvml_version: String,
    /// `nvmlSystemGetCudaDriverVersion`: major * 1000 + minor * 10 (12040 = 12.4).
    pub cuda_driver_version: i32,
    /// When set, `nvmlInit_v2` fails with this error and nothing else works.
    pub init_error: Option<InitError>,
    /// The GPUs in NVML enumeration order (index 0 first).
    pub gpus: Vec<FakeGpu>,
    /// Processes that have NVML initialized (written by the fake). Like the real driver's open
    /// device files, any such client makes the fake `nvidia-smi -r` refuse.
    pub nvml_clients: u32,
    /// The kernel log the fake driver writes to (a host root's `dev/kmsg` in tests): when an XID
    /// event is delivered, its `NVRM: Xid` record is appended here first, as the real driver
    /// logs every Xid it raises. `None`: nothing is logged.
    pub kmsg_path: Option<std::path::PathBuf>,
}

impl Default for FakeConfig {
    fn default() -> Self {
        Self {
            driver_version: "550.163.01".into(),
            nvml_version: "12.550.163.01".into(),
            cuda_driver_version: 12040,
            init_error: None,
            gpus: Vec::new(),
            nvml_clients: 0,
            kmsg_path: None,
        }
    }
}

/// ECC error counters (`nvmlDeviceGetTotalEccErrors`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct EccCounts {
    /// Corrected (single-bit) errors since the last driver load or GPU reset.
    pub volatile_corrected: u64,
    /// Uncorrected (double-bit) errors since the last driver load or GPU reset.
    pub volatile_uncorrected: u64,
    /// Corrected errors over the GPU's life.
    pub aggregate_corrected: u64,
    /// Uncorrected errors over the GPU's life.
    pub aggregate_uncorrected: u64,
}

/// Page retirement (pre-Ampere; `nvmlDeviceGetRetiredPagesPendingStatus`, fields 29-31).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RetiredPages {
    /// Pages retired for multiple single-bit errors.
    pub single_bit: u64,
    /// Pages retired for a double-bit error.
    pub double_bit: u64,
    /// Retirements waiting for the next reset or reboot.
    pub pending: bool,
}

/// Row remapping (Ampere and later; fields 142-145).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RemappedRows {
    /// Rows remapped for correctable errors.
    pub correctable: u64,
    /// Rows remapped for uncorrectable errors.
    pub uncorrectable: u64,
    /// A remap waits for the next reset.
    pub pending: bool,
    /// A remap failed: the GPU is out of spare rows.
    pub failure: bool,
}

/// PCIe link state (`nvmlDeviceGet{Curr,Max}PcieLink{Generation,Width}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct PcieLink {
    /// Current generation (1-6).
    pub current_gen: u32,
    /// Maximum generation the GPU and slot support.
    pub max_gen: u32,
    /// Current lane count.
    pub current_width: u32,
    /// Maximum lane count.
    pub max_width: u32,
}

impl Default for PcieLink {
    fn default() -> Self {
        Self {
            current_gen: 5,
            max_gen: 5,
            current_width: 16,
            max_width: 16,
        }
    }
}

/// One NVLink link (`nvmlDeviceGetNvLinkState`, `nvmlDeviceGetNvLinkRemotePciInfo_v2`,
/// `nvmlDeviceGetNvLinkErrorCounter`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct NvLink {
    /// The link is up.
    pub active: bool,
    /// PCI bus id of the far end: an NVSwitch, or another GPU for a direct (bridge) link.
    pub remote_pci_bus_id: Option<String>,
    /// Data link transmit replays (`NVML_NVLINK_ERROR_DL_REPLAY`) since the driver loaded.
    pub replay_errors: u64,
    /// Data link recoveries (`NVML_NVLINK_ERROR_DL_RECOVERY`).
    pub recovery_errors: u64,
    /// Flow-control digit CRC errors (`NVML_NVLINK_ERROR_DL_CRC_FLIT`).
    pub crc_flit_errors: u64,
    /// Data CRC errors (`NVML_NVLINK_ERROR_DL_CRC_DATA`).
    pub crc_data_errors: u64,
}

/// How a lost GPU (`lost: true`) answers: current drivers say `NVML_ERROR_GPU_IS_LOST` (15),
/// older ones (before R450) `NVML_ERROR_UNKNOWN` (999) and their `nvidia-smi` prints
/// "Unknown Error".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum LostError {
    /// `NVML_ERROR_GPU_IS_LOST`.
    #[default]
    GpuIsLost,
    /// `NVML_ERROR_UNKNOWN`.
    Unknown,
}

/// A GPU's registration with the NVLink fabric (`nvmlDeviceGetGpuFabricInfoV`, Hopper and
/// later on NVSwitch systems): what the fabric manager did with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct FakeFabric {
    /// `NVML_GPU_FABRIC_STATE_*`: `notSupported`, `notStarted` (the fabric manager has not
    /// registered the GPU, e.g. it is not running), `inProgress`, `completed`.
    pub state: FabricState,
    /// The registration's outcome, an `nvmlReturn_t` (0 success; meaningful once completed).
    pub status: u32,
    /// The GPU's clique (the GPUs that can reach each other over NVLink).
    pub clique_id: u32,
    /// The fabric's cluster UUID, `xxxxxxxx-xxxx-...` (16 bytes).
    pub cluster_uuid: String,
}

impl Default for FakeFabric {
    fn default() -> Self {
        Self {
            state: FabricState::Completed,
            status: 0,
            clique_id: 0,
            cluster_uuid: "00000000-0000-0000-0000-000000000001".into(),
        }
    }
}

/// `nvmlGpuFabricState_t`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum FabricState {
    /// `NVML_GPU_FABRIC_STATE_NOT_SUPPORTED` (0).
    NotSupported,
    /// `NVML_GPU_FABRIC_STATE_NOT_STARTED` (1).
    NotStarted,
    /// `NVML_GPU_FABRIC_STATE_IN_PROGRESS` (2).
    InProgress,
    /// `NVML_GPU_FABRIC_STATE_COMPLETED` (3).
    #[default]
    Completed,
}

impl FabricState {
    /// The `nvmlGpuFabricState_t` value.
    pub fn value(self) -> u8 {
        match self {
            Self::NotSupported => 0,
            Self::NotStarted => 1,
            Self::InProgress => 2,
            Self::Completed => 3,
        }
    }
}

/// One queued XID: its number alone (`79`), or with the text the driver logs after the number
/// and the process it names (`{"xid": 154, "text": "GPU recovery action changed ...", "pid":
/// 4242}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum QueuedXid {
    /// Just the number; the driver's record carries no text.
    Number(u64),
    /// The number with the driver's words.
    Full {
        /// The XID number.
        xid: u64,
        /// What the driver writes after `<xid>, pid=<pid>, `.
        #[serde(default)]
        text: Option<String>,
        /// The process the driver names.
        #[serde(default)]
        pid: Option<u32>,
    },
}

impl QueuedXid {
    /// The XID number.
    pub fn xid(&self) -> u64 {
        match self {
            Self::Number(x) | Self::Full { xid: x, .. } => *x,
        }
    }

    /// The driver's kernel log record for this XID on the GPU at `bus_id`, in `/dev/kmsg` form
    /// (`4,<seq>,<usec>,-;NVRM: Xid (PCI:0000:2a:00): 154, pid=4242, <text>`).
    pub fn kmsg_record(&self, bus_id: &str, seq: u64) -> String {
        let (xid, text, pid) = match self {
            Self::Number(x) => (*x, None, None),
            Self::Full { xid, text, pid } => (*xid, text.as_deref(), *pid),
        };
        let pci = match parse_bus_id(bus_id) {
            Some((d, b, v, _)) => format!("{d:04x}:{b:02x}:{v:02x}"),
            None => bus_id.to_owned(),
        };
        let pid = pid.map_or("'<unknown>'".to_owned(), |p| p.to_string());
        format!(
            "4,{seq},{},-;NVRM: Xid (PCI:{pci}): {xid}, pid={pid}, {}",
            seq * 1000,
            text.unwrap_or("")
        )
    }
}

/// A process with a compute context (`nvmlDeviceGetComputeRunningProcesses_v3`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct FakeProcess {
    /// Process id.
    pub pid: u32,
    /// GPU memory it holds, bytes.
    pub used_memory_bytes: u64,
}

/// One GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct FakeGpu {
    /// `GPU-xxxxxxxx-...`.
    pub uuid: String,
    /// Product name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// Board serial (`nvmlDeviceGetSerial`); `None` answers `NVML_ERROR_NOT_SUPPORTED`.
    pub serial: Option<String>,
    /// VBIOS version (`nvmlDeviceGetVbiosVersion`); `None` answers `NVML_ERROR_NOT_SUPPORTED`.
    pub vbios_version: Option<String>,
    /// PCI bus id in the `0000:1A:00.0` form; NVML returns it as `00000000:1A:00.0`.
    pub pci_bus_id: String,
    /// PCI device id, vendor in the low 16 bits (`0x233010DE` = H100 SXM).
    pub pci_device_id: u32,
    /// PCI subsystem id.
    pub pci_sub_system_id: u32,
    /// Framebuffer size, bytes.
    pub memory_total_bytes: u64,
    /// Reserved by the driver, bytes.
    pub memory_reserved_bytes: u64,
    /// In use, bytes.
    pub memory_used_bytes: u64,
    /// GPU core temperature, °C.
    pub temperature_c: u32,
    /// `NVML_TEMPERATURE_THRESHOLD_SLOWDOWN`, °C.
    pub slowdown_threshold_c: u32,
    /// `NVML_TEMPERATURE_THRESHOLD_SHUTDOWN`, °C.
    pub shutdown_threshold_c: u32,
    /// Board power draw, mW.
    pub power_usage_mw: u32,
    /// Enforced power limit, mW.
    pub power_limit_mw: u32,
    /// ECC counters.
    pub ecc: EccCounts,
    /// Page retirement.
    pub retired_pages: RetiredPages,
    /// Row remapping.
    pub remapped_rows: RemappedRows,
    /// PCIe link.
    pub pcie: PcieLink,
    /// NVLink links; empty answers `NVML_ERROR_NOT_SUPPORTED` (a PCIe card without NVLink).
    pub nvlinks: Vec<NvLink>,
    /// Persistence mode.
    pub persistence_mode: bool,
    /// Compute processes.
    pub processes: Vec<FakeProcess>,
    /// `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION` (field 230): 0 none, 1 GPU reset, 2 node reboot,
    /// 3 drain peer-to-peer, 4 drain and reset.
    pub recovery_action: u32,
    /// Whether field 230 is supported (drivers before R550 answer `NOT_SUPPORTED`).
    pub recovery_action_supported: bool,
    /// `nvmlDeviceGetCurrentClocksThrottleReasons` bit mask (`nvmlClocksThrottleReason*`).
    pub throttle_reasons: u64,
    /// XIDs waiting to be delivered by `nvmlEventSetWait_v2`, oldest first; each is logged to
    /// `kmsgPath` (when set) as it is delivered.
    pub xid_events: Vec<QueuedXid>,
    /// The fake `nvidia-smi -r` fails on this GPU (exit 255) without changing it.
    pub reset_fails: bool,
    /// How many times the fake `nvidia-smi -r` reset this GPU (written by the fake).
    pub reset_count: u32,
    /// The GPU fell off the bus: it is counted (`nvmlDeviceGetCount`) but getting its handle
    /// fails with `NVML_ERROR_GPU_IS_LOST` (15), as does any call on a handle taken before;
    /// the fake `nvidia-smi` prints "Unable to determine the device handle" for it.
    pub lost: bool,
    /// What a lost GPU answers (`gpuIsLost`, or `unknown` as drivers before R450 do).
    pub lost_error: LostError,
    /// Its NVLink fabric registration; `None` answers `NVML_ERROR_NOT_SUPPORTED` (no NVSwitch
    /// fabric, or a GPU older than Hopper).
    pub fabric: Option<FakeFabric>,
    /// MIG mode (`nvmlDeviceGetMigMode`, current); `None`: the GPU does not support MIG
    /// (`NVML_ERROR_NOT_SUPPORTED`).
    pub mig_mode: Option<bool>,
    /// The mode after the next GPU reset; `None`: the same as `migMode`.
    pub mig_mode_pending: Option<bool>,
    /// MIG devices, by index (`nvmlDeviceGetMigDeviceHandleByIndex`); only there in MIG mode.
    pub mig_devices: Vec<FakeMigDevice>,
}

/// One MIG device (a compute instance in a GPU instance).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct FakeMigDevice {
    /// `MIG-xxxxxxxx-...`.
    pub uuid: String,
    /// e.g. `NVIDIA H100 80GB HBM3 MIG 1g.10gb`.
    pub name: String,
    /// The instance's memory, bytes.
    pub memory_total_bytes: u64,
    /// `nvmlDeviceGetGpuInstanceId`.
    pub gpu_instance_id: u32,
    /// `nvmlDeviceGetComputeInstanceId`.
    pub compute_instance_id: u32,
}

/// Most MIG devices an NVML GPU reports (`nvmlDeviceGetMaxMigDeviceCount` on an H100: seven
/// GPU instances of one compute instance each).
pub const MAX_MIG_DEVICES: u32 = 7;

impl Default for FakeGpu {
    fn default() -> Self {
        Self {
            uuid: String::new(),
            name: "NVIDIA H100 80GB HBM3".into(),
            serial: None,
            vbios_version: None,
            pci_bus_id: String::new(),
            pci_device_id: 0x2330_10DE,
            pci_sub_system_id: 0x1658_10DE,
            memory_total_bytes: 85_899_345_920,
            memory_reserved_bytes: 1_073_741_824,
            memory_used_bytes: 0,
            temperature_c: 34,
            slowdown_threshold_c: 87,
            shutdown_threshold_c: 92,
            power_usage_mw: 95_000,
            power_limit_mw: 700_000,
            ecc: EccCounts::default(),
            retired_pages: RetiredPages::default(),
            remapped_rows: RemappedRows::default(),
            pcie: PcieLink::default(),
            nvlinks: Vec::new(),
            persistence_mode: true,
            processes: Vec::new(),
            recovery_action: 0,
            recovery_action_supported: true,
            throttle_reasons: 0,
            xid_events: Vec::new(),
            reset_fails: false,
            reset_count: 0,
            lost: false,
            lost_error: LostError::GpuIsLost,
            fabric: None,
            mig_mode: None,
            mig_mode_pending: None,
            mig_devices: Vec::new(),
        }
    }
}

/// Splits a PCI bus id (`0000:1A:00.0`, `00000000:1a:00.0`, `1a:00.0`, `0000:1a:00`) into
/// (domain, bus, device, function); the function defaults to 0.
pub fn parse_bus_id(s: &str) -> Option<(u32, u32, u32, u32)> {
    let s = s.trim();
    let (rest, func) = match s.rsplit_once('.') {
        Some((r, f)) => (r, u32::from_str_radix(f, 16).ok()?),
        None => (s, 0),
    };
    let parts: Vec<&str> = rest.split(':').collect();
    let (dom, bus, dev) = match parts.as_slice() {
        [d, b, v] => (u32::from_str_radix(d, 16).ok()?, *b, *v),
        [b, v] => (0, *b, *v),
        _ => return None,
    };
    Some((
        dom,
        u32::from_str_radix(bus, 16).ok()?,
        u32::from_str_radix(dev, 16).ok()?,
        func,
    ))
}

impl FakeConfig {
    /// Index of the GPU whose bus id, UUID or decimal index is `id` (as `nvidia-smi -i` takes).
    pub fn find_gpu(&self, id: &str) -> Option<usize> {
        let id = id.trim();
        if let Some(i) = self
            .gpus
            .iter()
            .position(|g| g.uuid.eq_ignore_ascii_case(id))
        {
            return Some(i);
        }
        if let Some(want) = parse_bus_id(id).filter(|_| id.contains(':')) {
            return self
                .gpus
                .iter()
                .position(|g| parse_bus_id(&g.pci_bus_id) == Some(want));
        }
        id.parse::<usize>().ok().filter(|i| *i < self.gpus.len())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_parse_in_every_nvml_form() {
        let want = Some((0, 0x1a, 0, 0));
        assert_eq!(parse_bus_id("0000:1A:00.0"), want);
        assert_eq!(parse_bus_id("00000000:1a:00.0"), want);
        assert_eq!(parse_bus_id("1a:00.0"), want);
        assert_eq!(parse_bus_id("0000:1a:00"), want);
        assert_eq!(parse_bus_id("nonsense"), None);
    }

    #[test]
    fn gpus_are_found_by_uuid_bus_id_or_index() {
        let cfg = FakeConfig {
            gpus: vec![
                FakeGpu {
                    uuid: "GPU-a".into(),
                    pci_bus_id: "0000:1A:00.0".into(),
                    ..FakeGpu::default()
                },
                FakeGpu {
                    uuid: "GPU-b".into(),
                    pci_bus_id: "0000:1B:00.0".into(),
                    ..FakeGpu::default()
                },
            ],
            ..FakeConfig::default()
        };
        assert_eq!(cfg.find_gpu("GPU-b"), Some(1));
        assert_eq!(cfg.find_gpu("00000000:1B:00.0"), Some(1));
        assert_eq!(cfg.find_gpu("0"), Some(0));
        assert_eq!(cfg.find_gpu("7"), None);
        assert_eq!(cfg.find_gpu("0000:99:00.0"), None);
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let err = serde_json::from_str::<FakeConfig>(r#"{"gpus":[{"uuidd":"x"}]}"#);
        assert!(err.is_err());
    }
}
