//! `diag.nvml`: health checks per GPU, a verdict per GPU and per node, and the recommended action.
//!
//! Every check reports its status (pass / warn / fail), its value and, where there is one, the
//! threshold it was held against. A check whose NVML query the GPU does not support passes with
//! the value `"notSupported"`. The per-GPU checks live in `checks.rs`.

use serde_json::json;

use crate::hostroot::HostRoot;

use super::busid::PciAddr;
use super::checks::gpu_checks;
use super::kmsg::{self, KmsgEvent};
use super::{NvmlConfig, NvmlError, open};

pub use bc_protocol::commands::diag::{
    Check, CheckStatus, DiagArgs, DiagReport, ExpectedGpus, GpuReport, worst,
};
pub use bc_protocol::commands::xid::RecommendedAction;

/// Fills in the verdict, the action and (unless set) the summary of a report from its checks.
fn finish(mut report: DiagReport) -> DiagReport {
    let all = report
        .node_checks
        .iter()
        .chain(report.gpus.iter().flat_map(|g| g.checks.iter()));
    let (verdict, action) = worst(all);
    report.verdict = verdict;
    report.action = action;
    if report.summary.is_empty() {
        let failing: Vec<String> = report
            .node_checks
            .iter()
            .filter(|c| c.status == CheckStatus::Fail)
            .map(|c| c.name.clone())
            .chain(report.gpus.iter().flat_map(|g| {
                g.checks
                    .iter()
                    .filter(|c| c.status == CheckStatus::Fail)
                    .map(move |c| format!("GPU {} {}: {}", g.index, g.pci_bus_id, c.name))
            }))
            .collect();
        report.summary = format!(
            "{} GPUs: {}; action: {}",
            report.gpus.len(),
            verdict.as_str(),
            action.as_str()
        );
        if !failing.is_empty() {
            report
                .summary
                .push_str(&format!("; failing: {}", failing.join(", ")));
        }
    }
    report
}

/// Runs every check with only the expected GPUs given ([`diag_args`] with nothing else).
pub fn diag(cfg: &NvmlConfig, expected: Option<&ExpectedGpus>, root: &HostRoot) -> DiagReport {
    diag_args(
        cfg,
        &DiagArgs {
            expected_gpus: expected.cloned(),
            ..DiagArgs::default()
        },
        root,
    )
}

