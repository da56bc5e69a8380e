//! The SQL of health remediation's tables (migration 11): remediations and their steps, node
//! suspensions, application-class XID observations, a pool's breaker state, and the counts the
//! circuit breaker and the metrics read.

use crate::db::{OptionalExt, Row};
use crate::params;
use crate::remediation::{
    Fault, RemediationCounts, RemediationFilter, RemediationRecord, StepRecord, Suspension,
    XidObservation,
};

use super::{Reader, StoreError, Tx, from_json, parse_enum, sql_u64, to_json};

const COLUMNS: &str = "id, node_id, pool_id, mode, fault, ladder, step_index, phase, command_id, \
    verify_command_id, acted_at, cordoned, draining, waiting, state, disruptive, started_at, \
    phase_started_at, ended_at, outcome";

fn from_row(r: &Row<'_>) -> Result<RemediationRecord, StoreError> {
    let fault: Fault = from_json("remediations.fault", &r.get::<String>(4)?)?;
    let ladder: Vec<String> = from_json("remediations.ladder", &r.get::<String>(5)?)?;
    Ok(RemediationRecord {
        id: r.get(0)?,
        node_id: r.get(1)?,
        pool_id: r.get(2)?,
        mode: parse_enum("remediations.mode", &r.get::<String>(3)?)?,
        fault,
        ladder: ladder
            .iter()
            .map(|s| parse_enum("remediations.ladder", s))
            .collect::<Result<_, _>>()?,
        step_index: u32::try_from(r.get::<i64>(6)?).unwrap_or(0),
        phase: parse_enum("remediations.phase", &r.get::<String>(7)?)?,
        command_id: r.get(8)?,
        verify_command_id: r.get(9)?,
        acted_at: r.get(10)?,
        cordoned: r.get(11)?,
        draining: r.get(12)?,
        waiting: r.get(13)?,
        state: parse_enum("remediations.state", &r.get::<String>(14)?)?,
        disruptive: r.get(15)?,
        started_at: r.get(16)?,
        phase_started_at: r.get(17)?,
        ended_at: r.get(18)?,
        outcome: r.get(19)?,
    })
}

fn step_from_row(r: &Row<'_>) -> Result<StepRecord, StoreError> {
    Ok(StepRecord {
        step: parse_enum("remediation_steps.step", &r.get::<String>(0)?)?,
        outcome: parse_enum("remediation_steps.outcome", &r.get::<String>(1)?)?,
        command_id: r.get(2)?,
        at: r.get(3)?,
        message: r.get(4)?,
    })
}

