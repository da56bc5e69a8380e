//! The controller on the core: a fault a reset fixes (verified by a fresh `diag.nvml`), one
//! that climbs the ladder to a give-up with maintenance on, drain negotiation (`wait`, `evict`,
//! only the allocations on the reset GPU), tenant-controlled nodes, observe mode, suspension
//! and flapping nodes.

use bc_protocol::{CommandName, ConditionStatus};
use cpl_store::{
    DrainPolicy, RemediationMode, RemediationPhase, RemediationPolicy, RemediationState,
    StepOutcome, now_ms,
};
use serde_json::json;

use super::test_world::{TestResult, auto, bus, condition, diag, reset, world};
use super::{OWNER, REMEDIATED};
use crate::health::XID_CRITICAL;
use crate::ops::nodes::REASON_DRAINING;
use crate::placer::{self, AllocationRequest};

#[tokio::test]
async fn a_fault_a_reset_fixes_is_verified_by_a_new_diag_and_the_node_given_back() -> TestResult {
    let w = world(auto(RemediationPolicy::default()))?;
    w.host("node_a", 8)?;
    let gpu = bus(2);
    w.xid("node_a", 48, &gpu)?;
    let r = w.pass(now_ms()).await;
    assert_eq!(r.started, 1, "{r:?}");
    let n = w.node("node_a")?;
    assert!(n.cordoned, "cordoned before a disruptive step");
    let rem = w.open("node_a")?.ok_or("no remediation")?;
    assert_eq!(rem.phase, RemediationPhase::Acting);
    assert!(rem.cordoned, "it remembers that it cordoned the node");
    let c = w.open_command("node_a", CommandName::GpuReset)?;
    assert_eq!(
        c.args,
        json!({"gpus": [gpu]}),
        "only the fault's GPU is reset"
    );
    assert_eq!(c.actor, OWNER);
    w.finish(&c, Some(reset(&[&gpu], &[]))).await?;
    // The reset alone is not the verdict: a diag runs again first.
    assert_eq!(
        w.open("node_a")?.map(|r| r.phase),
        Some(RemediationPhase::Verifying)
    );
    w.pass(now_ms()).await;
    let d = w.open_command("node_a", CommandName::DiagNvml)?;
    assert_eq!(
        w.open("node_a")?.and_then(|r| r.verify_command_id),
        Some(d.id.clone())
    );
    w.finish(&d, Some(diag(8, &[]))).await?;
    let n = w.node("node_a")?;
    assert!(w.open("node_a")?.is_none(), "the remediation ended");
    let rem = w.last("node_a")?;
    assert_eq!(rem.state, RemediationState::Succeeded, "{rem:?}");
    assert!(!n.cordoned, "uncordoned: the controller had cordoned it");
    assert!(
        n.no_schedule_reasons.is_empty(),
        "{:?}",
        n.no_schedule_reasons
    );
    let healed = condition(&n, REMEDIATED).ok_or("no Remediated")?;
    assert_eq!(
        (healed.status, healed.reason.as_str()),
        (ConditionStatus::True, "Healed")
    );
    assert!(!n.maintenance);
    let steps = w.store.read_blocking(|r| r.remediation_steps(&rem.id))?;
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0].outcome, StepOutcome::Succeeded);
    let kinds: Vec<String> = w.events("node_a")?.into_iter().map(|e| e.kind).collect();
    for k in ["remediation", "remediationStep", "cordoned"] {
        assert!(kinds.iter().any(|x| x == k), "{k} in {kinds:?}");
    }
    Ok(())
}

