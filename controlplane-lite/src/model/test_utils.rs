//! Builders for model tests: a store with a site, a pool and nodes in chosen states.

use bc_protocol::{Adapter, NodeRole, Trust};
use rusqlite::{Connection, params};

use super::kinds::{PoolAgent, PoolKind, SiteKind};
use super::ops::pools::{self, NewPool};
use super::ops::sites::{self, NewSite};
use crate::store::nodes::{self, NewNode, NodeRecord};
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

/// A host node in `pool_id`, freshly joined (`adopting`).
pub(crate) fn node(
    conn: &Connection,
    id: &str,
    pool_id: Option<&str>,
) -> Result<NodeRecord, StoreError> {
    nodes::insert(
        conn,
        &NewNode {
            id: id.to_owned(),
            site_id: None,
            pool_id: pool_id.map(str::to_owned),
            owner_tenant_id: None,
            role: NodeRole::Host,
            trust: Trust::Platform,
            adapter: Adapter::BcdV1,
            drivers: serde_json::Map::new(),
            hostname: Some(id.to_owned()),
            hardware_key: None,
            hardware_key_trusted: false,
            identifier_digests: Vec::new(),
        },
        now_ms(),
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
