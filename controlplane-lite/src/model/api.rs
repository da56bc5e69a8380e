//! The operator API's verbs as one dispatcher: `dispatch(conn, "nodes.cordon", body, actor)`
//! parses the verb's camelCase JSON body, runs the operation (mutations in one `BEGIN IMMEDIATE`
//! transaction) and returns the JSON answer. An HTTP handler for `POST /v1/<method>` only needs to
//! authenticate, call this, and turn an [`OpError`] into its status and `{code, message}` body.
//!
//! Answers: node verbs return NodeDetail (never the internal record); lists are wrapped
//! (`{"nodes": [...]}`) so they can grow fields later.

use rusqlite::Connection;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::detail::NodeDetail;
use super::error::OpError;
use super::ops::{self, nodes as node_ops, write_tx};
use super::placer::{self, AllocationRequest};
use super::query::{self, NodeFilter};
use crate::store::allocations::AllocationFilter;
use crate::store::nodes::NodeRecord;
use crate::store::pools::{self, HardwareProfile};
use crate::store::tokens::NewToken;

/// Every method [`dispatch`] serves, for routing and `bcctl` help.
pub const METHODS: &[&str] = &[
    "nodes.list",
    "nodes.get",
    "nodes.events",
    "nodes.cordon",
    "nodes.uncordon",
    "nodes.drain",
    "nodes.taint",
    "nodes.untaint",
    "nodes.adopt",
    "nodes.recover",
    "nodes.setMaintenance",
    "nodes.revokeIdentity",
    "nodes.delete",
    "nodes.updateSpec",
    "nodes.startDedicatedRoot",
    "nodes.endDedicatedRoot",
    "pools.create",
    "pools.get",
    "pools.list",
    "pools.update",
    "pools.delete",
    "pools.capacity",
    "sites.create",
    "sites.get",
    "sites.list",
    "sites.update",
    "sites.delete",
    "tokens.create",
    "tokens.list",
    "tokens.revoke",
    "allocations.create",
    "allocations.get",
    "allocations.list",
    "allocations.release",
];

fn parse<T: DeserializeOwned>(method: &str, body: Value) -> Result<T, OpError> {
    // An absent body means `{}` for verbs whose fields are all optional.
    let body = if body.is_null() { json!({}) } else { body };
    serde_json::from_value(body)
        .map_err(|e| OpError::InvalidArgument(format!("{method}: invalid request body: {e}")))
}

