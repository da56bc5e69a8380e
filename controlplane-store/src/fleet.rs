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

/// Bare-metal gauges as the store has them, read in the same transaction as [`FleetCounts`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BareMetalCounts {
    /// BMCs by whether they answered the last time they were asked: `true`, `false`, or
    /// `unknown` (never asked yet).
    pub bmcs_by_reachable: Vec<(String, i64)>,
    /// Nodes in `failed` by `failed_from` (the state they failed in; `unknown` when unset).
    pub failed_from: Vec<(String, i64)>,
    /// Nodes in `failed` whose ramdisk boot for the state they failed in was never joined: the
    /// machine never booted the ramdisk (no power-on, no PXE, a broken image).
    pub boot_failed: i64,
    /// Per ramdisk state, when the node longest in it entered it (ms since the Unix epoch):
    /// boots not ended whose state is still the node's. A rescue whose SSH server is up (its
    /// `work_step` is the step asked to be left out) is left out: it lasts as long as needed.
    pub workflow_oldest_started: Vec<(String, i64)>,
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

    /// BMCs by reachability, failed nodes by the state they failed in, nodes whose ramdisk was
    /// never booted, and the oldest unfinished ramdisk boot per state; `open_ended_step` is the
    /// `work_step` of a boot that may last indefinitely (a rescue whose SSH server is up).
    pub fn bare_metal_counts(&self, open_ended_step: &str) -> Result<BareMetalCounts, StoreError> {
        let c = self.db();
        let bmcs_by_reachable = grouped(
            c,
            "SELECT CASE WHEN reachable IS NULL THEN 'unknown' WHEN reachable = 0 THEN 'false' \
             ELSE 'true' END, COUNT(*) FROM node_bmcs GROUP BY 1",
        )?;
        let failed_from = grouped(
            c,
            "SELECT COALESCE(failed_from, 'unknown'), COUNT(*) FROM nodes \
             WHERE provision_state = 'failed' GROUP BY 1",
        )?;
        let boot_failed: i64 = c.query_row(
            "SELECT COUNT(*) FROM nodes n JOIN node_boots b ON b.node_id = n.id \
             WHERE n.provision_state = 'failed' AND b.purpose = n.failed_from \
             AND b.used_at IS NULL",
            params![],
            |r| r.get(0),
        )?;
        let mut stmt = c.prepare_cached(
            "SELECT n.provision_state, MIN(b.phase_started_at) FROM node_boots b \
             JOIN nodes n ON n.id = b.node_id \
             WHERE b.ended_at IS NULL AND b.purpose = n.provision_state \
             AND (b.work_step IS NULL OR b.work_step <> ?1) GROUP BY n.provision_state",
        )?;
        let rows = stmt.query_map(params![open_ended_step], |r| Ok((r.get(0)?, r.get(1)?)))?;
        let workflow_oldest_started = rows.collect::<Result<_, _>>()?;
        Ok(BareMetalCounts {
            bmcs_by_reachable,
            failed_from,
            boot_failed,
            workflow_oldest_started,
        })
    }
}
