//! What `bcctl bench` reads off a running control plane's store (opened read-only beside it,
//! [`crate::Store::open_read_only`]).

use super::{Reader, StoreError};
use crate::params;

/// Counts over the nodes table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BenchCounts {
    pub total: u64,
    pub adopted: u64,
    pub connected: u64,
    /// `observedGeneration >= generation`.
    pub converged: u64,
    /// `unreachable` or `lost`.
    pub unreachable: u64,
    /// Connected with a session opened at or after the `since` asked for.
    pub reconnected: u64,
}

impl Reader<'_> {
    /// [`BenchCounts`]; `since_ms` is milliseconds since the Unix epoch.
    pub fn bench_counts(&self, since_ms: i64) -> Result<BenchCounts, StoreError> {
        self.db().query_row(
            // count(CASE …) rather than sum(<boolean>): PostgreSQL has no sum over booleans.
            "SELECT count(*), \
                count(CASE WHEN provision_state = 'adopted' THEN 1 END), \
                count(CASE WHEN connectivity = 'connected' THEN 1 END), \
                count(CASE WHEN observed_generation >= generation THEN 1 END), \
                count(CASE WHEN connectivity IN ('unreachable', 'lost') THEN 1 END), \
                count(CASE WHEN connectivity = 'connected' AND connected_at >= ?1 THEN 1 END) \
             FROM nodes",
            params![since_ms],
            |r| {
                Ok(BenchCounts {
                    total: r.get(0)?,
                    adopted: r.get(1)?,
                    connected: r.get(2)?,
                    converged: r.get(3)?,
                    unreachable: r.get(4)?,
                    reconnected: r.get(5)?,
                })
            },
        )
    }

    /// `(id, version)` of every node, by id.
    pub fn node_versions(&self) -> Result<Vec<(String, u64)>, StoreError> {
        let mut st = self
            .db()
            .prepare("SELECT id, version FROM nodes ORDER BY id")?;
        let rows = st.query_map(params![], |r| Ok((r.get(0)?, r.get(1)?)))?;
        rows.collect::<Result<_, _>>()
    }

    /// How many `name` commands created at or after `since_ms` succeeded.
    pub fn succeeded_commands_since(&self, name: &str, since_ms: i64) -> Result<u64, StoreError> {
        self.db().query_row(
            "SELECT count(*) FROM commands WHERE name = ?1 AND created_at >= ?2 AND state = 'succeeded'",
            crate::params![name, since_ms],
            |r| r.get(0),
        )
    }

    /// Milliseconds from creation to finish of each finished `name` command created at or after
    /// `since_ms`, ascending.
    pub fn command_latencies_ms(&self, name: &str, since_ms: i64) -> Result<Vec<i64>, StoreError> {
        let mut st = self.db().prepare(
            "SELECT finished_at - created_at FROM commands WHERE name = ?1 AND created_at >= ?2 \
             AND finished_at IS NOT NULL ORDER BY 1",
        )?;
        let rows = st.query_map(crate::params![name, since_ms], |r| r.get(0))?;
        rows.collect::<Result<_, _>>()
    }

    /// The lowest `generation` of any node (0 without nodes).
    pub fn min_generation(&self) -> Result<u64, StoreError> {
        self.db().query_row(
            "SELECT coalesce(min(generation), 0) FROM nodes",
            params![],
            |r| r.get(0),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bc_protocol::{Connectivity, ProvisionState};

    #[test]
    fn counts_add_up_on_either_backend() -> Result<(), StoreError> {
        let store = crate::testing::store()?;
        store.write_blocking(|tx| {
            for (i, (c, at, converged)) in [
                (Connectivity::Connected, 5_000, true),
                (Connectivity::Connected, 1_000, false),
                (Connectivity::Unreachable, 1_000, true),
                (Connectivity::Lost, 1_000, true),
            ]
            .into_iter()
            .enumerate()
            {
                let id = format!("node_{i}");
                let n = crate::testing::new_node(&id);
                tx.insert_node_in(&n, ProvisionState::Adopted, 1)?;
                let before = tx
                    .node(&id)?
                    .ok_or_else(|| StoreError::Task("no row".into()))?;
                let mut after = before.clone();
                after.connectivity = c;
                after.connected_at = Some(at);
                if converged {
                    after.observed_generation = after.generation;
                }
                assert!(tx.update_node(&before, &after, true, 1)?);
            }
            let c = tx.bench_counts(2_000)?;
            assert_eq!(
                c,
                BenchCounts {
                    total: 4,
                    adopted: 4,
                    connected: 2,
                    converged: 3,
                    unreachable: 2,
                    reconnected: 1,
                }
            );
            assert_eq!(tx.min_generation()?, 1);
            assert_eq!(tx.node_versions()?.len(), 4);
            Ok(())
        })
    }
}
