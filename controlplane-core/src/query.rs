//! Read verbs: `nodes.list` (filters by pool, provisionState, connectivity, schedulable and
//! labels; the label filter is applied to the rows the store returns, which carry the labels),
//! `nodes.get`, `nodes.events`. They return NodeDetail, never the internal record.

use bc_protocol::{Connectivity, ProvisionState};
use cpl_store::{NodeEvent, NodeQuery, NodeRecord, Reader};

use crate::detail::NodeDetail;
use crate::error::OpError;

/// Filters of `nodes.list`; absent matches everything.
#[derive(
    Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeFilter {
    pub pool_id: Option<crate::text::Id>,
    pub provision_state: Option<ProvisionState>,
    pub connectivity: Option<Connectivity>,
    /// `true`: only schedulable nodes; `false`: only unschedulable ones.
    pub schedulable: Option<bool>,
    /// Only nodes carrying every one of these labels with exactly this value.
    #[serde(default)]
    pub labels: Option<std::collections::BTreeMap<crate::text::Key, crate::text::ShortText>>,
    /// Only nodes whose inventory names this firmware: `<component>=<version>`, the component one
    /// of `bios`, `bmc`, `nvme`, `nic`, `infiniband`, `gpu` (issue 20.5; `inventory.firmware` of
    /// NodeDetail lists them), e.g. `nvme=1B2QEXP7`.
    #[serde(default)]
    pub firmware: Option<crate::text::ShortText>,
}

/// `<component>=<version>` of a firmware filter. Errors: `INVALID_ARGUMENT` naming the
/// components.
pub fn parse_firmware(f: &str) -> Result<(String, String), OpError> {
    let known = crate::inventory::FIRMWARE_COMPONENTS;
    match f.split_once('=') {
        Some((c, v)) if known.contains(&c.trim()) && !v.trim().is_empty() => {
            Ok((c.trim().to_owned(), v.trim().to_owned()))
        }
        _ => Err(OpError::InvalidArgument(format!(
            "firmware must be <component>=<version> with a component among {}, got {f:?}",
            known.join(", ")
        ))),
    }
}

/// `nodes.list`: matching nodes by id, as NodeDetail. The schedulable filter is the SQL predicate,
/// so the list agrees with what the placer would book.
pub fn list_nodes(conn: &Reader<'_>, f: &NodeFilter) -> Result<Vec<NodeDetail>, OpError> {
    let q = NodeQuery {
        pool_id: f.pool_id.as_ref().map(|p| p.to_string()),
        provision_state: f.provision_state,
        connectivity: f.connectivity,
        schedulable: f.schedulable,
        firmware: f
            .firmware
            .as_ref()
            .map(|s| parse_firmware(s.as_ref()))
            .transpose()?,
    };
    let selector = f.labels.clone().unwrap_or_default();
    Ok(conn
        .list_nodes(&q)?
        .iter()
        .filter(|(node, _)| crate::ops::labels::matches(node, &selector))
        .map(|(node, owner)| NodeDetail::new(node, owner.as_deref()))
        .collect())
}

/// The full record and its pool's owner; `NOT_FOUND` if absent.
pub fn get_record(
    conn: &Reader<'_>,
    node_id: &str,
) -> Result<(NodeRecord, Option<String>), OpError> {
    conn.node_with_pool_owner(node_id)?
        .ok_or_else(|| OpError::node_not_found(node_id))
}

/// `nodes.get`: one node as NodeDetail, with its pending re-join request.
pub fn get_node(conn: &Reader<'_>, node_id: &str) -> Result<NodeDetail, OpError> {
    let (node, owner) = get_record(conn, node_id)?;
    let mut d = NodeDetail::new(&node, owner.as_deref());
    d.rejoin_request = conn.rejoin_request(node_id)?.as_ref().map(Into::into);
    d.bmc = crate::bare_metal::bmc::BmcView::of(conn, &node)?;
    Ok(d)
}

/// `nodes.events`: the node's event log, oldest first. A deleted node's log stays readable; an id
/// that never had a node or an event is `NOT_FOUND`.
pub fn node_events(conn: &Reader<'_>, node_id: &str) -> Result<Vec<NodeEvent>, OpError> {
    let list = conn.events(node_id)?;
    if list.is_empty() && !conn.node_exists(node_id)? {
        return Err(OpError::node_not_found(node_id));
    }
    Ok(list)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reports::{InventoryReport, record_inventory};

    fn node(tx: &cpl_store::Tx<'_>, id: &str, doc: &str) -> Result<(), OpError> {
        tx.insert_node(&cpl_store::testing::new_node(id), 1)?;
        record_inventory(
            tx,
            id,
            0,
            &InventoryReport {
                hardware_key: "",
                trusted: false,
                digests: &[],
                document: doc.as_bytes(),
                sha256: id,
            },
        )?;
        Ok(())
    }

    fn ids(r: &Reader<'_>, firmware: &str) -> Result<Vec<String>, OpError> {
        let f = NodeFilter {
            firmware: Some(firmware.into()),
            ..Default::default()
        };
        Ok(list_nodes(r, &f)?.into_iter().map(|d| d.id).collect())
    }

    #[test]
    fn nodes_are_found_by_the_firmware_their_inventory_names() -> Result<(), OpError> {
        let store = cpl_store::testing::store()?;
        let disk = |fw: &str| {
            format!(
                r#"{{"schemaVersion": 1, "system": {{"biosVersion": "1.0"}}, "bmc": {{"firmware": "{fw}"}}, "disks": [{{"name": "nvme0n1", "sizeBytes": 1, "nvme": true, "firmware": "{fw}"}}]}}"#
            )
        };
        store.write_blocking(|tx| {
            node(tx, "a", &disk("OLD1"))?;
            node(tx, "b", &disk("NEW2"))?;
            node(
                tx,
                "c",
                r#"{"schemaVersion": 1, "disks": [{"name": "sda", "sizeBytes": 1, "nvme": false, "firmware": "OLD1"}]}"#,
            )
        })?;
        store.read_blocking(|r| {
            assert_eq!(
                ids(r, "nvme=OLD1")?,
                ["a"],
                "a SATA disk's firmware is no NVMe's"
            );
            assert_eq!(ids(r, "nvme=NEW2")?, ["b"]);
            assert_eq!(ids(r, "bios=1.0")?, ["a", "b"]);
            assert_eq!(ids(r, "bmc=NEW2")?, ["b"]);
            assert!(ids(r, "gpu=1.0")?.is_empty());
            assert!(matches!(
                ids(r, "disk=OLD1"),
                Err(OpError::InvalidArgument(_))
            ));
            assert!(matches!(ids(r, "nvme="), Err(OpError::InvalidArgument(_))));
            assert_eq!(list_nodes(r, &NodeFilter::default())?.len(), 3);
            let d = get_node(r, "a")?;
            let fw = d.inventory.map(|i| i.firmware).unwrap_or_default();
            assert_eq!(fw.len(), 3, "{fw:?}");
            Ok(())
        })
    }
}
