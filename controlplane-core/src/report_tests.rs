//! Issue 19.2: nothing an agent reports moves the `version` operators' writes are checked
//! against, on every report path (session open and close, heartbeat revival, Inventory with
//! acceptance, SpecStatus, XID events and command results through Health), while operators'
//! verbs and the control plane's own controllers still do.

use bc_protocol::commands::xid::{XidClass, XidEvent, XidSource};
use bc_protocol::{Connectivity, ProvisionState};
use cpl_store::{CommandRecord, CommandState, NodeRecord};
use serde_json::json;

use crate::error::OpError;
use crate::ops::nodes as node_ops;
use crate::reports::{InventoryReport, SpecReport, record_inventory, record_spec_status};
use crate::sessions::{self, SessionOpen};
use crate::test_utils::{TestResult, node};

fn get(tx: &cpl_store::Reader<'_>, id: &str) -> Result<NodeRecord, OpError> {
    tx.node(id)?.ok_or_else(|| OpError::node_not_found(id))
}

fn diag(result: serde_json::Value) -> CommandRecord {
    CommandRecord {
        id: "cmd_1".into(),
        node_id: "node_r".into(),
        name: bc_protocol::CommandName::DiagNvml,
        args: json!({}),
        state: CommandState::Succeeded,
        progress: 100,
        result: Some(result),
        error_code: None,
        error_message: None,
        actor: "t".into(),
        created_at: 0,
        sent_at: None,
        started_at: None,
        finished_at: None,
        deadline_at: 1,
        subject_node_id: None,
    }
}