#[tokio::test]
async fn a_fault_nothing_fixes_climbs_the_ladder_and_is_given_up_with_maintenance_on() -> TestResult
{
    let w = world(auto(RemediationPolicy::default()))?;
    w.host("node_a", 8)?;
    let gpu = bus(5);
    w.xid("node_a", 48, &gpu)?;
    w.pass(now_ms()).await;
    // The reset ran but the GPU still fails afterwards.
    let c = w.open_command("node_a", CommandName::GpuReset)?;
    w.finish(&c, Some(reset(&[], &[&gpu]))).await?;
    w.pass(now_ms()).await;
    let d = w.open_command("node_a", CommandName::DiagNvml)?;
    w.finish(&d, Some(diag(8, &[&gpu]))).await?;
    assert_eq!(
        condition(&w.node("node_a")?, XID_CRITICAL).map(|c| c.status),
        Some(ConditionStatus::True)
    );
    // The next rung: a reboot, verified once the node's session came back after it.
    w.pass(now_ms()).await;
    let reboot = w.open_command("node_a", CommandName::NodeReboot)?;
    w.finish(
        &reboot,
        Some(json!({"bootId": "b2", "previousBootId": "b1"})),
    )
    .await?;
    w.pass(now_ms()).await;
    let rem = w.open("node_a")?.ok_or("no remediation")?;
    assert_eq!(rem.phase, RemediationPhase::Verifying);
    assert!(
        rem.waiting
            .as_deref()
            .is_some_and(|m| m.contains("session to come back")),
        "{rem:?}"
    );
    w.reconnected("node_a", now_ms() + 1)?;
    w.pass(now_ms() + 2).await;
    let d = w.open_command("node_a", CommandName::DiagNvml)?;
    w.finish(&d, Some(diag(8, &[&gpu]))).await?;
    // No BMC: the power cycle and the re-inspection are skipped, and the controller gives up.
    w.pass(now_ms()).await;
    assert!(w.open("node_a")?.is_none());
    let rem = w.last("node_a")?;
    assert_eq!(rem.state, RemediationState::GaveUp);
    let n = w.node("node_a")?;
    assert!(n.maintenance, "maintenance on");
    let why = n.maintenance_reason.clone().unwrap_or_default();
    // The API view carries the reason beside the axis (`nodes.get`, `bcctl nodes get`).
    let detail = serde_json::to_value(crate::detail::NodeDetail::new(&n, None))?;
    assert_eq!(detail["maintenance"], true);
    assert_eq!(detail["maintenanceReason"].as_str(), Some(why.as_str()));
    for part in [
        "XidCritical Xid48",
        &gpu,
        "resetGpu (failed",
        "rebootNode (failed",
        "bmcPowerCycle (skipped",
        "reinspect (skipped",
    ] {
        assert!(why.contains(part), "{part} in {why}");
    }
    let c = condition(&n, REMEDIATED).ok_or("no Remediated")?;
    assert_eq!(
        (c.status, c.reason.as_str()),
        (ConditionStatus::False, "Exhausted")
    );
    assert!(n.cordoned, "a node given up stays cordoned");
    let gave_up = w
        .events("node_a")?
        .into_iter()
        .any(|e| e.kind == "remediation" && e.to.as_deref() == Some("gaveUp"));
    assert!(gave_up);
    // Maintenance keeps it out of the controller's reach from now on.
    assert_eq!(w.pass(now_ms()).await.started, 0);
    Ok(())
}

fn alloc(
    w: &super::test_world::World,
    gpus: u32,
) -> Result<cpl_store::Allocation, Box<dyn std::error::Error>> {
    let req = AllocationRequest {
        pool_id: w.pool.clone().into(),
        gpus,
        tenant_id: None,
        workload_id: None,
    };
    Ok(w.store
        .write_blocking(|tx| placer::create(tx, &req, "operator:t"))?)
}

