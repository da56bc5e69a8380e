//! Operation tests at the store level: versions (`CONFLICT`), illegal moves (`INVALID_STATE`
//! naming from and to), events, and `noScheduleReasons` written in the cause's transaction.

use bc_protocol::{ConditionStatus, Connectivity, ErrorCode, ProvisionState, Trust};

use bc_protocol::PoolKind;
use cpl_store::Store;

use crate::conditions::{ConditionUpdate, set_condition};
use crate::error::OpError;
use crate::ops::nodes as ops;
use crate::placer::{self, AllocationRequest};
use crate::query::{self, NodeFilter};
use crate::schedulable::CapacityBucket;
use crate::test_utils::{
    StoreExt, TestResult, events, node, nodes, pool, ready_host, taints, write_tx,
};

const OP: &str = "operator:alice";

fn setup() -> Result<(Store, String), Box<dyn std::error::Error>> {
    let store = cpl_store::testing::store()?;
    let pool_id = store.with(|c| {
        let p = pool(c, PoolKind::MetalHost, None)
            .map_err(|e| cpl_store::StoreError::Task(e.to_string()))?;
        node(c, "node_a", Some(&p.id))?;
        ready_host(c, "node_a", 4)?;
        Ok(p.id)
    })?;
    Ok((store, pool_id))
}

fn version(store: &Store, id: &str) -> Result<u64, Box<dyn std::error::Error>> {
    Ok(store
        .with(|c| nodes::get(c, id))?
        .map(|n| n.version)
        .ok_or("node missing")?)
}

fn node_events(
    store: &Store,
    id: &str,
) -> Result<Vec<events::NodeEvent>, Box<dyn std::error::Error>> {
    Ok(store.with(|c| events::list(c, id))?)
}

#[test]
fn stale_version_is_conflict_and_changes_nothing() -> TestResult {
    let (store, _) = setup()?;
    let v = version(&store, "node_a")?;
    let err = store
        .with(|c| Ok(write_tx(c, |tx| ops::cordon(tx, "node_a", v + 7, OP))))?
        .err()
        .ok_or("stale cordon must fail")?;
    assert_eq!(err.code(), ErrorCode::Conflict);
    assert!(
        err.to_string()
            .contains(&format!("expected version {}", v + 7)),
        "{err}"
    );
    let n = store.with(|c| nodes::get(c, "node_a"))?.ok_or("gone")?;
    assert!(!n.cordoned);
    assert_eq!(n.version, v);
    assert!(node_events(&store, "node_a")?.is_empty());
    Ok(())
}

#[test]
fn cordon_bumps_version_and_logs_who_what_from_to() -> TestResult {
    let (store, _) = setup()?;
    let v = version(&store, "node_a")?;
    let n = store.with(|c| Ok(write_tx(c, |tx| ops::cordon(tx, "node_a", v, OP))))??;
    assert!(n.cordoned);
    assert_eq!(n.version, v + 1);
    assert_eq!(version(&store, "node_a")?, v + 1);
    // Cordoning again is a no-op: same version, no second event.
    let again = store.with(|c| Ok(write_tx(c, |tx| ops::cordon(tx, "node_a", v + 1, OP))))??;
    assert_eq!(again.version, v + 1);
    let ev = node_events(&store, "node_a")?;
    assert_eq!(ev.len(), 1);
    assert_eq!(
        (
            ev[0].kind.as_str(),
            ev[0].from.as_deref(),
            ev[0].to.as_deref()
        ),
        ("cordoned", Some("false"), Some("true"))
    );
    assert_eq!(ev[0].actor, OP);
    assert!(ev[0].at > 0);
    // And uncordon with the old version conflicts.
    let stale = store.with(|c| Ok(write_tx(c, |tx| ops::uncordon(tx, "node_a", v, OP))))?;
    assert_eq!(stale.err().map(|e| e.code()), Some(ErrorCode::Conflict));
    Ok(())
}

