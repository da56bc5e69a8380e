//! The node table: [`NodeRecord`] (the full internal record, spec "Modules and node adapters
//! receive the full NodeRecord"), loading and saving it, the identifier index JoinService looks
//! machines up by, and the `nodes.list` query with the schedulable predicate in SQL.

use bc_protocol::{Adapter, Condition, Connectivity, NodeRole, Power, ProvisionState, Trust};
use serde::Serialize;

use super::{Reader, StoreError, Tx, from_json, parse_enum, sql_u64, to_json};
use crate::db::{Db, OptionalExt, Row, ToValue, Value as SqlValue};
use crate::params;

/// Every field the spec gives a node, plus session and inventory bookkeeping. Loaded with
/// [`Reader::node`], changed in memory, saved with [`Tx::update_node`].
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
    /// The last session ended without a Goodbye (its stream broke: a reset, a killed agent).
    /// Liveness turns a broken session's silence into `unreachable`; a clean Goodbye's never.
    pub session_broken: bool,
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
const NODE_COLUMNS: &str = "id, site_id, pool_id, owner_tenant_id, role, trust, adapter, drivers, \
    provision_state, failed_from, maintenance, maintenance_reason, cordoned, power, connectivity, \
    conditions, no_schedule_reasons, hardware_key, hardware_key_trusted, identifier_digests, \
    generation, observed_generation, identity_generation, version, labels, spec, hostname, \
    agent_version, boot_id, session_epoch, gateway_id, connected_at, disconnected_at, last_seen, \
    inventory, inventory_at, created_at, updated_at, inventory_sha256, session_broken";

fn u64_col(row: &Row<'_>, idx: usize) -> Result<u64, StoreError> {
    let v: i64 = row.get(idx)?;
    Ok(u64::try_from(v).unwrap_or(0))
}

