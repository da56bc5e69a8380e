//! Session bookkeeping on the node row: the gateway opens and closes sessions, heartbeats move
//! `lastSeen` (batched), and the Liveness controller moves `connectivity`. Each change of
//! `connectivity` updates `noScheduleReasons` and the event log in the same transaction.

use bc_protocol::Connectivity;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::nodes;
use super::{StoreError, events, now_ms};

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

/// Moves `connectivity` through the axis's one writer, `model::ops::nodes::set_connectivity`
/// (the connectivity event, and `unreachable` in noScheduleReasons with its own event, in this
/// transaction). Nothing is written when nothing changes.
fn set_connectivity(
    tx: &Connection,
    node_id: &str,
    to: Connectivity,
    actor: &str,
    message: &str,
) -> Result<(), StoreError> {
    crate::model::ops::nodes::set_connectivity(tx, node_id, actor, to, message)
        .map(|_| ())
        .map_err(super::op_err)
}

/// Opens a session: epoch + 1, `connected`, session fields set. `None` when the node is gone.
pub fn open(conn: &mut Connection, s: &SessionOpen) -> Result<Option<Opened>, StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let Some(node) = nodes::get(&tx, &s.node_id)? else {
        return Ok(None);
    };
    let now = now_ms();
    let epoch = node.session_epoch + 1;
    tx.execute(
        "UPDATE nodes SET session_epoch = ?2, gateway_id = ?3, connected_at = ?4, last_seen = ?4, \
         boot_id = ?5, agent_version = ?6 WHERE id = ?1",
        params![
            s.node_id,
            i64::try_from(epoch).unwrap_or(i64::MAX),
            s.gateway_id,
            now,
            s.boot_id,
            s.agent_version
        ],
    )?;
    set_connectivity(
        &tx,
        &s.node_id,
        Connectivity::Connected,
        "gateway",
        "session opened",
    )?;
    tx.commit()?;
    Ok(Some(Opened {
        epoch,
        generation: node.generation,
        spec: node.spec,
        identity_generation: node.identity_generation,
        trust: node.trust,
    }))
}

/// Closes a session after a clean Goodbye: `disconnected`, `disconnectedAt`. A session that is no
/// longer the node's current epoch changes nothing.
pub fn close_clean(
    conn: &mut Connection,
    node_id: &str,
    epoch: u64,
    reason: &str,
) -> Result<(), StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let Some(node) = nodes::get(&tx, node_id)? else {
        return Ok(());
    };
    if node.session_epoch != epoch {
        return Ok(());
    }
    let now = now_ms();
    tx.execute(
        "UPDATE nodes SET disconnected_at = ?2 WHERE id = ?1",
        params![node_id, now],
    )?;
    set_connectivity(
        &tx,
        node_id,
        Connectivity::Disconnected,
        "gateway",
        "agent said Goodbye",
    )?;
    if !reason.is_empty() {
        events::record(
            &tx,
            node_id,
            now,
            "goodbye",
            None,
            Some(reason),
            "gateway",
            "agent said Goodbye",
        )?;
    }
    tx.commit()?;
    Ok(())
}

/// Writes a batch of heartbeats `(node_id, epoch, last_seen_ms)` in one transaction. A node whose
/// current session heartbeats while marked unreachable or lost is `connected` again.
pub fn flush_heartbeats(
    conn: &mut Connection,
    beats: &[(String, u64, i64)],
) -> Result<usize, StoreError> {
    if beats.is_empty() {
        return Ok(0);
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let mut revived = Vec::new();
    {
        let mut upd = tx.prepare_cached(
            "UPDATE nodes SET last_seen = MAX(COALESCE(last_seen, 0), ?3) WHERE id = ?1 AND session_epoch = ?2",
        )?;
        let mut state = tx.prepare_cached(
            "SELECT connectivity FROM nodes WHERE id = ?1 AND session_epoch = ?2",
        )?;
        for (id, epoch, at) in beats {
            let epoch_i = i64::try_from(*epoch).unwrap_or(i64::MAX);
            upd.execute(params![id, epoch_i, at])?;
            let c: Option<String> = state
                .query_row(params![id, epoch_i], |r| r.get(0))
                .optional()?;
            if matches!(c.as_deref(), Some("unreachable") | Some("lost")) {
                revived.push(id.clone());
            }
        }
    }
    for id in &revived {
        set_connectivity(
            &tx,
            id,
            Connectivity::Connected,
            "Liveness",
            "heartbeat of the current session",
        )?;
    }
    tx.commit()?;
    Ok(beats.len())
}

/// Liveness sweep: `connected` nodes silent for `unreachable_after_ms` become `unreachable`;
/// `unreachable` nodes silent for `unreachable_after_ms + lost_after_ms` become `lost`.
/// Returns the ids that changed.
pub fn sweep(
    conn: &mut Connection,
    now: i64,
    unreachable_after_ms: i64,
    lost_after_ms: i64,
) -> Result<Vec<(String, Connectivity)>, StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let mut candidates = Vec::new();
    {
        let mut stmt = tx.prepare_cached(
            "SELECT id, connectivity FROM nodes WHERE \
             (connectivity = 'connected' AND COALESCE(last_seen, 0) < ?1) OR \
             (connectivity = 'unreachable' AND COALESCE(last_seen, 0) < ?2)",
        )?;
        let rows = stmt.query_map(
            params![
                now - unreachable_after_ms,
                now - unreachable_after_ms - lost_after_ms
            ],
            |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)),
        )?;
        for row in rows {
            candidates.push(row?);
        }
    }
    let mut changed = Vec::new();
    for (id, _) in candidates {
        let Some(node) = nodes::get(&tx, &id)? else {
            continue;
        };
        let to = match node.connectivity {
            Connectivity::Connected => Connectivity::Unreachable,
            Connectivity::Unreachable => Connectivity::Lost,
            _ => continue,
        };
        set_connectivity(&tx, &id, to, "Liveness", "no heartbeat")?;
        changed.push((id, to));
    }
    tx.commit()?;
    Ok(changed)
}
