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
    let commands = Commands {
        store: store.clone(),
        sessions: Arc::clone(&sessions),
    };
    Core {
        store: store.clone(),
        bare_metal: crate::bare_metal::BareMetal::new(
            commands.clone(),
            crate::bare_metal::CredentialKey::generate(),
            Default::default(),
        ),
        commands,
        sessions,
        issuer: TokenIssuer {
            ca_pin: "sha256:00".into(),
            control_plane: "https://127.0.0.1:7443".into(),
        },
        replica: crate::status::ReplicaIdentity {
            id: "gw-test".into(),
            gateway_url: "https://127.0.0.1:7443".into(),
        },
    }
}

/// Runs `method` as the HTTP adapter does: name, body, dispatch, JSON answer.
pub(super) fn call(store: &Store, method: &str, body: Value) -> Result<Value, OpError> {
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
    let store = cpl_store::testing::store()?;
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
    let store = cpl_store::testing::store()?;
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
    assert_eq!(call(&store, "pools.list", json!({}))?, json!({"pools": []}));
    Ok(())
}

#[test]
fn tokens_create_is_one_verb_with_the_served_defaults() -> Result<(), Box<dyn std::error::Error>> {
    let store = cpl_store::testing::store()?;
    let before = cpl_store::now_ms();
    let tok = call(&store, "tokens.create", json!({}))?;
    let mut keys: Vec<&str> = tok
        .as_object()
        .ok_or("an object")?
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "caPin",
            "controlPlane",
            "expiresAt",
            "id",
            "maxUses",
            "poolId",
            "siteId",
            "token"
        ]
    );
    assert_eq!(tok["maxUses"], Value::Null, "unlimited by default");
    assert_eq!(tok["controlPlane"], "https://127.0.0.1:7443");
    // One hour by default.
    let listed = call(&store, "tokens.list", json!({}))?;
    let expires = listed["tokens"][0]["expiresAt"]
        .as_i64()
        .ok_or("expiresAt")?;
    let ttl = expires - before;
    assert!((3_600_000..3_660_000).contains(&ttl), "ttl {ttl} ms");
    for (body, what) in [
        (json!({"ttlSeconds": 0}), "ttlSeconds"),
        (
            json!({"ttlSeconds": MAX_TOKEN_TTL_SECONDS + 1}),
            "ttlSeconds",
        ),
        (json!({"maxUses": 0}), "maxUses"),
        (json!({"ttl": 5}), "unknown field"),
    ] {
        let err = call(&store, "tokens.create", body).err().ok_or("refused")?;
        assert_eq!(err.code(), bc_protocol::ErrorCode::InvalidArgument);
        assert!(err.to_string().contains(what), "{err}");
    }
    let longest = call(
        &store,
        "tokens.create",
        json!({"ttlSeconds": MAX_TOKEN_TTL_SECONDS, "maxUses": 3}),
    )?;
    assert_eq!(longest["maxUses"], 3);
    Ok(())
}

#[test]
fn a_site_token_is_good_for_one_join_unless_asked_for_more()
-> Result<(), Box<dyn std::error::Error>> {
    let store = cpl_store::testing::store()?;
    let site = call(
        &store,
        "sites.create",
        json!({"name": "dc1", "kind": "platform"}),
    )?;
    let site_id = site["id"].as_str().ok_or("site id")?;
    // A site token places a site agent, the appliance that gets every BMC password of its
    // site: one use unless the operator asks for more (issue 30.10).
    let one = call(&store, "tokens.create", json!({"siteId": site_id}))?;
    assert_eq!(one["maxUses"], 1, "{one}");
    let listed = call(&store, "tokens.list", json!({}))?;
    assert_eq!(listed["tokens"][0]["maxUses"], 1, "{listed}");
    let two = call(
        &store,
        "tokens.create",
        json!({"siteId": site_id, "maxUses": 2}),
    )?;
    assert_eq!(two["maxUses"], 2);
    // A pool token keeps its default (unlimited: a fleet's installs share one).
    let pool = call(
        &store,
        "pools.create",
        json!({"name": "p", "kind": "metal-host", "siteId": site_id}),
    )?;
    let pooled = call(&store, "tokens.create", json!({"poolId": pool["id"]}))?;
    assert_eq!(pooled["maxUses"], Value::Null, "{pooled}");
    Ok(())
}

