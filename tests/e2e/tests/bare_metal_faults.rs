//! BMC faults end to end (issue 14): a real `bcctl serve` (`--max-requests-per-bmc 2`, a 1 s
//! power sync), a real `bcd site`, and three machines of one sushy-emulator, each its own "BMC":
//! - `slow` behind a fault proxy that delays every request (2 s, under the agent's request
//!   timeout), `healthy` on the emulator directly, `dropped` behind a proxy that later closes
//!   every connection without an answer;
//! - six reboots of `slow` at once, then (while `slow` is still busy) a burst on `healthy`: every
//!   `healthy` command succeeds while `slow` still has commands open, and then every `slow`
//!   command succeeds too. Commands and the sync loop share the per-BMC permits, and the proxy
//!   never counted more requests in flight to `slow` than the limit (it did reach it);
//! - a dropped connection fails its power command as a BMC fault whose message names the BMC,
//!   and the sync loop then reports the BMC unreachable (`BmcReachable=false`, power `unknown`).
//!
//! No timing thresholds: the checks are on order, outcome and the proxy's count. Without
//! sushy-emulator the test says so loudly and checks nothing; under `CI=true` it fails instead.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/bare_metal.rs"]
mod support;

use std::time::Duration;

use bc_e2e::{ControlPlane, eventually};
use bcd_site::test_utils::proxy::{Fault, FaultProxy};
use bcd_site::test_utils::sushy::{FakeSystem, Sushy};
use bcd_site::test_utils::{PASSWORD, USER};
use serde_json::{Value, json};
use support::{Seen, SiteAgent, WAIT, condition};

/// The per-BMC limit serve sends in the site assignment.
const LIMIT: usize = 2;

fn enroll(seen: &mut Seen, cp: &ControlPlane, site: &str, name: &str, address: &str) -> String {
    let n = seen.ok(
        cp,
        "nodes.enroll",
        json!({"inspect": false, "siteId": site, "name": name, "bmc": {
            "address": address, "username": USER, "password": PASSWORD}}),
    );
    n["id"].as_str().unwrap().to_owned()
}

fn state(seen: &mut Seen, cp: &ControlPlane, id: &str) -> Value {
    seen.ok(cp, "commands.get", json!({"commandId": id}))
}

fn over(c: &Value) -> bool {
    matches!(
        c["state"].as_str(),
        Some("succeeded" | "failed" | "cancelled" | "expired")
    )
}

