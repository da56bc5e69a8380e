//! [`Edit`]: load a node row under the write lock, change it in memory, record why, save it with
//! `version + 1`. Every node mutation goes through it so the version check, the events and the
//! `noScheduleReasons` write cannot be forgotten by one verb.

use rusqlite::{Connection, params};

use crate::model::error::OpError;
use crate::store::nodes::{self, NodeRecord, with_reason};
use crate::store::{events, now_ms, to_json};

/// One event to append when the edit is saved.
#[derive(Debug, Clone)]
struct PendingEvent {
    kind: String,
    from: Option<String>,
    to: Option<String>,
    message: String,
}

/// A node being changed inside one transaction.
#[derive(Debug)]
pub struct Edit<'t> {
    tx: &'t Connection,
    /// The node as it will be saved. Verbs change its fields directly.
    pub node: NodeRecord,
    loaded_version: u64,
    actor: String,
    now: i64,
    events: Vec<PendingEvent>,
}

impl<'t> Edit<'t> {
    /// Loads `node_id` for an operator mutation: `NOT_FOUND` if absent, `CONFLICT` unless its
    /// `version` is `expected_version`. PostgreSQL: the load is the place for `FOR UPDATE`.
    pub fn begin(
        tx: &'t Connection,
        node_id: &str,
        expected_version: u64,
        actor: &str,
    ) -> Result<Self, OpError> {
        let edit = Self::begin_unversioned(tx, node_id, actor)?;
        if edit.node.version != expected_version {
            return Err(OpError::Conflict {
                kind: "node",
                id: node_id.to_owned(),
                expected: expected_version,
                actual: edit.node.version,
            });
        }
        Ok(edit)
    }

    /// Loads `node_id` for a controller write, which acts on the current row whatever its
    /// version (it still bumps it, so an operator holding an older read gets `CONFLICT`).
    pub fn begin_unversioned(
        tx: &'t Connection,
        node_id: &str,
        actor: &str,
    ) -> Result<Self, OpError> {
        let node = nodes::get(tx, node_id)?.ok_or_else(|| OpError::node_not_found(node_id))?;
        Ok(Edit {
            tx,
            loaded_version: node.version,
            node,
            actor: actor.to_owned(),
            now: now_ms(),
            events: Vec::new(),
        })
    }

    /// The transaction's time, milliseconds since the Unix epoch.
    pub fn now(&self) -> i64 {
        self.now
    }

    /// Who is making the change.
    pub fn actor(&self) -> &str {
        &self.actor
    }

    /// The transaction, for side tables (taints, leases, allocations).
    pub fn tx(&self) -> &'t Connection {
        self.tx
    }

    /// Queues an event `kind: from -> to`.
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
            message: message.into(),
        });
    }

    /// Adds (`present`) or removes `reason` in `noScheduleReasons`, with an event when it changes.
    pub fn set_reason(&mut self, reason: &str, present: bool) {
        let next = with_reason(&self.node.no_schedule_reasons, reason, present);
        if next != self.node.no_schedule_reasons {
            let from = to_json(&self.node.no_schedule_reasons);
            let to = to_json(&next);
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

    /// Whether anything was changed (an edit with no events is saved as a no-op).
    pub fn changed(&self) -> bool {
        !self.events.is_empty()
    }

    /// Writes the node (fields the model owns; never the gateway's session columns), bumps
    /// `version`, appends the queued events. Without changes, returns the node untouched.
    pub fn save(mut self) -> Result<NodeRecord, OpError> {
        if self.events.is_empty() {
            return Ok(self.node);
        }
        let n = &self.node;
        let updated = self.tx.execute(
            "UPDATE nodes SET site_id = ?3, pool_id = ?4, owner_tenant_id = ?5, role = ?6, \
             trust = ?7, provision_state = ?8, failed_from = ?9, maintenance = ?10, \
             maintenance_reason = ?11, cordoned = ?12, connectivity = ?13, conditions = ?14, \
             no_schedule_reasons = ?15, generation = ?16, identity_generation = ?17, labels = ?18, \
             spec = ?19, updated_at = ?20, power = ?21, version = version + 1 \
             WHERE id = ?1 AND version = ?2",
            params![
                n.id,
                i64::try_from(self.loaded_version).unwrap_or(i64::MAX),
                n.site_id,
                n.pool_id,
                n.owner_tenant_id,
                n.role.as_str(),
                n.trust.as_str(),
                n.provision_state.as_str(),
                n.failed_from.map(|s| s.as_str()),
                n.maintenance,
                n.maintenance_reason,
                n.cordoned,
                n.connectivity.as_str(),
                to_json(&n.conditions),
                to_json(&n.no_schedule_reasons),
                i64::try_from(n.generation).unwrap_or(i64::MAX),
                i64::try_from(n.identity_generation).unwrap_or(i64::MAX),
                to_json(&n.labels),
                to_json(&n.spec),
                self.now,
                n.power.as_str(),
            ],
        )?;
        if updated != 1 {
            // Only reachable without the write lock (e.g. a deferred transaction on PostgreSQL
            // without FOR UPDATE): someone saved in between.
            let actual = nodes::get(self.tx, &n.id)?.map(|r| r.version).unwrap_or(0);
            return Err(OpError::Conflict {
                kind: "node",
                id: n.id.clone(),
                expected: self.loaded_version,
                actual,
            });
        }
        for e in &self.events {
            events::record(
                self.tx,
                &n.id,
                self.now,
                &e.kind,
                e.from.as_deref(),
                e.to.as_deref(),
                &self.actor,
                &e.message,
            )?;
        }
        self.node.version = self.loaded_version + 1;
        self.node.updated_at = self.now;
        Ok(self.node)
    }
}
