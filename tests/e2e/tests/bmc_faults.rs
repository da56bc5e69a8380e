//! Flaky, slow and locked-out BMCs (issue 31, rules 7, 8, 9 and 13), through a real
//! `bcctl serve` and `bcd site` and the BMC behaviour simulator in front of sushy-emulator.
//!
//! Skipped loudly without sushy-emulator; a failure under `CI=true`. No timing is asserted: the
//! checks are outcomes, what the BMC received and its counters.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/bmc_rig.rs"]
mod rig;
#[path = "support/bare_metal.rs"]
mod support;

use std::time::Duration;

use bc_bmc_sim::{Behaviour, Fault, FaultKind};
use bcd_site::test_utils::sushy::FakeSystem;
use rig::{Rig, condition};
use serde_json::json;

/// Rule 13 (and 8): a BMC that answers 500 to one request in three — before the change is made
/// for some, after it for others — inspects to `ready`: reads and writes are retried after
/// reading back whether the change took, the machine boots once, and the retried faults are
/// visible in the node's events.
#[test]
fn a_bmc_failing_one_request_in_three_still_inspects_to_ready() {
    let systems = [FakeSystem::numbered(41)];
    let Some(mut rig) = Rig::start("bmc flaky e2e", &systems, &[], &[]) else {
        return;
    };
    let sim = rig.sim(
        &systems[0],
        Behaviour {
            every_nth_fails: Some((3, 500)),
            ..Behaviour::default()
        },
    );
    // The every-third failures land on whatever request comes third, the power sync's reads
    // among them, so whether one hits a command is chance; the power-on's first reset request
    // fails for sure, so the command's event must say it retried.
    sim.fault(Fault::new(
        "POST",
        "ComputerSystem.Reset",
        FaultKind::StatusBefore(500),
        1,
    ));
    let _m = rig.machine(&sim, &systems[0]);
    let a = rig.enroll("flaky", &sim.address(), true);
    rig.state(&a, "ready");
    let boots = sim.boots();
    assert_eq!(boots.len(), 1, "one boot, not one per retry: {boots:?}");
    assert_eq!(boots[0].device, "Pxe");
    // The flaky BMC is visible in the node's events (the power command's result event may be
    // written after the node reached `ready`, so it is waited for, not read once).
    rig.until_event(&a, "transient");
    rig.until(&a, "powered off when ready", |n| {
        (n["bmc"]["power"] == "off").then_some(())
    });
    assert_eq!(rig.real_power(&systems[0]), "Off");
}

/// Rule 8 (and 1): an answer dropped after the BMC made the change is read back, not resent
/// (one power-on, one reset request); a 503 during an enrollment's reads does not fail it; a
/// power-on that keeps failing leaves no override armed.
#[test]
fn transient_faults_are_read_back_and_a_failed_power_on_disarms_the_override() {
    let systems = [FakeSystem::numbered(42), FakeSystem::numbered(43)];
    let Some(mut rig) = Rig::start("bmc transient e2e", &systems, &[], &[]) else {
        return;
    };
    let drops = rig.sim(&systems[0], Behaviour::default());
    drops.fault(Fault::new(
        "GET",
        "/Systems/",
        FaultKind::StatusBefore(503),
        1,
    ));
    let a = rig.enroll("drops", &drops.address(), false);
    rig.verified(&a);
    drops.fault(Fault::new(
        "POST",
        "ComputerSystem.Reset",
        FaultKind::DropAfter,
        1,
    ));
    let c = rig.power(&a, "on");
    assert_eq!(c["state"], "succeeded", "{c}");
    assert_eq!(c["result"]["power"], "on", "{c}");
    let resets = drops
        .requests()
        .iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("ComputerSystem.Reset"))
        .count();
    assert_eq!(resets, 1, "the change was made: it is not sent again");
    assert_eq!(drops.boots().len(), 1);
    assert_eq!(rig.real_power(&systems[0]), "On");

    let broken = rig.sim(&systems[1], Behaviour::default());
    let _m = rig.machine(&broken, &systems[1]);
    let b = rig.enroll("broken-reset", &broken.address(), false);
    rig.verified(&b);
    broken.fault(Fault::new(
        "POST",
        "ComputerSystem.Reset",
        FaultKind::StatusBefore(500),
        1000,
    ));
    rig.seen.ok(&rig.cp, "nodes.inspect", json!({"nodeId": b}));
    let n = rig.state(&b, "failed");
    let inspected = condition(&n, "Inspected").cloned().unwrap_or_default();
    assert_eq!(inspected["reason"], "PowerOnFailed", "{n}");
    let o = broken.boot_override();
    assert!(
        o.enabled == "Disabled" || o.target != "Pxe",
        "a failed power-on left the override armed: {o:?}"
    );
    assert!(broken.boots().is_empty());
}