#[tokio::test]
async fn a_reset_waits_only_for_the_allocations_on_its_gpu_and_evicts_them_after_the_grace()
-> TestResult {
    let w = world(auto(RemediationPolicy {
        drain_grace_seconds: Some(60),
        drain: Some(DrainPolicy::Evict),
        ..Default::default()
    }))?;
    w.host("node_a", 8)?;
    let first = alloc(&w, 4)?;
    let second = alloc(&w, 4)?;
    assert_eq!(first.node_id, "node_a");
    // GPU 5 is booked by the second allocation.
    assert!(
        second.atoms.contains(&"GPU-node_a-5".to_owned()),
        "{second:?}"
    );
    w.xid("node_a", 48, &bus(5))?;
    let t0 = now_ms();
    w.pass(t0).await;
    let n = w.node("node_a")?;
    assert!(n.cordoned && n.no_schedule_reasons.contains(&REASON_DRAINING.to_owned()));
    let rem = w.open("node_a")?.ok_or("no remediation")?;
    assert_eq!(rem.phase, RemediationPhase::Draining);
    let waiting = rem.waiting.unwrap_or_default();
    assert!(
        waiting.contains(&second.id) && !waiting.contains(&first.id),
        "{waiting}"
    );
    assert!(
        w.open_command("node_a", CommandName::GpuReset).is_err(),
        "nothing reset yet"
    );
    // Past the grace, `evict` releases the allocation with the remediation as its reason.
    w.pass(t0 + 61_000).await;
    let evicted = w
        .store
        .read_blocking(|r| r.allocation(&second.id))?
        .ok_or("gone")?;
    assert!(evicted.released_at.is_some());
    let why = evicted.release_reason.unwrap_or_default();
    assert!(why.contains(&rem.id) && why.contains("resetGpu"), "{why}");
    let kept = w
        .store
        .read_blocking(|r| r.allocation(&first.id))?
        .ok_or("gone")?;
    assert!(
        kept.released_at.is_none(),
        "the other GPUs' allocation stays"
    );
    w.open_command("node_a", CommandName::GpuReset)?;
    Ok(())
}

#[tokio::test]
async fn under_wait_a_reboot_keeps_waiting_and_says_so_until_the_allocation_is_released()
-> TestResult {
    let w = world(auto(RemediationPolicy {
        drain_grace_seconds: Some(60),
        ..Default::default()
    }))?;
    w.host("node_a", 8)?;
    let a = alloc(&w, 2)?;
    w.xid("node_a", 79, &bus(6))?;
    let t0 = now_ms();
    w.pass(t0).await;
    w.pass(t0 + 120_000).await;
    let rem = w.open("node_a")?.ok_or("no remediation")?;
    let waiting = rem.waiting.unwrap_or_default();
    assert!(
        waiting.contains(&a.id) && waiting.contains("drain policy is wait"),
        "a reboot waits for every allocation, and says why: {waiting}"
    );
    assert!(
        w.store
            .read_blocking(|r| r.allocation(&a.id))?
            .and_then(|a| a.released_at)
            .is_none()
    );
    w.store
        .write_blocking(|tx| placer::release(tx, &a.id, "operator:t"))?;
    w.pass(t0 + 121_000).await;
    w.open_command("node_a", CommandName::NodeReboot)?;
    Ok(())
}

#[tokio::test]
async fn a_tenant_controlled_node_is_never_sent_a_platform_command() -> TestResult {
    let w = world(auto(RemediationPolicy::default()))?;
    w.host("node_a", 8)?;
    w.store.write_blocking(|tx| {
        let v = tx.node("node_a")?.map(|n| n.version).unwrap_or(0);
        crate::ops::nodes::start_dedicated_root(tx, "node_a", v, "operator:t", "tenant-a")
    })?;
    w.xid("node_a", 48, &bus(1))?;
    w.pass(now_ms()).await;
    w.pass(now_ms()).await;
    let cmds = w.commands("node_a")?;
    assert!(cmds.is_empty(), "no command: {cmds:?}");
    let rem = w.last("node_a")?;
    assert_eq!(rem.state, RemediationState::GaveUp);
    let steps = w.store.read_blocking(|r| r.remediation_steps(&rem.id))?;
    assert!(steps.iter().all(|s| s.outcome == StepOutcome::Skipped));
    assert!(
        steps[0].message.contains("tenant-controlled"),
        "{:?}",
        steps[0]
    );
    Ok(())
}

