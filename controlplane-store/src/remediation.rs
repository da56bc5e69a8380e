//! Health remediation's records (issue 33): a pool's policy (`pools.remediation`), one row per
//! remediation of a node (`remediations`) with one row per step it took (`remediation_steps`),
//! the nodes an operator suspended (`remediation_suspensions`), and the application-class XIDs
//! seen on booked GPUs (`xid_observations`) that tell a workload's fault from a node's.
//!
//! What the rows mean — which fault, which ladder, when a step counts as done — is the core's
//! (`cpl_core::remediation`); the store keeps them consistent (one open remediation per node:
//! the partial unique index of migration 11) and counts them for the circuit breaker and the
//! metrics.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

bc_protocol::string_enum! {
    /// `remediation.mode` of a pool: `off` (the default: nothing is done), `observe` (what would
    /// be done is recorded, as remediations and events, and nothing is acted on) or `auto`.
    RemediationMode, "remediation mode" {
        Off => "off",
        Observe => "observe",
        Auto => "auto",
    }
}

bc_protocol::string_enum! {
    /// What the controller does with allocations still on a node once the pool's
    /// `drainGraceSeconds` passed: `wait` (keep waiting, and say so) or `evict` (release them,
    /// with the remediation as the reason on each).
    DrainPolicy, "drain policy" {
        Wait => "wait",
        Evict => "evict",
    }
}

bc_protocol::string_enum! {
    /// The kind of fault a remediation is about: the recovery action its evidence calls for
    /// (NVML's `resetGpu`, `rebootNode`, `drainP2p`, `service`; `unknown` for a failed check
    /// without one), or a node that stayed `unreachable` and has a BMC.
    FaultKind, "fault kind" {
        ResetGpu => "resetGpu",
        RebootNode => "rebootNode",
        DrainP2p => "drainP2p",
        Service => "service",
        Unknown => "unknown",
        Unreachable => "unreachable",
    }
}

bc_protocol::string_enum! {
    /// One rung of a ladder: `resetGpu` (`gpu.reset` of the fault's GPUs), `rebootNode`
    /// (`node.reboot`), `bmcPowerCycle` (`bmc.power reboot` through the site's lease holder),
    /// `reinspect` (a bare-metal `ready` machine inspected and commissioned again).
    RemediationStep, "remediation step" {
        ResetGpu => "resetGpu",
        RebootNode => "rebootNode",
        BmcPowerCycle => "bmcPowerCycle",
        Reinspect => "reinspect",
    }
}

bc_protocol::string_enum! {
    /// Where a remediation's current step is: `draining` (cordoned, waiting for allocations),
    /// `acting` (its command in flight), `verifying` (waiting for the session, then
    /// `diag.nvml`), `ended`.
    RemediationPhase, "remediation phase" {
        Draining => "draining",
        Acting => "acting",
        Verifying => "verifying",
        Ended => "ended",
    }
}

bc_protocol::string_enum! {
    /// A remediation's state: `active`, or how it ended — `succeeded` (a step fixed the fault),
    /// `gaveUp` (the ladder was exhausted, or the node flaps: maintenance on), `cleared` (the
    /// fault went away before a step acted; an observed fault that went away), `cancelled` (the
    /// node was suspended, its pool turned remediation off, the node left service or was
    /// deleted).
    RemediationState, "remediation state" {
        Active => "active",
        Succeeded => "succeeded",
        GaveUp => "gaveUp",
        Cleared => "cleared",
        Cancelled => "cancelled",
    }
}

bc_protocol::string_enum! {
    /// What became of one step: it fixed the fault, it did not (its command failed, or the
    /// verification still saw the fault), or it did not apply to the node (no BMC, a
    /// tenant-controlled node, not a bare-metal `ready` machine).
    StepOutcome, "step outcome" {
        Succeeded => "succeeded",
        Failed => "failed",
        Skipped => "skipped",
    }
}

#[cfg(feature = "openapi")]
macro_rules! text_enum_schema {
    ($($name:ident),+ $(,)?) => {$(
        impl utoipa::PartialSchema for $name {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                utoipa::openapi::schema::ObjectBuilder::new()
                    .schema_type(utoipa::openapi::schema::Type::String)
                    .enum_values(Some($name::ALL.iter().map(|v| v.as_str())))
                    .into()
            }
        }

        impl utoipa::ToSchema for $name {
            fn name() -> std::borrow::Cow<'static, str> {
                std::borrow::Cow::Borrowed(stringify!($name))
            }
        }
    )+};
}

#[cfg(feature = "openapi")]
text_enum_schema!(
    RemediationMode,
    DrainPolicy,
    FaultKind,
    RemediationStep,
    RemediationPhase,
    RemediationState,
    StepOutcome,
);

