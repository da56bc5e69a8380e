//! Per-GPU queries: identity, health counters, links, persistence mode, processes.

use std::ffi::{c_char, c_int, c_uint, c_ulonglong};

use nvml_wrapper_sys::bindings::field_id::*;
use nvml_wrapper_sys::bindings::*;

use super::*;
use crate::config::FakeGpu;

// --- identity ---------------------------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    dev: nvmlDevice_t,
    buf: *mut c_char,
    len: c_uint,
) -> Ret {
    with_target(dev, |t| match t {
        Target::Gpu(_, g) => put_str(buf, len, &g.uuid),
        Target::Mig(.., m) => put_str(buf, len, &m.uuid),
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    dev: nvmlDevice_t,
    buf: *mut c_char,
    len: c_uint,
) -> Ret {
    with_target(dev, |t| match t {
        Target::Gpu(_, g) => put_str(buf, len, &g.name),
        Target::Mig(.., m) => put_str(buf, len, &m.name),
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSerial(
    dev: nvmlDevice_t,
    buf: *mut c_char,
    len: c_uint,
) -> Ret {
    with_gpu(dev, |g| match &g.serial {
        Some(s) => put_str(buf, len, s),
        None => Err(NOT_SUPPORTED),
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetVbiosVersion(
    dev: nvmlDevice_t,
    buf: *mut c_char,
    len: c_uint,
) -> Ret {
    with_gpu(dev, |g| match &g.vbios_version {
        Some(v) => put_str(buf, len, v),
        None => Err(NOT_SUPPORTED),
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    dev: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> Ret {
    // A MIG device answers with its parent's PCI information.
    with_target(dev, |t| {
        let (Target::Gpu(_, g) | Target::Mig(_, g, ..)) = t;
        put(
            pci,
            pci_info(&g.pci_bus_id, g.pci_device_id, g.pci_sub_system_id)?,
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    dev: nvmlDevice_t,
    mem: *mut nvmlMemory_v2_t,
) -> Ret {
    with_target(dev, |t| {
        if mem.is_null() {
            return Err(INVALID);
        }
        // SAFETY: `mem` is non-null and points at an `nvmlMemory_v2_t` whose `version` the caller
        // set (NVML contract).
        let version = unsafe { (*mem).version };
        let (total, reserved, used) = match t {
            Target::Gpu(_, g) => (
                g.memory_total_bytes,
                g.memory_reserved_bytes,
                g.memory_used_bytes,
            ),
            Target::Mig(.., m) => (m.memory_total_bytes, 0, 0),
        };
        put(
            mem,
            nvmlMemory_v2_t {
                version,
                total,
                reserved,
                free: total.saturating_sub(reserved + used),
                used,
            },
        )
    })
}

// --- health -----------------------------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    dev: nvmlDevice_t,
    sensor: nvmlTemperatureSensors_t,
    temp: *mut c_uint,
) -> Ret {
    with_gpu(dev, |g| {
        if sensor != nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU {
            return Err(INVALID);
        }
        put(temp, g.temperature_c)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperatureThreshold(
    dev: nvmlDevice_t,
    kind: nvmlTemperatureThresholds_t,
    temp: *mut c_uint,
) -> Ret {
    with_gpu(dev, |g| match kind {
        nvmlTemperatureThresholds_enum_NVML_TEMPERATURE_THRESHOLD_SLOWDOWN => {
            put(temp, g.slowdown_threshold_c)
        }
        nvmlTemperatureThresholds_enum_NVML_TEMPERATURE_THRESHOLD_SHUTDOWN => {
            put(temp, g.shutdown_threshold_c)
        }
        _ => Err(NOT_SUPPORTED),
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(dev: nvmlDevice_t, mw: *mut c_uint) -> Ret {
    with_gpu(dev, |g| put(mw, g.power_usage_mw))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetEnforcedPowerLimit(
    dev: nvmlDevice_t,
    mw: *mut c_uint,
) -> Ret {
    with_gpu(dev, |g| put(mw, g.power_limit_mw))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    dev: nvmlDevice_t,
    error_type: nvmlMemoryErrorType_t,
    counter_type: nvmlEccCounterType_t,
    count: *mut c_ulonglong,
) -> Ret {
    with_gpu(dev, |g| {
        let e = &g.ecc;
        let v = match (error_type, counter_type) {
            (
                nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_CORRECTED,
                nvmlEccCounterType_enum_NVML_VOLATILE_ECC,
            ) => e.volatile_corrected,
            (
                nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                nvmlEccCounterType_enum_NVML_VOLATILE_ECC,
            ) => e.volatile_uncorrected,
            (
                nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_CORRECTED,
                nvmlEccCounterType_enum_NVML_AGGREGATE_ECC,
            ) => e.aggregate_corrected,
            (
                nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                nvmlEccCounterType_enum_NVML_AGGREGATE_ECC,
            ) => e.aggregate_uncorrected,
            _ => return Err(INVALID),
        };
        put(count, v)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPagesPendingStatus(
    dev: nvmlDevice_t,
    pending: *mut nvmlEnableState_t,
) -> Ret {
    with_gpu(dev, |g| put(pending, enable_state(g.retired_pages.pending)))
}

/// The value of one field for `g`, or the per-field error.
fn field_value(g: &FakeGpu, id: u32) -> Result<u64, Ret> {
    Ok(match id {
        NVML_FI_DEV_RETIRED_SBE => g.retired_pages.single_bit,
        NVML_FI_DEV_RETIRED_DBE => g.retired_pages.double_bit,
        NVML_FI_DEV_RETIRED_PENDING => u64::from(g.retired_pages.pending),
        NVML_FI_DEV_REMAPPED_COR => g.remapped_rows.correctable,
        NVML_FI_DEV_REMAPPED_UNC => g.remapped_rows.uncorrectable,
        NVML_FI_DEV_REMAPPED_PENDING => u64::from(g.remapped_rows.pending),
        NVML_FI_DEV_REMAPPED_FAILURE => u64::from(g.remapped_rows.failure),
        NVML_FI_DEV_GET_GPU_RECOVERY_ACTION if g.recovery_action_supported => {
            u64::from(g.recovery_action)
        }
        _ => return Err(NOT_SUPPORTED),
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    dev: nvmlDevice_t,
    count: c_int,
    values: *mut nvmlFieldValue_t,
) -> Ret {
    with_gpu(dev, |g| {
        let n = usize::try_from(count).map_err(|_| INVALID)?;
        if values.is_null() {
            return Err(INVALID);
        }
        // SAFETY: `values` is non-null and points at `count` initialized `nvmlFieldValue_t`s the
        // caller owns exclusively for the duration of the call (NVML contract).
        let slots = unsafe { std::slice::from_raw_parts_mut(values, n) };
        for slot in slots {
            match field_value(g, slot.fieldId) {
                Ok(v) => {
                    slot.valueType = nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
                    slot.value = nvmlValue_t { ullVal: v };
                    slot.nvmlReturn = OK;
                }
                Err(e) => slot.nvmlReturn = e,
            }
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(
    dev: nvmlDevice_t,
    reasons: *mut c_ulonglong,
) -> Ret {
    with_gpu(dev, |g| put(reasons, g.throttle_reasons))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksEventReasons(
    dev: nvmlDevice_t,
    reasons: *mut c_ulonglong,
) -> Ret {
    with_gpu(dev, |g| put(reasons, g.throttle_reasons))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrPcieLinkGeneration(
    dev: nvmlDevice_t,
    v: *mut c_uint,
) -> Ret {
    with_gpu(dev, |g| put(v, g.pcie.current_gen))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxPcieLinkGeneration(
    dev: nvmlDevice_t,
    v: *mut c_uint,
) -> Ret {
    with_gpu(dev, |g| put(v, g.pcie.max_gen))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrPcieLinkWidth(dev: nvmlDevice_t, v: *mut c_uint) -> Ret {
    with_gpu(dev, |g| put(v, g.pcie.current_width))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxPcieLinkWidth(dev: nvmlDevice_t, v: *mut c_uint) -> Ret {
    with_gpu(dev, |g| put(v, g.pcie.max_width))
}

fn nvlink(g: &FakeGpu, link: c_uint) -> Result<&crate::config::NvLink, Ret> {
    if g.nvlinks.is_empty() {
        return Err(NOT_SUPPORTED);
    }
    g.nvlinks.get(link as usize).ok_or(INVALID)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkState(
    dev: nvmlDevice_t,
    link: c_uint,
    active: *mut nvmlEnableState_t,
) -> Ret {
    with_gpu(dev, |g| put(active, enable_state(nvlink(g, link)?.active)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemotePciInfo_v2(
    dev: nvmlDevice_t,
    link: c_uint,
    pci: *mut nvmlPciInfo_t,
) -> Ret {
    with_gpu(dev, |g| {
        let remote = nvlink(g, link)?
            .remote_pci_bus_id
            .as_deref()
            .ok_or(NOT_SUPPORTED)?;
        put(pci, pci_info(remote, 0, 0)?)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkErrorCounter(
    dev: nvmlDevice_t,
    link: c_uint,
    counter: nvmlNvLinkErrorCounter_t,
    value: *mut std::ffi::c_ulonglong,
) -> Ret {
    with_gpu(dev, |g| {
        let l = nvlink(g, link)?;
        let v = match counter {
            nvmlNvLinkErrorCounter_enum_NVML_NVLINK_ERROR_DL_REPLAY => l.replay_errors,
            nvmlNvLinkErrorCounter_enum_NVML_NVLINK_ERROR_DL_RECOVERY => l.recovery_errors,
            nvmlNvLinkErrorCounter_enum_NVML_NVLINK_ERROR_DL_CRC_FLIT => l.crc_flit_errors,
            nvmlNvLinkErrorCounter_enum_NVML_NVLINK_ERROR_DL_CRC_DATA => l.crc_data_errors,
            _ => return Err(NOT_SUPPORTED),
        };
        put(value, v)
    })
}

// --- NVLink fabric ----------------------------------------------------------------------------

/// `NVML_STRUCT_VERSION(GpuFabricInfo, 3)`: the struct's size with the version in the top byte.
fn fabric_info_version(v: u32) -> c_uint {
    let size = std::mem::size_of::<nvmlGpuFabricInfo_v3_t>() as c_uint;
    size | (v << 24)
}

/// Writes the cluster UUID `s` (`xxxxxxxx-xxxx-…`, 32 hex digits) as its 16 bytes.
fn uuid_bytes(s: &str) -> Result<[u8; 16], Ret> {
    let hex: Vec<u8> = s.bytes().filter(|b| *b != b'-').collect();
    if hex.len() != 32 {
        return Err(UNKNOWN);
    }
    let mut out = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        let text = std::str::from_utf8(pair).map_err(|_| UNKNOWN)?;
        out[i] = u8::from_str_radix(text, 16).map_err(|_| UNKNOWN)?;
    }
    Ok(out)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuFabricInfoV(
    dev: nvmlDevice_t,
    info: *mut nvmlGpuFabricInfoV_t,
) -> Ret {
    with_gpu(dev, |g| {
        if info.is_null() {
            return Err(INVALID);
        }
        // SAFETY: `info` is non-null and points at the caller's struct (NVML contract), whose
        // `version` the caller set before the call.
        let version = unsafe { (*info).version };
        if version != fabric_info_version(3) && version != fabric_info_version(2) {
            return Err(nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let f = g.fabric.as_ref().ok_or(NOT_SUPPORTED)?;
        put(
            info,
            nvmlGpuFabricInfoV_t {
                version,
                clusterUuid: uuid_bytes(&f.cluster_uuid)?,
                status: f.status,
                cliqueId: f.clique_id,
                state: f.state.value(),
                healthMask: 0,
                healthSummary: 0,
            },
        )
    })
}

// --- persistence and processes ----------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPersistenceMode(
    dev: nvmlDevice_t,
    mode: *mut nvmlEnableState_t,
) -> Ret {
    with_gpu(dev, |g| put(mode, enable_state(g.persistence_mode)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetPersistenceMode(
    dev: nvmlDevice_t,
    mode: nvmlEnableState_t,
) -> Ret {
    update_gpu(dev, |g| {
        g.persistence_mode = match mode {
            nvmlEnableState_enum_NVML_FEATURE_ENABLED => true,
            nvmlEnableState_enum_NVML_FEATURE_DISABLED => false,
            _ => return Err(INVALID),
        };
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    dev: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> Ret {
    with_gpu(dev, |g| {
        if count.is_null() {
            return Err(INVALID);
        }
        // SAFETY: `count` is non-null and valid for reads (NVML contract).
        let room = unsafe { count.read() } as usize;
        put(count, g.processes.len() as c_uint)?;
        if g.processes.len() > room || (infos.is_null() && !g.processes.is_empty()) {
            return Err(INSUFFICIENT);
        }
        for (i, p) in g.processes.iter().enumerate() {
            let info = nvmlProcessInfo_t {
                pid: p.pid,
                usedGpuMemory: p.used_memory_bytes,
                gpuInstanceId: u32::MAX,
                computeInstanceId: u32::MAX,
            };
            // SAFETY: `infos` is non-null and holds `room >= processes.len() > i` entries.
            put(unsafe { infos.add(i) }, info)?;
        }
        Ok(())
    })
}
