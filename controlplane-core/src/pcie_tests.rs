//! Issue 20.3: `PcieLinkDegraded` from an inventory report's `topology.degradedLinks`
//! (crate::pcie), through `record_inventory` (one `Edit::report`, which leaves `version`), and
//! the pool profile's `pcieLinkDegraded` setting deciding NoSchedule.

use bc_protocol::{Condition, ConditionStatus, PoolAgent, PoolKind};
use cpl_store::{HardwareProfile, LinkDegradedPolicy, NodeRecord, Tx};
use serde_json::{Value, json};

use crate::error::OpError;
use crate::ops::pools::{NewPool, create};
use crate::pcie::{self, CONDITION};
use crate::reports::{InventoryReport, record_inventory};
use crate::schedulable::{CapacityBucket, SchedulingFacts, capacity_bucket};
use crate::sessions::{self, SessionOpen};
use crate::test_utils::{TestResult, force, node};

/// A GPU trained at x8 (and 16 of 32 GT/s) where both ends do x16.
fn gpu_x8() -> Value {
    json!({"address": "0000:17:00.0", "kind": "gpu", "currentSpeedGts": 16.0, "maxSpeedGts": 32.0,
           "currentWidth": 8, "maxWidth": 16})
}

/// A document with `degraded` as its degraded links; `None`: no topology section at all.
fn doc(degraded: Option<Vec<Value>>) -> String {
    let mut d = json!({"schemaVersion": 1, "hostname": "n"});
    if let Some(links) = degraded {
        d["topology"] = json!({"degradedLinks": links});
    }
    d.to_string()
}

/// A host node in a pool with `policy`, open session, converged and connected; returns its
/// session epoch.
fn setup(tx: &Tx<'_>, policy: Option<LinkDegradedPolicy>) -> Result<u64, OpError> {
    let pool = create(
        tx,
        &NewPool {
            name: "gpu".into(),
            kind: PoolKind::VpsHost,
            agent: PoolAgent::Bcd,
            site_id: None,
            owner_tenant_id: None,
            hardware_profile: HardwareProfile {
                pcie_link_degraded: policy,
                ..Default::default()
            },
            acceptance: Default::default(),
        },
    )?;
    node(tx, "node_p", Some(&pool.id))?;
    let open = SessionOpen {
        node_id: "node_p".into(),
        gateway_id: "gw".into(),
        boot_id: "b".into(),
        agent_version: "1".into(),
    };
    let epoch = sessions::open(tx, &open)?
        .ok_or_else(|| OpError::InvalidState("no session".into()))?
        .epoch;
    force(tx, "node_p", |n| {
        n.observed_generation = 1;
        n.connectivity = bc_protocol::Connectivity::Connected;
    })?;
    Ok(epoch)
}

/// Reports `document` (its own text as digest: a new text is a new document).
fn report(tx: &Tx<'_>, epoch: u64, document: &str) -> Result<NodeRecord, OpError> {
    let r = InventoryReport {
        hardware_key: "",
        trusted: false,
        digests: &[],
        document: document.as_bytes(),
        sha256: document,
    };
    record_inventory(tx, "node_p", epoch, &r)?;
    tx.node("node_p")?
        .ok_or_else(|| OpError::node_not_found("node_p"))
}

fn condition(n: &NodeRecord) -> Option<&Condition> {
    n.conditions.iter().find(|c| c.type_ == CONDITION)
}

fn bucket(n: &NodeRecord) -> CapacityBucket {
    capacity_bucket(&SchedulingFacts::of(n, None))
}

#[test]
fn a_degraded_link_is_a_condition_and_no_schedule_when_the_pool_says_so() -> TestResult {
    let store = cpl_store::testing::store()?;
    store.write_blocking(|tx| -> TestResult {
        let epoch = setup(tx, Some(LinkDegradedPolicy::NoSchedule))?;
        let v = tx.node("node_p")?.ok_or("node")?.version;
        let n = report(tx, epoch, &doc(Some(vec![gpu_x8()])))?;
        let c = condition(&n).ok_or("condition set")?;
        assert_eq!(
            (c.status, c.reason.as_str(), c.owner.as_str()),
            (ConditionStatus::True, "LinkDegraded", "Inventory")
        );
        assert!(
            c.message.contains("0000:17:00.0 (GPU)")
                && c.message.contains("width x8 of x16")
                && c.message.contains("speed 16.0 of 32.0 GT/s"),
            "{}",
            c.message
        );
        assert_eq!(n.no_schedule_reasons, vec![CONDITION.to_owned()]);
        assert_eq!(bucket(&n), CapacityBucket::Unhealthy);
        assert_eq!(n.version, v, "an agent's report never moves the version");

        // The link is fixed: the next inventory lists no degraded link.
        let n = report(tx, epoch, &doc(Some(Vec::new())))?;
        let c = condition(&n).ok_or("condition kept")?;
        assert_eq!(
            (c.status, c.reason.as_str()),
            (ConditionStatus::False, "LinksAtMaximum")
        );
        assert!(n.no_schedule_reasons.is_empty());
        assert_eq!(bucket(&n), CapacityBucket::Available);
        assert_eq!(n.version, v);
        assert!(
            tx.events("node_p")?
                .iter()
                .any(|e| e.kind == "condition:PcieLinkDegraded"),
            "the report records its events"
        );
        Ok(())
    })
}

