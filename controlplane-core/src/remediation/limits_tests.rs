//! The circuit breaker and workload faults on the core: a fleet-wide event trips the breaker at
//! its limit and nothing more starts until an operator resumes it; application-class XIDs on
//! several nodes of one workload are the workload's, on one node alone across allocations the
//! node's.

use bc_protocol::ConditionStatus;
use cpl_store::{RemediationPolicy, RemediationState, now_ms};

use super::breaker::{self, REMEDIATION_PAUSED};
use super::test_world::{Res, TestResult, World, auto, bus, condition, world, xid_event};
use super::workload::{self, Verdict};
use crate::error::OpError;
use crate::placer::{self, AllocationRequest};

fn hosts(w: &World, n: usize) -> Res<Vec<String>> {
    let ids: Vec<String> = (0..n).map(|i| format!("node_{i:02}")).collect();
    w.hosts(&ids, 8)?;
    Ok(ids)
}

fn paused_condition(w: &World) -> Res<Option<bc_protocol::Condition>> {
    Ok(w.pool()?
        .conditions
        .into_iter()
        .find(|c| c.type_ == REMEDIATION_PAUSED))
}

#[tokio::test]
async fn a_fleet_wide_fault_trips_the_breaker_at_its_limit_until_an_operator_resumes_it()
-> TestResult {
    let w = world(auto(RemediationPolicy {
        max_concurrent: Some(3),
        max_concurrent_percent: Some(100),
        max_per_hour: Some(100),
        ..Default::default()
    }))?;
    let nodes = hosts(&w, 10)?;
    // 30 % of the pool fails at once, twice the breaker's limit (6 > 3).
    for n in nodes.iter().take(6) {
        w.xid(n, 48, &bus(0))?;
    }
    let r = w.pass(now_ms()).await;
    assert_eq!(r.started, 3, "{r:?}");
    assert_eq!(r.tripped, vec![w.pool.clone()]);
    let c = paused_condition(&w)?.ok_or("no RemediationPaused")?;
    assert_eq!(c.status, ConditionStatus::True);
    assert!(
        c.message.contains("maxConcurrent") && c.message.contains("the limit is 3"),
        "the numbers: {}",
        c.message
    );
    assert_eq!(w.pool()?.remediation_trips, 1);
    let in_remediation: Vec<&String> = nodes
        .iter()
        .filter(|n| w.open(n).ok().flatten().is_some())
        .collect();
    assert_eq!(in_remediation.len(), 3, "{in_remediation:?}");
    // Nothing else is disturbed: the healthy nodes and the refused ones are not cordoned.
    let cordoned = nodes
        .iter()
        .filter(|n| w.node(n).is_ok_and(|x| x.cordoned))
        .count();
    assert_eq!(cordoned, 3);
    // Even once one ends, an open breaker starts nothing new.
    let first = in_remediation[0].clone();
    w.store.write_blocking(|tx| {
        let v = tx.node(&first)?.map(|n| n.version).unwrap_or(0);
        super::view::set_suspension(
            tx,
            &super::view::SetRemediationRequest {
                node_id: first.clone().into(),
                version: v,
                suspended: true,
                reason: Some("taken out by hand".into()),
            },
            "operator:t",
        )
    })?;
    let r = w.pass(now_ms()).await;
    assert_eq!(r.started, 0, "paused: {r:?}");
    assert!(r.tripped.is_empty(), "it trips once, not every pass");
    // An operator resumes: the next ones start, up to the limit again.
    let v = w.pool()?.version;
    let pool_id = w.pool.clone();
    let resumed = w
        .store
        .write_blocking(|tx| breaker::resume(tx, &pool_id, v, "operator:t"))?;
    assert!(!breaker::paused(&resumed));
    let c = paused_condition(&w)?.ok_or("no RemediationPaused")?;
    assert_eq!(
        (c.status, c.reason.as_str()),
        (ConditionStatus::False, "Resumed")
    );
    let r = w.pass(now_ms()).await;
    assert_eq!(r.started, 1, "one slot was free: {r:?}");
    assert_eq!(
        r.tripped,
        vec![w.pool.clone()],
        "and the limit trips it again"
    );
    Ok(())
}

#[tokio::test]
async fn the_hourly_limit_trips_the_breaker_and_resuming_what_is_not_paused_is_refused()
-> TestResult {
    let w = world(auto(RemediationPolicy {
        max_concurrent: Some(10),
        max_concurrent_percent: Some(100),
        max_per_hour: Some(2),
        ..Default::default()
    }))?;
    let nodes = hosts(&w, 4)?;
    let v = w.pool()?.version;
    let pool_id = w.pool.clone();
    let refused = w
        .store
        .write_blocking(|tx| breaker::resume(tx, &pool_id, v, "operator:t"));
    assert!(
        matches!(refused, Err(OpError::InvalidState(_))),
        "{refused:?}"
    );
    for n in &nodes {
        w.xid(n, 48, &bus(1))?;
    }
    let r = w.pass(now_ms()).await;
    assert_eq!(r.started, 2, "{r:?}");
    let c = paused_condition(&w)?.ok_or("no RemediationPaused")?;
    assert!(c.message.contains("maxPerHour"), "{}", c.message);
    let refused_event = w
        .events(&nodes[2])?
        .into_iter()
        .any(|e| e.kind == "remediation" && e.to.as_deref() == Some("paused"));
    assert!(refused_event, "the refused node says why");
    Ok(())
}

