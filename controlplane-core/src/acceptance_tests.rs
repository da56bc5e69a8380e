//! Acceptance per pool: the defaults by kind, what keeps a node `adopting`, and the deadline.

use bc_protocol::{Condition, PoolAgent};
use cpl_store::{Acceptance, HardwareProfile, NodeRecord};

use super::*;
use crate::ops::pools::{NewPool, create};
use crate::reports::{InventoryReport, record_inventory};
use crate::test_utils::node;

fn pool(
    tx: &Tx<'_>,
    kind: PoolKind,
    acceptance: Acceptance,
    gpus: Option<u32>,
) -> Result<Pool, OpError> {
    create(
        tx,
        &NewPool {
            name: "p".into(),
            kind,
            agent: PoolAgent::Bcd,
            site_id: None,
            owner_tenant_id: None,
            hardware_profile: HardwareProfile {
                expected_gpu_count: gpus,
                ..Default::default()
            },
            acceptance,
        },
    )
}

/// The node's first inventory with `gpus` GPUs and a key trusted or not, as the gateway records
/// it (session epoch 0).
fn report(tx: &Tx<'_>, id: &str, trusted: bool, gpus: usize) -> Result<NodeRecord, OpError> {
    let doc = serde_json::json!({
        "schemaVersion": 1,
        "gpus": (0..gpus).map(|i| serde_json::json!({"uuid": format!("GPU-{i}"), "pciBusId": format!("0000:{:02x}:00.0", i + 1), "source": "nvml"})).collect::<Vec<_>>()
    })
    .to_string();
    let digests: Vec<String> = if trusted {
        vec!["d1".into(), "d2".into()]
    } else {
        vec!["d1".into()]
    };
    let r = InventoryReport {
        hardware_key: &format!("key-{id}"),
        trusted,
        digests: &digests,
        document: doc.as_bytes(),
        sha256: &format!("sha-{id}-{trusted}-{gpus}"),
    };
    record_inventory(tx, id, 0, &r)?;
    tx.node(id)?.ok_or_else(|| OpError::node_not_found(id))
}

fn accepted(n: &NodeRecord) -> Option<&Condition> {
    n.conditions.iter().find(|c| c.type_ == ACCEPTED)
}

#[test]
fn metal_pools_require_a_trusted_key_by_default_and_a_pool_may_say_otherwise() -> Result<(), OpError>
{
    let store = cpl_store::testing::store()?;
    store.write_blocking(|tx| -> Result<(), OpError> {
        let metal = pool(tx, PoolKind::MetalHost, Acceptance::default(), None)?;
        let vps = pool(tx, PoolKind::VpsHost, Acceptance::default(), None)?;
        let dev = pool(
            tx,
            PoolKind::MetalHost,
            Acceptance {
                require_trusted_key: Some(false),
                ..Default::default()
            },
            None,
        )?;
        assert_eq!(
            rules(Some(&metal)),
            Rules {
                require_trusted_key: true,
                deadline: DEFAULT_DEADLINE
            }
        );
        assert!(!rules(Some(&vps)).require_trusted_key);
        assert!(!rules(None).require_trusted_key);
        for (id, p) in [
            ("node_m", &metal),
            ("node_v", &vps),
            ("node_d", &dev),
            ("node_t", &metal),
        ] {
            node(tx, id, Some(&p.id))?;
        }
        // Untrusted on a metal pool: still adopting, Accepted false naming the reason.
        let m = report(tx, "node_m", false, 0)?;
        assert_eq!(m.provision_state, ProvisionState::Adopting);
        let c = accepted(&m).ok_or(OpError::Internal("no Accepted".into()))?;
        assert_eq!(
            (c.status, c.reason.as_str()),
            (ConditionStatus::False, "UntrustedKey")
        );
        assert!(
            c.message.contains("requires a trusted hardware key")
                && c.message.contains("at least two"),
            "{}",
            c.message
        );
        // Trusted on the metal pool, untrusted where the pool allows it: adopted.
        for (id, trusted) in [("node_t", true), ("node_v", false), ("node_d", false)] {
            let n = report(tx, id, trusted, 0)?;
            assert_eq!(n.provision_state, ProvisionState::Adopted, "{id}");
            let c = accepted(&n).ok_or(OpError::Internal("no Accepted".into()))?;
            assert_eq!(
                (c.status, c.reason.as_str()),
                (ConditionStatus::True, "AcceptancePassed")
            );
        }
        // The machine gets its second identifier back: accepted on its next report.
        let m = report(tx, "node_m", true, 0)?;
        assert_eq!(m.provision_state, ProvisionState::Adopted);
        Ok(())
    })
}

