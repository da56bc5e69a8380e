//! Session bookkeeping the gateway and Liveness need in bulk: heartbeats written in batches (one
//! transaction per flush, never one write per heartbeat) and the sweep's silent nodes. Any change
//! of `connectivity` these find is made by the core's edit path, not here.

use crate::db::OptionalExt;
use crate::params;

use super::{Reader, StoreError, Tx, sql_u64};

impl Tx<'_> {
    /// Moves `lastSeen` up (never down) for each `(node_id, epoch, last_seen_ms)` whose epoch is
    /// still the node's current session. Returns the ids of those nodes that are `unreachable` or
    /// `lost`: a heartbeat of the current session makes them `connected` again.
    pub fn touch_heartbeats(
        &self,
        beats: &[(String, u64, i64)],
    ) -> Result<Vec<String>, StoreError> {
        let tx = self.db();
        let mut upd = tx.prepare_cached(
            "UPDATE nodes SET last_seen = CASE WHEN COALESCE(last_seen, 0) > ?3 THEN last_seen ELSE ?3 END \
             WHERE id = ?1 AND session_epoch = ?2",
        )?;
        let mut state = tx.prepare_cached(
            "SELECT connectivity FROM nodes WHERE id = ?1 AND session_epoch = ?2",
        )?;
        let mut revive = Vec::new();
        for (id, epoch, at) in beats {
            let epoch = sql_u64(*epoch);
            upd.execute(params![id, epoch, at])?;
            let c: Option<String> = state
                .query_row(params![id, epoch], |r| r.get(0))
                .optional()?;
            if matches!(c.as_deref(), Some("unreachable") | Some("lost")) {
                revive.push(id.clone());
            }
        }
        Ok(revive)
    }
}

impl Reader<'_> {
    /// Liveness candidates at `now`: `connected` nodes, and `disconnected` ones whose session
    /// broke without a Goodbye, silent for `unreachable_after_ms`; `unreachable` nodes silent for
    /// `unreachable_after_ms + lost_after_ms`.
    pub fn silent_nodes(
        &self,
        now: i64,
        unreachable_after_ms: i64,
        lost_after_ms: i64,
    ) -> Result<Vec<String>, StoreError> {
        let mut stmt = self.db().prepare_cached(
            "SELECT id FROM nodes WHERE \
             (connectivity IN ('connected', 'disconnected') AND COALESCE(last_seen, 0) < ?1 \
              AND (connectivity = 'connected' OR session_broken = 1)) OR \
             (connectivity = 'unreachable' AND COALESCE(last_seen, 0) < ?2)",
        )?;
        let rows = stmt.query_map(
            params![
                now - unreachable_after_ms,
                now - unreachable_after_ms - lost_after_ms
            ],
            |r| r.get::<String>(0),
        )?;
        rows.collect::<Result<_, _>>()
    }
}
