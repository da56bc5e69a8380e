//! The per-node event log: what changed, from → to, who, when.

use crate::params;
use serde::Serialize;

use super::{Reader, StoreError, Tx};

/// One event.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct NodeEvent {
    pub seq: i64,
    pub node_id: String,
    /// Milliseconds since the Unix epoch.
    pub at: i64,
    /// What changed, e.g. `provisionState`, `connectivity`, `joined`.
    pub kind: String,
    pub from: Option<String>,
    pub to: Option<String>,
    /// Who changed it: `JoinService`, `NodeLifecycle`, `gateway`, `Liveness`, `operator:<name>`.
    pub actor: String,
    pub message: String,
}

/// An event to append: one field per column of the row.
#[derive(Debug, Clone, Copy)]
pub struct NewEvent<'a> {
    pub node_id: &'a str,
    /// Milliseconds since the Unix epoch.
    pub at: i64,
    pub kind: &'a str,
    pub from: Option<&'a str>,
    pub to: Option<&'a str>,
    pub actor: &'a str,
    pub message: &'a str,
}

impl Reader<'_> {
    /// A node's events, oldest first.
    pub fn events(&self, node_id: &str) -> Result<Vec<NodeEvent>, StoreError> {
        let mut stmt = self.db().prepare_cached(
            "SELECT seq, node_id, at, kind, from_value, to_value, actor, message FROM node_events \
             WHERE node_id = ?1 ORDER BY seq",
        )?;
        let rows = stmt.query_map(params![node_id], |r| {
            Ok(NodeEvent {
                seq: r.get(0)?,
                node_id: r.get(1)?,
                at: r.get(2)?,
                kind: r.get(3)?,
                from: r.get(4)?,
                to: r.get(5)?,
                actor: r.get(6)?,
                message: r.get(7)?,
            })
        })?;
        rows.collect::<Result<_, _>>()
    }
}

impl Tx<'_> {
    /// Appends an event.
    pub fn record_event(&self, e: &NewEvent<'_>) -> Result<(), StoreError> {
        self.db()
            .prepare_cached(
                "INSERT INTO node_events (node_id, at, kind, from_value, to_value, actor, message) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?
            .execute(params![
                e.node_id, e.at, e.kind, e.from, e.to, e.actor, e.message
            ])?;
        Ok(())
    }
}
