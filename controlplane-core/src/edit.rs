//! [`Edit`]: the one writer of the node row. Load the node under the write lock, check the
//! version where the caller gave one, change it in memory, record why, save it. Every change of
//! any axis, condition, `noScheduleReasons`, generation, identity or session field goes through
//! here — operator verbs, JoinService, the gateway's session open and close, agent reports,
//! Liveness and Health alike — so the version check, the events and the `noScheduleReasons`
//! write cannot be forgotten by one writer.
//!
//! Two kinds of change: a *state* change records an event (or calls [`Edit::bump`]) and is saved
//! with `version + 1`, so an operator holding an older read gets `CONFLICT`; *bookkeeping* (the
//! session's epoch and times, `inventoryAt`) is saved without moving `version`, as a heartbeat or
//! an identical inventory must stay cheap (docs/benchmarks.md).
//!
//! What an agent reports ([`Edit::report`]: Inventory, SpecStatus, XID events and command
//! results through Health, session open and close, a heartbeat reviving a node) is saved with its
//! events but never moves `version`: `version` is what operators' writes are checked against, and
//! a node that sends reports as fast as it can must not make every operator write a `CONFLICT`
//! (issue 19.2). Operators and the control plane's own controllers use [`Edit::begin`].

use bc_protocol::ProvisionState;
use cpl_store::{NewEvent, NewNode, NodeRecord, Tx, now_ms};

use crate::error::OpError;

/// One event to append when the edit is saved.
#[derive(Debug, Clone)]
struct PendingEvent {
    kind: String,
    from: Option<String>,
    to: Option<String>,
    actor: String,
    message: String,
}

/// A node being changed inside one write transaction.
#[derive(Debug)]
pub struct Edit {
    before: NodeRecord,
    /// The node as it will be saved. Writers change its fields directly.
    pub node: NodeRecord,
    actor: String,
    now: i64,
    events: Vec<PendingEvent>,
    bump: bool,
    /// Driven by what an agent reported: saved without moving `version`.
    report: bool,
}

impl Edit {
    /// Loads `node_id` for a change by `actor`: `NOT_FOUND` if absent; with `expected_version`
    /// (an operator mutation), `CONFLICT` unless the node is at that version. Without it (a
    /// controller or the gateway) the change applies to the current row, and still moves the
    /// version when it changes state. On PostgreSQL the row is locked already: by the global
    /// write lock, or `FOR UPDATE` at the start of a node's write (`cpl_store::Store::write_node`).
    pub fn begin(
        tx: &Tx<'_>,
        node_id: &str,
        expected_version: Option<u64>,
        actor: &str,
    ) -> Result<Self, OpError> {
        let node = tx
            .node(node_id)?
            .ok_or_else(|| OpError::node_not_found(node_id))?;
        if let Some(expected) = expected_version
            && node.version != expected
        {
            return Err(OpError::Conflict {
                kind: "node",
                id: node_id.to_owned(),
                expected,
                actual: node.version,
            });
        }
        Ok(Edit {
            before: node.clone(),
            node,
            actor: actor.to_owned(),
            now: now_ms(),
            events: Vec::new(),
            bump: false,
            report: false,
        })
    }

    /// Loads `node_id` for a change that an agent's report drives (by `actor`, the controller
    /// applying it): saved with its events, never with `version + 1`. `NOT_FOUND` if absent.
    pub fn report(tx: &Tx<'_>, node_id: &str, actor: &str) -> Result<Self, OpError> {
        let mut edit = Self::begin(tx, node_id, None, actor)?;
        edit.report = true;
        Ok(edit)
    }

    /// The transaction's time, milliseconds since the Unix epoch.
    pub fn now(&self) -> i64 {
        self.now
    }

    /// Who is making the change (the actor of the events recorded from now on).
    pub fn actor(&self) -> &str {
        &self.actor
    }

    /// Records the following events as `actor`'s (one edit may carry the changes of several
    /// owners, e.g. an inventory report and the NodeLifecycle acceptance it triggers).
    pub fn act_as(&mut self, actor: &str) {
        actor.clone_into(&mut self.actor);
    }

    /// The node as it was loaded.
    pub fn before(&self) -> &NodeRecord {
        &self.before
    }

