//! A GPU's registration with the NVLink fabric (`nvmlDeviceGetGpuFabricInfoV`, Hopper and later
//! on NVSwitch systems: HGX H100/H200/B200, GB200 NVL).
//!
//! On such systems the fabric manager (`nvidia-fabricmanager`, or the NVLink subnet manager on
//! GB200) registers every GPU with the NVSwitch fabric. Until it has (state not `completed`), or
//! when it failed (a status other than success), every CUDA program on the node fails with error
//! 802 ("system not yet initialized") although every other health counter is fine
//! (NVIDIA/gpu-operator#2511). So `diag.nvml` checks it, and the inventory shows the GPU's
//! clique (the GPUs that reach each other over NVLink) and the fabric's cluster UUID.
//!
//! nvml-wrapper does not wrap this call: it is made here through the library's symbol table,
//! the one `unsafe` of the NVML module.
#![allow(unsafe_code)]

use nvml_wrapper::Device;
use nvml_wrapper::error::{NvmlError as WrapperError, nvml_try};
use nvml_wrapper_sys::bindings::{
    NVML_GPU_FABRIC_STATE_COMPLETED, NVML_GPU_FABRIC_STATE_IN_PROGRESS,
    NVML_GPU_FABRIC_STATE_NOT_STARTED, NVML_GPU_FABRIC_STATE_NOT_SUPPORTED, nvmlGpuFabricInfo_t,
    nvmlGpuFabricInfoV_t, nvmlReturn_enum_NVML_SUCCESS,
};

pub use bc_protocol::inventory::GpuFabric;

/// `NVML_STRUCT_VERSION(GpuFabricInfo, 3)`: the struct's size, the version in the top byte.
fn struct_version() -> u32 {
    let size = u32::try_from(std::mem::size_of::<nvmlGpuFabricInfoV_t>()).unwrap_or(0);
    size | (3 << 24)
}

/// The spelling of an `nvmlGpuFabricState_t`.
pub fn state_name(state: u8) -> String {
    match u32::from(state) {
        NVML_GPU_FABRIC_STATE_NOT_SUPPORTED => "notSupported".into(),
        NVML_GPU_FABRIC_STATE_NOT_STARTED => "notStarted".into(),
        NVML_GPU_FABRIC_STATE_IN_PROGRESS => "inProgress".into(),
        NVML_GPU_FABRIC_STATE_COMPLETED => "completed".into(),
        other => format!("unknown ({other})"),
    }
}

/// The GPU's fabric registration; `Ok(None)` where the GPU or driver has none (no NVSwitch
/// fabric, a GPU before Hopper, a driver before the call existed: `NOT_SUPPORTED`, a missing
/// symbol, or the state `notSupported`).
pub fn fabric_info(dev: &Device<'_>) -> Result<Option<GpuFabric>, WrapperError> {
    let lib = dev.nvml().lib();
    // SAFETY: `handle()` is the live handle of `dev`, which borrows the initialized `Nvml` whose
    // library `lib` is; the handle is only passed back to that library.
    let handle = unsafe { dev.handle() };
    let raw = match &lib.nvmlDeviceGetGpuFabricInfoV {
        Ok(f) => {
            // SAFETY: all-zero is a valid value of this plain C struct (integers and a byte
            // array).
            let mut info: nvmlGpuFabricInfoV_t = unsafe { std::mem::zeroed() };
            info.version = struct_version();
            // SAFETY: `f` is NVML's `nvmlDeviceGetGpuFabricInfoV`; `info` is a valid, versioned
            // struct the call writes, alive for the call.
            let ret = unsafe { f(handle, &mut info) };
            with_not_supported(nvml_try(ret))?
                .map(|()| (info.state, info.status, info.cliqueId, info.clusterUuid))
        }
        Err(_) => match &lib.nvmlDeviceGetGpuFabricInfo {
            Ok(f) => {
                // SAFETY: as above; the unversioned struct of the older call.
                let mut info: nvmlGpuFabricInfo_t = unsafe { std::mem::zeroed() };
                // SAFETY: `f` is NVML's `nvmlDeviceGetGpuFabricInfo`, `info` a valid struct.
                let ret = unsafe { f(handle, &mut info) };
                with_not_supported(nvml_try(ret))?
                    .map(|()| (info.state, info.status, info.cliqueId, info.clusterUuid))
            }
            Err(_) => None,
        },
    };
    let Some((state, status, clique, uuid)) = raw else {
        return Ok(None);
    };
    if u32::from(state) == NVML_GPU_FABRIC_STATE_NOT_SUPPORTED {
        return Ok(None);
    }
    let completed = u32::from(state) == NVML_GPU_FABRIC_STATE_COMPLETED;
    Ok(Some(GpuFabric {
        state: state_name(state),
        // The status is the registration's outcome, meaningful once it completed.
        status: (completed && status != nvmlReturn_enum_NVML_SUCCESS)
            .then(|| format!("{} (NVML status {status})", WrapperError::from(status))),
        clique_id: completed.then_some(clique),
        cluster_uuid: (completed && uuid.iter().any(|b| *b != 0)).then(|| format_uuid(&uuid)),
    }))
}

/// `Ok(None)` for `NOT_SUPPORTED`, else the result as it is.
fn with_not_supported(r: Result<(), WrapperError>) -> Result<Option<()>, WrapperError> {
    match r {
        Ok(()) => Ok(Some(())),
        Err(WrapperError::NotSupported) => Ok(None),
        Err(e) => Err(e),
    }
}

/// 16 bytes as `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
fn format_uuid(b: &[u8; 16]) -> String {
    let h = hex::encode(b);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_and_uuids_are_spelled_as_nvml_and_uuids_are() {
        assert_eq!(state_name(3), "completed");
        assert_eq!(state_name(2), "inProgress");
        assert_eq!(state_name(1), "notStarted");
        assert_eq!(state_name(9), "unknown (9)");
        let mut b = [0u8; 16];
        b[15] = 1;
        b[0] = 0xab;
        assert_eq!(format_uuid(&b), "ab000000-0000-0000-0000-000000000001");
        assert_eq!(struct_version() >> 24, 3);
    }
}
