//! What the verbs refuse before anything is stored: operator strings past their limits or with
//! characters a terminal would interpret (`crate::text`), numbers the store cannot hold, and
//! command arguments that break their typed contract.

use serde_json::{Value, json};

use super::verbs_tests::call;
use crate::error::OpError;
use crate::test_utils::StoreExt;
use bc_protocol::ErrorCode;
use cpl_store::Store;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// The refusal's code and message, `None` when the call succeeded.
fn refusal(r: Result<Value, OpError>) -> Option<(ErrorCode, String)> {
    r.err().map(|e| (e.code(), e.to_string()))
}

/// Asserts `INVALID_ARGUMENT` with a message naming `field`.
fn assert_refused(store: &Store, method: &str, body: Value, field: &str) {
    let got = refusal(call(store, method, body.clone()));
    let Some((code, msg)) = got else {
        panic!(
            "{method} accepted {}",
            &body.to_string()[..body.to_string().len().min(200)]
        );
    };
    assert_eq!(code, ErrorCode::InvalidArgument, "{method}: {msg}");
    assert!(
        msg.contains(field),
        "{method}: message does not name {field}: {msg}"
    );
    assert!(
        msg.len() < 1000,
        "the message must not echo the value: {} bytes",
        msg.len()
    );
    assert!(!msg.contains('\u{1b}') && !msg.contains('\0'), "{msg:?}");
}