#[test]
fn unknown_node_is_not_found() -> TestResult {
    let (store, _) = setup()?;
    let err = store
        .with(|c| Ok(write_tx(c, |tx| ops::cordon(tx, "node_zz", 1, OP))))?
        .err();
    assert_eq!(err.map(|e| e.code()), Some(ErrorCode::NotFound));
    let err = store.with(|c| Ok(query::get_node(c, "node_zz")))?.err();
    assert_eq!(err.map(|e| e.code()), Some(ErrorCode::NotFound));
    Ok(())
}

#[test]
fn illegal_move_is_invalid_state_naming_from_and_to() -> TestResult {
    let (store, _) = setup()?;
    let v = version(&store, "node_a")?; // adopted (ready_host)
    let err = store
        .with(|c| Ok(write_tx(c, |tx| ops::adopt(tx, "node_a", v, OP))))?
        .err()
        .ok_or("adopt of an adopted node must fail")?;
    assert_eq!(err.code(), ErrorCode::InvalidState);
    assert!(matches!(
        err,
        OpError::InvalidTransition {
            from: ProvisionState::Adopted,
            to: ProvisionState::Adopted
        }
    ));
    assert_eq!(
        err.to_string(),
        "invalid provisionState transition from adopted to adopted"
    );
    let err = store
        .with(|c| {
            Ok(write_tx(c, |tx| {
                ops::transition(
                    tx,
                    "node_a",
                    None,
                    "NodeLifecycle",
                    ProvisionState::Failed,
                    "x",
                )
            }))
        })?
        .err()
        .ok_or("adopted cannot fail")?;
    assert_eq!(
        err.to_string(),
        "invalid provisionState transition from adopted to failed"
    );
    assert_eq!(version(&store, "node_a")?, v);
    Ok(())
}

#[test]
fn failure_records_failed_from_and_maintenance_and_recover_goes_back() -> TestResult {
    let store = cpl_store::testing::store()?;
    store.with(|c| node(c, "node_b", None).map(|_| ()))?;
    let v = version(&store, "node_b")?; // adopting
    let failed = store.with(|c| {
        Ok(write_tx(c, |tx| {
            ops::transition(
                tx,
                "node_b",
                Some(v),
                "NodeLifecycle",
                ProvisionState::Failed,
                "acceptance timed out",
            )
        }))
    })??;
    assert_eq!(failed.provision_state, ProvisionState::Failed);
    assert_eq!(failed.failed_from, Some(ProvisionState::Adopting));
    assert!(failed.maintenance);
    assert!(
        failed
            .maintenance_reason
            .as_deref()
            .unwrap_or_default()
            .contains("acceptance timed out")
    );
    let kinds: Vec<String> = node_events(&store, "node_b")?
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(kinds, vec!["provisionState", "maintenance"]);

    let rec = store.with(|c| {
        Ok(write_tx(c, |tx| {
            ops::recover(tx, "node_b", failed.version, OP)
        }))
    })??;
    assert_eq!(rec.provision_state, ProvisionState::Adopting);
    assert_eq!(rec.failed_from, None);
    assert!(
        rec.maintenance,
        "maintenance is its own axis: recover leaves it on"
    );
    let again = store.with(|c| {
        Ok(write_tx(c, |tx| {
            ops::recover(tx, "node_b", rec.version, OP)
        }))
    })?;
    assert_eq!(again.err().map(|e| e.code()), Some(ErrorCode::InvalidState));

    let off = store.with(|c| {
        Ok(write_tx(c, |tx| {
            ops::set_maintenance(tx, "node_b", rec.version, OP, false, None)
        }))
    })??;
    assert!(!off.maintenance);
    assert_eq!(off.maintenance_reason, None);
    let adopted =
        store.with(|c| Ok(write_tx(c, |tx| ops::adopt(tx, "node_b", off.version, OP))))??;
    assert_eq!(adopted.provision_state, ProvisionState::Adopted);
    Ok(())
}

