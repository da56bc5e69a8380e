//! Operating a live node through bcctl and the API: commands, cordon, specs, trust.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use bc_e2e::{Agent, ControlPlane, eventually};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

fn pool(cp: &ControlPlane) -> String {
    cp.metal_host_pool()
}

fn joined(cp: &ControlPlane, dir: &std::path::Path) -> (Agent, String) {
    let pool = pool(cp);
    let token = cp.create_token(&["--pool", &pool]);
    let agent = Agent::start(cp, dir, Some(&token), &[]);
    let id = agent.node_id();
    eventually(WAIT, "adopted and converged", || {
        let n = cp.node(&id);
        (n["provisionState"] == "adopted"
            && n["observedGeneration"] == 1
            && n["connectivity"] == "connected")
            .then_some(())
    });
    (agent, id)
}

#[test]
fn inventory_refresh_runs_once_and_reports_through_bcctl() {
    let tmp = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&tmp.path().join("cp"));
    let (agent, id) = joined(&cp, &tmp.path().join("agent"));
    let n = cp.node(&id);
    assert_eq!(n["role"], "host");
    assert_eq!(n["schedulable"], true, "{n}");

    let (ok, out, err) = cp.bcctl(&[
        "nodes",
        "run",
        &id,
        "inventory.refresh",
        "--wait",
        "-o",
        "json",
    ]);
    assert!(ok, "{err}\n{}", agent.log_text());
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["state"], "succeeded", "{v}");
    assert_eq!(
        v["result"]["cpuThreads"].as_u64(),
        Some(bc_e2e::real_cpu_threads())
    );
    let cmd_id = v["id"].as_str().unwrap();
    // The agent journaled it in its state dir.
    let journal = std::fs::read_to_string(
        agent
            .state_dir
            .join("commands")
            .join(format!("{cmd_id}.json")),
    )
    .unwrap();
    assert!(journal.contains("\"succeeded\""), "{journal}");

    // An unknown command name is refused before it is queued.
    let (status, body) = cp.call("commands.create", json!({"nodeId": id, "name": "rm.rf"}));
    assert_eq!(status, 400, "{body}");
}

#[test]
fn commands_queued_while_disconnected_run_on_reconnect_or_expire() {
    let tmp = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&tmp.path().join("cp"));
    let dir = tmp.path().join("agent");
    let (mut agent, id) = joined(&cp, &dir);
    agent.kill9();

    let queued = cp.ok(
        "commands.create",
        json!({"nodeId": id, "name": "inventory.refresh", "timeoutSeconds": 60}),
    );
    let short = cp.ok(
        "commands.create",
        json!({"nodeId": id, "name": "inventory.refresh", "timeoutSeconds": 1}),
    );
    assert_eq!(queued["state"], "queued");
    let expired = eventually(WAIT, "short command expires", || {
        let c = cp.ok("commands.get", json!({"commandId": short["id"]}));
        (c["state"] == "expired").then_some(c)
    });
    assert_eq!(expired["error"]["code"], "DEADLINE_EXCEEDED");

    let _agent = Agent::start(&cp, &dir, None, &[]);
    let done = eventually(WAIT, "queued command runs after reconnect", || {
        let c = cp.ok("commands.get", json!({"commandId": queued["id"]}));
        (c["state"] == "succeeded").then_some(c)
    });
    assert!(done["sentAt"].is_string() && done["finishedAt"].is_string());
    // The expired one was never run.
    let c = cp.ok("commands.get", json!({"commandId": short["id"]}));
    assert_eq!(c["state"], "expired");
    assert!(
        !dir.join("commands")
            .join(format!("{}.json", short["id"].as_str().unwrap()))
            .exists()
    );
}

