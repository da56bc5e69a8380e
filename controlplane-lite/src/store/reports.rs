//! What agents report over their session, stored: Inventory (with NodeLifecycle acceptance and
//! the hardware-key and profile conditions) and SpecStatus (`observedGeneration`,
//! `SpecConverged`). Both are applied by the session's writer task, in arrival order; a report
//! of an older session epoch changes nothing.

use bc_protocol::{Condition, ConditionStatus, ProvisionState};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::nodes;
use super::{StoreError, events, now_ms, to_json};

/// Stores an inventory report and runs NodeLifecycle acceptance: a node in `adopting` whose
/// inventory arrived becomes `adopted`. `document` is the agent's JSON bytes
/// (`bc_protocol::inventory::Inventory`, camelCase) and `sha256` their hex digest.
///
/// A report identical to the stored one (same digest, hardware key, trust and identifiers: what
/// every session open repeats) only moves `inventoryAt` and re-checks the pool's profile: a
/// restart storm of 10,000 nodes must not rewrite 10,000 documents (docs/benchmarks.md).
/// Returns the provision state after, `None` when the node is gone. Errors: SQLite, or the
/// document is not JSON (nothing is stored then).
#[allow(clippy::too_many_arguments)]
pub fn record_inventory(
    conn: &mut Connection,
    node_id: &str,
    epoch: u64,
    hardware_key: &str,
    trusted: bool,
    digests: &[String],
    document: &[u8],
    sha256: &str,
) -> Result<Option<ProvisionState>, StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let Some(node) = nodes::get(&tx, node_id)? else {
        return Ok(None);
    };
    if node.session_epoch != epoch {
        return Ok(Some(node.provision_state));
    }
    let key = (!hardware_key.is_empty()).then_some(hardware_key);
    let unchanged = node.inventory_sha256.as_deref() == Some(sha256)
        && node.hardware_key.as_deref() == key
        && node.identifier_digests == digests
        // A key refused as a duplicate (stored untrusted, reported trusted) is checked again.
        && node.hardware_key_trusted == trusted
        && node.provision_state != ProvisionState::Adopting;
    if unchanged {
        tx.execute(
            "UPDATE nodes SET inventory_at = ?2 WHERE id = ?1",
            params![node_id, now_ms()],
        )?;
        crate::model::conditions::refresh_profile_conditions(&tx, node_id)
            .map_err(super::op_err)?;
        tx.commit()?;
        return Ok(Some(node.provision_state));
    }
    let text = std::str::from_utf8(document).map_err(|e| StoreError::Json {
        column: "inventory",
        source: serde::de::Error::custom(e),
    })?;
    let document: serde_json::Value = super::from_json("inventory", text)?;
    let now = now_ms();
    let key = (!hardware_key.is_empty()).then_some(hardware_key);
    // A trusted key is unique across nodes: one already held by another node is refused, never
    // silently shared (spec "hardwareKeyTrusted").
    let holder: Option<String> = match key {
        Some(k) if trusted => tx
            .query_row(
                "SELECT id FROM nodes WHERE hardware_key = ?1 AND hardware_key_trusted = 1 AND id != ?2 LIMIT 1",
                params![k, node_id],
                |r| r.get(0),
            )
            .optional()?,
        _ => None,
    };
    let trusted_unique = trusted && holder.is_none();
    tx.execute(
        "UPDATE nodes SET inventory = ?2, inventory_at = ?3, hardware_key = ?4, \
         hardware_key_trusted = ?5, identifier_digests = ?6, hostname = COALESCE(?7, hostname), \
         inventory_sha256 = ?8, updated_at = ?3, version = version + 1 WHERE id = ?1",
        params![
            node_id,
            text,
            now,
            key,
            trusted_unique,
            to_json(&digests),
            document.get("hostname").and_then(|h| h.as_str()),
            sha256,
        ],
    )?;
    nodes::index_identifier_digests(&tx, node_id, digests)?;
    let (status, reason, message) = match (&holder, trusted) {
        (Some(other), _) => (
            ConditionStatus::False,
            "DuplicateKey",
            format!("node {other} already holds this trusted hardware key; uniqueness refused"),
        ),
        (None, true) => (
            ConditionStatus::True,
            "Trusted",
            format!("{} independent identifiers", digests.len()),
        ),
        (None, false) => (
            ConditionStatus::False,
            "TooFewIdentifiers",
            format!(
                "{} identifier(s) survived; at least two are needed",
                digests.len()
            ),
        ),
    };
    if let Some(other) = &holder
        && node.conditions.iter().all(|c| c.reason != "DuplicateKey")
    {
        events::record(
            &tx,
            node_id,
            now,
            "hardwareKey",
            None,
            Some("duplicate"),
            "Inventory",
            &message,
        )?;
        tracing::warn!(node_id, holder = %other, "trusted hardware key already held by another node");
    }
    crate::model::conditions::set_condition(
        &tx,
        node_id,
        &crate::model::conditions::ConditionUpdate {
            type_: "HardwareKeyTrusted".to_owned(),
            status,
            reason: reason.to_owned(),
            message,
            owner: "Inventory".to_owned(),
        },
    )
    .map_err(super::op_err)?;
    // Inventory conditions (GpuCountMismatch, ... against the pool's hardware profile) and their
    // noScheduleReasons, in this same transaction.
    crate::model::conditions::refresh_profile_conditions(&tx, node_id).map_err(super::op_err)?;
    let mut state = node.provision_state;
    if state == ProvisionState::Adopting {
        // NodeLifecycle acceptance, through the one provisionStateTable.
        let after = crate::model::ops::nodes::transition(
            &tx,
            node_id,
            None,
            "NodeLifecycle",
            ProvisionState::Adopted,
            "acceptance passed: inventory received",
        )
        .map_err(super::op_err)?;
        state = after.provision_state;
    }
    tx.commit()?;
    Ok(Some(state))
}

