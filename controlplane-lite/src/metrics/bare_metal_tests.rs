//! The bare-metal gauges against a store with BMCs, failed nodes and ramdisk boots.
#![allow(clippy::unwrap_used)]

use bc_protocol::ProvisionState;
use cpl_store::{BmcRecord, BootRecord, NodeRecord, StoreError, Tx};

use crate::gateway::registry::Registry as Sessions;
use crate::metrics::Metrics;

const NOW: i64 = 1_800_000_000_000;

fn force(c: &Tx<'_>, id: &str, f: impl FnOnce(&mut NodeRecord)) -> Result<(), StoreError> {
    let before = c.node(id)?.ok_or_else(|| StoreError::Task(id.to_owned()))?;
    let mut after = before.clone();
    f(&mut after);
    c.update_node(&before, &after, false, 1)?;
    Ok(())
}

fn bmc(node: &str, reachable: Option<bool>) -> BmcRecord {
    BmcRecord {
        node_id: node.to_owned(),
        address: "redfish+https://10.0.0.1".to_owned(),
        tls: "insecure".to_owned(),
        credentials: "sealed".to_owned(),
        candidate: None,
        cert_sha256: None,
        facts: None,
        identifiers: Vec::new(),
        macs: Vec::new(),
        verified_at: None,
        verify_command_id: None,
        verify_started_at: None,
        last_error: None,
        power_expected: None,
        power_expected_at: None,
        reachable,
        created_at: 1,
        inspect: false,
        deployed: false,
        deployment: None,
        rescue: None,
    }
}

fn boot(node: &str, purpose: ProvisionState, started: i64) -> BootRecord {
    BootRecord {
        node_id: node.to_owned(),
        token_id: format!("boot_{node}"),
        secret_sha256: "00".repeat(32),
        sealed: "sealed".to_owned(),
        purpose,
        created_at: started,
        expires_at: started + 3_600_000,
        used_at: None,
        phase_started_at: started,
        command_id: None,
        ended_at: None,
        diag_command_id: None,
        steps_at: None,
        work_command_id: None,
        work_step: None,
        override_command_id: None,
        mismatches: 0,
    }
}

fn has(text: &str, line: &str) -> bool {
    text.lines().any(|l| l == line)
}

#[tokio::test]
async fn bare_metal_gauges_come_from_the_store_at_scrape_time() {
    let store = cpl_store::testing::store().unwrap();
    store
        .write(|c| {
            for id in ["node_a", "node_b", "node_c", "node_d", "node_e"] {
                c.insert_node(&cpl_store::testing::new_node(id), 1)?;
            }
            c.put_bmc(&bmc("node_a", Some(true)))?;
            c.put_bmc(&bmc("node_b", Some(false)))?;
            c.put_bmc(&bmc("node_c", None))?;
            // node_a: commissioning for two minutes.
            force(c, "node_a", |n| {
                n.provision_state = ProvisionState::Commissioning
            })?;
            c.put_boot(&boot(
                "node_a",
                ProvisionState::Commissioning,
                NOW - 120_000,
            ))?;
            // node_b: failed in inspecting, and its machine never joined with the boot token.
            force(c, "node_b", |n| {
                n.provision_state = ProvisionState::Failed;
                n.failed_from = Some(ProvisionState::Inspecting);
            })?;
            c.put_boot(&BootRecord {
                ended_at: Some(NOW - 1),
                ..boot("node_b", ProvisionState::Inspecting, NOW - 600_000)
            })?;
            // node_c: failed in deploying after its ramdisk joined: not a boot failure.
            force(c, "node_c", |n| {
                n.provision_state = ProvisionState::Failed;
                n.failed_from = Some(ProvisionState::Deploying);
            })?;
            c.put_boot(&BootRecord {
                used_at: Some(NOW - 500_000),
                ended_at: Some(NOW - 1),
                ..boot("node_c", ProvisionState::Deploying, NOW - 600_000)
            })?;
            // node_d: a rescue whose SSH server is up lasts as long as the operator needs it.
            force(c, "node_d", |n| n.provision_state = ProvisionState::Rescue)?;
            c.put_boot(&BootRecord {
                used_at: Some(NOW - 86_000_000),
                work_step: Some(cpl_store::WorkStep::RescueReady),
                ..boot("node_d", ProvisionState::Rescue, NOW - 86_400_000)
            })?;
            // node_e: deploying for an hour.
            force(c, "node_e", |n| {
                n.provision_state = ProvisionState::Deploying
            })?;
            c.put_boot(&boot("node_e", ProvisionState::Deploying, NOW - 3_600_000))?;
            Ok::<_, StoreError>(())
        })
        .await
        .unwrap();
    let counts = store
        .read(|r| r.bare_metal_counts(cpl_store::WorkStep::RescueReady.as_str()))
        .await
        .unwrap();
    let m = Metrics::new();
    m.inner.bare_metal.set(&counts, NOW);
    let text = m.encode().unwrap();
    for want in [
        "bcctl_bmcs{reachable=\"true\"} 1",
        "bcctl_bmcs{reachable=\"false\"} 1",
        "bcctl_bmcs{reachable=\"unknown\"} 1",
        "bcctl_nodes_failed{failed_from=\"inspecting\"} 1",
        "bcctl_nodes_failed{failed_from=\"deploying\"} 1",
        "bcctl_nodes_boot_failed 1",
        "bcctl_workflow_oldest_seconds{provision_state=\"commissioning\"} 120",
        "bcctl_workflow_oldest_seconds{provision_state=\"deploying\"} 3600",
        "bcctl_workflow_oldest_seconds{provision_state=\"rescue\"} 0",
        "bcctl_workflow_oldest_seconds{provision_state=\"inspecting\"} 0",
        "bcctl_workflow_oldest_seconds{provision_state=\"releasing\"} 0",
    ] {
        assert!(has(&text, want), "no line {want:?} in\n{text}");
    }

    // node_b is recovered: it leaves `failed`, and its series goes rather than staying at 1.
    store
        .write(|c| {
            force(c, "node_b", |n| {
                n.provision_state = ProvisionState::Inspecting;
                n.failed_from = None;
            })
        })
        .await
        .unwrap();
    let text = m.scrape(&store, &Sessions::default()).await.unwrap();
    assert!(
        !text.contains("failed_from=\"inspecting\""),
        "a state without failed nodes keeps no series:\n{text}"
    );
    assert!(has(&text, "bcctl_nodes_boot_failed 0"), "{text}");
    assert!(
        has(&text, "bcctl_nodes_failed{failed_from=\"deploying\"} 1"),
        "{text}"
    );
}
