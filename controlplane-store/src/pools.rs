//! The `pools` table: a pool's kind decides its nodes' `role`, its `agent` their `adapter`, and
//! its hardware profile their `drivers` and expected GPUs (spec "Identity, ownership and
//! generations").

use std::collections::BTreeMap;

use crate::db::Row;
use crate::params;
use bc_protocol::{PoolAgent, PoolKind};
use serde::{Deserialize, Serialize};

use super::{Reader, StoreError, Tx, from_json, parse_enum, sql_u64, to_json};

/// What a pool's machines are expected to have, and the drivers they inherit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HardwareProfile {
    /// GPUs per node; a node reporting another count gets the NoSchedule condition
    /// `GpuCountMismatch`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_gpu_count: Option<u32>,
    /// GPU model name as NVML reports it (`nvmlDeviceGetName`), e.g. `NVIDIA H100 80GB HBM3`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_gpu_model: Option<String>,
    /// Active NVLink links each GPU should have, for `diag.nvml`'s `nvlink` check; absent: bcd's
    /// table by product (an H100 NVL pair 12, HGX H100 18), 0: no NVLink expected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_nvlinks_per_gpu: Option<u32>,
    /// Driver per concern (`power`, `boot`, `deploy`, ...), e.g. `{"power": "redfish"}`.
    #[serde(default)]
    pub drivers: BTreeMap<String, String>,
    /// What a `PcieLinkDegraded` condition does to the pool's nodes (issue 20.3): `ignore` (the
    /// default when absent) only reports it; `noSchedule` also keeps new work off the node while
    /// a link is degraded in a way that counts (docs/node-model.md "PcieLinkDegraded").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_link_degraded: Option<LinkDegradedPolicy>,
    /// Commissioning (issue 15): installed memory at least this, bytes — the DIMMs' total
    /// (SMBIOS type 17), else the kernel's `MemTotal` with 5 % allowed for what firmware and
    /// kernel reserve. A dead DIMM shows up here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_memory_bytes: Option<u64>,
    /// Commissioning: the CPU model as `/proc/cpuinfo` names it (`model name`), exactly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_cpu_model: Option<String>,
    /// Commissioning: logical CPUs at least this many.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_cpu_threads: Option<u32>,
    /// Commissioning: physical NICs with a link up, at least this many (a cabled port whose link
    /// stays down in the ramdisk is a cabling or optics fault).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_linked_nics: Option<u32>,
}

/// `hardwareProfile.pcieLinkDegraded`: whether a degraded PCIe link makes the node NoSchedule.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub enum LinkDegradedPolicy {
    /// The condition is reported; scheduling is not affected.
    #[default]
    Ignore,
    /// The condition, while it counts, puts `PcieLinkDegraded` into `noScheduleReasons`.
    NoSchedule,
}

/// How a pool accepts its joining nodes (NodeLifecycle, `adopting -> adopted`). An absent key
/// takes the default for the pool's kind (`cpl_core::acceptance::rules`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Acceptance {
    /// A node needs a trusted hardware key (at least two independent identifiers) to be
    /// accepted. Default: `true` for `metal-host` and `metal-dedicated` pools, `false` for
    /// `vps-host` and `provider` pools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require_trusted_key: Option<bool>,
    /// Seconds a node may stay `adopting` before it is `failed` (failedFrom `adopting`), 1 to
    /// 2,592,000 (30 days). Default 3,600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_seconds: Option<u64>,
    /// Bare metal (issue 15): seconds a machine may stay `inspecting` — power-on, network boot,
    /// the ramdisk's join and first inventory — before it is `failed`, 1 to 2,592,000. Default
    /// 1,800 (a server's POST alone can take ten minutes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inspection_deadline_seconds: Option<u64>,
    /// Bare metal: seconds a machine may stay `commissioning`, 1 to 2,592,000. Default 3,600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commissioning_deadline_seconds: Option<u64>,
    /// Bare metal: whether the site agent powers a machine off once it is `ready` (default
    /// `true`); `false` leaves it running the ramdisk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_off_when_ready: Option<bool>,
    /// Bare metal (issue 16): how much of every disk the ramdisk erases on release and retire,
    /// `metadata` (default: partition tables and signatures) or `full` (every block).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cleaning: Option<bc_protocol::commands::clean::CleanMode>,
    /// Bare metal: seconds a machine may stay `releasing` or `retiring` — the reboot into the
    /// ramdisk, its join, the cleaning and the checks after it — 1 to 2,592,000. Default 3,600;
    /// a full erase of large disks wants more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cleaning_deadline_seconds: Option<u64>,
    /// Bare metal: seconds a machine may stay `deploying` — the boot into the ramdisk, the
    /// image's download and write, the boot device and the reboot onto the disk — 1 to
    /// 2,592,000. Default 3,600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deploy_deadline_seconds: Option<u64>,
    /// Bare metal: seconds a machine in `rescue` may take to boot the ramdisk and start its SSH
    /// server, 1 to 2,592,000 (once it listens, a rescue has no deadline). Default 1,800.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rescue_deadline_seconds: Option<u64>,
}

