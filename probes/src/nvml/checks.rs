//! The per-GPU checks of `diag.nvml`, each from one NVML query (named in its doc line).

use nvml_wrapper::Device;
use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::enum_wrappers::device::{
    EccCounter, MemoryError, TemperatureSensor, TemperatureThreshold,
};
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::error::NvmlError as WrapperError;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::sys_exports::field_id::*;
use serde_json::json;

use super::busid::PciAddr;
use super::diag::{Check, CheckStatus, ExpectedGpus, GpuReport, worst};
use super::kmsg::{KmsgEvent, active_xids};
use super::xid::{self, RecommendedAction, XidClass};

/// A GPU within this many °C of its slowdown threshold is a warning.
pub const TEMPERATURE_MARGIN_C: u32 = 5;
pub use super::nvlink::NVLINK_MAX_LINKS;
/// `NVML_DEVICE_MIG_ENABLE` (`nvml.h`): the MIG mode value "enabled".
pub const MIG_ENABLE: u32 = 1;

/// Field values (`nvmlDeviceGetFieldValues`) as `u64`, `None` where unsupported or failed.
pub(crate) fn field_u64s(dev: &Device, ids: &[u32]) -> Vec<Option<u64>> {
    let fids: Vec<FieldId> = ids.iter().map(|i| FieldId(*i)).collect();
    match dev.field_values_for(&fids) {
        Ok(samples) => samples
            .into_iter()
            .map(|s| {
                s.ok().and_then(|s| s.value.ok()).and_then(|v| match v {
                    SampleValue::U32(x) => Some(u64::from(x)),
                    SampleValue::U64(x) => Some(x),
                    SampleValue::I64(x) => u64::try_from(x).ok(),
                    SampleValue::F64(x) => (x >= 0.0).then_some(x as u64),
                })
            })
            .collect(),
        Err(_) => vec![None; ids.len()],
    }
}

/// The check for a query that failed: not supported passes, a lost GPU fails with a reboot,
/// anything else warns.
pub(crate) fn query_failed(name: &str, e: &WrapperError) -> Check {
    match e {
        WrapperError::NotSupported => Check::pass(name, "notSupported"),
        WrapperError::GpuLost => Check::fail(name, "gpuLost", RecommendedAction::RebootNode)
            .detail("GPU has fallen off the bus"),
        other => Check::warn(name, "queryFailed").detail(other.to_string()),
    }
}

/// Runs every check on `dev`; `nvlinks` is the hardware profile's `expectedNvlinksPerGpu`.
pub(crate) fn gpu_checks(
    dev: &Device,
    index: u32,
    events: &Result<Vec<KmsgEvent>, String>,
    expected: Option<&ExpectedGpus>,
    nvlinks: Option<u32>,
) -> GpuReport {
    let uuid = super::nvml_string(dev.uuid().unwrap_or_default());
    let name = super::nvml_string(dev.name().unwrap_or_default());
    let addr = dev.pci_info().ok().and_then(|p| PciAddr::parse(&p.bus_id));
    let pci_bus_id = addr.map(PciAddr::to_bus_id).unwrap_or_default();

    let mut checks = vec![present(&uuid, &name, expected)];
    checks.push(volatile_ecc(dev));
    checks.extend(retired_and_remapped(dev));
    checks.push(temperature(dev));
    checks.push(power(dev));
    checks.push(throttle(dev));
    checks.push(pcie(dev));
    checks.push(super::nvlink::check(dev, &name, nvlinks));
    checks.push(super::nvlink::errors(dev));
    checks.push(fabric(dev));
    checks.push(mig(dev));
    checks.push(recovery_action(dev));
    checks.push(xids(addr, events));

    let (verdict, action) = worst(checks.iter());
    GpuReport {
        index,
        uuid,
        pci_bus_id,
        name,
        checks,
        verdict,
        action,
    }
}

/// `present`: NVML opened the GPU; its name contains the profile's model.
fn present(uuid: &str, name: &str, expected: Option<&ExpectedGpus>) -> Check {
    match expected.and_then(|e| e.name.as_deref()) {
        Some(want) if !name.contains(want) => {
            Check::fail("present", name, RecommendedAction::Service)
                .threshold(want)
                .detail(format!("{uuid} is not a {want}"))
        }
        Some(want) => Check::pass("present", name).threshold(want),
        None => Check::pass("present", name),
    }
}

