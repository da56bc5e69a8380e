//! Issue: bcd joins controlplane-lite over mutual TLS and the machine becomes an adopted,
//! schedulable node. Real `bcctl serve` and `bcd agent` processes on loopback.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use bc_e2e::{Agent, ControlPlane, eventually, real_cpu_threads, real_macs};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

fn wait_node(cp: &ControlPlane, id: &str, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    eventually(WAIT, what, || {
        let n = cp.node(id);
        pred(&n).then_some(n)
    })
}

fn adopted_connected_converged(n: &Value) -> bool {
    n["provisionState"] == "adopted"
        && n["connectivity"] == "connected"
        && n["observedGeneration"] == 1
}

#[test]
fn agent_joins_and_node_is_adopted_with_real_inventory() {
    let tmp = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&tmp.path().join("cp"));
    let token = cp.create_token(&["--uses", "1"]);
    let agent = Agent::start(&cp, &tmp.path().join("agent"), Some(&token), &[]);
    let id = agent.node_id();
    assert!(id.starts_with("node_"), "{id}");

    let n = wait_node(
        &cp,
        &id,
        "adopted, connected, observedGeneration 1",
        adopted_connected_converged,
    );
    assert_eq!(n["identityGeneration"], 1);
    assert_eq!(n["session"]["epoch"], 1);
    assert!(
        n["session"]["gatewayId"]
            .as_str()
            .is_some_and(|g| g.starts_with("gw-"))
    );
    assert!(
        n.get("power").is_none() && n.get("hardwareKey").is_none() && n.get("adapter").is_none()
    );

    // The inventory is this machine's.
    let inv = &n["inventory"];
    assert_eq!(inv["cpuThreads"].as_u64(), Some(real_cpu_threads()));
    assert!(inv["memoryBytes"].as_u64().unwrap_or(0) > 0);
    let reported: Vec<(String, String)> = inv["nics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["name"].as_str().unwrap().to_owned(),
                n["mac"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    for (name, mac) in real_macs() {
        assert!(
            reported.contains(&(name.clone(), mac.clone())),
            "{name} {mac} missing from {reported:?}"
        );
    }

    // The event log shows the provision state go adopting -> adopted.
    let events = cp.ok("nodes.events", json!({"nodeId": id}))["events"]
        .as_array()
        .cloned()
        .unwrap();
    let moves: Vec<(Value, Value)> = events
        .iter()
        .filter(|e| e["kind"] == "provisionState")
        .map(|e| (e["from"].clone(), e["to"].clone()))
        .collect();
    assert_eq!(
        moves,
        vec![
            (Value::Null, json!("adopting")),
            (json!("adopting"), json!("adopted"))
        ]
    );

    // bcctl prints the same node as a table and as the API's JSON.
    let (ok, out, err) = cp.bcctl(&["nodes", "list"]);
    assert!(ok, "{err}");
    assert!(
        out.contains(&id) && out.contains("adopted") && out.contains("connected"),
        "{out}"
    );
    let (ok, out, _) = cp.bcctl(&["nodes", "get", &id, "-o", "json"]);
    assert!(ok);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["id"], id.as_str());
    assert_eq!(v["provisionState"], "adopted");
}

#[test]
fn restart_keeps_node_id_and_bumps_epoch_and_sigterm_disconnects() {
    let tmp = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&tmp.path().join("cp"));
    let token = cp.create_token(&["--uses", "1"]);
    let dir = tmp.path().join("agent");
    let mut agent = Agent::start(&cp, &dir, Some(&token), &[]);
    let id = agent.node_id();
    wait_node(&cp, &id, "adopted", adopted_connected_converged);

    // SIGTERM: Goodbye gives `disconnected`, not `unreachable`, and it stays so past the grace.
    assert!(
        agent.sigterm().success(),
        "agent exit status\n{}",
        agent.log_text()
    );
    let n = wait_node(&cp, &id, "disconnected", |n| {
        n["connectivity"] == "disconnected"
    });
    assert!(n["session"]["disconnectedAt"].is_string());
    std::thread::sleep(Duration::from_millis(1500));
    let n = cp.node(&id);
    assert_eq!(n["connectivity"], "disconnected", "{n}");
    assert_eq!(n["noScheduleReasons"], json!([]));

    // Second start: the token is used up, yet no second join happens; same node, epoch 2.
    let _agent = Agent::start(&cp, &dir, None, &[]);
    let n = wait_node(&cp, &id, "reconnected with epoch 2", |n| {
        n["connectivity"] == "connected" && n["session"]["epoch"] == 2
    });
    assert_eq!(n["identityGeneration"], 1);
    assert_eq!(
        cp.nodes().len(),
        1,
        "a restart must not create a second node"
    );
}

