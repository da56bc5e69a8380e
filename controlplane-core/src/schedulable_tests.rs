//! The Rust predicate and the SQL predicate agree, bucket included: exhaustively over every
//! combination of the axis values the seven checks read, and by proptest over wider values
//! (any observedGeneration, any tenant names, any reasons). The SQL runs on a real SQLite store.

use bc_protocol::{Adapter, Connectivity, NodeRole, PoolAgent, PoolKind, ProvisionState, Trust};
use cpl_store::{HardwareProfile, NewNode, Pool, StoreError, Tx};
use proptest::prelude::*;

use crate::schedulable::{CapacityBucket, SchedulingFacts, capacity_bucket, is_schedulable};
use crate::test_utils::{StoreExt, TestResult, force};

/// One node row's inputs to the predicate, owned.
#[derive(Debug, Clone)]
struct Case {
    role: NodeRole,
    trust: Trust,
    owner: Option<String>,
    /// Index into [`POOLS`]: which pool the node is in (`None`: no pool).
    pool: Option<usize>,
    maintenance: bool,
    cordoned: bool,
    state: ProvisionState,
    observed_generation: u64,
    connectivity: Connectivity,
    reasons: Vec<String>,
}

/// Pools of the test store: id and owner.
const POOLS: &[(&str, Option<&str>)] = &[
    ("pool_none", None),
    ("pool_a", Some("tenant-a")),
    ("pool_b", Some("tenant-b")),
];

impl Case {
    fn facts(&self) -> SchedulingFacts<'_> {
        SchedulingFacts {
            role: self.role,
            trust: self.trust,
            owner_tenant_id: self.owner.as_deref(),
            pool_owner_tenant_id: self.pool.and_then(|i| POOLS[i].1),
            maintenance: self.maintenance,
            cordoned: self.cordoned,
            provision_state: self.state,
            observed_generation: self.observed_generation,
            connectivity: self.connectivity,
            no_schedule_reasons_empty: self.reasons.is_empty(),
        }
    }
}

fn seed_pools(tx: &Tx<'_>) -> Result<(), StoreError> {
    for (id, owner) in POOLS {
        tx.insert_pool(&Pool {
            id: (*id).to_owned(),
            site_id: None,
            name: (*id).to_owned(),
            kind: PoolKind::MetalHost,
            agent: PoolAgent::Bcd,
            owner_tenant_id: owner.map(str::to_owned),
            hardware_profile: HardwareProfile::default(),
            acceptance: Default::default(),
            remediation: Default::default(),
            conditions: Vec::new(),
            remediation_resumed_at: None,
            remediation_trips: 0,
            version: 1,
            created_at: 0,
        })?;
    }
    Ok(())
}

fn insert(tx: &Tx<'_>, id: &str, c: &Case) -> Result<(), StoreError> {
    tx.insert_node(
        &NewNode {
            id: id.to_owned(),
            site_id: None,
            pool_id: c.pool.map(|i| POOLS[i].0.to_owned()),
            owner_tenant_id: c.owner.clone(),
            role: c.role,
            trust: c.trust,
            adapter: Adapter::BcdV1,
            drivers: Default::default(),
            hostname: None,
            hardware_key: None,
            hardware_key_trusted: false,
            identifier_digests: Vec::new(),
        },
        0,
    )?;
    force(tx, id, |n| {
        n.provision_state = c.state;
        n.maintenance = c.maintenance;
        n.cordoned = c.cordoned;
        n.connectivity = c.connectivity;
        n.observed_generation = c.observed_generation;
        n.no_schedule_reasons = c.reasons.clone();
    })?;
    Ok(())
}

