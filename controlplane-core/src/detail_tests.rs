//! NodeDetail's shape, the error-code mapping, the power axis, and optimistic concurrency under
//! parallel writers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};

use bc_protocol::{ErrorCode, Power, ProvisionState};

use bc_protocol::PoolKind;
use cpl_store::{Store, StoreError};

use crate::edit::Edit;
use crate::error::{ErrorBody, OpError};
use crate::ops::nodes as ops;
use crate::query;
use crate::test_utils::{
    StoreExt, TestResult, events, force, node, nodes, pool, ready_host, write_tx,
};

fn setup() -> Result<Store, Box<dyn std::error::Error>> {
    let store = cpl_store::testing::store()?;
    store.with(|c| {
        let p = pool(c, PoolKind::MetalHost, None).map_err(|e| StoreError::Task(e.to_string()))?;
        node(c, "node_a", Some(&p.id))?;
        ready_host(c, "node_a", 4)?;
        Ok(())
    })?;
    Ok(store)
}

#[test]
fn node_detail_has_exactly_the_spec_fields() -> TestResult {
    let store = setup()?;
    store.with(|c| {
        force(c, "node_a", |n| {
            n.session_epoch = 3;
            n.gateway_id = Some("gw-1".into());
            n.connected_at = Some(1_700_000_000_000);
            n.last_seen = Some(1_700_000_001_500);
            n.hardware_key = Some("deadbeef".into());
            n.power = Power::On;
        })?;
        Ok(())
    })?;
    let d = store.with(|c| Ok(query::get_node(c, "node_a")))??;
    let json = serde_json::to_value(&d)?;
    let obj = json.as_object().ok_or("not an object")?;
    let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
    keys.sort_unstable();
    let mut want = vec![
        "id",
        "siteId",
        "poolId",
        "ownerTenantId",
        "role",
        "trust",
        "provisionState",
        "maintenance",
        "cordoned",
        "connectivity",
        "conditions",
        "noScheduleReasons",
        "hardwareKeyTrusted",
        "generation",
        "observedGeneration",
        "identityGeneration",
        "version",
        "labels",
        "session",
        "inventory",
        "schedulable",
        "capacityBucket",
    ];
    want.sort_unstable();
    assert_eq!(
        keys, want,
        "no power, adapter, drivers, hardwareKey; failedFrom only when failed"
    );
    assert_eq!(json["session"]["epoch"], 3);
    assert_eq!(json["session"]["gatewayId"], "gw-1");
    assert_eq!(json["session"]["connectedAt"], "2023-11-14T22:13:20.000Z");
    assert_eq!(json["session"]["lastSeen"], "2023-11-14T22:13:21.500Z");
    assert!(json["session"]["disconnectedAt"].is_null());
    assert_eq!(json["inventory"]["gpus"], 4);
    assert_eq!(json["capacityBucket"], "available");
    assert_eq!(json["schedulable"], true);
    Ok(())
}

#[test]
fn every_error_maps_to_its_code() {
    use ErrorCode::*;
    let cases: Vec<(OpError, ErrorCode)> = vec![
        (
            OpError::NotFound {
                kind: "node",
                id: "n".into(),
            },
            NotFound,
        ),
        (
            OpError::InvalidTransition {
                from: ProvisionState::Retired,
                to: ProvisionState::Ready,
            },
            InvalidState,
        ),
        (OpError::InvalidState("x".into()), InvalidState),
        (
            OpError::Conflict {
                kind: "node",
                id: "n".into(),
                expected: 1,
                actual: 2,
            },
            Conflict,
        ),
        (OpError::InvalidArgument("x".into()), InvalidArgument),
        (OpError::PermissionDenied("x".into()), PermissionDenied),
        (
            OpError::InsufficientCapacity {
                pool_id: "p".into(),
                requested: 9,
                largest_free: 8,
            },
            Unavailable,
        ),
        (OpError::Store(StoreError::Task("x".into())), Internal),
    ];
    for (e, code) in cases {
        assert_eq!(e.code(), code, "{e}");
        let body = serde_json::to_value(ErrorBody::from(&e)).unwrap_or_default();
        assert_eq!(body["code"], code.as_str());
        assert_eq!(body["message"], e.to_string());
    }
}

#[test]
fn power_is_its_own_axis_and_not_in_node_detail() -> TestResult {
    let store = setup()?;
    let n = store.with(|c| {
        Ok(write_tx(c, |tx| {
            ops::set_power(tx, "node_a", "BMC", Power::Off)
        }))
    })??;
    assert_eq!(n.power, Power::Off);
    assert!(n.no_schedule_reasons.is_empty());
    let stored = store.with(|c| nodes::get(c, "node_a"))?.ok_or("gone")?;
    assert_eq!(stored.power, Power::Off);
    let json = serde_json::to_value(store.with(|c| Ok(query::get_node(c, "node_a")))??)?;
    assert!(json.get("power").is_none());
    Ok(())
}

