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

/// Liveness sweep at `now`: `connected` nodes silent for `unreachable_after_ms` become
/// `unreachable`; `unreachable` nodes silent for `unreachable_after_ms + lost_after_ms` become
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
            Connectivity::Unreachable => Connectivity::Lost,
            _ => continue,
        };
        apply_connectivity(&mut edit, to, "no heartbeat");
        let _: NodeRecord = edit.save(tx)?;
        changed.push((id, to));
    }
    Ok(changed)
}
