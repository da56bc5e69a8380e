//! `diag.nvml`: health checks per GPU, a verdict per GPU and per node, and the recommended action.
//!
//! Every check reports its status (pass / warn / fail), its value and, where there is one, the
//! threshold it was held against. The checks themselves run in `bcd-probes` (`nvml::diag`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::xid::RecommendedAction;

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

impl CheckStatus {
    /// The camelCase spelling (`pass`), as in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pass => "pass",
            Self::Warn => "warn",
            Self::Fail => "fail",
        }
    }
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

/// The worst status and strongest action among `checks`.
pub fn worst<'a>(checks: impl Iterator<Item = &'a Check>) -> (CheckStatus, RecommendedAction) {
    checks.fold((CheckStatus::Pass, RecommendedAction::None), |(s, a), c| {
        (s.max(c.status), a.max(c.action))
    })
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

/// The arguments of the `diag.nvml` command: `{"expectedGpus": {"count": 8, "name": "H100"},
/// "expectedNvlinksPerGpu": 12}` (both optional; from the pool's hardware profile).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiagArgs {
    /// What the node should have.
    #[serde(default)]
    pub expected_gpus: Option<ExpectedGpus>,
    /// Active NVLink links each GPU should have, overriding bcd's table by product (0: NVLink is
    /// not expected at all). Absent: the table decides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_nvlinks_per_gpu: Option<u32>,
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

/// The result of `diag.nvml` (camelCase JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiagReport {
    /// NVML loaded and initialized. A report without NVML says nothing about GPU health.
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