#[test]
fn a_slow_bmc_delays_only_itself_stays_under_the_per_bmc_limit_and_a_dropped_one_is_named() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let systems = [
        FakeSystem::numbered(21),
        FakeSystem::numbered(22),
        FakeSystem::numbered(23),
    ];
    let Some(sushy) = rt.block_on(Sushy::start("bare metal faults e2e", &systems, None)) else {
        return;
    };
    let slow_proxy = rt.block_on(FaultProxy::start(sushy.socket()));
    let drop_proxy = rt.block_on(FaultProxy::start(sushy.socket()));
    let dir = tempfile::tempdir().unwrap();
    let limit = LIMIT.to_string();
    let cp = ControlPlane::start_with(
        &dir.path().join("cp"),
        &[
            "--power-sync-interval",
            "1s",
            "--max-requests-per-bmc",
            &limit,
        ],
    );
    let mut seen = Seen::default();
    let site = seen.ok(
        &cp,
        "sites.create",
        json!({"name": "dc-faults", "kind": "platform"}),
    );
    let site = site["id"].as_str().unwrap().to_owned();
    let token = cp.create_token(&["--site", &site]);
    let agent = SiteAgent::start(&cp, dir.path(), "site-f", &token);
    eventually(WAIT, "the site agent holding the lease", || {
        let s = seen.ok(&cp, "sites.get", json!({"siteId": site}));
        s["lease"]["holderNodeId"].is_string().then_some(())
    });

    let path = |s: &FakeSystem| format!("/redfish/v1/Systems/{}", s.uuid);
    let slow = enroll(
        &mut seen,
        &cp,
        &site,
        "slow",
        &slow_proxy.address(&path(&systems[0])),
    );
    let healthy = enroll(
        &mut seen,
        &cp,
        &site,
        "healthy",
        &sushy.address(&systems[1].uuid),
    );
    let dropped = enroll(
        &mut seen,
        &cp,
        &site,
        "dropped",
        &drop_proxy.address(&path(&systems[2])),
    );
    for id in [&slow, &healthy, &dropped] {
        eventually(WAIT, &format!("{id} verified"), || {
            seen.node(&cp, id)["bmc"]["verifiedAt"]
                .is_string()
                .then_some(())
        });
    }

    // Six reboots of the slow BMC at once (each reads the system, resets it and reads the power
    // back: every request waits 2 s at the proxy), with the sync loop polling it meanwhile.
    slow_proxy.set_fault(Fault::Delay(Duration::from_secs(2)));
    let slow_cmds: Vec<String> = (0..6)
        .map(|_| {
            let c = seen.ok(
                &cp,
                "nodes.power",
                json!({"nodeId": slow, "action": "reboot"}),
            );
            c["id"].as_str().unwrap().to_owned()
        })
        .collect();
    eventually(WAIT, "the slow BMC busy", || {
        (slow_proxy.in_flight() > 0).then_some(())
    });

    // The healthy BMC's burst completes while the slow one still has commands open.
    let mut healthy_cmds: Vec<String> = (0..3)
        .map(|_| {
            let c = seen.ok(
                &cp,
                "nodes.power",
                json!({"nodeId": healthy, "action": "reboot"}),
            );
            c["id"].as_str().unwrap().to_owned()
        })
        .collect();
    let c = seen.ok(
        &cp,
        "nodes.setBootDevice",
        json!({"nodeId": healthy, "device": "pxe"}),
    );
    healthy_cmds.push(c["id"].as_str().unwrap().to_owned());
    for id in &healthy_cmds {
        let c = seen.finished(&cp, id);
        assert_eq!(c["state"], "succeeded", "healthy BMC: {c}");
    }
    let slow_open = slow_cmds
        .iter()
        .filter(|id| !over(&state(&mut seen, &cp, id)))
        .count();
    assert!(
        slow_open > 0,
        "every healthy command finished only after all {} of the slow BMC's: the slow BMC held the healthy one up",
        slow_cmds.len()
    );

    // The slow BMC's commands all succeed in the end: queued behind the limit, never refused.
    for id in &slow_cmds {
        let c = seen.finished(&cp, id);
        assert_eq!(c["state"], "succeeded", "slow BMC: {c}");
    }
    slow_proxy.set_fault(Fault::Pass);
    let resets = slow_proxy
        .requests()
        .iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("ComputerSystem.Reset"))
        .count();
    assert_eq!(resets, slow_cmds.len(), "one reset per command");
    assert!(
        slow_proxy.max_in_flight() <= LIMIT,
        "{} requests in flight at once to the slow BMC; the limit is {LIMIT}",
        slow_proxy.max_in_flight()
    );
    assert_eq!(
        slow_proxy.max_in_flight(),
        LIMIT,
        "six commands and the sync loop at once never used the limit: nothing was bounded"
    );

    // A BMC that drops the connection: the command fails as a BMC fault naming it, and the sync
    // loop reports it unreachable.
    drop_proxy.set_fault(Fault::Drop);
    let c = seen.ok(
        &cp,
        "nodes.power",
        json!({"nodeId": dropped, "action": "on"}),
    );
    let c = seen.finished(&cp, c["id"].as_str().unwrap());
    assert_eq!(c["state"], "failed", "{c}");
    let code = c["error"]["code"].as_str().unwrap_or_default();
    assert!(
        matches!(code, "BMC_UNREACHABLE" | "BMC_ERROR"),
        "a BMC fault, not a node fault: {c}"
    );
    let message = c["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(&drop_proxy.addr.to_string()), "{c}");
    assert_eq!(rt.block_on(sushy.power(&systems[2].uuid)), "Off");
    let n = eventually(WAIT, "the dropping BMC reported unreachable", || {
        let n = seen.node(&cp, &dropped);
        (n["bmc"]["power"] == "unknown"
            && condition(&n, "BmcReachable").is_some_and(|c| c["status"] == "false"))
        .then_some(n)
    });
    let reachable = condition(&n, "BmcReachable").unwrap();
    assert!(
        reachable["message"]
            .as_str()
            .unwrap_or_default()
            .contains(&drop_proxy.addr.to_string()),
        "{n}"
    );
    assert!(drop_proxy.max_in_flight() <= LIMIT);

    // The healthy BMC stayed reachable throughout.
    let n = seen.node(&cp, &healthy);
    assert_ne!(
        condition(&n, "BmcReachable").map(|c| c["status"].clone()),
        Some(json!("false")),
        "{n}"
    );
    drop(agent);
}