/// `volatileUncorrectedEcc` (`nvmlDeviceGetTotalEccErrors`): uncorrected errors since the last
/// reset fail; a reset clears them after the driver retired or remapped the memory.
fn volatile_ecc(dev: &Device) -> Check {
    const NAME: &str = "volatileUncorrectedEcc";
    match dev.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile) {
        Ok(n) => {
            let agg = dev
                .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Aggregate)
                .ok();
            let corr = dev
                .total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)
                .ok();
            let detail = format!(
                "aggregate uncorrected {}, volatile corrected {}",
                agg.map_or("?".into(), |v| v.to_string()),
                corr.map_or("?".into(), |v| v.to_string())
            );
            let c = if n > 0 {
                Check::fail(NAME, n, RecommendedAction::ResetGpu)
            } else {
                Check::pass(NAME, n)
            };
            c.threshold(0).unit("count").detail(detail)
        }
        Err(e) => query_failed(NAME, &e),
    }
}

/// `retiredPagesPending` (`nvmlDeviceGetRetiredPagesPendingStatus`, fields 29/30),
/// `remappedRowsPending` and `remappedRowsFailure` (fields 142-145).
fn retired_and_remapped(dev: &Device) -> Vec<Check> {
    let f = field_u64s(
        dev,
        &[
            NVML_FI_DEV_RETIRED_SBE,
            NVML_FI_DEV_RETIRED_DBE,
            NVML_FI_DEV_REMAPPED_COR,
            NVML_FI_DEV_REMAPPED_UNC,
            NVML_FI_DEV_REMAPPED_PENDING,
            NVML_FI_DEV_REMAPPED_FAILURE,
        ],
    );
    let n = |v: Option<u64>| v.map_or("?".into(), |v| v.to_string());
    let retired_detail = format!(
        "retired pages: {} single-bit, {} double-bit",
        n(f[0]),
        n(f[1])
    );
    let retired = match dev.are_pages_pending_retired() {
        Ok(true) => Check::fail("retiredPagesPending", true, RecommendedAction::ResetGpu)
            .detail(retired_detail),
        Ok(false) => Check::pass("retiredPagesPending", false).detail(retired_detail),
        Err(e) => query_failed("retiredPagesPending", &e),
    };
    let remap_detail = format!(
        "remapped rows: {} correctable, {} uncorrectable",
        n(f[2]),
        n(f[3])
    );
    let pending = match f[4] {
        Some(0) => Check::pass("remappedRowsPending", false),
        Some(_) => Check::fail("remappedRowsPending", true, RecommendedAction::ResetGpu),
        None => Check::pass("remappedRowsPending", "notSupported"),
    }
    .detail(remap_detail.clone());
    let failure = match f[5] {
        Some(0) => Check::pass("remappedRowsFailure", false),
        Some(_) => Check::fail("remappedRowsFailure", true, RecommendedAction::Service)
            .detail(format!("{remap_detail}; no spare rows left")),
        None => Check::pass("remappedRowsFailure", "notSupported"),
    };
    vec![retired, pending, failure]
}

/// `temperature` (`nvmlDeviceGetTemperature`) against `NVML_TEMPERATURE_THRESHOLD_SLOWDOWN`:
/// at or above fails, within [`TEMPERATURE_MARGIN_C`] warns.
fn temperature(dev: &Device) -> Check {
    const NAME: &str = "temperature";
    let t = match dev.temperature(TemperatureSensor::Gpu) {
        Ok(t) => t,
        Err(e) => return query_failed(NAME, &e),
    };
    match dev.temperature_threshold(TemperatureThreshold::Slowdown) {
        Ok(slow) => {
            let c = if t >= slow {
                Check::fail(NAME, t, RecommendedAction::Service).detail("at the slowdown threshold")
            } else if t + TEMPERATURE_MARGIN_C >= slow {
                Check::warn(NAME, t).detail("near the slowdown threshold")
            } else {
                Check::pass(NAME, t)
            };
            c.threshold(slow).unit("C")
        }
        Err(_) => Check::pass(NAME, t).unit("C"),
    }
}

/// `power` (`nvmlDeviceGetPowerUsage`) against `nvmlDeviceGetEnforcedPowerLimit`, in W.
fn power(dev: &Device) -> Check {
    const NAME: &str = "power";
    let w = |mw: u32| f64::from(mw) / 1000.0;
    match (dev.power_usage(), dev.enforced_power_limit()) {
        (Ok(u), Ok(l)) if u > l => Check::warn(NAME, w(u))
            .threshold(w(l))
            .unit("W")
            .detail("drawing more than the enforced limit"),
        (Ok(u), Ok(l)) => Check::pass(NAME, w(u)).threshold(w(l)).unit("W"),
        (Ok(u), Err(_)) => Check::pass(NAME, w(u)).unit("W"),
        (Err(e), _) => query_failed(NAME, &e),
    }
}