#[test]
fn cordon_spec_generations_and_tenant_controlled_trust() {
    let tmp = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&tmp.path().join("cp"));
    let (_agent, id) = joined(&cp, &tmp.path().join("agent"));

    let (ok, out, err) = cp.bcctl(&["nodes", "cordon", &id, "-o", "json"]);
    assert!(ok, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["cordoned"], true);
    assert_eq!(v["schedulable"], false);
    assert_eq!(v["capacityBucket"], "maintenance");
    // A stale version is a CONFLICT.
    let (status, body) = cp.call("nodes.uncordon", json!({"nodeId": id, "version": 1}));
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("CONFLICT")),
        "{body}"
    );
    let (ok, _, err) = cp.bcctl(&["nodes", "uncordon", &id]);
    assert!(ok, "{err}");

    // A new empty generation converges; observedGeneration follows.
    let n = cp.node(&id);
    let v = cp.ok(
        "nodes.updateSpec",
        json!({"nodeId": id, "version": n["version"], "spec": {}}),
    );
    assert_eq!(v["generation"], 2);
    eventually(WAIT, "observedGeneration 2", || {
        (cp.node(&id)["observedGeneration"] == 2).then_some(())
    });

    // Tenant-controlled: only read-only commands.
    let n = cp.node(&id);
    cp.ok(
        "nodes.startDedicatedRoot",
        json!({"nodeId": id, "version": n["version"], "tenantId": "t1"}),
    );
    let (status, body) = cp.call(
        "commands.create",
        json!({"nodeId": id, "name": "node.reboot"}),
    );
    assert_eq!(
        (status, body["code"].as_str()),
        (403, Some("PERMISSION_DENIED")),
        "{body}"
    );
    let (status, _) = cp.call(
        "commands.create",
        json!({"nodeId": id, "name": "inventory.refresh"}),
    );
    assert_eq!(status, 200);
}

/// A public key (not a secret) for the break-glass tests.
const KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA8sbL4rFDmnZfcn2jJLWdVsH4Gq+DHu2p/7JO1IqLsN";

#[test]
fn break_glass_keys_converge_through_the_agent_and_never_reach_a_tenant_controlled_node() {
    let tmp = tempfile::tempdir().unwrap();
    // A host root with one user, so the agent writes under the test's tree, not /root.
    let root = tmp.path().join("root");
    std::fs::create_dir_all(root.join("etc")).unwrap();
    std::fs::create_dir_all(root.join("home/ops")).unwrap();
    std::fs::write(
        root.join("etc/passwd"),
        "ops:x:4242:4242::/home/ops:/bin/sh\n",
    )
    .unwrap();
    std::fs::create_dir_all(root.join("home/ops/.ssh")).unwrap();
    std::fs::write(
        root.join("home/ops/.ssh/authorized_keys"),
        "ssh-ed25519 AAAAuserkey me@laptop\n",
    )
    .unwrap();

    let cp = ControlPlane::start(&tmp.path().join("cp"));
    let token = cp.create_token(&[]);
    let agent = Agent::start(
        &cp,
        &tmp.path().join("agent"),
        Some(&token),
        &["--root", root.to_str().unwrap()],
    );
    let id = agent.node_id();
    eventually(WAIT, "converged", || {
        (cp.node(&id)["observedGeneration"] == 1).then_some(())
    });

    // A bad key is INVALID_ARGUMENT and changes nothing.
    let n = cp.node(&id);
    let (status, body) = cp.call(
        "nodes.updateSpec",
        json!({"nodeId": id, "version": n["version"], "spec": {"breakGlassSsh": {"user": "ops", "keys": [{"publicKey": "ssh-ed25519 nonsense"}]}}}),
    );
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("INVALID_ARGUMENT")),
        "{body}"
    );

    let spec = json!({"breakGlassSsh": {"user": "ops", "keys": [{"publicKey": KEY, "comment": "oncall"}]}});
    let (ok, _, err) = cp.bcctl(&["nodes", "update-spec", &id, &spec.to_string()]);
    assert!(ok, "{err}");
    eventually(WAIT, "generation 2 converged", || {
        (cp.node(&id)["observedGeneration"] == 2).then_some(())
    });
    let keys = std::fs::read_to_string(root.join("home/ops/.ssh/authorized_keys")).unwrap();
    assert!(
        keys.starts_with("ssh-ed25519 AAAAuserkey me@laptop\n"),
        "user lines kept: {keys}"
    );
    assert!(keys.contains(KEY), "{keys}");

    // Tenant-controlled: a spec with keys is refused.
    let n = cp.node(&id);
    cp.ok(
        "nodes.startDedicatedRoot",
        json!({"nodeId": id, "version": n["version"], "tenantId": "t1"}),
    );
    let n = cp.node(&id);
    let (status, body) = cp.call(
        "nodes.updateSpec",
        json!({"nodeId": id, "version": n["version"], "spec": spec}),
    );
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("INVALID_ARGUMENT")),
        "{body}"
    );
}