#[test]
fn taint_writes_reason_in_the_same_transaction() -> TestResult {
    let (store, _) = setup()?;
    let v = version(&store, "node_a")?;
    // A transaction that taints and then fails leaves neither the taint nor its reason.
    let failed: Result<(), OpError> = store.with(|c| {
        Ok(write_tx(c, |tx| {
            ops::taint(tx, "node_a", v, OP, "gpu-firmware", "pending")?;
            Err(OpError::InvalidArgument("abort after taint".into()))
        }))
    })?;
    assert!(failed.is_err());
    let n = store.with(|c| nodes::get(c, "node_a"))?.ok_or("gone")?;
    assert!(n.no_schedule_reasons.is_empty());
    assert!(store.with(|c| taints::list(c, "node_a"))?.is_empty());

    let n = store.with(|c| {
        Ok(write_tx(c, |tx| {
            ops::taint(tx, "node_a", v, OP, "gpu-firmware", "pending")
        }))
    })??;
    assert_eq!(n.no_schedule_reasons, vec!["taint:gpu-firmware"]);
    let stored = store.with(|c| nodes::get(c, "node_a"))?.ok_or("gone")?;
    assert_eq!(stored.no_schedule_reasons, vec!["taint:gpu-firmware"]);
    assert_eq!(store.with(|c| taints::list(c, "node_a"))?.len(), 1);
    let d = store.with(|c| Ok(query::get_node(c, "node_a")))??;
    assert_eq!(d.capacity_bucket, CapacityBucket::Unhealthy);

    let bad = store.with(|c| {
        Ok(write_tx(c, |tx| {
            ops::taint(tx, "node_a", n.version, OP, "bad key!", "")
        }))
    })?;
    assert_eq!(
        bad.err().map(|e| e.code()),
        Some(ErrorCode::InvalidArgument)
    );
    let missing = store.with(|c| {
        Ok(write_tx(c, |tx| {
            ops::untaint(tx, "node_a", n.version, OP, "other")
        }))
    })?;
    assert_eq!(missing.err().map(|e| e.code()), Some(ErrorCode::NotFound));
    let n = store.with(|c| {
        Ok(write_tx(c, |tx| {
            ops::untaint(tx, "node_a", n.version, OP, "gpu-firmware")
        }))
    })??;
    assert!(n.no_schedule_reasons.is_empty());
    assert!(store.with(|c| taints::list(c, "node_a"))?.is_empty());
    Ok(())
}

#[test]
fn no_schedule_condition_drives_its_reason() -> TestResult {
    let (store, _) = setup()?;
    let update = |status| ConditionUpdate {
        type_: "GpuCountMismatch".into(),
        status,
        reason: "CountDiffers".into(),
        message: "expected 8, found 7".into(),
        owner: "Inventory".into(),
        gpus: Vec::new(),
    };
    let n = store.with(|c| {
        Ok(write_tx(c, |tx| {
            set_condition(tx, "node_a", &update(ConditionStatus::True))
        }))
    })??;
    assert_eq!(n.no_schedule_reasons, vec!["GpuCountMismatch"]);
    let first_time = n.conditions[0].last_transition_time.clone();
    assert!(first_time.ends_with('Z'), "{first_time}");
    // Same status again: lastTransitionTime stays, nothing new to save.
    let same = store.with(|c| {
        Ok(write_tx(c, |tx| {
            set_condition(tx, "node_a", &update(ConditionStatus::True))
        }))
    })??;
    assert_eq!(same.conditions[0].last_transition_time, first_time);
    assert_eq!(same.version, n.version);
    let cleared = store.with(|c| {
        Ok(write_tx(c, |tx| {
            set_condition(tx, "node_a", &update(ConditionStatus::False))
        }))
    })??;
    assert!(cleared.no_schedule_reasons.is_empty());
    assert_eq!(cleared.conditions.len(), 1);
    // A condition that is not NoSchedule never touches the reasons.
    let info = ConditionUpdate {
        type_: "HardwareKeyTrusted".into(),
        ..update(ConditionStatus::True)
    };
    let n = store.with(|c| Ok(write_tx(c, |tx| set_condition(tx, "node_a", &info))))??;
    assert!(n.no_schedule_reasons.is_empty());
    assert_eq!(n.conditions.len(), 2);
    Ok(())
}