/// `throttleReasons` (`nvmlDeviceGetCurrentClocksThrottleReasons`): HW thermal slowdown fails,
/// HW slowdown and power-brake slowdown warn.
fn throttle(dev: &Device) -> Check {
    const NAME: &str = "throttleReasons";
    let r = match dev.current_throttle_reasons() {
        Ok(r) => r,
        Err(e) => return query_failed(NAME, &e),
    };
    let names: Vec<&str> = [
        (ThrottleReasons::HW_SLOWDOWN, "hwSlowdown"),
        (ThrottleReasons::HW_THERMAL_SLOWDOWN, "hwThermalSlowdown"),
        (
            ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN,
            "hwPowerBrakeSlowdown",
        ),
        (ThrottleReasons::SW_THERMAL_SLOWDOWN, "swThermalSlowdown"),
        (ThrottleReasons::SW_POWER_CAP, "swPowerCap"),
    ]
    .into_iter()
    .filter(|(bit, _)| r.contains(*bit))
    .map(|(_, n)| n)
    .collect();
    let status = if r.contains(ThrottleReasons::HW_THERMAL_SLOWDOWN) {
        CheckStatus::Fail
    } else if r.intersects(ThrottleReasons::HW_SLOWDOWN | ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN)
    {
        CheckStatus::Warn
    } else {
        CheckStatus::Pass
    };
    Check::with_status(NAME, status, json!(names), RecommendedAction::Service)
}

/// `pcieLink` (`nvmlDeviceGet{Curr,Max}PcieLink{Generation,Width}`): below the maximum warns
/// (idle GPUs may train down to save power; a narrow link is worth a look).
fn pcie(dev: &Device) -> Check {
    const NAME: &str = "pcieLink";
    let q = (
        dev.current_pcie_link_gen(),
        dev.max_pcie_link_gen(),
        dev.current_pcie_link_width(),
        dev.max_pcie_link_width(),
    );
    match q {
        (Ok(g), Ok(mg), Ok(w), Ok(mw)) => {
            let value = format!("Gen{g} x{w}");
            let threshold = format!("Gen{mg} x{mw}");
            if g < mg || w < mw {
                Check::warn(NAME, value)
                    .threshold(threshold)
                    .detail("link below its maximum")
            } else {
                Check::pass(NAME, value).threshold(threshold)
            }
        }
        (Err(e), ..) | (_, Err(e), ..) | (_, _, Err(e), _) | (.., Err(e)) => query_failed(NAME, &e),
    }
}

/// `fabric` (`nvmlDeviceGetGpuFabricInfoV`, see [`super::fabric`]): on an NVSwitch system the
/// GPU must be registered with the NVLink fabric, or every CUDA program fails with error 802.
/// Not registered yet (`notStarted`, `inProgress`) or registered with a failure fails, with
/// what to do about the fabric manager; a GPU without a fabric passes (`notSupported`).
fn fabric(dev: &Device) -> Check {
    const NAME: &str = "fabric";
    const FM: &str = "nvidia-fabricmanager (GB200: nvidia-imex and the NVLink subnet manager)";
    let f = match super::fabric::fabric_info(dev) {
        Ok(Some(f)) => f,
        Ok(None) => return Check::pass(NAME, "notSupported"),
        Err(e) => return query_failed(NAME, &e),
    };
    let value = f.state.clone();
    match (f.state.as_str(), &f.status) {
        ("completed", None) => Check::pass(NAME, value).detail(format!(
            "clique {}, cluster {}",
            f.clique_id.map_or("?".into(), |c| c.to_string()),
            f.cluster_uuid.as_deref().unwrap_or("?")
        )),
        ("completed", Some(status)) => Check::fail(NAME, value, RecommendedAction::Service)
            .threshold("completed")
            .detail(format!(
                "the fabric manager registered the GPU with a failure ({status}): CUDA programs \
                 fail with error 802; read {FM}'s log, fix its configuration and restart it"
            )),
        ("notStarted", _) => Check::fail(NAME, value, RecommendedAction::Service)
            .threshold("completed")
            .detail(format!(
                "the GPU is not registered with the NVLink fabric: CUDA programs fail with error \
                 802; start {FM} (systemctl start nvidia-fabricmanager)"
            )),
        _ => Check::fail(NAME, value, RecommendedAction::Service)
            .threshold("completed")
            .detail(format!(
                "the GPU's registration with the NVLink fabric has not completed: CUDA programs \
                 fail with error 802 until it does; if it stays so, check {FM}"
            )),
    }
}