    /// Queues an event `kind: from -> to` (a state change: the save moves `version`).
    pub fn event(
        &mut self,
        kind: &str,
        from: Option<String>,
        to: Option<String>,
        message: impl Into<String>,
    ) {
        self.events.push(PendingEvent {
            kind: kind.to_owned(),
            from,
            to,
            actor: self.actor.clone(),
            message: message.into(),
        });
    }

    /// Marks a state change that has no event of its own (a new inventory document): the save
    /// moves `version`.
    pub fn bump(&mut self) {
        self.bump = true;
    }

    /// Adds (`present`) or removes `reason` in `noScheduleReasons`, with an event when it changes.
    pub fn set_reason(&mut self, reason: &str, present: bool) {
        let next = with_reason(&self.node.no_schedule_reasons, reason, present);
        if next != self.node.no_schedule_reasons {
            let from = json(&self.node.no_schedule_reasons);
            let to = json(&next);
            let verb = if present { "added" } else { "removed" };
            self.node.no_schedule_reasons = next;
            self.event(
                "noScheduleReasons",
                Some(from),
                Some(to),
                format!("{verb} {reason}"),
            );
        }
    }

    /// Whether a state change was recorded.
    pub fn changed(&self) -> bool {
        self.bump || !self.events.is_empty()
    }

    /// Saves the node: the columns that differ from the loaded row; with a state change also
    /// `version + 1` and the queued events. Without any difference nothing is written. Returns
    /// the node as saved.
    ///
    /// Errors: `CONFLICT` when the row moved under the edit (only reachable without the write
    /// lock, e.g. PostgreSQL without `FOR UPDATE`).
    pub fn save(mut self, tx: &Tx<'_>) -> Result<NodeRecord, OpError> {
        let versioned = self.changed() && !self.report;
        if !self.changed() && self.node == self.before {
            return Ok(self.node);
        }
        if !tx.update_node(&self.before, &self.node, versioned, self.now)? {
            let actual = tx.node(&self.node.id)?.map(|r| r.version).unwrap_or(0);
            return Err(OpError::Conflict {
                kind: "node",
                id: self.node.id.clone(),
                expected: self.before.version,
                actual,
            });
        }
        for e in &self.events {
            tx.record_event(&NewEvent {
                node_id: &self.node.id,
                at: self.now,
                kind: &e.kind,
                from: e.from.as_deref(),
                to: e.to.as_deref(),
                actor: &e.actor,
                message: &e.message,
            })?;
        }
        if versioned {
            self.node.version = self.before.version + 1;
            self.node.updated_at = self.now;
        }
        Ok(self.node)
    }
}

/// Creates a node, the one way any node comes to exist: inserts it in `state` (`adopting` for
/// JoinService, `enrolling` for `nodes.enroll`) and records the `provisionState` event `→ state`
/// by `actor` with `message`. Returns the creation time, ms since the Unix epoch (the node's
/// `createdAt`, for rows written beside it).
pub fn create_node(
    tx: &Tx<'_>,
    new: &NewNode,
    state: ProvisionState,
    actor: &str,
    message: &str,
) -> Result<i64, OpError> {
    let now = now_ms();
    tx.insert_node_in(new, state, now)?;
    tx.record_event(&NewEvent {
        node_id: &new.id,
        at: now,
        kind: "provisionState",
        from: None,
        to: Some(state.as_str()),
        actor,
        message,
    })?;
    Ok(now)
}

/// Sorted, deduplicated reasons with `reason` added or removed.
pub fn with_reason(reasons: &[String], reason: &str, present: bool) -> Vec<String> {
    let mut out: Vec<String> = reasons.iter().filter(|r| *r != reason).cloned().collect();
    if present {
        out.push(reason.to_owned());
    }
    out.sort();
    out.dedup();
    out
}

fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_stay_sorted_and_unique() {
        let r = with_reason(&["taint:gpu".into()], "unreachable", true);
        assert_eq!(r, vec!["taint:gpu".to_owned(), "unreachable".to_owned()]);
        let r = with_reason(&r, "unreachable", true);
        assert_eq!(r.len(), 2);
        let r = with_reason(&r, "unreachable", false);
        assert_eq!(r, vec!["taint:gpu".to_owned()]);
    }
}