#[test]
fn a_hardware_profile_mismatch_keeps_the_node_adopting() -> Result<(), OpError> {
    let store = cpl_store::testing::store()?;
    store.write_blocking(|tx| -> Result<(), OpError> {
        let p = pool(tx, PoolKind::VpsHost, Acceptance::default(), Some(8))?;
        node(tx, "node_a", Some(&p.id))?;
        let n = report(tx, "node_a", true, 4)?;
        assert_eq!(n.provision_state, ProvisionState::Adopting);
        let c = accepted(&n).ok_or(OpError::Internal("no Accepted".into()))?;
        assert_eq!(c.reason, "ProfileMismatch");
        assert!(c.message.contains("GpuCountMismatch"), "{}", c.message);
        let n = report(tx, "node_a", true, 8)?;
        assert_eq!(n.provision_state, ProvisionState::Adopted);
        Ok(())
    })
}

#[test]
fn a_node_that_never_passes_fails_at_the_deadline() -> Result<(), OpError> {
    let store = cpl_store::testing::store()?;
    store.write_blocking(|tx| -> Result<(), OpError> {
        let p = pool(
            tx,
            PoolKind::MetalHost,
            Acceptance {
                deadline_seconds: Some(60),
                ..Default::default()
            },
            None,
        )?;
        node(tx, "node_a", Some(&p.id))?;
        node(tx, "node_b", Some(&p.id))?;
        let a = report(tx, "node_a", false, 0)?;
        let t0 = a.created_at;
        assert!(sweep(tx, t0 + 59_000)?.is_empty(), "within the deadline");
        assert_eq!(
            sweep(tx, t0 + 61_000)?,
            vec!["node_a".to_owned(), "node_b".to_owned()]
        );
        let a = tx
            .node("node_a")?
            .ok_or(OpError::node_not_found("node_a"))?;
        assert_eq!(a.provision_state, ProvisionState::Failed);
        assert_eq!(a.failed_from, Some(ProvisionState::Adopting));
        assert!(a.maintenance);
        let c = accepted(&a).ok_or(OpError::Internal("no Accepted".into()))?;
        assert_eq!(
            (c.status, c.reason.as_str()),
            (ConditionStatus::False, "DeadlineExceeded")
        );
        assert!(
            c.message.contains("within 1m") && c.message.contains("trusted hardware key"),
            "{}",
            c.message
        );
        // node_b never reported inventory: it failed for that.
        let b = tx
            .node("node_b")?
            .ok_or(OpError::node_not_found("node_b"))?;
        assert!(accepted(&b).is_some_and(|c| c.message.contains("no inventory")));
        // Recovered to adopting, the deadline counts again from the recovery.
        let a = crate::ops::nodes::recover(tx, "node_a", a.version, "operator:t")?;
        assert_eq!(a.provision_state, ProvisionState::Adopting);
        assert!(sweep(tx, cpl_store::now_ms() + 1_000)?.is_empty());
        Ok(())
    })
}

#[test]
fn a_node_moved_to_a_pool_it_passes_is_accepted_at_once() -> Result<(), OpError> {
    let store = cpl_store::testing::store()?;
    store.write_blocking(|tx| -> Result<(), OpError> {
        let metal = pool(tx, PoolKind::MetalHost, Acceptance::default(), None)?;
        let lenient = pool(
            tx,
            PoolKind::MetalHost,
            Acceptance {
                require_trusted_key: Some(false),
                ..Default::default()
            },
            None,
        )?;
        node(tx, "node_a", Some(&metal.id))?;
        let a = report(tx, "node_a", false, 0)?;
        assert_eq!(a.provision_state, ProvisionState::Adopting);
        // The new pool's rules decide now, not at the next inventory report.
        let moved =
            crate::ops::membership::move_node(tx, "node_a", a.version, "operator:t", &lenient.id)?;
        assert_eq!(moved.provision_state, ProvisionState::Adopted);
        let c = accepted(&moved).ok_or(OpError::Internal("no Accepted".into()))?;
        assert_eq!(
            (c.status, c.reason.as_str()),
            (ConditionStatus::True, "AcceptancePassed")
        );
        Ok(())
    })
}
