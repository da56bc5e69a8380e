//! Re-join requests: a machine that matched a platform node by its identifiers only (not by a
//! trusted hardware key) may re-join in place only once an operator approved it
//! (`nodes.approveRejoin`). At most one request per node; the row goes with the node.

use crate::db::OptionalExt;
use crate::params;
use serde::Serialize;

use super::{Reader, StoreError, Tx, from_json, to_json};

/// A machine's request to re-join an existing node in place.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RejoinRequest {
    /// `rejoin_…`.
    pub id: String,
    /// The node the machine matched.
    pub node_id: String,
    /// The join token the machine presented (its id; never the secret).
    pub token_id: String,
    /// The machine's hardware key, if it sent one.
    pub hardware_key: Option<String>,
    /// Whether the control plane found the key trustworthy (not the agent's claim).
    pub hardware_key_trusted: bool,
    /// Sorted, distinct hex digests of the machine's identifiers.
    pub identifier_digests: Vec<String>,
    /// The hostname the agent sent.
    pub hostname: Option<String>,
    /// Source address of the join.
    pub peer: Option<String>,
    /// Milliseconds since the Unix epoch.
    pub requested_at: i64,
    /// When an operator approved it (milliseconds); `None` while it waits.
    pub approved_at: Option<i64>,
    /// `operator:<name>` who approved it.
    pub approved_by: Option<String>,
}

const COLUMNS: &str = "id, node_id, token_id, hardware_key, hardware_key_trusted, \
    identifier_digests, hostname, peer, requested_at, approved_at, approved_by";

fn from_row(row: &crate::db::Row<'_>) -> Result<RejoinRequest, StoreError> {
    let digests: String = row.get(5)?;
    Ok(RejoinRequest {
        id: row.get(0)?,
        node_id: row.get(1)?,
        token_id: row.get(2)?,
        hardware_key: row.get(3)?,
        hardware_key_trusted: row.get(4)?,
        identifier_digests: from_json("rejoin_requests.identifier_digests", &digests)?,
        hostname: row.get(6)?,
        peer: row.get(7)?,
        requested_at: row.get(8)?,
        approved_at: row.get(9)?,
        approved_by: row.get(10)?,
    })
}

impl Reader<'_> {
    /// The node's re-join request, if any.
    pub fn rejoin_request(&self, node_id: &str) -> Result<Option<RejoinRequest>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM rejoin_requests WHERE node_id = ?1");
        let mut stmt = self.db().prepare_cached(&sql)?;
        stmt.query_map(params![node_id], from_row)?
            .next()
            .transpose()
    }

    /// The request with this id, if any.
    pub fn rejoin_request_by_id(&self, id: &str) -> Result<Option<RejoinRequest>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM rejoin_requests WHERE id = ?1");
        self.db()
            .query_row(&sql, params![id], |row| Ok(from_row(row)))
            .optional()?
            .transpose()
    }
}

impl Tx<'_> {
    /// Stores `r` as its node's one request, replacing any earlier one.
    pub fn put_rejoin_request(&self, r: &RejoinRequest) -> Result<(), StoreError> {
        let tx = self.db();
        tx.execute(
            "DELETE FROM rejoin_requests WHERE node_id = ?1",
            params![r.node_id],
        )?;
        tx.execute(
            &format!(
                "INSERT INTO rejoin_requests ({COLUMNS}) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"
            ),
            params![
                r.id,
                r.node_id,
                r.token_id,
                r.hardware_key,
                r.hardware_key_trusted,
                to_json(&r.identifier_digests),
                r.hostname,
                r.peer,
                r.requested_at,
                r.approved_at,
                r.approved_by
            ],
        )?;
        Ok(())
    }

    /// Marks request `id` approved by `by` at `at`. Returns false when there is no such request.
    pub fn approve_rejoin_request(&self, id: &str, by: &str, at: i64) -> Result<bool, StoreError> {
        let n = self.db().execute(
            "UPDATE rejoin_requests SET approved_at = ?2, approved_by = ?3 WHERE id = ?1",
            params![id, at, by],
        )?;
        Ok(n > 0)
    }

    /// Removes the node's request (used, or the node moved). Returns whether there was one.
    pub fn delete_rejoin_request(&self, node_id: &str) -> Result<bool, StoreError> {
        let n = self.db().execute(
            "DELETE FROM rejoin_requests WHERE node_id = ?1",
            params![node_id],
        )?;
        Ok(n > 0)
    }
}
