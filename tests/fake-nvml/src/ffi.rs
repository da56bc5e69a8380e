//! The exported NVML C functions. Signatures, struct layouts and enum values come from
//! `nvml-wrapper-sys`'s bindings (generated from NVIDIA's `nvml.h`), so they match what
//! nvml-wrapper calls.
//!
//! Device handles are `index + 1` cast to a pointer and event-set handles are `slot + 1`; neither
//! is ever dereferenced by callers (NVML handles are opaque).
//!
//! Every function is `unsafe extern "C"`: its contract is NVML's own — each pointer argument is
//! null or valid for the write (or read) the NVML documentation describes, and string buffers hold
//! `length` bytes.
#![allow(clippy::missing_safety_doc, non_upper_case_globals, non_snake_case)]

use std::ffi::{CStr, c_char, c_int, c_uint, c_ulonglong};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use nvml_wrapper_sys::bindings::field_id::*;
use nvml_wrapper_sys::bindings::*;

use crate::config::{FakeConfig, FakeGpu, parse_bus_id};
use crate::state;

type Ret = nvmlReturn_t;
const OK: Ret = nvmlReturn_enum_NVML_SUCCESS;
const UNINIT: Ret = nvmlReturn_enum_NVML_ERROR_UNINITIALIZED;
const INVALID: Ret = nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
const NOT_SUPPORTED: Ret = nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
const NOT_FOUND: Ret = nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
const INSUFFICIENT: Ret = nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
const TIMEOUT: Ret = nvmlReturn_enum_NVML_ERROR_TIMEOUT;
const UNKNOWN: Ret = nvmlReturn_enum_NVML_ERROR_UNKNOWN;

/// `nvmlInit` calls minus `nvmlShutdown` calls, as NVML counts them.
static INIT_COUNT: AtomicUsize = AtomicUsize::new(0);
/// Event sets: slot `i` is handle `i + 1`; each holds (GPU index, event mask) registrations.
/// (GPU index, event mask) pairs registered in one event set.
type Registrations = Vec<(usize, u64)>;

static EVENT_SETS: Mutex<Vec<Option<Registrations>>> = Mutex::new(Vec::new());
/// This copy of the library's config path, found once.
static CONFIG_PATH: OnceLock<Option<PathBuf>> = OnceLock::new();

fn config_path() -> Option<PathBuf> {
    CONFIG_PATH
        .get_or_init(|| {
            let me: unsafe extern "C" fn() -> Ret = nvmlInit_v2;
            let image = state::image_containing(me as usize);
            state::config_path_beside(image.as_deref()).ok()
        })
        .clone()
}

fn load() -> Result<(PathBuf, FakeConfig), Ret> {
    let path = config_path().ok_or(UNKNOWN)?;
    let cfg = state::load(&path).map_err(|_| UNKNOWN)?;
    Ok((path, cfg))
}

fn status(r: Result<(), Ret>) -> Ret {
    match r {
        Ok(()) => OK,
        Err(e) => e,
    }
}

/// Runs `f` on the config when NVML is initialized.
fn with_cfg(f: impl FnOnce(&FakeConfig) -> Result<(), Ret>) -> Ret {
    if INIT_COUNT.load(Ordering::SeqCst) == 0 {
        return UNINIT;
    }
    status(load().and_then(|(_, cfg)| f(&cfg)))
}

fn gpu_index(device: nvmlDevice_t, cfg: &FakeConfig) -> Result<usize, Ret> {
    let i = (device as usize).checked_sub(1).ok_or(INVALID)?;
    if i < cfg.gpus.len() {
        Ok(i)
    } else {
        Err(INVALID)
    }
}

/// Runs `f` on the GPU behind `device`.
fn with_gpu(device: nvmlDevice_t, f: impl FnOnce(&FakeGpu) -> Result<(), Ret>) -> Ret {
    with_cfg(|cfg| f(&cfg.gpus[gpu_index(device, cfg)?]))
}