impl NodeRecord {
    /// Maps a row selected with `NODE_COLUMNS`.
    fn from_row(row: &Row<'_>) -> Result<Self, StoreError> {
        let text = |i: usize| -> Result<String, StoreError> { row.get(i) };
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
            session_broken: row.get(39)?,
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

/// Filters of `nodes.list`; `None` matches everything.
#[derive(Debug, Clone, Default)]
pub struct NodeQuery {
    pub pool_id: Option<String>,
    pub provision_state: Option<ProvisionState>,
    pub connectivity: Option<Connectivity>,
    /// `true`: only schedulable nodes; `false`: only unschedulable ones (the SQL predicate).
    pub schedulable: Option<bool>,
    /// Only nodes whose inventory names this firmware: `(component, version)`, the component
    /// one of `bios`, `bmc`, `nvme`, `nic`, `infiniband`, `gpu` ([`super::firmware::firmware_sql`]).
    pub firmware: Option<(String, String)>,
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
/// up by) with `digests`, the list written to `nodes.identifier_digests`.
fn index_identifier_digests(
    tx: Db<'_>,
    node_id: &str,
    digests: &[String],
) -> Result<(), StoreError> {
    tx.execute(
        "DELETE FROM node_identifier_digests WHERE node_id = ?1",
        params![node_id],
    )?;
    let mut ins = tx.prepare_cached(
        "INSERT INTO node_identifier_digests (digest, node_id) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
    )?;
    for d in indexed(digests) {
        ins.execute(params![d, node_id])?;
    }
    Ok(())
}

/// `e`, or [`StoreError::DuplicateTrustedKey`] when it is the trusted-key index refusing `key`.
fn key_conflict(e: StoreError, key: Option<&str>) -> StoreError {
    if e.is_unique_violation("nodes.hardware_key", "nodes_trusted_hardware_key") {
        return StoreError::DuplicateTrustedKey {
            key: key.unwrap_or_default().to_owned(),
        };
    }
    e
}

/// `NODE_COLUMNS` qualified with the `n.` alias, so they stay unambiguous next to `pools p`.
fn node_columns_n() -> String {
    NODE_COLUMNS
        .split(',')
        .map(|c| format!("n.{}", c.trim()))
        .collect::<Vec<_>>()
        .join(", ")
}

fn text(s: &Option<String>) -> SqlValue {
    match s {
        Some(s) => SqlValue::Text(s.clone()),
        None => SqlValue::Null,
    }
}

fn int(v: Option<i64>) -> SqlValue {
    v.map(SqlValue::Int).unwrap_or(SqlValue::Null)
}

/// The columns whose value differs between `before` and `after`, with the new value. `version`,
/// `created_at` and `updated_at` are the save's to set.
fn changed_columns(before: &NodeRecord, after: &NodeRecord) -> Vec<(&'static str, SqlValue)> {
    let mut out = Vec::new();
    let mut col = |changed: bool, name: &'static str, value: &dyn Fn() -> SqlValue| {
        if changed {
            out.push((name, value()));
        }
    };
    let (b, a) = (before, after);
    col(b.site_id != a.site_id, "site_id", &|| text(&a.site_id));
    col(b.pool_id != a.pool_id, "pool_id", &|| text(&a.pool_id));
    col(
        b.owner_tenant_id != a.owner_tenant_id,
        "owner_tenant_id",
        &|| text(&a.owner_tenant_id),
    );
    col(b.role != a.role, "role", &|| {
        SqlValue::Text(a.role.as_str().into())
    });
    col(b.trust != a.trust, "trust", &|| {
        SqlValue::Text(a.trust.as_str().into())
    });
    col(b.adapter != a.adapter, "adapter", &|| {
        SqlValue::Text(a.adapter.as_str().into())
    });
    col(b.drivers != a.drivers, "drivers", &|| {
        SqlValue::Text(to_json(&a.drivers))
    });
    col(
        b.provision_state != a.provision_state,
        "provision_state",
        &|| SqlValue::Text(a.provision_state.as_str().into()),
    );
    col(b.failed_from != a.failed_from, "failed_from", &|| {
        text(&a.failed_from.map(|s| s.as_str().to_owned()))
    });
    col(b.maintenance != a.maintenance, "maintenance", &|| {
        SqlValue::Int(a.maintenance.into())
    });
    col(
        b.maintenance_reason != a.maintenance_reason,
        "maintenance_reason",
        &|| text(&a.maintenance_reason),
    );
    col(b.cordoned != a.cordoned, "cordoned", &|| {
        SqlValue::Int(a.cordoned.into())
    });
    col(b.power != a.power, "power", &|| {
        SqlValue::Text(a.power.as_str().into())
    });
    col(b.connectivity != a.connectivity, "connectivity", &|| {
        SqlValue::Text(a.connectivity.as_str().into())
    });
    col(b.conditions != a.conditions, "conditions", &|| {
        SqlValue::Text(to_json(&a.conditions))
    });
    col(
        b.no_schedule_reasons != a.no_schedule_reasons,
        "no_schedule_reasons",
        &|| SqlValue::Text(to_json(&a.no_schedule_reasons)),
    );
    col(b.hardware_key != a.hardware_key, "hardware_key", &|| {
        text(&a.hardware_key)
    });
    col(
        b.hardware_key_trusted != a.hardware_key_trusted,
        "hardware_key_trusted",
        &|| SqlValue::Int(a.hardware_key_trusted.into()),
    );
    col(
        b.identifier_digests != a.identifier_digests,
        "identifier_digests",
        &|| SqlValue::Text(to_json(&a.identifier_digests)),
    );
    col(b.generation != a.generation, "generation", &|| {
        SqlValue::Int(sql_u64(a.generation))
    });
    col(
        b.observed_generation != a.observed_generation,
        "observed_generation",
        &|| SqlValue::Int(sql_u64(a.observed_generation)),
    );
    col(
        b.identity_generation != a.identity_generation,
        "identity_generation",
        &|| SqlValue::Int(sql_u64(a.identity_generation)),
    );
    col(b.labels != a.labels, "labels", &|| {
        SqlValue::Text(to_json(&a.labels))
    });
    col(b.spec != a.spec, "spec", &|| {
        SqlValue::Text(to_json(&a.spec))
    });
    col(b.hostname != a.hostname, "hostname", &|| text(&a.hostname));
    col(b.agent_version != a.agent_version, "agent_version", &|| {
        text(&a.agent_version)
    });
    col(b.boot_id != a.boot_id, "boot_id", &|| text(&a.boot_id));
    col(b.session_epoch != a.session_epoch, "session_epoch", &|| {
        SqlValue::Int(sql_u64(a.session_epoch))
    });
    col(b.gateway_id != a.gateway_id, "gateway_id", &|| {
        text(&a.gateway_id)
    });
    col(b.connected_at != a.connected_at, "connected_at", &|| {
        int(a.connected_at)
    });
    col(
        b.disconnected_at != a.disconnected_at,
        "disconnected_at",
        &|| int(a.disconnected_at),
    );
    col(
        b.last_seen != a.last_seen,
        "last_seen",
        &|| int(a.last_seen),
    );
    col(
        b.session_broken != a.session_broken,
        "session_broken",
        &|| SqlValue::Int(a.session_broken.into()),
    );
    col(b.inventory_json != a.inventory_json, "inventory", &|| {
        text(&a.inventory_json)
    });
    col(b.inventory_at != a.inventory_at, "inventory_at", &|| {
        int(a.inventory_at)
    });
    col(
        b.inventory_sha256 != a.inventory_sha256,
        "inventory_sha256",
        &|| text(&a.inventory_sha256),
    );
    out
}

impl Reader<'_> {
    /// One node by id.
    pub fn node(&self, id: &str) -> Result<Option<NodeRecord>, StoreError> {
        let sql = format!("SELECT {NODE_COLUMNS} FROM nodes WHERE id = ?1");
        let mut stmt = self.db().prepare_cached(&sql)?;
        stmt.query_map(params![id], NodeRecord::from_row)?
            .next()
            .transpose()
    }

    /// Every node, ordered by id.
    pub fn nodes(&self) -> Result<Vec<NodeRecord>, StoreError> {
        let sql = format!("SELECT {NODE_COLUMNS} FROM nodes ORDER BY id");
        let mut stmt = self.db().prepare_cached(&sql)?;
        stmt.query_map(params![], NodeRecord::from_row)?.collect()
    }

    /// Whether a node with this id exists.
    pub fn node_exists(&self, id: &str) -> Result<bool, StoreError> {
        Ok(self
            .db()
            .query_row("SELECT 1 FROM nodes WHERE id = ?1", params![id], |_| Ok(()))
            .optional()?
            .is_some())
    }

    /// A node and its pool's owner (`pools.owner_tenant_id`, which the trust check of a
    /// tenant-owned node reads).
    pub fn node_with_pool_owner(
        &self,
        id: &str,
    ) -> Result<Option<(NodeRecord, Option<String>)>, StoreError> {
        let sql = format!(
            "SELECT {cols}, p.owner_tenant_id FROM nodes n LEFT JOIN pools p ON p.id = n.pool_id \
             WHERE n.id = ?1",
            cols = node_columns_n()
        );
        let owner_idx = NODE_COLUMNS.split(',').count();
        let mut stmt = self.db().prepare_cached(&sql)?;
        stmt.query_map(params![id], |row| {
            Ok((NodeRecord::from_row(row)?, row.get(owner_idx)?))
        })?
        .next()
        .transpose()
    }

    /// `nodes.list`: matching nodes by id, each with its pool's owner. The schedulable filter is
    /// the SQL form of the predicate, so the list agrees with what the placer would book.
    pub fn list_nodes(
        &self,
        f: &NodeQuery,
    ) -> Result<Vec<(NodeRecord, Option<String>)>, StoreError> {
        let sched = match f.schedulable {
            Some(true) => format!(" AND {}", super::schedulable::schedulable_sql()),
            Some(false) => format!(" AND NOT {}", super::schedulable::schedulable_sql()),
            None => String::new(),
        };
        let firmware = match &f.firmware {
            Some((component, _)) => {
                match super::firmware::firmware_sql(component, self.db().is_postgres()) {
                    Some(cond) => format!(" AND n.inventory IS NOT NULL AND {cond}"),
                    None => return Ok(Vec::new()),
                }
            }
            // ?4 is bound either way (a statement takes exactly its parameters).
            None => " AND CAST(?4 AS TEXT) IS NULL".to_owned(),
        };
        // PostgreSQL cannot type a parameter only compared with NULL: the CASTs say it (SQLite
        // takes them as they are).
        let sql = format!(
            "SELECT {cols}, p.owner_tenant_id FROM nodes n LEFT JOIN pools p ON p.id = n.pool_id \
             WHERE (CAST(?1 AS TEXT) IS NULL OR n.pool_id = ?1) \
             AND (CAST(?2 AS TEXT) IS NULL OR n.provision_state = ?2) \
             AND (CAST(?3 AS TEXT) IS NULL OR n.connectivity = ?3){sched}{firmware} ORDER BY n.id",
            cols = node_columns_n()
        );
        let owner_idx = NODE_COLUMNS.split(',').count();
        let mut stmt = self.db().prepare_cached(&sql)?;
        stmt.query_map(
            params![
                f.pool_id,
                f.provision_state.map(|s| s.as_str()),
                f.connectivity.map(|c| c.as_str()),
                f.firmware.as_ref().map(|(_, v)| v.as_str())
            ],
            |row| Ok((NodeRecord::from_row(row)?, row.get(owner_idx)?)),
        )?
        .collect()
    }

    /// Nodes sharing at least `min_shared` of `digests`, oldest first: `(id, identity_generation)`.
    /// The same [`MAX_INDEXED_DIGESTS`] digests a node is indexed by are looked up: an index
    /// probe, not a scan of every node (docs/benchmarks.md).
    pub fn nodes_sharing_identifiers(
        &self,
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
        let mut stmt = self.db().prepare(&sql)?;
        let min = i64::try_from(min_shared).unwrap_or(i64::MAX);
        let params: Vec<&dyn ToValue> = std::iter::once(&min as &dyn ToValue)
            .chain(unique.iter().map(|d| d as &dyn ToValue))
            .collect();
        let rows = stmt.query_map(&params, |r| Ok((r.get::<String>(0)?, u64_col(r, 1)?)))?;
        rows.collect::<Result<_, _>>()
    }

    /// The oldest node holding `key` as a trusted hardware key: `(id, identity_generation)`.
    pub fn node_by_trusted_key(&self, key: &str) -> Result<Option<(String, u64)>, StoreError> {
        self.db()
            .query_row(
                "SELECT id, identity_generation FROM nodes WHERE hardware_key = ?1 \
                 AND hardware_key_trusted = 1 ORDER BY created_at LIMIT 1",
                params![key],
                |r| Ok((r.get::<String>(0)?, u64_col(r, 1)?)),
            )
            .optional()
    }

    /// Another node than `except` that holds `key` as a trusted hardware key. Inside a node's
    /// write ([`crate::Store::write_node`]) the key is locked first, so of two nodes claiming it
    /// at once the second sees the first as the holder; a caller that goes on to store `key` as
    /// trusted holds that lock until its commit.
    pub fn trusted_key_holder(
        &self,
        key: &str,
        except: &str,
    ) -> Result<Option<String>, StoreError> {
        self.lock_hardware_key(key)?;
        self.db()
            .query_row(
                "SELECT id FROM nodes WHERE hardware_key = ?1 AND hardware_key_trusted = 1 \
                 AND id != ?2 LIMIT 1",
                params![key, except],
                |r| r.get(0),
            )
            .optional()
    }
}

impl Tx<'_> {
    /// Inserts a node in provisionState `adopting`, generation 1, identityGeneration 1, and
    /// indexes its identifier digests.
    pub fn insert_node(&self, n: &NewNode, now: i64) -> Result<(), StoreError> {
        self.insert_node_in(n, ProvisionState::Adopting, now)
    }