/// One pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Pool {
    pub id: String,
    pub site_id: Option<String>,
    pub name: String,
    pub kind: PoolKind,
    pub agent: PoolAgent,
    /// The tenant whose pool this is; a `tenant-owned` node adds capacity only here.
    pub owner_tenant_id: Option<String>,
    pub hardware_profile: HardwareProfile,
    /// How the pool accepts joining nodes.
    #[serde(default)]
    pub acceptance: Acceptance,
    /// Health remediation's policy (`pools.setRemediation`; `{}`: off).
    #[serde(default)]
    pub remediation: crate::remediation::RemediationPolicy,
    /// The pool's own conditions: `RemediationPaused` (owner `Remediation`) while its circuit
    /// breaker is open, with the numbers that tripped it.
    #[serde(default)]
    pub conditions: Vec<bc_protocol::Condition>,
    /// When an operator last resumed remediation (`pools.resumeRemediation`), ms since the Unix
    /// epoch; the hourly limit counts from here at the earliest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remediation_resumed_at: Option<i64>,
    /// How often the circuit breaker tripped.
    #[serde(default)]
    pub remediation_trips: u64,
    pub version: u64,
    /// Milliseconds since the Unix epoch.
    pub created_at: i64,
}

const POOL_COLUMNS: &str = "id, site_id, name, kind, agent, owner_tenant_id, hardware_profile, version, created_at, acceptance, \
    remediation, conditions, remediation_resumed_at, remediation_trips";

fn from_row(row: &Row<'_>) -> Result<Pool, StoreError> {
    let kind: String = row.get(3)?;
    let agent: String = row.get(4)?;
    let profile: String = row.get(6)?;
    let version: i64 = row.get(7)?;
    Ok(Pool {
        id: row.get(0)?,
        site_id: row.get(1)?,
        name: row.get(2)?,
        kind: parse_enum("pools.kind", &kind)?,
        agent: parse_enum("pools.agent", &agent)?,
        owner_tenant_id: row.get(5)?,
        hardware_profile: from_json("pools.hardware_profile", &profile)?,
        acceptance: from_json("pools.acceptance", &row.get::<String>(9)?)?,
        remediation: from_json("pools.remediation", &row.get::<String>(10)?)?,
        conditions: from_json("pools.conditions", &row.get::<String>(11)?)?,
        remediation_resumed_at: row.get(12)?,
        remediation_trips: u64::try_from(row.get::<i64>(13)?).unwrap_or(0),
        version: u64::try_from(version).unwrap_or(0),
        created_at: row.get(8)?,
    })
}

