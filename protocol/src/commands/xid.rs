//! XID errors: the event the agent sends when a GPU raises one (`Event{type: "xid"}`), the
//! catalog class of an XID number, and the recommended actions `diag.nvml` reports too.
//!
//! Classes follow NVIDIA's XID catalog (its resolution buckets, kept as data in
//! [`super::xid_catalog`]): an Xid the catalog resolves with a GPU reset, a node reboot, a
//! restart of the application, by ignoring it, or by draining the node for service; XID 154 by
//! the recovery action it announces; and `unknown` for an Xid the catalog does not list.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// What to do about a GPU or node, from least to most disruptive (the derived order is used to
/// pick the strongest action of several). camelCase in JSON (`resetGpu`).
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
    /// From NVML's `nvmlDeviceGpuRecoveryAction_t` (field 230,
    /// `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`): 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P,
    /// 4 drain and reset (reset is the stronger half); anything else needs a person.
    pub fn from_nvml_recovery_action(v: u64) -> Self {
        match v {
            0 => Self::None,
            1 | 4 => Self::ResetGpu,
            2 => Self::RebootNode,
            3 => Self::DrainP2p,
            _ => Self::Service,
        }
    }

    /// The camelCase spelling (`resetGpu`), as in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::DrainP2p => "drainP2p",
            Self::ResetGpu => "resetGpu",
            Self::RebootNode => "rebootNode",
            Self::Service => "service",
        }
    }
}

/// How the catalog classes an XID. camelCase in JSON (`resetRequired`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum XidClass {
    /// Resolved by a GPU reset (bucket `resetGpu`: 46, 48, 62, 64, 74, 95, 109, 119, ...).
    ResetRequired,
    /// Needs a node reboot (bucket `rebootNode`: 79, 151, 160).
    RebootRequired,
    /// The application's fault, not the GPU's (bucket `restartApp`: 13, 31, 94, ...).
    ApplicationFault,
    /// Informational (bucket `ignore`: 43, 63, 92, 121, ...); an XID 154 that announces "no
    /// action".
    Informational,
    /// The node must be drained and a person look at it (bucket `drainAndService`: the
    /// catalog's "contact support" Xids, 54 "check mechanicals", 78 "update software").
    ServiceRequired,
    /// Peer-to-peer traffic must be drained: an XID 154 that announces "Drain P2P".
    DrainP2pRequired,
    /// Not in the catalog (and an XID 154 whose action could not be read).
    Unknown,
}

impl XidClass {
    /// The catalog class of `xid` ([`super::xid_catalog`]); XID 154 is `unknown` until its
    /// announced action is known ([`XidClass::announcing`]).
    pub fn of(xid: u64) -> Self {
        use super::xid_catalog::Bucket;
        match super::xid_catalog::catalog().get(xid).map(|e| e.bucket) {
            Some(Bucket::Ignore) => Self::Informational,
            Some(Bucket::RestartApp) => Self::ApplicationFault,
            Some(Bucket::ResetGpu) => Self::ResetRequired,
            Some(Bucket::RebootNode) => Self::RebootRequired,
            Some(Bucket::DrainAndService) => Self::ServiceRequired,
            Some(Bucket::Announced) | None => Self::Unknown,
        }
    }

    /// The camelCase spelling (`resetRequired`), as in JSON and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ResetRequired => "resetRequired",
            Self::RebootRequired => "rebootRequired",
            Self::ApplicationFault => "applicationFault",
            Self::Informational => "informational",
            Self::ServiceRequired => "serviceRequired",
            Self::DrainP2pRequired => "drainP2pRequired",
            Self::Unknown => "unknown",
        }
    }

    /// The action this class calls for.
    pub fn action(self) -> RecommendedAction {
        match self {
            Self::ResetRequired => RecommendedAction::ResetGpu,
            Self::RebootRequired => RecommendedAction::RebootNode,
            Self::DrainP2pRequired => RecommendedAction::DrainP2p,
            Self::ServiceRequired => RecommendedAction::Service,
            Self::ApplicationFault | Self::Informational | Self::Unknown => RecommendedAction::None,
        }
    }

    /// The class of an XID that announces `action` (XID 154, NVML field 230).
    pub fn announcing(action: RecommendedAction) -> Self {
        match action {
            RecommendedAction::None => Self::Informational,
            RecommendedAction::DrainP2p => Self::DrainP2pRequired,
            RecommendedAction::ResetGpu => Self::ResetRequired,
            RecommendedAction::RebootNode => Self::RebootRequired,
            RecommendedAction::Service => Self::Unknown,
        }
    }

    /// Whether the node must not take new work until the GPU is reset, the node rebooted or a
    /// person looked at it (the control plane's `XidCritical` condition).
    pub fn is_critical(self) -> bool {
        matches!(
            self,
            Self::ResetRequired | Self::RebootRequired | Self::ServiceRequired
        )
    }
}

/// Where the agent saw an XID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum XidSource {
    /// An NVML event set (`nvmlEventSetWait_v2`, `nvmlEventTypeXidCriticalError`).
    Nvml,
    /// The kernel log (`/dev/kmsg`, the driver's `NVRM: Xid` lines).
    Kmsg,
}

/// One XID error: `Event.data_json` of an event of type [`super::EventType::Xid`] (camelCase
/// JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct XidEvent {
    /// The XID number.
    pub xid: u64,
    /// The GPU, `0000:1a:00.0`.
    pub pci_bus_id: Option<String>,
    /// The GPU's UUID (NVML source only).
    pub uuid: Option<String>,
    /// Catalog class.
    pub class: XidClass,
    /// What the catalog recommends.
    pub action: RecommendedAction,
    /// Catalog description, when known.
    pub description: Option<String>,
    /// The driver's message: the kernel log's line (for an NVML event, the line the driver
    /// logged for the same XID on the same GPU, when the watch saw it).
    pub message: Option<String>,
    /// Process id the driver named, if any.
    pub pid: Option<u32>,
    /// Where it was seen.
    pub source: XidSource,
    /// When the agent saw it (RFC 3339 in JSON).
    pub observed_at: DateTime<Utc>,
    /// No Xid was logged: the driver's own message said what happened and `xid` is the
    /// catalog's number for it (79 for "fallen off the bus"). Absent in JSON when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub driver_message: bool,
}