#[test]
fn operator_strings_have_limits_and_a_character_set() -> TestResult {
    let store = cpl_store::testing::store()?;
    let huge = "n".repeat(65_536);
    assert_refused(
        &store,
        "pools.create",
        json!({"name": huge, "kind": "metal-host"}),
        "name",
    );
    assert_refused(
        &store,
        "sites.create",
        json!({"name": "a\u{0}b", "kind": "platform"}),
        "name",
    );
    assert_refused(
        &store,
        "sites.create",
        json!({"name": "\u{1b}[2Jx", "kind": "platform"}),
        "name",
    );
    assert_refused(
        &store,
        "pools.create",
        json!({"name": "p", "kind": "metal-host", "hardwareProfile": {"expectedGpuModel": "H100\u{1b}"}}),
        "hardwareProfile",
    );
    assert_refused(
        &store,
        "pools.create",
        json!({"name": "p", "kind": "metal-host", "ownerTenantId": "acme corp"}),
        "ownerTenantId",
    );
    assert_refused(
        &store,
        "tokens.create",
        json!({"description": "x".repeat(1025)}),
        "description",
    );
    assert_refused(
        &store,
        "nodes.get",
        json!({"nodeId": "n".repeat(129)}),
        "nodeId",
    );
    assert_refused(&store, "commands.list", json!({"nodeId": "a/b"}), "nodeId");

    let site = call(
        &store,
        "sites.create",
        json!({"name": "fra1", "kind": "platform"}),
    )?;
    let site_id = site["id"].as_str().ok_or("site id")?;
    assert_refused(
        &store,
        "sites.update",
        json!({"siteId": site_id, "version": 1, "name": "x".repeat(129)}),
        "name",
    );
    let pool = call(
        &store,
        "pools.create",
        json!({"name": "Zürich h100", "kind": "metal-host"}),
    )?;
    assert_eq!(pool["name"], "Zürich h100", "printable Unicode is fine");
    store.with(|c| {
        crate::test_utils::node(c, "node_1", None)?;
        Ok(())
    })?;
    let node = |f: &str, v: Value| {
        let mut body = json!({"nodeId": "node_1", "version": 1});
        if let Some(o) = body.as_object_mut() {
            o.insert(f.to_owned(), v);
        }
        body
    };
    let mut taint = node("key", json!("k".repeat(64)));
    assert_refused(&store, "nodes.taint", taint.clone(), "key");
    taint["key"] = json!("gpu");
    taint["value"] = json!("v".repeat(257));
    assert_refused(&store, "nodes.taint", taint, "value");
    let mut maint = node("maintenance", json!(true));
    maint["reason"] = json!("firmware\nupdate");
    assert_refused(&store, "nodes.setMaintenance", maint, "reason");
    assert_refused(
        &store,
        "nodes.startDedicatedRoot",
        node("tenantId", json!("")),
        "tenantId",
    );
    assert_refused(
        &store,
        "nodes.approveRejoin",
        node("requestId", json!("rejoin_\u{1b}[2J")),
        "requestId",
    );
    assert_refused(
        &store,
        "nodes.move",
        node("poolId", json!("p".repeat(129))),
        "poolId",
    );
    // Nothing of the above was stored.
    assert_eq!(
        call(&store, "nodes.get", json!({"nodeId": "node_1"}))?["version"],
        1
    );
    assert_eq!(
        call(&store, "sites.list", json!({}))?["sites"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );
    Ok(())
}

#[test]
fn the_openapi_document_carries_the_string_limits() -> TestResult {
    let doc = serde_json::to_value(super::openapi::document())?;
    let schemas = &doc["components"]["schemas"];
    let name = schemas["NewPool"]["properties"]["name"]["$ref"]
        .as_str()
        .ok_or("name ref")?;
    let name = &schemas[name.rsplit('/').next().ok_or("ref")?];
    assert_eq!(name["maxLength"], 128);
    assert!(name["pattern"].is_string());
    let key = schemas["TaintRequest"]["properties"]["key"]["$ref"]
        .as_str()
        .ok_or("key ref")?;
    assert_eq!(
        schemas[key.rsplit('/').next().ok_or("ref")?]["maxLength"],
        63
    );
    Ok(())
}

#[test]
fn a_max_uses_the_store_cannot_hold_is_refused_not_clamped() -> TestResult {
    let store = cpl_store::testing::store()?;
    let (code, msg) = refusal(call(&store, "tokens.create", json!({"maxUses": u64::MAX})))
        .ok_or("2^64-1 was accepted")?;
    assert_eq!(code, ErrorCode::InvalidArgument);
    assert!(msg.contains("maxUses"), "{msg}");
    let largest = i64::MAX as u64;
    let ok = call(&store, "tokens.create", json!({"maxUses": largest}))?;
    assert_eq!(ok["maxUses"], largest);
    let listed = call(&store, "tokens.list", json!({}))?;
    assert_eq!(listed["tokens"].as_array().map(Vec::len), Some(1));
    assert_eq!(listed["tokens"][0]["maxUses"], largest, "stored as given");
    Ok(())
}

#[test]
fn command_arguments_are_checked_against_their_contract_at_create() -> TestResult {
    let store = cpl_store::testing::store()?;
    store.with(|c| {
        crate::test_utils::node(c, "node_1", None)?;
        Ok(())
    })?;
    let create = |name: &str, args: Value| {
        refusal(call(
            &store,
            "commands.create",
            json!({"nodeId": "node_1", "name": name, "args": args}),
        ))
    };
    for (name, args, field) in [
        ("logs.collect", json!({"maxBytes": -1}), "maxBytes"),
        ("logs.collect", json!({"maxBytes": 0}), "maxBytes"),
        ("gpu.reset", json!({"force": true}), "gpus"),
        ("gpu.reset", json!({"gpus": []}), "gpus"),
        (
            "node.reboot",
            json!({"force": true, "delaySeconds": 86400}),
            "delaySeconds",
        ),
        ("node.reboot", json!({"mode": "hard"}), "hard"),
    ] {
        let (code, msg) = create(name, args.clone()).ok_or(format!("{name} {args} accepted"))?;
        assert_eq!(code, ErrorCode::InvalidArgument, "{name} {args}: {msg}");
        assert!(msg.contains(field) && msg.contains(name), "{name}: {msg}");
    }
    let listed = call(&store, "commands.list", json!({}))?;
    assert_eq!(listed["commands"], json!([]), "nothing was queued");
    // The contract's defaults still pass, `force` is the control plane's own.
    assert_eq!(
        create("gpu.reset", json!({"gpus": "all", "force": true})),
        None
    );
    assert_eq!(create("logs.collect", json!({"since": "2h"})), None);
    Ok(())
}

#[test]
fn labels_through_the_verbs_and_the_list_filter() -> TestResult {
    let store = cpl_store::testing::store()?;
    store.with(|c| {
        crate::test_utils::node(c, "node_1", None)?;
        crate::test_utils::node(c, "node_2", None)?;
        Ok(())
    })?;
    let d = call(
        &store,
        "nodes.setLabels",
        json!({"nodeId": "node_1", "version": 1, "labels": {"rack": "r7", "tier": "gold"}}),
    )?;
    assert_eq!(d["labels"], json!({"rack": "r7", "tier": "gold"}));
    assert_eq!(d["version"], 2);
    call(
        &store,
        "nodes.setLabels",
        json!({"nodeId": "node_2", "version": 1, "labels": {"rack": "r7"}}),
    )?;
    let ids = |filter: Value| -> Result<Vec<String>, OpError> {
        let v = call(&store, "nodes.list", filter)?;
        Ok(v["nodes"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|n| n["id"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default())
    };
    assert_eq!(
        ids(json!({"labels": {"rack": "r7"}}))?,
        vec!["node_1", "node_2"]
    );
    assert_eq!(
        ids(json!({"labels": {"rack": "r7", "tier": "gold"}}))?,
        vec!["node_1"]
    );
    assert_eq!(
        ids(json!({"labels": {"rack": "r8"}}))?,
        Vec::<String>::new()
    );
    // A stale version is CONFLICT; removing is by key.
    let stale = refusal(call(
        &store,
        "nodes.removeLabels",
        json!({"nodeId": "node_1", "version": 1, "keys": ["tier"]}),
    ));
    assert_eq!(stale.map(|(c, _)| c), Some(ErrorCode::Conflict));
    let d = call(
        &store,
        "nodes.removeLabels",
        json!({"nodeId": "node_1", "version": 2, "keys": ["tier"]}),
    )?;
    assert_eq!(d["labels"], json!({"rack": "r7"}));
    // Keys and values have the limits of crate::text.
    assert_refused(
        &store,
        "nodes.setLabels",
        json!({"nodeId": "node_1", "version": 3, "labels": {"-bad": "v"}}),
        "labels",
    );
    assert_refused(
        &store,
        "nodes.setLabels",
        json!({"nodeId": "node_1", "version": 3, "labels": {"k": "v\u{1b}"}}),
        "labels",
    );
    assert_refused(
        &store,
        "nodes.list",
        json!({"labels": {"k": "x".repeat(257)}}),
        "labels",
    );
    let doc = serde_json::to_value(super::openapi::document())?;
    assert!(doc["paths"]["/v1/nodes.setLabels"]["post"].is_object());
    assert!(doc["paths"]["/v1/nodes.removeLabels"]["post"].is_object());
    Ok(())
}

/// Issue 30.9: `bmc.address` has the `text` rules of names (a length limit, no control or
/// formatting character) and more: no whitespace, a parsed host that is an IP address or a DNS
/// name (never an option for ipmitool), a system path of one plain segment (no percent-encoded
/// traversal), and no credentials; a refusal never echoes what might be a password.
#[test]
fn bmc_addresses_have_limits_a_parsed_host_and_echo_no_secret() -> TestResult {
    let store = cpl_store::testing::store()?;
    let site = call(
        &store,
        "sites.create",
        json!({"name": "dc1", "kind": "platform"}),
    )?;
    let site_id = site["id"].as_str().ok_or("site id")?.to_owned();
    let enroll = |address: &str| {
        json!({"siteId": site_id, "inspect": false, "bmc": {
            "address": address, "username": "admin", "password": "pw"}})
    };
    let huge = format!(
        "redfish+https://10.0.0.5/redfish/v1/Systems/{}",
        "1".repeat(300_000)
    );
    for bad in [
        huge.as_str(),
        "redfish+https://10.0.0.5/redfish/v1/Systems/1\n",
        "redfish+https://10.0.0.5/redfish/v1/Systems/1\nX-Injected: 1",
        "redfish+https://10.0.0.5\t/redfish/v1/Systems/1",
        "redfish+https://10.0.0.5/redfish/v1/Systems/1\u{0}",
        "redfish+https://10.0.0.5 /redfish/v1/Systems/1",
        "redfish+https://10.0.0.5/redfish/v1/Systems/..%2f..%2fManagers%2f1",
        "redfish+https://10.0.0.5/redfish/v1/Systems/%2e%2e",
        "redfish+https://10.0.0.5/redfish/v1/Systems/1%00",
        "redfish+https://10.0.0.5/redfish/v1/Systems/a\\b",
        "redfish+https://10.0.0.5/redfish/v1/Systems/..",
        "ipmi://-oProxyCommand=x",
        "ipmi://-oProxyCommand=x:623",
        "ipmi://bmc_1.example",
        "ipmi://bmc..example",
        "ipmi://bmc-.example",
        "redfish+http://-h/redfish/v1/Systems/1",
        "ipmi://a%20b",
        "ipmi://\u{202e}1.0.0.10",
    ] {
        assert_refused(&store, "nodes.enroll", enroll(bad), "bmc.address");
    }
    // A password in the address, even one holding '/' (which ends the authority for a parser),
    // is refused without being repeated.
    for (bad, secret) in [
        ("redfish+https://root:s3cr/et@10.0.0.5", "s3cr"),
        (
            "redfish+https://root:hunter2@10.0.0.5/redfish/v1/Systems/1",
            "hunter2",
        ),
        ("ipmi://admin:pa%2Fss@10.0.0.5", "pa%2Fss"),
        ("ipmi://admin:pa ss@10.0.0.5", "pa ss"),
    ] {
        let (code, msg) =
            refusal(call(&store, "nodes.enroll", enroll(bad))).ok_or(format!("{bad} accepted"))?;
        assert_eq!(code, ErrorCode::InvalidArgument, "{msg}");
        assert!(msg.contains("bmc.address"), "{msg}");
        assert!(
            !msg.contains(secret),
            "the refusal echoes the password: {msg}"
        );
    }
    assert_eq!(
        call(&store, "nodes.list", json!({}))?["nodes"],
        json!([]),
        "nothing was enrolled"
    );
    for good in [
        "redfish+https://10.0.0.5/redfish/v1/Systems/System.Embedded.1",
        "redfish+https://10.0.0.6:8443/redfish/v1/Systems/437XR1138R2/",
        "redfish+http://bmc-17.example.org:8000",
        "ipmi://[fd00::5]:623",
        "ipmi://10.0.0.7",
        "ipmi://bmc-18",
    ] {
        let n = call(&store, "nodes.enroll", enroll(good));
        assert!(n.is_ok(), "{good}: {n:?}");
    }
    Ok(())
}