fn to_value<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct NodeRef {
    #[serde(alias = "id")]
    node_id: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct NodeMutation {
    #[serde(alias = "id")]
    node_id: String,
    version: u64,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct TaintBody {
    #[serde(alias = "id")]
    node_id: String,
    version: u64,
    key: String,
    #[serde(default)]
    value: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct UntaintBody {
    #[serde(alias = "id")]
    node_id: String,
    version: u64,
    key: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct MaintenanceBody {
    #[serde(alias = "id")]
    node_id: String,
    version: u64,
    maintenance: bool,
    #[serde(default)]
    reason: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SpecBody {
    #[serde(alias = "id")]
    node_id: String,
    version: u64,
    spec: Value,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct LeaseBody {
    #[serde(alias = "id")]
    node_id: String,
    version: u64,
    tenant_id: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PoolRef {
    #[serde(alias = "id")]
    pool_id: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PoolUpdate {
    #[serde(alias = "id")]
    pool_id: String,
    version: u64,
    name: String,
    #[serde(default)]
    hardware_profile: HardwareProfile,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PoolDelete {
    #[serde(alias = "id")]
    pool_id: String,
    version: u64,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SiteRef {
    #[serde(alias = "id")]
    site_id: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SiteUpdate {
    #[serde(alias = "id")]
    site_id: String,
    version: u64,
    name: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SiteDelete {
    #[serde(alias = "id")]
    site_id: String,
    version: u64,
}

/// `tokens.create` body. `ttlSeconds` defaults to 24 h.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct TokenCreate {
    #[serde(default)]
    pool_id: Option<String>,
    #[serde(default)]
    site_id: Option<String>,
    #[serde(default = "default_ttl_seconds")]
    ttl_seconds: u64,
    #[serde(default)]
    max_uses: Option<u64>,
    #[serde(default)]
    description: Option<String>,
}

fn default_ttl_seconds() -> u64 {
    24 * 3600
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct TokenRef {
    #[serde(alias = "id")]
    token_id: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct AllocationRef {
    #[serde(alias = "id")]
    allocation_id: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct AllocationListBody {
    #[serde(default)]
    pool_id: Option<String>,
    #[serde(default)]
    node_id: Option<String>,
    #[serde(default)]
    active_only: bool,
}

/// NodeDetail of a record just saved in `tx` (its pool's owner read in the same transaction).
fn detail(tx: &Connection, node: &NodeRecord) -> Result<Value, OpError> {
    let owner = match &node.pool_id {
        Some(p) => pools::get(tx, p)?.and_then(|p| p.owner_tenant_id),
        None => None,
    };
    Ok(to_value(&NodeDetail::new(node, owner.as_deref())))
}

/// A node mutation `{nodeId, version}` run through `f` and answered with NodeDetail.
fn node_verb(
    conn: &mut Connection,
    method: &str,
    body: Value,
    actor: &str,
    f: fn(&Connection, &str, u64, &str) -> Result<NodeRecord, OpError>,
) -> Result<Value, OpError> {
    let b: NodeMutation = parse(method, body)?;
    write_tx(conn, |tx| {
        let n = f(tx, &b.node_id, b.version, actor)?;
        detail(tx, &n)
    })
}

/// Runs `method` with JSON `body` on behalf of `actor` (`operator:<name>`). Unknown methods are
/// `NOT_FOUND`; a body of the wrong shape is `INVALID_ARGUMENT`.
pub fn dispatch(
    conn: &mut Connection,
    method: &str,
    body: Value,
    actor: &str,
) -> Result<Value, OpError> {
    match method {
        "nodes.list" => {
            let f: NodeFilter = parse(method, body)?;
            Ok(json!({ "nodes": query::list_nodes(conn, &f)? }))
        }
        "nodes.get" => {
            let b: NodeRef = parse(method, body)?;
            Ok(to_value(&query::get_node(conn, &b.node_id)?))
        }
        "nodes.events" => {
            let b: NodeRef = parse(method, body)?;
            Ok(json!({ "events": query::node_events(conn, &b.node_id)? }))
        }
        "nodes.cordon" => node_verb(conn, method, body, actor, node_ops::cordon),
        "nodes.uncordon" => node_verb(conn, method, body, actor, node_ops::uncordon),
        "nodes.drain" => node_verb(conn, method, body, actor, node_ops::drain),
        "nodes.adopt" => node_verb(conn, method, body, actor, node_ops::adopt),
        "nodes.recover" => node_verb(conn, method, body, actor, node_ops::recover),
        "nodes.revokeIdentity" => node_verb(conn, method, body, actor, node_ops::revoke_identity),
        "nodes.delete" => node_verb(conn, method, body, actor, node_ops::delete),
        "nodes.endDedicatedRoot" => {
            node_verb(conn, method, body, actor, node_ops::end_dedicated_root)
        }
        "nodes.taint" => {
            let b: TaintBody = parse(method, body)?;
            write_tx(conn, |tx| {
                let n = node_ops::taint(tx, &b.node_id, b.version, actor, &b.key, &b.value)?;
                detail(tx, &n)
            })
        }
        "nodes.untaint" => {
            let b: UntaintBody = parse(method, body)?;
            write_tx(conn, |tx| {
                let n = node_ops::untaint(tx, &b.node_id, b.version, actor, &b.key)?;
                detail(tx, &n)
            })
        }
        "nodes.setMaintenance" => {
            let b: MaintenanceBody = parse(method, body)?;
            write_tx(conn, |tx| {
                let n = node_ops::set_maintenance(
                    tx,
                    &b.node_id,
                    b.version,
                    actor,
                    b.maintenance,
                    b.reason.as_deref(),
                )?;
                detail(tx, &n)
            })
        }
        "nodes.updateSpec" => {
            let b: SpecBody = parse(method, body)?;
            write_tx(conn, |tx| {
                let n = node_ops::update_spec(tx, &b.node_id, b.version, actor, b.spec)?;
                detail(tx, &n)
            })
        }
        "nodes.startDedicatedRoot" => {
            let b: LeaseBody = parse(method, body)?;
            write_tx(conn, |tx| {
                let (n, lease) =
                    node_ops::start_dedicated_root(tx, &b.node_id, b.version, actor, &b.tenant_id)?;
                Ok(json!({ "node": detail(tx, &n)?, "lease": lease }))
            })
        }
        "pools.create" => {
            let b: ops::pools::NewPool = parse(method, body)?;
            write_tx(conn, |tx| Ok(to_value(&ops::pools::create(tx, &b)?)))
        }
        "pools.get" => {
            let b: PoolRef = parse(method, body)?;
            Ok(to_value(&ops::pools::get(conn, &b.pool_id)?))
        }
        "pools.list" => Ok(json!({ "pools": ops::pools::list(conn)? })),
        "pools.update" => {
            let b: PoolUpdate = parse(method, body)?;
            write_tx(conn, |tx| {
                let p =
                    ops::pools::update(tx, &b.pool_id, b.version, &b.name, &b.hardware_profile)?;
                Ok(to_value(&p))
            })
        }
        "pools.delete" => {
            let b: PoolDelete = parse(method, body)?;
            write_tx(conn, |tx| {
                Ok(to_value(&ops::pools::delete(tx, &b.pool_id, b.version)?))
            })
        }
        "pools.capacity" => {
            let b: PoolRef = parse(method, body)?;
            Ok(to_value(&placer::capacity(conn, &b.pool_id)?))
        }
        "sites.create" => {
            let b: ops::sites::NewSite = parse(method, body)?;
            write_tx(conn, |tx| Ok(to_value(&ops::sites::create(tx, &b)?)))
        }
        "sites.get" => {
            let b: SiteRef = parse(method, body)?;
            Ok(to_value(&ops::sites::get(conn, &b.site_id)?))
        }
        "sites.list" => Ok(json!({ "sites": ops::sites::list(conn)? })),
        "sites.update" => {
            let b: SiteUpdate = parse(method, body)?;
            write_tx(conn, |tx| {
                Ok(to_value(&ops::sites::rename(
                    tx, &b.site_id, b.version, &b.name,
                )?))
            })
        }
        "sites.delete" => {
            let b: SiteDelete = parse(method, body)?;
            write_tx(conn, |tx| {
                Ok(to_value(&ops::sites::delete(tx, &b.site_id, b.version)?))
            })
        }
        "tokens.create" => {
            let b: TokenCreate = parse(method, body)?;
            let new = NewToken {
                pool_id: b.pool_id,
                site_id: b.site_id,
                ttl_ms: i64::try_from(b.ttl_seconds.saturating_mul(1000)).unwrap_or(i64::MAX),
                max_uses: b.max_uses,
                description: b.description,
            };
            write_tx(conn, |tx| {
                let (token, secret) = ops::tokens::create(tx, &new)?;
                // The secret is shown once, here, and never stored.
                Ok(json!({ "token": token, "secret": secret }))
            })
        }
        "tokens.list" => Ok(json!({ "tokens": ops::tokens::list(conn)? })),
        "tokens.revoke" => {
            let b: TokenRef = parse(method, body)?;
            write_tx(conn, |tx| {
                ops::tokens::revoke(tx, &b.token_id)?;
                Ok(json!({}))
            })
        }
        "allocations.create" => {
            let b: AllocationRequest = parse(method, body)?;
            write_tx(conn, |tx| Ok(to_value(&placer::create(tx, &b, actor)?)))
        }
        "allocations.get" => {
            let b: AllocationRef = parse(method, body)?;
            Ok(to_value(&placer::get(conn, &b.allocation_id)?))
        }
        "allocations.list" => {
            let b: AllocationListBody = parse(method, body)?;
            let f = AllocationFilter {
                pool_id: b.pool_id,
                node_id: b.node_id,
                active_only: b.active_only,
            };
            Ok(json!({ "allocations": placer::list(conn, &f)? }))
        }
        "allocations.release" => {
            let b: AllocationRef = parse(method, body)?;
            write_tx(conn, |tx| {
                Ok(to_value(&placer::release(tx, &b.allocation_id, actor)?))
            })
        }
        other => Err(OpError::NotFound {
            kind: "method",
            id: other.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    const OP: &str = "operator:api";

    fn call(store: &Store, method: &str, body: Value) -> Result<Value, OpError> {
        store
            .with(|c| Ok(dispatch(c, method, body, OP)))
            .map_err(OpError::from)?
    }

    #[test]
    fn a_node_through_the_verbs() -> Result<(), Box<dyn std::error::Error>> {
        let store = Store::open_in_memory()?;
        let site = call(
            &store,
            "sites.create",
            json!({"name": "fra1", "kind": "platform"}),
        )?;
        let pool = call(
            &store,
            "pools.create",
            json!({"name": "h100", "kind": "metal-host", "siteId": site["id"],
                   "hardwareProfile": {"expectedGpuCount": 2, "drivers": {"power": "redfish"}}}),
        )?;
        let pool_id = pool["id"].as_str().ok_or("pool id")?.to_owned();
        let tok = call(
            &store,
            "tokens.create",
            json!({"poolId": pool_id, "maxUses": 1}),
        )?;
        assert!(tok["secret"].as_str().is_some_and(|s| s.contains('.')));
        store.with(|c| {
            crate::model::test_utils::node(c, "node_1", Some(&pool_id))?;
            crate::model::test_utils::ready_host(c, "node_1", 2)?;
            Ok(())
        })?;
        let d = call(&store, "nodes.get", json!({"nodeId": "node_1"}))?;
        assert_eq!(d["capacityBucket"], "available");
        let v = d["version"].as_u64().ok_or("version")?;
        let d = call(
            &store,
            "nodes.taint",
            json!({"nodeId": "node_1", "version": v, "key": "fw"}),
        )?;
        assert_eq!(d["noScheduleReasons"], json!(["taint:fw"]));
        assert_eq!(d["capacityBucket"], "unhealthy");
        let stale = call(
            &store,
            "nodes.cordon",
            json!({"nodeId": "node_1", "version": v}),
        );
        assert_eq!(
            stale.err().map(|e| e.code()),
            Some(bc_protocol::ErrorCode::Conflict)
        );
        let d = call(
            &store,
            "nodes.untaint",
            json!({"nodeId": "node_1", "version": v + 1, "key": "fw"}),
        )?;
        let a = call(
            &store,
            "allocations.create",
            json!({"poolId": pool_id, "gpus": 2}),
        )?;
        assert_eq!(a["nodeId"], "node_1");
        let cap = call(&store, "pools.capacity", json!({"poolId": pool_id}))?;
        assert_eq!(cap["buckets"]["available"], 2);
        assert_eq!(cap["free"], 0);
        let d = call(
            &store,
            "nodes.drain",
            json!({"nodeId": "node_1", "version": d["version"]}),
        )?;
        assert_eq!(d["noScheduleReasons"], json!(["draining"]));
        call(
            &store,
            "allocations.release",
            json!({"allocationId": a["id"]}),
        )?;
        let d = call(&store, "nodes.get", json!({"nodeId": "node_1"}))?;
        assert_eq!(d["noScheduleReasons"], json!([]));
        assert_eq!(d["cordoned"], true);
        let listed = call(&store, "nodes.list", json!({"schedulable": false}))?;
        assert_eq!(listed["nodes"].as_array().map(Vec::len), Some(1));
        let ev = call(&store, "nodes.events", json!({"nodeId": "node_1"}))?;
        assert!(ev["events"].as_array().is_some_and(|e| e.len() >= 6));
        Ok(())
    }

    #[test]
    fn bad_requests_are_clear_errors() -> Result<(), Box<dyn std::error::Error>> {
        let store = Store::open_in_memory()?;
        let unknown = call(&store, "nodes.frobnicate", json!({}));
        assert_eq!(
            unknown.err().map(|e| e.code()),
            Some(bc_protocol::ErrorCode::NotFound)
        );
        let missing = call(&store, "nodes.cordon", json!({"nodeId": "n"})).err();
        let msg = missing
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default();
        assert_eq!(
            missing.map(|e| e.code()),
            Some(bc_protocol::ErrorCode::InvalidArgument)
        );
        assert!(msg.contains("version"), "{msg}");
        let extra = call(&store, "nodes.get", json!({"nodeId": "n", "bogus": 1}));
        assert_eq!(
            extra.err().map(|e| e.code()),
            Some(bc_protocol::ErrorCode::InvalidArgument)
        );
        let kind = call(
            &store,
            "pools.create",
            json!({"name": "x", "kind": "gpu-farm"}),
        );
        assert_eq!(
            kind.err().map(|e| e.code()),
            Some(bc_protocol::ErrorCode::InvalidArgument)
        );
        assert_eq!(
            call(&store, "pools.list", Value::Null)?,
            json!({"pools": []})
        );
        Ok(())
    }
}
