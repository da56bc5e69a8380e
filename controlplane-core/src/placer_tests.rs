//! Placer and capacity tests, and the concurrency test: cordons and allocations in parallel
//! transactions on separate connections to one database file; no allocation ever lands on a node
//! whose cordon committed first.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bc_protocol::{ErrorCode, PoolKind, SiteKind, Trust};
use cpl_store::{AllocationFilter, Store, StoreError};

use crate::error::OpError;
use crate::ops::nodes as ops;
use crate::placer::{self, AllocationRequest};
use crate::schedulable::CapacityBucket;
use crate::test_utils::{
    StoreExt, TestResult, events, force, node, nodes, pool, ready_host, site, write_tx,
};

const OP: &str = "operator:test";

fn req(pool_id: &str, gpus: u32) -> AllocationRequest {
    AllocationRequest {
        pool_id: pool_id.into(),
        gpus,
        tenant_id: None,
        workload_id: None,
    }
}

fn task(e: impl std::fmt::Display) -> StoreError {
    StoreError::Task(e.to_string())
}

#[test]
fn books_best_fit_and_never_a_cordoned_node() -> TestResult {
    let store = cpl_store::testing::store()?;
    let pool_id = store.with(|c| {
        let p = pool(c, PoolKind::MetalHost, None).map_err(task)?;
        for (id, gpus) in [("node_a", 8), ("node_b", 4), ("node_c", 2)] {
            node(c, id, Some(&p.id))?;
            ready_host(c, id, gpus)?;
        }
        Ok(p.id)
    })?;
    // 3 GPUs: node_b (4 free) is the tightest fit.
    let a = store.with(|c| Ok(write_tx(c, |tx| placer::create(tx, &req(&pool_id, 3), OP))))??;
    assert_eq!(a.node_id, "node_b");
    assert_eq!(
        a.atoms,
        vec!["GPU-node_b-0", "GPU-node_b-1", "GPU-node_b-2"]
    );
    // Cordon node_c; 2 GPUs then go to node_a, not the cordoned node_c.
    let v = store
        .with(|c| nodes::get(c, "node_c"))?
        .ok_or("gone")?
        .version;
    store.with(|c| Ok(write_tx(c, |tx| ops::cordon(tx, "node_c", v, OP))))??;
    let b = store.with(|c| Ok(write_tx(c, |tx| placer::create(tx, &req(&pool_id, 2), OP))))??;
    assert_eq!(b.node_id, "node_a");
    // 7 GPUs: node_a has 6 free, node_b 1: nothing fits.
    let err = store
        .with(|c| Ok(write_tx(c, |tx| placer::create(tx, &req(&pool_id, 7), OP))))?
        .err()
        .ok_or("must not fit")?;
    assert_eq!(err.code(), ErrorCode::Unavailable);
    assert!(
        matches!(
            err,
            OpError::InsufficientCapacity {
                requested: 7,
                largest_free: 6,
                ..
            }
        ),
        "{err}"
    );
    let zero = store.with(|c| Ok(write_tx(c, |tx| placer::create(tx, &req(&pool_id, 0), OP))))?;
    assert_eq!(
        zero.err().map(|e| e.code()),
        Some(ErrorCode::InvalidArgument)
    );
    let nopool = store.with(|c| Ok(write_tx(c, |tx| placer::create(tx, &req("pool_x", 1), OP))))?;
    assert_eq!(nopool.err().map(|e| e.code()), Some(ErrorCode::NotFound));

    let cap = store.with(|c| Ok(placer::capacity(c, &pool_id)))??;
    assert_eq!(cap.total, 14);
    assert_eq!(cap.buckets[&CapacityBucket::Available], 12);
    assert_eq!(cap.buckets[&CapacityBucket::Maintenance], 2);
    assert_eq!(cap.allocated, 5);
    assert_eq!(cap.free, 7);
    // The booking is in the node's event log.
    let log = store.with(|c| events::list(c, "node_b"))?;
    assert_eq!(log.last().and_then(|e| e.to.clone()), Some(a.id.clone()));
    Ok(())
}