#[test]
fn connectivity_writer_keeps_unreachable_in_step() -> TestResult {
    let (store, _) = setup()?;
    let n = store.with(|c| {
        Ok(write_tx(c, |tx| {
            ops::set_connectivity(
                tx,
                "node_a",
                "Liveness",
                Connectivity::Unreachable,
                "no heartbeat for 40 s",
            )
        }))
    })??;
    assert_eq!(n.no_schedule_reasons, vec!["unreachable"]);
    let n = store.with(|c| {
        Ok(write_tx(c, |tx| {
            ops::set_connectivity(tx, "node_a", "Liveness", Connectivity::Lost, "10 min")
        }))
    })??;
    assert_eq!(n.no_schedule_reasons, vec!["unreachable"]);
    let n = store.with(|c| {
        Ok(write_tx(c, |tx| {
            ops::set_connectivity(tx, "node_a", "gateway", Connectivity::Connected, "session")
        }))
    })??;
    assert!(n.no_schedule_reasons.is_empty());
    Ok(())
}

#[test]
fn drain_holds_draining_until_allocations_are_released() -> TestResult {
    let (store, pool_id) = setup()?;
    let req = AllocationRequest {
        pool_id: pool_id.clone().into(),
        gpus: 2,
        tenant_id: None,
        workload_id: None,
    };
    let a = store.with(|c| Ok(write_tx(c, |tx| placer::create(tx, &req, OP))))??;
    let b = store.with(|c| Ok(write_tx(c, |tx| placer::create(tx, &req, OP))))??;
    let v = version(&store, "node_a")?;
    let n = store.with(|c| Ok(write_tx(c, |tx| ops::drain(tx, "node_a", v, OP))))??;
    assert!(n.cordoned);
    assert_eq!(n.no_schedule_reasons, vec!["draining"]);
    // Deleting a node that still holds allocations is refused.
    let del = store.with(|c| Ok(write_tx(c, |tx| ops::delete(tx, "node_a", n.version, OP))))?;
    assert_eq!(del.err().map(|e| e.code()), Some(ErrorCode::InvalidState));
    store.with(|c| Ok(write_tx(c, |tx| placer::release(tx, &a.id, OP))))??;
    let n = store.with(|c| nodes::get(c, "node_a"))?.ok_or("gone")?;
    assert_eq!(
        n.no_schedule_reasons,
        vec!["draining"],
        "one allocation left"
    );
    store.with(|c| Ok(write_tx(c, |tx| placer::release(tx, &b.id, OP))))??;
    let n = store.with(|c| nodes::get(c, "node_a"))?.ok_or("gone")?;
    assert!(n.no_schedule_reasons.is_empty());
    assert!(n.cordoned, "drain leaves the node cordoned");
    // Releasing twice is INVALID_STATE.
    let twice = store.with(|c| Ok(write_tx(c, |tx| placer::release(tx, &b.id, OP))))?;
    assert_eq!(twice.err().map(|e| e.code()), Some(ErrorCode::InvalidState));
    // Draining an idle node only cordons it.
    let n = store.with(|c| Ok(write_tx(c, |tx| ops::drain(tx, "node_a", n.version, OP))))??;
    assert!(n.no_schedule_reasons.is_empty());
    Ok(())
}

