//! NodeDetail: the API view of a node (spec "Identity, ownership and generations": "the axes
//! except power, the fields above except adapter, drivers and the key itself (only
//! hardwareKeyTrusted), plus labels, conditions and the current session").

use bc_protocol::{Condition, Connectivity, NodeRole, ProvisionState, Trust};
use serde::{Deserialize, Serialize};

use crate::store::nodes::NodeRecord;

/// RFC 3339 (UTC, milliseconds) from milliseconds since the Unix epoch.
pub fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_default()
}

/// The node's current session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionView {
    pub epoch: u64,
    pub gateway_id: Option<String>,
    pub connected_at: Option<String>,
    pub disconnected_at: Option<String>,
    pub last_seen: Option<String>,
}

/// A NIC in the inventory summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NicSummary {
    pub name: String,
    pub mac: Option<String>,
}

/// What the node reported of itself, in brief (from its latest inventory).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InventorySummary {
    pub hostname: Option<String>,
    pub cpu_model: Option<String>,
    /// Logical CPUs.
    pub cpu_threads: Option<u64>,
    /// Bytes.
    pub memory_bytes: Option<u64>,
    pub nics: Vec<NicSummary>,
    pub kernel: Option<String>,
    pub collected_at: Option<String>,
}

/// The API view of a node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeDetail {
    pub id: String,
    pub site_id: Option<String>,
    pub pool_id: Option<String>,
    pub owner_tenant_id: Option<String>,
    pub role: NodeRole,
    pub trust: Trust,
    pub provision_state: ProvisionState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_from: Option<ProvisionState>,
    pub maintenance: bool,
    pub cordoned: bool,
    pub connectivity: Connectivity,
    pub conditions: Vec<Condition>,
    pub no_schedule_reasons: Vec<String>,
    pub hardware_key_trusted: bool,
    pub generation: u64,
    pub observed_generation: u64,
    pub identity_generation: u64,
    pub version: u64,
    pub labels: serde_json::Map<String, serde_json::Value>,
    pub session: SessionView,
    pub inventory: Option<InventorySummary>,
}

fn summary(n: &NodeRecord) -> Option<InventorySummary> {
    let inv = n.inventory.as_ref()?;
    let str_at = |ptr: &str| inv.pointer(ptr).and_then(|v| v.as_str()).map(str::to_owned);
    let nics = inv
        .get("nics")
        .and_then(|v| v.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|nic| {
                    Some(NicSummary {
                        name: nic.get("name")?.as_str()?.to_owned(),
                        mac: nic.get("mac").and_then(|m| m.as_str()).map(str::to_owned),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    Some(InventorySummary {
        hostname: str_at("/hostname"),
        cpu_model: str_at("/cpu/model"),
        cpu_threads: inv.pointer("/cpu/threads").and_then(|v| v.as_u64()),
        memory_bytes: inv.pointer("/memory/totalBytes").and_then(|v| v.as_u64()),
        nics,
        kernel: str_at("/os/kernel"),
        collected_at: n.inventory_at.map(rfc3339),
    })
}

impl From<&NodeRecord> for NodeDetail {
    fn from(n: &NodeRecord) -> Self {
        Self {
            id: n.id.clone(),
            site_id: n.site_id.clone(),
            pool_id: n.pool_id.clone(),
            owner_tenant_id: n.owner_tenant_id.clone(),
            role: n.role,
            trust: n.trust,
            provision_state: n.provision_state,
            failed_from: n.failed_from,
            maintenance: n.maintenance,
            cordoned: n.cordoned,
            connectivity: n.connectivity,
            conditions: n.conditions.clone(),
            no_schedule_reasons: n.no_schedule_reasons.clone(),
            hardware_key_trusted: n.hardware_key_trusted,
            generation: n.generation,
            observed_generation: n.observed_generation,
            identity_generation: n.identity_generation,
            version: n.version,
            labels: n.labels.clone(),
            session: SessionView {
                epoch: n.session_epoch,
                gateway_id: n.gateway_id.clone(),
                connected_at: n.connected_at.map(rfc3339),
                disconnected_at: n.disconnected_at.map(rfc3339),
                last_seen: n.last_seen.map(rfc3339),
            },
            inventory: summary(n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detail_hides_power_adapter_drivers_and_key() -> Result<(), Box<dyn std::error::Error>> {
        let store = crate::store::Store::open_in_memory()?;
        let n = store.with(|c| {
            crate::store::nodes::insert(
                c,
                &crate::store::nodes::NewNode {
                    id: "node_x".into(),
                    site_id: None,
                    pool_id: None,
                    owner_tenant_id: None,
                    role: NodeRole::Host,
                    trust: Trust::Platform,
                    adapter: bc_protocol::Adapter::BcdV1,
                    drivers: Default::default(),
                    hostname: None,
                    hardware_key: Some("abc123".into()),
                    hardware_key_trusted: true,
                    identifier_digests: vec![],
                },
                0,
            )?;
            crate::store::nodes::get(c, "node_x")
        })?;
        let n = n.ok_or("node missing")?;
        let json = serde_json::to_value(NodeDetail::from(&n))?;
        let obj = json.as_object().ok_or("not an object")?;
        for hidden in ["power", "adapter", "drivers", "hardwareKey"] {
            assert!(
                !obj.contains_key(hidden),
                "{hidden} must not be in NodeDetail"
            );
        }
        assert_eq!(
            obj.get("hardwareKeyTrusted"),
            Some(&serde_json::Value::Bool(true))
        );
        assert_eq!(
            obj.get("provisionState").and_then(|v| v.as_str()),
            Some("adopting")
        );
        Ok(())
    }
}