/// Runs `f` on the GPU behind `device` and writes the change back.
fn update_gpu(device: nvmlDevice_t, f: impl FnOnce(&mut FakeGpu) -> Result<(), Ret>) -> Ret {
    if INIT_COUNT.load(Ordering::SeqCst) == 0 {
        return UNINIT;
    }
    let path = match config_path() {
        Some(p) => p,
        None => return UNKNOWN,
    };
    let r = state::update(&path, |cfg| {
        let i = gpu_index(device, cfg)?;
        f(&mut cfg.gpus[i])
    });
    match r {
        Ok(r) => status(r),
        Err(_) => UNKNOWN,
    }
}

fn handle(index: usize) -> nvmlDevice_t {
    std::ptr::without_provenance_mut(index + 1)
}

/// Stores `v` in `*out`.
fn put<T>(out: *mut T, v: T) -> Result<(), Ret> {
    if out.is_null() {
        return Err(INVALID);
    }
    // SAFETY: `out` is non-null and, by the NVML contract of every caller, valid for a write of
    // one `T`.
    unsafe { out.write(v) };
    Ok(())
}

/// Copies `s` and a NUL into the `len`-byte buffer `buf`.
fn put_str(buf: *mut c_char, len: c_uint, s: &str) -> Result<(), Ret> {
    if buf.is_null() {
        return Err(INVALID);
    }
    if s.len() + 1 > len as usize {
        return Err(INSUFFICIENT);
    }
    // SAFETY: `buf` is non-null and holds `len` bytes (NVML contract); we write `s.len() + 1 <=
    // len` bytes, and `s` cannot overlap a buffer the caller owns.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr().cast::<c_char>(), buf, s.len());
        buf.add(s.len()).write(0);
    }
    Ok(())
}

fn read_str(p: *const c_char) -> Result<String, Ret> {
    if p.is_null() {
        return Err(INVALID);
    }
    // SAFETY: `p` is non-null and points at a NUL-terminated string (NVML contract).
    let s = unsafe { CStr::from_ptr(p) };
    Ok(s.to_string_lossy().into_owned())
}

fn enable_state(b: bool) -> nvmlEnableState_t {
    if b {
        nvmlEnableState_enum_NVML_FEATURE_ENABLED
    } else {
        nvmlEnableState_enum_NVML_FEATURE_DISABLED
    }
}

fn pci_info(bus_id: &str, device_id: u32, subsys: u32) -> Result<nvmlPciInfo_t, Ret> {
    let (domain, bus, device, func) = parse_bus_id(bus_id).ok_or(UNKNOWN)?;
    let mut info = nvmlPciInfo_t {
        busIdLegacy: [0; 16],
        domain,
        bus,
        device,
        pciDeviceId: device_id,
        pciSubSystemId: subsys,
        busId: [0; 32],
    };
    let long = format!("{domain:08X}:{bus:02X}:{device:02X}.{func:X}");
    let legacy = format!("{:04X}:{bus:02X}:{device:02X}.{func:X}", domain & 0xffff);
    put_str(info.busId.as_mut_ptr(), 32, &long)?;
    put_str(info.busIdLegacy.as_mut_ptr(), 16, &legacy)?;
    Ok(info)
}

// --- init -------------------------------------------------------------------------------------