#[test]
fn capacity_respects_trust() -> TestResult {
    let store = cpl_store::testing::store()?;
    let (own, other) = store.with(|c| {
        let own = pool(c, PoolKind::MetalHost, Some("tenant-a")).map_err(task)?;
        let other = pool(c, PoolKind::MetalHost, Some("tenant-b")).map_err(task)?;
        for (id, p) in [("node_own", &own.id), ("node_elsewhere", &other.id)] {
            node(c, id, Some(p))?;
            ready_host(c, id, 4)?;
            force(c, id, |n| {
                n.trust = Trust::TenantOwned;
                n.owner_tenant_id = Some("tenant-a".into());
            })?;
        }
        node(c, "node_leased", Some(&own.id))?;
        ready_host(c, "node_leased", 4)?;
        Ok((own.id, other.id))
    })?;
    let v = store
        .with(|c| nodes::get(c, "node_leased"))?
        .ok_or("gone")?
        .version;
    store.with(|c| {
        Ok(write_tx(c, |tx| {
            ops::start_dedicated_root(tx, "node_leased", v, OP, "tenant-a")
        }))
    })??;
    let own_cap = store.with(|c| Ok(placer::capacity(c, &own)))??;
    assert_eq!(
        own_cap.buckets[&CapacityBucket::Available],
        4,
        "tenant-owned counts in its owner's pool"
    );
    assert_eq!(
        own_cap.buckets[&CapacityBucket::Excluded],
        4,
        "tenant-controlled adds nothing"
    );
    let other_cap = store.with(|c| Ok(placer::capacity(c, &other)))??;
    assert_eq!(other_cap.buckets[&CapacityBucket::Available], 0);
    assert_eq!(other_cap.buckets[&CapacityBucket::Excluded], 4);
    // Another tenant may not allocate from tenant-a's pool.
    let denied = store.with(|c| {
        Ok(write_tx(c, |tx| {
            placer::create(
                tx,
                &AllocationRequest {
                    tenant_id: Some("tenant-b".into()),
                    ..req(&own, 1)
                },
                OP,
            )
        }))
    })?;
    assert_eq!(
        denied.err().map(|e| e.code()),
        Some(ErrorCode::PermissionDenied)
    );
    let a = store.with(|c| Ok(write_tx(c, |tx| placer::create(tx, &req(&own, 4), OP))))??;
    assert_eq!(a.node_id, "node_own");
    Ok(())
}