/// Records a SpecStatus: on `converged`, `observedGeneration` moves up to `generation` (never past
/// the node's `generation`, never down); the `SpecConverged` condition says how the apply went.
pub fn record_spec_status(
    conn: &mut Connection,
    node_id: &str,
    epoch: u64,
    generation: u64,
    converged: bool,
    reason: &str,
    message: &str,
) -> Result<Option<u64>, StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let Some(node) = nodes::get(&tx, node_id)? else {
        return Ok(None);
    };
    if node.session_epoch != epoch || generation > node.generation {
        return Ok(Some(node.observed_generation));
    }
    let now = now_ms();
    let mut observed = node.observed_generation;
    if converged && generation > observed {
        observed = generation;
        events::record(
            &tx,
            node_id,
            now,
            "observedGeneration",
            Some(&node.observed_generation.to_string()),
            Some(&observed.to_string()),
            "gateway",
            "",
        )?;
    }
    let status = if converged {
        ConditionStatus::True
    } else {
        ConditionStatus::False
    };
    let mut conditions = node.conditions.clone();
    let reason = if converged {
        "Converged"
    } else if reason.is_empty() {
        "ApplyFailed"
    } else {
        reason
    };
    let existing = conditions.iter().find(|c| c.type_ == "SpecConverged");
    if observed == node.observed_generation
        && existing
            .is_some_and(|c| c.status == status && c.reason == reason && c.message == message)
    {
        // The same report again (every session open repeats it): nothing to write.
        return Ok(Some(observed));
    }
    match conditions.iter_mut().find(|c| c.type_ == "SpecConverged") {
        Some(c) => {
            if c.status != status {
                c.last_transition_time = crate::model::conditions::rfc3339_ms(now);
            }
            c.status = status;
            c.reason = reason.to_owned();
            c.message = message.to_owned();
        }
        None => conditions.push(Condition {
            type_: "SpecConverged".to_owned(),
            status,
            reason: reason.to_owned(),
            message: message.to_owned(),
            last_transition_time: crate::model::conditions::rfc3339_ms(now),
            owner: "NodeLifecycle".to_owned(),
        }),
    }
    tx.execute(
        "UPDATE nodes SET observed_generation = ?2, conditions = ?3, updated_at = ?4, \
         version = version + 1 WHERE id = ?1",
        params![
            node_id,
            i64::try_from(observed).unwrap_or(i64::MAX),
            to_json(&conditions),
            now
        ],
    )?;
    tx.commit()?;
    Ok(Some(observed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;
    use crate::store::nodes::{NewNode, insert};

    fn node(id: &str) -> NewNode {
        NewNode {
            id: id.into(),
            site_id: None,
            pool_id: None,
            owner_tenant_id: None,
            role: bc_protocol::NodeRole::Host,
            trust: bc_protocol::Trust::Platform,
            adapter: bc_protocol::Adapter::BcdV1,
            drivers: Default::default(),
            hostname: None,
            hardware_key: None,
            hardware_key_trusted: false,
            identifier_digests: vec![],
        }
    }
    #[test]
    fn a_trusted_key_is_never_shared_and_acceptance_adopts() -> Result<(), StoreError> {
        let store = Store::open_in_memory()?;
        store.with(|c| {
            insert(c, &node("node_a"), 0)?;
            insert(c, &node("node_b"), 0)?;
            let digests = vec!["d1".to_owned(), "d2".to_owned()];
            let doc = serde_json::to_vec(&serde_json::json!({"hostname": "a"}))
                .map_err(|e| StoreError::Task(e.to_string()))?;
            assert_eq!(
                record_inventory(c, "node_a", 0, "key1", true, &digests, &doc, "s1")?,
                Some(ProvisionState::Adopted)
            );
            let a = nodes::get(c, "node_a")?.ok_or(StoreError::Task("a".into()))?;
            assert!(a.hardware_key_trusted);
            let cond = a
                .conditions
                .iter()
                .find(|c| c.type_ == "HardwareKeyTrusted")
                .cloned();
            assert_eq!(cond.map(|c| c.status), Some(ConditionStatus::True));

            record_inventory(c, "node_b", 0, "key1", true, &digests, &doc, "s1")?;
            let b = nodes::get(c, "node_b")?.ok_or(StoreError::Task("b".into()))?;
            assert!(
                !b.hardware_key_trusted,
                "a second node must not share a trusted key"
            );
            let cond = b
                .conditions
                .iter()
                .find(|c| c.type_ == "HardwareKeyTrusted")
                .cloned();
            assert_eq!(
                cond.as_ref().map(|c| c.reason.as_str()),
                Some("DuplicateKey")
            );
            let evs = events::list(c, "node_b")?;
            assert!(
                evs.iter()
                    .any(|e| e.kind == "hardwareKey" && e.to.as_deref() == Some("duplicate"))
            );
            // A stale epoch changes nothing.
            assert_eq!(
                record_inventory(c, "node_b", 7, "key2", true, &digests, &doc, "s2")?,
                Some(ProvisionState::Adopted)
            );
            let b2 = nodes::get(c, "node_b")?.ok_or(StoreError::Task("b".into()))?;
            assert_eq!(b2.hardware_key.as_deref(), Some("key1"));
            Ok(())
        })
    }

    #[test]
    fn an_identical_report_is_not_stored_again_but_a_changed_one_is() -> Result<(), StoreError> {
        let store = Store::open_in_memory()?;
        store.with(|c| {
            insert(c, &node("node_a"), 0)?;
            let digests = vec!["d1".to_owned(), "d2".to_owned()];
            let doc = br#"{"hostname":"a","gpus":[]}"#;
            record_inventory(c, "node_a", 0, "k", true, &digests, doc, "sha-1")?;
            let first = nodes::get(c, "node_a")?.ok_or(StoreError::Task("a".into()))?;
            assert_eq!(first.inventory_sha256.as_deref(), Some("sha-1"));
            assert_eq!(
                first.inventory_json.as_deref(),
                Some(r#"{"hostname":"a","gpus":[]}"#)
            );

            // Same digest: the document and the version stay; inventoryAt moves.
            std::thread::sleep(std::time::Duration::from_millis(2));
            record_inventory(c, "node_a", 0, "k", true, &digests, b"ignored", "sha-1")?;
            let same = nodes::get(c, "node_a")?.ok_or(StoreError::Task("a".into()))?;
            assert_eq!(same.version, first.version);
            assert_eq!(same.inventory_json, first.inventory_json);
            assert!(same.inventory_at > first.inventory_at);

            // A new digest is parsed and stored; junk is refused and changes nothing.
            let doc2 = br#"{"hostname":"b"}"#;
            record_inventory(c, "node_a", 0, "k", true, &digests, doc2, "sha-2")?;
            let changed = nodes::get(c, "node_a")?.ok_or(StoreError::Task("a".into()))?;
            assert_eq!(changed.hostname.as_deref(), Some("b"));
            assert!(changed.version > same.version);
            let junk = record_inventory(c, "node_a", 0, "k", true, &digests, b"{not json", "sha-3");
            assert!(matches!(
                junk,
                Err(StoreError::Json {
                    column: "inventory",
                    ..
                })
            ));
            let after = nodes::get(c, "node_a")?.ok_or(StoreError::Task("a".into()))?;
            assert_eq!(after.inventory_sha256.as_deref(), Some("sha-2"));
            Ok(())
        })
    }

    #[test]
    fn machines_are_found_by_two_shared_identifiers_through_the_index() -> Result<(), StoreError> {
        let store = Store::open_in_memory()?;
        store.with(|c| {
            let mut a = node("node_a");
            a.identifier_digests = vec!["x".into(), "y".into(), "z".into()];
            insert(c, &a, 0)?;
            let mut b = node("node_b");
            b.identifier_digests = vec!["y".into(), "q".into()];
            insert(c, &b, 1)?;
            let find = |c: &Connection, d: &[&str]| -> Result<Vec<String>, StoreError> {
                let d: Vec<String> = d.iter().map(|s| (*s).to_owned()).collect();
                Ok(nodes::sharing_identifiers(c, &d, 2)?
                    .into_iter()
                    .map(|(id, _)| id)
                    .collect())
            };
            assert_eq!(find(c, &["x", "z", "w"])?, vec!["node_a"]);
            assert!(
                find(c, &["y", "w"])?.is_empty(),
                "one shared identifier is not enough"
            );
            assert!(find(c, &["y", "y"])?.is_empty(), "a digest counts once");
            assert_eq!(find(c, &["y", "q", "x"])?, vec!["node_a", "node_b"]);
            // A new report replaces the node's identifiers in the index.
            let doc = br#"{}"#;
            record_inventory(
                c,
                "node_a",
                0,
                "",
                false,
                &["m".into(), "n".into()],
                doc,
                "s",
            )?;
            assert!(find(c, &["x", "z"])?.is_empty());
            assert_eq!(find(c, &["m", "n"])?, vec!["node_a"]);
            // Deleting the node drops its rows (ON DELETE CASCADE).
            c.execute("DELETE FROM nodes WHERE id = 'node_a'", [])?;
            assert!(find(c, &["m", "n"])?.is_empty());
            Ok(())
        })
    }
}