/// Adds `delta` to the config's `nvmlClients`; false when the file could not be updated.
fn count_client(delta: i32) -> bool {
    config_path().is_some_and(|path| {
        state::update(&path, |c| {
            c.nvml_clients = c.nvml_clients.saturating_add_signed(delta);
        })
        .is_ok()
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInit_v2() -> Ret {
    match load() {
        Err(e) => e,
        Ok((_, cfg)) => match cfg.init_error {
            Some(crate::config::InitError::DriverNotLoaded) => {
                nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED
            }
            Some(crate::config::InitError::LibRmVersionMismatch) => {
                nvmlReturn_enum_NVML_ERROR_LIB_RM_VERSION_MISMATCH
            }
            Some(crate::config::InitError::NoPermission) => {
                nvmlReturn_enum_NVML_ERROR_NO_PERMISSION
            }
            None => {
                if INIT_COUNT.fetch_add(1, Ordering::SeqCst) == 0 && !count_client(1) {
                    INIT_COUNT.fetch_sub(1, Ordering::SeqCst);
                    return UNKNOWN;
                }
                OK
            }
        },
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> Ret {
    // SAFETY: no arguments to uphold.
    unsafe { nvmlInit_v2() }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlShutdown() -> Ret {
    match INIT_COUNT.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)) {
        Ok(1) => {
            // The last shutdown of this process closes its (pretend) device files.
            count_client(-1);
            OK
        }
        Ok(_) => OK,
        Err(_) => UNINIT,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlErrorString(result: Ret) -> *const c_char {
    let s: &'static CStr = match result {
        OK => c"Success",
        UNINIT => c"Uninitialized",
        INVALID => c"Invalid Argument",
        NOT_SUPPORTED => c"Not Supported",
        nvmlReturn_enum_NVML_ERROR_NO_PERMISSION => c"Insufficient Permissions",
        NOT_FOUND => c"Not Found",
        INSUFFICIENT => c"Insufficient Size",
        nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED => c"Driver Not Loaded",
        TIMEOUT => c"Timeout",
        nvmlReturn_enum_NVML_ERROR_LIB_RM_VERSION_MISMATCH => c"Driver/library version mismatch",
        _ => c"Unknown Error",
    };
    s.as_ptr()
}

// --- system -----------------------------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> Ret {
    with_cfg(|c| put_str(version, length, &c.driver_version))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) -> Ret {
    with_cfg(|c| put_str(version, length, &c.nvml_version))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(v: *mut c_int) -> Ret {
    with_cfg(|c| put(v, c.cuda_driver_version))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(v: *mut c_int) -> Ret {
    with_cfg(|c| put(v, c.cuda_driver_version))
}

// --- enumeration ------------------------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> Ret {
    with_cfg(|c| put(count, c.gpus.len() as c_uint))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    dev: *mut nvmlDevice_t,
) -> Ret {
    with_cfg(|c| {
        if (index as usize) < c.gpus.len() {
            put(dev, handle(index as usize))
        } else {
            Err(INVALID)
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    dev: *mut nvmlDevice_t,
) -> Ret {
    with_cfg(|c| {
        let want = read_str(uuid)?;
        let i = c
            .gpus
            .iter()
            .position(|g| g.uuid == want)
            .ok_or(NOT_FOUND)?;
        put(dev, handle(i))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    bus_id: *const c_char,
    dev: *mut nvmlDevice_t,
) -> Ret {
    with_cfg(|c| {
        let want = parse_bus_id(&read_str(bus_id)?).ok_or(INVALID)?;
        let i = c
            .gpus
            .iter()
            .position(|g| parse_bus_id(&g.pci_bus_id) == Some(want))
            .ok_or(NOT_FOUND)?;
        put(dev, handle(i))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(dev: nvmlDevice_t, index: *mut c_uint) -> Ret {
    with_cfg(|c| put(index, gpu_index(dev, c)? as c_uint))
}

// --- identity ---------------------------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    dev: nvmlDevice_t,
    buf: *mut c_char,
    len: c_uint,
) -> Ret {
    with_gpu(dev, |g| put_str(buf, len, &g.uuid))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    dev: nvmlDevice_t,
    buf: *mut c_char,
    len: c_uint,
) -> Ret {
    with_gpu(dev, |g| put_str(buf, len, &g.name))
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
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    dev: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> Ret {
    with_gpu(dev, |g| {
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
    with_gpu(dev, |g| {
        if mem.is_null() {
            return Err(INVALID);
        }
        // SAFETY: `mem` is non-null and points at an `nvmlMemory_v2_t` whose `version` the caller
        // set (NVML contract).
        let version = unsafe { (*mem).version };
        put(
            mem,
            nvmlMemory_v2_t {
                version,
                total: g.memory_total_bytes,
                reserved: g.memory_reserved_bytes,
                free: g
                    .memory_total_bytes
                    .saturating_sub(g.memory_reserved_bytes + g.memory_used_bytes),
                used: g.memory_used_bytes,
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

// --- events -----------------------------------------------------------------------------------

/// The event types the fake can deliver.
const SUPPORTED_EVENTS: u64 = nvmlEventTypeXidCriticalError as u64;

fn lock_sets() -> std::sync::MutexGuard<'static, Vec<Option<Registrations>>> {
    EVENT_SETS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn set_slot(set: nvmlEventSet_t) -> Result<usize, Ret> {
    (set as usize).checked_sub(1).ok_or(INVALID)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    dev: nvmlDevice_t,
    types: *mut c_ulonglong,
) -> Ret {
    with_gpu(dev, |_| put(types, SUPPORTED_EVENTS))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> Ret {
    with_cfg(|_| {
        let mut sets = lock_sets();
        sets.push(Some(Vec::new()));
        put(set, std::ptr::without_provenance_mut(sets.len()))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    dev: nvmlDevice_t,
    types: c_ulonglong,
    set: nvmlEventSet_t,
) -> Ret {
    with_cfg(|c| {
        let i = gpu_index(dev, c)?;
        if types & !SUPPORTED_EVENTS != 0 {
            return Err(NOT_SUPPORTED);
        }
        let slot = set_slot(set)?;
        match lock_sets().get_mut(slot) {
            Some(Some(regs)) => {
                regs.push((i, types));
                Ok(())
            }
            _ => Err(INVALID),
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetFree(set: nvmlEventSet_t) -> Ret {
    let Ok(slot) = set_slot(set) else {
        return INVALID;
    };
    match lock_sets().get_mut(slot) {
        Some(s @ Some(_)) => {
            *s = None;
            OK
        }
        _ => INVALID,
    }
}

/// Pops the oldest queued XID of a GPU registered in `regs`, writing the state back.
fn pop_xid(regs: &[(usize, u64)]) -> Result<Option<(usize, u64)>, Ret> {
    let (path, cfg) = load()?;
    let queued = |cfg: &FakeConfig| {
        regs.iter().find_map(|&(i, types)| {
            (types & SUPPORTED_EVENTS != 0
                && cfg.gpus.get(i).is_some_and(|g| !g.xid_events.is_empty()))
            .then_some(i)
        })
    };
    // Poll without the lock; take it only when there is something to pop.
    if queued(&cfg).is_none() {
        return Ok(None);
    }
    state::update(&path, |cfg| {
        queued(cfg).map(|i| (i, cfg.gpus[i].xid_events.remove(0)))
    })
    .map_err(|_| UNKNOWN)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeout_ms: c_uint,
) -> Ret {
    if INIT_COUNT.load(Ordering::SeqCst) == 0 {
        return UNINIT;
    }
    let deadline = Instant::now() + Duration::from_millis(u64::from(timeout_ms));
    loop {
        let regs = match set_slot(set).map(|s| lock_sets().get(s).cloned()) {
            Ok(Some(Some(regs))) => regs,
            _ => return INVALID,
        };
        match pop_xid(&regs) {
            Err(e) => return e,
            Ok(Some((i, xid))) => {
                return status(put(
                    data,
                    nvmlEventData_t {
                        device: handle(i),
                        eventType: SUPPORTED_EVENTS,
                        eventData: xid,
                        gpuInstanceId: u32::MAX,
                        computeInstanceId: u32::MAX,
                    },
                ));
            }
            Ok(None) => {}
        }
        let now = Instant::now();
        if now >= deadline {
            return TIMEOUT;
        }
        std::thread::sleep((deadline - now).min(Duration::from_millis(20)));
    }
}