#[tokio::test]
async fn observe_records_what_it_would_do_and_acts_on_nothing() -> TestResult {
    let w = world(RemediationPolicy {
        mode: Some(RemediationMode::Observe),
        ..Default::default()
    })?;
    w.host("node_a", 8)?;
    w.xid("node_a", 48, &bus(0))?;
    assert_eq!(w.pass(now_ms()).await.started, 1);
    assert_eq!(w.pass(now_ms()).await.started, 0, "recorded once");
    let n = w.node("node_a")?;
    assert!(!n.cordoned && !n.maintenance);
    assert!(w.commands("node_a")?.is_empty());
    let rem = w.open("node_a")?.ok_or("no observation")?;
    assert_eq!(rem.mode, RemediationMode::Observe);
    let said = w
        .events("node_a")?
        .into_iter()
        .find(|e| e.kind == "remediation" && e.to.as_deref() == Some("observed"))
        .ok_or("no event")?;
    assert!(said.message.contains("would cordon") && said.message.contains("resetGpu"));
    // The fault goes away: the observation ends as cleared.
    w.store.write_blocking(|tx| {
        let mut e = crate::edit::Edit::report(tx, "node_a", "Health")?;
        let ups = crate::health::updates_for(
            &e.node.conditions,
            &crate::health::Evidence::Reset {
                verified: vec![bus(0)],
            },
        );
        for u in &ups {
            crate::conditions::apply(&mut e, u);
        }
        e.save(tx).map(|_| ())
    })?;
    w.pass(now_ms()).await;
    assert_eq!(w.last("node_a")?.state, RemediationState::Cleared);
    Ok(())
}

#[tokio::test]
async fn a_suspended_node_is_left_alone_and_its_open_remediation_cancelled() -> TestResult {
    let w = world(auto(RemediationPolicy::default()))?;
    w.host("node_a", 8)?;
    w.xid("node_a", 48, &bus(0))?;
    w.pass(now_ms()).await;
    assert!(w.node("node_a")?.cordoned);
    let v = w.node("node_a")?.version;
    let req = super::view::SetRemediationRequest {
        node_id: "node_a".into(),
        version: v,
        suspended: true,
        reason: Some("bad cable, DC ticket 42".into()),
    };
    w.store
        .write_blocking(|tx| super::view::set_suspension(tx, &req, "operator:t"))?;
    let rem = w.last("node_a")?;
    assert_eq!(rem.state, RemediationState::Cancelled);
    assert!(rem.outcome.unwrap_or_default().contains("DC ticket 42"));
    assert!(!w.node("node_a")?.cordoned, "its cordon is lifted");
    assert_eq!(w.pass(now_ms()).await.started, 0, "nothing new starts");
    Ok(())
}

#[tokio::test]
async fn a_node_that_flaps_is_given_up_on_not_healed_forever() -> TestResult {
    let w = world(auto(RemediationPolicy {
        max_attempts_per_node: Some(2),
        ..Default::default()
    }))?;
    w.host("node_a", 8)?;
    for _ in 0..2 {
        w.xid("node_a", 48, &bus(3))?;
        w.pass(now_ms()).await;
        let c = w.open_command("node_a", CommandName::GpuReset)?;
        w.finish(&c, Some(reset(&[&bus(3)], &[]))).await?;
        w.pass(now_ms()).await;
        let d = w.open_command("node_a", CommandName::DiagNvml)?;
        w.finish(&d, Some(diag(8, &[]))).await?;
        assert_eq!(w.last("node_a")?.state, RemediationState::Succeeded);
    }
    w.xid("node_a", 48, &bus(3))?;
    w.pass(now_ms()).await;
    let rem = w.last("node_a")?;
    assert_eq!(rem.state, RemediationState::GaveUp);
    let n = w.node("node_a")?;
    assert!(n.maintenance);
    let c = condition(&n, REMEDIATED).ok_or("no Remediated")?;
    assert_eq!(c.reason, "Flapping");
    assert!(w.open_command("node_a", CommandName::GpuReset).is_err());
    Ok(())
}

#[tokio::test]
async fn a_pool_that_is_off_is_never_touched() -> TestResult {
    let w = world(RemediationPolicy::default())?;
    w.host("node_a", 8)?;
    w.xid("node_a", 48, &bus(0))?;
    assert_eq!(w.pass(now_ms()).await, super::PassReport::default());
    assert!(!w.node("node_a")?.cordoned);
    assert!(w.commands("node_a")?.is_empty());
    Ok(())
}