/// Rule 8, a BMC that says it is busy: for 8 s every request is answered 503 with
/// `Retry-After: 5`. A power-on sent into the spell is not failed by it (the driver waits a busy
/// answer out: 1 s, doubling, at least 15 s over its retries — the ordinary backoff's 3 s would
/// give up inside the spell), nothing is done twice, and the BMC got few requests meanwhile, sync
/// reads included. The `Retry-After` value itself is not read (docs/bare-metal.md: nv-redfish
/// hands no headers of a failed answer).
#[test]
fn a_busy_bmc_is_waited_out_not_hammered() {
    let systems = [FakeSystem::numbered(47)];
    let Some(mut rig) = Rig::start("bmc busy e2e", &systems, &[], &[]) else {
        return;
    };
    let sim = rig.sim(&systems[0], Behaviour::default());
    let a = rig.enroll("busy", &sim.address(), false);
    rig.verified(&a);
    let before = sim.requests().len();
    sim.busy(Duration::from_secs(8), 503, 5);
    let c = rig.power(&a, "on");
    assert_eq!(c["state"], "succeeded", "{c}");
    assert_eq!(c["result"]["power"], "on", "{c}");
    assert_eq!(rig.real_power(&systems[0]), "On");
    let after: Vec<_> = sim.requests().split_off(before);
    let busy: Vec<_> = after.iter().filter(|r| r.status == 503).collect();
    let resets = after
        .iter()
        .filter(|r| {
            r.method == "POST" && r.path.ends_with("ComputerSystem.Reset") && r.status != 503
        })
        .count();
    assert_eq!(resets, 1, "one reset reached the BMC: {after:#?}");
    assert!(!busy.is_empty(), "the spell was seen: {after:#?}");
    // Two retry chains at most (the command's, the power sync's), four requests each within
    // 8 s at 1 s, 2 s, 4 s; the ordinary backoff sends five per chain in about 3 s, and the sync
    // starts its next chain a second after one gives up.
    assert!(
        busy.len() <= 10,
        "{} requests answered busy within the spell: {:#?}",
        busy.len(),
        busy.iter()
            .map(|r| (r.at.duration_since(busy[0].at), &r.method, &r.path))
            .collect::<Vec<_>>()
    );
}