#[test]
fn command_verbs_refuse_with_their_codes() -> Result<(), Box<dyn std::error::Error>> {
    let store = cpl_store::testing::store()?;
    let code = |r: Result<Value, OpError>| r.err().map(|e| (e.code(), e.to_string()));
    assert_eq!(
        code(call(&store, "commands.get", json!({"commandId": "cmd_x"}))),
        Some((
            bc_protocol::ErrorCode::NotFound,
            "command cmd_x not found".to_owned()
        ))
    );
    let create = |body| code(call(&store, "commands.create", body)).map(|(c, _)| c);
    assert_eq!(
        create(json!({"nodeId": "node_x", "name": "inventory.refresh"})),
        Some(bc_protocol::ErrorCode::NotFound)
    );
    assert_eq!(
        create(json!({"nodeId": "node_x", "name": "inventory.refresh", "timeoutSeconds": 0})),
        Some(bc_protocol::ErrorCode::InvalidArgument)
    );
    assert_eq!(
        create(json!({"nodeId": "node_x", "name": "rm.rf"})),
        Some(bc_protocol::ErrorCode::InvalidArgument),
        "the command name is checked before the node"
    );
    // Erasing every disk is the release/retire workflow's, never an operator's command.
    let clean = code(call(
        &store,
        "commands.create",
        json!({"nodeId": "node_x", "name": "disk.clean", "args": {"mode": "full"}}),
    ));
    assert!(
        matches!(&clean, Some((bc_protocol::ErrorCode::PermissionDenied, m)) if m.contains("nodes.release")),
        "{clean:?}"
    );
    assert_eq!(
        call(&store, "commands.list", json!({}))?,
        json!({"commands": []})
    );
    Ok(())
}

#[test]
fn every_method_is_named_once_and_decodes() {
    let mut names: Vec<&str> = Method::ALL.iter().map(|m| m.name()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), Method::ALL.len(), "a name is used twice");
    for &m in Method::ALL {
        assert_eq!(Method::from_name(m.name()), Some(m));
        // A body of the wrong shape is INVALID_ARGUMENT naming the method, never a panic.
        if let Err(e) = m.decode(json!([1, 2])) {
            assert_eq!(e.code(), bc_protocol::ErrorCode::InvalidArgument);
            assert!(e.to_string().starts_with(m.name()), "{e}");
        }
    }
    assert!(Method::from_name("nodes.frobnicate").is_none());
    assert!(matches!(
        Method::PoolsList.decode(json!({})),
        Ok(Request::PoolsList(_))
    ));
}

/// Issue 30.11: a verb without fields takes `{}` and nothing else, and no verb takes a JSON
/// `null` for its body (an absent body is the HTTP adapter's `{}`).
#[test]
fn verbs_without_fields_take_only_an_empty_object_and_no_verb_takes_null() {
    for m in [
        Method::PoolsList,
        Method::SitesList,
        Method::TokensList,
        Method::ControlPlaneStatus,
    ] {
        assert!(m.decode(json!({})).is_ok(), "{m}");
        for bad in [
            json!({"poolId": "p"}),
            json!([]),
            json!(1),
            json!("x"),
            Value::Null,
        ] {
            let e = m.decode(bad.clone()).err();
            assert!(
                e.as_ref()
                    .is_some_and(|e| e.code() == bc_protocol::ErrorCode::InvalidArgument
                        && e.to_string().starts_with(m.name())),
                "{m} took {bad}: {e:?}"
            );
        }
    }
    for &m in Method::ALL {
        let e = m.decode(Value::Null).err();
        assert!(
            e.as_ref()
                .is_some_and(|e| e.to_string().contains("a JSON object")),
            "{m} took null: {e:?}"
        );
    }
    // Lists with filters take `{}` (no filter) as before.
    for m in [
        Method::NodesList,
        Method::CommandsList,
        Method::AllocationsList,
    ] {
        assert!(m.decode(json!({})).is_ok(), "{m}");
    }
}

#[test]
fn the_openapi_document_has_every_method_and_resolves_every_reference()
-> Result<(), Box<dyn std::error::Error>> {
    let doc = serde_json::to_value(openapi::document())?;
    assert!(
        doc["openapi"]
            .as_str()
            .is_some_and(|v| v.starts_with("3.1"))
    );
    assert_eq!(
        doc["components"]["securitySchemes"][openapi::BEARER_SCHEME]["scheme"],
        "bearer"
    );
    assert!(doc["security"][0].get(openapi::BEARER_SCHEME).is_some());
    for &m in Method::ALL {
        let op = &doc["paths"][format!("/v1/{}", m.name())]["post"];
        assert_eq!(op["operationId"], m.name());
        assert!(op["responses"]["200"].is_object() && op["responses"]["default"].is_object());
    }
    // The document itself is readable without the token.
    assert_eq!(
        doc["paths"]["/v1/openapi.json"]["get"]["security"],
        json!([{}])
    );
    // Every $ref points at a schema the document has.
    let text = serde_json::to_string(&doc)?;
    let schemas = doc["components"]["schemas"].as_object().ok_or("schemas")?;
    for part in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
        let name = part.split('"').next().unwrap_or_default();
        assert!(schemas.contains_key(name), "dangling $ref {name}");
    }
    Ok(())
}