fn count(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

impl Tx<'_> {
    /// Inserts or replaces remediation `r` (by id). A second open remediation of one node is
    /// refused by the store's partial unique index.
    pub fn put_remediation(&self, r: &RemediationRecord) -> Result<(), StoreError> {
        let ladder: Vec<&str> = r.ladder.iter().map(|s| s.as_str()).collect();
        self.db().execute(
            "INSERT INTO remediations (id, node_id, pool_id, mode, fault, ladder, step_index, \
             phase, command_id, verify_command_id, acted_at, cordoned, draining, waiting, state, \
             disruptive, started_at, phase_started_at, ended_at, outcome) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, \
             ?18, ?19, ?20) \
             ON CONFLICT (id) DO UPDATE SET step_index = excluded.step_index, \
             phase = excluded.phase, command_id = excluded.command_id, \
             verify_command_id = excluded.verify_command_id, acted_at = excluded.acted_at, \
             cordoned = excluded.cordoned, draining = excluded.draining, \
             waiting = excluded.waiting, state = excluded.state, \
             phase_started_at = excluded.phase_started_at, ended_at = excluded.ended_at, \
             outcome = excluded.outcome, fault = excluded.fault",
            params![
                r.id,
                r.node_id,
                r.pool_id,
                r.mode.as_str(),
                to_json(&r.fault),
                to_json(&ladder),
                i64::from(r.step_index),
                r.phase.as_str(),
                r.command_id,
                r.verify_command_id,
                r.acted_at,
                r.cordoned,
                r.draining,
                r.waiting,
                r.state.as_str(),
                r.disruptive,
                r.started_at,
                r.phase_started_at,
                r.ended_at,
                r.outcome
            ],
        )?;
        Ok(())
    }

    /// Appends a step to remediation `id` (numbered after the ones it has).
    pub fn add_remediation_step(&self, id: &str, s: &StepRecord) -> Result<(), StoreError> {
        self.db().execute(
            "INSERT INTO remediation_steps (remediation_id, seq, step, outcome, command_id, at, \
             message) VALUES (?1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM remediation_steps \
             WHERE remediation_id = ?1), ?2, ?3, ?4, ?5, ?6)",
            params![
                id,
                s.step.as_str(),
                s.outcome.as_str(),
                s.command_id,
                s.at,
                s.message
            ],
        )?;
        Ok(())
    }

    /// Suspends remediation on `node_id` (replacing an earlier suspension), or lifts it
    /// (`None`).
    pub fn set_remediation_suspension(
        &self,
        node_id: &str,
        s: Option<&Suspension>,
    ) -> Result<(), StoreError> {
        match s {
            Some(s) => self.db().execute(
                "INSERT INTO remediation_suspensions (node_id, reason, by_actor, at) \
                 VALUES (?1, ?2, ?3, ?4) ON CONFLICT (node_id) DO UPDATE SET \
                 reason = excluded.reason, by_actor = excluded.by_actor, at = excluded.at",
                params![node_id, s.reason, s.by, s.at],
            )?,
            None => self.db().execute(
                "DELETE FROM remediation_suspensions WHERE node_id = ?1",
                params![node_id],
            )?,
        };
        Ok(())
    }

    /// Records an application-class XID; observations older than `prune_before` (ms) go.
    pub fn add_xid_observation(
        &self,
        o: &XidObservation,
        prune_before: i64,
    ) -> Result<(), StoreError> {
        let db = self.db();
        db.execute(
            "DELETE FROM xid_observations WHERE at < ?1",
            params![prune_before],
        )?;
        db.execute(
            "INSERT INTO xid_observations (id, node_id, xid, gpu, workload_id, allocation_id, \
             workload_fault, at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![
                format!("xid_{}", super::random_lowercase(20)),
                o.node_id,
                sql_u64(o.xid),
                o.gpu,
                o.workload_id,
                o.allocation_id,
                o.workload_fault,
                o.at
            ],
        )?;
        Ok(())
    }

    /// Marks every observation of `workload_id` since `since` (ms) as part of the workload's
    /// fault.
    pub fn mark_workload_fault(&self, workload_id: &str, since: i64) -> Result<(), StoreError> {
        self.db().execute(
            "UPDATE xid_observations SET workload_fault = 1 WHERE workload_id = ?1 AND at >= ?2",
            params![workload_id, since],
        )?;
        Ok(())
    }

    /// Writes pool `pool_id`'s remediation policy (JSON) and moves its version if it is still
    /// at `version`; returns whether a row changed.
    pub fn update_pool_remediation(
        &self,
        pool_id: &str,
        version: u64,
        policy: &crate::remediation::RemediationPolicy,
    ) -> Result<bool, StoreError> {
        let n = self.db().execute(
            "UPDATE pools SET remediation = ?3, version = version + 1 \
             WHERE id = ?1 AND version = ?2",
            params![pool_id, sql_u64(version), to_json(policy)],
        )?;
        Ok(n == 1)
    }

    /// Writes pool `pool_id`'s conditions; with `trip`, its breaker trips count goes up by one;
    /// with `resumed_at`, that becomes the time the breaker was last resumed (ms). With
    /// `version`, the write moves the pool's version and applies only at that version (an
    /// operator's resume); without, it is the controller's and leaves the version alone.
    /// Returns whether a row changed.
    pub fn update_pool_breaker(
        &self,
        pool_id: &str,
        conditions: &[bc_protocol::Condition],
        trip: bool,
        resumed_at: Option<i64>,
        version: Option<u64>,
    ) -> Result<bool, StoreError> {
        let n = self.db().execute(
            "UPDATE pools SET conditions = ?2, \
             remediation_trips = remediation_trips + ?3, \
             remediation_resumed_at = COALESCE(?4, remediation_resumed_at), \
             version = version + ?5 \
             WHERE id = ?1 AND (CAST(?6 AS BIGINT) IS NULL OR version = ?6)",
            params![
                pool_id,
                to_json(&conditions),
                i64::from(trip),
                resumed_at,
                i64::from(version.is_some()),
                version.map(sql_u64)
            ],
        )?;
        Ok(n == 1)
    }
}