/// Rule 9: a password the BMC refused is not sent again (no polling with it), the node says
/// `CredentialsRejected`; the operator's new password gets through even while the account is
/// locked: it is tried again once the lockout window passed.
#[test]
fn a_refused_password_is_not_used_again_and_a_new_one_gets_through_a_lockout() {
    let systems = [FakeSystem::numbered(44)];
    let Some(mut rig) = Rig::start(
        "bmc credentials e2e",
        &systems,
        &[],
        &[("BCD_SITE_BMC_LOCKOUT_WINDOW_MS", "6000")],
    ) else {
        return;
    };
    let sim = rig.sim(
        &systems[0],
        Behaviour {
            lockout_threshold: 3,
            lockout_window: Duration::from_secs(60),
            lockout_duration: Duration::from_secs(5),
            ..Behaviour::default()
        },
    );
    let a = rig.enroll("rotated", &sim.address(), false);
    rig.verified(&a);
    // Someone changed the password on the BMC.
    sim.set_password("the-new-Pa55-of-the-bmc");
    let n = rig.until(&a, "the refusal seen by the sync", |n| {
        let c = condition(n, "BmcReachable")?;
        (c["status"] == "false").then(|| n.clone())
    });
    let reachable = condition(&n, "BmcReachable").unwrap();
    assert_eq!(reachable["reason"], "CredentialsRejected", "{n}");
    // Several sync periods later the refused password was not tried again.
    std::thread::sleep(Duration::from_secs(4));
    let c = sim.counters();
    assert!(
        c.failed_logins <= 1,
        "the refused password was tried again: {c:?}"
    );
    assert!(!c.locked, "the site agent locked the account: {c:?}");

    // The account is locked now (someone else's tries); the operator's new password.
    sim.lock_out(Duration::from_secs(4));
    let version = rig.node(&a)["version"].as_u64().unwrap();
    let (status, body) = rig.cp.call(
        "nodes.updateBmcCredentials",
        json!({"nodeId": a, "version": version, "username": bcd_site::test_utils::USER,
               "password": "the-new-Pa55-of-the-bmc"}),
    );
    assert_eq!(status, 200, "the rotation went through the lockout: {body}");
    let events = rig.events(&a);
    assert!(
        events
            .iter()
            .any(|e| e["kind"] == "bmcCredentials" && e["to"] == "rotated"),
        "{events:?}"
    );
    rig.until(&a, "the BMC reachable with the new password", |n| {
        let c = condition(n, "BmcReachable")?;
        (c["status"] == "true").then_some(())
    });
}

/// Rule 7: a BMC that answers in 4 s never has more requests in flight than the per-BMC limit,
/// even when the site agent's requests time out at 3 s (the BMC still works on them); one
/// answer of 11 s is waited for under the default timeouts.
#[test]
fn a_slow_bmc_is_slow_not_dead_and_never_over_its_limit() {
    let systems = [FakeSystem::numbered(45), FakeSystem::numbered(46)];
    let Some(mut rig) = Rig::start(
        "bmc slow e2e",
        &systems,
        &["--max-requests-per-bmc", "2"],
        &[
            ("BCD_SITE_REQUEST_TIMEOUT_MS", "3000"),
            ("BCD_SITE_OPERATION_TIMEOUT_MS", "30000"),
        ],
    ) else {
        return;
    };
    let slow = rig.sim(&systems[0], Behaviour::default());
    let a = rig.enroll("slow", &slow.address(), false);
    rig.verified(&a);
    slow.set(|b| b.delay = Duration::from_secs(4));
    let ids: Vec<String> = (0..4)
        .map(|_| {
            let c = rig
                .seen
                .ok(&rig.cp, "nodes.power", json!({"nodeId": a, "action": "on"}));
            c["id"].as_str().unwrap().to_owned()
        })
        .collect();
    for id in &ids {
        rig.seen.finished(&rig.cp, id);
    }
    std::thread::sleep(Duration::from_secs(5));
    let c = slow.counters();
    assert!(
        c.max_in_flight <= 2,
        "the BMC worked on {} requests at once; the limit is 2",
        c.max_in_flight
    );
    drop(rig);

    // Default timeouts: an 11 s answer is slow, not dead.
    let Some(mut rig) = Rig::start("bmc slow e2e (defaults)", &systems[1..], &[], &[]) else {
        return;
    };
    let sim = rig.sim(&systems[1], Behaviour::default());
    let b = rig.enroll("eleven-seconds", &sim.address(), false);
    rig.verified(&b);
    sim.fault(Fault::new(
        "POST",
        "ComputerSystem.Reset",
        FaultKind::Delay(Duration::from_secs(11)),
        1,
    ));
    let c = rig.power(&b, "on");
    assert_eq!(c["state"], "succeeded", "{c}");
    assert_eq!(rig.real_power(&systems[1]), "On");
}
