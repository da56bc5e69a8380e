//! End to end with GPUs: a real `bcctl serve` and `bcd agent` whose NVML is the fake library with
//! eight H100s (NVIDIA's mock profile). diag.nvml and gpu.reset travel as commands; the Health
//! controller turns their results into `GpuUnhealthy` and noScheduleReasons.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fake_nvml;

use std::time::Duration;

use bc_e2e::{Agent, ControlPlane, eventually};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(40);

fn run(cp: &ControlPlane, id: &str, name: &str, args: Value) -> Value {
    let c = cp.ok(
        "commands.create",
        json!({"nodeId": id, "name": name, "args": args, "timeoutSeconds": 120}),
    );
    eventually(WAIT, &format!("{name} finishes"), || {
        let c = cp.ok("commands.get", json!({"commandId": c["id"]}));
        matches!(
            c["state"].as_str(),
            Some("succeeded" | "failed" | "expired")
        )
        .then_some(c)
    })
}

fn condition(n: &Value, t: &str) -> Option<Value> {
    n["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == t)
        .cloned()
}

#[test]
fn diag_fault_marks_unhealthy_and_a_reset_makes_the_node_schedulable_again() {
    if !fake_nvml::fixture_present() {
        return;
    }
    let gpus = fake_nvml::FakeNode::new(&fake_nvml::h100_node());
    let tmp = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&tmp.path().join("cp"));
    let site = cp.ok("sites.create", json!({"name": "s", "kind": "platform"}));
    let pool = cp.ok(
        "pools.create",
        // The fake root has no SMBIOS, so the key is untrusted: the pool accepts that (metal pools
        // require a trusted key by default, issue 18 item 9).
        json!({"name": "h100", "kind": "metal-host", "siteId": site["id"], "hardwareProfile": {"expectedGpuCount": 8, "expectedGpuModel": "H100"},
               "acceptance": {"requireTrustedKey": false}}),
    );
    let token = cp.create_token(&["--pool", pool["id"].as_str().unwrap()]);
    let lib = gpus.cfg.lib_path.clone().unwrap();
    let agent = Agent::start(
        &cp,
        &tmp.path().join("agent"),
        Some(&token),
        &[
            "--nvml-lib",
            lib.to_str().unwrap(),
            "--nvidia-smi",
            gpus.cfg.nvidia_smi.to_str().unwrap(),
            "--root",
            gpus.root.root().to_str().unwrap(),
        ],
    );
    let id = agent.node_id();
    let n = eventually(WAIT, "adopted with 8 NVML GPUs", || {
        let n = cp.node(&id);
        (n["provisionState"] == "adopted"
            && n["observedGeneration"] == 1
            && n["inventory"]["gpus"] == 8)
            .then_some(n)
    });
    assert_eq!(n["schedulable"], true, "{n}\n{}", agent.log_text());

    // Healthy: diag passes and the pool's expectation (8 x H100) was sent along.
    let c = run(&cp, &id, "diag.nvml", json!({}));
    assert_eq!(c["state"], "succeeded", "{c}");
    assert_eq!(c["args"]["expectedGpus"]["count"], 8);
    assert_eq!(c["result"]["verdict"], "pass", "{}", c["result"]["summary"]);
    assert_eq!(
        condition(&cp.node(&id), "GpuUnhealthy").unwrap()["status"],
        "false"
    );

    // A volatile uncorrected ECC error on GPU 2: diag fails, the node leaves scheduling.
    gpus.update(|v| v["gpus"][2]["ecc"]["volatileUncorrected"] = json!(3));
    let c = run(&cp, &id, "diag.nvml", json!({}));
    assert_eq!(c["result"]["verdict"], "fail", "{c}");
    let n = cp.node(&id);
    assert_eq!(
        condition(&n, "GpuUnhealthy").unwrap()["status"],
        "true",
        "{n}"
    );
    assert!(
        n["noScheduleReasons"]
            .as_array()
            .unwrap()
            .contains(&json!("GpuUnhealthy")),
        "{n}"
    );
    assert_eq!(n["schedulable"], false);
    assert_eq!(n["capacityBucket"], "unhealthy");

    // A reset needs a cordon first.
    let uuid = fake_nvml::h100_node()["gpus"][2]["uuid"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, body) = cp.call(
        "commands.create",
        json!({"nodeId": id, "name": "gpu.reset", "args": {"gpus": [uuid]}}),
    );
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("INVALID_STATE")),
        "{body}"
    );
    let (ok, _, err) = cp.bcctl(&["nodes", "cordon", &id]);
    assert!(ok, "{err}");
    let c = run(&cp, &id, "gpu.reset", json!({"gpus": [uuid]}));
    assert_eq!(c["state"], "succeeded", "{c}\n{}", agent.log_text());
    assert_eq!(
        gpus.read()["gpus"][2]["ecc"]["volatileUncorrected"],
        0,
        "the fake nvidia-smi cleared it"
    );
    let n = cp.node(&id);
    assert_eq!(
        condition(&n, "GpuUnhealthy").unwrap()["status"],
        "false",
        "{n}"
    );
    let (ok, _, err) = cp.bcctl(&["nodes", "uncordon", &id]);
    assert!(ok, "{err}");
    assert_eq!(cp.node(&id)["schedulable"], true);

    // A reset-required XID as it happens (NVML event): XidCritical takes the node out.
    gpus.update(|v| v["gpus"][5]["xidEvents"] = json!([62]));
    let n = eventually(WAIT, "XidCritical from the XID watch", || {
        let n = cp.node(&id);
        condition(&n, "XidCritical")
            .is_some_and(|c| c["status"] == "true")
            .then_some(n)
    });
    assert!(
        n["noScheduleReasons"]
            .as_array()
            .unwrap()
            .contains(&json!("XidCritical")),
        "{n}"
    );
    assert_eq!(n["schedulable"], false);
    // A verified reset of that GPU clears it.
    let uuid5 = fake_nvml::h100_node()["gpus"][5]["uuid"]
        .as_str()
        .unwrap()
        .to_owned();
    cp.bcctl(&["nodes", "cordon", &id]);
    let c = run(&cp, &id, "gpu.reset", json!({"gpus": [uuid5]}));
    assert_eq!(c["state"], "succeeded", "{c}");
    let n = cp.node(&id);
    assert_eq!(
        condition(&n, "XidCritical").unwrap()["status"],
        "false",
        "{n}"
    );
    cp.bcctl(&["nodes", "uncordon", &id]);
    assert_eq!(cp.node(&id)["schedulable"], true);

    // Capacity and placement on the real node: 8 GPUs available, 3 booked, drain waits for them.
    let pool_id = pool["id"].as_str().unwrap();
    let cap = cp.ok("pools.capacity", json!({"poolId": pool_id}));
    assert_eq!(
        (cap["total"].as_u64(), cap["free"].as_u64()),
        (Some(8), Some(8)),
        "{cap}"
    );
    let (ok, out, err) = cp.bcctl(&[
        "allocations",
        "create",
        "--pool",
        pool_id,
        "--gpus",
        "3",
        "-o",
        "json",
    ]);
    assert!(ok, "{err}");
    let alloc: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(alloc["nodeId"], id.as_str(), "{alloc}");
    let cap = cp.ok("pools.capacity", json!({"poolId": pool_id}));
    assert_eq!(
        (cap["allocated"].as_u64(), cap["free"].as_u64()),
        (Some(3), Some(5)),
        "{cap}"
    );
    let (ok, _, err) = cp.bcctl(&["nodes", "drain", &id]);
    assert!(ok, "{err}");
    let n = cp.node(&id);
    assert!(
        n["noScheduleReasons"]
            .as_array()
            .unwrap()
            .contains(&json!("draining")),
        "{n}"
    );
    let (status, _) = cp.call("allocations.create", json!({"poolId": pool_id, "gpus": 1}));
    assert_ne!(status, 200, "a draining node takes no new allocation");
    let (ok, _, err) = cp.bcctl(&["allocations", "release", alloc["id"].as_str().unwrap()]);
    assert!(ok, "{err}");
    let n = cp.node(&id);
    assert!(
        !n["noScheduleReasons"]
            .as_array()
            .unwrap()
            .contains(&json!("draining")),
        "{n}"
    );
}
