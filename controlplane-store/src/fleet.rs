//! The fleet gauges `GET /metrics` reads at scrape time.

use super::{Reader, StoreError};
use crate::db::Db;
use crate::params;

/// Fleet gauges as the store has them: (label value, count) rows, read in one transaction so the
/// answers describe the same moment.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FleetCounts {
    /// Commands by `state`.
    pub commands: Vec<(String, i64)>,
    /// Nodes by `connectivity`.
    pub connectivity: Vec<(String, i64)>,
    /// Nodes by `provision_state`.
    pub provision_states: Vec<(String, i64)>,
    /// Nodes whose condition of the type asked for is `true`.
    pub condition_true: i64,
}

fn grouped(c: Db<'_>, sql: &str) -> Result<Vec<(String, i64)>, StoreError> {
    let mut stmt = c.prepare_cached(sql)?;
    let rows = stmt.query_map(params![], |r| Ok((r.get(0)?, r.get(1)?)))?;
    rows.collect::<Result<_, _>>()
}

impl Reader<'_> {
    /// Nodes by `connectivity`: (value, count) rows, one query (`bcctl status`).
    pub fn connectivity_counts(&self) -> Result<Vec<(String, i64)>, StoreError> {
        grouped(
            self.db(),
            "SELECT connectivity, COUNT(*) FROM nodes GROUP BY connectivity",
        )
    }

    /// Counts of commands by state, nodes by connectivity and provisionState, and nodes whose
    /// condition `condition_type` has status `true` (e.g. `GpuUnhealthy`).
    pub fn fleet_counts(&self, condition_type: &str) -> Result<FleetCounts, StoreError> {
        let c = self.db();
        let commands = grouped(c, "SELECT state, COUNT(*) FROM commands GROUP BY state")?;
        let connectivity = self.connectivity_counts()?;
        let provision_states = grouped(
            c,
            "SELECT provision_state, COUNT(*) FROM nodes GROUP BY provision_state",
        )?;
        // Conditions are a JSON array of {type, status, ...}.
        let sql = if c.is_postgres() {
            "SELECT COUNT(*) FROM nodes WHERE EXISTS (SELECT 1 FROM jsonb_array_elements(\
             CASE WHEN jsonb_typeof(nodes.conditions::jsonb) = 'array' THEN nodes.conditions::jsonb \
             ELSE '[]'::jsonb END) j WHERE j ->> 'type' = ?1 AND j ->> 'status' = ?2)"
        } else {
            "SELECT COUNT(*) FROM nodes WHERE EXISTS (SELECT 1 FROM json_each(nodes.conditions) \
             WHERE json_extract(value, '$.type') = ?1 AND json_extract(value, '$.status') = ?2)"
        };
        let condition_true: i64 = c.query_row(
            sql,
            crate::params![condition_type, bc_protocol::ConditionStatus::True.as_str()],
            |r| r.get(0),
        )?;
        Ok(FleetCounts {
            commands,
            connectivity,
            provision_states,
            condition_true,
        })
    }
}
