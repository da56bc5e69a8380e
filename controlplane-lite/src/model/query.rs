//! Read verbs: `nodes.list` (filters by pool, provisionState, connectivity, schedulable),
//! `nodes.get`, `nodes.events`. They return NodeDetail, never the internal record.

use bc_protocol::{Connectivity, ProvisionState};
use rusqlite::{Connection, params};

use super::detail::NodeDetail;
use super::error::OpError;
use super::schedulable::schedulable_sql;
use crate::store::events::{self, NodeEvent};
use crate::store::nodes::{NODE_COLUMNS, NodeRecord};

/// `NODE_COLUMNS` qualified with the `n.` alias, so they stay unambiguous next to `pools p`.
pub(crate) fn node_columns_n() -> String {
    NODE_COLUMNS
        .split(',')
        .map(|c| format!("n.{}", c.trim()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Filters of `nodes.list`; `None` matches everything.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeFilter {
    pub pool_id: Option<String>,
    pub provision_state: Option<ProvisionState>,
    pub connectivity: Option<Connectivity>,
    /// `true`: only schedulable nodes; `false`: only unschedulable ones.
    pub schedulable: Option<bool>,
}

/// `nodes.list`: matching nodes by id, as NodeDetail. The schedulable filter is the SQL predicate
/// (`schedulable_sql`), so the list agrees with what the placer would book.
pub fn list_nodes(conn: &Connection, f: &NodeFilter) -> Result<Vec<NodeDetail>, OpError> {
    let sched = match f.schedulable {
        Some(true) => format!(" AND {}", schedulable_sql()),
        Some(false) => format!(" AND NOT {}", schedulable_sql()),
        None => String::new(),
    };
    // PostgreSQL wants `?1::text IS NULL` for an untyped NULL parameter; SQLite takes it as is.
    let sql = format!(
        "SELECT {cols}, p.owner_tenant_id FROM nodes n LEFT JOIN pools p ON p.id = n.pool_id \
         WHERE (?1 IS NULL OR n.pool_id = ?1) AND (?2 IS NULL OR n.provision_state = ?2) \
         AND (?3 IS NULL OR n.connectivity = ?3){sched} ORDER BY n.id",
        cols = node_columns_n()
    );
    let owner_idx = NODE_COLUMNS.split(',').count();
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut rows = stmt.query(params![
        f.pool_id,
        f.provision_state.map(|s| s.as_str()),
        f.connectivity.map(|c| c.as_str())
    ])?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        let node = NodeRecord::from_row(row)?;
        let owner: Option<String> = row.get(owner_idx)?;
        out.push(NodeDetail::new(&node, owner.as_deref()));
    }
    Ok(out)
}

/// The full record and its pool's owner; `NOT_FOUND` if absent.
pub fn get_record(
    conn: &Connection,
    node_id: &str,
) -> Result<(NodeRecord, Option<String>), OpError> {
    let sql = format!(
        "SELECT {cols}, p.owner_tenant_id FROM nodes n LEFT JOIN pools p ON p.id = n.pool_id \
         WHERE n.id = ?1",
        cols = node_columns_n()
    );
    let owner_idx = NODE_COLUMNS.split(',').count();
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut rows = stmt.query(params![node_id])?;
    let row = rows
        .next()?
        .ok_or_else(|| OpError::node_not_found(node_id))?;
    Ok((NodeRecord::from_row(row)?, row.get(owner_idx)?))
}

/// `nodes.get`: one node as NodeDetail.
pub fn get_node(conn: &Connection, node_id: &str) -> Result<NodeDetail, OpError> {
    let (node, owner) = get_record(conn, node_id)?;
    Ok(NodeDetail::new(&node, owner.as_deref()))
}

/// `nodes.events`: the node's event log, oldest first. A deleted node's log stays readable; an id
/// that never had a node or an event is `NOT_FOUND`.
pub fn node_events(conn: &Connection, node_id: &str) -> Result<Vec<NodeEvent>, OpError> {
    let list = events::list(conn, node_id)?;
    if list.is_empty() && !crate::store::nodes::exists(conn, node_id)? {
        return Err(OpError::node_not_found(node_id));
    }
    Ok(list)
}