/// Runs every check. Never fails: an unusable NVML is itself a result ("NVML unavailable").
/// `args` come from the pool's hardware profile (expected GPUs, expected NVLink links per GPU);
/// `root` is where `/dev/kmsg` is read. Blocks (NVML calls).
pub fn diag_args(cfg: &NvmlConfig, args: &DiagArgs, root: &HostRoot) -> DiagReport {
    let expected = args.expected_gpus.as_ref();
    let mut report = DiagReport {
        nvml_available: false,
        unavailable_reason: None,
        driver_version: None,
        nvml_version: None,
        node_checks: Vec::new(),
        gpus: Vec::new(),
        verdict: CheckStatus::Pass,
        action: RecommendedAction::None,
        summary: String::new(),
    };
    let _gate = super::shared_access();
    let nvml = match open(cfg) {
        Ok(n) => n,
        Err(e) => {
            let reason = format!("NVML unavailable: {e}");
            let gpus_expected = expected.is_some_and(|x| x.count > 0);
            let check = match &e {
                NvmlError::LibraryNotFound { .. } if !gpus_expected => {
                    Check::warn("nvml", e.to_string())
                }
                _ => Check::fail("nvml", e.to_string(), e.action()),
            };
            report.node_checks.push(check.detail(reason.clone()));
            report.unavailable_reason = Some(reason.clone());
            report.summary = reason;
            return finish(report);
        }
    };
    report.nvml_available = true;
    report
        .node_checks
        .push(Check::pass("nvml", "initialized").detail(format!(
            "loaded {}",
            cfg.lib_path
                .as_deref()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| super::DEFAULT_LIB.to_owned())
        )));
    for (name, v) in [
        ("driverVersion", nvml.sys_driver_version()),
        ("nvmlVersion", nvml.sys_nvml_version()),
    ] {
        let check = match v {
            Ok(v) => {
                if name == "driverVersion" {
                    report.driver_version = Some(v.clone());
                } else {
                    report.nvml_version = Some(v.clone());
                }
                Check::pass(name, v)
            }
            Err(e) => Check::warn(name, "unknown").detail(e.to_string()),
        };
        report.node_checks.push(check);
    }

    let events = kmsg::read_since_boot(root).map_err(|e| e.to_string());
    let count = match nvml.device_count() {
        Ok(c) => c,
        Err(e) => {
            report.node_checks.push(Check::fail(
                "gpuCount",
                "unknown",
                RecommendedAction::Service,
            ));
            report.summary = format!("nvmlDeviceGetCount failed: {e}");
            return finish(report);
        }
    };
    let mut seen = Vec::new();
    let mut unopened = Vec::new();
    for index in 0..count {
        let g = match nvml.device_by_index(index) {
            Ok(dev) => gpu_checks(
                &dev,
                index,
                &events,
                expected,
                args.expected_nvlinks_per_gpu,
            ),
            Err(e) => {
                unopened.push(index);
                lost_gpu(index, &e)
            }
        };
        if let Some(a) = PciAddr::parse(&g.pci_bus_id) {
            seen.push(a);
        }
        report.gpus.push(g);
    }
    // NVML cannot say which GPU it failed to open; nvidia-smi and the host's PCI list can.
    let named = super::lost::name_unopened(&unopened, &seen, &cfg.nvidia_smi, root);
    for (index, found) in unopened.iter().zip(named) {
        let (Some((addr, how)), Some(g)) = (found, report.gpus.get_mut(*index as usize)) else {
            continue;
        };
        g.pci_bus_id = addr.to_bus_id();
        for c in &mut g.checks {
            c.detail = Some(format!(
                "{}; the GPU at {} ({how}){}",
                c.detail.take().unwrap_or_default(),
                g.pci_bus_id,
                if c.action == RecommendedAction::RebootNode {
                    ": reboot the node to recover it"
                } else {
                    ""
                }
            ));
        }
    }
    report
        .node_checks
        .push(count_check(count, expected, &events, &seen));
    finish(report)
}

/// A GPU NVML lists but cannot open.
fn lost_gpu(index: u32, e: &nvml_wrapper::error::NvmlError) -> GpuReport {
    let check = Check::fail("present", false, RecommendedAction::RebootNode)
        .detail(format!("nvmlDeviceGetHandleByIndex({index}): {e}"));
    GpuReport {
        index,
        uuid: String::new(),
        pci_bus_id: String::new(),
        name: String::new(),
        verdict: check.status,
        action: check.action,
        checks: vec![check],
    }
}

/// GPU count against the hardware profile. Fewer GPUs than expected after an XID 79 (fallen off
/// the bus) on an address NVML no longer lists is a reboot; the driver's own "fallen off the
/// bus" message counts as that XID (see [`super::kmsg`]). Otherwise a person must look.
fn count_check(
    count: u32,
    expected: Option<&ExpectedGpus>,
    events: &Result<Vec<KmsgEvent>, String>,
    seen: &[PciAddr],
) -> Check {
    let Some(exp) = expected else {
        return Check::pass("gpuCount", count).unit("count");
    };
    let check = if count < exp.count {
        let mut fell_off: Vec<String> = events
            .as_ref()
            .map(|ev| {
                ev.iter()
                    .filter_map(|e| match e {
                        KmsgEvent::Xid(x) if x.xid == 79 && !seen.contains(&x.addr) => {
                            Some(x.addr.to_bus_id())
                        }
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default();
        fell_off.sort();
        fell_off.dedup();
        if fell_off.is_empty() {
            Check::fail("gpuCount", count, RecommendedAction::Service)
                .detail(format!("{} GPU(s) missing", exp.count - count))
        } else {
            Check::fail("gpuCount", count, RecommendedAction::RebootNode).detail(format!(
                "fallen off the bus (Xid 79 or the driver's own message in the kernel log): {}",
                fell_off.join(", ")
            ))
        }
    } else if count > exp.count {
        Check::warn("gpuCount", count).detail("more GPUs than the hardware profile lists")
    } else {
        Check::pass("gpuCount", count)
    };
    check.threshold(json!(exp.count)).unit("count")
}
