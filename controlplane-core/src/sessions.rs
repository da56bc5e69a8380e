//! Session bookkeeping on the node row, through the one edit path: the gateway opens and closes
//! sessions, heartbeats move `lastSeen` (batched: one transaction per flush), and Liveness moves
//! `connectivity`. Each change of `connectivity` updates `noScheduleReasons` and the event log in
//! the same save (`ops::nodes::apply_connectivity`).

use bc_protocol::Connectivity;
use cpl_store::{NodeRecord, Tx};

use crate::edit::Edit;
use crate::error::OpError;
use crate::ops::nodes::apply_connectivity;

/// Facts of a session being opened.
#[derive(Debug, Clone)]
pub struct SessionOpen {
    pub node_id: String,
    pub gateway_id: String,
    pub boot_id: String,
    pub agent_version: String,
}

/// What the gateway needs after opening: the new epoch and the spec to send.
#[derive(Debug, Clone)]
pub struct Opened {
    pub epoch: u64,
    pub generation: u64,
    pub spec: serde_json::Value,
    pub identity_generation: u64,
    pub trust: bc_protocol::Trust,
}

/// Opens a session: epoch + 1, `connected`, session fields set. `None` when the node is gone.
pub fn open(tx: &Tx<'_>, s: &SessionOpen) -> Result<Option<Opened>, OpError> {
    let mut edit = match Edit::report(tx, &s.node_id, "gateway") {
        Ok(e) => e,
        Err(OpError::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    let now = edit.now();
    let n = &mut edit.node;
    n.session_epoch += 1;
    n.gateway_id = Some(s.gateway_id.clone());
    n.connected_at = Some(now);
    n.last_seen = Some(now);
    n.boot_id = Some(s.boot_id.clone());
    n.agent_version = Some(s.agent_version.clone());
    n.session_broken = false;
    apply_connectivity(&mut edit, Connectivity::Connected, "session opened");
    let node = edit.save(tx)?;
    Ok(Some(Opened {
        epoch: node.session_epoch,
        generation: node.generation,
        spec: node.spec,
        identity_generation: node.identity_generation,
        trust: node.trust,
    }))
}

/// Closes a session the agent (or the control plane, on revoke) ended on purpose: `disconnected`,
/// `disconnectedAt`, and a `goodbye` event naming `reason` when one is given. A session that is
/// no longer the node's current epoch changes nothing.
pub fn close_clean(tx: &Tx<'_>, node_id: &str, epoch: u64, reason: &str) -> Result<(), OpError> {
    let mut edit = match Edit::report(tx, node_id, "gateway") {
        Ok(e) => e,
        Err(OpError::NotFound { .. }) => return Ok(()),
        Err(e) => return Err(e),
    };
    if edit.node.session_epoch != epoch {
        return Ok(());
    }
    edit.node.disconnected_at = Some(edit.now());
    edit.node.session_broken = false;
    apply_connectivity(&mut edit, Connectivity::Disconnected, "agent said Goodbye");
    if !reason.is_empty() {
        edit.event(
            "goodbye",
            None,
            Some(reason.to_owned()),
            "agent said Goodbye",
        );
    }
    edit.save(tx)?;
    Ok(())
}

/// Closes a session whose stream ended without a Goodbye (the transport closed: a reset, a killed
/// agent): `disconnected` at once with `disconnectedAt`, marked broken so that Liveness still
/// turns its silence into `unreachable` (and later `lost`) if the agent does not come back. A
/// session that is no longer the node's current epoch (a newer one opened) changes nothing.
pub fn close_broken(tx: &Tx<'_>, node_id: &str, epoch: u64) -> Result<(), OpError> {
    // The agent's transport closing drives this change, as its Goodbye does: a report, which
    // never moves `version` (issue 19.2).
    let mut edit = match Edit::report(tx, node_id, "gateway") {
        Ok(e) => e,
        Err(OpError::NotFound { .. }) => return Ok(()),
        Err(e) => return Err(e),
    };
    if edit.node.session_epoch != epoch || edit.node.connectivity != Connectivity::Connected {
        return Ok(());
    }
    edit.node.disconnected_at = Some(edit.now());
    edit.node.session_broken = true;
    apply_connectivity(
        &mut edit,
        Connectivity::Disconnected,
        "session stream ended without a Goodbye",
    );
    edit.save(tx)?;
    Ok(())
}

/// Writes a batch of heartbeats `(node_id, epoch, last_seen_ms)` in the caller's one transaction.
/// A node whose current session heartbeats while marked unreachable or lost is `connected` again.
/// Returns how many heartbeats were in the batch.
pub fn flush_heartbeats(tx: &Tx<'_>, beats: &[(String, u64, i64)]) -> Result<usize, OpError> {
    if beats.is_empty() {
        return Ok(0);
    }
    for id in tx.touch_heartbeats(beats)? {
        // The agent's heartbeat drives this change: a report, which never moves `version`.
        let mut edit = Edit::report(tx, &id, "Liveness")?;
        apply_connectivity(
            &mut edit,
            Connectivity::Connected,
            "heartbeat of the current session",
        );
        edit.save(tx)?;
    }
    Ok(beats.len())
}

/// Liveness sweep at `now`: `connected` nodes (and `disconnected` ones whose session broke
/// without a Goodbye) silent for `unreachable_after_ms` become `unreachable`; `unreachable` nodes silent for `unreachable_after_ms + lost_after_ms` become
/// `lost`. Returns the nodes that changed and their new connectivity.
pub fn sweep(
    tx: &Tx<'_>,
    now: i64,
    unreachable_after_ms: i64,
    lost_after_ms: i64,
) -> Result<Vec<(String, Connectivity)>, OpError> {
    let mut changed = Vec::new();
    for id in tx.silent_nodes(now, unreachable_after_ms, lost_after_ms)? {
        let mut edit = Edit::begin(tx, &id, None, "Liveness")?;
        let to = match edit.node.connectivity {
            Connectivity::Connected => Connectivity::Unreachable,
            Connectivity::Disconnected if edit.node.session_broken => Connectivity::Unreachable,
            Connectivity::Unreachable => Connectivity::Lost,
            _ => continue,
        };
        apply_connectivity(&mut edit, to, "no heartbeat");
        let _: NodeRecord = edit.save(tx)?;
        changed.push((id, to));
    }
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_utils::node;

    fn opened(tx: &Tx<'_>, id: &str) -> Result<u64, OpError> {
        let s = SessionOpen {
            node_id: id.to_owned(),
            gateway_id: "gw".into(),
            boot_id: "b".into(),
            agent_version: "v".into(),
        };
        Ok(open(tx, &s)?.map_or(0, |o| o.epoch))
    }

    #[test]
    fn a_broken_stream_is_disconnected_at_once_and_unreachable_after_the_silence()
    -> Result<(), OpError> {
        let store = cpl_store::testing::store()?;
        store.write_blocking(|tx| -> Result<(), OpError> {
            node(tx, "node_a", None)?;
            node(tx, "node_b", None)?;
            let a = opened(tx, "node_a")?;
            let b = opened(tx, "node_b")?;
            let version = tx.node("node_a")?.map(|n| n.version);
            close_broken(tx, "node_a", a)?;
            close_clean(tx, "node_b", b, "shutdown")?;
            let n = tx
                .node("node_a")?
                .ok_or(OpError::node_not_found("node_a"))?;
            assert_eq!(n.connectivity, Connectivity::Disconnected);
            // The transport closing is the agent's doing: operators' version stays (issue 19.2).
            assert_eq!(Some(n.version), version);
            assert!(n.disconnected_at.is_some() && n.session_broken);
            assert!(n.no_schedule_reasons.is_empty());
            // Past the silence rule: the broken one is unreachable, the clean one stays.
            let later = n.last_seen.unwrap_or(0) + 40_001;
            let changed = sweep(tx, later, 40_000, 600_000)?;
            assert_eq!(
                changed,
                vec![("node_a".to_owned(), Connectivity::Unreachable)]
            );
            let n = tx
                .node("node_a")?
                .ok_or(OpError::node_not_found("node_a"))?;
            assert_eq!(n.no_schedule_reasons, vec!["unreachable".to_owned()]);
            let b = tx
                .node("node_b")?
                .ok_or(OpError::node_not_found("node_b"))?;
            assert_eq!(b.connectivity, Connectivity::Disconnected);
            // A new session makes it connected and no longer broken; the old epoch's break
            // afterwards changes nothing.
            let a2 = opened(tx, "node_a")?;
            close_broken(tx, "node_a", a)?;
            let n = tx
                .node("node_a")?
                .ok_or(OpError::node_not_found("node_a"))?;
            assert_eq!(
                (n.connectivity, n.session_broken, n.session_epoch),
                (Connectivity::Connected, false, a2)
            );
            let kinds: Vec<(Option<String>, Option<String>, String)> = tx
                .events("node_a")?
                .into_iter()
                .filter(|e| e.kind == "connectivity")
                .map(|e| (e.from, e.to, e.message))
                .collect();
            assert_eq!(
                kinds[1],
                (
                    Some("connected".into()),
                    Some("disconnected".into()),
                    "session stream ended without a Goodbye".into()
                )
            );
            Ok(())
        })
    }
}
