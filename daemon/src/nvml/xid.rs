//! The XID catalog and the recommended actions bcd derives from it and from NVML's recovery
//! action (field 230, `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`).
//!
//! Classes follow NVIDIA's XID catalog ("XID Errors", GPU deployment and management
//! documentation) and its recovery-action table: the XIDs whose documented resolution is a GPU
//! reset, the one that needs a node reboot (79, fallen off the bus), the ones caused by the
//! application rather than the GPU, and the purely informational ones.

use serde::{Deserialize, Serialize};

/// What to do about a GPU or node, from least to most disruptive (the derived order is used to
/// pick the strongest action of several).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RecommendedAction {
    /// Nothing to do.
    None,
    /// Stop peer-to-peer (NVLink) traffic: drain the node's multi-GPU jobs.
    DrainP2p,
    /// Reset the GPU (`gpu.reset`).
    ResetGpu,
    /// Reboot the node.
    RebootNode,
    /// A person must look at the hardware or the driver installation.
    Service,
}

impl RecommendedAction {
    /// From NVML's `nvmlDeviceGpuRecoveryAction_t` (field 230): 0 none, 1 GPU reset, 2 node
    /// reboot, 3 drain P2P, 4 drain and reset (reset is the stronger half).
    pub fn from_nvml_recovery_action(v: u64) -> Self {
        match v {
            0 => Self::None,
            1 | 4 => Self::ResetGpu,
            2 => Self::RebootNode,
            3 => Self::DrainP2p,
            _ => Self::Service,
        }
    }
}

/// The name of an NVML recovery action value, as reported.
pub fn recovery_action_name(v: u64) -> &'static str {
    match v {
        0 => "none",
        1 => "gpuReset",
        2 => "nodeReboot",
        3 => "drainP2p",
        4 => "drainAndReset",
        _ => "unknown",
    }
}

/// How the catalog classes an XID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum XidClass {
    /// Resolved by a GPU reset: 62, 64, 95, 109, 119, 120, 136, 140, 143, 155.
    ResetRequired,
    /// Needs a node reboot: 79.
    RebootRequired,
    /// The application's fault, not the GPU's: 13, 31, 94.
    ApplicationFault,
    /// Informational: 43, 63, 92, 121.
    Informational,
    /// Not in bcd's catalog.
    Unknown,
}

impl XidClass {
    /// The catalog class of `xid`.
    pub fn of(xid: u64) -> Self {
        match xid {
            62 | 64 | 95 | 109 | 119 | 120 | 136 | 140 | 143 | 155 => Self::ResetRequired,
            79 => Self::RebootRequired,
            13 | 31 | 94 => Self::ApplicationFault,
            43 | 63 | 92 | 121 => Self::Informational,
            _ => Self::Unknown,
        }
    }

    /// The action this class calls for.
    pub fn action(self) -> RecommendedAction {
        match self {
            Self::ResetRequired => RecommendedAction::ResetGpu,
            Self::RebootRequired => RecommendedAction::RebootNode,
            Self::ApplicationFault | Self::Informational | Self::Unknown => RecommendedAction::None,
        }
    }
}

/// A short description of the XIDs bcd knows (NVIDIA's catalog wording, shortened).
pub fn describe(xid: u64) -> Option<&'static str> {
    Some(match xid {
        13 => "graphics engine exception",
        31 => "GPU memory page fault",
        43 => "GPU stopped processing",
        48 => "double-bit ECC error",
        62 => "internal micro-controller halt",
        63 => "ECC page retirement or row remapping recording event",
        64 => "ECC page retirement or row remapping recording failure",
        74 => "NVLink error",
        79 => "GPU has fallen off the bus",
        92 => "high single-bit ECC error rate",
        94 => "contained ECC error",
        95 => "uncontained ECC error",
        109 => "context switch timeout",
        119 => "GSP RPC timeout",
        120 => "GSP error",
        121 => "C2C link corrected error",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_classes_match_the_issue_lists() {
        for x in [62, 64, 95, 109, 119, 120, 136, 140, 143, 155] {
            assert_eq!(XidClass::of(x).action(), RecommendedAction::ResetGpu, "{x}");
        }
        assert_eq!(XidClass::of(79).action(), RecommendedAction::RebootNode);
        for x in [13, 31, 94] {
            assert_eq!(XidClass::of(x), XidClass::ApplicationFault);
        }
        for x in [43, 63, 92, 121] {
            assert_eq!(XidClass::of(x), XidClass::Informational);
        }
        assert_eq!(XidClass::of(48), XidClass::Unknown);
    }

    #[test]
    fn actions_order_by_disruption_and_map_from_nvml() {
        assert!(RecommendedAction::Service > RecommendedAction::RebootNode);
        assert!(RecommendedAction::RebootNode > RecommendedAction::ResetGpu);
        assert!(RecommendedAction::ResetGpu > RecommendedAction::DrainP2p);
        assert_eq!(
            RecommendedAction::from_nvml_recovery_action(4),
            RecommendedAction::ResetGpu
        );
        assert_eq!(
            RecommendedAction::from_nvml_recovery_action(2),
            RecommendedAction::RebootNode
        );
        assert_eq!(recovery_action_name(3), "drainP2p");
    }
}