fn book(w: &World, gpus: u32, workload: Option<&str>) -> Res<cpl_store::Allocation> {
    let req = AllocationRequest {
        pool_id: w.pool.clone().into(),
        gpus,
        tenant_id: None,
        workload_id: workload.map(Into::into),
    };
    Ok(w.store
        .write_blocking(|tx| placer::create(tx, &req, "operator:t"))?)
}

fn observe(w: &World, node: &str, xid: u64, gpu: usize, at: i64) -> Res<Verdict> {
    let e = xid_event(xid, Some(&bus(gpu)));
    let id = node.to_owned();
    Ok(w.store
        .write_blocking(move |tx| workload::observe(tx, &id, &e, at))?)
}

#[tokio::test]
async fn the_same_application_xid_on_several_nodes_of_one_workload_is_the_workloads_fault()
-> TestResult {
    let w = world(auto(RemediationPolicy::default()))?;
    hosts(&w, 2)?;
    let a = book(&w, 8, Some("job-7"))?;
    let b = book(&w, 8, Some("job-7"))?;
    assert_ne!(a.node_id, b.node_id, "one allocation per node");
    let t = now_ms();
    assert_eq!(observe(&w, &a.node_id, 13, 2, t)?, Verdict::Observed);
    assert_eq!(
        observe(&w, &b.node_id, 13, 5, t + 1000)?,
        Verdict::Workload("job-7".into())
    );
    for x in [&a, &b] {
        let rec = w
            .store
            .read_blocking(|r| r.allocation(&x.id))?
            .ok_or("allocation gone")?;
        let f = rec.workload_fault.ok_or("no workloadFault")?;
        assert_eq!(f.xids, vec![13]);
        assert_eq!(f.nodes.len(), 2);
        let said = w
            .events(&x.node_id)?
            .into_iter()
            .any(|e| e.kind == "workloadFault");
        assert!(said, "a workloadFault event on {}", x.node_id);
        let n = w.node(&x.node_id)?;
        assert!(
            n.no_schedule_reasons.is_empty(),
            "{:?}",
            n.no_schedule_reasons
        );
    }
    // No node is remediated for the workload's fault.
    assert_eq!(w.pass(now_ms()).await.started, 0);
    Ok(())
}

#[tokio::test]
async fn one_node_alone_showing_it_across_allocations_is_the_nodes_fault_and_remediated()
-> TestResult {
    let w = world(auto(RemediationPolicy {
        node_min_allocations: Some(2),
        ..Default::default()
    }))?;
    hosts(&w, 1)?;
    let t = now_ms();
    let first = book(&w, 8, None)?;
    assert_eq!(observe(&w, &first.node_id, 31, 4, t)?, Verdict::Observed);
    w.store
        .write_blocking(|tx| placer::release(tx, &first.id, "operator:t"))?;
    let second = book(&w, 8, None)?;
    assert_eq!(second.node_id, first.node_id);
    assert_eq!(
        observe(&w, &second.node_id, 31, 4, t + 1000)?,
        Verdict::Node
    );
    let n = w.node(&second.node_id)?;
    let c = condition(&n, super::fault::REPEATED_WORKLOAD_XID).ok_or("no condition")?;
    assert_eq!(c.status, ConditionStatus::True);
    assert_eq!(c.gpus, vec![bus(4)]);
    assert!(
        n.no_schedule_reasons
            .contains(&super::fault::REPEATED_WORKLOAD_XID.to_owned())
    );
    // Unlike the workload's, the node's fault is remediated.
    w.store
        .write_blocking(|tx| placer::release(tx, &second.id, "operator:t"))?;
    assert_eq!(w.pass(now_ms()).await.started, 1);
    assert_eq!(w.last(&n.id)?.state, RemediationState::Active);
    Ok(())
}

#[tokio::test]
async fn thirty_percent_of_a_thousand_nodes_failing_at_once_starts_no_more_than_the_limit()
-> TestResult {
    // The defaults: N = 4, P = 10 %, M = 20.
    let w = world(auto(RemediationPolicy::default()))?;
    let nodes = hosts(&w, 1000)?;
    let failing: Vec<&String> = nodes
        .iter()
        .step_by(10)
        .chain(nodes.iter().skip(1).step_by(10))
        .chain(nodes.iter().skip(2).step_by(10))
        .collect();
    assert_eq!(failing.len(), 300);
    w.xids(&failing, 48, &bus(0))?;
    let mut started = 0;
    for _ in 0..5 {
        started += w.pass(now_ms()).await.started;
    }
    assert_eq!(started, 4, "maxConcurrent");
    assert!(breaker::paused(&w.pool()?));
    assert_eq!(
        w.pool()?.remediation_trips,
        1,
        "one trip, not one per refused node"
    );
    // Nothing else is disturbed: four nodes cordoned, four commands, all on those four.
    let mut cordoned = 0;
    let mut commands = 0;
    for n in &nodes {
        cordoned += usize::from(w.node(n)?.cordoned);
        commands += w.commands(n)?.len();
    }
    assert_eq!((cordoned, commands), (4, 4));
    Ok(())
}