#[test]
fn spec_identity_delete() -> TestResult {
    let (store, _) = setup()?;
    let v = version(&store, "node_a")?;
    let n = store.with(|c| {
        Ok(write_tx(c, |tx| {
            ops::update_spec(tx, "node_a", v, OP, serde_json::json!({"devices": {}}))
        }))
    })??;
    assert_eq!(n.generation, 2);
    assert_eq!(n.spec, serde_json::json!({"devices": {}}));
    let bad = store.with(|c| {
        Ok(write_tx(c, |tx| {
            ops::update_spec(tx, "node_a", n.version, OP, serde_json::json!([1]))
        }))
    })?;
    assert_eq!(
        bad.err().map(|e| e.code()),
        Some(ErrorCode::InvalidArgument)
    );
    let n = store.with(|c| {
        Ok(write_tx(c, |tx| {
            ops::revoke_identity(tx, "node_a", n.version, OP)
        }))
    })??;
    assert_eq!(n.identity_generation, 2);
    let n = store.with(|c| {
        Ok(write_tx(c, |tx| {
            ops::taint(tx, "node_a", n.version, OP, "k", "v")
        }))
    })??;
    let gone = store.with(|c| Ok(write_tx(c, |tx| ops::delete(tx, "node_a", n.version, OP))))??;
    assert_eq!(gone.identity_generation, 3);
    assert!(store.with(|c| nodes::get(c, "node_a"))?.is_none());
    assert!(store.with(|c| taints::list(c, "node_a"))?.is_empty());
    let log = store.with(|c| Ok(query::node_events(c, "node_a")))??;
    assert_eq!(log.last().map(|e| e.kind.as_str()), Some("deleted"));
    let kinds: Vec<&str> = log.iter().map(|e| e.kind.as_str()).collect();
    assert!(
        kinds.contains(&"generation") && kinds.contains(&"identityGeneration"),
        "{kinds:?}"
    );
    Ok(())
}

#[test]
fn dedicated_root_lease_makes_the_node_tenant_controlled() -> TestResult {
    let (store, _) = setup()?;
    let v = version(&store, "node_a")?;
    let (n, lease) = store.with(|c| {
        Ok(write_tx(c, |tx| {
            ops::start_dedicated_root(tx, "node_a", v, OP, "tenant-x")
        }))
    })??;
    assert_eq!(n.trust, Trust::TenantControlled);
    assert_eq!(lease.trust_before, Trust::Platform);
    let d = store.with(|c| Ok(query::get_node(c, "node_a")))??;
    assert_eq!(d.capacity_bucket, CapacityBucket::Excluded);
    let twice = store.with(|c| {
        Ok(write_tx(c, |tx| {
            ops::start_dedicated_root(tx, "node_a", n.version, OP, "tenant-y")
        }))
    })?;
    assert_eq!(twice.err().map(|e| e.code()), Some(ErrorCode::InvalidState));
    let n = store.with(|c| {
        Ok(write_tx(c, |tx| {
            ops::end_dedicated_root(tx, "node_a", n.version, OP)
        }))
    })??;
    assert_eq!(n.trust, Trust::Platform);
    let none = store.with(|c| {
        Ok(write_tx(c, |tx| {
            ops::end_dedicated_root(tx, "node_a", n.version, OP)
        }))
    })?;
    assert_eq!(none.err().map(|e| e.code()), Some(ErrorCode::InvalidState));
    Ok(())
}

#[test]
fn list_filters_by_pool_state_connectivity_and_schedulable() -> TestResult {
    let (store, pool_id) = setup()?;
    store.with(|c| {
        node(c, "node_b", Some(&pool_id))?;
        node(c, "node_c", None)?;
        Ok(())
    })?;
    let ids = |f: NodeFilter| -> Result<Vec<String>, Box<dyn std::error::Error>> {
        Ok(store
            .with(|c| Ok(query::list_nodes(c, &f)))??
            .into_iter()
            .map(|d| d.id)
            .collect())
    };
    assert_eq!(
        ids(NodeFilter::default())?,
        vec!["node_a", "node_b", "node_c"]
    );
    assert_eq!(
        ids(NodeFilter {
            pool_id: Some(pool_id.clone().into()),
            ..Default::default()
        })?,
        vec!["node_a", "node_b"]
    );
    assert_eq!(
        ids(NodeFilter {
            provision_state: Some(ProvisionState::Adopting),
            ..Default::default()
        })?,
        vec!["node_b", "node_c"]
    );
    assert_eq!(
        ids(NodeFilter {
            connectivity: Some(Connectivity::Connected),
            ..Default::default()
        })?,
        vec!["node_a"]
    );
    assert_eq!(
        ids(NodeFilter {
            schedulable: Some(true),
            ..Default::default()
        })?,
        vec!["node_a"]
    );
    assert_eq!(
        ids(NodeFilter {
            schedulable: Some(false),
            ..Default::default()
        })?,
        vec!["node_b", "node_c"]
    );
    Ok(())
}
