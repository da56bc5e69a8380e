//! The node table: [`NodeRecord`] (the full internal record, spec "Modules and node adapters
//! receive the full NodeRecord") and the queries the gateway, JoinService and controllers use.

use bc_protocol::{Adapter, Condition, Connectivity, NodeRole, Power, ProvisionState, Trust};
use rusqlite::{Connection, OptionalExtension, Row, params};
use serde::Serialize;

use super::{StoreError, from_json, parse_enum, to_json};

/// Every field the spec gives a node, plus session and inventory bookkeeping.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeRecord {
    pub id: String,
    pub site_id: Option<String>,
    pub pool_id: Option<String>,
    pub owner_tenant_id: Option<String>,
    pub role: NodeRole,
    pub trust: Trust,
    pub adapter: Adapter,
    pub drivers: serde_json::Map<String, serde_json::Value>,
    pub provision_state: ProvisionState,
    pub failed_from: Option<ProvisionState>,
    pub maintenance: bool,
    pub maintenance_reason: Option<String>,
    pub cordoned: bool,
    pub power: Power,
    pub connectivity: Connectivity,
    pub conditions: Vec<Condition>,
    pub no_schedule_reasons: Vec<String>,
    pub hardware_key: Option<String>,
    pub hardware_key_trusted: bool,
    pub identifier_digests: Vec<String>,
    pub generation: u64,
    pub observed_generation: u64,
    pub identity_generation: u64,
    pub version: u64,
    pub labels: serde_json::Map<String, serde_json::Value>,
    pub spec: serde_json::Value,
    pub hostname: Option<String>,
    pub agent_version: Option<String>,
    pub boot_id: Option<String>,
    pub session_epoch: u64,
    pub gateway_id: Option<String>,
    /// Milliseconds since the Unix epoch.
    pub connected_at: Option<i64>,
    pub disconnected_at: Option<i64>,
    pub last_seen: Option<i64>,
    /// The latest inventory document as stored (camelCase JSON text). Kept unparsed: the gateway
    /// loads a node several times per session and per report, and only NodeDetail, the profile
    /// checks and `nodes.updateSpec` read it ([`NodeRecord::inventory`]).
    #[serde(skip)]
    pub inventory_json: Option<String>,
    /// SHA-256 (hex) of the inventory bytes the agent last sent; an identical report is not
    /// stored again.
    #[serde(skip)]
    pub inventory_sha256: Option<String>,
    pub inventory_at: Option<i64>,
    pub created_at: i64,
    pub updated_at: i64,
}

/// The column list every node query selects, in [`NodeRecord::from_row`]'s order.
pub const NODE_COLUMNS: &str = "id, site_id, pool_id, owner_tenant_id, role, trust, adapter, drivers, \
    provision_state, failed_from, maintenance, maintenance_reason, cordoned, power, connectivity, \
    conditions, no_schedule_reasons, hardware_key, hardware_key_trusted, identifier_digests, \
    generation, observed_generation, identity_generation, version, labels, spec, hostname, \
    agent_version, boot_id, session_epoch, gateway_id, connected_at, disconnected_at, last_seen, \
    inventory, inventory_at, created_at, updated_at, inventory_sha256";

fn u64_col(row: &Row<'_>, idx: usize) -> rusqlite::Result<u64> {
    let v: i64 = row.get(idx)?;
    Ok(u64::try_from(v).unwrap_or(0))
}

