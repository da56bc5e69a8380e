//! MIG: the mode of a GPU and the handles of its MIG devices (`nvml.h`, "Multi Instance GPU
//! Management"; what nvml-wrapper's `Device::mig_mode`, `mig_device_count`,
//! `mig_device_by_index`, `mig_is_mig_device_handle` and `mig_parent_device` call).

use std::ffi::c_uint;

use nvml_wrapper_sys::bindings::*;

use super::*;
use crate::config::MAX_MIG_DEVICES;

/// `NVML_DEVICE_MIG_ENABLE` / `NVML_DEVICE_MIG_DISABLE`.
fn mig_value(on: bool) -> c_uint {
    if on {
        NVML_DEVICE_MIG_ENABLE
    } else {
        NVML_DEVICE_MIG_DISABLE
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    dev: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> Ret {
    with_target(dev, |t| match t {
        Target::Gpu(_, g) => {
            let on = g.mig_mode.ok_or(NOT_SUPPORTED)?;
            put(current, mig_value(on))?;
            put(pending, mig_value(g.mig_mode_pending.unwrap_or(on)))
        }
        Target::Mig(..) => Err(INVALID),
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    dev: nvmlDevice_t,
    count: *mut c_uint,
) -> Ret {
    with_target(dev, |t| match t {
        Target::Gpu(_, g) if g.mig_mode.is_some() => put(
            count,
            MAX_MIG_DEVICES.max(u32::try_from(g.mig_devices.len()).unwrap_or(u32::MAX)),
        ),
        Target::Gpu(..) => Err(NOT_SUPPORTED),
        Target::Mig(..) => Err(INVALID),
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    dev: nvmlDevice_t,
    index: c_uint,
    mig: *mut nvmlDevice_t,
) -> Ret {
    with_target(dev, |t| {
        let Target::Gpu(i, g) = t else {
            return Err(INVALID);
        };
        let on = g.mig_mode.ok_or(NOT_SUPPORTED)?;
        let m = index as usize;
        if m >= (MAX_MIG_DEVICES as usize).max(g.mig_devices.len()) {
            return Err(INVALID);
        }
        // No MIG device at this index (MIG off, or an index no instance uses).
        if !on || m >= g.mig_devices.len() {
            return Err(NOT_FOUND);
        }
        put(mig, mig_handle(i, m))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(
    dev: nvmlDevice_t,
    is_mig: *mut c_uint,
) -> Ret {
    with_target(dev, |t| {
        put(is_mig, c_uint::from(matches!(t, Target::Mig(..))))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    mig: nvmlDevice_t,
    parent: *mut nvmlDevice_t,
) -> Ret {
    with_target(mig, |t| match t {
        Target::Mig(i, ..) => put(parent, handle(i)),
        Target::Gpu(..) => Err(INVALID),
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(dev: nvmlDevice_t, id: *mut c_uint) -> Ret {
    with_target(dev, |t| match t {
        Target::Mig(.., m) => put(id, m.gpu_instance_id),
        Target::Gpu(..) => Err(NOT_SUPPORTED),
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(dev: nvmlDevice_t, id: *mut c_uint) -> Ret {
    with_target(dev, |t| match t {
        Target::Mig(.., m) => put(id, m.compute_instance_id),
        Target::Gpu(..) => Err(NOT_SUPPORTED),
    })
}
