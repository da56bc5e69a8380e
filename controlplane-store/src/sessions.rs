//! Session bookkeeping the gateway and Liveness need in bulk: heartbeats written in batches (one
//! transaction per flush, never one write per heartbeat) and the sweep's silent nodes. Any change
//! of `connectivity` these find is made by the core's edit path, not here.

use crate::params;

use super::{Reader, StoreError, Tx, sql_u64};

impl Tx<'_> {
    /// Moves `lastSeen` up (never down) for each `(node_id, epoch, last_seen_ms)` whose epoch is
    /// still the node's current session. Returns the ids of those nodes that are `unreachable` or
    /// `lost`: a heartbeat of the current session makes them `connected` again.
    ///
    /// One statement for the whole batch (the beats go in as one JSON parameter): a flush of
    /// 10,000 heartbeats is one round trip to PostgreSQL, not 20,000. Two beats of one session in
    /// a batch count as the later one.
    pub fn touch_heartbeats(
        &self,
        beats: &[(String, u64, i64)],
    ) -> Result<Vec<String>, StoreError> {
        if beats.is_empty() {
            return Ok(Vec::new());
        }
        let mut latest: std::collections::BTreeMap<(&str, u64), i64> = Default::default();
        for (id, epoch, at) in beats {
            let e = latest.entry((id.as_str(), *epoch)).or_insert(*at);
            *e = (*e).max(*at);
        }
        let batch: Vec<serde_json::Value> = latest
            .iter()
            .map(|((id, epoch), at)| serde_json::json!({"id": id, "epoch": sql_u64(*epoch), "at": at}))
            .collect();
        let batch = serde_json::Value::Array(batch).to_string();
        let db = self.db();
        let beats_table = if db.is_postgres() {
            "jsonb_to_recordset(CAST(?1 AS jsonb)) AS b(id text, epoch bigint, at bigint)"
        } else {
            "(SELECT json_extract(value, '$.id') AS id, json_extract(value, '$.epoch') AS epoch, \
             json_extract(value, '$.at') AS at FROM json_each(?1)) AS b"
        };
        let sql = format!(
            "UPDATE nodes SET last_seen = CASE WHEN COALESCE(nodes.last_seen, 0) > b.at \
             THEN nodes.last_seen ELSE b.at END FROM {beats_table} \
             WHERE nodes.id = b.id AND nodes.session_epoch = b.epoch \
             RETURNING nodes.id, nodes.connectivity"
        );
        let mut revive: Vec<String> = db
            .query_map(&sql, params![batch], |r| {
                Ok((r.get::<String>(0)?, r.get::<String>(1)?))
            })?
            .filter_map(|row| match row {
                Ok((id, c)) => matches!(c.as_str(), "unreachable" | "lost").then_some(Ok(id)),
                Err(e) => Some(Err(e)),
            })
            .collect::<Result<_, _>>()?;
        revive.sort();
        Ok(revive)
    }
}

impl Reader<'_> {
    /// `(node_id, session_epoch, gateway_id)` of every node `connected` through a gateway: which
    /// replica holds which session, as the sessions' opens recorded it.
    pub fn connected_sessions(&self) -> Result<Vec<(String, u64, String)>, StoreError> {
        self.db()
            .query_map(
                "SELECT id, session_epoch, gateway_id FROM nodes \
                 WHERE connectivity = 'connected' AND gateway_id IS NOT NULL ORDER BY id",
                params![],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )?
            .collect()
    }

    /// `(gateway_id, connected nodes)` for every replica holding at least one session, most
    /// sessions first (ties by id): how the fleet spreads over the replicas, as the sessions'
    /// opens recorded it (`controlPlane.status`).
    pub fn sessions_per_gateway(&self) -> Result<Vec<(String, u64)>, StoreError> {
        self.db()
            .query_map(
                "SELECT gateway_id, COUNT(*) AS n FROM nodes \
                 WHERE connectivity = 'connected' AND gateway_id IS NOT NULL \
                 GROUP BY gateway_id ORDER BY n DESC, gateway_id",
                params![],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )?
            .collect()
    }

    /// Nodes connected through `gateway_id` that something waits for: a queued command, or a
    /// spec newer than the one they observed. A replica whose LISTEN connection broke may have
    /// missed the notices that would have sent them; it sends them after reconnecting.
    pub fn sessions_owed(&self, gateway_id: &str) -> Result<Vec<String>, StoreError> {
        self.db()
            .query_map(
                "SELECT id FROM nodes WHERE gateway_id = ?1 AND connectivity = 'connected' \
                 AND (generation > observed_generation OR EXISTS \
                   (SELECT 1 FROM commands c WHERE c.node_id = nodes.id AND c.state = 'queued')) \
                 ORDER BY id",
                params![gateway_id],
                |r| r.get(0),
            )?
            .collect()
    }

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