impl Reader<'_> {
    /// One remediation by id.
    pub fn remediation(&self, id: &str) -> Result<Option<RemediationRecord>, StoreError> {
        self.db()
            .query_row(
                &format!("SELECT {COLUMNS} FROM remediations WHERE id = ?1"),
                params![id],
                from_row,
            )
            .optional()
    }

    /// The node's remediation that has not ended, if any.
    pub fn open_remediation(&self, node_id: &str) -> Result<Option<RemediationRecord>, StoreError> {
        self.db()
            .query_row(
                &format!(
                    "SELECT {COLUMNS} FROM remediations WHERE node_id = ?1 AND ended_at IS NULL"
                ),
                params![node_id],
                from_row,
            )
            .optional()
    }

    /// Remediations matching `f`, newest first.
    pub fn remediations(
        &self,
        f: &RemediationFilter,
    ) -> Result<Vec<RemediationRecord>, StoreError> {
        let mut stmt = self.db().prepare_cached(&format!(
            "SELECT {COLUMNS} FROM remediations \
             WHERE (CAST(?1 AS TEXT) IS NULL OR pool_id = ?1) \
             AND (CAST(?2 AS TEXT) IS NULL OR node_id = ?2) \
             AND (?3 = 0 OR ended_at IS NULL) ORDER BY started_at DESC, id LIMIT ?4"
        ))?;
        let rows = stmt.query_map(
            params![f.pool_id, f.node_id, f.open_only, i64::from(f.limit)],
            from_row,
        )?;
        rows.collect()
    }

    /// Every remediation that has not ended, oldest first (the controller's pass).
    pub fn open_remediations(&self) -> Result<Vec<RemediationRecord>, StoreError> {
        let mut stmt = self.db().prepare_cached(&format!(
            "SELECT {COLUMNS} FROM remediations WHERE ended_at IS NULL ORDER BY started_at, id"
        ))?;
        let rows = stmt.query_map(params![], from_row)?;
        rows.collect()
    }

    /// The steps remediation `id` took, in order.
    pub fn remediation_steps(&self, id: &str) -> Result<Vec<StepRecord>, StoreError> {
        let mut stmt = self.db().prepare_cached(
            "SELECT step, outcome, command_id, at, message FROM remediation_steps \
             WHERE remediation_id = ?1 ORDER BY seq",
        )?;
        let rows = stmt.query_map(params![id], step_from_row)?;
        rows.collect()
    }

    /// The pool's disruptive remediations: `(open now, started at or after since_ms)`.
    pub fn pool_remediation_load(
        &self,
        pool_id: &str,
        since_ms: i64,
    ) -> Result<(u64, u64), StoreError> {
        self.db().query_row(
            "SELECT COALESCE(SUM(CASE WHEN ended_at IS NULL THEN 1 ELSE 0 END), 0), \
             COALESCE(SUM(CASE WHEN started_at >= ?2 THEN 1 ELSE 0 END), 0) \
             FROM remediations WHERE pool_id = ?1 AND disruptive = 1",
            params![pool_id, since_ms],
            |r| Ok((count(r.get(0)?), count(r.get(1)?))),
        )
    }

    /// How many disruptive remediations of `node_id` started at or after `since_ms`.
    pub fn node_remediations_since(&self, node_id: &str, since_ms: i64) -> Result<u64, StoreError> {
        self.db().query_row(
            "SELECT COUNT(*) FROM remediations WHERE node_id = ?1 AND disruptive = 1 \
             AND started_at >= ?2",
            params![node_id, since_ms],
            |r| Ok(count(r.get(0)?)),
        )
    }

    /// The operator's suspension of remediation on `node_id`, if any.
    pub fn remediation_suspension(&self, node_id: &str) -> Result<Option<Suspension>, StoreError> {
        self.db()
            .query_row(
                "SELECT reason, by_actor, at FROM remediation_suspensions WHERE node_id = ?1",
                params![node_id],
                |r| {
                    Ok(Suspension {
                        reason: r.get(0)?,
                        by: r.get(1)?,
                        at: r.get(2)?,
                    })
                },
            )
            .optional()
    }

    /// Nodes of `pool_id` that may need remediation: a `host` in service (`adopted` or
    /// `deployed`, not in maintenance, not suspended) with a GPU fault in `noScheduleReasons`,
    /// or `unreachable`/`lost` with a BMC. Ids, sorted.
    pub fn remediation_candidates(&self, pool_id: &str) -> Result<Vec<String>, StoreError> {
        let mut stmt = self.db().prepare_cached(
            "SELECT n.id FROM nodes n WHERE n.pool_id = ?1 AND n.role = 'host' \
             AND n.provision_state IN ('adopted', 'deployed') AND n.maintenance = 0 \
             AND NOT EXISTS (SELECT 1 FROM remediation_suspensions s WHERE s.node_id = n.id) \
             AND (n.no_schedule_reasons LIKE '%\"GpuUnhealthy\"%' \
                  OR n.no_schedule_reasons LIKE '%\"XidCritical\"%' \
                  OR n.no_schedule_reasons LIKE '%\"P2pDrainRequired\"%' \
                  OR n.no_schedule_reasons LIKE '%\"RepeatedWorkloadXid\"%' \
                  OR (n.connectivity IN ('unreachable', 'lost') \
                      AND EXISTS (SELECT 1 FROM node_bmcs b WHERE b.node_id = n.id))) \
             ORDER BY n.id",
        )?;
        let rows = stmt.query_map(params![pool_id], |r| r.get(0))?;
        rows.collect()
    }

    /// Application-class XID observations of `workload_id` at or after `since_ms`.
    pub fn workload_xids(
        &self,
        workload_id: &str,
        since_ms: i64,
    ) -> Result<Vec<XidObservation>, StoreError> {
        self.xids("workload_id", workload_id, since_ms)
    }

    /// Application-class XID observations of `node_id` at or after `since_ms`.
    pub fn node_xids(
        &self,
        node_id: &str,
        since_ms: i64,
    ) -> Result<Vec<XidObservation>, StoreError> {
        self.xids("node_id", node_id, since_ms)
    }

    fn xids(
        &self,
        column: &'static str,
        value: &str,
        since_ms: i64,
    ) -> Result<Vec<XidObservation>, StoreError> {
        let mut stmt = self.db().prepare_cached(&format!(
            "SELECT node_id, xid, gpu, workload_id, allocation_id, workload_fault, at \
             FROM xid_observations WHERE {column} = ?1 AND at >= ?2 ORDER BY at, id"
        ))?;
        let rows = stmt.query_map(params![value, since_ms], |r| {
            Ok(XidObservation {
                node_id: r.get(0)?,
                xid: count(r.get(1)?),
                gpu: r.get(2)?,
                workload_id: r.get(3)?,
                allocation_id: r.get(4)?,
                workload_fault: r.get(5)?,
                at: r.get(6)?,
            })
        })?;
        rows.collect()
    }

    /// What the metrics show, counted in the store.
    pub fn remediation_counts(&self) -> Result<RemediationCounts, StoreError> {
        let db = self.db();
        let mut stmt = db.prepare_cached(
            "SELECT mode, state, COUNT(*) FROM remediations GROUP BY mode, state ORDER BY mode, state",
        )?;
        let by_state = stmt
            .query_map(params![], |r| Ok((r.get(0)?, r.get(1)?, count(r.get(2)?))))?
            .collect::<Result<_, _>>()?;
        let mut stmt = db.prepare_cached(
            "SELECT step, outcome, COUNT(*) FROM remediation_steps GROUP BY step, outcome \
             ORDER BY step, outcome",
        )?;
        let steps = stmt
            .query_map(params![], |r| Ok((r.get(0)?, r.get(1)?, count(r.get(2)?))))?
            .collect::<Result<_, _>>()?;
        let breaker_trips = db.query_row(
            "SELECT COALESCE(SUM(remediation_trips), 0) FROM pools",
            params![],
            |r| Ok(count(r.get(0)?)),
        )?;
        Ok(RemediationCounts {
            by_state,
            steps,
            breaker_trips,
        })
    }
}