impl NodeRecord {
    /// Maps a row selected with [`NODE_COLUMNS`].
    pub fn from_row(row: &Row<'_>) -> Result<Self, StoreError> {
        let text = |i: usize| -> rusqlite::Result<String> { row.get(i) };
        let failed_from: Option<String> = row.get(9)?;
        Ok(Self {
            id: row.get(0)?,
            site_id: row.get(1)?,
            pool_id: row.get(2)?,
            owner_tenant_id: row.get(3)?,
            role: parse_enum("role", &text(4)?)?,
            trust: parse_enum("trust", &text(5)?)?,
            adapter: parse_enum("adapter", &text(6)?)?,
            drivers: from_json("drivers", &text(7)?)?,
            provision_state: parse_enum("provision_state", &text(8)?)?,
            failed_from: failed_from
                .map(|s| parse_enum("failed_from", &s))
                .transpose()?,
            maintenance: row.get(10)?,
            maintenance_reason: row.get(11)?,
            cordoned: row.get(12)?,
            power: parse_enum("power", &text(13)?)?,
            connectivity: parse_enum("connectivity", &text(14)?)?,
            conditions: from_json("conditions", &text(15)?)?,
            no_schedule_reasons: from_json("no_schedule_reasons", &text(16)?)?,
            hardware_key: row.get(17)?,
            hardware_key_trusted: row.get(18)?,
            identifier_digests: from_json("identifier_digests", &text(19)?)?,
            generation: u64_col(row, 20)?,
            observed_generation: u64_col(row, 21)?,
            identity_generation: u64_col(row, 22)?,
            version: u64_col(row, 23)?,
            labels: from_json("labels", &text(24)?)?,
            spec: from_json("spec", &text(25)?)?,
            hostname: row.get(26)?,
            agent_version: row.get(27)?,
            boot_id: row.get(28)?,
            session_epoch: u64_col(row, 29)?,
            gateway_id: row.get(30)?,
            connected_at: row.get(31)?,
            disconnected_at: row.get(32)?,
            last_seen: row.get(33)?,
            inventory_json: row.get(34)?,
            inventory_at: row.get(35)?,
            created_at: row.get(36)?,
            updated_at: row.get(37)?,
            inventory_sha256: row.get(38)?,
        })
    }

    /// The latest inventory document (`bc_protocol::inventory::Inventory` as camelCase JSON), or
    /// `None` before the first report. Errors: the column does not hold JSON.
    pub fn inventory(&self) -> Result<Option<serde_json::Value>, StoreError> {
        self.inventory_json
            .as_deref()
            .map(|s| from_json("inventory", s))
            .transpose()
    }
}

/// Fields of a node created by JoinService.
#[derive(Debug, Clone)]
pub struct NewNode {
    pub id: String,
    pub site_id: Option<String>,
    pub pool_id: Option<String>,
    pub owner_tenant_id: Option<String>,
    pub role: NodeRole,
    pub trust: Trust,
    pub adapter: Adapter,
    pub drivers: serde_json::Map<String, serde_json::Value>,
    pub hostname: Option<String>,
    pub hardware_key: Option<String>,
    pub hardware_key_trusted: bool,
    pub identifier_digests: Vec<String>,
}

/// Inserts a node in provisionState `adopting`, generation 1, identityGeneration 1.
pub fn insert(tx: &Connection, n: &NewNode, now: i64) -> Result<(), StoreError> {
    tx.execute(
        "INSERT INTO nodes (id, site_id, pool_id, owner_tenant_id, role, trust, adapter, drivers, \
         provision_state, hostname, hardware_key, hardware_key_trusted, identifier_digests, \
         created_at, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?14)",
        params![
            n.id,
            n.site_id,
            n.pool_id,
            n.owner_tenant_id,
            n.role.as_str(),
            n.trust.as_str(),
            n.adapter.as_str(),
            to_json(&n.drivers),
            ProvisionState::Adopting.as_str(),
            n.hostname,
            n.hardware_key,
            n.hardware_key_trusted,
            to_json(&n.identifier_digests),
            now,
        ],
    )?;
    index_identifier_digests(tx, &n.id, &n.identifier_digests)?;
    Ok(())
}

/// The digests a node is indexed and looked up by: distinct, sorted, at most
/// [`MAX_INDEXED_DIGESTS`] (a machine has a handful; a report with thousands must not write
/// thousands of rows).
fn indexed(digests: &[String]) -> Vec<&str> {
    let mut unique: Vec<&str> = digests.iter().map(String::as_str).collect();
    unique.sort_unstable();
    unique.dedup();
    unique.truncate(MAX_INDEXED_DIGESTS);
    unique
}

/// Most identifier digests indexed per node.
pub const MAX_INDEXED_DIGESTS: usize = 256;