/// A pool's remediation policy (`pools.setRemediation`, shown by `pools.get` as
/// `remediation`). An absent key takes the default the core documents
/// (`cpl_core::remediation::policy`); `{}` is `mode: off`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RemediationPolicy {
    /// `off` (default), `observe` or `auto`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<RemediationMode>,
    /// The ladder per fault kind, replacing the built-in one of that kind (an empty ladder:
    /// give up at once). Kinds not named keep the built-in ladder.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub ladders: BTreeMap<FaultKind, Vec<RemediationStep>>,
    /// Nodes of the pool in remediation at once, at most (N). Default 4.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent: Option<u32>,
    /// Nodes of the pool in remediation at once, at most this percentage of the pool's nodes
    /// (P, 1 to 100; at least one node). Default 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent_percent: Option<u32>,
    /// Remediations started in the pool per hour, at most (M). Default 20.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_per_hour: Option<u32>,
    /// How long the controller waits for a cordoned node's allocations to be released before
    /// the `drain` policy applies, s. Default 600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_grace_seconds: Option<u64>,
    /// `wait` (default) or `evict`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<DrainPolicy>,
    /// Remediations of one node within `attemptWindowSeconds`, at most; the next fault gives
    /// up on the node (it flaps). Default 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts_per_node: Option<u32>,
    /// The window of `maxAttemptsPerNode`, s. Default 86,400.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_window_seconds: Option<u64>,
    /// Whether the BMC steps apply to a tenant-controlled node (dedicated root), which is
    /// never sent a platform command. Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bmc_on_tenant_controlled: Option<bool>,
    /// How long a node with a BMC stays `unreachable` before it is a fault, s. Default 300.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unreachable_seconds: Option<u64>,
    /// The window in which application-class XIDs are compared across nodes, s. Default 600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_window_seconds: Option<u64>,
    /// One workload's nodes that must show an application-class XID within the window for it
    /// to be the workload's fault. Default 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_min_nodes: Option<u32>,
    /// Distinct allocations in which one node alone shows an application-class XID within the
    /// window for it to be the node's fault. Default 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_min_allocations: Option<u32>,
}

/// What a remediation is about: its kind, and the evidence it was read from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Fault {
    pub kind: FaultKind,
    /// The condition type (`XidCritical`, `GpuUnhealthy`, …), or `connectivity`.
    pub condition: String,
    /// Its owner (`Health`, `Liveness`).
    pub owner: String,
    /// The condition's reason (`Xid48`, `DiagFailed:resetGpu`, `unreachable`).
    pub reason: String,
    /// The condition's message.
    pub message: String,
    /// The GPUs it concerns (PCI bus ids); empty: the whole node.
    #[serde(default)]
    pub gpus: Vec<String>,
}

/// One remediation of one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemediationRecord {
    /// `rem_` and 20 characters of `[a-z0-9]`.
    pub id: String,
    pub node_id: String,
    pub pool_id: Option<String>,
    /// `observe` or `auto`, as the pool said when it started.
    pub mode: RemediationMode,
    pub fault: Fault,
    /// The ladder, as it was when the remediation started.
    pub ladder: Vec<RemediationStep>,
    /// The rung in progress (== `ladder.len()` once the ladder is exhausted).
    pub step_index: u32,
    pub phase: RemediationPhase,
    /// The current step's command (`gpu.reset`, `node.reboot`, `bmc.power`), once queued.
    pub command_id: Option<String>,
    /// The verification's `diag.nvml`, once queued.
    pub verify_command_id: Option<String>,
    /// When the current step's command was queued, ms since the Unix epoch.
    pub acted_at: Option<i64>,
    /// The controller cordoned the node (it uncordons it on success, and only then).
    pub cordoned: bool,
    /// The controller put `draining` into `noScheduleReasons`.
    pub draining: bool,
    /// Why the remediation waits, for people (`waiting for allocation alloc_… (policy wait)`).
    pub waiting: Option<String>,
    pub state: RemediationState,
    /// Whether it may disrupt the node (counts against the circuit breaker): an `auto`
    /// remediation with a ladder to climb.
    pub disruptive: bool,
    /// Milliseconds since the Unix epoch.
    pub started_at: i64,
    /// When the current phase began, ms.
    pub phase_started_at: i64,
    pub ended_at: Option<i64>,
    /// How it ended, for people.
    pub outcome: Option<String>,
}

/// One step a remediation took (or skipped).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct StepRecord {
    pub step: RemediationStep,
    pub outcome: StepOutcome,
    /// The step's command, if it sent one.
    pub command_id: Option<String>,
    /// Milliseconds since the Unix epoch.
    pub at: i64,
    pub message: String,
}

/// Filters of [`crate::Reader::remediations`]; `None` matches everything.
#[derive(Debug, Clone, Default)]
pub struct RemediationFilter {
    pub pool_id: Option<String>,
    pub node_id: Option<String>,
    /// Only remediations that have not ended.
    pub open_only: bool,
    /// At most this many, newest first.
    pub limit: u32,
}

/// An operator's suspension of remediation on one node (`nodes.setRemediation`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Suspension {
    pub reason: String,
    /// Who suspended it (`operator`).
    pub by: String,
    /// Milliseconds since the Unix epoch.
    pub at: i64,
}

/// An application-class XID seen on a node (kept for the workload-fault window).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidObservation {
    pub node_id: String,
    pub xid: u64,
    /// The GPU (canonical PCI bus id), when the XID named one.
    pub gpu: Option<String>,
    /// The workload of the allocation that held the GPU (its `workloadId`, else its id).
    pub workload_id: Option<String>,
    pub allocation_id: Option<String>,
    /// Counted as part of a workload's fault (never against the node).
    pub workload_fault: bool,
    /// Milliseconds since the Unix epoch.
    pub at: i64,
}

/// Counts for the metrics, read at scrape time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RemediationCounts {
    /// `(mode, state, count)` of every remediation ever recorded.
    pub by_state: Vec<(String, String, u64)>,
    /// `(step, outcome, count)` of every step ever taken.
    pub steps: Vec<(String, String, u64)>,
    /// Circuit-breaker trips, summed over pools.
    pub breaker_trips: u64,
}