#[test]
fn join_placement_role_trust_adapter_drivers() -> TestResult {
    use crate::ops::pools::{NewPool, create};
    use crate::ownership::{placement_for_join, role_for};
    use bc_protocol::PoolAgent;
    use bc_protocol::{Adapter, NodeRole};
    use cpl_store::HardwareProfile;
    assert_eq!(role_for(Some(PoolKind::MetalHost), false), NodeRole::Host);
    assert_eq!(role_for(Some(PoolKind::VpsHost), false), NodeRole::Host);
    assert_eq!(role_for(Some(PoolKind::Provider), false), NodeRole::Host);
    assert_eq!(
        role_for(Some(PoolKind::MetalDedicated), false),
        NodeRole::Dedicated
    );
    assert_eq!(role_for(None, false), NodeRole::Unassigned);
    assert_eq!(role_for(Some(PoolKind::MetalHost), true), NodeRole::Site);
    let store = cpl_store::testing::store()?;
    store.with(|c| {
        let custom = site(c, SiteKind::Custom, Some("tenant-a")).map_err(task)?;
        let mut profile = HardwareProfile::default();
        profile.drivers.insert("power".into(), "redfish".into());
        let p = create(
            c,
            &NewPool {
                name: "prov".into(),
                kind: PoolKind::Provider,
                agent: PoolAgent::None,
                site_id: Some(custom.id.clone().into()),
                owner_tenant_id: None,
                hardware_profile: profile,
                acceptance: Default::default(),
            },
        )
        .map_err(task)?;
        assert_eq!(
            p.owner_tenant_id.as_deref(),
            Some("tenant-a"),
            "pool on a custom site is the tenant's"
        );
        let pl = placement_for_join(c, Some(&p.id), None, false).map_err(task)?;
        assert_eq!(pl.role, NodeRole::Host);
        assert_eq!(pl.trust, Trust::TenantOwned);
        assert_eq!(pl.adapter, Adapter::ProviderApiV1);
        assert_eq!(pl.site_id.as_deref(), Some(custom.id.as_str()));
        assert_eq!(pl.owner_tenant_id.as_deref(), Some("tenant-a"));
        assert_eq!(pl.drivers.get("power"), Some(&serde_json::json!("redfish")));
        let site_agent = placement_for_join(c, None, Some(&custom.id), true).map_err(task)?;
        assert_eq!(
            (site_agent.role, site_agent.pool_id),
            (NodeRole::Site, None)
        );
        let platform = site(c, SiteKind::Platform, None).map_err(task)?;
        let mismatch = placement_for_join(c, Some(&p.id), Some(&platform.id), false);
        assert_eq!(
            mismatch.err().map(|e| e.code()),
            Some(ErrorCode::InvalidArgument)
        );
        // Tokens bind to an existing pool or site only.
        let bad = crate::ops::tokens::create(
            c,
            &cpl_store::NewToken {
                pool_id: Some("pool_nope".into()),
                ttl_ms: 1000,
                ..Default::default()
            },
        );
        assert_eq!(bad.err().map(|e| e.code()), Some(ErrorCode::NotFound));
        let (tok, _) = crate::ops::tokens::create(
            c,
            &cpl_store::NewToken {
                site_id: Some(platform.id.clone()),
                ttl_ms: 1000,
                ..Default::default()
            },
        )
        .map_err(task)?;
        crate::ops::tokens::revoke(c, &tok.id).map_err(task)?;
        assert!(c.tokens()?.iter().any(|t| t.id == tok.id && t.revoked));
        // A custom site without an owner, and deleting a site that still has pools, are refused.
        assert_eq!(
            site(c, SiteKind::Custom, None).err().map(|e| e.code()),
            Some(ErrorCode::InvalidArgument)
        );
        let del = crate::ops::sites::delete(c, &custom.id, custom.version);
        assert_eq!(del.err().map(|e| e.code()), Some(ErrorCode::InvalidState));
        let stale = crate::ops::pools::delete(c, &p.id, p.version + 1);
        assert_eq!(stale.err().map(|e| e.code()), Some(ErrorCode::Conflict));
        Ok(())
    })?;
    Ok(())
}

/// Replays every node's event log in commit order (`seq`): a booking (`allocation` with a `to`)
/// while the node's last committed cordon says `true` is a violation.
fn violations(store: &Store, node_ids: &[String]) -> Result<(u64, u64, u64), StoreError> {
    let (mut bookings, mut cordons, mut bad) = (0, 0, 0);
    for id in node_ids {
        let mut cordoned = false;
        for e in store.with(|c| events::list(c, id))? {
            match (e.kind.as_str(), e.to.as_deref()) {
                ("cordoned", Some(to)) => {
                    cordoned = to == "true";
                    cordons += u64::from(cordoned);
                }
                ("allocation", Some(_)) => {
                    bookings += 1;
                    bad += u64::from(cordoned);
                }
                _ => {}
            }
        }
    }
    Ok((bookings, cordons, bad))
}