    /// Inserts a node in `state` (`enrolling` for a bare-metal node enrolled through its BMC).
    pub fn insert_node_in(
        &self,
        n: &NewNode,
        state: ProvisionState,
        now: i64,
    ) -> Result<(), StoreError> {
        let tx = self.db();
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
                state.as_str(),
                n.hostname,
                n.hardware_key,
                n.hardware_key_trusted,
                to_json(&n.identifier_digests),
                now,
            ],
        )
        .map_err(|e| key_conflict(e, n.hardware_key.as_deref()))?;
        index_identifier_digests(tx, &n.id, &n.identifier_digests)
    }

    /// Saves `after`, read as `before` in this transaction: writes the columns that differ (and
    /// re-indexes the identifier digests when they changed). With `bump`, also `version + 1` and
    /// `updated_at = now`. Nothing is written when nothing differs and `bump` is false.
    ///
    /// Returns false when the row is no longer at `before.version` (someone saved in between:
    /// only reachable without the write lock, e.g. PostgreSQL without `FOR UPDATE`).
    pub fn update_node(
        &self,
        before: &NodeRecord,
        after: &NodeRecord,
        bump: bool,
        now: i64,
    ) -> Result<bool, StoreError> {
        let mut sets = changed_columns(before, after);
        if sets.is_empty() && !bump {
            return Ok(true);
        }
        let mut assignments: Vec<String> = sets
            .iter()
            .enumerate()
            .map(|(i, (name, _))| format!("{name} = ?{}", i + 3))
            .collect();
        if bump {
            assignments.push("version = version + 1".to_owned());
            assignments.push(format!("updated_at = ?{}", sets.len() + 3));
            sets.push(("updated_at", SqlValue::Int(now)));
        }
        let sql = format!(
            "UPDATE nodes SET {} WHERE id = ?1 AND version = ?2",
            assignments.join(", ")
        );
        let tx = self.db();
        let mut values: Vec<SqlValue> = vec![
            SqlValue::Text(before.id.clone()),
            SqlValue::Int(sql_u64(before.version)),
        ];
        values.extend(sets.into_iter().map(|(_, v)| v));
        let values: Vec<&dyn ToValue> = values.iter().map(|v| v as &dyn ToValue).collect();
        let n = tx
            .prepare_cached(&sql)?
            .execute(&values)
            .map_err(|e| key_conflict(e, after.hardware_key.as_deref()))?;
        if n != 1 {
            return Ok(false);
        }
        if before.identifier_digests != after.identifier_digests {
            index_identifier_digests(tx, &after.id, &after.identifier_digests)?;
        }
        Ok(true)
    }

    /// Removes the node's row (its taints and identifier index rows go with it; events stay).
    pub fn delete_node(&self, id: &str) -> Result<(), StoreError> {
        self.db()
            .execute("DELETE FROM nodes WHERE id = ?1", params![id])?;
        Ok(())
    }
}