#[test]
fn no_report_path_moves_the_version_and_operators_still_win() -> TestResult {
    let store = cpl_store::testing::store()?;
    store.write_blocking(|tx| -> TestResult {
        node(tx, "node_r", None)?;
        let v = get(tx, "node_r")?.version;
        let open = SessionOpen {
            node_id: "node_r".into(),
            gateway_id: "gw".into(),
            boot_id: "b".into(),
            agent_version: "1".into(),
        };
        let epoch = sessions::open(tx, &open)?.ok_or("opened")?.epoch;
        let digests = vec!["d1".to_owned(), "d2".to_owned()];
        let report = |doc: &'static [u8], sha: &'static str| InventoryReport {
            hardware_key: "k",
            trusted: true,
            digests: &[],
            document: doc,
            sha256: sha,
        };
        let mut inv = report(br#"{"hostname":"r","gpus":[]}"#, "s1");
        inv.digests = &digests;
        // A new document, with acceptance (adopting -> adopted) and the trusted-key condition.
        assert_eq!(
            record_inventory(tx, "node_r", epoch, &inv)?,
            Some(ProvisionState::Adopted)
        );
        // SpecStatus with changing text, converged and not: what the flood of 19.2 sent.
        for i in 0..50u32 {
            let s = SpecReport {
                generation: 1,
                converged: i.is_multiple_of(2),
                reason: if i.is_multiple_of(2) {
                    ""
                } else {
                    "BindFailed"
                },
                message: &format!("attempt {i}"),
            };
            record_spec_status(tx, "node_r", epoch, &s)?;
        }
        // Health from the agent's diag result and XID report.
        let fail = diag(json!({"nvmlAvailable": true, "verdict": "fail", "action": "resetGpu"}));
        crate::health::apply_command_result(tx, &fail)?;
        let pass = diag(json!({"nvmlAvailable": true, "verdict": "pass"}));
        crate::health::apply_command_result(tx, &pass)?;
        // Liveness marks it unreachable (a controller: moves version), a heartbeat revives it (the
        // agent: does not), then Goodbye.
        let swept = get(tx, "node_r")?;
        let last = swept.last_seen.unwrap_or(0);
        sessions::sweep(tx, last + 10_000, 1_000, 60_000)?;
        let after_sweep = get(tx, "node_r")?;
        assert_eq!(after_sweep.connectivity, Connectivity::Unreachable);
        assert_eq!(
            after_sweep.version,
            v + 1,
            "Liveness is the control plane's own"
        );
        sessions::flush_heartbeats(tx, &[("node_r".into(), epoch, last + 11_000)])?;
        sessions::close_clean(tx, "node_r", epoch, "shutdown")?;
        let n = get(tx, "node_r")?;
        assert_eq!(n.connectivity, Connectivity::Disconnected);
        assert_eq!(n.provision_state, ProvisionState::Adopted);
        assert!(n.hardware_key_trusted);
        assert!(n.conditions.iter().any(|c| c.type_ == "SpecConverged"));
        assert_eq!(
            n.version,
            v + 1,
            "only the Liveness sweep moved the version; every report left it"
        );
        assert!(
            tx.events("node_r")?.len() > 5,
            "reports still record their events"
        );
        // The operator's read before all of that still writes.
        node_ops::cordon(tx, "node_r", after_sweep.version, "operator:o")?;
        Ok(())
    })
}

#[test]
fn xid_events_from_the_agent_leave_the_version() -> TestResult {
    let store = cpl_store::testing::store()?;
    store.write_blocking(|tx| -> TestResult {
        node(tx, "node_r", None)?;
        Ok(())
    })?;
    let v = store.read_blocking(|r| get(r, "node_r"))?.version;
    let rt = tokio::runtime::Builder::new_current_thread().build()?;
    for i in 0..5 {
        let ev = XidEvent {
            xid: 79,
            pci_bus_id: Some(format!("0000:0{i}:00.0")),
            uuid: None,
            class: XidClass::RebootRequired,
            action: XidClass::RebootRequired.action(),
            description: None,
            message: None,
            pid: None,
            source: XidSource::Kmsg,
            observed_at: chrono::DateTime::from_timestamp(0, 0).unwrap_or_default(),
            driver_message: false,
        };
        rt.block_on(crate::health::on_xid(&store, "node_r", &ev));
    }
    let n = store.read_blocking(|r| get(r, "node_r"))?;
    assert!(
        n.no_schedule_reasons.iter().any(|r| r == "XidCritical"),
        "{n:?}"
    );
    assert_eq!(n.version, v);
    Ok(())
}

/// Eight nodes report the same trusted hardware key at once, each in a node's write (as the
/// gateway records inventories: on PostgreSQL they run in parallel): exactly one holds it
/// trusted, the others are refused with `DuplicateKey`, and none of the writes fails.
#[test]
fn nodes_racing_for_one_trusted_key_leave_exactly_one_holder() -> TestResult {
    let store = cpl_store::testing::store()?;
    let ids: Vec<String> = (0..8).map(|i| format!("node_race_{i}")).collect();
    let epochs = store.write_blocking(|tx| -> Result<Vec<u64>, OpError> {
        let mut epochs = Vec::new();
        for id in &ids {
            node(tx, id, None)?;
            let open = SessionOpen {
                node_id: id.clone(),
                gateway_id: "gw".into(),
                boot_id: "b".into(),
                agent_version: "1".into(),
            };
            epochs.push(
                sessions::open(tx, &open)?
                    .ok_or(OpError::node_not_found(id))?
                    .epoch,
            );
        }
        Ok(epochs)
    })?;
    let start = std::sync::Arc::new(std::sync::Barrier::new(ids.len()));
    let writers: Vec<_> = ids
        .iter()
        .zip(epochs)
        .map(|(id, epoch)| {
            let (store, start, id) = (store.clone(), start.clone(), id.clone());
            std::thread::spawn(move || {
                let digests = vec![format!("{id}-board"), format!("{id}-nic")];
                let document = format!(r#"{{"hostname":"{id}","gpus":[]}}"#);
                start.wait();
                store.write_node_blocking(&id, |tx| {
                    let report = InventoryReport {
                        hardware_key: "the-same-key",
                        trusted: true,
                        digests: &digests,
                        document: document.as_bytes(),
                        sha256: &id,
                    };
                    record_inventory(tx, &id, epoch, &report)
                })
            })
        })
        .collect();
    for w in writers {
        let state = w.join().map_err(|_| "writer panicked")??;
        assert!(state.is_some(), "the node is there");
    }
    let nodes = store.read_blocking(|r| -> Result<Vec<NodeRecord>, OpError> {
        ids.iter().map(|id| get(r, id)).collect()
    })?;
    let holders: Vec<&str> = nodes
        .iter()
        .filter(|n| n.hardware_key_trusted)
        .map(|n| n.id.as_str())
        .collect();
    assert_eq!(holders.len(), 1, "trusted holders: {holders:?}");
    for n in nodes.iter().filter(|n| !n.hardware_key_trusted) {
        let c = n
            .conditions
            .iter()
            .find(|c| c.type_ == "HardwareKeyTrusted")
            .ok_or("no HardwareKeyTrusted condition")?;
        assert_eq!(c.reason, "DuplicateKey", "{}: {c:?}", n.id);
        assert!(c.message.contains(holders[0]), "{}", c.message);
    }
    Ok(())
}