#[test]
fn no_allocation_on_a_node_whose_cordon_committed_first() -> TestResult {
    const NODES: usize = 4;
    const CORDON_OPS: u64 = 1200;
    const ALLOC_OPS: u64 = 800;
    const ALLOCATORS: usize = 2;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("state.db");
    let setup = Store::open(&path)?;
    let node_ids: Vec<String> = (0..NODES).map(|i| format!("node_{i}")).collect();
    let pool_id = setup.with(|c| {
        let p = pool(c, PoolKind::MetalHost, None).map_err(task)?;
        for id in &node_ids {
            node(c, id, Some(&p.id))?;
            ready_host(c, id, 8)?;
        }
        Ok(p.id)
    })?;
    drop(setup);

    let refused = Arc::new(AtomicU64::new(0));
    let allocators_done = Arc::new(AtomicBool::new(false));
    let cordon_txs = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    {
        let (path, ids) = (path.clone(), node_ids.clone());
        let (done, txs) = (Arc::clone(&allocators_done), Arc::clone(&cordon_txs));
        handles.push(std::thread::spawn(move || -> Result<(), String> {
            let store = Store::open(&path).map_err(|e| e.to_string())?;
            let mut rng_state = 0x9e37_79b9_u64;
            let mut i = 0u64;
            // Cordon one node, uncordon it, pick another: at most one node is cordoned at a time,
            // so the allocators keep finding room and race with every cordon. Runs until the
            // allocators are done, and at least CORDON_OPS times.
            let mut id = ids[0].clone();
            while i < CORDON_OPS || !done.load(Ordering::SeqCst) {
                let cordon = i.is_multiple_of(2);
                if cordon {
                    rng_state = rng_state
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1);
                    id = ids[(rng_state >> 33) as usize % ids.len()].clone();
                }
                store
                    .with(|c| {
                        Ok(write_tx(c, |tx| {
                            let v = nodes::get(tx, &id)?.map(|n| n.version).unwrap_or(0);
                            if cordon {
                                ops::cordon(tx, &id, v, OP)
                            } else {
                                ops::uncordon(tx, &id, v, OP)
                            }
                        }))
                    })
                    .map_err(|e| e.to_string())?
                    .map_err(|e| e.to_string())?;
                i += 1;
            }
            txs.store(i, Ordering::SeqCst);
            Ok(())
        }));
    }
    for t in 0..ALLOCATORS {
        let (path, pool_id, refused) = (path.clone(), pool_id.clone(), Arc::clone(&refused));
        handles.push(std::thread::spawn(move || -> Result<(), String> {
            let store = Store::open(&path).map_err(|e| e.to_string())?;
            let mut mine = std::collections::VecDeque::new();
            for i in 0..ALLOC_OPS {
                let gpus = 1 + u32::try_from((i + t as u64) % 3).unwrap_or(0);
                let r = store
                    .with(|c| {
                        Ok(write_tx(c, |tx| {
                            placer::create(tx, &req(&pool_id, gpus), OP)
                        }))
                    })
                    .map_err(|e| e.to_string())?;
                match r {
                    Ok(a) => mine.push_back(a.id),
                    Err(OpError::InsufficientCapacity { .. }) => {
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => return Err(e.to_string()),
                }
                // Keep the pool from filling up: hold at most 4 allocations per thread.
                if mine.len() > 4
                    && let Some(id) = mine.pop_front()
                {
                    store
                        .with(|c| Ok(write_tx(c, |tx| placer::release(tx, &id, OP))))
                        .map_err(|e| e.to_string())?
                        .map_err(|e| e.to_string())?;
                }
            }
            Ok(())
        }));
    }
    // Allocators first (handles[1..]), then tell the cordoner to stop.
    let cordoner = handles.remove(0);
    for h in handles {
        h.join().map_err(|_| "thread panicked")??;
    }
    allocators_done.store(true, Ordering::SeqCst);
    cordoner.join().map_err(|_| "thread panicked")??;
    let store = Store::open(&path)?;
    let (bookings, cordons, bad) = violations(&store, &node_ids)?;
    let total = store
        .with(|c| c.allocations(&AllocationFilter::default()))?
        .len();
    println!(
        "concurrency: {} cordon/uncordon txs, {bookings} bookings, {} refused, {cordons} cordons",
        cordon_txs.load(Ordering::SeqCst),
        refused.load(Ordering::Relaxed)
    );
    assert_eq!(
        bad, 0,
        "allocations booked on a node after its cordon committed"
    );
    assert_eq!(
        u64::try_from(total)?,
        bookings,
        "every allocation is in a node's log"
    );
    assert!(bookings > 0 && cordons > 0, "both sides must have run");
    // No atom booked twice at any time: the final active set has unique (node, atom) pairs by
    // primary key; cross-check the per-node counts against the inventories.
    let active = AllocationFilter {
        active_only: true,
        ..Default::default()
    };
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for a in store.with(|c| c.allocations(&active))? {
        *per_node.entry(a.node_id).or_default() += a.atoms.len();
    }
    assert!(per_node.values().all(|n| *n <= 8), "{per_node:?}");
    Ok(())
}
