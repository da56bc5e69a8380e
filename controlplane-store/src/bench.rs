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
            "SELECT count(*), \
                coalesce(sum(provision_state = 'adopted'), 0), \
                coalesce(sum(connectivity = 'connected'), 0), \
                coalesce(sum(observed_generation >= generation), 0), \
                coalesce(sum(connectivity IN ('unreachable', 'lost')), 0), \
                coalesce(sum(connectivity = 'connected' AND connected_at >= ?1), 0) \
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
