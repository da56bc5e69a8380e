//! The exported NVML C functions. Signatures, struct layouts and enum values come from
//! `nvml-wrapper-sys`'s bindings (generated from NVIDIA's `nvml.h`), so they match what
//! nvml-wrapper calls.
//!
//! Device handles are `index + 1` cast to a pointer, MIG device handles add `(mig index + 1) <<
//! 16` to their parent's, and event-set handles are `slot + 1`; none is ever dereferenced by
//! callers (NVML handles are opaque).
//!
//! Every function is `unsafe extern "C"`: its contract is NVML's own — each pointer argument is
//! null or valid for the write (or read) the NVML documentation describes, and string buffers hold
//! `length` bytes.
#![allow(clippy::missing_safety_doc, non_upper_case_globals, non_snake_case)]

use std::ffi::{CStr, c_char, c_int, c_uint};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

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
const GPU_IS_LOST: Ret = nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST;
/// Where a MIG device handle keeps its MIG index (plus one).
const MIG_SHIFT: usize = 16;

/// `nvmlInit` calls minus `nvmlShutdown` calls, as NVML counts them.
static INIT_COUNT: AtomicUsize = AtomicUsize::new(0);
/// Event sets: slot `i` is handle `i + 1`; each holds (GPU index, event mask) registrations.
/// (GPU index, event mask) pairs registered in one event set.
type Registrations = Vec<(usize, u64)>;

static EVENT_SETS: Mutex<Vec<Option<Registrations>>> = Mutex::new(Vec::new());
/// This copy of the library's config path, found once.
static CONFIG_PATH: OnceLock<PathBuf> = OnceLock::new();

/// The library file this code was loaded from.
fn own_image() -> Option<PathBuf> {
    let me: unsafe extern "C" fn() -> Ret = nvmlInit_v2;
    state::image_containing(me as usize)
}

/// This copy's config file, found once (a miss is not remembered: the file may appear later).
fn config_path() -> Result<PathBuf, state::StateError> {
    if let Some(p) = CONFIG_PATH.get() {
        return Ok(p.clone());
    }
    let p = state::config_path_beside(own_image().as_deref())?;
    Ok(CONFIG_PATH.get_or_init(|| p).clone())
}

fn load() -> Result<(PathBuf, FakeConfig), Ret> {
    let path = config_path().map_err(|_| UNKNOWN)?;
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

/// What a lost GPU answers: `NVML_ERROR_GPU_IS_LOST`, or `NVML_ERROR_UNKNOWN` as older drivers
/// say it.
fn lost(g: &FakeGpu) -> Ret {
    match g.lost_error {
        crate::config::LostError::GpuIsLost => GPU_IS_LOST,
        crate::config::LostError::Unknown => UNKNOWN,
    }
}

/// Runs `f` on the GPU behind `device`; a lost GPU answers [`lost`].
fn with_gpu(device: nvmlDevice_t, f: impl FnOnce(&FakeGpu) -> Result<(), Ret>) -> Ret {
    with_cfg(|cfg| {
        let g = &cfg.gpus[gpu_index(device, cfg)?];
        if g.lost {
            return Err(lost(g));
        }
        f(g)
    })
}

/// What a device handle names: a GPU, or one of its MIG devices.
pub(crate) enum Target<'a> {
    /// A physical GPU and its index.
    Gpu(usize, &'a FakeGpu),
    /// A MIG device: parent index, parent, the device.
    Mig(usize, &'a FakeGpu, &'a crate::config::FakeMigDevice),
}

/// Decodes a GPU or MIG device handle. A MIG handle is valid while its GPU is in MIG mode.
pub(crate) fn target(device: nvmlDevice_t, cfg: &FakeConfig) -> Result<Target<'_>, Ret> {
    let h = device as usize;
    let i = (h & ((1 << MIG_SHIFT) - 1)).checked_sub(1).ok_or(INVALID)?;
    let g = cfg.gpus.get(i).ok_or(INVALID)?;
    if g.lost {
        return Err(lost(g));
    }
    match (h >> MIG_SHIFT).checked_sub(1) {
        None => Ok(Target::Gpu(i, g)),
        Some(m) => match g.mig_devices.get(m) {
            Some(d) if g.mig_mode == Some(true) => Ok(Target::Mig(i, g, d)),
            _ => Err(INVALID),
        },
    }
}

/// Runs `f` on what `device` names (a GPU or a MIG device).
fn with_target(device: nvmlDevice_t, f: impl FnOnce(Target<'_>) -> Result<(), Ret>) -> Ret {
    with_cfg(|cfg| f(target(device, cfg)?))
}

/// The handle of MIG device `mig` of GPU `index`.
fn mig_handle(index: usize, mig: usize) -> nvmlDevice_t {
    std::ptr::without_provenance_mut((index + 1) | ((mig + 1) << MIG_SHIFT))
}

/// Runs `f` on the GPU behind `device` and writes the change back.
fn update_gpu(device: nvmlDevice_t, f: impl FnOnce(&mut FakeGpu) -> Result<(), Ret>) -> Ret {
    if INIT_COUNT.load(Ordering::SeqCst) == 0 {
        return UNINIT;
    }
    let Ok(path) = config_path() else {
        return UNKNOWN;
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
    config_path().is_ok_and(|path| {
        state::update(&path, |c| {
            c.nvml_clients = c.nvml_clients.saturating_add_signed(delta);
        })
        .is_ok()
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInit_v2() -> Ret {
    match load() {
        Err(e) => {
            // The caller only sees "Unknown Error"; say which file is missing or broken.
            if let Err(why) = config_path().and_then(|p| state::load(&p).map(|_| ())) {
                eprintln!("fake-nvml: {why}");
            }
            e
        }
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
        GPU_IS_LOST => c"GPU is lost",
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
    with_cfg(|c| match c.gpus.get(index as usize) {
        Some(g) if g.lost => Err(lost(g)),
        Some(_) => put(dev, handle(index as usize)),
        None => Err(INVALID),
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
        if c.gpus[i].lost {
            return Err(lost(&c.gpus[i]));
        }
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
        if c.gpus[i].lost {
            return Err(lost(&c.gpus[i]));
        }
        put(dev, handle(i))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(dev: nvmlDevice_t, index: *mut c_uint) -> Ret {
    with_cfg(|c| put(index, gpu_index(dev, c)? as c_uint))
}

mod device;
mod events;
mod mig;