impl Tx<'_> {
    /// Inserts `pool` as given (version 1).
    pub fn insert_pool(&self, pool: &Pool) -> Result<(), StoreError> {
        self.insert_pool_sql(pool, "").map(|_| ())
    }

    /// Inserts `pool` unless a pool with its id exists; returns whether it was inserted (the
    /// fixed pool `bcctl dev` and `bcctl bench` put their nodes in).
    pub fn insert_pool_if_absent(&self, pool: &Pool) -> Result<bool, StoreError> {
        self.insert_pool_sql(pool, " ON CONFLICT (id) DO NOTHING")
    }

    fn insert_pool_sql(&self, pool: &Pool, on_conflict: &str) -> Result<bool, StoreError> {
        let n = self.db().execute(
            &format!(
                "INSERT INTO pools (id, site_id, name, kind, agent, owner_tenant_id, hardware_profile, \
                 version, created_at, acceptance, remediation) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 1, ?8, ?9, ?10){on_conflict}"
            ),
            params![
                pool.id,
                pool.site_id,
                pool.name,
                pool.kind.as_str(),
                pool.agent.as_str(),
                pool.owner_tenant_id,
                to_json(&pool.hardware_profile),
                pool.created_at,
                to_json(&pool.acceptance),
                to_json(&pool.remediation)
            ],
        )?;
        Ok(n == 1)
    }

    /// Writes name, hardware profile and acceptance rules if the pool is still at `version`;
    /// returns whether a row changed. Kind, agent, site and owner are fixed at creation: nodes
    /// derived role, adapter and trust from them.
    pub fn update_pool(
        &self,
        id: &str,
        version: u64,
        name: &str,
        profile: &HardwareProfile,
        acceptance: &Acceptance,
    ) -> Result<bool, StoreError> {
        let n = self.db().execute(
            "UPDATE pools SET name = ?3, hardware_profile = ?4, acceptance = ?5, \
             version = version + 1 WHERE id = ?1 AND version = ?2",
            params![
                id,
                sql_u64(version),
                name,
                to_json(profile),
                to_json(acceptance)
            ],
        )?;
        Ok(n == 1)
    }

    /// Deletes a pool if it is still at `version`; returns whether a row went.
    pub fn delete_pool(&self, id: &str, version: u64) -> Result<bool, StoreError> {
        let n = self.db().execute(
            "DELETE FROM pools WHERE id = ?1 AND version = ?2",
            params![id, sql_u64(version)],
        )?;
        Ok(n == 1)
    }
}

impl Reader<'_> {
    /// One pool by id.
    pub fn pool(&self, id: &str) -> Result<Option<Pool>, StoreError> {
        let mut stmt = self
            .db()
            .prepare_cached(&format!("SELECT {POOL_COLUMNS} FROM pools WHERE id = ?1"))?;
        stmt.query_map(params![id], from_row)?.next().transpose()
    }

    /// Every pool, by id.
    pub fn pools(&self) -> Result<Vec<Pool>, StoreError> {
        let mut stmt = self
            .db()
            .prepare_cached(&format!("SELECT {POOL_COLUMNS} FROM pools ORDER BY id"))?;
        stmt.query_map(params![], from_row)?.collect()
    }

    /// Nodes in `adopting`, with their pool and when they entered `adopting` (the newest
    /// `provisionState` event to `adopting`, else the node's creation), ms.
    pub fn adopting_nodes(&self) -> Result<Vec<(String, Option<String>, i64)>, StoreError> {
        let mut stmt = self.db().prepare_cached(
            "SELECT n.id, n.pool_id, COALESCE((SELECT MAX(e.at) FROM node_events e \
             WHERE e.node_id = n.id AND e.kind = 'provisionState' AND e.to_value = 'adopting'), \
             n.created_at) FROM nodes n WHERE n.provision_state = 'adopting' ORDER BY n.id",
        )?;
        let rows = stmt.query_map(params![], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
        rows.collect::<Result<_, _>>()
    }

    /// How many nodes are in the pool.
    pub fn pool_node_count(&self, id: &str) -> Result<u64, StoreError> {
        let n: i64 = self.db().query_row(
            "SELECT COUNT(*) FROM nodes WHERE pool_id = ?1",
            params![id],
            |r| r.get(0),
        )?;
        Ok(u64::try_from(n).unwrap_or(0))
    }
}