#[cfg(test)]
mod tests {
    use super::*;
    use bc_protocol::{Connectivity, ProvisionState};

    fn node(tx: &Tx<'_>, id: &str, epoch: u64, c: Connectivity) -> Result<(), StoreError> {
        node_on(tx, id, epoch, c, None)
    }

    fn node_on(
        tx: &Tx<'_>,
        id: &str,
        epoch: u64,
        c: Connectivity,
        gateway: Option<&str>,
    ) -> Result<(), StoreError> {
        let n = crate::testing::new_node(id);
        tx.insert_node_in(&n, ProvisionState::Adopted, 1)?;
        let before = tx
            .node(id)?
            .ok_or_else(|| StoreError::Task("no row".into()))?;
        let mut after = before.clone();
        after.session_epoch = epoch;
        after.connectivity = c;
        after.last_seen = Some(1_000);
        after.gateway_id = gateway.map(str::to_owned);
        // Converged: nothing to push.
        after.observed_generation = after.generation;
        assert!(tx.update_node(&before, &after, true, 1)?);
        Ok(())
    }

    #[test]
    fn a_batch_moves_last_seen_up_for_current_sessions_and_names_the_revived()
    -> Result<(), StoreError> {
        let store = crate::testing::store()?;
        store.write_blocking(|tx| {
            node(tx, "node_a", 3, Connectivity::Connected)?;
            node(tx, "node_b", 3, Connectivity::Unreachable)?;
            node(tx, "node_c", 3, Connectivity::Lost)?;
            node(tx, "node_d", 3, Connectivity::Connected)?;
            let revive = tx.touch_heartbeats(&[
                ("node_a".into(), 3, 5_000),
                // Two beats of one session: the later counts, whatever the order.
                ("node_a".into(), 3, 4_000),
                ("node_b".into(), 3, 6_000),
                ("node_c".into(), 3, 7_000),
                // An older session's beat changes nothing.
                ("node_d".into(), 2, 9_000),
                // Never down.
                ("node_d".into(), 3, 500),
                ("node_missing".into(), 1, 9_000),
            ])?;
            assert_eq!(revive, vec!["node_b".to_owned(), "node_c".to_owned()]);
            let seen = |id: &str| -> Result<Option<i64>, StoreError> {
                Ok(tx.node(id)?.and_then(|n| n.last_seen))
            };
            assert_eq!(seen("node_a")?, Some(5_000));
            assert_eq!(seen("node_b")?, Some(6_000));
            assert_eq!(seen("node_c")?, Some(7_000));
            assert_eq!(seen("node_d")?, Some(1_000));
            assert!(tx.touch_heartbeats(&[])?.is_empty());
            Ok(())
        })
    }

    #[test]
    fn sessions_are_counted_per_replica_most_first() -> Result<(), StoreError> {
        let store = crate::testing::store()?;
        store.write_blocking(|tx| {
            assert!(tx.sessions_per_gateway()?.is_empty());
            node_on(tx, "node_a", 1, Connectivity::Connected, Some("gw-b"))?;
            node_on(tx, "node_b", 1, Connectivity::Connected, Some("gw-a"))?;
            node_on(tx, "node_c", 1, Connectivity::Connected, Some("gw-b"))?;
            // Not connected any more: its last gateway does not count.
            node_on(tx, "node_d", 1, Connectivity::Unreachable, Some("gw-c"))?;
            node_on(tx, "node_e", 1, Connectivity::Connected, None)?;
            assert_eq!(
                tx.sessions_per_gateway()?,
                vec![("gw-b".to_owned(), 2), ("gw-a".to_owned(), 1)]
            );
            // gw-b owes nothing until a command waits for node_a or node_c's spec moves on.
            assert!(tx.sessions_owed("gw-b")?.is_empty());
            let mut c = tx
                .node("node_c")?
                .ok_or_else(|| StoreError::Task("no row".into()))?;
            let before = c.clone();
            c.generation += 1;
            assert!(tx.update_node(&before, &c, true, 2)?);
            tx.insert_command(&crate::CommandRecord {
                id: "cmd_1".into(),
                node_id: "node_a".into(),
                name: bc_protocol::CommandName::InventoryRefresh,
                args: serde_json::json!({}),
                state: crate::CommandState::Queued,
                progress: 0,
                result: None,
                error_code: None,
                error_message: None,
                actor: "operator:test".into(),
                created_at: 2,
                sent_at: None,
                started_at: None,
                finished_at: None,
                deadline_at: 60_000,
                subject_node_id: None,
            })?;
            assert_eq!(
                tx.sessions_owed("gw-b")?,
                vec!["node_a".to_owned(), "node_c".to_owned()]
            );
            // Nobody else's.
            assert!(tx.sessions_owed("gw-a")?.is_empty());
            Ok(())
        })
    }
}
