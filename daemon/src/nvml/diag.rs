//! `diag.nvml`: health checks per GPU, a verdict per GPU and per node, and the recommended action.
//!
//! Every check reports its status (pass / warn / fail), its value and, where there is one, the
//! threshold it was held against. A check whose NVML query the GPU does not support passes with
//! the value `"notSupported"`. The per-GPU checks live in `checks.rs`.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::hostroot::HostRoot;

use super::busid::PciAddr;
use super::checks::gpu_checks;
use super::kmsg::{self, KmsgEvent};
use super::xid::RecommendedAction;
use super::{NvmlConfig, NvmlError, open};

/// A check's outcome, from best to worst (the derived order picks the worst of several).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum CheckStatus {
    /// Healthy.
    Pass,
    /// Worth a look; does not make the GPU unusable.
    Warn,
    /// Unhealthy: the control plane's Health controller turns this into a condition.
    Fail,
}

/// One check.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Check {
    /// camelCase check id, e.g. `volatileUncorrectedEcc`.
    pub name: String,
    /// Outcome.
    pub status: CheckStatus,
    /// What was measured (a number in `unit`, a string, a bool or a list).
    pub value: Value,
    /// What `value` was held against, when there is a threshold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold: Option<Value>,
    /// Unit of `value` and `threshold`: `C` (°C), `W`, `count`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    /// Explanation for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// What this check alone recommends.
    pub action: RecommendedAction,
}

impl Check {
    fn new(name: &str, status: CheckStatus, value: impl Into<Value>) -> Self {
        Self {
            name: name.to_owned(),
            status,
            value: value.into(),
            threshold: None,
            unit: None,
            detail: None,
            action: RecommendedAction::None,
        }
    }

    /// A passing check.
    pub fn pass(name: &str, value: impl Into<Value>) -> Self {
        Self::new(name, CheckStatus::Pass, value)
    }

    /// A warning.
    pub fn warn(name: &str, value: impl Into<Value>) -> Self {
        Self::new(name, CheckStatus::Warn, value)
    }

    /// A failure that calls for `action`.
    pub fn fail(name: &str, value: impl Into<Value>, action: RecommendedAction) -> Self {
        Self {
            action,
            ..Self::new(name, CheckStatus::Fail, value)
        }
    }

    /// Pass, warn or fail by `status` (`action` only applies to a failure).
    pub fn with_status(
        name: &str,
        status: CheckStatus,
        value: impl Into<Value>,
        action: RecommendedAction,
    ) -> Self {
        match status {
            CheckStatus::Fail => Self::fail(name, value, action),
            s => Self::new(name, s, value),
        }
    }

    /// Sets the threshold.
    pub fn threshold(mut self, t: impl Into<Value>) -> Self {
        self.threshold = Some(t.into());
        self
    }

    /// Sets the unit.
    pub fn unit(mut self, u: &str) -> Self {
        self.unit = Some(u.to_owned());
        self
    }

    /// Sets the detail.
    pub fn detail(mut self, d: impl Into<String>) -> Self {
        self.detail = Some(d.into());
        self
    }
}

/// What the pool's hardware profile says the node has.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExpectedGpus {
    /// Number of GPUs.
    pub count: u32,
    /// A substring every GPU's NVML name must contain, e.g. `H100`.
    #[serde(default)]
    pub name: Option<String>,
}

/// The arguments of the `diag.nvml` command: `{"expectedGpus": {"count": 8, "name": "H100"}}`
/// (optional; from the pool's hardware profile).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiagArgs {
    /// What the node should have.
    #[serde(default)]
    pub expected_gpus: Option<ExpectedGpus>,
}

/// One GPU's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuReport {
    /// NVML index.
    pub index: u32,
    /// `GPU-...`, empty when NVML could not say.
    pub uuid: String,
    /// `0000:1a:00.0`.
    pub pci_bus_id: String,
    /// Product name.
    pub name: String,
    /// Every check, in a fixed order.
    pub checks: Vec<Check>,
    /// The worst check status.
    pub verdict: CheckStatus,
    /// The strongest action the checks call for.
    pub action: RecommendedAction,
}

/// The result of `diag.nvml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiagReport {
    /// NVML loaded and initialized.
    pub nvml_available: bool,
    /// `NVML unavailable: <reason>` when it did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable_reason: Option<String>,
    /// `nvmlSystemGetDriverVersion`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    /// `nvmlSystemGetNVMLVersion`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvml_version: Option<String>,
    /// Node-wide checks: `nvml`, `driverVersion`, `nvmlVersion`, `gpuCount`.
    pub node_checks: Vec<Check>,
    /// Per GPU, in NVML index order.
    pub gpus: Vec<GpuReport>,
    /// The worst status of all checks.
    pub verdict: CheckStatus,
    /// The strongest action of all checks.
    pub action: RecommendedAction,
    /// One line for people.
    pub summary: String,
}

impl DiagReport {
    fn finish(mut self) -> Self {
        let all = self
            .node_checks
            .iter()
            .chain(self.gpus.iter().flat_map(|g| g.checks.iter()));
        let (verdict, action) = worst(all);
        self.verdict = verdict;
        self.action = action;
        if self.summary.is_empty() {
            let failing: Vec<String> = self
                .node_checks
                .iter()
                .filter(|c| c.status == CheckStatus::Fail)
                .map(|c| c.name.clone())
                .chain(self.gpus.iter().flat_map(|g| {
                    g.checks
                        .iter()
                        .filter(|c| c.status == CheckStatus::Fail)
                        .map(move |c| format!("GPU {} {}: {}", g.index, g.pci_bus_id, c.name))
                }))
                .collect();
            let status = serde_json::to_value(verdict)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            let action = serde_json::to_value(action)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            self.summary = format!("{} GPUs: {status}; action: {action}", self.gpus.len());
            if !failing.is_empty() {
                self.summary
                    .push_str(&format!("; failing: {}", failing.join(", ")));
            }
        }
        self
    }
}

/// The worst status and strongest action among `checks`.
pub fn worst<'a>(checks: impl Iterator<Item = &'a Check>) -> (CheckStatus, RecommendedAction) {
    checks.fold((CheckStatus::Pass, RecommendedAction::None), |(s, a), c| {
        (s.max(c.status), a.max(c.action))
    })
}

/// Runs every check. Never fails: an unusable NVML is itself a result ("NVML unavailable").
/// `expected` comes from the pool's hardware profile; `root` is where `/dev/kmsg` is read.
/// Blocks (NVML calls).
pub fn diag(cfg: &NvmlConfig, expected: Option<&ExpectedGpus>, root: &HostRoot) -> DiagReport {
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
            return report.finish();
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
            return report.finish();
        }
    };
    let mut seen = Vec::new();
    let mut unopened = Vec::new();
    for index in 0..count {
        let g = match nvml.device_by_index(index) {
            Ok(dev) => gpu_checks(&dev, index, &events, expected),
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
    report.finish()
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
