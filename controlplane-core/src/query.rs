//! Read verbs: `nodes.list` (filters by pool, provisionState, connectivity, schedulable and
//! labels; the label filter is applied to the rows the store returns, which carry the labels),
//! `nodes.get`, `nodes.events`. They return NodeDetail, never the internal record.

use bc_protocol::{Connectivity, ProvisionState};
use cpl_store::{NodeEvent, NodeQuery, NodeRecord, Reader};

use crate::detail::NodeDetail;
use crate::error::OpError;

/// Filters of `nodes.list`; absent matches everything.
#[derive(Debug, Clone, Default, serde::Deserialize, utoipa::ToSchema)]
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
}

/// `nodes.list`: matching nodes by id, as NodeDetail. The schedulable filter is the SQL predicate,
/// so the list agrees with what the placer would book.
pub fn list_nodes(conn: &Reader<'_>, f: &NodeFilter) -> Result<Vec<NodeDetail>, OpError> {
    let q = NodeQuery {
        pool_id: f.pool_id.as_ref().map(|p| p.to_string()),
        provision_state: f.provision_state,
        connectivity: f.connectivity,
        schedulable: f.schedulable,
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
    d.bmc = crate::bare_metal::enroll::BmcView::of(conn, &node)?;
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
