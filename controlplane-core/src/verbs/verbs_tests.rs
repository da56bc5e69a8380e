//! The verbs through the one dispatcher, as the HTTP adapter calls them: typed requests decoded
//! from JSON, typed answers encoded back, and refusals keeping their codes.

use std::sync::Arc;

use serde_json::{Value, json};

use super::*;
use crate::commands::Commands;
use crate::port::NoSessions;
use crate::test_utils::StoreExt;
use cpl_store::Store;

const OP: &str = "operator:api";

fn core(store: &Store) -> Core {
    let sessions: Arc<dyn crate::port::AgentSessions> = Arc::new(NoSessions);
    Core {
        store: store.clone(),
        commands: Commands {
            store: store.clone(),
            sessions: Arc::clone(&sessions),
        },
        sessions,
        issuer: TokenIssuer {
            ca_pin: "sha256:00".into(),
            control_plane: "https://127.0.0.1:7443".into(),
        },
    }
}

/// Runs `method` as the HTTP adapter does: name, body, dispatch, JSON answer.
fn call(store: &Store, method: &str, body: Value) -> Result<Value, OpError> {
    let m = Method::from_name(method).ok_or_else(|| OpError::NotFound {
        kind: "method",
        id: method.to_owned(),
    })?;
    let req = m.decode(body)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| OpError::Internal(e.to_string()))?;
    let answer = rt.block_on(core(store).dispatch(req, OP))?;
    serde_json::to_value(answer).map_err(|e| OpError::Internal(e.to_string()))
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
    // The one tokens.create: the token `<id>.<secret>` with what an agent needs to join.
    assert!(tok["token"].as_str().is_some_and(|s| s.contains('.')));
    assert_eq!(tok["caPin"], "sha256:00");
    assert_eq!(tok["maxUses"], 1);
    store.with(|c| {
        crate::test_utils::node(c, "node_1", Some(&pool_id))?;
        crate::test_utils::ready_host(c, "node_1", 2)?;
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
