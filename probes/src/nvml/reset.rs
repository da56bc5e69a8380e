//! `gpu.reset`: reset GPUs with `nvidia-smi -r`, safely, and prove it worked.
//!
//! The reset has NVML to itself for its whole run (see `super::exclusive_access`). Steps: resolve
//! the targets (UUID or PCI bus id, or all); add direct NVLink peers (a GPU whose
//! link ends at another GPU rather than an NVSwitch is reset with it, as bridged pairs require);
//! refuse with `GPU_BUSY` if any has compute processes; record a before snapshot; switch
//! persistence mode off where it is on (it holds the device open); shut NVML down (an open NVML
//! handle also holds it); run `nvidia-smi -r -i <bus ids>`; re-open NVML and switch persistence
//! mode back on, whatever the outcome; then verify each GPU: the same UUID at the same bus id,
//! volatile ECC counters zero, recovery action none. A successful reset logs a marker to the
//! kernel log so `diag.nvml` treats earlier XIDs of that GPU as cleared.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError};
use nvml_wrapper::sys_exports::field_id::NVML_FI_DEV_GET_GPU_RECOVERY_ACTION;
use nvml_wrapper::{Device, Nvml};

use crate::hostroot::HostRoot;

use super::busid::PciAddr;
use super::checks::{NVLINK_MAX_LINKS, field_u64s};
use super::tool::run_with_timeout;
use super::{NvmlConfig, NvmlError, kmsg, open, xid};

pub use bc_protocol::commands::reset::{
    BusyGpu, GpuResetResult, GpuSnapshot, ResetArgs, ResetReport, ResetTarget,
};
use bc_protocol::commands::{CommandErrorCode, CommandFailure};

/// How long `nvidia-smi -r` may run before it is killed and the reset counts as failed. NVIDIA
/// documents resets taking seconds; a hung tool must not hold the NVML gate forever.
pub const NVIDIA_SMI_TIMEOUT: Duration = Duration::from_secs(180);