/// schemathesis found `allocations.create` answering 503 when the pool has no room: the API's
/// retryable UNAVAILABLE refusal, kept, and now declared in the document.
#[test]
fn the_openapi_document_declares_the_capacity_refusal() -> Result<(), Box<dyn std::error::Error>> {
    let store = cpl_store::testing::store()?;
    let pool = call(
        &store,
        "pools.create",
        json!({"name": "p", "kind": "metal-host"}),
    )?;
    let err = call(
        &store,
        "allocations.create",
        json!({"poolId": pool["id"], "gpus": 2_147_483_648_u64}),
    )
    .err()
    .ok_or("no capacity")?;
    assert_eq!(err.code(), bc_protocol::ErrorCode::Unavailable);
    let doc = serde_json::to_value(openapi::document())?;
    let responses = &doc["paths"]["/v1/allocations.create"]["post"]["responses"];
    assert!(
        responses["503"]["description"]
            .as_str()
            .is_some_and(|d| d.starts_with("UNAVAILABLE"))
    );
    Ok(())
}

/// Issue 32 item 3: `diag.nvml` carries the pool's expected GPUs and expected NVLink links per
/// GPU, unless the operator's arguments say otherwise.
#[test]
fn diag_nvml_takes_the_pools_nvlink_expectation() -> Result<(), Box<dyn std::error::Error>> {
    let store = cpl_store::testing::store()?;
    let pool = call(
        &store,
        "pools.create",
        json!({"name": "nvl", "kind": "metal-host", "hardwareProfile": {
            "expectedGpuCount": 2, "expectedGpuModel": "H100 NVL", "expectedNvlinksPerGpu": 12
        }}),
    )?;
    assert_eq!(pool["hardwareProfile"]["expectedNvlinksPerGpu"], 12);
    let mut n = cpl_store::testing::new_node("node_nvl");
    n.pool_id = pool["id"].as_str().map(str::to_owned);
    store.write_blocking(|tx| tx.insert_node(&n, 1))?;
    let args_of = |body: Value| -> Result<Value, Box<dyn std::error::Error>> {
        let c = call(&store, "commands.create", body)?;
        let got = call(&store, "commands.get", json!({"commandId": c["id"]}))?;
        Ok(got["args"].clone())
    };
    let a = args_of(json!({"nodeId": "node_nvl", "name": "diag.nvml"}))?;
    assert_eq!(a["expectedNvlinksPerGpu"], 12, "{a}");
    assert_eq!(
        a["expectedGpus"],
        json!({"count": 2, "name": "H100 NVL"}),
        "{a}"
    );
    // The operator's own expectation wins, key by key.
    let a = args_of(json!({"nodeId": "node_nvl", "name": "diag.nvml",
        "args": {"expectedNvlinksPerGpu": 0}}))?;
    assert_eq!(a["expectedNvlinksPerGpu"], 0, "{a}");
    assert_eq!(a["expectedGpus"]["count"], 2, "{a}");
    Ok(())
}

/// Issue 33: the operator verbs of health remediation are in the document schemathesis reads
/// (`tests/e2e/tests/schemathesis.rs` generates requests for every operation in it), with the
/// shapes their answers are checked against, and `nodes.get` declares `maintenanceReason`.
#[test]
fn the_openapi_document_has_the_remediation_verbs_and_their_shapes()
-> Result<(), Box<dyn std::error::Error>> {
    let doc = serde_json::to_value(openapi::document())?;
    let schemas = &doc["components"]["schemas"];
    let schema_of = |r: &serde_json::Value| -> String {
        r["content"]["application/json"]["schema"]["$ref"]
            .as_str()
            .unwrap_or_default()
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_owned()
    };
    for (method, request, answer) in [
        ("pools.setRemediation", "PoolRemediationRequest", "Pool"),
        (
            "pools.resumeRemediation",
            "ResumeRemediationRequest",
            "Pool",
        ),
        (
            "nodes.setRemediation",
            "SetRemediationRequest",
            "NodeDetail",
        ),
        (
            "remediations.list",
            "RemediationListRequest",
            "RemediationList",
        ),
        ("remediations.get", "RemediationRef", "RemediationView"),
    ] {
        let op = &doc["paths"][format!("/v1/{method}")]["post"];
        assert_eq!(op["operationId"], method);
        assert_eq!(schema_of(&op["requestBody"]), request, "{method}");
        assert_eq!(schema_of(&op["responses"]["200"]), answer, "{method}");
    }
    let policy = &schemas["RemediationPolicy"]["properties"];
    for field in [
        "mode",
        "ladders",
        "maxConcurrent",
        "maxConcurrentPercent",
        "maxPerHour",
        "drainGraceSeconds",
        "drain",
    ] {
        assert!(policy.get(field).is_some(), "RemediationPolicy.{field}");
    }
    let view = &schemas["RemediationView"]["properties"];
    for field in [
        "nodeId", "fault", "step", "since", "attempts", "nextStep", "waiting",
    ] {
        assert!(view.get(field).is_some(), "RemediationView.{field}");
    }
    assert!(
        schemas["NodeDetail"]["properties"]
            .get("maintenanceReason")
            .is_some(),
        "NodeDetail.maintenanceReason"
    );
    Ok(())
}
