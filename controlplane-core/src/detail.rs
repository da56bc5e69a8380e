//! NodeDetail: the API view `nodes.get` returns (spec "Identity, ownership and generations": "the
//! axes except power, the fields above except adapter, drivers and the key itself (only
//! hardwareKeyTrusted), plus labels, conditions and the current session"). The full
//! [`NodeRecord`] stays internal; modules and node adapters receive that.

use bc_protocol::{CapacityBucket, Condition, Connectivity, NodeRole, ProvisionState, Trust};
use cpl_store::NodeRecord;
use serde::Serialize;

use crate::conditions::rfc3339_ms;
use crate::inventory::{InventorySummary, summary};
use crate::schedulable::{SchedulingFacts, capacity_bucket};

/// The node's current (or last) gateway session. Times are RFC 3339 strings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionDetail {
    /// Session epoch; fences messages of superseded sessions. 0: never connected.
    pub epoch: u64,
    pub gateway_id: Option<String>,
    pub connected_at: Option<String>,
    pub disconnected_at: Option<String>,
    pub last_seen: Option<String>,
}

/// A machine's request to re-join the node in place, waiting for (or holding) an operator's
/// approval (`nodes.approveRejoin`). Times are RFC 3339 strings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RejoinRequestView {
    /// `rejoin_…`: what `nodes.approveRejoin` takes.
    pub id: String,
    /// The join token the machine presented.
    pub token_id: String,
    /// The hostname the agent sent.
    pub hostname: Option<String>,
    /// Source address of the join.
    pub peer: Option<String>,
    /// How many identifier digests the machine sent.
    pub identifiers: usize,
    /// Whether the control plane found the machine's hardware key trustworthy.
    pub hardware_key_trusted: bool,
    /// When the machine asked.
    pub requested_at: String,
    /// When an operator approved it; absent while it waits.
    pub approved_at: Option<String>,
    /// Who approved it (`operator:<name>`).
    pub approved_by: Option<String>,
}

impl From<&cpl_store::RejoinRequest> for RejoinRequestView {
    fn from(r: &cpl_store::RejoinRequest) -> Self {
        Self {
            id: r.id.clone(),
            token_id: r.token_id.clone(),
            hostname: r.hostname.clone(),
            peer: r.peer.clone(),
            identifiers: r.identifier_digests.len(),
            hardware_key_trusted: r.hardware_key_trusted,
            requested_at: rfc3339_ms(r.requested_at),
            approved_at: r.approved_at.map(rfc3339_ms),
            approved_by: r.approved_by.clone(),
        }
    }
}

/// The API view of a node.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeDetail {
    pub id: String,
    pub site_id: Option<String>,
    pub pool_id: Option<String>,
    pub owner_tenant_id: Option<String>,
    pub role: NodeRole,
    pub trust: Trust,
    pub provision_state: ProvisionState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed_from: Option<ProvisionState>,
    pub maintenance: bool,
    /// Why the node is in maintenance, from whoever turned it on: a failed workflow's error, a
    /// remediation that gave up (the fault and every step tried), an operator's
    /// `nodes.setMaintenance` reason. Absent when maintenance is off or no reason was given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub maintenance_reason: Option<String>,
    pub cordoned: bool,
    pub connectivity: Connectivity,
    pub conditions: Vec<Condition>,
    pub no_schedule_reasons: Vec<String>,
    pub hardware_key_trusted: bool,
    pub generation: u64,
    pub observed_generation: u64,
    pub identity_generation: u64,
    pub version: u64,
    #[schema(value_type = Object)]
    pub labels: serde_json::Map<String, serde_json::Value>,
    pub session: SessionDetail,
    /// Summary of the last inventory, absent until the node reported one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inventory: Option<InventorySummary>,
    /// Whether placement may book this node now (spec "When a node is schedulable").
    pub schedulable: bool,
    /// The bucket of its pool's capacity the node's GPUs count in.
    pub capacity_bucket: CapacityBucket,
    /// A machine's re-join request waiting for `nodes.approveRejoin` (`nodes.get` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rejoin_request: Option<RejoinRequestView>,
    /// The BMC of a bare-metal node enrolled through one (`nodes.get` only): address, TLS mode,
    /// certificate fingerprint, verified facts and the power axis; never its credentials.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bmc: Option<crate::bare_metal::bmc::BmcView>,
}

impl NodeDetail {
    /// The API view of `node`, whose pool is owned by `pool_owner_tenant_id` (needed for the trust
    /// check of tenant-owned nodes).
    pub fn new(node: &NodeRecord, pool_owner_tenant_id: Option<&str>) -> Self {
        let bucket = capacity_bucket(&SchedulingFacts::of(node, pool_owner_tenant_id));
        NodeDetail {
            id: node.id.clone(),
            site_id: node.site_id.clone(),
            pool_id: node.pool_id.clone(),
            owner_tenant_id: node.owner_tenant_id.clone(),
            role: node.role,
            trust: node.trust,
            provision_state: node.provision_state,
            failed_from: node.failed_from,
            maintenance: node.maintenance,
            // A reason left behind by an earlier maintenance says nothing about the node now.
            maintenance_reason: node.maintenance_reason.clone().filter(|_| node.maintenance),
            cordoned: node.cordoned,
            connectivity: node.connectivity,
            conditions: node.conditions.clone(),
            no_schedule_reasons: node.no_schedule_reasons.clone(),
            hardware_key_trusted: node.hardware_key_trusted,
            generation: node.generation,
            observed_generation: node.observed_generation,
            identity_generation: node.identity_generation,
            version: node.version,
            labels: node.labels.clone(),
            session: SessionDetail {
                epoch: node.session_epoch,
                gateway_id: node.gateway_id.clone(),
                connected_at: node.connected_at.map(rfc3339_ms),
                disconnected_at: node.disconnected_at.map(rfc3339_ms),
                last_seen: node.last_seen.map(rfc3339_ms),
            },
            inventory: crate::inventory::of(node).as_ref().map(summary),
            schedulable: bucket == CapacityBucket::Available,
            capacity_bucket: bucket,
            rejoin_request: None,
            bmc: None,
        }
    }
}