#[test]
fn killed_agent_becomes_unreachable_after_the_grace_period() {
    let tmp = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&tmp.path().join("cp"));
    let token = cp.create_token(&[]);
    let mut agent = Agent::start(&cp, &tmp.path().join("agent"), Some(&token), &[]);
    let id = agent.node_id();
    wait_node(&cp, &id, "adopted", adopted_connected_converged);
    agent.kill9();
    let n = wait_node(&cp, &id, "unreachable after kill -9", |n| {
        n["connectivity"] == "unreachable"
    });
    assert_eq!(n["noScheduleReasons"], json!(["unreachable"]));
    // Issue 18 item 10: the broken stream made the node `disconnected` (with `disconnectedAt`)
    // when the transport closed, before the silence rule made it `unreachable`.
    assert!(n["session"]["disconnectedAt"].is_string(), "{n}");
    let moves: Vec<(String, String, String)> =
        cp.ok("nodes.events", json!({"nodeId": id}))["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["kind"] == "connectivity")
            .map(|e| {
                let s = |k: &str| e[k].as_str().unwrap_or_default().to_owned();
                (s("from"), s("to"), s("message"))
            })
            .collect();
    let tail: Vec<(&str, &str)> = moves
        .iter()
        .rev()
        .take(2)
        .rev()
        .map(|(f, t, _)| (f.as_str(), t.as_str()))
        .collect();
    assert_eq!(
        tail,
        [
            ("connected", "disconnected"),
            ("disconnected", "unreachable")
        ],
        "{moves:?}"
    );
    assert!(
        moves
            .iter()
            .any(|(_, t, m)| t == "disconnected" && m.contains("without a Goodbye")),
        "{moves:?}"
    );
    // Back: connected again and the reason is gone.
    let _agent = Agent::start(&cp, &tmp.path().join("agent"), None, &[]);
    let n = wait_node(&cp, &id, "connected again", |n| {
        n["connectivity"] == "connected"
    });
    assert_eq!(n["noScheduleReasons"], json!([]));
}

fn refused(cp: &ControlPlane, dir: &std::path::Path, token: &str, expect: &str) {
    let mut agent = Agent::start(cp, dir, Some(token), &[]);
    let status = agent.wait_exit(WAIT);
    let log = agent.log_text();
    assert!(!status.success(), "agent must fail\n{log}");
    assert!(log.contains(expect), "log must say {expect:?}:\n{log}");
    assert!(!dir.join("node.json").exists(), "no identity may be stored");
}

#[test]
fn wrong_expired_and_used_up_tokens_are_refused_without_creating_nodes() {
    let tmp = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&tmp.path().join("cp"));

    let good = cp.create_token(&["--uses", "1"]);
    let (id_part, _) = good.split_once('.').unwrap();
    refused(
        &cp,
        &tmp.path().join("wrong"),
        &format!("{id_part}.0000000000000000"),
        "is not known",
    );
    refused(
        &cp,
        &tmp.path().join("malformed"),
        "no-dot-here",
        "malformed",
    );

    let short = cp.create_token(&["--ttl", "1s"]);
    std::thread::sleep(Duration::from_millis(1300));
    refused(&cp, &tmp.path().join("expired"), &short, "expired");
    assert!(cp.nodes().is_empty(), "refused joins must create no node");

    // One use: the first agent joins, the second is refused.
    let first = Agent::start(&cp, &tmp.path().join("first"), Some(&good), &[]);
    first.node_id();
    refused(&cp, &tmp.path().join("second"), &good, "no uses left");
    assert_eq!(cp.nodes().len(), 1);
}

#[test]
fn wrong_ca_pin_means_the_token_is_never_sent() {
    let tmp = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&tmp.path().join("cp"));
    let token = cp.create_token(&["--uses", "1"]);
    let wrong_pin = format!("sha256:{}", "ab".repeat(32));
    let dir = tmp.path().join("agent");
    let mut agent = Agent::start_with_pin(&cp, &dir, Some(&token), &wrong_pin, &[]);
    let status = agent.wait_exit(WAIT);
    let log = agent.log_text();
    assert!(!status.success(), "{log}");
    assert!(log.contains("does not present the CA pinned"), "{log}");
    // The token was not spent and no node exists.
    let toks = cp.ok("tokens.list", json!({}));
    assert_eq!(toks["tokens"][0]["uses"], 0, "{toks}");
    assert!(cp.nodes().is_empty());
    // With the right pin the same token still works.
    let agent = Agent::start(&cp, &dir, Some(&token), &[]);
    agent.node_id();
}

#[test]
fn operator_api_requires_the_bearer_token() {
    let tmp = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&tmp.path().join("cp"));
    let resp = reqwest::blocking::Client::new()
        .post(format!("{}/v1/nodes.list", cp.api_url))
        .json(&json!({}))
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    let body: Value = resp.json().unwrap();
    assert_eq!(body["code"], "UNAUTHENTICATED");
    let (status, body) = cp.call("nodes.get", json!({"nodeId": "node_nope"}));
    assert_eq!(status, 404);
    assert_eq!(body["code"], "NOT_FOUND");
    let (status, body) = cp.call("nodes.get", json!({"bogus": 1}));
    assert_eq!(status, 400);
    assert_eq!(body["code"], "INVALID_ARGUMENT");
}