/// `gpu.reset` failed.
#[derive(Debug, thiserror::Error)]
pub enum ResetError {
    /// NVML could not be loaded or initialized.
    #[error("NVML unavailable: {0}")]
    Nvml(#[from] NvmlError),
    /// The arguments name no GPU.
    #[error("no GPU to reset: {0}")]
    InvalidArgument(String),
    /// No GPU has this UUID or bus id.
    #[error("no GPU matches {0}")]
    NotFound(String),
    /// Compute processes run on the GPUs; nothing was changed.
    #[error("GPUs busy: {}", describe_busy(.0))]
    GpuBusy(Vec<BusyGpu>),
    /// Switching persistence mode off failed; what was switched off was switched back on.
    #[error("cannot disable persistence mode on {bus_id}: {reason}")]
    Persistence {
        /// The GPU.
        bus_id: String,
        /// NVML's error.
        reason: String,
    },
    /// `nvidia-smi` could not be started.
    #[error("cannot run {path}: {source}")]
    Spawn {
        /// The binary.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// `nvidia-smi -r` failed; persistence mode was restored (see the report).
    #[error("nvidia-smi -r failed (exit {exit_code:?}): {}", report.nvidia_smi_output.trim())]
    ResetFailed {
        /// Exit status, `None` if killed by a signal.
        exit_code: Option<i32>,
        /// Before and after, with the tool's output.
        report: Box<ResetReport>,
    },
    /// The reset ran but a GPU did not come back as expected.
    #[error("reset not verified: {}", report.gpus.iter().flat_map(|g| g.problems.iter().map(move |p| format!("{}: {p}", g.pci_bus_id))).collect::<Vec<_>>().join("; "))]
    VerifyFailed {
        /// Before and after.
        report: Box<ResetReport>,
    },
}

fn describe_busy(b: &[BusyGpu]) -> String {
    b.iter()
        .map(|g| format!("{} pids {:?}", g.pci_bus_id, g.pids))
        .collect::<Vec<_>>()
        .join(", ")
}

impl ResetError {
    /// The command error code the agent reports.
    pub fn code(&self) -> CommandErrorCode {
        match self {
            Self::Nvml(_) => CommandErrorCode::NvmlUnavailable,
            Self::InvalidArgument(_) => CommandErrorCode::InvalidArgument,
            Self::NotFound(_) => CommandErrorCode::NotFound,
            Self::GpuBusy(_) => CommandErrorCode::GpuBusy,
            Self::Persistence { .. } | Self::Spawn { .. } | Self::ResetFailed { .. } => {
                CommandErrorCode::ResetFailed
            }
            Self::VerifyFailed { .. } => CommandErrorCode::ResetNotVerified,
        }
    }

    /// The command failure the agent reports: the code, the message and, when there are
    /// [`details`](Self::details), those as JSON after ` details: `.
    pub fn to_failure(&self) -> CommandFailure {
        let details = self
            .details()
            .map(|d| format!(" details: {d}"))
            .unwrap_or_default();
        CommandFailure::new(self.code(), format!("{self}{details}"))
    }

    /// Structured details for the command result: the busy GPUs, or the report.
    pub fn details(&self) -> Option<serde_json::Value> {
        match self {
            Self::GpuBusy(b) => serde_json::to_value(b).ok(),
            Self::ResetFailed { report, .. } | Self::VerifyFailed { report } => {
                serde_json::to_value(report).ok()
            }
            _ => None,
        }
    }
}

/// A GPU as enumerated.
#[derive(Debug, Clone)]
struct Gpu {
    index: u32,
    uuid: String,
    addr: PciAddr,
}

fn enumerate(nvml: &Nvml) -> Result<Vec<Gpu>, NvmlError> {
    let n = nvml
        .device_count()
        .map_err(NvmlError::call("nvmlDeviceGetCount"))?;
    (0..n)
        .map(|index| {
            let d = nvml
                .device_by_index(index)
                .map_err(NvmlError::call("nvmlDeviceGetHandleByIndex"))?;
            let pci = d
                .pci_info()
                .map_err(NvmlError::call("nvmlDeviceGetPciInfo"))?;
            Ok(Gpu {
                index,
                uuid: super::nvml_string(d.uuid().map_err(NvmlError::call("nvmlDeviceGetUUID"))?),
                addr: PciAddr::parse(&pci.bus_id).ok_or(NvmlError::Call {
                    call: "nvmlDeviceGetPciInfo",
                    source: nvml_wrapper::error::NvmlError::GetPciInfoFailed,
                })?,
            })
        })
        .collect()
}

/// Indices into `gpus` of the requested GPUs.
fn resolve(gpus: &[Gpu], target: &ResetTarget) -> Result<Vec<usize>, ResetError> {
    let ids = match target {
        ResetTarget::All => return Ok((0..gpus.len()).collect()),
        ResetTarget::Gpus(ids) if ids.is_empty() => {
            return Err(ResetError::InvalidArgument("empty gpus list".into()));
        }
        ResetTarget::Gpus(ids) => ids,
    };
    let mut out = Vec::new();
    for id in ids {
        let by_addr = PciAddr::parse(id);
        let i = gpus
            .iter()
            .position(|g| g.uuid.eq_ignore_ascii_case(id.trim()) || Some(g.addr) == by_addr)
            .ok_or_else(|| ResetError::NotFound(id.clone()))?;
        if !out.contains(&i) {
            out.push(i);
        }
    }
    Ok(out)
}

/// Adds GPUs joined to the group by an active NVLink link that ends at another GPU.
fn add_nvlink_peers(nvml: &Nvml, gpus: &[Gpu], group: &mut Vec<usize>) {
    let mut k = 0;
    while k < group.len() {
        let Ok(dev) = nvml.device_by_index(gpus[group[k]].index) else {
            k += 1;
            continue;
        };
        for link in 0..NVLINK_MAX_LINKS {
            let l = dev.link_wrapper_for(link);
            match l.is_active() {
                Ok(true) => {}
                Ok(false) => continue,
                Err(_) => break,
            }
            let remote = l
                .remote_pci_info()
                .ok()
                .and_then(|p| PciAddr::parse(&p.bus_id));
            if let Some(j) = gpus.iter().position(|g| Some(g.addr) == remote)
                && !group.contains(&j)
            {
                group.push(j);
            }
        }
        k += 1;
    }
}

fn snapshot(dev: &Device) -> GpuSnapshot {
    GpuSnapshot {
        uuid: super::nvml_string(dev.uuid().unwrap_or_default()),
        persistence_mode: dev.is_in_persistent_mode().unwrap_or(false),
        volatile_corrected_ecc: dev
            .total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)
            .ok(),
        volatile_uncorrected_ecc: dev
            .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
            .ok(),
        recovery_action: field_u64s(dev, &[NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])[0]
            .map(|v| xid::recovery_action_name(v).to_owned()),
    }
}

/// Switches persistence mode on for the GPUs at `addrs`; returns whether each is on afterwards.
fn restore_persistence(nvml: &Nvml, addrs: &[PciAddr]) -> Vec<bool> {
    addrs
        .iter()
        .map(|a| {
            nvml.device_by_pci_bus_id(a.to_bus_id())
                .ok()
                .is_some_and(|mut d| d.set_persistent(true).is_ok())
        })
        .collect()
}

/// Resets `target` (see the module doc). Blocks for as long as `nvidia-smi` runs.
pub fn reset(
    cfg: &NvmlConfig,
    target: &ResetTarget,
    root: &HostRoot,
) -> Result<ResetReport, ResetError> {
    let _gate = super::exclusive_access();
    let nvml = open(cfg)?;
    let gpus = enumerate(&nvml)?;
    let requested = resolve(&gpus, target)?;
    let mut group = requested.clone();
    add_nvlink_peers(&nvml, &gpus, &mut group);

    let mut busy = Vec::new();
    let mut results = Vec::new();
    for &i in &group {
        let g = &gpus[i];
        let dev = nvml
            .device_by_index(g.index)
            .map_err(NvmlError::call("nvmlDeviceGetHandleByIndex"))?;
        let pids: Vec<u32> = dev
            .running_compute_processes()
            .map_err(NvmlError::call("nvmlDeviceGetComputeRunningProcesses"))?
            .into_iter()
            .map(|p| p.pid)
            .collect();
        if !pids.is_empty() {
            busy.push(BusyGpu {
                pci_bus_id: g.addr.to_bus_id(),
                uuid: g.uuid.clone(),
                pids,
            });
        }
        results.push(GpuResetResult {
            pci_bus_id: g.addr.to_bus_id(),
            requested: requested.contains(&i),
            before: snapshot(&dev),
            after: None,
            persistence_mode_restored: None,
            problems: Vec::new(),
        });
    }
    if !busy.is_empty() {
        return Err(ResetError::GpuBusy(busy));
    }

    // Persistence mode off where it is on; on failure put back what we changed.
    let mut switched: Vec<PciAddr> = Vec::new();
    for (&i, r) in group.iter().zip(&results) {
        if !r.before.persistence_mode {
            continue;
        }
        let g = &gpus[i];
        let res = nvml
            .device_by_index(g.index)
            .and_then(|mut d| d.set_persistent(false));
        if let Err(e) = res {
            restore_persistence(&nvml, &switched);
            return Err(ResetError::Persistence {
                bus_id: g.addr.to_bus_id(),
                reason: e.to_string(),
            });
        }
        switched.push(g.addr);
    }
    let addrs: Vec<PciAddr> = group.iter().map(|&i| gpus[i].addr).collect();
    drop(nvml);

    let ids: Vec<String> = addrs.iter().map(|a| a.to_bus_id()).collect();
    let mut cmd = Command::new(&cfg.nvidia_smi);
    cmd.args(["-r", "-i", &ids.join(",")]);
    let run = run_with_timeout(cmd, NVIDIA_SMI_TIMEOUT);

    // Whatever happened, persistence mode goes back on.
    let nvml = open(cfg);
    let restored = match &nvml {
        Ok(n) => restore_persistence(n, &switched),
        Err(_) => vec![false; switched.len()],
    };
    for (r, a) in results.iter_mut().zip(&addrs) {
        if let Some(k) = switched.iter().position(|s| s == a) {
            r.persistence_mode_restored = Some(restored[k]);
        }
    }

    let out = match run {
        Ok(o) => o,
        Err(source) => {
            return Err(ResetError::Spawn {
                path: cfg.nvidia_smi.clone(),
                source,
            });
        }
    };
    let mut report = ResetReport {
        gpus: results,
        nvidia_smi_output: out.text.clone(),
        verified: false,
    };
    let nvml = match nvml {
        Ok(n) => n,
        Err(e) => {
            for r in &mut report.gpus {
                r.problems
                    .push(format!("NVML unavailable after reset: {e}"));
            }
            return Err(if out.success() {
                ResetError::VerifyFailed {
                    report: Box::new(report),
                }
            } else {
                ResetError::ResetFailed {
                    exit_code: out.code(),
                    report: Box::new(report),
                }
            });
        }
    };
    for (r, a) in report.gpus.iter_mut().zip(&addrs) {
        r.after = nvml
            .device_by_pci_bus_id(a.to_bus_id())
            .ok()
            .map(|d| snapshot(&d));
    }
    if !out.success() {
        return Err(ResetError::ResetFailed {
            exit_code: out.code(),
            report: Box::new(report),
        });
    }
    for (r, a) in report.gpus.iter_mut().zip(&addrs) {
        verify(r);
        if r.problems.is_empty()
            && let Err(e) = kmsg::write_reset_marker(root, *a, &r.before.uuid)
        {
            tracing::warn!(error = %e, gpu = %a, "cannot log reset marker");
        }
    }
    report.verified = report.gpus.iter().all(|g| g.problems.is_empty());
    if report.verified {
        Ok(report)
    } else {
        Err(ResetError::VerifyFailed {
            report: Box::new(report),
        })
    }
}

/// Fills `r.problems` from its before and after snapshots.
fn verify(r: &mut GpuResetResult) {
    let Some(after) = &r.after else {
        r.problems
            .push("GPU not found at its bus id after reset".into());
        return;
    };
    if after.uuid != r.before.uuid {
        r.problems.push(format!(
            "UUID changed: {} before, {} after",
            r.before.uuid, after.uuid
        ));
    }
    let ecc = (after.volatile_corrected_ecc, after.volatile_uncorrected_ecc);
    if ecc.0.unwrap_or(0) != 0 || ecc.1.unwrap_or(0) != 0 {
        r.problems.push(format!(
            "volatile ECC not cleared: {} corrected, {} uncorrected",
            ecc.0.unwrap_or(0),
            ecc.1.unwrap_or(0)
        ));
    }
    if let Some(a) = after.recovery_action.as_deref()
        && a != "none"
    {
        r.problems.push(format!("recovery action still {a}"));
    }
    if r.persistence_mode_restored == Some(false) {
        r.problems.push("persistence mode not restored".into());
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn targets_resolve_by_uuid_or_bus_id() {
        let g = |i: u32, bus: u8| Gpu {
            index: i,
            uuid: format!("GPU-{i}"),
            addr: PciAddr {
                domain: 0,
                bus,
                device: 0,
            },
        };
        let gpus = [g(0, 0x1a), g(1, 0x1b)];
        let t = ResetTarget::Gpus(vec!["00000000:1B:00.0".into(), "gpu-0".into()]);
        assert_eq!(resolve(&gpus, &t).unwrap(), vec![1, 0]);
        let t = ResetTarget::Gpus(vec!["GPU-9".into()]);
        assert_eq!(resolve(&gpus, &t).unwrap_err().code().as_str(), "NOT_FOUND");
        let t = ResetTarget::Gpus(vec![]);
        assert_eq!(
            resolve(&gpus, &t).unwrap_err().code().as_str(),
            "INVALID_ARGUMENT"
        );
    }
}