#[test]
fn ignore_reports_the_condition_and_leaves_the_node_schedulable() -> TestResult {
    for policy in [None, Some(LinkDegradedPolicy::Ignore)] {
        let store = cpl_store::testing::store()?;
        store.write_blocking(|tx| -> TestResult {
            let epoch = setup(tx, policy)?;
            let n = report(tx, epoch, &doc(Some(vec![gpu_x8()])))?;
            assert_eq!(condition(&n).map(|c| c.status), Some(ConditionStatus::True));
            assert!(n.no_schedule_reasons.is_empty());
            assert_eq!(bucket(&n), CapacityBucket::Available);
            Ok(())
        })?;
    }
    Ok(())
}

#[test]
fn an_inventory_without_topology_sets_no_condition() -> TestResult {
    let store = cpl_store::testing::store()?;
    store.write_blocking(|tx| -> TestResult {
        let epoch = setup(tx, Some(LinkDegradedPolicy::NoSchedule))?;
        let n = report(tx, epoch, &doc(None))?;
        assert!(condition(&n).is_none(), "{:?}", n.conditions);
        assert!(n.no_schedule_reasons.is_empty());
        // A degraded link, then an older agent's document: the condition is left as it was.
        report(tx, epoch, &doc(Some(vec![gpu_x8()])))?;
        let n = report(tx, epoch, &doc(None))?;
        assert_eq!(condition(&n).map(|c| c.status), Some(ConditionStatus::True));
        Ok(())
    })
}

#[test]
fn a_gpu_below_its_speed_only_is_reported_but_never_no_schedule() -> TestResult {
    let store = cpl_store::testing::store()?;
    store.write_blocking(|tx| -> TestResult {
        let epoch = setup(tx, Some(LinkDegradedPolicy::NoSchedule))?;
        let idle = json!({"address": "0000:17:00.0", "kind": "gpu", "currentSpeedGts": 2.5,
                          "maxSpeedGts": 16.0, "currentWidth": 16, "maxWidth": 16});
        let n = report(tx, epoch, &doc(Some(vec![idle.clone()])))?;
        let c = condition(&n).ok_or("condition set")?;
        assert_eq!(
            (c.status, c.reason.as_str()),
            (ConditionStatus::True, "GpuLinkSpeedBelowMaximum")
        );
        assert!(
            c.message.contains("speed 2.5 of 16.0 GT/s"),
            "{}",
            c.message
        );
        assert!(n.no_schedule_reasons.is_empty());
        // A NIC's speed counts.
        let nic = json!({"address": "0000:3b:00.0", "kind": "nic", "currentSpeedGts": 8.0,
                         "maxSpeedGts": 16.0, "currentWidth": 16, "maxWidth": 16});
        let n = report(tx, epoch, &doc(Some(vec![idle, nic])))?;
        let c = condition(&n).ok_or("condition set")?;
        assert_eq!(c.reason, "LinkDegraded");
        assert!(
            c.message
                .contains("0000:3b:00.0 (NIC): speed 8.0 of 16.0 GT/s"),
            "{}",
            c.message
        );
        assert_eq!(n.no_schedule_reasons, vec![CONDITION.to_owned()]);
        Ok(())
    })
}

#[test]
fn link_condition_is_absent_without_topology() -> TestResult {
    let inv: bc_protocol::inventory::Inventory = serde_json::from_str(&doc(None))?;
    assert!(pcie::link_condition(&inv).is_none());
    let inv: bc_protocol::inventory::Inventory = serde_json::from_str(&doc(Some(vec![
        json!({"address": "0000:01:00.0", "kind": "nvme", "currentWidth": 2, "maxWidth": 4}),
    ])))?;
    let c = pcie::link_condition(&inv).ok_or("condition")?;
    assert_eq!(
        c.message,
        "PCIe link below its maximum: 0000:01:00.0 (NVMe): width x2 of x4"
    );
    Ok(())
}

#[test]
fn moving_into_a_no_schedule_pool_applies_its_setting() -> TestResult {
    let store = cpl_store::testing::store()?;
    store.write_blocking(|tx| -> TestResult {
        let epoch = setup(tx, None)?;
        let n = report(tx, epoch, &doc(Some(vec![gpu_x8()])))?;
        assert!(n.no_schedule_reasons.is_empty());
        let strict = create(
            tx,
            &NewPool {
                name: "strict".into(),
                kind: PoolKind::VpsHost,
                agent: PoolAgent::Bcd,
                site_id: None,
                owner_tenant_id: None,
                hardware_profile: HardwareProfile {
                    pcie_link_degraded: Some(LinkDegradedPolicy::NoSchedule),
                    ..Default::default()
                },
                acceptance: Default::default(),
            },
        )?;
        let n =
            crate::ops::membership::move_node(tx, "node_p", n.version, "operator:o", &strict.id)?;
        assert_eq!(n.no_schedule_reasons, vec![CONDITION.to_owned()]);
        Ok(())
    })
}

#[test]
fn the_openapi_document_declares_the_pool_setting() -> TestResult {
    let doc = serde_json::to_value(crate::verbs::openapi::document())?;
    let schemas = &doc["components"]["schemas"];
    let field = &schemas["HardwareProfile"]["properties"]["pcieLinkDegraded"];
    assert!(!field.is_null(), "{}", schemas["HardwareProfile"]);
    assert_eq!(
        schemas["LinkDegradedPolicy"]["enum"],
        json!(["ignore", "noSchedule"])
    );
    // The wire form, camelCase, and an absent setting stays absent.
    let p: HardwareProfile = serde_json::from_value(json!({"pcieLinkDegraded": "noSchedule"}))?;
    assert_eq!(p.pcie_link_degraded, Some(LinkDegradedPolicy::NoSchedule));
    assert_eq!(
        serde_json::to_value(HardwareProfile::default())?,
        json!({"drivers": {}})
    );
    Ok(())
}