fn every_case() -> Vec<Case> {
    let owners = [None, Some("tenant-a"), Some("tenant-b")];
    let pools = [None, Some(0), Some(1), Some(2)];
    let mut out = Vec::new();
    for &role in NodeRole::ALL {
        for &trust in Trust::ALL {
            for owner in owners {
                for pool in pools {
                    for maintenance in [false, true] {
                        for cordoned in [false, true] {
                            for &state in ProvisionState::ALL {
                                for observed_generation in [0, 1] {
                                    for &connectivity in Connectivity::ALL {
                                        for reasons in [vec![], vec!["taint:gpu".to_owned()]] {
                                            out.push(Case {
                                                role,
                                                trust,
                                                owner: owner.map(str::to_owned),
                                                pool,
                                                maintenance,
                                                cordoned,
                                                state,
                                                observed_generation,
                                                connectivity,
                                                reasons,
                                            });
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

#[test]
fn rust_and_sql_agree_on_every_combination_bucket_included() -> TestResult {
    let store = cpl_store::testing::store()?;
    let cases = every_case();
    // 4 roles x 3 trusts x 3 owners x 4 pools x 2 x 2 x 13 states x 2 generations x 4 x 2.
    assert_eq!(cases.len(), 4 * 3 * 3 * 4 * 2 * 2 * 13 * 2 * 4 * 2);
    // On PostgreSQL every row is a round trip (about 3.6 ms: 217 s of CI for all 59,904), so
    // there the test takes every 7th combination: 7 is prime to every dimension's size and to
    // the products of the inner ones, so every value of every dimension still occurs, and
    // SQLite checks them all with the same query.
    let stride = if cpl_store::testing::on_postgres() {
        7
    } else {
        1
    };
    let cases: Vec<Case> = cases.into_iter().step_by(stride).collect();
    store.with(|tx| {
        seed_pools(tx)?;
        for (i, c) in cases.iter().enumerate() {
            insert(tx, &format!("node_{i:06}"), c)?;
        }
        Ok(())
    })?;
    let verdicts = store.read_blocking(|r| r.sql_verdicts())?;
    assert_eq!(verdicts.len(), cases.len());
    let mut seen = std::collections::BTreeMap::new();
    for ((id, sql_bucket, sql_sched), case) in verdicts.iter().zip(&cases) {
        let rust = capacity_bucket(&case.facts());
        assert_eq!(*sql_bucket, rust, "{id}: {case:?}");
        assert_eq!(*sql_sched, is_schedulable(&case.facts()), "{id}: {case:?}");
        *seen.entry(rust).or_insert(0usize) += 1;
    }
    // The enumeration reaches every bucket, so no branch of either side goes untested.
    assert_eq!(seen.len(), CapacityBucket::ALL.len(), "{seen:?}");
    Ok(())
}

#[test]
fn checks_run_in_the_spec_order() {
    // A node failing every check lands in the first bucket; fixing checks one at a time walks
    // the buckets in the spec's order.
    let mut c = Case {
        role: NodeRole::Dedicated,
        trust: Trust::TenantControlled,
        owner: None,
        pool: Some(0),
        maintenance: true,
        cordoned: true,
        state: ProvisionState::Ready,
        observed_generation: 0,
        connectivity: Connectivity::Lost,
        reasons: vec!["draining".into()],
    };
    let mut walk = vec![capacity_bucket(&c.facts())];
    c.role = NodeRole::Host;
    walk.push(capacity_bucket(&c.facts()));
    c.trust = Trust::Platform;
    walk.push(capacity_bucket(&c.facts()));
    c.maintenance = false;
    walk.push(capacity_bucket(&c.facts()));
    c.cordoned = false;
    walk.push(capacity_bucket(&c.facts()));
    c.state = ProvisionState::Deployed;
    walk.push(capacity_bucket(&c.facts()));
    c.observed_generation = 1;
    walk.push(capacity_bucket(&c.facts()));
    c.connectivity = Connectivity::Connected;
    walk.push(capacity_bucket(&c.facts()));
    c.reasons.clear();
    walk.push(capacity_bucket(&c.facts()));
    use CapacityBucket::*;
    assert_eq!(
        walk,
        vec![
            Excluded,
            Excluded,
            Maintenance,
            Maintenance,
            Provisioning,
            Provisioning,
            Unreachable,
            Unhealthy,
            Available
        ]
    );
}

#[test]
fn tenant_owned_counts_only_in_its_owners_pool_and_tenant_controlled_never() {
    let base = Case {
        role: NodeRole::Host,
        trust: Trust::TenantOwned,
        owner: Some("tenant-a".into()),
        pool: Some(1),
        maintenance: false,
        cordoned: false,
        state: ProvisionState::Adopted,
        observed_generation: 1,
        connectivity: Connectivity::Connected,
        reasons: vec![],
    };
    assert_eq!(capacity_bucket(&base.facts()), CapacityBucket::Available);
    for pool in [None, Some(0), Some(2)] {
        let c = Case {
            pool,
            ..base.clone()
        };
        assert_eq!(
            capacity_bucket(&c.facts()),
            CapacityBucket::Excluded,
            "{c:?}"
        );
    }
    let leased = Case {
        trust: Trust::TenantControlled,
        ..base
    };
    assert_eq!(capacity_bucket(&leased.facts()), CapacityBucket::Excluded);
}

fn arb_case() -> impl Strategy<Value = Case> {
    let tenant = prop::option::of(prop::sample::select(vec![
        "tenant-a".to_owned(),
        "tenant-b".to_owned(),
        "tenant-c".to_owned(),
        String::new(),
    ]));
    (
        (
            prop::sample::select(NodeRole::ALL.to_vec()),
            prop::sample::select(Trust::ALL.to_vec()),
            tenant,
            prop::option::of(0..POOLS.len()),
            any::<bool>(),
            any::<bool>(),
        ),
        (
            prop::sample::select(ProvisionState::ALL.to_vec()),
            prop_oneof![Just(0u64), Just(1u64), 0u64..=i64::MAX as u64],
            prop::sample::select(Connectivity::ALL.to_vec()),
            prop::collection::vec("[a-z:]{1,12}", 0..3),
        ),
    )
        .prop_map(
            |((role, trust, owner, pool, maintenance, cordoned), (state, og, connectivity, r))| {
                let mut reasons = r;
                reasons.sort();
                reasons.dedup();
                Case {
                    role,
                    trust,
                    owner,
                    pool,
                    maintenance,
                    cordoned,
                    state,
                    observed_generation: og,
                    connectivity,
                    reasons,
                }
            },
        )
}

/// Random rows per run: 256 on SQLite; 24 on PostgreSQL, where every case is a new database
/// and its twelve migrations (about 1.4 s each, 360 s of CI for 256), and where the exhaustive
/// `rust_and_sql_agree_on_every_combination_bucket_included` already runs the same query.
fn proptest_cases() -> u32 {
    if cpl_store::testing::on_postgres() {
        24
    } else {
        256
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: proptest_cases(), ..ProptestConfig::default() })]

    #[test]
    fn rust_and_sql_agree_on_arbitrary_rows(cases in prop::collection::vec(arb_case(), 1..16)) {
        let store = cpl_store::testing::store().map_err(|e| TestCaseError::fail(e.to_string()))?;
        let verdicts = store
            .with(|tx| {
                seed_pools(tx)?;
                for (i, c) in cases.iter().enumerate() {
                    insert(tx, &format!("node_{i:03}"), c)?;
                }
                tx.sql_verdicts()
            })
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        for ((_, sql_bucket, sql_sched), case) in verdicts.iter().zip(&cases) {
            prop_assert_eq!(sql_bucket.as_str(), capacity_bucket(&case.facts()).as_str(), "{:?}", case);
            prop_assert_eq!(*sql_sched, is_schedulable(&case.facts()), "{:?}", case);
        }
    }
}