/// `recoveryAction` (field 230, `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`, R550+ drivers).
fn recovery_action(dev: &Device) -> Check {
    const NAME: &str = "recoveryAction";
    match field_u64s(dev, &[NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])[0] {
        None => Check::pass(NAME, "notSupported"),
        Some(0) => Check::pass(NAME, "none"),
        Some(v) => Check::fail(
            NAME,
            xid::recovery_action_name(v),
            RecommendedAction::from_nvml_recovery_action(v),
        )
        .threshold("none")
        .detail(format!(
            "the driver announces: {} (field 230 = {v})",
            xid::recovery_action_description(v)
        )),
    }
}

/// `migMode` (`nvmlDeviceGetMigMode`, `nvmlDeviceGetMigDeviceHandleByIndex`): MIG on or off and
/// its MIG devices. The other checks run on the parent GPU either way (NVML answers ECC, thermal,
/// power, PCIe and NVLink queries for the physical GPU). A mode change waiting for a GPU reset
/// warns.
fn mig(dev: &Device) -> Check {
    const NAME: &str = "migMode";
    let mode = match dev.mig_mode() {
        Ok(m) => m,
        // Drivers older than MIG (before R450) do not export the function at all.
        Err(WrapperError::FailedToLoadSymbol(_)) => return Check::pass(NAME, "notSupported"),
        Err(e) => return query_failed(NAME, &e),
    };
    let on = |v: u32| v == MIG_ENABLE;
    let value = if on(mode.current) {
        "enabled"
    } else {
        "disabled"
    };
    if mode.pending != mode.current {
        Check::warn(NAME, value).detail(format!(
            "MIG mode {} after the next GPU reset",
            if on(mode.pending) {
                "enabled"
            } else {
                "disabled"
            }
        ))
    } else if on(mode.current) {
        let devices = super::mig_devices(dev).len();
        Check::pass(NAME, value).detail(format!("{devices} MIG devices"))
    } else {
        Check::pass(NAME, value)
    }
}

/// `xids`: XIDs in the kernel log since boot, less those a later `gpu.reset` cleared, judged by
/// the catalog ([`XidClass`]).
fn xids(addr: Option<PciAddr>, events: &Result<Vec<KmsgEvent>, String>) -> Check {
    const NAME: &str = "xids";
    let (events, addr) = match (events, addr) {
        (Err(e), _) => {
            return Check::warn(NAME, "unknown").detail(format!("cannot read kernel log: {e}"));
        }
        (_, None) => return Check::warn(NAME, "unknown").detail("no PCI address"),
        (Ok(ev), Some(a)) => (ev, a),
    };
    let (active, cleared) = active_xids(events, addr);
    let mut status = CheckStatus::Pass;
    let mut action = RecommendedAction::None;
    let mut notes = Vec::new();
    // Each XID 154 replaces the recovery action the one before announced: the latest counts.
    let latest_154 = active
        .iter()
        .rposition(|x| x.xid == xid::RECOVERY_ACTION_CHANGED);
    for (i, x) in active.iter().enumerate() {
        let announced = (x.xid == xid::RECOVERY_ACTION_CHANGED)
            .then(|| xid::announced_recovery_action(&x.text))
            .flatten();
        if x.xid == xid::RECOVERY_ACTION_CHANGED && Some(i) != latest_154 {
            notes.push(format!("{} (superseded by a later 154)", x.xid));
            continue;
        }
        let (class, a, description) = xid::judge(x.xid, announced);
        let s = match class {
            XidClass::ResetRequired
            | XidClass::RebootRequired
            | XidClass::DrainP2pRequired
            | XidClass::ServiceRequired => CheckStatus::Fail,
            XidClass::ApplicationFault | XidClass::Unknown => CheckStatus::Warn,
            XidClass::Informational => CheckStatus::Pass,
        };
        status = status.max(s);
        action = action.max(a);
        let origin = if x.driver_message {
            ", the driver's message without an Xid line"
        } else {
            ""
        };
        notes.push(match description {
            Some(d) => format!("{} ({d}{origin})", x.xid),
            None => x.xid.to_string(),
        });
    }
    let xs: Vec<u64> = active.iter().map(|x| x.xid).collect();
    let mut c = Check::with_status(NAME, status, json!(xs), action);
    if !notes.is_empty() {
        c = c.detail(notes.join(", "));
    }
    if cleared > 0 {
        let d = format!("{cleared} earlier XID(s) cleared by gpu.reset");
        c.detail = Some(match c.detail.take() {
            Some(prev) => format!("{prev}; {d}"),
            None => d,
        });
    }
    c
}
