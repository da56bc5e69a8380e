//! `gpu.reset`: which GPUs to reset, and the before/after report that proves the reset worked.
//! The reset itself (`nvidia-smi -r` with its preflight and verification) runs in `bcd-probes`
//! (`nvml::reset`).

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Which GPUs to reset: `"all"` or a list of UUIDs / PCI bus ids, in JSON as in the arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResetTarget {
    /// Every GPU on the node.
    All,
    /// These GPUs (`GPU-...` or `0000:1a:00.0`).
    Gpus(Vec<String>),
}

impl Serialize for ResetTarget {
    /// Writes `"all"` or the list, the shape [`Deserialize`] reads.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::All => s.serialize_str("all"),
            Self::Gpus(ids) => ids.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for ResetTarget {
    /// Accepts `"all"` or `["GPU-...", "0000:1a:00.0"]`.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Word(String),
            List(Vec<String>),
        }
        match Raw::deserialize(d)? {
            Raw::Word(w) if w == "all" => Ok(Self::All),
            Raw::Word(w) => Err(serde::de::Error::custom(format!(
                "gpus must be \"all\" or a list, got {w:?}"
            ))),
            Raw::List(l) => Ok(Self::Gpus(l)),
        }
    }
}

/// The arguments of the `gpu.reset` command: `{"gpus": "all" | ["GPU-…", "0000:1a:00.0"]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResetArgs {
    /// Which GPUs.
    pub gpus: ResetTarget,
}

/// A GPU that holds compute processes (the details of a `GPU_BUSY` failure).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BusyGpu {
    /// `0000:1a:00.0`.
    pub pci_bus_id: String,
    /// `GPU-...`.
    pub uuid: String,
    /// Process ids (`nvmlDeviceGetComputeRunningProcesses_v3`).
    pub pids: Vec<u32>,
}

/// A GPU's resettable state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuSnapshot {
    /// `GPU-...`; empty when the GPU was not found at its bus id.
    pub uuid: String,
    /// Persistence mode on.
    pub persistence_mode: bool,
    /// Volatile corrected ECC errors (`None`: not supported).
    pub volatile_corrected_ecc: Option<u64>,
    /// Volatile uncorrected ECC errors.
    pub volatile_uncorrected_ecc: Option<u64>,
    /// NVML recovery action name (field 230; `None`: not supported), e.g. `none`, `gpuReset`.
    pub recovery_action: Option<String>,
}

/// One reset GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuResetResult {
    /// `0000:1a:00.0`.
    pub pci_bus_id: String,
    /// Asked for (false: added as an NVLink peer).
    pub requested: bool,
    /// Before the reset.
    pub before: GpuSnapshot,
    /// After the reset (and persistence restore).
    pub after: Option<GpuSnapshot>,
    /// Persistence mode was on before and is on again.
    pub persistence_mode_restored: Option<bool>,
    /// What verification found wrong; empty when verified.
    pub problems: Vec<String>,
}

/// The result of `gpu.reset` (camelCase JSON); also the details of a `RESET_FAILED` or
/// `RESET_NOT_VERIFIED` failure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResetReport {
    /// Every GPU reset, requested ones first.
    pub gpus: Vec<GpuResetResult>,
    /// What `nvidia-smi` printed (stdout then stderr).
    pub nvidia_smi_output: String,
    /// All GPUs verified.
    pub verified: bool,
}