/// Replaces the node's rows in `node_identifier_digests` (the index JoinService looks machines
/// up by). Call with the same list written to `nodes.identifier_digests`.
pub fn index_identifier_digests(
    tx: &Connection,
    node_id: &str,
    digests: &[String],
) -> Result<(), StoreError> {
    tx.execute(
        "DELETE FROM node_identifier_digests WHERE node_id = ?1",
        params![node_id],
    )?;
    let mut ins = tx.prepare_cached(
        "INSERT OR IGNORE INTO node_identifier_digests (digest, node_id) VALUES (?1, ?2)",
    )?;
    for d in indexed(digests) {
        ins.execute(params![d, node_id])?;
    }
    Ok(())
}

/// Nodes sharing at least `min_shared` of `digests`, oldest first: `(id, identity_generation)`.
/// The same [`MAX_INDEXED_DIGESTS`] digests a node is indexed by are looked up.
pub fn sharing_identifiers(
    conn: &Connection,
    digests: &[String],
    min_shared: usize,
) -> Result<Vec<(String, u64)>, StoreError> {
    let unique = indexed(digests);
    if unique.is_empty() {
        return Ok(Vec::new());
    }
    let marks: Vec<String> = (2..unique.len() + 2).map(|i| format!("?{i}")).collect();
    let sql = format!(
        "SELECT n.id, n.identity_generation FROM node_identifier_digests d \
         JOIN nodes n ON n.id = d.node_id WHERE d.digest IN ({}) \
         GROUP BY n.id, n.identity_generation, n.created_at HAVING COUNT(*) >= ?1 \
         ORDER BY n.created_at",
        marks.join(", ")
    );
    let mut stmt = conn.prepare(&sql)?;
    let min = i64::try_from(min_shared).unwrap_or(i64::MAX);
    let params = std::iter::once(&min as &dyn rusqlite::ToSql)
        .chain(unique.iter().map(|d| d as &dyn rusqlite::ToSql));
    let rows = stmt.query_map(rusqlite::params_from_iter(params), |r| {
        Ok((r.get::<_, String>(0)?, u64_col(r, 1)?))
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// One node by id.
pub fn get(conn: &Connection, id: &str) -> Result<Option<NodeRecord>, StoreError> {
    let sql = format!("SELECT {NODE_COLUMNS} FROM nodes WHERE id = ?1");
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut rows = stmt.query(params![id])?;
    match rows.next()? {
        Some(row) => Ok(Some(NodeRecord::from_row(row)?)),
        None => Ok(None),
    }
}

/// Every node, ordered by id.
pub fn list(conn: &Connection) -> Result<Vec<NodeRecord>, StoreError> {
    let sql = format!("SELECT {NODE_COLUMNS} FROM nodes ORDER BY id");
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut rows = stmt.query([])?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        out.push(NodeRecord::from_row(row)?);
    }
    Ok(out)
}

/// Whether a node with this id exists.
pub fn exists(conn: &Connection, id: &str) -> Result<bool, StoreError> {
    Ok(conn
        .query_row("SELECT 1 FROM nodes WHERE id = ?1", params![id], |_| Ok(()))
        .optional()?
        .is_some())
}

/// Sorted, deduplicated reasons with `reason` added or removed. Callers write the result in the
/// same transaction as the change that caused it.
pub fn with_reason(reasons: &[String], reason: &str, present: bool) -> Vec<String> {
    let mut out: Vec<String> = reasons.iter().filter(|r| *r != reason).cloned().collect();
    if present {
        out.push(reason.to_owned());
    }
    out.sort();
    out.dedup();
    out
}

/// Writes the node's `noScheduleReasons`.
pub fn set_no_schedule_reasons(
    tx: &Connection,
    id: &str,
    reasons: &[String],
) -> Result<(), StoreError> {
    tx.execute(
        "UPDATE nodes SET no_schedule_reasons = ?2 WHERE id = ?1",
        params![id, to_json(&reasons)],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_stay_sorted_and_unique() {
        let r = with_reason(&["taint:gpu".into()], "unreachable", true);
        assert_eq!(r, vec!["taint:gpu".to_owned(), "unreachable".to_owned()]);
        let r = with_reason(&r, "unreachable", true);
        assert_eq!(r.len(), 2);
        let r = with_reason(&r, "unreachable", false);
        assert_eq!(r, vec!["taint:gpu".to_owned()]);
    }
}
