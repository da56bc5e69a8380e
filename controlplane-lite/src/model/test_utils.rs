//! Builders for model tests: a store with a site, a pool and nodes in chosen states.

use bc_protocol::{Adapter, NodeRole, ProvisionState, Trust};
use rusqlite::{Connection, params};

use super::kinds::{PoolAgent, PoolKind, SiteKind};
use super::ops::pools::{self, NewPool};
use super::ops::sites::{self, NewSite};
use crate::store::nodes::{self, NodeRecord};
use crate::store::pools::{HardwareProfile, Pool};
use crate::store::sites::Site;
use crate::store::{StoreError, now_ms};

pub(crate) type TestResult = Result<(), Box<dyn std::error::Error>>;

pub(crate) fn site(
    conn: &Connection,
    kind: SiteKind,
    owner: Option<&str>,
) -> Result<Site, super::OpError> {
    sites::create(
        conn,
        &NewSite {
            name: "s".into(),
            kind,
            owner_tenant_id: owner.map(str::to_owned),
        },
    )
}

pub(crate) fn pool(
    conn: &Connection,
    kind: PoolKind,
    owner: Option<&str>,
) -> Result<Pool, super::OpError> {
    pools::create(
        conn,
        &NewPool {
            name: "p".into(),
            kind,
            agent: PoolAgent::Bcd,
            site_id: None,
            owner_tenant_id: owner.map(str::to_owned),
            hardware_profile: HardwareProfile::default(),
        },
    )
}

/// A host node in `pool_id`, freshly joined (`adopting`). Raw SQL with the columns' defaults, so
/// the helper does not depend on the shape of JoinService's `NewNode`.
pub(crate) fn node(
    conn: &Connection,
    id: &str,
    pool_id: Option<&str>,
) -> Result<NodeRecord, StoreError> {
    let now = now_ms();
    conn.execute(
        "INSERT INTO nodes (id, pool_id, role, trust, adapter, provision_state, hostname, \
         created_at, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?1, ?7, ?7)",
        params![
            id,
            pool_id,
            NodeRole::Host.as_str(),
            Trust::Platform.as_str(),
            Adapter::BcdV1.as_str(),
            ProvisionState::Adopting.as_str(),
            now
        ],
    )?;
    nodes::get(conn, id)?.ok_or_else(|| StoreError::Task(format!("node {id} vanished")))
}

/// Makes `id` schedulable the way the controllers would (adopted, converged, connected) and gives
/// it `gpus` GPUs in its inventory. Raw SQL: these columns belong to other writers.
pub(crate) fn ready_host(
    conn: &Connection,
    id: &str,
    gpus: usize,
) -> Result<NodeRecord, StoreError> {
    let inv = serde_json::json!({
        "gpus": (0..gpus).map(|i| serde_json::json!({"index": i, "uuid": format!("GPU-{id}-{i}")})).collect::<Vec<_>>()
    });
    conn.execute(
        "UPDATE nodes SET provision_state = 'adopted', observed_generation = 1, \
         connectivity = 'connected', inventory = ?2 WHERE id = ?1",
        params![id, inv.to_string()],
    )?;
    nodes::get(conn, id)?.ok_or_else(|| StoreError::Task(format!("node {id} vanished")))
}
