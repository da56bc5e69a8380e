//! What agents report over their session, through the one edit path: Inventory (with
//! NodeLifecycle acceptance and the hardware-key and profile conditions) and SpecStatus
//! (`observedGeneration`, `SpecConverged`). Both are applied by the session's writer task, in
//! arrival order; a report of an older session epoch changes nothing.

use bc_protocol::{ConditionStatus, ProvisionState};
use cpl_store::{StoreError, Tx};

use crate::conditions::{ConditionUpdate, apply, refresh_profile_conditions};
use crate::edit::Edit;
use crate::error::OpError;
use crate::identity;

/// An inventory report as the agent sent it.
#[derive(Debug, Clone, Copy)]
pub struct InventoryReport<'a> {
    /// The agent's hardware key (hex SHA-256), empty when it has none.
    pub hardware_key: &'a str,
    /// Whether the agent found at least two independent identifiers.
    pub trusted: bool,
    /// Hex SHA-256 of each identifier.
    pub digests: &'a [String],
    /// The JSON bytes (`bc_protocol::inventory::Inventory`, camelCase).
    pub document: &'a [u8],
    /// Hex SHA-256 of `document`.
    pub sha256: &'a str,
}

/// Stores an inventory report and runs NodeLifecycle acceptance: a node in `adopting` whose
/// inventory arrived becomes `adopted`.
///
/// A report identical to the stored one (same digest, hardware key, trust and identifiers: what
/// every session open repeats) only moves `inventoryAt` and re-checks the pool's profile: a
/// restart storm of 10,000 nodes must not rewrite 10,000 documents (docs/benchmarks.md).
/// Returns the provision state after, `None` when the node is gone. Errors: the store, or the
/// document is not JSON (`StoreError::Json`, nothing is stored then).
pub fn record_inventory(
    tx: &Tx<'_>,
    node_id: &str,
    epoch: u64,
    report: &InventoryReport<'_>,
) -> Result<Option<ProvisionState>, OpError> {
    let mut edit = match Edit::report(tx, node_id, "Inventory") {
        Ok(e) => e,
        Err(OpError::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    let node = &edit.node;
    if node.session_epoch != epoch {
        return Ok(Some(node.provision_state));
    }
    let key = (!report.hardware_key.is_empty()).then(|| report.hardware_key.to_owned());
    // Recomputed, never the agent's claim alone (crate::identity).
    let trusted = identity::trusted(report.trusted, report.hardware_key, report.digests);
    let unchanged = node.inventory_sha256.as_deref() == Some(report.sha256)
        && node.hardware_key == key
        && node.identifier_digests == report.digests
        // A key refused as a duplicate (stored untrusted, reported trusted) is checked again.
        && node.hardware_key_trusted == trusted
        && node.provision_state != ProvisionState::Adopting;
    edit.node.inventory_at = Some(edit.now());
    if !unchanged {
        store_document(tx, &mut edit, key, trusted, report)?;
    }
    // PcieLinkDegraded from the document's topology (issue 20.3), before the profile decides
    // whether it is NoSchedule.
    crate::pcie::refresh(&mut edit, !unchanged);
    // BmcAddressMismatch: the BMC the host sees in band against its enrollment (issue 20.4).
    crate::bmc_address::refresh(tx, &mut edit, !unchanged)?;
    // Inventory conditions (GpuCountMismatch, ... against the pool's hardware profile) and their
    // noScheduleReasons, in this same save.
    refresh_profile_conditions(tx, &mut edit)?;
    // A bare-metal machine's ramdisk: inspection ends, commissioning decides (issue 15).
    crate::bare_metal::table::on_report(tx, &mut edit)?;
    // NodeLifecycle acceptance (per pool: profile, trusted key), through the one
    // provisionStateTable.
    crate::acceptance::evaluate(tx, &mut edit)?;
    Ok(Some(edit.save(tx)?.provision_state))
}

/// A new document: stored with its key, trust (`trusted`, as the control plane recomputed it)
/// and identifiers, and the `HardwareKeyTrusted` condition. A trusted key is unique across nodes:
/// one already held by another node is refused, never silently shared (spec
/// "hardwareKeyTrusted"; the store's unique index backs this up).
fn store_document(
    tx: &Tx<'_>,
    edit: &mut Edit,
    key: Option<String>,
    trusted: bool,
    report: &InventoryReport<'_>,
) -> Result<(), OpError> {
    let json_error = |source| StoreError::Json {
        column: "inventory",
        source,
    };
    let text = std::str::from_utf8(report.document)
        .map_err(|e| json_error(serde::de::Error::custom(e)))?;
    let document: serde_json::Value = serde_json::from_str(text).map_err(json_error)?;
    let holder = match &key {
        Some(k) if trusted => tx.trusted_key_holder(k, &edit.node.id)?,
        _ => None,
    };
    let n = &mut edit.node;
    n.inventory_json = Some(text.to_owned());
    n.inventory_sha256 = Some(report.sha256.to_owned());
    n.hardware_key = key;
    n.hardware_key_trusted = trusted && holder.is_none();
    n.identifier_digests = report.digests.to_vec();
    if let Some(h) = document.get("hostname").and_then(|h| h.as_str()) {
        let mut h = h.to_owned();
        bc_protocol::limits::bound(bc_protocol::limits::Field::Hostname, &mut h);
        n.hostname = Some(h);
    }
    edit.bump();
    let count = identity::distinct_digests(report.digests).len();
    let (status, reason, message) = match (&holder, trusted) {
        (Some(other), _) => (
            ConditionStatus::False,
            "DuplicateKey",
            format!("node {other} already holds this trusted hardware key; uniqueness refused"),
        ),
        (None, true) => (
            ConditionStatus::True,
            "Trusted",
            format!("{count} independent identifiers"),
        ),
        (None, false) if report.trusted || count < identity::MIN_TRUSTED_IDENTIFIERS => (
            ConditionStatus::False,
            "TooFewIdentifiers",
            format!("{count} identifier(s) survived; at least two are needed"),
        ),
        (None, false) => (
            ConditionStatus::False,
            "TooFewIdentifiers",
            format!("the agent found fewer than two independent identifiers ({count} digests)"),
        ),
    };
    if let Some(other) = &holder
        && edit
            .node
            .conditions
            .iter()
            .all(|c| c.reason != "DuplicateKey")
    {
        edit.event("hardwareKey", None, Some("duplicate".to_owned()), &message);
        tracing::warn!(holder = %other, "trusted hardware key already held by another node");
    }
    apply(
        edit,
        &ConditionUpdate {
            type_: "HardwareKeyTrusted".to_owned(),
            status,
            reason: reason.to_owned(),
            message,
            owner: "Inventory".to_owned(),
            gpus: Vec::new(),
        },
    );
    Ok(())
}

/// A SpecStatus as the agent sent it.
#[derive(Debug, Clone, Copy)]
pub struct SpecReport<'a> {
    pub generation: u64,
    pub converged: bool,
    /// Why an apply failed (CamelCase); empty means `ApplyFailed`.
    pub reason: &'a str,
    pub message: &'a str,
}

/// Records a SpecStatus: on `converged`, `observedGeneration` moves up to `generation` (never past
/// the node's `generation`, never down); the `SpecConverged` condition says how the apply went.
/// The same report again (every session open repeats it) writes nothing. Returns the
/// observedGeneration after, `None` when the node is gone.
pub fn record_spec_status(
    tx: &Tx<'_>,
    node_id: &str,
    epoch: u64,
    report: &SpecReport<'_>,
) -> Result<Option<u64>, OpError> {
    let mut edit = match Edit::report(tx, node_id, "gateway") {
        Ok(e) => e,
        Err(OpError::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    let node = &edit.node;
    if node.session_epoch != epoch || report.generation > node.generation {
        return Ok(Some(node.observed_generation));
    }
    let before = node.observed_generation;
    if report.converged && report.generation > before {
        edit.node.observed_generation = report.generation;
        edit.event(
            "observedGeneration",
            Some(before.to_string()),
            Some(report.generation.to_string()),
            "",
        );
    }
    let (status, reason) = match (report.converged, report.reason) {
        (true, _) => (ConditionStatus::True, "Converged"),
        (false, "") => (ConditionStatus::False, "ApplyFailed"),
        (false, r) => (ConditionStatus::False, r),
    };
    apply(
        &mut edit,
        &ConditionUpdate {
            type_: "SpecConverged".to_owned(),
            status,
            reason: reason.to_owned(),
            message: report.message.to_owned(),
            owner: "NodeLifecycle".to_owned(),
            gpus: Vec::new(),
        },
    );
    Ok(Some(edit.save(tx)?.observed_generation))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cpl_store::NewNode;

    #[allow(clippy::too_many_arguments)]
    fn rec(
        tx: &Tx<'_>,
        id: &str,
        epoch: u64,
        hardware_key: &str,
        trusted: bool,
        digests: &[String],
        document: &[u8],
        sha256: &str,
    ) -> Result<Option<ProvisionState>, OpError> {
        let report = InventoryReport {
            hardware_key,
            trusted,
            digests,
            document,
            sha256,
        };
        record_inventory(tx, id, epoch, &report)
    }

    fn node(id: &str) -> NewNode {
        cpl_store::testing::new_node(id)
    }
    #[test]
    fn a_trusted_key_is_never_shared_and_acceptance_adopts() -> Result<(), OpError> {
        let store = cpl_store::testing::store()?;
        store.write_blocking(|c| -> Result<(), OpError> {
            c.insert_node(&node("node_a"), 0)?;
            c.insert_node(&node("node_b"), 0)?;
            let digests = vec!["d1".to_owned(), "d2".to_owned()];
            let doc = serde_json::to_vec(&serde_json::json!({"hostname": "a"}))
                .map_err(|e| OpError::Internal(e.to_string()))?;
            assert_eq!(
                rec(c, "node_a", 0, "key1", true, &digests, &doc, "s1")?,
                Some(ProvisionState::Adopted)
            );
            let a = c.node("node_a")?.ok_or(OpError::Internal("a".into()))?;
            assert!(a.hardware_key_trusted);
            let cond = a
                .conditions
                .iter()
                .find(|c| c.type_ == "HardwareKeyTrusted")
                .cloned();
            assert_eq!(cond.map(|c| c.status), Some(ConditionStatus::True));

            rec(c, "node_b", 0, "key1", true, &digests, &doc, "s1")?;
            let b = c.node("node_b")?.ok_or(OpError::Internal("b".into()))?;
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
            let evs = c.events("node_b")?;
            assert!(
                evs.iter()
                    .any(|e| e.kind == "hardwareKey" && e.to.as_deref() == Some("duplicate"))
            );
            // A stale epoch changes nothing.
            assert_eq!(
                rec(c, "node_b", 7, "key2", true, &digests, &doc, "s2")?,
                Some(ProvisionState::Adopted)
            );
            let b2 = c.node("node_b")?.ok_or(OpError::Internal("b".into()))?;
            assert_eq!(b2.hardware_key.as_deref(), Some("key1"));
            Ok(())
        })
    }

    #[test]
    fn an_identical_report_is_not_stored_again_but_a_changed_one_is() -> Result<(), OpError> {
        let store = cpl_store::testing::store()?;
        store.write_blocking(|c| -> Result<(), OpError> {
            c.insert_node(&node("node_a"), 0)?;
            let digests = vec!["d1".to_owned(), "d2".to_owned()];
            let doc = br#"{"hostname":"a","gpus":[]}"#;
            rec(c, "node_a", 0, "k", true, &digests, doc, "sha-1")?;
            let first = c.node("node_a")?.ok_or(OpError::Internal("a".into()))?;
            assert_eq!(first.inventory_sha256.as_deref(), Some("sha-1"));
            assert_eq!(
                first.inventory_json.as_deref(),
                Some(r#"{"hostname":"a","gpus":[]}"#)
            );

            // Same digest: the document and the version stay; inventoryAt moves.
            std::thread::sleep(std::time::Duration::from_millis(2));
            rec(c, "node_a", 0, "k", true, &digests, b"ignored", "sha-1")?;
            let same = c.node("node_a")?.ok_or(OpError::Internal("a".into()))?;
            assert_eq!(same.version, first.version);
            assert_eq!(same.inventory_json, first.inventory_json);
            assert!(same.inventory_at > first.inventory_at);

            // A new digest is parsed and stored; junk is refused and changes nothing.
            let doc2 = br#"{"hostname":"b"}"#;
            rec(c, "node_a", 0, "k", true, &digests, doc2, "sha-2")?;
            let changed = c.node("node_a")?.ok_or(OpError::Internal("a".into()))?;
            assert_eq!(changed.hostname.as_deref(), Some("b"));
            // An agent's report never moves the version operators' writes are checked against
            // (issue 19.2; this asserted `>` before).
            assert_eq!(changed.version, same.version);
            let junk = rec(c, "node_a", 0, "k", true, &digests, b"{not json", "sha-3");
            assert!(matches!(
                junk,
                Err(OpError::Store(StoreError::Json {
                    column: "inventory",
                    ..
                }))
            ));
            let after = c.node("node_a")?.ok_or(OpError::Internal("a".into()))?;
            assert_eq!(after.inventory_sha256.as_deref(), Some("sha-2"));
            Ok(())
        })
    }

    #[test]
    fn machines_are_found_by_two_shared_identifiers_through_the_index() -> Result<(), OpError> {
        let store = cpl_store::testing::store()?;
        store.write_blocking(|c| -> Result<(), OpError> {
            let mut a = node("node_a");
            a.identifier_digests = vec!["x".into(), "y".into(), "z".into()];
            c.insert_node(&a, 0)?;
            let mut b = node("node_b");
            b.identifier_digests = vec!["y".into(), "q".into()];
            c.insert_node(&b, 1)?;
            let find = |c: &Tx<'_>, d: &[&str]| -> Result<Vec<String>, OpError> {
                let d: Vec<String> = d.iter().map(|s| (*s).to_owned()).collect();
                Ok(c.nodes_sharing_identifiers(&d, 2)?
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
            rec(
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
            c.delete_node("node_a")?;
            assert!(find(c, &["m", "n"])?.is_empty());
            Ok(())
        })
    }
}