#[test]
fn save_refuses_a_row_that_moved_under_the_edit() -> TestResult {
    let store = setup()?;
    let err = store.with(|c| {
        Ok(write_tx(c, |tx| {
            let mut edit = Edit::begin(tx, "node_a", None, "test")?;
            edit.node.cordoned = true;
            edit.event("cordoned", None, None, "test");
            // Another writer without the lock (PostgreSQL without FOR UPDATE) saves the row.
            let mut other = Edit::begin(tx, "node_a", None, "other")?;
            other.node.maintenance = true;
            other.event("maintenance", None, None, "other");
            other.save(tx)?;
            edit.save(tx)
        }))
    })?;
    assert!(matches!(err, Err(OpError::Conflict { .. })), "{err:?}");
    Ok(())
}

/// Several operators race on one node, each with the version it read in its own transaction
/// and a separate connection, all reading before any writes: each round exactly one wins and
/// moves the version by one, every other gets CONFLICT, and no write is lost.
#[test]
fn parallel_writers_with_one_version_get_one_winner_each_round() -> TestResult {
    const THREADS: usize = 3;
    const ROUNDS: u64 = 150;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("state.db");
    let setup = Store::open(&path)?;
    setup.with(|c| {
        node(c, "node_a", None)?;
        Ok(())
    })?;
    let v0 = setup
        .with(|c| nodes::get(c, "node_a"))?
        .ok_or("gone")?
        .version;
    drop(setup);
    let (wins, conflicts) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let barrier = Arc::new(Barrier::new(THREADS));
    let mut handles = Vec::new();
    for _ in 0..THREADS {
        let (path, wins, conflicts) = (path.clone(), Arc::clone(&wins), Arc::clone(&conflicts));
        let barrier = Arc::clone(&barrier);
        handles.push(std::thread::spawn(move || -> Result<(), String> {
            let store = Store::open(&path).map_err(|e| e.to_string())?;
            // Errors are kept, not returned, so this thread keeps meeting the barriers and a
            // failure fails the test instead of hanging the others.
            let mut first_error = None;
            for _ in 0..ROUNDS {
                // Read the version in one transaction, write with it in another, as an API
                // client does.
                let read = store.with(|c| nodes::get(c, "node_a"));
                // Everyone has read before anyone writes: each round has exactly one winner.
                barrier.wait();
                let outcome = match read {
                    Ok(Some(n)) => store
                        .with(|c| {
                            // Flip what was read, so a write at that version is a real change.
                            Ok(write_tx(c, |tx| {
                                if n.cordoned {
                                    ops::uncordon(tx, "node_a", n.version, "op")
                                } else {
                                    ops::cordon(tx, "node_a", n.version, "op")
                                }
                            }))
                        })
                        .map_err(|e| e.to_string())
                        .map(|r| (n.version, r)),
                    Ok(None) => Err("node vanished".to_owned()),
                    Err(e) => Err(e.to_string()),
                };
                match outcome {
                    Ok((v, Ok(n))) if n.version == v + 1 => {
                        wins.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok((v, Ok(n))) => {
                        first_error.get_or_insert(format!("version {v} became {}", n.version));
                    }
                    Ok((_, Err(OpError::Conflict { .. }))) => {
                        conflicts.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok((_, Err(e))) => {
                        first_error.get_or_insert(e.to_string());
                    }
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                }
                // Nobody reads the next round before every write of this one is done.
                barrier.wait();
            }
            first_error.map_or(Ok(()), Err)
        }));
    }
    for h in handles {
        h.join().map_err(|_| "thread panicked")??;
    }
    let store = Store::open(&path)?;
    let end = store.with(|c| nodes::get(c, "node_a"))?.ok_or("gone")?;
    let (wins, conflicts) = (
        wins.load(Ordering::Relaxed),
        conflicts.load(Ordering::Relaxed),
    );
    println!("optimistic concurrency: {wins} wins, {conflicts} conflicts");
    assert_eq!(wins, ROUNDS, "one winner per round");
    assert_eq!(
        conflicts,
        (THREADS as u64 - 1) * ROUNDS,
        "every other writer conflicts"
    );
    assert_eq!(
        end.version,
        v0 + wins,
        "every win is exactly one version step"
    );
    let logged = store
        .with(|c| events::list(c, "node_a"))?
        .iter()
        .filter(|e| e.kind == "cordoned")
        .count();
    assert_eq!(logged as u64, wins, "one event per win, none for a loser");
    assert_eq!(end.provision_state, ProvisionState::Adopting);
    Ok(())
}
